"""Adaptive and stiff solvers against scipy's solve_ivp (DOP853 at rtol 1e-12)."""

import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import diffsim as ds
import models


# Independent NumPy right-hand sides (written from the equations, not from the models' code), so
# that the reference is fast and shares no code with what it checks.
def _lorenz(t, y, sigma=10.0, rho=28.0, beta=8.0 / 3.0):
    return [sigma * (y[1] - y[0]), y[0] * (rho - y[2]) - y[1], y[0] * y[1] - beta * y[2]]


def _robertson(t, y, k1=0.04, k2=3e7, k3=1e4):
    return [
        -k1 * y[0] + k3 * y[1] * y[2],
        k1 * y[0] - k2 * y[1] ** 2 - k3 * y[1] * y[2],
        k2 * y[1] ** 2,
    ]


def _reference(rhs, y0, ts):
    ref = solve_ivp(
        rhs,
        (ts[0], ts[-1]),
        np.asarray(y0),
        method="DOP853",
        t_eval=np.asarray(ts),
        rtol=1e-12,
        atol=1e-14,
    )
    assert ref.success
    return ref.y.T


@pytest.mark.parametrize(
    "solver, tol",
    [
        # Lorenz over t in [0, 2]: local errors at rtol 1e-10 accumulate over ~1e3 steps and are
        # amplified by exp(0.9 t) ~ 6 (largest Lyapunov exponent ~0.9): a few 1e-7 relative.
        (ds.Tsit5(rtol=1e-10, atol=1e-10), 1e-6),
        (ds.Dopri5(rtol=1e-10, atol=1e-10), 1e-6),
        (ds.Dopri8(rtol=1e-10, atol=1e-10), 1e-6),
        (ds.Diffrax(__import__("diffrax").Bosh3(), rtol=1e-10, atol=1e-10), 1e-6),
    ],
    ids=["Tsit5", "Dopri5", "Dopri8", "Diffrax(Bosh3)"],
)
def test_nonstiff_lorenz_against_scipy(solver, tol):
    model = models.Lorenz()
    y0 = jnp.array([1.0, 1.0, 1.0])
    ts = jnp.linspace(0.0, 2.0, 21)
    sol = ds.simulate(model, y0, ts, solver=solver, max_steps=200_000)
    ref = _reference(_lorenz, y0, ts)
    scale = np.max(np.abs(ref), axis=0)  # component magnitudes (z ~ 30, x ~ 15)
    np.testing.assert_allclose(sol.ys / scale, ref / scale, atol=tol, rtol=0)


@pytest.mark.parametrize(
    "solver, rtol",
    [
        # Stiff Robertson over t in [0, 10] (scipy's DOP853 needs ~7e4 evaluations). The
        # fast species y2 ~ 3e-5 is compared relative to itself; 1e-6 allows Newton tolerance
        # and error accumulation over the stiff transient at rtol 1e-10.
        (ds.Kvaerno5(rtol=1e-10, atol=1e-14), 1e-6),
        (ds.Diffrax(__import__("diffrax").Kvaerno3(), rtol=1e-10, atol=1e-14), 1e-6),
    ],
    ids=["Kvaerno5", "Diffrax(Kvaerno3)"],
)
def test_stiff_robertson_against_scipy(solver, rtol):
    model = models.Robertson()
    y0 = jnp.array([1.0, 0.0, 0.0])
    ts = jnp.array([0.0, 0.1, 1.0, 10.0])
    sol = ds.simulate(model, y0, ts, solver=solver, max_steps=100_000)
    ref = _reference(_robertson, y0, ts)
    np.testing.assert_allclose(sol.ys[1:], ref[1:], rtol=rtol)


def test_tolerance_change_does_not_recompile():
    import equinox as eqx

    model = models.Lorenz()
    y0 = jnp.array([1.0, 1.0, 1.0])
    ts = jnp.linspace(0.0, 1.0, 11)

    @eqx.debug.assert_max_traces(max_traces=1)
    def run(solver):
        return ds.simulate(model, y0, ts, solver=solver)

    run_jit = eqx.filter_jit(run)
    coarse = run_jit(ds.Tsit5(rtol=1e-4, atol=1e-4))
    fine = run_jit(ds.Tsit5(rtol=1e-9, atol=1e-9))
    assert int(fine.stats["num_steps"]) > int(coarse.stats["num_steps"])


def test_new_initial_step_does_not_recompile(caplog):
    import logging

    import jax

    model = models.Lorenz()
    y0 = jnp.array([1.0, 1.0, 1.0])
    ts = jnp.linspace(0.0, 0.5, 6)
    solver = ds.Tsit5(rtol=1e-6, atol=1e-6)
    ds.simulate(model, y0, ts, solver=solver, dt=0.1)  # compiles
    with caplog.at_level(logging.WARNING, logger="jax"), jax.log_compiles(True):
        for dt in (0.05, 0.02):
            ds.simulate(model, y0, ts, solver=solver, dt=dt)
    compiles = [r.getMessage()[:80] for r in caplog.records if "Compiling" in r.getMessage()]
    assert not [c for c in compiles if "solve_adaptive" in c], compiles
