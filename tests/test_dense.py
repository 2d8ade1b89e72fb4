"""Dense output: `simulate(..., dense=True)` and `Solution.evaluate` / `Solution.derivative`
against the exact solution of an oscillator at random times, the method's own interpolant
(the outputs at `ts`), every derivative, `jit`/`vmap`, backward solves, events with resets,
and clear refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import diffsim as ds
import models


def _oscillator(t, y, p):
    return jnp.stack([y[1], -(p["w"] ** 2) * y[0]])


Y0 = jnp.array([1.0, 0.0])
# random query times on [0, 10], not on the output grid; the exact solution cos(2t)
TIMES = jnp.asarray(np.sort(np.random.default_rng(0).uniform(0.0, 10.0, 200)))


def _exact(t, w=2.0):
    return jnp.stack([jnp.cos(w * t), -w * jnp.sin(w * t)], -1)


def _exact_slope(t, w=2.0):
    return jnp.stack([-w * jnp.sin(w * t), -(w**2) * jnp.cos(w * t)], -1)


# error bounds: the global error of each solve over five periods. Adaptive solves at
# rtol 1e-10 keep the error at the steps below ~1e-9 (measured 1.4e-10 Tsit5, 6.6e-10 Dopri5,
# 3.6e-11 Rodas5P); RK4 at dt = 0.01 has a global error of ~5e-8 and the cubic Hermite
# interpolant adds h^4/384·max|y''''| ≈ 4e-10. The slope is one order of h less accurate
# (measured up to 1.1e-8 adaptive, 3.5e-7 RK4).
CASES = [
    pytest.param(ds.Tsit5(rtol=1e-10, atol=1e-12), {}, 1e-9, 1e-7, id="Tsit5"),
    pytest.param(ds.Dopri5(rtol=1e-10, atol=1e-12), {}, 2e-9, 1e-7, id="Dopri5"),
    pytest.param(ds.Rodas5P(rtol=1e-10, atol=1e-12), {}, 1e-9, 1e-7, id="Rodas5P"),
    pytest.param(ds.RK4(), {"dt": 0.01}, 1e-7, 1e-6, id="RK4"),
]


@pytest.mark.parametrize("solver, options, tol, slope_tol", CASES)
def test_evaluate_matches_the_exact_oscillator_at_random_times(solver, options, tol, slope_tol):
    model = ds.ODE(_oscillator, {"w": 2.0})
    ts = jnp.linspace(0.0, 10.0, 3)
    sol = ds.simulate(model, Y0, ts, solver=solver, dense=True, **options)
    np.testing.assert_allclose(sol.evaluate(TIMES), _exact(TIMES), atol=tol, rtol=0)
    np.testing.assert_allclose(sol.derivative(TIMES), _exact_slope(TIMES), atol=slope_tol, rtol=0)
    # the output times read from the dense output are the saved states
    np.testing.assert_allclose(sol.evaluate(ts), sol.ys, atol=1e-13, rtol=1e-13)
    assert sol.evaluate(3.0).shape == (2,)
    assert sol.evaluate(jnp.ones((4, 5))).shape == (4, 5, 2)
    # outside the span the solve covered there is no answer
    assert np.all(np.isnan(sol.evaluate(jnp.array([-0.1, 10.1]))))


@pytest.mark.parametrize(
    "solver",
    [ds.Tsit5(rtol=1e-6), ds.Dopri8(rtol=1e-8), ds.Rosenbrock23(rtol=1e-5)],
    ids=["Tsit5", "Dopri8", "Rosenbrock23"],
)
def test_the_stored_pieces_reproduce_the_methods_own_interpolant(solver):
    """The outputs at `ts` come from the method's interpolant inside the step; the dense output
    holds the same polynomial (sampled at degree + 1 nodes), so both agree to round-off at
    every output time (a node count below the interpolant's degree would miss by the
    interpolant's curvature, ~1e-4 here)."""
    solver = (
        solver if not isinstance(solver, ds.Dopri8) else ds.Dopri8(rtol=1e-8, step_to_outputs=False)
    )
    model = ds.ODE(_oscillator, {"w": 2.0})
    ts = jnp.linspace(0.0, 3.0, 61)
    sol = ds.simulate(model, Y0, ts, solver=solver, dense=True)
    np.testing.assert_allclose(sol.evaluate(ts), sol.ys, atol=1e-13, rtol=1e-12)


@pytest.mark.parametrize(
    "solver, options",
    [(ds.Tsit5(rtol=1e-10, atol=1e-12), {}), (ds.RK4(), {"dt": 0.01})],
    ids=["Tsit5", "RK4"],
)
def test_derivatives_of_evaluate_in_every_mode(solver, options):
    ts = jnp.array([0.0, 3.0])
    queries = jnp.array([0.37, 1.91, 2.5])  # 0.37 is a step boundary of RK4

    def position(w, t):
        sol = ds.simulate(
            ds.ODE(_oscillator, {"w": w}), Y0, ts, solver=solver, dense=True, **options
        )
        return sol.evaluate(t)[..., 0]

    # d/dw cos(w t) = −t sin(w t); d²/dw² = −t² cos(w t); d/dt = −w sin(w t)
    exact = -queries * jnp.sin(2.0 * queries)
    tol = 1e-8 if isinstance(solver, ds.Tsit5) else 1e-7  # the solves' global errors (above)
    np.testing.assert_allclose(jax.jacrev(position)(2.0, queries), exact, atol=tol)
    # (forward mode: the Hessian below is forward over reverse)
    slope = jax.vmap(jax.grad(position, 1), (None, 0))(2.0, queries)
    np.testing.assert_allclose(slope, -2.0 * jnp.sin(2.0 * queries), atol=10 * tol)
    second = jax.hessian(position)(2.0, queries[1])
    np.testing.assert_allclose(second, -(queries[1] ** 2) * jnp.cos(2.0 * queries[1]), atol=1e-6)
    batch = jax.jit(jax.vmap(lambda w: position(w, queries)))(jnp.array([1.5, 2.0]))
    np.testing.assert_allclose(
        batch, jnp.cos(jnp.array([[1.5], [2.0]]) * queries[None, :]), atol=tol
    )


@pytest.mark.parametrize(
    "solver, options", [(ds.Tsit5(rtol=1e-10, atol=1e-12), {}), (ds.RK4(), {"dt": 0.01})]
)
def test_a_backward_solve_evaluates_like_the_forward_one(solver, options):
    model = ds.ODE(_oscillator, {"w": 2.0})
    end = _exact(jnp.asarray(3.0))
    sol = ds.simulate(model, end, jnp.array([3.0, 0.0]), solver=solver, dense=True, **options)
    queries = jnp.array([0.05, 1.3, 2.99])
    tol = 1e-8 if isinstance(solver, ds.Tsit5) else 1e-7
    np.testing.assert_allclose(sol.evaluate(queries), _exact(queries), atol=tol)
    np.testing.assert_allclose(sol.derivative(queries), _exact_slope(queries), atol=10 * tol)
    assert np.all(np.isnan(sol.evaluate(3.5)))


def test_the_dense_output_follows_an_event_and_its_reset():
    """A ball dropped from 1 m bounces with restitution 0.8: between bounces the height is a
    parabola; the dense output reads it on both sides of the first bounce."""
    g, restitution = 9.81, 0.8

    def fall(t, y, p):
        return jnp.stack([y[1], -g * jnp.ones_like(y[0])])

    bounce = ds.Event(
        lambda t, y: y[0],
        reset=lambda t, y: jnp.stack([jnp.zeros_like(y[0]), -restitution * y[1]]),
        direction=-1,
        max_events=3,
    )
    sol = ds.simulate(
        ds.ODE(fall, {}),
        jnp.array([1.0, 0.0]),
        jnp.linspace(0.0, 1.0, 3),
        solver=ds.Tsit5(rtol=1e-10, atol=1e-12),
        events=bounce,
        dense=True,
    )
    t_hit = np.sqrt(2.0 / g)
    up = restitution * g * t_hit
    queries = jnp.array([0.2, t_hit - 1e-3, t_hit + 1e-3, t_hit + 0.3])
    after = queries - t_hit
    exact = np.where(queries < t_hit, 1.0 - g * queries**2 / 2, up * after - g * after**2 / 2)
    # a quadratic: the quartic interpolant holds it to round-off
    np.testing.assert_allclose(sol.evaluate(queries)[:, 0], exact, atol=1e-12)
    exact_velocity = np.where(queries < t_hit, -g * queries, up - g * after)
    np.testing.assert_allclose(sol.derivative(queries)[:, 0], exact_velocity, atol=1e-10)


def test_dense_output_under_jit_with_throw():
    model = ds.ODE(_oscillator, {"w": 2.0})

    @jax.jit
    def read(y0):
        sol = ds.simulate(model, y0, jnp.array([0.0, 1.0]), solver=ds.Tsit5(), dense=True)
        return sol.evaluate(0.5)

    # the default tolerances (rtol 1e-6): the error is of that order
    np.testing.assert_allclose(read(Y0), _exact(jnp.asarray(0.5)), atol=1e-5)
    with pytest.raises(Exception, match="max_steps|invalid"):
        # NaN start: a caller who reads only the dense output still gets the error
        jax.block_until_ready(read(jnp.array([jnp.nan, 0.0])))


def test_a_batch_of_solutions_from_vmap_evaluates_every_member():
    """A solution returned from `jax.vmap` carries batch axes on its pieces: reading it
    outside failed inside searchsorted ("a should be 1-dimensional"); now every member
    answers at the same times, batch shape first."""

    def solve(w):
        model = ds.ODE(_oscillator, {"w": w})
        options = dict(solver=ds.Tsit5(rtol=1e-10, atol=1e-12), dense=True)
        return ds.simulate(model, Y0, jnp.array([0.0, 2.0]), **options)

    frequencies = jnp.array([1.0, 2.0, 3.0])
    batch = jax.vmap(solve)(frequencies)
    queries = jnp.array([[0.3, 1.1], [1.7, 0.05]])
    values, slopes = batch.evaluate(queries), batch.derivative(queries)
    assert values.shape == slopes.shape == (3, 2, 2, 2)
    for i, w in enumerate(frequencies):  # as in the oscillator cases above: rtol 1e-10
        np.testing.assert_allclose(values[i], _exact(queries, w), atol=1e-9)
        np.testing.assert_allclose(slopes[i], _exact_slope(queries, w), atol=1e-7)


def test_an_empty_span_evaluates_to_y0():
    sol = ds.simulate(
        ds.ODE(_oscillator, {"w": 2.0}), Y0, jnp.array([1.0, 1.0]), solver=ds.Tsit5(), dense=True
    )
    np.testing.assert_array_equal(sol.evaluate(1.0), Y0)
    assert np.all(np.isnan(sol.evaluate(1.5)))


def test_dense_refusals_say_what_to_do():
    model = ds.ODE(_oscillator, {"w": 2.0})
    ts = jnp.array([0.0, 1.0])
    sol = ds.simulate(model, Y0, ts, solver=ds.Tsit5())
    with pytest.raises(ValueError, match="dense=True"):
        sol.evaluate(0.5)
    with pytest.raises(TypeError, match="dense must be True or False"):
        ds.simulate(model, Y0, ts, solver=ds.Tsit5(), dense="yes")
    with pytest.raises(NotImplementedError, match="diffrax's loop"):
        ds.simulate(model, Y0, ts, solver=ds.Kvaerno5(), dense=True)
    # the adjoint, not the solver, moves an explicit pair into diffrax's loop: say so
    with pytest.raises(NotImplementedError, match="Tsit5 and adjoint='checkpoint'.*'auto'"):
        ds.simulate(model, Y0, ts, solver=ds.Tsit5(), dense=True, adjoint="checkpoint")
    # diffrax's own refusal of a backsolve between events names SaveAt(subs=...)
    import diffrax

    with pytest.raises(NotImplementedError, match="events= with adjoint=diffrax.Backsolve"):
        ds.simulate(
            model,
            Y0,
            ts,
            solver=ds.Tsit5(),
            events=ds.Event(lambda t, y: y[0] - 0.5),
            adjoint=diffrax.BacksolveAdjoint(),
        )
    event = ds.Event(lambda t, y: y[0])
    with pytest.raises(NotImplementedError, match="adaptive solver"):
        ds.simulate(model, Y0, ts, solver=ds.RK4(), dt=0.1, events=event, dense=True)
    with pytest.raises(NotImplementedError, match="stochastic"):
        ds.simulate(
            models.OrnsteinUhlenbeck(),
            jnp.array(0.0),
            ts,
            solver=ds.EulerMaruyama(),
            dt=0.1,
            key=jax.random.key(0),
            dense=True,
        )
