"""Integration backwards in time (a decreasing `ts`) and empty spans (`ts[0] == ts[-1]`):
against closed forms and the forward solves, with derivatives, events and the refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import diffsim as ds
import models

OSCILLATOR = ds.ODE(lambda t, y, p: jnp.stack([y[1], -p * y[0]]), 4.0)  # omega = 2

# Kvaerno5 backwards: tests/test_peer_scipy.py::test_integration
SOLVERS = {
    "RK4": dict(solver=ds.RK4(), dt=0.005),
    "Tsit5": dict(solver=ds.Tsit5(rtol=1e-10, atol=1e-12)),
    "Rodas5P": dict(solver=ds.Rodas5P(rtol=1e-10, atol=1e-12)),
}


def _oscillator(t):
    """x = cos 2t, v = -2 sin 2t (from x = 1, v = 0 at t = 0)."""
    return np.stack([np.cos(2 * t), -2 * np.sin(2 * t)], -1)


@pytest.mark.parametrize("name", SOLVERS)
def test_a_backward_solve_matches_the_closed_form_and_the_forward_solve(name):
    # from t = 3 back to 0 through 31 outputs: the closed form at every output, and back at
    # t = 0 the state the forward solve started from (measured: RK4 at dt 0.005 1.0e-9 off,
    # the adaptive solvers at rtol 1e-10 ≤ 6.5e-11; 1e-8 and 2e-8 leave a margin of 10)
    ts = jnp.linspace(3.0, 0.0, 31)
    sol = ds.simulate(OSCILLATOR, jnp.asarray(_oscillator(3.0)), ts, **SOLVERS[name])
    np.testing.assert_allclose(sol.ys, _oscillator(np.asarray(ts)), atol=1e-8)
    assert sol.ts[0] == 3.0
    forward = ds.simulate(OSCILLATOR, jnp.array([1.0, 0.0]), ts[::-1], **SOLVERS[name])
    np.testing.assert_allclose(sol.ys[::-1], forward.ys, atol=2e-8)


@pytest.mark.parametrize("name", ["RK4", "Tsit5", "Rodas5P"])
def test_derivatives_of_a_backward_solve(name):
    # y' = -k y from y(1) = 1 back to t = 0: y(0) = e^k, dy(0)/dk = e^k, and the Hessian e^k
    model = lambda k: ds.ODE(lambda t, y, p: -p * y, k)  # noqa: E731

    def back(k):
        ts = jnp.array([1.0, 0.5, 0.0])
        return ds.simulate(model(k), jnp.array([1.0]), ts, **SOLVERS[name]).ys[-1, 0]

    k = 0.7
    np.testing.assert_allclose(back(k), np.exp(k), rtol=1e-8)
    np.testing.assert_allclose(jax.grad(back)(k), np.exp(k), rtol=1e-7)
    if name == "RK4":  # second order (forward over reverse, so forward mode too) through the
        # same reversal (the adaptive loops' Hessians are tested forwards in test_derivatives.py)
        np.testing.assert_allclose(jax.hessian(back)(k), np.exp(k), rtol=1e-5)
    else:
        np.testing.assert_allclose(jax.jacfwd(back)(k), np.exp(k), rtol=1e-7)


@pytest.mark.parametrize("name", ["RK4", "Tsit5", "Rodas5P"])
def test_a_terminal_event_backwards(name):
    # x = cos 2t from t = 3 back: x falls through 0 at 5 pi / 4 going backwards (x' = 4 sin 2t
    # along decreasing t, negative just above it), its time in the caller's time
    event = ds.Event(lambda t, y: y[0], direction=-1)
    ts = jnp.linspace(3.0, 0.0, 7)
    sol = ds.simulate(OSCILLATOR, jnp.asarray(_oscillator(3.0)), ts, events=event, **SOLVERS[name])
    np.testing.assert_allclose(sol.event_time, 5 * np.pi / 4 - np.pi / 2, atol=1e-7)
    assert sol.reached.tolist() == [True, True, False, False, False, False, False]


@pytest.mark.parametrize("name", ["RK4", "Tsit5"])
def test_an_empty_span_returns_the_initial_state(name):
    y0 = jnp.array([1.0, 0.0])
    sol = ds.simulate(OSCILLATOR, y0, jnp.array([2.0, 2.0, 2.0]), **SOLVERS[name])
    np.testing.assert_array_equal(sol.ys, jnp.stack([y0, y0, y0]))
    assert int(sol.result) == 0 and int(sol.stats["num_steps"]) == 0
    event = ds.Event(lambda t, y: y[0])
    sol = ds.simulate(OSCILLATOR, y0, jnp.array([2.0, 2.0]), events=event, **SOLVERS[name])
    assert int(sol.event_count) == 0 and float(sol.event_time) == np.inf


def test_backwards_is_refused_where_it_has_no_meaning():
    with pytest.raises(NotImplementedError, match="backwards.*Leapfrog"):
        ds.simulate(
            models.Kepler(),
            jnp.array([[1.0, 0.0], [0.0, 1.0]]),
            jnp.array([1.0, 0.0]),
            solver=ds.Leapfrog(),
            dt=0.01,
        )
    with pytest.raises(ValueError, match="strictly increasing \\(or strictly decreasing"):
        ds.simulate(OSCILLATOR, jnp.ones(2), jnp.array([0.0, 1.0, 0.5]), solver=ds.Tsit5())


@pytest.mark.parametrize("name", ["Tsit5", "Rodas5P"])
def test_an_open_end_closed_by_a_terminal_event(name):
    # scipy's test_duplicate_timestamps: a cannon fired up at 0.01 m/s over t_span (0, inf)
    # lands at 2 v / g; the output at inf is never reached
    cannon = ds.ODE(lambda t, y, p: jnp.stack([y[1], jnp.full_like(y[0], -9.80665)]), None)
    hit = ds.Event(lambda t, y: y[0], direction=-1, terminal=True)
    ts = jnp.array([0.0, 0.001, jnp.inf])
    sol = ds.simulate(cannon, jnp.array([0.0, 0.01]), ts, events=hit, **SOLVERS[name])
    np.testing.assert_allclose(sol.event_time, 2 * 0.01 / 9.80665, rtol=1e-10)
    assert sol.reached.tolist() == [True, True, False]
    np.testing.assert_allclose(sol.ys[1], [0.01e-3 - 0.5 * 9.80665e-6, 0.01 - 9.80665e-3])


def test_an_open_end_needs_a_terminal_event_and_an_own_loop():
    cannon = ds.ODE(lambda t, y, p: jnp.stack([y[1], jnp.full_like(y[0], -9.80665)]), None)
    hit = ds.Event(lambda t, y: y[0], direction=-1, terminal=True)
    ts, y0 = jnp.array([0.0, jnp.inf]), jnp.array([0.0, 0.01])
    with pytest.raises(ValueError, match="none was given"):
        ds.simulate(cannon, y0, ts, solver=ds.Tsit5())
    with pytest.raises(ValueError, match="fixed steps"):
        ds.simulate(cannon, y0, ts, solver=ds.RK4(), dt=0.1, events=hit)
    with pytest.raises(ValueError, match="diffrax's loop"):
        ds.simulate(cannon, y0, ts, solver=ds.Kvaerno5(), events=hit)
    with pytest.raises(ValueError, match="only its last time may be inf"):
        ds.simulate(cannon, y0, jnp.array([0.0, jnp.inf, jnp.inf]), solver=ds.Tsit5(), events=hit)


def test_a_traced_decreasing_ts_fails_loudly_also_for_event_outputs():
    # under jit a ts built inside the function is traced and must increase; the failure
    # reaches a caller who reads only the event state (it came back silently wrong before)
    hit = ds.Event(lambda t, y: y[0] + 0.5)

    @jax.jit
    def event_state():
        ts = jnp.array([2.0, 0.0])
        sol = ds.simulate(OSCILLATOR, jnp.array([1.0, 0.0]), ts, solver=ds.Tsit5(), events=hit)
        return sol.event_state

    with pytest.raises(Exception, match="a ts traced under jit must increase"):
        jax.block_until_ready(event_state())
