"""`ds.Problem`: studies of several experiments with observation and noise models, fitted by
maximum likelihood, against closed forms: σ and log10 noise by their maximum-likelihood
formulas, Laplace noise by the median, condition-specific unknowns, parametric initial states
and pre-equilibration from exact data, a prior's posterior mode and spread from the conjugate
normal case; the bad descriptions a study refuses."""

import dataclasses
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import diffsim as ds

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments" / "bench"))

DECAY = ds.ODE(lambda t, y, p: -p["k"] * y, {"k": 0.5})


def _long(times, observable, values):
    return {"time": np.asarray(times), "observable": [observable] * len(times), "value": values}


def _concat(*tables):
    return {
        key: np.concatenate([np.asarray(t[key], dtype=object) for t in tables]) for key in tables[0]
    }


def test_noise_levels_by_maximum_likelihood_with_replicates_and_log10_noise():
    """y = e^{−kt}: "A" measured twice per time (replicates) with normal noise, "B" = 10 y with
    log10-normal noise. At the optimum the σ's are their closed forms given k̂: the RMS of
    the residuals (on the log10 scale for B); the log-likelihood is PEtab's formula."""
    rng = np.random.default_rng(0)
    ts = np.linspace(0.5, 5.0, 10)
    a = np.exp(-0.5 * np.concatenate([ts, ts])) + 0.05 * rng.normal(size=20)
    b = 10 * np.exp(-0.5 * ts) * 10 ** (0.1 * rng.normal(size=10))
    data = _concat(_long(np.concatenate([ts, ts]), "A", a), _long(ts, "B", b))
    problem = ds.Problem(
        DECAY,
        [ds.Experiment(data, y0=jnp.array([1.0]))],
        {
            "A": ds.Observable(lambda t, y, p: y[0], sigma="sigma_A"),
            "B": ds.Observable(lambda t, y, p: 10 * y[0], noise="log10-normal", sigma="sigma_B"),
        },
        {
            "k": ds.Unknown(0.2, bounds=(1e-3, 1e2), scale="log10"),
            "sigma_A": ds.Unknown(1.0, bounds=(1e-4, 1e2), scale="log10"),
            "sigma_B": ds.Unknown(1.0, bounds=(1e-4, 1e2), scale="log10"),
        },
    )
    result = ds.fit(problem)
    assert result.converged and result.starts_reached == 1
    k = result.params["k"]
    pred_a = np.exp(-k * np.concatenate([ts, ts]))
    pred_b = 10 * np.exp(-k * ts)
    sigma_a = np.sqrt(np.mean((a - pred_a) ** 2))
    sigma_b = np.sqrt(np.mean((np.log10(b) - np.log10(pred_b)) ** 2))
    # the optimiser's tolerance (1e-8 on the step) and the solve's (rtol 1e-8)
    assert result.params["sigma_A"] == pytest.approx(sigma_a, rel=1e-6)
    assert result.params["sigma_B"] == pytest.approx(sigma_b, rel=1e-6)
    llh = (
        stats.norm.logpdf(a, pred_a, sigma_a).sum()
        + (stats.norm.logpdf(np.log10(b), np.log10(pred_b), sigma_b) - np.log(b * np.log(10))).sum()
    )
    assert result.llh == pytest.approx(llh, abs=1e-6)
    assert problem.llh(result.params) == pytest.approx(result.llh, abs=1e-9)
    # a σ from 30 values (20 + 10): its log10 standard error from the Fisher information,
    # 1/(√(2n) ln 10)
    assert result.stderr["sigma_B"] == pytest.approx(1 / (np.sqrt(20) * np.log(10)), rel=0.05)
    # the fit's information, from the Jacobian the optimiser ended with (its rows corrected by
    # ∂log σ/∂θ), is that of a forward pass through the Fisher residuals (the program ds.fit
    # runs where priors or BFGS leave it no such Jacobian); the same derivatives in another
    # order, and the covariance inverted back: round-off apart (measured 3e-18 of the largest
    # entry here, 3e-13 on Boehm)
    from diffsim._fit.study_fit import _information

    scaled = jnp.asarray([result.params_on_scale[n] for n in result.names])
    information = np.asarray(_information(problem, scaled))
    np.testing.assert_allclose(
        np.linalg.inv(result.covariance), information, rtol=1e-8, atol=1e-10 * information.max()
    )


class _Turnover(ds.AbstractODE):
    """y' = k_in + stimulus − k_out y: at rest (k_in + stimulus)/k_out."""

    k_in: jnp.ndarray
    k_out: jnp.ndarray
    stimulus: jnp.ndarray

    def vector_field(self, t, y, args=None):
        return self.k_in + self.stimulus - self.k_out * y


def _turnover(t, start, k_in, k_out, stimulus):
    rest = (k_in + stimulus) / k_out
    return rest + (start - rest) * np.exp(-k_out * t)


def _three_turnovers():
    """Three experiments of one model: a parametric start y0 = y_start (unstimulated); a
    stimulus after rest (pre-equilibration without it); the same with a condition-specific
    k_out_treated (which its rest uses too). Exact data. (problem, truth, times, treated)"""
    truth = dict(k_in=2.0, k_out=0.5, k_out_treated=1.5, y_start=0.3)
    ts = np.linspace(0.5, 8.0, 12)
    unstimulated = _turnover(ts, truth["y_start"], 2.0, 0.5, 0.0)
    stimulated = _turnover(ts, 2.0 / 0.5, 2.0, 0.5, 1.0)
    treated = _turnover(ts, 2.0 / 1.5, 2.0, 1.5, 1.0)
    observables = {"y": ds.Observable(lambda t, y, p: y[0], sigma=0.1)}
    experiments = [
        ds.Experiment(_long(ts, "y", unstimulated), y0=lambda p: jnp.stack([p["y_start"]])),
        ds.Experiment(
            _long(ts, "y", stimulated),
            y0=jnp.array([1.0]),
            set={"stimulus": 1.0},
            pre_equilibrate={"stimulus": 0.0},
        ),
        ds.Experiment(
            _long(ts, "y", treated),
            y0=jnp.array([1.0]),
            set={"stimulus": 1.0, "k_out": "k_out_treated"},
            pre_equilibrate={"stimulus": 0.0},
            name="treated",
        ),
    ]
    unknowns = {
        name: ds.Unknown(1.0, bounds=(1e-3, 1e3), scale="log10")
        for name in ("k_in", "k_out", "k_out_treated", "y_start")
    }
    model = _Turnover(jnp.array(1.0), jnp.array(1.0), jnp.array(0.0))
    return ds.Problem(model, experiments, observables, unknowns), truth, ts, treated


def test_conditions_parametric_starts_and_pre_equilibration_from_exact_data():
    """The three experiments of `_three_turnovers`: every unknown recovered."""
    problem, truth, ts, treated = _three_turnovers()
    result = ds.fit(problem)
    assert result.converged
    for name, value in truth.items():
        assert result.params[name] == pytest.approx(value, rel=1e-6), name
    # exact data: every residual vanishes, the llh is the normal constant alone
    rows = 3 * len(ts)
    assert result.llh == pytest.approx(-rows * np.log(np.sqrt(2 * np.pi) * 0.1), abs=1e-6)
    predictions = result.predictions()
    assert [p["prediction"].shape for p in predictions] == [(12,)] * 3
    np.testing.assert_allclose(predictions[2]["prediction"], treated, atol=1e-6)


def test_a_prior_gives_the_posterior_mode_and_spread_of_the_conjugate_normal_case():
    """y' = a (y = a t from 0), m = a t + N(0, σ²) with σ known and a ~ N(μ0, s0²): the
    posterior of a is normal with precision 1/s0² + Σt²/σ², its mode the MAP estimate and
    its sd the standard error (Fisher information of the data plus the prior's)."""
    rng = np.random.default_rng(1)
    ts = np.linspace(1.0, 5.0, 8)
    sigma, mu0, s0 = 0.5, 0.0, 0.3
    measured = 0.8 * ts + sigma * rng.normal(size=ts.size)
    model = ds.ODE(lambda t, y, p: p["a"] + 0 * y, {"a": 0.1})
    problem = ds.Problem(
        model,
        [ds.Experiment(_long(ts, "y", measured), y0=jnp.array([0.0]))],
        {"y": ds.Observable(lambda t, y, p: y[0], sigma=sigma)},
        {"a": ds.Unknown(0.1, prior=_normal(mu0, s0))},
    )
    result = ds.fit(problem)
    precision = 1 / s0**2 + np.sum(ts**2) / sigma**2
    mode = (mu0 / s0**2 + np.sum(ts * measured) / sigma**2) / precision
    assert result.params["a"] == pytest.approx(mode, rel=1e-7)
    assert result.stderr["a"] == pytest.approx(1 / np.sqrt(precision), rel=1e-6)
    assert result.log_posterior == pytest.approx(
        result.llh + stats.norm.logpdf(mode, mu0, s0), abs=1e-6
    )


def _normal(loc, scale):
    import numpyro.distributions as dist

    return dist.Normal(loc, scale)


def test_laplace_noise_finds_the_median_and_the_mean_absolute_deviation():
    """A constant c measured with Laplace noise: the maximum-likelihood c is the median, b the
    mean absolute deviation from it (BFGS, the default for Laplace noise)."""
    rng = np.random.default_rng(2)
    measured = 3.0 + rng.laplace(scale=0.4, size=15)  # odd: a unique median
    ts = np.linspace(0.0, 7.0, 15)
    problem = ds.Problem(
        ds.ODE(lambda t, y, p: 0 * y, {}),
        [ds.Experiment(_long(ts, "y", measured), y0=lambda p: jnp.stack([p["c"]]))],
        {"y": ds.Observable(lambda t, y, p: y[0], noise="laplace", sigma="b")},
        {
            "c": ds.Unknown(1.0, bounds=(-10, 10)),
            "b": ds.Unknown(1.0, bounds=(1e-3, 10), scale="log"),
        },
    )
    result = ds.fit(problem, starts=3)
    median = np.median(measured)
    assert result.params["c"] == pytest.approx(median, abs=1e-5)
    assert result.params["b"] == pytest.approx(np.mean(np.abs(measured - median)), rel=1e-4)


def test_a_fit_ending_on_a_plateau_says_so():
    """Two decays with Laplace noise, the treated one's rate started at 0.1: BFGS runs it up
    to ~43, where the treated decay is gone before the first measurement and the likelihood
    is flat (llh −3.19 against 24.27 at the optimum near k_treated = 1), and stops
    "converged". Its standard error there (4e6 decades) exceeds its bounds' 5 decades: the
    fit warns of a plateau."""
    rng = np.random.default_rng(9)
    ts = np.linspace(0.5, 4.0, 8)
    control = np.exp(-0.4 * ts) * np.exp(0.12 * rng.normal(size=8))
    treated = 2.0 * np.exp(-0.9 * ts) * np.exp(0.12 * rng.normal(size=8))
    problem = ds.Problem(
        DECAY,
        [
            ds.Experiment(_long(ts, "A", control), y0=jnp.array([1.0]), name="control"),
            ds.Experiment(_long(ts, "A", treated), y0=jnp.array([2.0]), set={"k": "k_treated"}),
        ],
        {"A": ds.Observable(lambda t, y, p: y[0], noise="laplace", sigma="sigma")},
        {
            "k": ds.Unknown(0.1, bounds=(1e-3, 1e2), scale="log10"),
            "k_treated": ds.Unknown(0.1, bounds=(1e-3, 1e2), scale="log10"),
            "sigma": ds.Unknown(0.5, bounds=(1e-3, 10), scale="log10"),
        },
    )
    with pytest.warns(ds.FitWarning, match=r"k_treated \(4.*against 5\).*plateau"):
        result = ds.fit(problem, progress=False)
    assert result.params["k_treated"] > 10
    # the optimum (a Nelder–Mead search on the llh from there): far above the plateau
    optimum = {"k": 0.385240, "k_treated": 0.994644, "sigma": 0.040365}
    assert problem.llh(optimum) > result.llh + 25


def test_a_pure_scaling_factor_is_set_in_closed_form():
    """y = s·x with s an unknown that only scales (found by `Tables.scalings`): one closed-form
    step from any s gives the weighted least-squares s = Σ h m/σ² / Σ h²/σ² (here the truth, 3,
    from noise-free data at the true rate); an offset (s·x + 0.1, or s·x + off with off 0
    by default and set to 1 by the experiment) or an s that is also a σ is not a pure
    scaling."""
    from diffsim._fit.study_fit import _closed_form_refinement
    from diffsim._fit.study_objective import residuals, to_natural_values

    model = ds.ODE(lambda t, y, p: -p["k"] * y, {"k": 0.5})
    ts = np.linspace(0.5, 5.0, 10)
    data = {"time": ts, "observable": ["A"] * 10, "value": 3.0 * np.exp(-0.5 * ts)}

    def study(fn, sigma=0.1, prior=None):
        return ds.Problem(
            model,
            experiments=[ds.Experiment(data, y0=jnp.array([1.0]))],
            observables={"A": ds.Observable(fn, sigma=sigma)},
            unknowns={
                "k": ds.Unknown(0.2, bounds=(1e-3, 1e2), scale="log10"),
                "s": ds.Unknown(0.7, bounds=(1e-3, 1e3), scale="log10", prior=prior),
            },
        )

    problem = study(lambda t, y, p: p["s"] * y[0])
    assert [(problem.names[k], int(mask.sum())) for k, mask in problem.tables.scalings] == [
        ("s", 10)
    ]
    tables = problem.tables
    x = jnp.asarray([np.log10(0.5), np.log10(0.7)])
    r = jax.jit(lambda x: residuals(problem, to_natural_values(x, tables.scales)))(x)
    refined = _closed_form_refinement(problem)(x, r, tables.lower, tables.upper)
    # exact given h; h is the solve's (its rtol 1e-8 bounds the relative error of s)
    assert 10 ** float(refined[1]) == pytest.approx(3.0, rel=1e-7)
    assert not study(lambda t, y, p: p["s"] * y[0] + 0.1).tables.scalings
    assert not study(lambda t, y, p: p["s"] * y[0], sigma="s").tables.scalings
    # an offset that is 0 by default but set by the experiment (or estimated) is an offset:
    # the closed form of s·x alone would be wrong there
    offset = ds.Problem(
        model,
        experiments=[ds.Experiment(data, y0=jnp.array([1.0]), set={"off": 1.0})],
        observables={"A": ds.Observable(lambda t, y, p: p["s"] * y[0] + p["off"], sigma=0.1)},
        unknowns={
            "k": ds.Unknown(0.2, bounds=(1e-3, 1e2), scale="log10"),
            "s": ds.Unknown(0.7, bounds=(1e-3, 1e3), scale="log10"),
            "off": ds.Unknown(0.0, estimate=False),
        },
    )
    assert not offset.tables.scalings
    # an offset fixed at 0 that nothing sets leaves a pure scaling; an offset in time does not
    fixed = dataclasses.replace(offset.experiments[0], set=None)
    assert [
        offset.names[k]
        for k, _ in ds.Problem(model, [fixed], offset.observables, offset.unknowns).tables.scalings
    ] == ["s"]
    assert not study(lambda t, y, p: p["s"] * y[0] + t).tables.scalings
    # a factor or a σ that the initial state also reads reaches the model: neither is set in
    # closed form (read as a pure σ, it took a fit started at its optimum, llh 22.09, to −9.07)
    reads_s = ds.Problem(
        model,
        [ds.Experiment(data, y0=lambda p: jnp.stack([p["s"]]))],
        {"A": ds.Observable(lambda t, y, p: p["s"] * y[0], sigma="sd")},
        {
            "k": ds.Unknown(0.2, bounds=(1e-3, 1e2), scale="log10"),
            "s": ds.Unknown(0.7, bounds=(1e-3, 1e3), scale="log10"),
            "sd": ds.Unknown(0.1, bounds=(1e-3, 1.0), scale="log10"),
        },
    )
    assert not reads_s.tables.scalings and reads_s.tables.noise
    reads_sd = ds.Problem(
        model,
        [ds.Experiment(data, y0=lambda p: jnp.stack([p["sd"] * 100]))],
        {"A": ds.Observable(lambda t, y, p: y[0], sigma="sd")},
        {
            "k": ds.Unknown(0.2, bounds=(1e-3, 1e2), scale="log10"),
            "sd": ds.Unknown(0.1, bounds=(1e-3, 1.0), scale="log10"),
        },
    )
    assert not reads_sd.tables.noise
    # with a prior the closed form (which ignores it) is not used: s is fitted with the rest
    import numpyro.distributions as dist

    prior = dist.LogNormal(0.0, 1.0)
    assert not study(lambda t, y, p: p["s"] * y[0], prior=prior).tables.scalings


def test_bad_studies_are_refused_with_what_to_do():
    data = _long([1.0, 2.0], "y", np.array([0.5, 0.3]))
    observables = {"y": ds.Observable(lambda t, y, p: y[0], sigma="sigma")}
    unknowns = {"k": ds.Unknown(0.5, bounds=(1e-3, 10), scale="log10"), "sigma": 0.1}

    def problem(**change):
        arguments = dict(
            model=DECAY,
            experiments=[ds.Experiment(data, y0=jnp.array([1.0]))],
            observables=observables,
            unknowns=unknowns,
        )
        arguments.update(change)
        return ds.Problem(
            arguments.pop("model"),
            arguments.pop("experiments"),
            arguments.pop("observables"),
            arguments.pop("unknowns"),
            **arguments,
        )

    with pytest.raises(
        ValueError, match=r"set names 'kk', which is neither a parameter of ODE \(k\)"
    ):
        problem(experiments=[ds.Experiment(data, y0=jnp.array([1.0]), set={"kk": 1.0})])
    with pytest.raises(ValueError, match=r"observables\['y'\].sigma names 'noise'"):
        problem(observables={"y": ds.Observable(lambda t, y, p: y[0], sigma="noise")})
    # a ds.Data's own noise or weights would be ignored by a study (its σ are its observables')
    noisy = ds.Data(np.array([1.0, 2.0]), np.array([0.5, 0.3]), noise=0.1, names=("y",))
    with pytest.raises(ValueError, match="its ds.Data carries noise, which a study does not"):
        problem(experiments=[ds.Experiment(noisy, y0=jnp.array([1.0]))])
    # what the functions do is checked when the problem is built (traced, nothing computed)
    with pytest.raises(ValueError, match=r"b's initial state has shape \(2,\), a's \(1,\)"):
        problem(
            experiments=[
                ds.Experiment(data, y0=jnp.array([1.0]), name="a"),
                ds.Experiment(data, y0=jnp.array([1.0, 2.0]), name="b"),
            ]
        )
    with pytest.raises(ValueError, match=r"observables\['y'\] returns shape \(2,\): one number"):
        problem(
            experiments=[ds.Experiment(data, y0=jnp.array([1.0, 2.0]))],
            observables={"y": ds.Observable(lambda t, y, p: y)},
        )
    with pytest.raises(
        ValueError, match=r"observables\['y'\] reads p\['scale'\], which is neither"
    ):
        problem(observables={"y": ds.Observable(lambda t, y, p: p["scale"] * y[0])})
    with pytest.raises(
        ValueError, match=r"sigma is 'noise', fixed at a value that is not positive"
    ):
        problem(
            observables={"y": ds.Observable(lambda t, y, p: y[0], sigma="noise")},
            unknowns={**unknowns, "noise": ds.Unknown(0.0, estimate=False)},
        )
    # a σ function that gives 0: no likelihood, and the warning says which measurement and why
    zero_sigma = problem(
        observables={"y": ds.Observable(lambda t, y, p: y[0], sigma=lambda t, y, p: 0.0 * y[0])},
        unknowns={"k": unknowns["k"]},
    )
    with pytest.warns(UserWarning, match=r"experiment 0's y at t = 1 has σ = 0: a noise level"):
        assert np.isnan(zero_sigma.llh())
    # a value outside its bound (a warning): uniform starts lie within the bounds all the same
    with pytest.warns(UserWarning, match="outside its bounds"):
        beyond = problem(unknowns={"k": ds.Unknown(5.0, bounds=(None, 1.0)), "sigma": 0.1})
    assert np.all(beyond.uniform_starts(8)[:, 0] <= 1.0)
    with pytest.warns(UserWarning, match=r"unknowns \['kk'\] are estimated but read by nothing"):
        problem(unknowns={**unknowns, "kk": ds.Unknown(1.0)})
    # an unknown every experiment sets to a number of its own is as unread: its fit stayed at
    # its start, "converged"
    with pytest.warns(UserWarning, match=r"unknowns \['k'\] are estimated, but every experiment"):
        problem(experiments=[ds.Experiment(data, y0=jnp.array([1.0]), set={"k": 0.5})])
    # y[0] of a scalar y0: JAX's bare IndexError named neither the observable nor the y0
    with pytest.raises(ValueError, match=r"observables\['y'\] cannot read the state, of shape"):
        problem(experiments=[ds.Experiment(data, y0=1.0)])
    # a data column sets its rows' observables and σ, not the experiment's one simulation: a
    # column naming the model's k was silently ignored by it
    column = {**data, "k": np.full(len(data["time"]), 5.0)}
    with pytest.raises(ValueError, match=r"data column 'k' names a parameter its simulation"):
        problem(experiments=[ds.Experiment(column, y0=jnp.array([1.0]))])
    with pytest.raises(ValueError, match=r"data column 'a' names a parameter its simulation"):
        problem(
            experiments=[
                ds.Experiment(
                    {**data, "a": np.ones(len(data["time"]))}, y0=lambda p: jnp.stack([p["a"]])
                )
            ],
            unknowns={**unknowns, "a": ds.Unknown(1.0)},
        )
    with pytest.raises(ValueError, match=r"name observables \['z'\] the study does not define"):
        problem(experiments=[ds.Experiment(_long([1.0], "z", np.ones(1)), y0=jnp.ones(1))])
    with pytest.raises(ValueError, match="log10-normal noise, but a measurement of it is -1"):
        problem(
            experiments=[ds.Experiment(_long([1.0], "y", -np.ones(1)), y0=jnp.ones(1))],
            observables={"y": ds.Observable(lambda t, y, p: y[0], noise="log10-normal")},
        )
    with pytest.raises(ValueError, match="precedes its t0 = 2"):
        problem(experiments=[ds.Experiment(data, y0=jnp.array([1.0]), t0=2.0)])
    # a NaN t0 gave an llh of NaN whose warning blamed a failed simulation
    with pytest.raises(ValueError, match="t0 must be finite, got nan"):
        problem(experiments=[ds.Experiment(data, y0=jnp.array([1.0]), t0=float("nan"))])
    # unnamed ds.Data columns against two observables: their order would be a guess (columns
    # (B, A) were read as (A, B), silently)
    two = {
        "y": ds.Observable(lambda t, y, p: y[0]),
        "z": ds.Observable(lambda t, y, p: 2 * y[0]),
    }
    unnamed = ds.Data(np.array([1.0, 2.0]), np.ones((2, 2)))
    with pytest.raises(ValueError, match=r"name its columns after the study's observables"):
        problem(experiments=[ds.Experiment(unnamed, y0=jnp.array([1.0]))], observables=two)
    text = {"time": [1.0, 2.0], "observable": ["y", "y"], "value": [0.5, "n/a"]}
    with pytest.raises(ValueError, match="its value column holds 'n/a' at row 1, which is no"):
        problem(experiments=[ds.Experiment(text, y0=jnp.array([1.0]))])
    with pytest.raises(TypeError, match="takes fixed steps: use ds.Rodas5P"):
        problem(solver=ds.RK4())
    with pytest.raises(ValueError, match="a value on a log scale must be positive"):
        ds.Unknown(-1.0, scale="log10")
    # a value outside the bounds is a nominal value (PEtab allows it): warned, and fits
    # start from the nearest bound
    with pytest.warns(UserWarning, match="outside its bounds.*start from the nearest bound"):
        outside = ds.Unknown(20.0, bounds=(0, 10))
    assert outside.value == 20.0
    with pytest.raises(ValueError, match="noise=.*must be one of"):
        ds.Observable(lambda t, y, p: y[0], noise="gaussian")
    # a problem that estimates nothing evaluates (its llh at the values given) but fits nothing
    fixed = problem(unknowns={"sigma": ds.Unknown(0.1, estimate=False)})
    assert np.isfinite(fixed.llh())
    with pytest.raises(ValueError, match="ds.fit: no unknown of the problem is estimated"):
        ds.fit(fixed)
    with pytest.raises(TypeError, match=r"ds.fit\(problem\) takes its model, data.*\['y0'\]"):
        ds.fit(problem(), jnp.ones(1))
    with pytest.raises(TypeError, match=r"observables\['y'\].sigma is called as fn\(t, y, p\)"):
        problem(observables={"y": ds.Observable(lambda t, y, p: y[0], sigma=lambda t, y: y[0])})
    # a σ no parameter value mends (a function of the state that is negative): refused after
    # the screen, with the reason, instead of starts that end where they began
    negative = {"y": ds.Observable(lambda t, y, p: y[0], sigma=lambda t, y, p: -0.1 + 0 * y[0])}
    with pytest.raises(ValueError, match=r"none of the 64 screened.*σ = -0.1: a noise level must"):
        ds.fit(problem(observables=negative, unknowns={"k": unknowns["k"]}))


def test_bounded_levenberg_marquardt_matches_scipy_with_active_bounds():
    """A nonlinear least-squares problem whose unconstrained optimum lies outside the box: the
    bounded Levenberg–Marquardt step ends on the bound, where scipy's trust-region reflective
    method does, with the free unknown at its conditional optimum."""
    import jax
    from scipy.optimize import least_squares

    from diffsim._fit import bounded_lm

    t = np.linspace(0.0, 2.0, 12)
    data = 2.5 * np.exp(-1.3 * t) + 0.4

    def residual(x):  # amplitude, rate, offset: the offset is held to <= 0.1
        return x[0] * jnp.exp(-x[1] * jnp.asarray(t)) + x[2] - jnp.asarray(data)

    lower, upper = np.array([0.0, 0.0, -1.0]), np.array([10.0, 10.0, 0.1])
    optimum = jax.jit(
        lambda x0: bounded_lm.minimize(
            residual, x0, lower, upper, max_steps=200, rtol=1e-10, atol=1e-12
        )
    )(jnp.array([1.0, 0.5, 0.0]))
    reference = least_squares(
        lambda x: np.asarray(residual(x)),
        [1.0, 0.5, 0.0],
        bounds=(lower, upper),
        xtol=1e-14,
        ftol=1e-14,
        gtol=1e-14,
    )
    assert int(optimum.code) == 0
    assert float(optimum.u[2]) == 0.1  # on the bound, exactly (projected)
    np.testing.assert_allclose(optimum.u, reference.x, rtol=1e-7)


def test_bounded_levenberg_marquardt_stalls_where_derivatives_disagree():
    """Derivatives that disagree with the objective (here the slope's sign flipped, as a solve
    that fails near the iterate makes them disagree): no step lowers the loss, the damping
    grows without bound, and the gradient stays far from zero. That ends as `stalled`, not
    `converged` (it was reported converged, at llh -8000 on Fujita's random starts); the
    same objective with its true derivative converges to the root."""
    import jax

    from diffsim._fit import bounded_lm
    from diffsim._fit.optimize import FIT_RESULTS

    @jax.custom_jvp
    def wrong(x):
        return x

    @wrong.defjvp
    def _(primals, tangents):
        return wrong(primals[0]), -tangents[0]

    def run(residual):
        return bounded_lm.minimize(
            residual, jnp.array([3.0]), -10.0, 10.0, max_steps=200, rtol=1e-8, atol=1e-10
        )

    stalled = jax.jit(lambda: run(lambda x: wrong(x) - 1.0))()
    assert int(stalled.code) == FIT_RESULTS.stalled
    assert float(stalled.u[0]) == 3.0  # every step was rejected
    assert "no step lowers the loss" in FIT_RESULTS(int(stalled.code)).message
    right = jax.jit(lambda: run(lambda x: x - 1.0))()
    assert int(right.code) == FIT_RESULTS.converged
    np.testing.assert_allclose(right.u, [1.0], atol=1e-10)


def test_bounded_levenberg_marquardt_damps_unknowns_the_data_barely_see():
    """An unknown whose Jacobian column is 1e-15 of the other's (a rate whose reaction has not
    started): with MINPACK's scaling alone its damped step is the other's over 1e-15 at any
    damping, every trial crosses the box to where the model fails (here r is NaN below
    x1 = -100), and the fit stalled at its start (x0 = 3). Floored, the scaling keeps the step
    where the linearisation holds, and the fit converges to x0 = 1 in a few steps."""
    import jax

    from diffsim._fit import bounded_lm
    from diffsim._fit.optimize import FIT_RESULTS

    def residual(x):
        return jnp.stack([x[0] + 1e-15 * x[1] - 1.0, 1e-15 * jnp.sqrt(x[1] + 100.0)])

    optimum = jax.jit(
        lambda x0: bounded_lm.minimize(
            residual,
            x0,
            jnp.array([-10.0, -1000.0]),
            jnp.array([10.0, 1000.0]),
            max_steps=100,
            rtol=1e-8,
            atol=1e-10,
        )
    )(jnp.array([3.0, 5.0]))
    assert int(optimum.code) == FIT_RESULTS.converged
    assert int(optimum.steps) <= 10
    np.testing.assert_allclose(optimum.u[0], 1.0, atol=1e-10)
    assert float(optimum.u[1]) > -100.0


def test_bounded_levenberg_marquardt_ends_as_soon_as_the_optimum_is_resolved():
    """A decay's residuals with a floor (the log-σ roots of a likelihood: the loss is not 0 at
    the optimum), at doses 1, 8 and 64: the landscape is the same in x, so is the number of
    iterations, to one (the loss near the optimum is 64² times as sensitive to x at dose 64,
    and the Gauss–Newton step's predicted decrease takes one more quadratic step to fall below
    `bounded_lm._FLAT` × rtol of the loss: 4, 4 and 5 iterations). At the optimum the
    Gauss–Newton step (1e-13) changes the loss by 0 and is rejected; it took 16 iterations at
    doses 8 and 64 (the damping raised until it was "stuck") against 5 at dose 1, and a study
    of eight doses ran 3.3× one dose's time."""
    import jax

    from diffsim._fit import bounded_lm
    from diffsim._fit.optimize import FIT_RESULTS

    t = jnp.linspace(0.5, 4.0, 8)
    steps = []
    for dose in (1.0, 8.0, 64.0):

        def residual(x, dose=dose):
            decay = dose * (jnp.exp(-(10 ** x[0]) * t) - jnp.exp(-0.7 * t)) / 0.01
            return jnp.concatenate([decay, jnp.full(8, 5.7)])

        optimum = jax.jit(
            lambda x0, residual=residual: bounded_lm.minimize(
                residual,
                x0,
                jnp.array([-3.0]),
                jnp.array([1.0]),
                max_steps=50,
                rtol=1e-8,
                atol=1e-10,
            )
        )(jnp.array([np.log10(0.3)]))
        assert int(optimum.code) == FIT_RESULTS.converged
        # Gauss–Newton converges quadratically here: the last accepted step was 3e-9
        np.testing.assert_allclose(optimum.u, [np.log10(0.7)], atol=1e-12)
        steps.append(int(optimum.steps))
    assert max(steps) - min(steps) <= 1 and max(steps) <= 6, steps


def _piecewise_turnover(ts, start, k_in, k_out, pieces):
    """The closed form through `pieces`: (time, stimulus from then on, state set or None)."""
    out, t_now, y_now, stimulus = [], 0.0, start, 0.0
    for t in ts:
        for at, new_stimulus, new_state in pieces:
            if t_now <= at <= t:
                y_now = _turnover(at - t_now, y_now, k_in, k_out, stimulus)
                t_now, stimulus = at, new_stimulus
                y_now = new_state(y_now) if new_state else y_now
        out.append(_turnover(t - t_now, y_now, k_in, k_out, stimulus))
        pieces = [p for p in pieces if p[0] > t]
    return np.asarray(out)


def test_changes_at_given_times_doses_and_switches_from_exact_data():
    """A dose added at t = 2 (a function of the state and an estimated amount), a stimulus
    switched on at 1.5 and off at 4 (measured exactly at 4: the state is continuous there), and
    two experiments of one batch whose states are set to numbers at different times. Exact
    data from the piecewise closed form: every unknown recovered; the predictions match it."""
    truth = dict(k_in=2.0, k_out=0.5, dose=3.0)
    ts = np.array([0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.5, 8.0])
    k_in, k_out = truth["k_in"], truth["k_out"]

    def closed(pieces):
        return _piecewise_turnover(ts, 1.0, k_in, k_out, pieces)

    dosed = closed([(2.0, 0.0, lambda y: y + truth["dose"])])
    switched = closed([(1.5, 1.0, None), (4.0, 0.0, None)])
    reset_early = closed([(3.0, 0.0, lambda y: 0.5)])
    reset_late = closed([(5.0, 0.0, lambda y: 6.0)])
    observables = {"y": ds.Observable(lambda t, y, p: y[0], sigma=0.1)}
    experiments = [
        ds.Experiment(
            _long(ts, "y", dosed),
            y0=jnp.array([1.0]),
            changes=[(2.0, {0: lambda y, p: y[0] + p["dose"]})],
        ),
        ds.Experiment(
            _long(ts, "y", switched),
            y0=jnp.array([1.0]),
            changes={4.0: {"stimulus": 0.0}, 1.5: {"stimulus": "on"}},
        ),
        ds.Experiment(_long(ts, "y", reset_early), y0=jnp.array([1.0]), changes=[(3.0, {0: 0.5})]),
        ds.Experiment(_long(ts, "y", reset_late), y0=jnp.array([1.0]), changes=[(5.0, {0: 6.0})]),
    ]
    unknowns = {
        "k_in": ds.Unknown(1.0, bounds=(1e-3, 1e3), scale="log10"),
        "k_out": ds.Unknown(1.0, bounds=(1e-3, 1e3), scale="log10"),
        "dose": ds.Unknown(1.0, bounds=(1e-3, 1e3), scale="log10"),
        "on": ds.Unknown(1.0, estimate=False),
    }
    model = _Turnover(jnp.array(1.0), jnp.array(1.0), jnp.array(0.0))
    problem = ds.Problem(model, experiments, observables, unknowns)
    # the two resets share one batch; the dose and the switches have batches of their own
    assert len(problem.tables.groups) == 3
    exact = [dosed, switched, reset_early, reset_late]
    at_truth = problem.predictions(truth)
    for prediction, expected in zip(at_truth, exact):
        # the solver's tolerance (rtol 1e-8, atol 1e-10)
        np.testing.assert_allclose(prediction["prediction"], expected, rtol=1e-7, atol=1e-8)
    result = ds.fit(problem)
    assert result.converged
    for name, value in truth.items():
        assert result.params[name] == pytest.approx(value, rel=1e-6), name
    # reverse mode through the segments: the gradient equals central differences (step 1e-6:
    # error ~1e-12 relative to an llh of ~1e3, to 1e-6 relative on the gradient)
    theta = jnp.array([1.5, 0.7, 2.0])
    gradient = jax.grad(problem.log_likelihood)(theta)
    for i in range(3):
        step = jnp.zeros(3).at[i].set(1e-6)
        central = (
            problem.log_likelihood(theta + step) - problem.log_likelihood(theta - step)
        ) / 2e-6
        assert gradient[i] == pytest.approx(float(central), rel=1e-5), i


def test_changes_after_a_pre_equilibration_start_from_the_rest():
    """At rest without the stimulus (y = k_in / k_out = 4), the stimulus 1 from t0 and 3 from
    t = 1.5: the piecewise closed form."""
    ts = np.array([0.5, 1.0, 2.0, 3.0])
    model = _Turnover(jnp.array(2.0), jnp.array(0.5), jnp.array(0.0))
    experiment = ds.Experiment(
        _long(ts, "y", np.ones(4)),
        y0=jnp.array([1.0]),
        set={"stimulus": 1.0},
        pre_equilibrate={"stimulus": 0.0},
        changes=[(1.5, {"stimulus": 3.0})],
    )
    observables = {"y": ds.Observable(lambda t, y, p: y[0], sigma=0.1)}
    problem = ds.Problem(model, [experiment], observables, {"k_in": 2.0})
    before = _turnover(ts[:2], 4.0, 2.0, 0.5, 1.0)
    after = _turnover(ts[2:] - 1.5, _turnover(1.5, 4.0, 2.0, 0.5, 1.0), 2.0, 0.5, 3.0)
    # the solver's tolerance (rtol 1e-8), and the steady state's (its own tolerance 1e-8)
    np.testing.assert_allclose(
        problem.predictions()[0]["prediction"], np.concatenate([before, after]), rtol=1e-7
    )


def test_a_name_in_a_change_means_that_parameters_value_just_before_it():
    """y' = k_in (k_out = 0): the experiment sets level = 5 (its base value is 2); at t = 1
    the state is set to level and k_in to level; at t = 2 level becomes 7 and the state is
    set to level as it was just before (5, as SBML evaluates an event's assignments):
    y(1.5) = 5 + 0.5·5, y(3) = 5 + 1·5."""
    model = _Turnover(jnp.array(0.0), jnp.array(0.0), jnp.array(0.0))
    experiment = ds.Experiment(
        _long([1.5, 3.0], "y", [1.0, 1.0]),
        y0=jnp.array([1.0]),
        set={"level": 5.0},
        changes=[(1.0, {0: "level", "k_in": "level"}), (2.0, {"level": 7.0, 0: "level"})],
    )
    observables = {"y": ds.Observable(lambda t, y, p: y[0], sigma=0.1)}
    unknowns = {"level": ds.Unknown(2.0, estimate=False), "k_out": 0.0}
    problem = ds.Problem(model, [experiment], observables, unknowns)
    # y' is constant in each segment, which every Runge–Kutta step integrates exactly:
    # only rounding differs
    np.testing.assert_allclose(problem.predictions()[0]["prediction"], [7.5, 10.0], rtol=1e-9)


def test_bad_changes_are_refused_naming_the_change():
    model = _Turnover(jnp.array(1.0), jnp.array(1.0), jnp.array(0.0))
    data = _long([1.0, 2.0], "y", [1.0, 1.0])
    observables = {"y": ds.Observable(lambda t, y, p: y[0], sigma=0.1)}

    def build(changes, t0=0.0):
        experiment = ds.Experiment(data, y0=jnp.array([1.0]), t0=t0, changes=changes)
        return ds.Problem(model, [experiment], observables, {"k_out": 1.0})

    with pytest.raises(ValueError, match="names 'kout', which is neither a parameter"):
        build([(1.0, {"kout": 2.0})])
    with pytest.raises(ValueError, match="precedes its t0"):
        build([(-1.0, {"k_out": 2.0})])
    with pytest.raises(ValueError, match="finite number"):
        build([(1.0, {0: float("nan")})])
    with pytest.raises(ValueError, match="two changes at t = 1"):
        build([(1.0, {"k_out": 2.0}), (1.0, {0: 2.0})])
    with pytest.raises(TypeError, match="assigns states only"):
        build([(1.0, {"k_out": lambda y, p: 2.0})])
    with pytest.raises(ValueError, match="names no parameter"):
        build([(1.0, {0: "dose"})])
    with pytest.raises(TypeError, match="pair"):
        build([1.0])


def test_experiments_of_one_kind_compile_no_more_programs_than_one():
    """Eight doses of one study run as one batch (one solve in the program, `lax.map`ped on a
    CPU): the fit compiles the same number of programs as a study of one experiment."""
    from studies import decay_study
    from test_compile import _compiles

    study = decay_study
    one, one_count = _compiles(lambda: ds.fit(study([1.0]), screen=0).params)
    eight, eight_count = _compiles(lambda: ds.fit(study(np.arange(1.0, 9.0)), screen=0).params)
    assert eight_count <= one_count, (one_count, eight_count)
    assert one["k"] == pytest.approx(0.7, rel=1e-6) and eight["k"] == pytest.approx(0.7, rel=1e-6)


def test_a_fits_forward_passes_take_the_experiments_in_turn_as_a_batch_would(monkeypatch):
    """On a CPU a fit's forward-mode passes (its residuals and their Jacobian) simulate the
    experiments of a group one after another (`lax.map`), elsewhere as one vmapped batch: the
    same residuals and Jacobian either way (to round-off), and the same as `simulate`'s default
    rule gives, on three experiments with a parametric start and pre-equilibrations."""
    from diffsim._fit import study_objective
    from diffsim._fit.study_objective import residuals_and_terms

    assert jax.default_backend() in study_objective._IN_TURN_ON  # so `in_turn` is in turn
    problem, *_ = _three_turnovers()
    theta = jnp.asarray([1.3, 0.8, 2.5, 0.6])  # natural values of problem.names, not the truth

    def linearised(forward):
        rows = lambda x: residuals_and_terms(problem, x, forward=forward)[0]  # noqa: E731
        return jax.jit(lambda x: (rows(x), jax.jacfwd(rows)(x)))(theta)

    in_turn = linearised(True)
    default = linearised(False)
    monkeypatch.setattr(study_objective, "_IN_TURN_ON", ())
    batched = linearised(True)
    for a, b, c in zip(in_turn, batched, default):
        assert np.all(np.isfinite(a)) and np.max(np.abs(a)) > 1.0
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(a, c, rtol=1e-12, atol=1e-12)


def test_a_fits_jacobian_takes_no_tangent_of_the_solves_for_noise_and_scalings():
    """A noise level and an observable's scaling reach no simulation (`Tables.simulated`),
    and the unknowns each experiment reads are known (`Tables.reads`): the fit's Jacobian
    takes the solves' tangents for the four unknowns they read only, shared by unknowns no
    experiment reads together (k_out_treated, only the third's rate, with k_out or y_start,
    which the third does not read: 3 tangents), and the rest by the chain rule through the
    observation, `jax.jacfwd` of the residuals to round-off, on `_three_turnovers`'
    experiments (a parametric start, pre-equilibrations)."""
    from diffsim._fit import study_fit
    from diffsim._fit.study_objective import residuals_and_terms, to_natural_values

    three, *_ = _three_turnovers()
    problem = ds.Problem(
        three.model,
        three.experiments,
        {"y": ds.Observable(lambda t, y, p: p["scale"] * y[0], sigma="sigma")},
        {
            **three.unknowns,
            "scale": ds.Unknown(1.0, bounds=(0.1, 10.0), scale="log10"),
            "sigma": ds.Unknown(0.1, bounds=(1e-3, 1.0), scale="log10"),
        },
    )
    assert problem.names[4:] == ("scale", "sigma")
    assert problem.tables.simulated.tolist() == [True] * 4 + [False] * 2
    # per experiment (12 measurements each): k_in, k_out, k_out_treated, y_start read
    reads = problem.tables.reads.reshape(3, 12, 6)
    assert np.all(reads == reads[:, :1])
    assert reads[:, 0].tolist() == [
        [True, True, False, True, False, False],
        [True, True, False, False, False, False],
        [True, False, True, False, False, False],
    ]
    colours = study_fit._colours(problem.tables.reads[:, :4])
    assert len(set(colours.tolist())) == 3  # k_in, k_out and y_start are read together
    assert all(len(set(colours[row].tolist())) == row.sum() for row in reads[:, 0, :4])
    scaled = jnp.asarray([0.1, -0.2, 0.4, -0.3, 0.2, -1.5])  # on the log10 scales

    def rows(s):
        natural = to_natural_values(s, problem.tables.scales)
        return residuals_and_terms(problem, natural, forward=True)[0]

    linearise = study_fit._linearisation(problem)
    r, jacobian, _ = jax.jit(linearise)(scaled)
    expected_r, expected = jax.jit(lambda s: (rows(s), jax.jacfwd(rows)(s)))(scaled)
    np.testing.assert_allclose(r, expected_r, rtol=1e-13)
    np.testing.assert_allclose(jacobian, expected, rtol=1e-10, atol=1e-12 * np.abs(expected).max())
    assert np.all(np.abs(jacobian).max(axis=0) > 1e-3)  # every column, scale and σ included


def test_a_float32_study_with_the_defaults_is_each_experiment_alone_and_fits():
    """In float32 with the default solver: a batch of experiments with 3 and 6 measurement
    times (the shorter one's padded past its end), a t0 1e-8 from a measurement time (one
    time in float32) and a third started from the rest of another rate (pre-equilibration,
    the default rest test): the study's llh is the sum of each experiment's alone, to float32
    round-off, and the fit recovers both rates from exact data to 1e-4. Before, padding 1e-9
    apart made the shorter member's solve fail (llh NaN), and the float64 defaults (rtol 1e-8
    of the solver, 1e-8/1e-10 of the rest test) a rest never reached (NaN): the fit
    "converged" far from the truth."""
    with jax.enable_x64(False):
        k, k_rest = 0.5, 2.0
        short = _long([0.5, 1.0, 1.5], "y", np.exp(-k * np.array([0.5, 1.0, 1.5])))
        times = np.linspace(0.5, 3.0, 6)
        long = _long(times, "y", np.exp(-k * (times - 0.5 + 1e-8)))
        # y' = s − k y: at rest under s = 1, k_rest, then decaying with k from 1 / k_rest
        rested = _long(times, "y", np.exp(-k * times) / k_rest)
        experiments = [
            ds.Experiment(short, y0=jnp.ones(1), name="short"),
            ds.Experiment(long, y0=jnp.ones(1), t0=0.5 - 1e-8, name="long"),
            ds.Experiment(
                rested,
                y0=jnp.ones(1),
                pre_equilibrate={"s": 1.0, "k": "k_rest"},
                name="from rest",
            ),
        ]

        def study(members):
            return ds.Problem(
                ds.ODE(lambda t, y, p: p["s"] - p["k"] * y, {"k": 1.0, "s": 0.0}),  # float32
                members,
                {"y": ds.Observable(lambda t, y, p: y[0], sigma=0.1)},
                {
                    "k": ds.Unknown(1.0, bounds=(0.01, 10.0), scale="log10"),
                    "k_rest": ds.Unknown(
                        1.0,
                        bounds=(0.01, 10.0),
                        scale="log10",
                        # held where no member rests (nothing reads it there)
                        estimate=any(m.pre_equilibrate for m in members),
                    ),
                },
            )

        every = study(experiments)
        assert float(every.solver.rtol) == pytest.approx(1e-5)
        alone = [study([e]).llh() for e in experiments]
        assert np.all(np.isfinite(alone))
        # a member of the batch takes its own steps, which may differ from its steps alone
        # (the batch's padded output times): each prediction agrees within 10x the solver's
        # tolerance (a global error), and the llh within what such a change of the
        # predictions moves it, Σ |r| δ/σ (residuals r ~ 2 at k = 1: ~1e-4, above float32's
        # round-off of the sum; measured 5.6e-5 relative on one CPU, < 1e-5 on another)
        bound = 0.0
        for batched, single in zip(
            every.predictions(), (study([e]).predictions()[0] for e in experiments)
        ):
            allowed = 10 * (1e-5 * np.abs(single["prediction"]) + 1e-7)
            np.testing.assert_array_less(
                np.abs(batched["prediction"] - single["prediction"]), allowed
            )
            bound += np.sum(np.abs(single["residual"]) * allowed / single["sigma"])
        assert abs(every.llh() - sum(alone)) <= bound
        fit = ds.fit(every, progress=False)
        assert fit.params["k"] == pytest.approx(k, rel=1e-4)
        assert fit.params["k_rest"] == pytest.approx(k_rest, rel=1e-4)
        # a factor that only scales an observable is found in float32 too (its linearity
        # checked to float32's round-off, not float64's)
        scaled = ds.Problem(
            every.model,
            experiments[:1],
            {"y": ds.Observable(lambda t, y, p: p["scale"] * y[0], sigma=0.1)},
            {"k": ds.Unknown(1.0, bounds=(0.01, 10.0)), "scale": ds.Unknown(1.0)},
        )
        assert [scaled.names[j] for j, _ in scaled.tables.scalings] == ["scale"]


def test_reverse_mode_gradients_equal_forward_mode_where_a_prediction_is_zero():
    """y' = k, y(0) = 0, measured at t = 0 (the prediction exactly 0) with normal noise, and at
    later times with Laplace and log10-normal noise, σ estimated: `jax.grad` of the
    log-likelihood equals the forward-mode derivative (round-off). It was NaN for every model
    parameter: the log of the linear rows' predictions, though not selected, had the
    derivative 1/0 there, which reverse mode multiplies by the zero sent to it (ds.sample and
    ds.train take such gradients)."""
    ts = np.array([0.0, 0.5, 1.0, 2.0])
    data = _concat(
        _long(ts, "y", np.array([0.01, 0.9, 2.1, 3.9])),
        _long(ts[1:], "z", np.array([1.1, 1.9, 4.2])),
        _long(ts[1:], "w", np.array([0.8, 2.2, 4.1])),
    )
    problem = ds.Problem(
        ds.ODE(lambda t, y, p: jnp.broadcast_to(p["k"], y.shape), {"k": 1.0}),
        [ds.Experiment(data, y0=jnp.zeros(1))],
        {
            "y": ds.Observable(lambda t, y, p: y[0], sigma="s"),
            "z": ds.Observable(lambda t, y, p: y[0], noise="laplace", sigma="s"),
            "w": ds.Observable(lambda t, y, p: y[0], noise="log10-normal", sigma=0.1),
        },
        {"k": ds.Unknown(2.0, bounds=(0.1, 10.0)), "s": ds.Unknown(0.5, bounds=(0.01, 10.0))},
        solver=ds.Tsit5(rtol=1e-10, atol=1e-12),
    )
    theta = jnp.asarray(problem.theta())
    reverse = jax.grad(problem.log_likelihood)(theta)
    forward = jax.jacfwd(problem.log_likelihood)(theta)
    assert np.all(np.isfinite(reverse))
    np.testing.assert_allclose(reverse, forward, rtol=1e-10)


@pytest.mark.parametrize("name", ["Boehm", "Fujita", "Bruno"])
def test_published_studies_reproduce_their_log_likelihood(name):
    """The benchmark collection's studies written by hand (experiments/bench/_studies.py):
    the log-likelihood at the published parameters within 1e-3 of AMICI's (measured: 8e-7,
    9e-6, 4e-6; the solves' own tolerance, Rodas5P at rtol 1e-8)."""
    import _studies

    problem = _studies.STUDIES[name]()
    assert problem.llh() == pytest.approx(_studies.REFERENCE_LLH[name], abs=1e-3)


def test_profile_and_refit_of_a_study_of_two_experiments():
    """Two doses of a decay with a shared rate and an estimated noise level. The profile of k:
    its deviance is 2·(NLL rise) with σ refitted; near the optimum it follows the Fisher
    curvature, so its 95% interval on log10 k agrees with the Wald interval to a few percent
    (the model is nearly linear in log k over ±2 standard errors). Refits of datasets drawn
    from the fitted model: their intervals hold the fitted k in about 95% of them. Both run
    the fit's compiled program."""
    rng = np.random.default_rng(3)
    ts = np.linspace(0.5, 4.0, 8)
    data = [
        _long(ts, "y", dose * np.exp(-0.7 * ts) + 0.05 * rng.normal(size=ts.size))
        for dose in (1.0, 2.0)
    ]
    problem = ds.Problem(
        DECAY,
        [
            ds.Experiment(table, y0=jnp.array([dose]), name=f"dose {dose}")
            for table, dose in zip(data, (1.0, 2.0))
        ],
        {"y": ds.Observable(lambda t, y, p: y[0], sigma="sigma")},
        {
            "k": ds.Unknown(0.3, bounds=(1e-3, 10), scale="log10"),
            "sigma": ds.Unknown(0.2, bounds=(1e-4, 1), scale="log10"),
        },
    )
    result = ds.fit(problem)
    # each point of the profile and each replicate of a refit runs the fit's program
    from test_compile import _compiles

    profile, compiled = _compiles(lambda: ds.profile(result, "k", points=9))
    assert compiled == 0
    assert profile.deviance.min() >= -1e-6 and profile.converged.all()
    assert profile.deviance[4] == pytest.approx(0.0, abs=1e-6)  # the estimate itself
    # the Wald interval is the quadratic approximation of this deviance: at its 2-standard-
    # error ends they differ by the deviance's higher terms (measured 0.05 and 0.1 standard
    # errors here); 0.25 leaves a margin
    se = result.stderr["k"]
    for end, wald in zip(profile.interval, result.confidence_intervals["k"]):
        assert np.log10(end) == pytest.approx(np.log10(wald), abs=0.25 * se)

    k, sigma = result.params["k"], result.params["sigma"]
    rows = np.concatenate([ts, ts])
    doses = np.repeat([1.0, 2.0], ts.size)
    replicates = doses * np.exp(-k * rows) + sigma * rng.normal(size=(40, rows.size))
    batch, compiled = _compiles(lambda: ds.refit(result, replicates, start="fit"))
    assert compiled == 0 and batch.converged.all()
    # each replicate's information comes from the Jacobian its fit ended with; the forward
    # pass of the Fisher residuals at its optimum gives the same standard errors (the same
    # derivatives in another order: they differed by 4e-16 relative)
    from diffsim._fit.study_fit import _information

    scaled = np.log10([batch.params[n][0] for n in result.names])
    information = _information(problem, jnp.asarray(scaled), jnp.asarray(replicates[0]))
    expected = np.sqrt(np.diag(np.linalg.inv(np.asarray(information))))
    got = [batch.stderr[n][0] for n in result.names]
    np.testing.assert_allclose(got, expected, rtol=1e-8)
    covered = batch.coverage({"k": k})["k"]
    assert 0.8 <= covered <= 1.0  # 40 replicates of a 95% interval: 0.95 ± 2 × 0.034
    with pytest.raises(ValueError, match=r"values must have shape \(replicates, 16\)"):
        ds.refit(result, replicates[:, :3])


def test_the_posterior_of_a_study_of_two_experiments_is_the_conjugate_one(tmp_path):
    """y' = a in two experiments (starts 0 and 1), m = y + N(0, σ²) with σ known and a ~
    N(μ0, s0²): the posterior of a is normal with precision 1/s0² + Σt²/σ² (each experiment's
    times counted); NUTS draws match its mean (4 Monte Carlo errors) and sd (10%)."""
    rng = np.random.default_rng(4)
    ts = np.linspace(1.0, 4.0, 6)
    sigma, mu0, s0, a = 0.5, 0.0, 0.3, 0.8
    starts = (0.0, 1.0)
    data = [_long(ts, "y", y0 + a * ts + sigma * rng.normal(size=ts.size)) for y0 in starts]
    problem = ds.Problem(
        ds.ODE(lambda t, y, p: p["a"] + 0 * y, {"a": 0.1}),
        [ds.Experiment(d, y0=jnp.array([y0]), name=f"from {y0}") for d, y0 in zip(data, starts)],
        {"y": ds.Observable(lambda t, y, p: y[0], sigma=sigma)},
        {"a": ds.Unknown(0.1, prior=_normal(mu0, s0))},
        solver=ds.Tsit5(rtol=1e-10, atol=1e-10),
    )
    import jax

    posterior = ds.sample(problem, chains=2, warmup=300, draws=500, key=jax.random.key(0))
    times = np.concatenate([ts, ts])
    measured = np.concatenate([d["value"] for d in data]) - np.repeat(starts, ts.size)
    precision = 1 / s0**2 + np.sum(times**2) / sigma**2
    mean = (mu0 / s0**2 + np.sum(times * measured) / sigma**2) / precision
    row = posterior.table()["a"]
    assert abs(row["mean"] - mean) < 4 * row["mcse"]
    assert row["sd"] == pytest.approx(1 / np.sqrt(precision), rel=0.1)
    assert posterior.samples["a"].shape == (2, 500) and posterior.likelihood == "study"
    # its file: no observed data (the measurements are the problem's), read back as it was
    loaded = ds.Posterior.load(posterior.save(tmp_path / "study.nc"))
    np.testing.assert_array_equal(loaded.samples["a"], posterior.samples["a"])
    assert loaded.data is None and loaded.settings == posterior.settings
    with pytest.raises(ValueError, match="predicts through its problem"):
        posterior.predict()


def test_a_python_float_field_is_a_parameter_of_the_study():
    """`k: float` (as the hybrid-models page writes fields, and as ds.fit(model, params=["k"])
    takes them) is a model parameter of a study: an unknown of its name moves the
    predictions and is estimated (it was left out: the llh did not depend on k, a warning
    blamed a typo, and the fit 'converged' at the start)."""

    class Decay(ds.AbstractODE):
        k: float

        def vector_field(self, t, y, args=None):
            return -self.k * y

    ts = np.linspace(0.5, 3.0, 6)
    data = {"time": ts, "observable": ["y"] * ts.size, "value": 2.0 * np.exp(-0.7 * ts)}
    problem = ds.Problem(
        Decay(0.3),
        [ds.Experiment(data, y0=jnp.array([2.0]))],
        {"y": ds.Observable(lambda t, y, p: y[0], sigma=0.01)},
        {"k": ds.Unknown(0.3, bounds=(1e-2, 1e2), scale="log10")},
    )
    assert "k" in problem.model_parameters
    assert problem.llh({"k": 0.7}) > problem.llh({"k": 0.3}) + 100
    fit = ds.fit(problem, starts=1, progress=False)
    assert fit.params["k"] == pytest.approx(0.7, rel=1e-6)


def test_profile_intervals_of_a_gaussian_study_are_exact_on_any_grid():
    """y = b + a·t with σ known: the profile deviance of a is the parabola ((a − â)/se)², so
    its 95% interval is â ± 1.96·se on any grid (interpolated in √deviance; linear in the
    deviance, a 4-point grid gave an interval 11% too narrow, and a wide 5-point range one
    85% too narrow on a log scale). A range outside the bounds is refused."""
    rng = np.random.default_rng(1)
    ts = np.linspace(0.0, 4.0, 9)
    data = {"time": ts, "observable": ["y"] * 9, "value": 1 + 0.5 * ts + 0.1 * rng.normal(size=9)}
    problem = ds.Problem(
        ds.ODE(lambda t, y, p: jnp.stack([p["a"]]), {"a": 0.3}),
        [ds.Experiment(data, y0=lambda p: jnp.stack([p["b"]]))],
        {"y": ds.Observable(lambda t, y, p: y[0], sigma=0.1)},
        {"a": ds.Unknown(0.3, bounds=(-5.0, 5.0)), "b": ds.Unknown(0.5, bounds=(-5.0, 5.0))},
        solver=ds.Tsit5(rtol=1e-10, atol=1e-12),
    )
    result = ds.fit(problem, progress=False)
    design = np.stack([ts, np.ones_like(ts)], axis=1)
    se = 0.1 * np.sqrt(np.linalg.inv(design.T @ design)[0, 0])
    exact = result.params["a"] + np.array([-1, 1]) * 1.959964 * se
    np.testing.assert_allclose(ds.profile(result, "a", points=4).interval, exact, atol=1e-5 * se)
    with pytest.warns(ds.FitWarning, match="profile grid is coarse"):
        wide = ds.profile(result, "a", range=(-5.0, 5.0), points=5)
    np.testing.assert_allclose(wide.interval, exact, atol=1e-5 * se)
    with pytest.raises(ValueError, match=r"range \(6.0, 7.0\) lies outside its bounds"):
        ds.profile(result, "a", range=(6.0, 7.0), points=3)


def test_profile_of_a_scaling_with_estimated_noise_matches_the_closed_form():
    """y = s·e^{−kt} with s, k and σ estimated: at a pinned s the profile's σ is the maximum-
    likelihood σ for that s, so the deviance is n·log(S_min(s)/Ŝ) (S the residual sum of
    squares, minimised over k). The closed-form refinement moved s to its own optimum, set σ
    from those residuals (σ too small for the pinned s), then s was clipped back: deviances up
    to 0.39 too large, a too narrow interval, 20 of 21 points unconverged."""
    from scipy.optimize import minimize_scalar

    rng = np.random.default_rng(7)
    ts = np.linspace(0.3, 4.0, 12)
    values = 2.0 * np.exp(-0.5 * ts) + 0.05 * rng.normal(size=ts.size)
    problem = ds.Problem(
        DECAY,
        [ds.Experiment(_long(ts, "y", values), y0=jnp.array([1.0]))],
        {"y": ds.Observable(lambda t, y, p: p["s"] * y[0], sigma="sigma")},
        {
            "k": ds.Unknown(0.3, bounds=(1e-3, 10.0), scale="log10"),
            "s": ds.Unknown(1.0, bounds=(0.01, 100.0), scale="log10"),
            "sigma": ds.Unknown(0.1, bounds=(1e-4, 10.0), scale="log10"),
        },
        solver=ds.Tsit5(rtol=1e-10, atol=1e-12),
    )
    result = ds.fit(problem, progress=False)
    profile = ds.profile(result, "s", points=7)

    def smallest_sum(s):  # over k, to 1e-13 in log k
        sums = lambda log_k: np.sum((values - s * np.exp(-np.exp(log_k) * ts)) ** 2)  # noqa: E731
        return minimize_scalar(sums, bounds=(-5, 2), method="bounded", options={"xatol": 1e-13}).fun

    best = smallest_sum(result.params["s"])
    exact = [ts.size * np.log(smallest_sum(s) / best) for s in np.asarray(profile.values)]
    assert np.all(np.asarray(profile.converged))
    # the fits' tolerances (rtol 1e-8 on the loss) bound the deviance's error far below 1e-4
    np.testing.assert_allclose(np.asarray(profile.deviance), exact, atol=1e-4)


def test_a_study_in_small_units_has_the_same_uncertainty():
    """The same decay in units 1e10 times smaller (an amount in mol/L): the same estimates,
    standard errors (A's in its units), convergence and no bound warning. The information's
    raw eigenvalues lie 1e19 apart there: k was called undetermined (stderr inf) and A's
    stderr made conditional on it; an absolute margin put A 'on its bound'; and the LM's end
    was called stalled."""
    import warnings

    rng = np.random.default_rng(2)
    ts = np.linspace(0.25, 4.0, 8)
    noise = rng.normal(size=8)
    out = {}
    for unit in (1.0, 1e-10):
        data = {"time": ts, "observable": ["y"] * 8, "value": unit * (2 * np.exp(-0.7 * ts))}
        data["value"] = data["value"] + unit * 0.05 * noise
        problem = ds.Problem(
            ds.ODE(lambda t, y, p: -p["k"] * y, {"k": 0.5}),
            [ds.Experiment(data, y0=lambda p: jnp.stack([p["A"]]))],
            {"y": ds.Observable(lambda t, y, p: y[0], sigma=0.05 * unit)},
            {
                "k": ds.Unknown(0.5, bounds=(1e-3, 1e2), scale="log10"),
                "A": ds.Unknown(1.5 * unit, bounds=(0.0, 10 * unit)),
            },
            solver=ds.Tsit5(rtol=1e-10, atol=1e-12 * unit),
        )
        with warnings.catch_warnings():
            warnings.simplefilter("error", ds.FitWarning)
            result = ds.fit(problem, progress=False)
        assert result.converged
        out[unit] = (result.params["k"], result.params["A"] / unit)
        out[unit] += (result.stderr["k"], result.stderr["A"] / unit)
    np.testing.assert_allclose(out[1e-10], out[1.0], rtol=1e-6)
    assert np.all(np.isfinite(out[1e-10]))


def test_a_rest_that_is_never_reached_is_named_as_the_reason():
    """y' = k > 0 has no steady state: an experiment starting from one has no likelihood, and
    the warning says the pre-equilibration reached no rest (not merely "t = 0")."""
    model = ds.ODE(lambda t, y, p: p["k"] * jnp.ones(1), {"k": 1.0})
    experiment = ds.Experiment(
        {"time": [0.0], "observable": ["y"], "value": [1.0]},
        y0=jnp.ones(1),
        pre_equilibrate=True,
        name="rest",
    )
    problem = ds.Problem(model, [experiment], {"y": ds.Observable(lambda t, y, p: y[0])}, {})
    with pytest.warns(UserWarning, match="rest's y at t = 0 .* reached no steady state"):
        assert np.isnan(problem.llh())


def test_a_log_noise_prediction_the_solver_does_not_resolve_is_warned_about():
    """y = 2 e^(−k t) measured to t = 60 under log-normal noise: at k = 0.7 the last value,
    1.1e-18, lies far below the default atol (1e-10), and the solve's value there has no
    correct digit (it came out 1,000 times too large, and a fit ended at k = 1.78 reporting
    convergence). The llh and the fit say so; with an atol that resolves it, the fit finds the
    closed-form optimum (the mean log-rate of the data)."""
    ts = np.array([0.5, 1.0, 2.0, 3.0, 5.0, 60.0])
    noise = np.exp(0.1 * np.random.default_rng(0).normal(size=ts.size))
    values = 2.0 * np.exp(-0.7 * ts) * noise
    model = ds.ODE(lambda t, y, p: -p["k"] * y, {"k": 0.5})

    def study(solver=None):
        return ds.Problem(
            model,
            [ds.Experiment(_long(ts, "A", values), y0=jnp.array([2.0]))],
            {"A": ds.Observable(lambda t, y, p: y[0], noise="log-normal", sigma=0.1)},
            {"k": ds.Unknown(0.3, bounds=(1e-3, 10), scale="log10")},
            **({} if solver is None else {"solver": solver}),
        )

    unresolved = "under log-scale noise is .* below 1000 × the solver's atol .*atol=1e-"
    with pytest.warns(ds.FitWarning, match=unresolved):
        study().llh({"k": 0.7})
    with pytest.warns(ds.FitWarning, match=unresolved):
        ds.fit(study(), progress=False)
    resolved = study(ds.Rodas5P(rtol=1e-8, atol=1e-30))
    # log y = log 2 − k t: least squares of log(values/2) on −t
    exact = -np.sum(ts * np.log(values / 2.0)) / np.sum(ts**2)
    result = ds.fit(resolved, progress=False)
    assert result.params["k"] == pytest.approx(exact, rel=1e-6)


def test_a_wald_interval_keeps_to_the_unknowns_bounds():
    """An offset whose data favour 0.42 is held at its lower bound 0.5: its Wald interval
    starts there (it was (0.44, 0.56), reaching values the problem excludes); the upper end
    is still p̂ + z·se on its (linear) scale."""
    rng = np.random.default_rng(18)
    ts = np.linspace(0.5, 5, 10)
    values = 2 * np.exp(-0.7 * ts) + 0.3 + 0.05 * rng.normal(size=10)
    problem = ds.Problem(
        ds.ODE(lambda t, y, p: -p["k"] * y, {"k": 0.5}),
        [ds.Experiment(_long(ts, "A", values), y0=jnp.array([2.0]))],
        {"A": ds.Observable(lambda t, y, p: y[0] + p["o"], sigma=0.05)},
        {
            "k": ds.Unknown(0.5, bounds=(1e-3, 10), scale="log"),
            "o": ds.Unknown(0.6, bounds=(0.5, 1.0)),
        },
    )
    with pytest.warns(ds.FitWarning, match=r"\['o'\] ended on a bound"):
        result = ds.fit(problem, progress=False)
    assert result.params["o"] == pytest.approx(0.5, abs=1e-9)
    low, high = result.confidence_intervals["o"]
    assert low == pytest.approx(0.5, abs=1e-12)
    assert high == pytest.approx(0.5 + 1.959964 * result.stderr["o"], rel=1e-6)
