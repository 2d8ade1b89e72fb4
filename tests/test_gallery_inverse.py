"""Gallery experiments: the driven pendulum's bifurcation diagram and the heat equation's inverse
problem, through their quick runs (each experiment runs once per module, shared by its tests)."""

import numpy as np
import pytest
import xarray as xr
from helpers import check_outputs, load_experiment


@pytest.fixture(scope="module")
def bifurcation(tmp_path_factory):
    out = tmp_path_factory.mktemp("pendulum_bifurcation")
    return out, load_experiment("pendulum_bifurcation").run(out, quick=True)


@pytest.fixture(scope="module")
def heat(tmp_path_factory):
    out = tmp_path_factory.mktemp("heat_inverse")
    return out, load_experiment("heat_inverse").run(out, quick=True)


def _check_files(out, record, figure):
    check_outputs(record, out, ())
    assert {f"{figure}.png", f"{figure}.pdf", f"{figure}.json"} <= set(record["files"])


# --- the pendulum ----------------------------------------------------------------------------


def test_bifurcation_files(bifurcation):
    out, record = bifurcation
    _check_files(out, record, "pendulum_bifurcation")
    config = record["config"]
    with xr.open_dataset(out / "pendulum_bifurcation.nc", engine="h5netcdf") as data:
        assert data["omega"].shape == (config["amplitudes"], config["section_periods"])
        assert (data["result"] == 0).all()
    assert record["failed_members"] == 0


def test_period_one_windows(bifurcation):
    _, record = bifurcation
    for amplitude in ("0.95", "1", "1.35"):
        probe = record["probes"][amplitude]
        assert probe["period"] == 1 and probe["distinct_points"] == 1, (amplitude, probe)
        # After 300 transient periods the distance to a stable period-1 orbit has shrunk
        # geometrically (phase volume contracts by e^(-T/q) = e^(-4.7) per period): measured
        # 5e-11 rad/s at g = 1 and below 1e-11 at 0.95 and 1.35. 1e-7 is 2000x above that
        # and 1000x below the 1e-4 tolerance that tells section points apart.
        assert probe["spread"] < 1e-7, (amplitude, probe)


def test_first_period_doubling(bifurcation):
    _, record = bifurcation
    probe = record["probes"]["1.07"]
    assert probe["period"] == 2 and probe["distinct_points"] == 2, probe
    # the two branches are 0.067 rad/s apart at g = 1.07: far above the 1e-4 tolerance
    assert probe["spread"] > 0.01
    # Baker & Gollub's first doubling lies near g = 1.07 (full run: first period 2 at 1.066);
    # the quick grid has steps of 0.01, so its first period-2 amplitude is 1.07
    assert 1.06 <= record["first_period_doubling"] <= 1.08


def test_second_cascade(bifurcation):
    _, record = bifurcation
    onsets = record["cascade_onsets"]
    # full run (steps of 1e-4): period 2 from g = 1.4232, 4 from 1.4590; the quick zoom grid
    # has steps of 0.004, so each onset is found at most one step later
    assert 1.4232 <= onsets["2"] <= 1.4232 + 0.004 + 1e-9
    assert 1.4590 <= onsets["4"] <= 1.4590 + 0.004 + 1e-9
    assert record["probes"]["1.45"]["period"] == 2


def test_chaotic_band(bifurcation):
    _, record = bifurcation
    samples = record["config"]["section_periods"]
    for amplitude in ("1.2", "1.5"):
        probe = record["probes"][amplitude]
        assert probe["period"] == 0, (amplitude, probe)  # no period up to 32
        # chaos: (nearly) every one of the 64 section points is distinct (measured: all 64)
        # and they fill a band of ω 2.5 rad/s wide; a periodic orbit of any period has a
        # finite number of points, and the period-2 branches here are at most 0.75 apart
        assert probe["distinct_points"] >= 0.9 * samples, (amplitude, probe)
        assert probe["spread"] > 1.0, (amplitude, probe)
    # Baker & Gollub's chaotic band 1.15-1.26 has only narrow windows (full run: 95% of the
    # 221 amplitudes aperiodic; quick: all 12); 80% leaves room for a window on the coarse grid
    assert record["aperiodic_fraction_1.15_to_1.26"] >= 0.8


def test_section_classification():
    module = load_experiment("pendulum_bifurcation")
    rng = np.random.default_rng(1)
    three = np.tile([0.5, 1.5, -0.2], 22)[:64] + 1e-7 * rng.standard_normal(64)
    noise = rng.uniform(-1, 2, 64)
    samples = np.stack([np.full(64, 0.7), three, noise])
    assert module.periods_of(samples).tolist() == [1, 3, 0]
    assert module.distinct_points(samples)[:2].tolist() == [1, 3]
    assert module.distinct_points(samples)[2] >= 60  # uniform draws: gaps below 1e-4 are rare


# --- the heat equation -----------------------------------------------------------------------


def test_heat_files(heat):
    out, record = heat
    _check_files(out, record, "heat_inverse")
    with xr.open_dataset(out / "heat_inverse.nc", engine="h5netcdf") as data:
        alphas = record["config"]["alphas"]
        assert data["recovered_initial"].shape == (len(alphas), record["config"]["points"])
        assert data.attrs["chosen_alpha"] == record["chosen_alpha"]


def test_heat_recovery(heat):
    _, record = heat
    # With 1% noise the data see the sine modes up to k ~ 15 (the Picard panel); what the
    # penalty fills in beyond them, plus the noise in the seen modes, costs the bumps a few
    # percent (measured 6.7% quick, 5.4% full). 10% leaves room for a neighbouring grid α.
    assert record["relative_error"] < 0.10
    # Without the penalty the fit amplifies the noise in the unseen modes (measured 162% after
    # 150 iterations, still growing); the initial guess u0 = 0 has error 1 by definition.
    assert record["unregularized_relative_error"] > 5 * record["relative_error"]
    assert record["initial_guess_relative_error"] > 5 * record["relative_error"]
    # Morozov's choice explains the data to within the noise, χ²/m ≤ 1, and not far below:
    # 252 data and at most ~30 effective parameters give χ²/m ≥ 1 - 30/252 ≈ 0.88
    assert 0.88 < record["misfit"] <= 1.0
    # converged: the quadratic's exact line search takes the gradient to round-off (1e-12)
    assert record["gradient_norm_at_chosen"] < 1e-6


def test_heat_prediction_is_the_model(heat):
    """The fit tracks the predictions through its steps by linearity; a fresh solve of the
    recovered u0 must give them (measured: 8e-15 apart)."""
    import jax.numpy as jnp

    import diffsim as ds
    import models

    out, record = heat
    with xr.open_dataset(out / "heat_inverse.nc", engine="h5netcdf") as data:
        chosen = data.sel(alpha=record["chosen_alpha"])
        config = record["config"]
        model = models.Heat1D(
            diffusivity=config["diffusivity"], length=config["length"], n=config["points"]
        )
        ts = np.r_[0.0, config["observation_times"]]
        u0 = jnp.asarray(chosen["recovered_initial"].values)
        solved = ds.simulate(model, u0, ts, solver=ds.RK4(), dt=config["dt"]).ys[1:]
        # round-off of ~150 linear updates of values of size 1: far below 1e-9
        np.testing.assert_allclose(solved, chosen["predicted"].values, rtol=0, atol=1e-9)


def test_heat_gradient_check(heat):
    _, record = heat
    check = record["gradient_check"]
    # The loss is quadratic in u0 (RK4 of the linear heat equation is a linear map), so a
    # central difference has no truncation error; its round-off is ~eps·J/(h·|∇J·v|) =
    # 2e-16·956/(1e-3·144) ≈ 1e-12 (measured 4e-14). A wrong adjoint would be off by O(1).
    assert check["relative_error"] < 1e-8
    assert check["largest_relative_error_over_alphas"] < 1e-8
