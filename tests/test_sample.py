"""`ds.sample` and `ds.Posterior`: a posterior with a closed form, a count model with
negative-binomial noise, the posterior's views and files, and the errors for bad input."""

import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest
from helpers import counted, synthetic_posterior
from jaxtyping import Array

import diffsim as ds
import models

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
from posterior_lynx_hare import priors  # noqa: E402

K_TRUE, SIGMA = 0.4, 0.1
PRIOR_MEAN, PRIOR_SD = 0.3, 0.2


class _Decay(ds.AbstractODE):
    """dy/dt = −k y from y(0) = 1: log y(t) = −k t, linear in k."""

    k: Array = ds.parameter(0.3, ndim=0)

    def vector_field(self, t, y, args=None):
        return -self.k * y


def _decay_data():
    ts = np.linspace(0.5, 5.0, 10)
    noise = np.random.default_rng(1).normal(0.0, SIGMA, ts.size)
    values = np.exp(-K_TRUE * ts + noise)
    values[3] = np.nan  # a missing value: it must not count
    return ts, values


@pytest.fixture(scope="module")
def decay_posterior():
    ts, values = _decay_data()
    priors = {
        "k": dist.Normal(PRIOR_MEAN, PRIOR_SD),
        # σ held at 0.1 to within 0.1 %: the posterior of k is then the conjugate normal one
        "sigma": dist.LogNormal(np.log(SIGMA), 1e-3),
    }
    return ds.sample(
        _Decay(k=0.3),
        jnp.array([1.0]),
        (ts, values),
        params="k",
        priors=priors,
        likelihood="lognormal",
        t0=0.0,
        chains=2,
        warmup=300,
        draws=600,
        key=jax.random.key(3),
    )


def test_conjugate_posterior_matches_the_closed_form(decay_posterior):
    # log y = −k t + ε, ε ~ N(0, σ²), k ~ N(m0, s0²): k | y ~ N(mn, sn²) with
    # 1/sn² = 1/s0² + Σt²/σ², mn = sn² (m0/s0² − Σ t log y / σ²), over the observed values only.
    ts, values = _decay_data()
    seen = ~np.isnan(values)
    t, logs = ts[seen], np.log(values[seen])
    precision = 1 / PRIOR_SD**2 + np.sum(t**2) / SIGMA**2
    sd = 1 / np.sqrt(precision)
    mean = (PRIOR_MEAN / PRIOR_SD**2 - np.sum(t * logs) / SIGMA**2) / precision
    row = decay_posterior.table(quantiles=(0.1, 0.9))["k"]
    # 4 Monte Carlo standard errors: a correct sampler fails this about once in 16,000 runs
    assert abs(row["mean"] - mean) < 4 * row["mcse"]
    assert row["sd"] == pytest.approx(sd, rel=0.1)  # ~600 effective draws: sd within ~6 %
    assert row["10%"] == pytest.approx(mean - 1.2816 * sd, abs=0.3 * sd)
    assert row["90%"] == pytest.approx(mean + 1.2816 * sd, abs=0.3 * sd)
    assert row["r_hat"] < 1.01
    assert decay_posterior.divergences.sum() == 0
    assert decay_posterior.samples["k"].shape == (2, 600)
    assert decay_posterior.samples["sigma"].shape == (2, 600)


def test_posterior_views_and_file_round_trip(decay_posterior, tmp_path):
    post = decay_posterior
    idata = post.to_arviz()
    assert {"posterior", "sample_stats", "observed_data", "posterior_predictive"} <= set(
        idata.groups()
    )
    assert idata.posterior["k"].shape == (2, 600)
    assert idata.posterior_predictive["y"].shape[2:] == (10, 1)
    replicated = post.replicated
    assert np.all(replicated[np.isfinite(replicated)] > 0)  # log-normal data are positive
    bands = post.predict(np.linspace(0.0, 5.0, 11), draws=100)
    assert bands["model_low"].shape == (11, 1)
    assert np.all(bands["model_low"] <= bands["model_median"])
    assert np.all(bands["model_high"] <= bands["data_high"])  # new data scatter more
    # at t = 0 the model is y0 = 1 exactly, for every draw
    np.testing.assert_allclose(bands["model_median"][0], 1.0, rtol=1e-12)
    # another level at the same times and draws traces and compiles nothing new
    narrow, compiles, traced = counted(
        lambda: post.predict(np.linspace(0.0, 5.0, 11), draws=100, level=0.5)
    )
    assert (compiles, traced) == (0, 0)
    assert np.all(narrow["model_low"] >= bands["model_low"])
    path = post.save(tmp_path / "posterior.nc")
    loaded = ds.Posterior.load(path)
    np.testing.assert_array_equal(loaded.samples["k"], post.samples["k"])
    assert loaded.settings == post.settings
    assert loaded.summary().splitlines()[2:] == post.summary().splitlines()[2:]
    # printed, a posterior says what it holds, not its draws
    assert repr(post).startswith("Posterior(k") and len(repr(post)) < 200
    with pytest.raises(ValueError, match="loaded from a file"):
        loaded.predict()
    # the provenance keeps the solver's tolerances (equinox's repr printed rtol=f64[])
    assert post.settings.solver.startswith("Tsit5(rtol=1e-06, atol=1e-06")
    with pytest.raises(TypeError, match="key"):
        post.predict(np.array([1.0, 2.0]), key=0)
    with pytest.raises(TypeError, match=r"quantiles must be probabilities, e.g. \(0.05"):
        post.summary(quantiles="median")
    with pytest.raises(ValueError, match=r"quantiles must lie in \(0, 1\), got \[1.5\]"):
        post.table(quantiles=(1.5,))
    assert "50%" in post.summary(quantiles=0.5)  # one number is one quantile
    for kind in ("predictive", "trace", "pair"):
        figure = post.plot(kind)
        assert figure.axes
    with pytest.raises(ValueError, match="kind must be one of"):
        post.plot("violin")


def test_negative_binomial_counts_recover_the_growth_rate():
    # dy/dt = r y from y(0) = 5; counts of mean y(t) and variance μ + μ²/φ
    rate, phi = 0.5, 20.0
    ts = np.arange(1.0, 9.0)
    mean = 5.0 * np.exp(rate * ts)
    rng = np.random.default_rng(2)
    counts = rng.negative_binomial(phi, phi / (phi + mean)).astype(float)
    post = ds.sample(
        _Decay(k=-0.3),  # k = −r: growth
        jnp.array([5.0]),
        (ts, counts),
        params="k",
        priors={"k": dist.Normal(0.0, 1.0), "phi": dist.LogNormal(np.log(10.0), 1.5)},
        likelihood="negative_binomial",
        t0=0.0,
        # a fixed-step solve: RK4's relative error at dt = 0.05 is ~1e-8 (160 steps of
        # (r dt)^5 / 120), far below the counts' noise, and its gradient compiles to a scan
        # (the adaptive default is covered above)
        solver=ds.RK4(),
        dt=0.05,
        chains=2,
        warmup=300,
        draws=500,
        key=jax.random.key(4),
    )
    k = post.samples["k"]
    low, high = np.quantile(k, [0.005, 0.995])
    assert low < -rate < high
    assert np.std(k) < 0.05  # eight counts in the hundreds pin the rate down
    assert np.all(post.samples["phi"] > 0)
    replicated = post.replicated
    assert np.all(replicated == np.round(replicated)) and np.all(replicated >= 0)
    assert post.table()["k"]["r_hat"] < 1.05


@pytest.mark.parametrize("family", ["normal", "lognormal", "poisson", "negative_binomial"])
def test_replicated_data_follow_the_family(family):
    """The posterior predictive's draws (`likelihood.draw`, on the host) against each family's
    mean and variance from 200,000 draws of two observables with their own parameter: at 4
    standard errors of the estimates (the variance's standard error from the fourth moment),
    and NaN where a prediction lies outside the family's domain."""
    from diffsim._fit import likelihood as lik

    n = 200_000
    mu = np.array([3.0, 40.0])
    extra = {"normal": [0.5, 2.0], "lognormal": [0.1, 0.4], "negative_binomial": [5.0, 20.0]}
    parameter = None if family == "poisson" else np.tile(extra[family], (n, 1))
    predictions = np.broadcast_to(mu, (n, 1, 2)).copy()
    predictions[:10, 0, 0] = -1.0  # outside a log-normal or count family's domain
    predictions[10:20, 0, 0] = np.nan
    drawn = lik.draw(family, np.random.default_rng(0), predictions, parameter)
    assert drawn.shape == (n, 1, 2)
    assert np.all(np.isnan(drawn[10:20, 0, 0]))
    outside = np.isnan(drawn[:10, 0, 0])
    assert np.all(~outside) if family == "normal" else np.all(outside)
    x = drawn[20:, 0, :]
    if family == "lognormal":  # log y ~ N(log μ, σ)
        x = np.log(x)
        mean, variance = np.log(mu), np.square(extra[family])
    else:
        mean = mu
        variance = {
            "normal": np.square(extra["normal"]),
            "poisson": mu,
            "negative_binomial": mu + mu**2 / np.array(extra["negative_binomial"]),
        }[family]
    count = x.shape[0]
    np.testing.assert_array_less(np.abs(x.mean(0) - mean), 4 * np.sqrt(variance / count))
    fourth = np.mean((x - x.mean(0)) ** 4, axis=0)
    spread = 4 * np.sqrt((fourth - variance**2) / count)
    np.testing.assert_array_less(np.abs(x.var(0) - variance), spread)
    if family in ("poisson", "negative_binomial"):
        assert np.all(x == np.round(x)) and np.all(x >= 0)


def test_lynx_hare_priors_are_checked():
    data = ds.Data.from_csv("experiments/data/lynx_hare.csv", time="year", columns=["hare", "lynx"])
    guess = models.LotkaVolterra(alpha=1.0, beta=0.05, gamma=1.0, delta=0.05)
    y0 = jnp.asarray(data.values[0])
    good = priors()  # the Stan case study's, as the experiment uses them
    options = dict(
        params=["alpha", "beta", "gamma", "delta"],
        initial_state=True,
        likelihood="lognormal",
        key=jax.random.key(0),
    )

    def sample(priors, **changes):
        return ds.sample(guess, y0, data, priors=priors, **{**options, **changes})

    with pytest.raises(ValueError, match=r"no prior for \['y0\[predator\]'\]"):
        sample({k: v for k, v in good.items() if k != "y0[predator]"})
    with pytest.raises(ValueError, match="no prior for 'sigma'"):
        sample({k: v for k, v in good.items() if k != "sigma"})
    with pytest.raises(ValueError, match=r"priors\['alpha'\] \(Normal\) has support"):
        sample({**good, "alpha": dist.Normal(1.0, 0.5)})  # a positive rate
    with pytest.raises(ValueError, match="not an unknown of this problem"):
        sample({**good, "omega": dist.Normal(1.0, 0.5)})
    with pytest.raises(ValueError, match=r"priors\['sigma'\] has shape \(3,\)"):
        sample({**good, "sigma": dist.LogNormal(-1.0, 1.0).expand([3])})
    with pytest.raises(ValueError, match="is discrete"):
        sample({**good, "alpha": dist.Poisson(1.0)})
    with pytest.raises(TypeError, match="numpyro distribution"):
        sample({**good, "alpha": 0.5})
    with pytest.raises(ValueError, match="likelihood must be one of"):
        sample(good, likelihood="cauchy")
    with pytest.raises(ValueError, match="count model"):
        sample(good, likelihood="poisson")  # pelts in thousands are not counts
    with pytest.raises(ValueError, match="needs key"):
        sample(good, key=None)
    with pytest.raises(ValueError, match="target_accept"):
        sample(good, target_accept=1.5)
    with pytest.raises(TypeError, match="dense_mass must be True or False, got 'no'"):
        sample(good, dense_mass="no")  # a truthy string turned the dense metric on
    improper = dist.ImproperUniform(dist.constraints.positive, (), ())
    with pytest.raises(ValueError, match=r"priors\['alpha'\] is improper \(ImproperUniform\)"):
        sample({**good, "alpha": improper})
    negative = ds.Data(data.ts, np.where(data.values > 50, -1.0, data.values))
    with pytest.raises(ValueError, match="positive data"):
        ds.sample(guess, y0, negative, priors=good, **options)


def _synthetic(positions, diverging):
    """A posterior built from given draws, to check what it reports about them."""
    return synthetic_posterior({"a": positions}, diverging)


def test_a_chain_whose_step_size_collapsed_is_named():
    # a warm-up too short to adapt one chain: its step size ~1e-10 and its draws frozen; the
    # summary said "divergences [0, 0]" and only gave the generic R-hat and ESS notes
    rng = np.random.default_rng(1)
    positions = rng.normal(size=(2, 200))
    positions[1] = 0.3 + 1e-12 * rng.normal(size=200)
    posterior = _synthetic(positions, np.zeros((2, 200), bool))
    posterior.sample_stats["step_size"][1] = 1.5e-10
    notes = posterior.warnings
    assert any("chains [1] did not move (step size [1.5e-10]" in n for n in notes), notes
    assert "1.5e-10" in posterior.summary().splitlines()[1]  # not rounded to 0.0


def test_divergences_and_unmixed_chains_are_reported():
    rng = np.random.default_rng(0)
    mixed = rng.normal(size=(4, 1000))
    assert _synthetic(mixed, np.zeros((4, 1000), bool)).warnings == ()
    diverging = np.zeros((4, 1000), bool)
    diverging[1, :3] = True
    notes = _synthetic(mixed, diverging).warnings
    assert len(notes) == 1 and "3 divergent transitions" in notes[0] and "[0, 3, 0, 0]" in notes[0]
    stuck = mixed + np.array([0.0, 0.0, 0.0, 3.0])[:, None]  # one chain in another mode
    notes = _synthetic(stuck, np.zeros((4, 1000), bool)).warnings
    assert any("R-hat above 1.01 for ['a']" in n for n in notes)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _synthetic(mixed, np.zeros((4, 1000), bool)).summary()


def test_sampling_an_improper_posterior_is_warned_about():
    """y' = a·g: only the product is determined, and a and g have neither bounds nor priors,
    so the flat posterior has infinite mass along a·g = const. Sampling it warns so, naming
    them (before, only R-hat and effective-draw counts hinted at it)."""
    ts = np.linspace(0.5, 3.0, 6)
    problem = ds.Problem(
        ds.ODE(lambda t, y, p: jnp.stack([p["a"] * p["g"]]), {"a": 1.0, "g": 1.0}),
        [ds.Experiment({"time": ts, "observable": ["y"] * 6, "value": 0.5 * ts}, y0=jnp.zeros(1))],
        {"y": ds.Observable(lambda t, y, p: y[0], sigma=0.1)},
        {"a": 1.0, "g": 1.0},
    )
    with pytest.warns(ds.FitWarning, match=r"\['a', 'g'\] have neither both bounds nor a prior"):
        ds.sample(problem, chains=1, draws=10, warmup=10, key=jax.random.key(0))
