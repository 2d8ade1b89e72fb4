"""`ds.multiple_shooting`: a long oscillation whose frequency one shot from a poor guess
cannot find (it ends in a local optimum) is found through windows with estimated starts."""

import jax.numpy as jnp
import numpy as np
import pytest

import diffsim as ds


def _oscillation():
    """x'' = −ω² x over ten periods of ω = 2 (x(0) = 1, x'(0) = 0), x measured exactly at
    121 times with σ = 0.05; ω guessed as 1.2."""
    model = ds.ODE(lambda t, y, p: jnp.stack([y[1], -(p["w"] ** 2) * y[0]]), {"w": 1.0})
    ts = np.linspace(0.0, 30.0, 121)
    data = {"time": ts, "observable": ["x"] * ts.size, "value": np.cos(2.0 * ts)}
    return ds.Problem(
        model,
        [ds.Experiment(data, y0=jnp.array([1.0, 0.0]), name="swing")],
        {"x": ds.Observable(lambda t, y, p: y[0], sigma=0.05)},
        {"w": ds.Unknown(1.2, bounds=(0.1, 10.0), scale="log10")},
        solver=ds.Tsit5(rtol=1e-8, atol=1e-10),
    )


def test_windows_with_estimated_starts_find_what_one_shot_misses():
    """From ω = 1.2, one shot ends far from 2 (a local optimum of the ten-period fit); ten
    windows (their starts estimated, continuity at the default 5% of each component) reach ω = 2 to
    1e-6, and that value is the original problem's optimum (its llh there is the exact
    data's, 121 · log(1 / (√(2π) 0.05)))."""
    problem = _oscillation()
    single = ds.fit(problem, starts=np.array([[1.2]]), progress=False)
    assert abs(single.params["w"] - 2.0) > 0.5
    shooting = ds.multiple_shooting(problem, 10)
    assert len(shooting.experiments) == 10
    # one batch: the first window starts from its constant state as the others from theirs
    assert [len(g.members) for g in shooting.tables.groups] == [10]
    assert shooting.names == ("w",) + tuple(
        f"swing [window {k}]:{i}" for k in range(1, 10) for i in range(2)
    )
    # from the same guess (ω = 1.2, the windows' starts on its trajectory), not screened
    fit = ds.fit(shooting, starts=np.asarray(shooting.theta())[None], progress=False)
    # 1e-6: exact data, so the optimum is ω = 2 up to the solves' error (rtol 1e-8 over ten
    # periods) and the fit's stopping tolerance
    assert fit.params["w"] == pytest.approx(2.0, abs=1e-6)
    ceiling = 121 * np.log(1 / (np.sqrt(2 * np.pi) * 0.05))
    assert problem.llh({"w": fit.params["w"]}) == pytest.approx(ceiling, abs=1e-6)
    # each window's start is the trajectory's state there: (cos 2t, −2 sin 2t)
    t = 3.0
    assert fit.params["swing [window 1]:0"] == pytest.approx(np.cos(2 * t), abs=1e-6)
    assert fit.params["swing [window 1]:1"] == pytest.approx(-2 * np.sin(2 * t), abs=1e-6)


def test_windows_at_the_trajectory_add_only_their_continuity_terms():
    """Two experiments of different spans (one from t0 = 0.5, its start a function of the
    estimated ω): at the unknowns' values the windows start on the trajectory, so every
    measurement is predicted as before and each continuity defect is 0: the llh is the
    original's plus log N(0; 0, σᵢ) per continuity measurement (1e-6, the solves' tolerance)."""
    problem = _oscillation()
    late = ds.Experiment(
        {"time": np.linspace(1.0, 9.0, 17), "observable": ["x"] * 17, "value": np.zeros(17)},
        y0=lambda p: jnp.stack([1.0, p["w"]]),
        t0=0.5,
        name="late",
    )
    problem = ds.Problem(
        problem.model,
        [problem.experiments[0], late],
        problem.observables,
        problem.unknowns,
        solver=problem.solver,
    )
    shooting = ds.multiple_shooting(problem, 3, sigma=[0.1, 0.2])
    assert len(shooting.experiments) == 6
    # late's first window starts from its function of ω, a batch of its own; every other
    # window from its `shoot:start` settings
    assert sorted(len(g.members) for g in shooting.tables.groups) == [1, 5]
    constants = 2 * sum(np.log(1 / (np.sqrt(2 * np.pi) * s)) for s in (0.1, 0.2))  # per edge
    assert shooting.llh() == pytest.approx(problem.llh() + 2 * constants, abs=1e-6)
    with pytest.raises(ValueError, match=r"one per state component, 2\)"):
        ds.multiple_shooting(problem, 3, sigma=[0.1, 0.2, 0.3])


def test_bad_shooting_requests_are_refused():
    problem = _oscillation()
    with pytest.raises(ValueError, match="segments must be an int >= 2"):
        ds.multiple_shooting(problem, 1)
    with pytest.raises(ValueError, match="sigma must be positive"):
        ds.multiple_shooting(problem, 3, sigma=0.0)
    with pytest.raises(TypeError, match="expected a ds.Problem"):
        ds.multiple_shooting("problem", 3)
