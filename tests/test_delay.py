"""Delay differential equations (`ds.DDE`, `ds.AbstractDDE`): the method of steps against
its closed form, an exact periodic solution, derivatives with respect to the gain and the
lag, `vmap` over lags, Mackey–Glass convergence, dense output, events and clear errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import diffsim as ds
import models


def _steps_solution(t, k=1.0, tau=1.0, x0=1.0):
    """x' = −k x(t − τ), x = x0 before 0, by the method of steps in closed form on [0, 3τ]."""
    x = 1.0 - k * t
    x = x + jnp.where(t > tau, k**2 * (t - tau) ** 2 / 2, 0.0)
    x = x - jnp.where(t > 2 * tau, k**3 * (t - 2 * tau) ** 3 / 6, 0.0)
    return x0 * x


TS = jnp.linspace(0.0, 3.0, 13)


@pytest.mark.parametrize(
    "solver, options, atol",
    [
        (ds.Tsit5(rtol=1e-10, atol=1e-12), {}, 1e-12),
        (ds.RK4(), {"dt": 0.05}, 1e-12),
        (ds.RK4(), {"dt": 0.07}, 1e-12),  # a dt that does not divide the outputs' 0.25
        (ds.Rodas5P(rtol=1e-8, atol=1e-10), {}, 1e-12),
        (ds.Rosenbrock23(rtol=1e-8, atol=1e-10), {}, 5e-6),
    ],
    ids=["Tsit5", "RK4", "RK4-dt-0.07", "Rodas5P", "Rosenbrock23"],
)
def test_the_method_of_steps_matches_its_closed_form(solver, options, atol):
    """The solution is a polynomial of degree ≤ 3 between breakpoints t = τ, 2τ, where the
    solve ends a step: Tsit5 and RK4 integrate such a piece exactly (round-off, measured
    4e-16), Rodas5P to 1.5e-13. Rosenbrock23 is of order 2: 7e-7 at rtol 1e-8 (as on the ODE
    x' = −t², 3e-7), 5e-6 leaves a margin. It was off by 0.09 at every tolerance while the
    first step after a breakpoint read the history through a clip, whose derivative in t is
    halved at the tie s = t0 (∂f/∂t enters the Rosenbrock stages)."""
    sol = ds.simulate(
        models.DelayedNegativeFeedback(), jnp.array([1.0]), TS, solver=solver, **options
    )
    np.testing.assert_allclose(sol.ys[:, 0], _steps_solution(TS), atol=atol, rtol=0)


def test_a_history_on_the_hopf_point_continues_as_the_exact_cosine():
    """x'(t) = −x(t − π/2) with the history cos t: the solution is cos t for all t (−sin t =
    −cos(t − π/2)); neutral stability, so the error grows only by accumulation."""
    model = ds.DDE(lambda t, y, yd, p: -yd[0], None, delays=(jnp.pi / 2,), history=jnp.cos)
    ts = jnp.linspace(0.0, 20.0, 41)
    sol = ds.simulate(model, jnp.array(1.0), ts, solver=ds.Tsit5(rtol=1e-10, atol=1e-12))
    # ~60 steps per lag at rtol 1e-10 over 13 lags: ~1e-9 accumulated
    np.testing.assert_allclose(sol.ys, jnp.cos(ts), atol=1e-8, rtol=0)


@pytest.mark.parametrize(
    "solver, options", [(ds.Tsit5(rtol=1e-10, atol=1e-12), {}), (ds.RK4(), {"dt": 0.05})]
)
def test_derivatives_with_respect_to_the_gain_the_lag_the_start_and_the_history(solver, options):
    """At t = 1.5 (τ = 1), with y0 = a and the history h: x = a − k h τ − k a (t − τ) +
    k² h (t − τ)²/2 (the method of steps), so the gradient in (k, τ, a, h) at 1 is
    (−1.25, −0.5, 0.5, −0.875) and the Hessian follows. The breakpoint t = τ moves with τ (it
    ends a step), so the lag's derivative is exact, not O(dt). The step that ends at t = τ
    must read the history at its last stage (s = t0, the left limit): reading y0 there gave
    derivatives in a and h of (1.12, −0.68, …) for Tsit5 although y0 = h(t0), and, where y0 ≠
    h(t0), an RK4 value off by dt·jump/6."""

    def x_at(params):
        gain, lag, start, history = params
        model = models.DelayedNegativeFeedback(gain=gain, tau=lag, x0=history)
        ts = jnp.array([0.0, 0.75, 1.5])
        return ds.simulate(model, start[None], ts, solver=solver, **options).ys[-1, 0]

    point = jnp.array([1.0, 1.0, 1.0, 1.0])
    np.testing.assert_allclose(jax.grad(x_at)(point), [-1.25, -0.5, 0.5, -0.875], atol=1e-10)
    jump = jnp.array([1.0, 1.0, 1.0, 1.3])  # y0 = 1 below a history of 1.3
    np.testing.assert_allclose(x_at(jump), 1.0 - 1.3 - 0.5 + 0.125 * 1.3, atol=1e-12)
    if isinstance(solver, ds.Tsit5):
        return  # the same loop and breakpoint rule as RK4's below (each mode compiles anew)
    # forward over reverse, so forward mode too; the lag–lag entry is 0 unless the
    # breakpoint t = τ ends a step and moves with τ
    hessian = [
        [0.25, -1.0, -0.5, -0.75],
        [-1.0, 1.0, 1.0, -1.5],
        [-0.5, 1.0, 0.0, 0.0],
        [-0.75, -1.5, 0.0, 0.0],
    ]
    np.testing.assert_allclose(jax.hessian(x_at)(point), hessian, atol=1e-8)


@pytest.mark.parametrize(
    "solver, options, modes",
    [
        (ds.Tsit5(rtol=1e-10, atol=1e-12), {}, ("forward", "reverse")),
        (ds.RK4(), {"dt": 0.125}, ("forward",)),
    ],
    ids=["Tsit5", "RK4"],
)
def test_the_lags_derivative_at_outputs_on_its_breakpoints(solver, options, modes):
    """Outputs every 0.25 with τ = 1: the breakpoints τ and 2τ are output times, and after
    them RK4's grid restarts, its steps ending on later outputs. There the step's end moves
    with τ, and the output took y at the end with its derivative along it: d x(t)/dτ off by
    k·x'(t) (−1 at t = 1 where it is 0, for Tsit5, RK4 and Rodas5P alike) until the output
    took the interpolant's derivative at its fixed time. Both pieces are polynomials the
    solvers integrate exactly, so the derivative is exact to round-off."""

    def xs(lag):
        model = models.DelayedNegativeFeedback(tau=lag)
        return ds.simulate(model, jnp.array([1.0]), TS, solver=solver, **options).ys[:, 0]

    exact = jax.vmap(jax.grad(_steps_solution, argnums=2), (0, None, None))(TS, 1.0, 1.0)
    assert float(exact[4]) == 0.0 and float(exact[8]) == -1.0  # at τ and at 2τ
    rules = {"forward": jax.jacfwd, "reverse": jax.jacrev}
    for mode in modes:
        np.testing.assert_allclose(rules[mode](xs)(1.0), exact, atol=1e-9, err_msg=mode)


def test_a_history_and_a_field_written_inside_the_differentiated_function():
    """A `ds.DDE` whose history or field closes over the traced values of `jax.grad` (or
    whose history is an equinox Module holding arrays) failed with "No constant handler";
    both are now lifted into leaves. By the method of steps with y0 = a and the history h,
    x(2.5) = −0.375 a − h/48 at k = 1 (so d/dh with a = h is −0.375 − 1/48), and with
    a = h = 1, x(2.5) = 1 − 2k + k²/2 − k(1 − k)/2 + k²/8 − k³/48 (d/dk = −0.3125)."""

    def x_end(history, gain):
        model = ds.DDE(
            lambda t, y, yd, p: -gain * yd[0],
            None,
            delays=jnp.array([1.0]),  # an array of lags is a sequence of them
            history=lambda t: history * jnp.ones(1),
        )
        sol = ds.simulate(
            model, history * jnp.ones(1), jnp.array([0.0, 2.5]), solver=ds.RK4(), dt=0.05
        )
        return sol.ys[-1, 0]

    # RK4 at dt = 0.05 integrates the cubic pieces exactly (breakpoints are step ends)
    np.testing.assert_allclose(jax.grad(x_end)(1.0, 1.0), -0.375 - 1 / 48, atol=1e-10)
    np.testing.assert_allclose(jax.grad(x_end, 1)(1.0, 1.0), -0.3125, atol=1e-10)


def test_vmap_over_lags_under_jit():
    """Each member has its own lag, so its own breakpoints and steps."""
    lags = jnp.array([0.8, 1.0, 1.3])

    @jax.jit
    def end_state(lag):
        model = models.DelayedNegativeFeedback(tau=lag)
        return ds.simulate(model, jnp.array([1.0]), TS, solver=ds.Tsit5(rtol=1e-10)).ys[:, 0]

    batch = jax.vmap(end_state)(lags)
    for lag, row in zip(lags, batch):
        inside = TS <= 3 * lag  # where the closed form holds
        np.testing.assert_allclose(row[inside], _steps_solution(TS, tau=lag)[inside], atol=1e-11)


def test_mackey_glass_converges_at_rk4s_order():
    """Mackey–Glass on the chaotic attractor (τ = 17) up to t = 50: RK4's error against a
    tight Tsit5 reference falls 16-fold when dt halves (order 4: the breakpoints t0 + kτ are
    step ends, so the history's kinks cost no order); the density stays positive."""
    model = models.MackeyGlass()
    ts = jnp.linspace(0.0, 50.0, 11)
    y0 = jnp.array([0.5])
    reference = ds.simulate(model, y0, ts, solver=ds.Tsit5(rtol=1e-12, atol=1e-14)).ys
    errors = []
    for dt in (1.0, 0.5):
        ys = ds.simulate(model, y0, ts, solver=ds.RK4(), dt=dt).ys
        errors.append(float(jnp.max(jnp.abs(ys - reference))))
    assert 10 < errors[0] / errors[1] < 22, errors
    assert errors[1] < 1e-5, errors
    assert bool(jnp.all(reference > 0))


def test_dense_output_and_events_of_a_delay_equation():
    """k = 1, τ = 2: x = 1 − t on [0, 2] crosses zero at t = 1, a terminal event; the dense
    output reads the closed form between output times."""
    model = models.DelayedNegativeFeedback(tau=2.0)
    stop = ds.Event(lambda t, y: y[0], terminal=True)
    sol = ds.simulate(
        model,
        jnp.array([1.0]),
        jnp.array([0.0, 0.5, 3.0]),
        solver=ds.Tsit5(rtol=1e-10, atol=1e-12),
        events=stop,
        dense=True,
    )
    np.testing.assert_allclose(sol.event_time, 1.0, atol=1e-12)
    queries = jnp.array([0.1, 0.45, 0.9])
    np.testing.assert_allclose(sol.evaluate(queries)[:, 0], 1.0 - queries, atol=1e-12)
    free = ds.simulate(
        models.DelayedNegativeFeedback(), jnp.array([1.0]), TS, solver=ds.RK4(), dt=0.05, dense=True
    )
    queries = jnp.array([0.33, 1.57, 2.71])
    np.testing.assert_allclose(free.evaluate(queries)[:, 0], _steps_solution(queries), atol=1e-6)


def _after_a_reset(a, tau, te, t):
    """x' = −a x(t − τ), x = 1 before 0, x(te) → x(te) + 1 (te < τ), by the method of steps
    at τ + te ≤ t ≤ 2τ: the jump at te is a kink at te + τ."""
    ye = 1 - a * te + 1.0  # after the reset
    at_tau = ye - a * (tau - te)
    at_kink = at_tau - a * (te - a * te**2 / 2)  # on [τ, τ + te] x(t − τ) = 1 − a(t − τ)
    s = t - tau - te  # on [τ + te, 2τ] x(t − τ) = ye − a(t − τ − te)
    return at_kink - a * (ye * s - a * s**2 / 2)


@pytest.mark.parametrize(
    "solver, options",
    [
        (ds.RK4(), {"dt": 0.1}),
        (ds.RK4(), {"dt": 0.05}),
        (ds.Tsit5(rtol=1e-6, atol=1e-9), {}),
        (ds.Rodas5P(rtol=1e-6, atol=1e-9), {}),
    ],
    ids=["RK4-0.1", "RK4-0.05", "Tsit5", "Rodas5P"],
)
def test_a_reset_travels_along_the_lag_as_a_breakpoint(solver, options):
    """A reset's jump at te makes a kink at te + τ, where a step must end and whose steps read
    the left and the right limit of the jump: then the solution, a polynomial of degree ≤ 2
    between kinks, is integrated exactly (RK4 was first order, 5.8e-3 off at dt = 0.05, one
    stage reading across the jump; Tsit5 at rtol 1e-6 5e-5). te = 0.57 lies off RK4's grid;
    the derivative in a against the closed form's. Then repeated resets (a state condition):
    a fixed-step solve has room for their steps (it ended at max_steps) and converges to the
    adaptive one (measured 4e-9 at dt = 0.05)."""
    tau, te, ts = 0.8, 0.57, jnp.array([0.0, 1.6])
    event = ds.Event(lambda t, y: t - te, direction=1, reset=lambda t, y: y + 1.0)

    def end(a):
        model = ds.DDE(lambda t, y, yd, p: -p["a"] * yd[0], {"a": a}, delays=(tau,), history=1.0)
        return ds.simulate(model, jnp.array(1.0), ts, solver=solver, events=event, **options).ys[-1]

    a = jnp.asarray(0.7)
    np.testing.assert_allclose(end(a), _after_a_reset(a, tau, te, 1.6), rtol=0, atol=1e-9)
    derivative = jax.grad(lambda a: _after_a_reset(a, tau, te, 1.6))(a)
    np.testing.assert_allclose(jax.grad(end)(a), derivative, rtol=0, atol=1e-9)
    if not isinstance(solver, ds.RK4):
        return
    model = ds.DDE(lambda t, y, yd, p: -0.7 * yd[0], {}, delays=(tau,), history=1.0)
    again = ds.Event(lambda t, y: y - 0.5, direction=-1, reset=lambda t, y: y + 0.5, max_events=8)
    outputs = jnp.linspace(0.0, 6.0, 7)
    fixed = ds.simulate(model, jnp.array(1.0), outputs, solver=solver, events=again, **options)
    adaptive = ds.simulate(
        model, jnp.array(1.0), outputs, solver=ds.Tsit5(rtol=1e-10, atol=1e-12), events=again
    )
    assert int(fixed.event_count) == int(adaptive.event_count) == 6
    # measured 1.7e-7 at dt = 0.1 and 3.9e-9 at 0.05 (4th order); first order, as before the
    # breakpoints, left 4.6e-3 at 0.1: the bounds sit ~50x above the measured errors
    np.testing.assert_allclose(
        fixed.ys, adaptive.ys, rtol=0, atol=1e-5 if options["dt"] > 0.05 else 1e-7
    )


def _two_lags(t, gains, lags, start, level):
    """y' = Σ aᵢ y(t − τᵢ), y = `level` before 0 and `start` at 0, in closed form (Laplace):
    y(t) = level + (start − level)·Σ_n c_n (t − D_n)^k / k! + level·A·Σ_n c_n (t − D_n)^(k+1)
    / (k+1)!, over n ∈ ℕ², k = |n|, D_n = n·τ ≤ t, c_n the multinomial coefficient times
    Πaᵢ^nᵢ, A = Σ aᵢ."""
    import itertools
    from math import factorial

    total = level
    terms = int(t / min(lags)) + 2
    for n in itertools.product(range(terms + 1), repeat=2):
        k, delay = sum(n), n[0] * lags[0] + n[1] * lags[1]
        if delay > t:
            continue
        coefficient = factorial(k) * np.prod([a**m / factorial(m) for a, m in zip(gains, n)])
        total += (start - level) * coefficient * (t - delay) ** k / factorial(k)
        total += level * sum(gains) * coefficient * (t - delay) ** (k + 1) / factorial(k + 1)
    return total


def test_two_lags_cut_their_combined_breakpoints_and_differentiate_there():
    """y' = −1.1 y(t − 0.7) + 0.6 y(t − 1.9) from a jump (y(0) = 1.5, history 0.8). The kinks
    at t0 + τ1 + τ2, 2τ1 + τ2, ... were not cut: Tsit5 ended up to 80× its tolerance at the
    step ends, and RK4's dy/dτ had an O(dt) error (3e-3 at dt = 0.01); at t = 3.3 = 2τ1 + τ2,
    an output on a breakpoint, the breakpoint's motion split into the output's derivative
    (0.22 off). Now within the tolerance, and the derivative to RK4's error."""
    gains, lags, start, level = (-1.1, 0.6), (0.7, 1.9), 1.5, 0.8
    ts = np.linspace(0.0, 8.0, 33)
    exact = np.array([_two_lags(t, gains, lags, start, level) for t in ts])

    def model(taus):
        return ds.DDE(
            lambda t, y, yd, p: p[0] * yd[0] + p[1] * yd[1],
            jnp.array(gains),
            delays=(taus[0], taus[1]),
            history=jnp.array(level),
        )

    tol = 1e-8
    solver = ds.Tsit5(rtol=tol, atol=tol, step_to_outputs=True)
    sol = ds.simulate(model(lags), jnp.array(start), jnp.asarray(ts), solver=solver)
    # a global error of a few tolerances, the criterion of the one-lag tests (0.3× measured)
    np.testing.assert_allclose(sol.ys, exact, atol=5 * tol, rtol=0)

    def at_3_3(taus):
        return ds.simulate(
            model(taus), jnp.array(start), jnp.array([0.0, 3.3]), solver=ds.RK4(), dt=0.01
        ).ys[-1]

    def closed(taus):
        return _two_lags(3.3, gains, taus, start, level)

    step = 1e-6  # central differences of the closed form: error ~ step² · y''' ~ 1e-12
    expected = [
        (closed((0.7 + step, 1.9)) - closed((0.7 - step, 1.9))) / (2 * step),
        (closed((0.7, 1.9 + step)) - closed((0.7, 1.9 - step))) / (2 * step),
    ]
    # RK4 at dt = 0.01: 8e-11 measured (an O(dt⁴) error), before 3e-3 and 0.22
    np.testing.assert_allclose(jax.grad(at_3_3)(jnp.array(lags)), expected, atol=1e-8)


def test_bad_delay_input_is_refused_with_what_to_do():
    fn = lambda t, y, yd, p: -yd[0]  # noqa: E731
    with pytest.raises(ValueError, match="positive"):
        ds.DDE(fn, None, delays=(-1.0,), history=jnp.array(1.0))
    with pytest.raises(ValueError, match="empty"):
        ds.DDE(fn, None, delays=(), history=jnp.array(1.0))
    model = ds.DDE(fn, None, delays=(0.5,), history=jnp.array(1.0))
    with pytest.raises(ValueError, match="smallest lag"):
        ds.simulate(model, jnp.array(1.0), jnp.linspace(0.0, 3.0, 4), solver=ds.RK4(), dt=1.0)
    with pytest.raises(NotImplementedError, match="delay equation"):
        ds.simulate(model, jnp.array(1.0), TS, solver=ds.Kvaerno5())
    # Dopri8's dense output (the delayed states' source) is below its order: its error on
    # y' = −y(t − 1) stalled at 5e-8 from rtol 1e-6 to 1e-12
    with pytest.raises(NotImplementedError, match="dense output.*lower order.*ds.Tsit5"):
        ds.simulate(model, jnp.array(1.0), TS, solver=ds.Dopri8())
    with pytest.raises(ValueError, match="ts must increase"):
        ds.simulate(model, jnp.array(1.0), TS[::-1], solver=ds.Tsit5())
    wrong = ds.DDE(fn, None, delays=(0.5,), history=jnp.ones(3))
    with pytest.raises(ValueError, match="history must return a state like y0"):
        ds.simulate(wrong, jnp.array(1.0), TS, solver=ds.Tsit5())
    # a history with a hole: every step was rejected until max_steps, with the advice to use
    # a stiff solver; now refused before the solve, naming where
    holes = ds.DDE(fn, None, delays=(1.0,), history=lambda t: jnp.where(t < -0.5, jnp.nan, 1.0))
    with pytest.raises(ValueError, match=r"history returns NaN or inf at t = -1:"):
        ds.simulate(holes, jnp.array(1.0), TS, solver=ds.Tsit5())
    # a tiny lag bounds the steps: the failure names it and the steps the span needs
    tiny = ds.DDE(fn, None, delays=(1e-6,), history=jnp.array(1.0))
    with pytest.raises(
        ds.SimulationError, match=r"smallest lag \(1e-06\).*at least 3,000,000 steps"
    ) as error:
        ds.simulate(tiny, jnp.array(1.0), TS, solver=ds.Tsit5(), max_steps=100)
    assert "Kvaerno5" not in str(error.value)
    # a traced lag shorter than dt: refused when concrete, silently read past the solution
    # computed so far (5 % off) when traced; now an invalid member that names the lag
    run = jax.jit(
        lambda lag: ds.simulate(
            ds.DDE(fn, None, delays=(lag,), history=jnp.array(1.0)),
            jnp.array(1.0),
            np.array([0.0, 1.0, 2.0]),
            solver=ds.RK4(),
            dt=0.5,
            throw=False,
        )
    )
    short = run(0.3)
    assert int(short.result) == ds.RESULTS.invalid_input and bool(jnp.isnan(short.ys[-1]))
    assert "shorter than a fixed step dt" in ds.RESULTS.invalid_input.message


def test_a_ds_dde_names_its_parameters_as_ds_ode_does():
    """ds.DDE's dict entries by bare name, as ds.ODE's: `ds.sweep(dde, {"a": ...})` was
    refused and `ds.fit(..., params=["a"])` said "its parameters are: constant_history".
    y' = a·y(t − 0.8), history 1, y(0) = 1: y(0.8) = 1 + 0.8a, exact for RK4."""
    model = ds.DDE(lambda t, y, yd, p: p["a"] * yd[0], {"a": -1.0}, delays=(0.8,), history=1.0)
    gains = np.array([-1.0, -0.5, 0.5])
    result = ds.sweep(
        model,
        {"a": gains},
        jnp.array(1.0),
        jnp.array([0.0, 0.8]),
        solver=ds.RK4(),
        dt=0.1,
        reduce="final_state",
        progress=False,
    )
    np.testing.assert_allclose(result["final_state"].values, 1 + 0.8 * gains, rtol=1e-12)
    ts = np.linspace(0.0, 0.8, 5)
    fit = ds.fit(model, jnp.array(1.0), (ts, 1 - 0.5 * ts), params=["a"], solver=ds.RK4(), dt=0.1)
    assert fit.params["a"] == pytest.approx(-0.5, abs=1e-9)  # exact data, exact solver
    # a delay equation's Lyapunov exponent: refused for what it is (it said "checkpoint does
    # not apply to delay equations", of an option never passed)
    with pytest.raises(TypeError, match="is a delay equation: lyapunov_exponent"):
        ds.lyapunov_exponent(model, jnp.array(1.0), solver=ds.RK4(), dt=0.1, steps=10)
