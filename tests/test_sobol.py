"""`ds.sobol`: Sobol' indices against closed forms (the Ishigami function, an additive linear
function), through simulate and sweep, and the errors for bad input."""

import jax.numpy as jnp
import numpy as np
import pytest

import diffsim as ds

A, B = 7.0, 0.1  # Ishigami's usual constants
PI = np.pi


def _ishigami(t, y, p):
    """dy/dt = Ishigami(x): y(1) from y(0) = 0 is the function itself (Euler with dt = 1 is
    exact for a constant rate), so the quantity goes through simulate and sweep."""
    x1, x2, x3 = p["x1"], p["x2"], p["x3"]
    value = jnp.sin(x1) + A * jnp.sin(x2) ** 2 + B * x3**4 * jnp.sin(x1)
    return jnp.zeros_like(y) + value


def _ishigami_model(x1, x2, x3):
    return ds.ODE(_ishigami, {"x1": x1, "x2": x2, "x3": x3})


def _final(solution):
    return solution.ys[-1, 0]


BOX = {"x1": (-PI, PI), "x2": (-PI, PI), "x3": (-PI, PI)}
OPTIONS = dict(solver=ds.Euler(), dt=1.0, reduce=_final, progress=False)


def test_ishigami_indices_against_the_closed_form():
    # Exact (Sobol' & Levitan; Saltelli et al. 2008): V = a²/8 + bπ⁴/5 + b²π⁸/18 + 1/2,
    # V1 = (1 + bπ⁴/5)²/2, V2 = a²/8, V3 = 0, VT3 = 8b²π⁸/225, VT1 = V1 + VT3.
    variance = A**2 / 8 + B * PI**4 / 5 + B**2 * PI**8 / 18 + 0.5
    v1, v2, vt3 = 0.5 * (1 + B * PI**4 / 5) ** 2, A**2 / 8, 8 * B**2 * PI**8 / 225
    first = np.array([v1, v2, 0.0]) / variance
    total = np.array([v1 + vt3, v2, vt3]) / variance
    result = ds.sobol(
        _ishigami_model, BOX, jnp.zeros(1), jnp.array([0.0, 1.0]), **OPTIONS, base_samples=2**14
    )
    assert result.attrs["simulations"] == 2**14 * 5
    # V from 2N = 32,768 quasi-random points: its Monte Carlo error is well under 1%
    np.testing.assert_allclose(result.attrs["variance"], variance, rtol=0.02)
    # the criteria: within 0.02 of the exact values at 2^14 base samples, and inside
    # the 95% bootstrap intervals
    np.testing.assert_allclose(result["first_order"], first, atol=0.02)
    np.testing.assert_allclose(result["total"], total, atol=0.02)
    for name, exact in (("first_order", first), ("total", total)):
        assert np.all(result[f"{name}_low"].values <= exact), name
        assert np.all(exact <= result[f"{name}_high"].values), name


def test_additive_function_has_equal_first_and_total_indices():
    # f = 1·u + 2·v + 0·w over unit boxes: no interactions, S_i = ST_i = c_i² / Σ c_j²
    def rate(t, y, p):
        return jnp.zeros_like(y) + p["u"] + 2 * p["v"] + 0 * p["w"]

    def make(u, v, w):
        return ds.ODE(rate, {"u": u, "v": v, "w": w})

    box = {"u": (0.0, 1.0), "v": (0.0, 1.0), "w": (0.0, 1.0)}
    result = ds.sobol(
        make, box, jnp.zeros(1), jnp.array([0.0, 1.0]), **OPTIONS, base_samples=2**12, bootstrap=0
    )
    exact = np.array([1.0, 4.0, 0.0]) / 5
    # 2^12 base samples of a smooth function: the estimators' error is a few 1e-3
    np.testing.assert_allclose(result["first_order"], exact, atol=0.01)
    np.testing.assert_allclose(result["total"], exact, atol=0.01)
    assert np.isnan(result["total_low"]).all()  # no resamples, no intervals
    assert list(result["parameter"].values) == ["u", "v", "w"]


def test_bad_input_is_refused_with_the_fix():
    y0, ts = jnp.zeros(1), jnp.array([0.0, 1.0])
    with pytest.raises(ValueError, match="non-empty dict name -> \\(low, high\\)"):
        ds.sobol(_ishigami_model, {}, y0, ts, **OPTIONS)
    with pytest.raises(ValueError, match="needs finite low < high"):
        ds.sobol(_ishigami_model, {**BOX, "x3": (1.0, 1.0)}, y0, ts, **OPTIONS)
    options = {**OPTIONS, "reduce": lambda s: s.ys[-1]}
    # too few base points for the indices to mean much (N = 2 gave S2 > ST2 and an ST1
    # interval that missed the true value): a warning before anything runs
    with (
        pytest.raises(ValueError, match="one number per simulation"),
        pytest.warns(UserWarning, match="base_samples = 8 is too few"),
    ):
        ds.sobol(_ishigami_model, BOX, y0, ts, **options, base_samples=8)
    with pytest.raises(ValueError, match="base_samples must be an int >= 2"):
        ds.sobol(_ishigami_model, BOX, y0, ts, **OPTIONS, base_samples=1)
    # a string range was read character by character: "01" as (0, 1)
    with pytest.raises(ValueError, match=r"ranges\['x1'\] must be a pair .* got '01'"):
        ds.sobol(_ishigami_model, {**BOX, "x1": "01"}, y0, ts, **OPTIONS)
    # a bad seed failed inside NumPy after every simulation had run
    for method in (ds.sobol, ds.morris):
        for seed in ("x", None, -1):
            with pytest.raises(TypeError, match=f"seed must be an int >= 0, got {seed!r}"):
                method(_ishigami_model, BOX, y0, ts, **OPTIONS, seed=seed)


def test_failed_simulations_are_not_dropped():
    # log(x) over x in (-1, 1): NaN for the points below 0 (the sweep warns; sobol refuses
    # to compute indices without them)
    def rate(t, y, p):
        return jnp.zeros_like(y) + jnp.log(p["x"])

    def make(x, z):
        return ds.ODE(rate, {"x": x, "z": z})

    with pytest.raises(ValueError, match="simulations failed"), pytest.warns(UserWarning):
        ds.sobol(
            make,
            {"x": (-1.0, 1.0), "z": (0.0, 1.0)},
            jnp.zeros(1),
            jnp.array([0.0, 1.0]),
            **OPTIONS,
            base_samples=16,
        )


def test_the_bar_plot_draws_both_indices_of_every_parameter():
    import matplotlib

    matplotlib.use("Agg")
    import xarray as xr

    indices = xr.Dataset(
        {
            "first_order": ("parameter", [0.3, 0.6]),
            "total": ("parameter", [0.35, 0.65]),
            "first_order_low": ("parameter", [0.2, 0.5]),
            "first_order_high": ("parameter", [0.4, 0.7]),
            "total_low": ("parameter", [0.3, 0.6]),
            "total_high": ("parameter", [0.4, 0.7]),
        },
        coords={"parameter": ["a", "b"]},
        attrs=dict(base_samples=64, level=0.95),
    )
    figure = ds.plot.sobol_indices(indices, labels=["α", "β"])
    heights = sorted(round(p.get_height(), 6) for p in figure.axes[0].patches)
    assert heights == [0.3, 0.35, 0.6, 0.65]
    assert [t.get_text() for t in figure.axes[0].get_xticklabels()] == ["α", "β"]
    with pytest.raises(TypeError, match="xarray Dataset of ds.sobol"):
        ds.plot.sobol_indices({"first_order": [0.1]})
    with pytest.raises(ValueError, match="labels has 1 entries for 2 parameters"):
        ds.plot.sobol_indices(indices, labels=["α"])


def _linear_and_square(t, y, p):
    """dy/dt = 2 x1 − 3 x2 + x3² (x4 unused): y(1) is that value (Euler, dt = 1)."""
    return jnp.zeros_like(y) + 2.0 * p["x1"] - 3.0 * p["x2"] + p["x3"] ** 2 + 0.0 * p["x4"]


def test_morris_effects_of_linear_square_and_unused_parameters():
    # Elementary effects in units of the quantity per whole range: a linear term c·x over
    # [lo, hi] has every effect c (hi − lo) (so μ* = |c|(hi − lo), σ = 0); x3² over [0, 1] has
    # effects (2 x + Δ) with x the start level, so σ > 0; an unused parameter has none.
    ranges = {"x1": (0.0, 1.0), "x2": (-1.0, 2.0), "x3": (0.0, 1.0), "x4": (0.0, 5.0)}
    result = ds.morris(
        lambda **p: ds.ODE(_linear_and_square, p),
        ranges,
        jnp.zeros(1),
        jnp.array([0.0, 1.0]),
        trajectories=40,
        seed=3,
        **OPTIONS,
    )
    mu_star, sigma = result["mu_star"].values, result["sigma"].values
    np.testing.assert_allclose(mu_star[:2], [2.0, 9.0], rtol=1e-12)
    np.testing.assert_allclose(sigma[[0, 1, 3]], 0.0, atol=1e-12)
    np.testing.assert_allclose(result["mu"].values[:2], [2.0, -9.0], rtol=1e-12)
    # x3 starts at level 0 or 1/3 and moves by Δ = 2/3: effects 2/3 and 4/3, mean in between
    assert 2 / 3 <= mu_star[2] <= 4 / 3 and sigma[2] > 0.1
    assert mu_star[3] == 0.0
    assert result.attrs["simulations"] == 40 * 5
    assert result["mu_star_low"].values[2] <= mu_star[2] <= result["mu_star_high"].values[2]
    with pytest.raises(ValueError, match="levels must be even"):
        ds.morris(lambda **p: ds.ODE(_linear_and_square, p), ranges, jnp.zeros(1),
                  jnp.array([0.0, 1.0]), levels=3, **OPTIONS)  # fmt: skip
    with pytest.raises(ValueError, match="morris: ranges"):
        ds.morris(lambda **p: ds.ODE(_linear_and_square, p), {}, jnp.zeros(1),
                  jnp.array([0.0, 1.0]), **OPTIONS)  # fmt: skip


def _decay_problem():
    """y' = −k y from y0 = A, measured at t = 1 and 2: log y(1) = log A − k, additive in
    (log A, k). A is on the log scale: a design samples log A uniformly."""
    data = {"time": [1.0, 2.0], "observable": ["y", "y"], "value": [0.5, 0.3]}
    return ds.Problem(
        ds.ODE(lambda t, y, p: -p["k"] * y, {"k": 0.5}),
        [ds.Experiment(data, y0=lambda p: jnp.stack([p["A"]]), name="decay")],
        {"y": ds.Observable(lambda t, y, p: y[0], sigma=0.1)},
        {
            "A": ds.Unknown(2.0, bounds=(1.0, float(np.e**2)), scale="log"),
            "k": ds.Unknown(0.5, bounds=(0.0, 1.0)),
        },
    )


def test_indices_of_a_problems_prediction_over_its_unknowns_on_their_scales():
    """log y(1) = log A − k with log A ~ U(0, 2) (A on the log scale within its bounds) and
    k ~ U(0, 1): additive, so first-order = total = each term's share of the variance,
    (4/12) / (5/12) = 0.8 and 0.2; a design linear in A would give other values. Morris:
    each elementary effect is the slope times the range, +2 and −1, in every trajectory
    (μ* = |μ|, σ = 0)."""
    problem = _decay_problem()

    def log_first(predictions):
        return jnp.log(predictions["decay"][0])

    indices = ds.sobol(problem, reduce=log_first, base_samples=1024, progress=False)
    # Monte Carlo error at N = 1024 (the bootstrap intervals are ~±0.02)
    np.testing.assert_allclose(indices["first_order"], [0.8, 0.2], atol=0.03)
    np.testing.assert_allclose(indices["total"], [0.8, 0.2], atol=0.03)
    effects = ds.morris(
        problem, ranges=["A", "k"], reduce=log_first, trajectories=8, progress=False
    )
    # the solve's tolerance (rtol 1e-8) over steps of 2/3 and 1/3 of the ranges
    np.testing.assert_allclose(effects["mu"], [2.0, -1.0], rtol=1e-6)
    np.testing.assert_allclose(effects["mu_star"], [2.0, 1.0], rtol=1e-6)
    np.testing.assert_allclose(effects["sigma"], [0.0, 0.0], atol=1e-6)
    # a range given in natural units, and the log-likelihood as the quantity
    narrow = ds.morris(
        problem, ranges={"k": (0.2, 0.4)}, reduce="llh", trajectories=4, progress=False
    )
    assert list(narrow["parameter"].values) == ["k"] and np.isfinite(narrow["mu_star"]).all()
    with pytest.raises(TypeError, match="a ds.Problem brings its own"):
        ds.sobol(problem, y0=jnp.ones(1), reduce="llh", progress=False)
    with pytest.raises(ValueError, match="'B' is not an estimated unknown"):
        ds.morris(problem, ranges=["B"], reduce="llh", progress=False)
    with pytest.raises(TypeError, match="reduce of a ds.Problem must be 'llh'"):
        ds.morris(problem, reduce="mean", progress=False)
    # a range beyond the bounds (it narrows them), and a reduce naming no experiment
    with pytest.raises(ValueError, match=r"'k' ranges over \(2.0, 3.0\), beyond its bounds"):
        ds.morris(problem, ranges={"k": (2.0, 3.0)}, reduce="llh", progress=False)
    with pytest.raises(KeyError, match=r"'e1' is no experiment of the problem; .*\['decay'\]"):
        ds.morris(problem, reduce=lambda q: q["e1"][0], trajectories=4, progress=False)
