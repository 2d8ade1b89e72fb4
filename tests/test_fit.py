"""ds.fit, ds.profile, ds.refit: recovery of known parameters, honest uncertainties, errors."""

import inspect
import json
import warnings
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jaxtyping import Array

import diffsim as ds
import models

LYNX_HARE = Path(__file__).parent.parent / "experiments" / "data" / "lynx_hare.csv"

# The damped pendulum observed through its angle only (101 values over 10 s, noise 0.05 rad).
TRUTH = dict(length=1.3, damping=0.25)
Y0 = jnp.array([1.0, 0.0])
TS = np.linspace(0.0, 10.0, 101)
NOISE = 0.05


def angle(y):
    return y[0]


def _clean_angle(ts=TS, dt=0.01):
    solution = ds.simulate(models.DampedPendulum(**TRUTH), Y0, ts, solver=ds.RK4(), dt=dt)
    return np.asarray(solution.ys[:, 0])


def _noisy(seed, clean=None):
    clean = _clean_angle() if clean is None else clean
    return clean + NOISE * np.random.default_rng(seed).standard_normal(clean.shape)


def _fit_pendulum(values, guess=None, **options):
    options = dict(observe=angle, solver=ds.RK4(), dt=0.01, **options)
    options.setdefault("params", ["length", "damping"])
    guess = models.DampedPendulum(length=0.8, damping=0.1) if guess is None else guess
    return ds.fit(guess, Y0, (TS, values), **options)


@pytest.fixture(scope="module")
def pendulum_fit():
    return _fit_pendulum(_noisy(0))


def test_recovers_truth_within_three_standard_errors(pendulum_fit):
    result = pendulum_fit
    assert result.converged, result.reason
    for name, value in TRUTH.items():
        assert abs(result.params[name] - value) < 3 * result.stderr[name], result.summary()
    # The noise estimate s from 99 residual dof: its relative sd is 1/sqrt(2*99) = 7%.
    assert np.sqrt(result.noise_variance) == pytest.approx(NOISE, rel=0.25)
    # the fitted model is the model with the fitted values; the others stay as they were
    assert float(result.model.length) == result.params["length"]
    assert float(result.model.gravity) == 9.81
    history = result.loss_history
    assert np.all(np.diff(history) <= 0) and history[-1] == pytest.approx(result.loss)
    assert result.residuals.shape == TS.shape
    text = result.summary()
    assert "length" in text and "damping" in text and "converged" in text


def test_covariance_matches_finite_difference_hessian(pendulum_fit):
    result = pendulum_fit
    names = result.names
    p_hat = np.array([result.params[n] for n in names])
    values = _noisy(0)

    def loss(p):
        model = models.DampedPendulum(length=p[0], damping=p[1])
        predicted = ds.simulate(model, Y0, TS, solver=ds.RK4(), dt=0.01).ys[:, 0]
        return 0.5 * float(jnp.sum((predicted - values) ** 2))

    # Central second differences with steps ~1e-4 of the standard errors' scale: truncation
    # O(h²) ~ 1e-8 relative, round-off ~ eps·loss/h² ~ 1e-6 relative.
    h = 1e-4 * np.maximum(np.abs(p_hat), 1e-2)
    k = len(names)
    hessian = np.zeros((k, k))
    for i in range(k):
        for j in range(k):

            def at(si, sj):
                p = p_hat.copy()
                p[i] += si * h[i]
                p[j] += sj * h[j]
                return loss(p)

            hessian[i, j] = (at(1, 1) - at(1, -1) - at(-1, 1) + at(-1, -1)) / (4 * h[i] * h[j])
    laplace = result.noise_variance * np.linalg.inv(hessian)
    np.testing.assert_allclose(result.covariance_laplace, laplace, rtol=1e-4)
    # Gauss–Newton drops Σ rᵢ∇²rᵢ: small at a good fit (residuals are noise), not zero.
    np.testing.assert_allclose(result.covariance, laplace, rtol=0.05)


def test_intervals_cover_the_truth_over_200_repeats(pendulum_fit):
    clean = _clean_angle()
    noise = NOISE * np.random.default_rng(123).standard_normal((200, clean.size))
    batch = ds.refit(pendulum_fit, clean[None] + noise, start="guess")
    assert batch.converged.mean() >= 0.99
    coverage = batch.coverage(TRUTH)
    # 95% intervals: the binomial sd of the coverage over 200 repeats is 1.5%.
    for name, fraction in coverage.items():
        assert 0.90 <= fraction <= 0.99, coverage


def test_profile_interval_agrees_with_wald_for_a_well_determined_parameter(pendulum_fit):
    profile = ds.profile(pendulum_fit, "damping", points=11)
    assert profile.converged.all()
    assert profile.deviance.min() > -1e-6  # the fit was the optimum
    low, high = profile.interval
    wald_low, wald_high = profile.wald
    width = wald_high - wald_low
    # nearly linear in this direction: ends within 10% of the interval's width
    assert abs(low - wald_low) < 0.1 * width and abs(high - wald_high) < 0.1 * width
    assert low < pendulum_fit.params["damping"] < high
    # the profiled unknown is an input of the profile's program: another one compiles nothing
    from test_compile import _compiles

    other, compiled = _compiles(lambda: ds.profile(pendulum_fit, "length", points=11))
    assert compiled == 0 and other.converged.all()


def test_fixed_parameters_stay_fixed_and_partial_initial_state():
    values = _noisy(1)
    guess = models.DampedPendulum(length=1.0, damping=0.1, gravity=9.81)
    result = ds.fit(
        guess,
        jnp.array([0.9, 0.0]),
        (TS, values),
        params="damping",
        initial_state=["angle"],
        observe=angle,
        solver=ds.RK4(),
        dt=0.01,
    )
    assert result.names == ("damping", "y0[angle]")
    assert float(result.model.length) == 1.0 and float(result.model.gravity) == 9.81
    assert float(result.y0[1]) == 0.0  # the unfitted velocity component is kept


def test_uniform_weights_change_nothing_and_a_filter_selects_parameters(pendulum_fit):
    # Relative weights rescale the loss; with the noise estimated, values and standard errors
    # must not move. A filter function selects the same two fields as their names.
    result = _fit_pendulum(
        _noisy(0), weights=4.0, params=lambda name, value: name in ("length", "damping")
    )
    assert result.names == pendulum_fit.names
    for name in TRUTH:
        assert result.params[name] == pytest.approx(pendulum_fit.params[name], rel=1e-7)
        assert result.stderr[name] == pytest.approx(pendulum_fit.stderr[name], rel=1e-6)
    assert result.loss == pytest.approx(4.0 * pendulum_fit.loss, rel=1e-9)


def test_float32_initial_state_fits_in_float32():
    # y0's dtype sets the precision, also with x64 enabled (as in these tests)
    result = ds.fit(
        models.DampedPendulum(length=0.8, damping=0.1),
        jnp.asarray(Y0, jnp.float32),
        (TS, _noisy(0).astype(np.float32)),
        params=["length", "damping"],
        observe=angle,
        solver=ds.RK4(),
        dt=0.01,
    )
    assert result.model.length.dtype == jnp.float32 and result.converged
    for name, value in TRUTH.items():
        assert abs(result.params[name] - value) < 3 * result.stderr[name]


def test_bounds_hold_strictly():
    # The truth (damping 0.25) lies below the allowed range: the fit ends on the bound's side.
    guess = models.DampedPendulum(length=0.8, damping=0.4)
    with pytest.warns(ds.FitWarning, match="damping = 0.3.* is at its lower bound 0.3"):
        result = _fit_pendulum(_noisy(2), guess, bounds={"damping": (0.3, 0.5)})
    assert 0.3 < result.params["damping"] < 0.5
    # on the bound up to the logit's reach (the optimiser stops at max_iterations there)
    assert result.params["damping"] == pytest.approx(0.3, abs=1e-3)
    with pytest.raises(ValueError, match="strictly inside its bounds"):
        _fit_pendulum(_noisy(2), bounds={"damping": (0.2, 0.5)})


def test_missing_values_are_ignored():
    values = _noisy(3)
    holes = values.copy()
    holes[5:40:3] = np.nan
    keep = ~np.isnan(holes)
    with_nan = _fit_pendulum(holes)
    guess = models.DampedPendulum(length=0.8, damping=0.1)
    without = ds.fit(
        guess,
        Y0,
        (TS[keep], values[keep]),
        params=["length", "damping"],
        observe=angle,
        solver=ds.RK4(),
        dt=0.01,
    )
    # weight 0 is the same as missing: no residual and no degree of freedom
    zero_weight = _fit_pendulum(values, weights=np.where(keep, 1.0, 0.0))
    for name in TRUTH:
        for other in (without, zero_weight):
            assert with_nan.params[name] == pytest.approx(other.params[name], rel=1e-7)
            assert with_nan.stderr[name] == pytest.approx(other.stderr[name], rel=1e-6)
    assert with_nan.dof == without.dof == zero_weight.dof == int(keep.sum()) - 2
    assert np.isnan(with_nan.residuals[5])


@pytest.mark.parametrize(
    "method", ["gauss-newton", "bfgs", optax.adam(0.05)], ids=["gauss-newton", "bfgs", "optax"]
)
def test_other_methods_reach_the_same_optimum(pendulum_fit, method):
    guess = models.DampedPendulum(length=1.2, damping=0.2)
    budget = {"max_iterations": 500} if not isinstance(method, str) else {}
    result = ds.fit(
        guess,
        Y0,
        (TS, _noisy(0)),
        params=["length", "damping"],
        observe=angle,
        solver=ds.RK4(),
        dt=0.01,
        method=method,
        **budget,
    )
    for name in TRUTH:
        # optax's Adam ends within a fraction of a standard error, not to round-off
        tolerance = 0.05 * pendulum_fit.stderr[name]
        assert abs(result.params[name] - pendulum_fit.params[name]) < tolerance, result.summary()


def test_the_screen_and_multiple_starts_escape_a_wrong_frequency():
    # x = cos(3t) over 5 periods: the loss in ω has a local minimum every ~0.6; from ω = 2 a
    # single LM start from the guess (screen=0) settles in one. The default screen (the loss
    # at 64 points within a decade of the guess, the lowest 3 fitted to the first half of the
    # record) starts in the true basin; so do some of 16 unscreened starts (the guess and 15
    # Halton points around it).
    ts = np.linspace(0.0, 10.0, 201)
    values = np.cos(3.0 * ts) + 0.1 * np.random.default_rng(0).standard_normal(ts.size)
    guess = models.HarmonicOscillator(omega=2.0)
    options = dict(params=["omega"], observe=angle, solver=ds.RK4(), dt=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ds.FitWarning)
        single = ds.fit(guess, Y0, (ts, values), **options, screen=0)
    default = ds.fit(guess, Y0, (ts, values), **options)
    with pytest.warns(ds.FitWarning, match=r"the given guess alone stops at a local optimum"):
        several = ds.fit(guess, Y0, (ts, values), **options, screen=0, starts=16)
    # each result says what it checked: one start from the guess, or from the screen
    assert "local optimum (one start;" in single.status and single.screen is None
    assert "the best of 64 screened points and 3 first-stage fits" in default.status
    assert abs(single.params["omega"] - 3.0) > 0.1
    for found in (default, several):  # 3 standard errors: p ≈ 0.997 for a correct interval
        assert abs(found.params["omega"] - 3.0) < 3 * found.stderr["omega"], found.summary()
        # the wrong basin's loss (189) is ~100x what the noise explains (201 × 0.1² ≈ 2)
        assert found.loss < 0.05 * single.loss
    # the screen: row 0 is the guess, the rest within a decade of it; every simulation counted
    screened = default.screen["params"]["omega"]
    assert screened.shape == (64,) and screened[0] == 2.0
    # the ends of the decade pass through log and exp: round-off of ~1e-16 relative
    assert np.all((screened > 0.2 * (1 - 1e-12)) & (screened < 20 * (1 + 1e-12)))
    assert default.screen["trial_loss"].shape == (3,)
    assert default.num_solves > 64 + int(np.sum(default.starts["evaluations"]))
    reached = several.starts_reached
    assert reached == int(np.sum(several.starts["loss"] <= several.loss * (1 + 1e-6)))
    assert 1 <= reached < 16 and f"{reached} of 16 starts reached" in several.summary()
    assert several.starts["loss"].shape == (16,)
    assert several.loss == pytest.approx(float(np.min(several.starts["loss"])))
    # with a key the points are shifted at random: other points, the same guess in row 0
    shifted = ds.fit(guess, Y0, (ts, values), **options, key=jax.random.key(1))
    assert shifted.screen["params"]["omega"][0] == 2.0
    assert not np.allclose(shifted.screen["params"]["omega"][1:], screened[1:])


def test_shooting_and_the_growing_horizon_fit_lorenz_where_one_stage_fails():
    truth = models.Lorenz()
    y0 = jnp.array([-8.0, 7.0, 27.0])
    ts = np.linspace(0.0, 2.0, 101)
    clean = np.asarray(ds.simulate(truth, y0, ts, solver=ds.RK4(), dt=0.01).ys)
    values = clean + 0.5 * np.random.default_rng(2).standard_normal(clean.shape)
    guess = models.Lorenz(sigma=5.0, rho=15.0, beta=1.0)
    options = dict(params=["sigma", "rho", "beta"], initial_state=True, solver=ds.RK4(), dt=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ds.FitWarning)
        single = ds.fit(guess, jnp.asarray(values[0]), (ts, values), **options, horizon=1, screen=0)
    default = ds.fit(guess, jnp.asarray(values[0]), (ts, values), **options)
    shooting = ds.fit(guess, jnp.asarray(values[0]), (ts, values), **options, segments=10)
    # The noise is 0.5: a good fit leaves residual variance ≈ 0.25; single shooting of the
    # whole window at once from the guess does not; the default (a screen of the first half's
    # loss, then a growing horizon) and multiple shooting do.
    assert single.noise_variance > 10
    assert default.noise_variance == pytest.approx(0.25, rel=0.25)
    assert shooting.noise_variance == pytest.approx(0.25, rel=0.25)
    assert default.loss == pytest.approx(shooting.loss, rel=1e-6)
    for name, value in (("sigma", 10.0), ("rho", 28.0), ("beta", 8 / 3)):
        assert abs(shooting.params[name] - value) < 3 * shooting.stderr[name], shooting.summary()
    assert shooting.shooting["segments"] == 10 and shooting.converged


def test_lynx_hare_agrees_with_the_published_estimates():
    # Carpenter (2018), Stan case study "Predator-Prey Population Dynamics", posterior means
    # under multiplicative (log-normal) noise: α 0.55, β 0.028, γ 0.80, δ 0.024, z0 = (33.9, 5.9).
    data = ds.Data.from_csv(LYNX_HARE, time="year")
    result = ds.fit(
        models.LotkaVolterra(),
        jnp.array([30.0, 4.0]),
        data,
        params=["alpha", "beta", "gamma", "delta"],
        initial_state=True,
        loss="log",
        bounds={"y0[prey]": (0, None), "y0[predator]": (0, None)},
        solver=ds.RK4(),
        dt=0.02,
    )
    published = {
        "alpha": 0.55,
        "beta": 0.028,
        "gamma": 0.80,
        "delta": 0.024,
        "y0[prey]": 33.9,
        "y0[predator]": 5.9,
    }
    for name, value in published.items():
        # a maximum-likelihood estimate against a posterior mean: within one standard error
        assert abs(result.params[name] - value) < result.stderr[name], result.summary()
    assert np.sqrt(result.noise_variance) == pytest.approx(0.25, abs=0.05)


def test_nonidentifiable_parameters_are_named():
    # Only g/L enters the pendulum's motion: length and gravity cannot both be determined.
    guess = models.DampedPendulum(length=1.0, gravity=9.0, damping=0.2)
    with pytest.warns(ds.FitWarning, match="non-identifiable") as record:
        result = ds.fit(
            guess,
            Y0,
            (TS, _noisy(5)),
            params=["length", "gravity"],
            observe=angle,
            solver=ds.RK4(),
            dt=0.01,
        )
    message = next(str(w.message) for w in record if "non-identifiable" in str(w.message))
    assert "length" in message and "gravity" in message
    assert any("non-identifiable" in w for w in result.warnings)


def test_data_sources_agree(tmp_path):
    import pandas as pd
    import xarray as xr

    path = tmp_path / "data.csv"
    values = _noisy(6)
    path.write_text("t,angle\n" + "".join(f"{t},{v}\n" for t, v in zip(TS, values)))
    from_csv = ds.Data.from_csv(path)
    from_frame = ds.Data.from_frame(pd.DataFrame({"angle": values}, index=TS))
    from_xarray = ds.Data.from_xarray(xr.DataArray(values, coords={"t": TS}, dims="t"))
    for data in (from_csv, from_frame, from_xarray):
        np.testing.assert_allclose(data.ts, TS)
        np.testing.assert_allclose(data.values.ravel(), values)
    assert from_csv.names == ("angle",)


def test_result_plot_and_json(pendulum_fit, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    figure = pendulum_fit.plot()
    figure.savefig(tmp_path / "fit.png")
    record = json.loads(json.dumps(pendulum_fit.to_dict()))
    assert record["params"]["length"] == pendulum_fit.params["length"]
    assert np.asarray(record["covariance"]).shape == (2, 2)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(params=["lenght"]), "no parameter 'lenght'"),
        (dict(data=(TS, np.zeros((50,)))), "one row per observation time"),
        (dict(data=(TS, np.full(TS.shape, np.nan))), "every data value is NaN"),
        (dict(noise=-0.1), "noise must be positive"),
        (dict(observe=None), "pass observe="),
        (dict(observe=lambda y: y), "observe returns 2 value"),
        (dict(t0=1.0), "not after the first data time"),
        (dict(loss="log"), "needs positive data"),
        (dict(dt=None), "fixed-step solver: pass dt"),
        (dict(method="newton"), "method must be one of"),
        (dict(segments=0), "segments must be >= 1"),
        (dict(segments=200), "at most 100 segments"),
        (dict(initial_state=["spin"]), "initial_state names 'spin'"),
        (dict(bounds={"gravity": (0, 20)}), "which are not fitted"),
        (dict(data=(TS[::-1], np.zeros(101))), "strictly increasing"),
    ],
)
def test_bad_input_gets_a_clear_error(change, message):
    arguments = dict(
        data=(TS, np.sin(TS)), params=["length"], observe=angle, solver=ds.RK4(), dt=0.01
    )
    arguments.update(change)
    data = arguments.pop("data")
    with pytest.raises(ValueError, match=message):
        ds.fit(models.DampedPendulum(), Y0, data, **arguments)


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda r: ds.profile(r, "gravity"), ValueError, "not a fitted unknown"),
        (lambda r: ds.profile(r, "length", span=0.0), ValueError, "span must be > 0"),
        (lambda r: ds.profile(r, "length", span=float("nan")), ValueError, "span must be finite"),
        (lambda r: ds.profile(r, "length", span="4"), TypeError, "span must be a real number"),
        (lambda r: ds.profile(r, "length", range=2.0), TypeError, r"range must be \(low, high\)"),
        (lambda r: ds.profile(r, "length", level="0.9"), TypeError, "level must be a real"),
        (lambda r: ds.profile({"length": 1.0}, "length"), TypeError, "takes the ds.FitResult"),
        (lambda r: ds.refit(r, np.zeros((3, 50))), ValueError, "values must have shape"),
        (
            lambda r: ds.refit(r, np.full((2, *r.data.values.shape), np.nan)),
            ValueError,
            r"replicate\(s\) \[0, 1\] hold no values",
        ),
        (
            lambda r: ds.refit(r, np.full((1, *r.data.values.shape), np.inf)),
            ValueError,
            "values hold inf",
        ),
        (
            lambda r: ds.refit(r, np.zeros((1, *r.data.values.shape), complex)),
            TypeError,
            "values must be real numbers",
        ),
        (lambda r: ds.plot.fit(r, points=0), ValueError, "points must be an int >= 2"),
    ],
    ids=[
        "unknown",
        "span-0",
        "span-nan",
        "span-text",
        "range-number",
        "level-text",
        "not-a-result",
        "refit-shape",
        "refit-all-nan",
        "refit-inf",
        "refit-complex",
        "plot-points",
    ],
)
def test_profile_refit_and_plot_reject_bad_input(pendulum_fit, call, error, message):
    with pytest.raises(error, match=message):
        call(pendulum_fit)


@pytest.mark.parametrize("dof", [1, 2, 5, 36, 99, 10_000])
def test_student_t_quantile_matches_scipy(dof):
    from scipy import stats

    from diffsim._fit.uncertainty import quantile

    for level in (0.68, 0.95, 0.99):
        assert quantile(level, dof) == pytest.approx(stats.t.ppf(0.5 + level / 2, dof), rel=1e-9)
    assert quantile(0.95, None) == pytest.approx(stats.norm.ppf(0.975), rel=1e-12)


def _assembled(model, y0, data, **options):
    """What ds.fit would optimise for these arguments (its checked, assembled setup)."""
    from diffsim._fit.setup import assemble, FitSpec

    # progress: a bar over a study's starts, not part of the setup
    skipped = ("y0", "data", "progress")
    defaults = {
        name: p.default for name, p in inspect.signature(ds.fit).parameters.items()
        if p.default is not inspect.Parameter.empty and name not in skipped
    }  # fmt: skip
    return assemble(FitSpec(model=model, y0=y0, data=data, **{**defaults, **options}))


class _Decay(ds.AbstractODE):
    """dy/dt = −k y: the rate's likelihood is skewed (long upper tail) on sparse data."""

    rate: Array = ds.parameter(1.0, positive=True, ndim=0)

    def vector_field(self, t, y, args=None):
        return -self.rate * y


def test_intervals_of_positive_rates_are_computed_in_log_space_and_follow_the_profile():
    ts = np.array([0.0, 2.0, 4.0, 6.0, 8.0])
    values = np.exp(-ts) + 0.03 * np.random.default_rng(1).standard_normal(ts.size)
    result = ds.fit(
        _Decay(rate=0.5), jnp.array([1.0]), (ts, values[:, None]), params=["rate"],
        solver=ds.RK4(), dt=0.01, noise=0.03,
    )  # fmt: skip
    assert result.interval_space("rate") == "log"
    low, high = result.confidence_intervals["rate"]
    estimate, se = result.params["rate"], result.stderr["rate"]
    q = 1.959963984540054  # noise given: the normal quantile
    assert low == pytest.approx(estimate * np.exp(-q * se / estimate), rel=1e-12)
    assert high == pytest.approx(estimate * np.exp(q * se / estimate), rel=1e-12)
    # against the likelihood's own (profile) interval, the log-space ends are the closer ones
    profile_low, profile_high = ds.profile(result, "rate", points=41, span=6).interval
    assert abs(low - profile_low) < abs(estimate - q * se - profile_low)
    assert abs(high - profile_high) < abs(estimate + q * se - profile_high)


def test_positive_initial_states_are_fitted_in_log_space_by_default():
    data = ds.Data.from_csv(LYNX_HARE, time="year")
    options = dict(params=["alpha"], initial_state=True, solver=ds.RK4(), dt=0.05)
    model = models.LotkaVolterra()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ds.FitWarning)
        by_loss = ds.fit(model, jnp.array([30.0, 4.0]), data, loss="log", **options)
    setup = _assembled(model, jnp.array([30.0, 4.0]), data, loss="squared", **options)
    # loss="log" compares the state itself with positive data; LotkaVolterra declares its
    # state positive: both put the initial states in log space
    assert [by_loss.interval_space(n) for n in ("y0[prey]", "y0[predator]")] == ["log"] * 2
    assert setup.problem.layout.kinds[1:] == ("log", "log")
    assert all(by_loss.confidence_intervals[n][0] > 0 for n in by_loss.names)
    # a state not declared positive stays unbounded under a squared loss
    pendulum = _assembled(
        models.DampedPendulum(), Y0, (TS, _noisy(0)), params=["length"], initial_state=[0],
        observe=angle, solver=ds.RK4(), dt=0.01,
    )  # fmt: skip
    assert pendulum.problem.layout.kinds == ("log", "identity")


def test_the_default_fit_is_deterministic_and_a_misfit_is_not_converged():
    values = _noisy(3)
    first, second = (_fit_pendulum(values) for _ in range(2))
    assert first.params == second.params and first.loss == second.loss
    # the noise given ten times too small: the optimiser stops, but the loss is far above what
    # that noise explains, so the result does not say converged
    with pytest.warns(ds.FitWarning, match="far above what the given noise explains"):
        claimed = _fit_pendulum(values, noise=NOISE / 10)
    assert not claimed.converged and "NOT converged" in claimed.status
    honest = _fit_pendulum(values, noise=NOISE)
    assert honest.converged


def test_starts_given_as_guesses_are_checked_and_each_reported():
    values = _noisy(4)
    guesses = np.array([[0.8, 0.1], [1.5, 0.4], [1.2, 0.2]])
    result = _fit_pendulum(values, starts=guesses)
    assert result.starts["loss"].shape == (3,) and result.starts["evaluations"].shape == (3,)
    np.testing.assert_allclose(result.starts["loss"], result.loss, rtol=1e-6)
    with pytest.raises(ValueError, match=r"shape \(starts, 2\).*\['length', 'damping'\]"):
        _fit_pendulum(values, starts=guesses[:, :1])
    with pytest.raises(ValueError, match=r"starts\[0\] puts damping = -0.1 outside its bounds"):
        _fit_pendulum(values, starts=guesses * np.array([1.0, -1.0]))


class _Blowup(ds.AbstractODE):
    """dy/dt = k y²: from y(0) = 1 the solution 1/(1 − k t) blows up at t = 1/k."""

    k: Array = ds.parameter(0.5, positive=True, ndim=0)

    def vector_field(self, t, y, args=None):
        return self.k * y**2


def test_the_screen_starts_where_the_guess_cannot_be_simulated():
    # data of k = 0.5 over [0, 1]; the guess k = 2 blows up at t = 0.5 (non-finite states), but
    # the screen's points within a decade of it include simulable ones below k = 1
    ts = np.linspace(0.0, 1.0, 11)
    values = 1 / (1 - 0.5 * ts) + 0.01 * np.random.default_rng(5).standard_normal(ts.size)
    options = dict(params=["k"], solver=ds.RK4(), dt=0.01)
    data = (ts, values[:, None])
    with pytest.warns(
        ds.FitWarning,
        match="at the given guess within the screen.s step budget .max_steps / 16.; the fit "
        "started from the lowest",
    ):
        result = ds.fit(_Blowup(k=2.0), jnp.array([1.0]), data, **options)
    assert not np.isfinite(result.screen["loss"][0])  # row 0: the guess itself
    # 3 standard errors: p ≈ 0.997 for a correct interval
    assert result.params["k"] == pytest.approx(0.5, abs=3 * result.stderr["k"])
    with pytest.raises(ValueError, match="at the initial guess: start from a guess"):
        ds.fit(_Blowup(k=2.0), jnp.array([1.0]), data, **options, screen=0)
    # every screened point (k from 20 to 2000) blows up before t = 1: nothing to start from
    with pytest.raises(ValueError, match="at the initial guess and at the 63 screened points"):
        ds.fit(_Blowup(k=200.0), jnp.array([1.0]), data, **options)


class _Drag(eqx.Module):
    coefficient: Array


class _Falling(ds.AbstractODE):
    """dv/dt = −c v with c a field of a nested module."""

    drag: _Drag

    def vector_field(self, t, y, args=None):
        return -self.drag.coefficient * y


def test_params_by_name_reach_ode_dict_entries_and_nested_fields():
    """`params=` names a `ds.ODE`'s dict entry as `"k"`, `"params.k"` or `'params["k"]'`, a
    nested module's field as `"drag.coefficient"`; the fitted rate is the exact decay's
    (noise-free data: 0.7 to the optimiser's tolerance); unknown names list those that exist,
    a selector that selects nothing is an error."""
    ts = jnp.linspace(0.0, 5.0, 10)
    ys = 2.0 * jnp.exp(-0.7 * ts)
    ode = ds.ODE(lambda t, y, p: -p["k"] * y, {"k": 0.3})
    for name in ("k", "params.k", 'params["k"]'):
        result = ds.fit(ode, jnp.array([2.0]), (ts, ys), params=[name])
        assert result.params[name] == pytest.approx(0.7, rel=1e-7)
        assert float(result.model.params["k"]) == pytest.approx(0.7, rel=1e-7)
    nested = _Falling(_Drag(jnp.asarray(0.3)))
    result = ds.fit(nested, jnp.array([2.0]), (ts, ys), params="drag.coefficient")
    assert float(result.model.drag.coefficient) == pytest.approx(0.7, rel=1e-7)
    with pytest.raises(ValueError, match="has no parameter 'q'; its parameters are: k"):
        ds.fit(ode, jnp.array([2.0]), (ts, ys), params=["q"])
    with pytest.raises(ValueError, match="selected no parameter of ODE"):
        ds.fit(ode, jnp.array([2.0]), (ts, ys), params=lambda name, value: False)
    with pytest.raises(ValueError, match="is not a floating-point parameter .* dict"):
        ds.fit(ode, jnp.array([2.0]), (ts, ys), params=["params"])
    # a network inside the model: not a parameter ds.fit estimates; the message says how to
    # train it
    network = _Falling(eqx.nn.Linear(1, 1, key=jax.random.key(0)))
    with pytest.raises(ValueError, match="is a Linear with 2 weights.*ds.train.*hybrid-models"):
        ds.fit(network, jnp.array([2.0]), (ts, ys), params="drag")


def test_fixed_step_fit_with_data_times_that_dt_does_not_divide():
    """Ten data points on [0, 5] (intervals 5/9) with `ds.RK4(), dt=0.01`: each interval takes
    56 equal steps of ≤ 0.01 and the fit recovers the exact decay's rate and initial value
    (noise-free data; RK4's global error at h ≈ 0.01 is ~1e-10, far below 1e-6)."""
    ts = np.linspace(0.0, 5.0, 10)
    ys = 2.0 * np.exp(-0.7 * ts)
    ode = ds.ODE(lambda t, y, p: -p["k"] * y, {"k": 0.3})
    result = ds.fit(
        ode, jnp.array([1.0]), (ts, ys), params=["k"], initial_state=True, solver=ds.RK4(), dt=0.01
    )
    assert result.converged
    assert result.params["k"] == pytest.approx(0.7, rel=1e-6)
    assert float(result.y0[0]) == pytest.approx(2.0, rel=1e-6)


def test_starts_at_the_same_loss_with_other_values_are_warned_about():
    """An oral dose measured in plasma alone: (ka, ke, V) and (ke, ka, V·ke/ka) give the same
    curve (pharmacokinetics' flip-flop). Starts on both sides end at one loss with the rates
    swapped: both fits say the optimum is not unique (before, "2 of 2 starts reached it")."""

    def field(t, y, p):
        return jnp.stack([-p["ka"] * y[0], p["ka"] * y[0] / p["V"] - p["ke"] * y[1]])

    model = ds.ODE(field, {"ka": 1.0, "ke": 1.0, "V": 1.0})
    t = np.array([0.25, 0.5, 1, 2, 3, 4, 6, 8, 12, 16, 24.0])
    ka, ke, volume = 1.5, 0.3, 20.0
    conc = 100 * ka / (volume * (ka - ke)) * (np.exp(-ke * t) - np.exp(-ka * t))
    data = conc + 0.05 * np.random.default_rng(0).normal(size=t.size)
    starts = np.array([[1.4, 0.35, 18.0], [0.35, 1.4, 5.0]])
    equal = "reached the kept loss elsewhere .* several optima of equal height"
    with pytest.warns(ds.FitWarning, match=equal):
        result = ds.fit(
            model,
            jnp.array([100.0, 0.0]),
            (t, data),
            params=["ka", "ke", "V"],
            observe=lambda y: y[1],
            t0=0.0,
            noise=0.05,
            starts=starts,
        )
    assert result.starts["loss"][0] == pytest.approx(result.starts["loss"][1], rel=1e-6)
    rates = sorted([result.starts["params"]["ka"][0], result.starts["params"]["ka"][1]])
    assert rates[0] == pytest.approx(0.29, abs=0.02) and rates[1] == pytest.approx(1.53, abs=0.05)
    rows = {"time": t, "observable": ["conc"] * t.size, "value": data}
    log10 = dict(bounds=(1e-3, 1e3), scale="log10")
    study = ds.Problem(
        model,
        [ds.Experiment(rows, y0=jnp.array([100.0, 0.0]), t0=0.0)],
        {"conc": ds.Observable(lambda t, y, p: y[1], sigma=0.05)},
        {n: ds.Unknown(1.0, **log10) for n in ("ka", "ke", "V")},
    )
    with pytest.warns(ds.FitWarning, match=equal):
        ds.fit(study, starts=starts, progress=False)
