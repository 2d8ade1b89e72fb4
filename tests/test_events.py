"""Events: crossings located inside steps, terminal stops, resets, records, derivatives through
them, batches whose members stop at different times, and the errors for bad events."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import diffsim as ds
import models

G = 9.81
DROP = 2.0


BALL = models.BouncingBall(gravity=G, restitution=0.8)


def _height(t, y):
    return y[0]


def _bounce_times(h, e, n):
    """Closed form: first impact at sqrt(2h/g), then flights of 2 e^k v1 / g."""
    v1 = math.sqrt(2 * G * h)
    times, v = [math.sqrt(2 * h / G)], v1
    for _ in range(n - 1):
        v *= e
        times.append(times[-1] + 2 * v / G)
    return np.array(times), v1 * e ** np.arange(n)


def _bouncing(e, max_events=8):
    # the restitution is traced inside the reset, so every test that bounces shares one
    # compiled solve per solver
    return models.BouncingBall(gravity=G, restitution=e).impacts(max_events)


LANDING = ds.Event(_height, direction=-1)
TS = jnp.linspace(0.0, 4.0, 81)


SOLVERS = {
    "RK4": dict(solver=ds.RK4(), dt=0.01),
    "Tsit5": dict(solver=ds.Tsit5(rtol=1e-10, atol=1e-12)),
    # events in diffsim's own adaptive loop, located on the method's dense output
    "Rodas5P": dict(solver=ds.Rodas5P(rtol=1e-10, atol=1e-12)),
}


def _bouncing_trajectory(ts, times, speeds, e):
    """Closed-form height: free fall from DROP, then parabolas leaving the floor at e * speed."""
    ts = np.asarray(ts)
    height = DROP - 0.5 * G * ts**2
    for t_k, u_k in zip(times, e * speeds):
        s = ts - t_k
        height = np.where(s >= 0, u_k * s - 0.5 * G * s**2, height)
    return height


@pytest.mark.parametrize("name", SOLVERS)
def test_bouncing_ball_matches_closed_form(name):
    # Free fall is quadratic in t: RK4, Tsit5 and both interpolants are exact on it, so bounce
    # times, impact speeds and heights must agree with the closed form to round-off (the root
    # finders converge to it; 1e-11 allows ~100 ulps of accumulation over 5 bounces).
    e = 0.8
    sol = ds.simulate(BALL, jnp.array([DROP, 0.0]), TS, events=_bouncing(e), **SOLVERS[name])
    times, speeds = _bounce_times(DROP, e, 5)  # t = 3.65 is the fifth bounce, the sixth is 4.07
    np.testing.assert_allclose(BALL.bounce_times(DROP, 5), times, rtol=1e-14)
    assert int(sol.event_count) == 5
    np.testing.assert_allclose(sol.event_time[:5], times, rtol=0, atol=1e-11)
    assert np.all(np.isinf(sol.event_time[5:]))
    np.testing.assert_allclose(sol.event_state[:5, 1], -speeds, rtol=1e-11)
    np.testing.assert_allclose(sol.event_state[:5, 0], 0.0, atol=1e-11)
    assert np.all(np.isnan(sol.event_state[5:]))
    # heights at the output times, apexes e^(2k) h included, against the piecewise parabola
    np.testing.assert_allclose(sol.ys[:, 0], _bouncing_trajectory(TS, times, speeds, e), atol=1e-10)
    assert bool(sol.reached.all())
    assert int(sol.result) == 0


def test_crossing_is_located_inside_the_step_to_the_solver_order():
    # x'' = -x from x = 1 crosses zero (falling) at pi/2. RK4 with the Hermite interpolant puts
    # the event within O(dt^4) of it: far inside a step, and 16x closer when dt halves.
    oscillator = ds.ODE(lambda t, y, p: jnp.stack([y[1], -y[0]]), None)
    event = ds.Event(_height, direction=-1)
    errors = []
    for dt in (0.1, 0.05):
        sol = ds.simulate(
            oscillator,
            jnp.array([1.0, 0.0]),
            jnp.array([0.0, 3.0]),
            solver=ds.RK4(),
            dt=dt,
            events=event,
        )
        errors.append(abs(float(sol.event_time) - math.pi / 2))
    assert errors[0] < 1e-5  # dt = 0.1: the step end would be off by up to 0.1
    assert 12 < errors[0] / errors[1] < 20  # fourth order


@pytest.mark.parametrize("name", SOLVERS)
def test_first_impact_time_derivatives(name):
    # t(h) = sqrt(2h/g): t' = 1/sqrt(2 g h). The event time is differentiable through the root
    # (implicit function theorem) in reverse and forward mode.
    def impact(h):
        sol = ds.simulate(BALL, jnp.stack([h, 0.0]), TS, events=LANDING, **SOLVERS[name])
        return sol.event_time

    assert float(impact(DROP)) == pytest.approx(math.sqrt(2 * DROP / G), abs=1e-12)
    exact = 1 / math.sqrt(2 * G * DROP)
    assert float(jax.grad(impact)(DROP)) == pytest.approx(exact, rel=1e-9)
    if name == "RK4":  # two differentiable Newton steps: the second derivative is exact too
        # (jax.hessian is forward over reverse, so forward mode is covered as well)
        second = -0.25 * math.sqrt(2 / G) * DROP**-1.5
        assert float(jax.hessian(impact)(DROP)) == pytest.approx(second, rel=1e-9)


def test_first_impact_time_forward_mode_adaptive():
    # forward mode of the adaptive event solve (the forward-mode Jacobian of diffsim's loop),
    # what ds.fit's Jacobians use; RK4's forward mode is covered by the Hessian above
    def impact(h):
        sol = ds.simulate(BALL, jnp.stack([h, 0.0]), TS, events=LANDING, **SOLVERS["Tsit5"])
        return sol.event_time

    exact = 1 / math.sqrt(2 * G * DROP)
    assert float(jax.jacfwd(impact)(DROP)) == pytest.approx(exact, rel=1e-9)


def test_gradient_flows_through_an_impact():
    # The second bounce happens at t1 + 2 e v1 / g, so d t2 / d e = 2 v1 / g; and the height at
    # a later time depends on e through the reset (checked against central differences).
    def second_bounce(e):
        sol = ds.simulate(BALL, jnp.array([DROP, 0.0]), TS, events=_bouncing(e), **SOLVERS["RK4"])
        return sol.event_time[1], sol.ys[38, 0]  # t = 1.9

    v1 = math.sqrt(2 * G * DROP)
    assert float(jax.grad(lambda e: second_bounce(e)[0])(0.8)) == pytest.approx(2 * v1 / G, 1e-9)
    grad = float(jax.grad(lambda e: second_bounce(e)[1])(0.8))
    step = 1e-6
    central = (second_bounce(0.8 + step)[1] - second_bounce(0.8 - step)[1]) / (2 * step)
    assert grad == pytest.approx(float(central), rel=1e-6)


@pytest.mark.parametrize("name", SOLVERS)
def test_terminal_events_under_vmap_stop_members_at_their_own_times(name):
    ts = TS
    heights = jnp.array([0.5, 2.0, 20.0, 100.0])  # the last one does not land before t = 4

    def run(h):
        return ds.simulate(
            BALL, jnp.stack([h, 0.0]), TS, events=LANDING, throw=False, **SOLVERS[name]
        )

    batch = jax.jit(jax.vmap(run))(heights)
    landing = np.sqrt(2 * np.asarray(heights) / G)
    expected = np.where(landing <= 4.0, landing, np.inf)
    np.testing.assert_allclose(batch.event_time, expected, rtol=1e-10)
    np.testing.assert_array_equal(batch.reached, np.asarray(ts)[None, :] <= landing[:, None])
    assert bool(jnp.all(jnp.isnan(batch.ys[~batch.reached])))
    assert bool(jnp.all(jnp.isfinite(batch.ys[batch.reached])))
    np.testing.assert_array_equal(batch.result, 0)
    np.testing.assert_array_equal(batch.event_count, [1, 1, 1, 0])
    alone = run(heights[1])
    np.testing.assert_allclose(batch.ys[1][alone.reached], alone.ys[alone.reached], rtol=1e-13)


@pytest.mark.parametrize("name", SOLVERS)
def test_earliest_event_wins_and_ties_go_in_order(name):
    # both levels are crossed within one step (0.4 s of fall, steps of 0.01 for RK4 and far
    # longer for the adaptive solvers in free fall): the earliest fires, whatever the order
    ts = jnp.array([0.0, 1.0])
    high = ds.Event(lambda t, y: y[0] - 1.9, direction=-1)
    low = ds.Event(lambda t, y: y[0] - 1.8, direction=-1)
    t_high = math.sqrt(2 * 0.1 / G)
    for events, first in (((low, high), 1), ((high, low), 0)):
        sol = ds.simulate(BALL, jnp.array([DROP, 0.0]), ts, events=events, **SOLVERS[name])
        counts = [int(c) for c in sol.event_count]
        assert counts[first] == 1 and counts[1 - first] == 0
        assert float(sol.event_time[first]) == pytest.approx(t_high, abs=1e-12)
    same = (ds.Event(_height, direction=-1), ds.Event(lambda t, y: 2 * y[0], direction=-1))
    sol = ds.simulate(BALL, jnp.array([DROP, 0.0]), ts, events=same, **SOLVERS[name])
    assert [int(c) for c in sol.event_count] == [1, 0]


@pytest.mark.parametrize("name", [*SOLVERS, "Kvaerno5"])
def test_a_terminal_event_at_its_nth_occurrence(name):
    # x'' = -x from x = 1 crosses zero at (2k + 1) pi / 2; terminal=True, max_events=3 stops
    # at the third (scipy's terminal=3), the first two recorded
    options = SOLVERS.get(name) or dict(solver=ds.Kvaerno5(rtol=1e-10, atol=1e-12))
    oscillator = ds.ODE(lambda t, y, p: jnp.stack([y[1], -y[0]]), None)
    event = ds.Event(_height, terminal=True, max_events=3)
    sol = ds.simulate(
        oscillator, jnp.array([1.0, 0.0]), jnp.linspace(0, 20, 5), events=event, **options
    )
    np.testing.assert_allclose(sol.event_time, np.pi / 2 * np.array([1, 3, 5]), atol=1e-6)
    assert int(sol.event_count) == 3
    assert sol.reached.tolist() == [True, True, False, False, False]


@pytest.mark.parametrize("name", SOLVERS)
def test_a_boolean_condition_fires_where_it_flips(name):
    # y[0] < 1 flips when the ball has fallen 1 m: at sqrt(2 / g), bracketed on the dense
    # output (the solves diffrax runs cannot locate a jump: see test_bad_input)
    event = ds.Event(lambda t, y: y[0] < 1.0, direction=1)
    ts = jnp.array([0.0, 1.0])
    sol = ds.simulate(BALL, jnp.array([DROP, 0.0]), ts, events=event, **SOLVERS[name])
    assert float(sol.event_time) == pytest.approx(math.sqrt(2 / G), abs=1e-9)


# the adaptive variant runs the segment loop the bouncing-ball test runs (~13 s): slow extra
def test_a_splitting_carries_its_force_through_events_under_vmap():
    # Leapfrog carries the force of its closing kick into the next step; at an event the state
    # changes (a reflecting wall at x = -0.9 for x'' = -x reverses v), so the force is taken
    # afresh there. Member 0 (amplitude 1) reflects at t1 = arccos(-0.9), 3 t1, ...; member 1
    # (amplitude 0.5) never reaches the wall and must equal the plain solve, in which the
    # force is carried the same way.
    oscillator = models.HarmonicOscillator(omega=1.0)
    wall = ds.Event(
        lambda t, y: y[0] + 0.9,
        direction=-1,
        reset=lambda t, y: y.at[1].multiply(-1.0),
        max_events=3,
    )
    ts = jnp.linspace(0.0, 10.0, 11)
    y0s = jnp.array([[1.0, 0.0], [0.5, 0.0]])
    options = dict(solver=ds.Leapfrog(), dt=0.01)
    sol = jax.vmap(lambda y0: ds.simulate(oscillator, y0, ts, events=wall, **options))(y0s)
    t1 = math.acos(-0.9)
    # Leapfrog's phase error at dt = 0.01 is ~dt²/24 a unit time: ~1e-5 at t = 8
    np.testing.assert_allclose(sol.event_time[0, :2], [t1, 3 * t1], atol=1e-4)
    assert [int(c) for c in sol.event_count] == [2, 0]
    plain = ds.simulate(oscillator, y0s[1], ts, **options)
    np.testing.assert_allclose(sol.ys[1], plain.ys, rtol=1e-12, atol=1e-12)
    # the wall is elastic and Leapfrog keeps the energy to O(dt²)
    energy = 0.5 * (sol.ys[0, :, 0] ** 2 + sol.ys[0, :, 1] ** 2)
    np.testing.assert_allclose(energy, 0.5, atol=1e-4)
    # one force a step, one more each time the loop starts (t0 and after each event), and 3
    # per located event (the interpolant's two ends and the restart value)
    steps, events = np.asarray(sol.stats["num_steps"]), np.asarray(sol.stats["num_events"])
    np.testing.assert_array_equal(sol.stats["num_function_evals"], steps + 1 + 4 * events)


@pytest.mark.parametrize("name", ["RK4", pytest.param("Tsit5", marks=pytest.mark.slow)])
def test_recording_event_leaves_the_solution_unchanged(name):
    # A Poincaré-like section: upward zero crossings of x for x'' = -x from (1, 0) happen at
    # 3 pi / 2 + 2 pi k. Recording them changes nothing in ys.
    oscillator = ds.ODE(lambda t, y, p: jnp.stack([y[1], -y[0]]), None)
    ts = jnp.linspace(0.0, 20.0, 41)
    options = SOLVERS[name] if name == "Tsit5" else dict(solver=ds.RK4(), dt=0.005)
    plain = ds.simulate(oscillator, jnp.array([1.0, 0.0]), ts, **options)
    section = ds.Event(_height, direction=1, terminal=False, max_events=2)
    sol = ds.simulate(oscillator, jnp.array([1.0, 0.0]), ts, events=section, **options)
    expected = 1.5 * math.pi + 2 * math.pi * np.arange(2)
    np.testing.assert_allclose(sol.event_time, expected, atol=1e-8)
    assert int(sol.event_count) == 2  # the third crossing (at 17.3) is past the slots
    np.testing.assert_allclose(sol.ys, plain.ys, atol=1e-8)


@pytest.mark.parametrize("name", SOLVERS)
def test_more_resets_than_max_events_is_an_error(name):
    # With e = 0.5 the ball comes to rest at t = 3 t1 = 1.92 after infinitely many bounces; a
    # run to t = 4 needs more than any max_events.
    with pytest.raises(ds.SimulationError, match="max_events"):
        ds.simulate(BALL, jnp.array([DROP, 0.0]), TS, events=_bouncing(0.5), **SOLVERS[name])
    sol = ds.simulate(
        BALL, jnp.array([DROP, 0.0]), TS, events=_bouncing(0.5), throw=False, **SOLVERS[name]
    )
    assert int(sol.result) == ds.RESULTS.event_limit_reached
    assert int(sol.event_count) == 8
    assert bool(jnp.all(jnp.isfinite(sol.event_time)))


@pytest.mark.parametrize("name", SOLVERS)
def test_a_ball_run_past_its_rest_time_bounces_on_the_closed_form_to_the_limit(name):
    # e = 0.8 from 2 m: the bounces pile up at 5.747 s. An adaptive step after a late bounce
    # spans the rest of the run (its polynomial is exact on a parabola), and the root finder
    # took the zero the step starts on (t + θh rounds to t): the 22nd bounce fired at the 21st's
    # time, moving up, the ball fell through the floor to -91 m at t = 10, reported successful.
    n = 60
    ts = jnp.array([0.0, 10.0])
    sol = ds.simulate(
        BALL, jnp.array([DROP, 0.0]), ts, events=_bouncing(0.8, n), throw=False, **SOLVERS[name]
    )
    times, speeds = _bounce_times(DROP, 0.8, n)
    assert int(sol.result) == ds.RESULTS.event_limit_reached
    assert int(sol.event_count) == n
    # every bounce is located to ~100 ulps of 6 s (1.3e-13 s) and their errors add up over 60
    # flights (8e-12; Rodas5P 1.1e-11 measured): 5e-11 is four times that
    np.testing.assert_allclose(sol.event_time, times, rtol=0, atol=5e-11)
    # impact speeds fall to 1.2e-5 m/s by the 60th: g times the time errors above (5e-10 m/s)
    # against speeds of that size
    np.testing.assert_allclose(sol.event_state[:, 1], -speeds, rtol=1e-8, atol=1e-12)
    assert float(jnp.min(sol.event_state[:, 0])) > -1e-12


@pytest.mark.parametrize("name", SOLVERS)
def test_event_inside_jit_and_with_a_closed_over_parameter(name):
    # the level is a traced value closed over by the condition; d t / d level = -1 / (g t).
    # The adaptive solves pass the condition into custom derivative rules, where a closed-over
    # tracer leaked ("No constant handler") until simulate lifted it into a leaf.
    ts = jnp.array([0.0, 1.0])
    options = SOLVERS.get(name) or dict(solver=ds.Kvaerno5(rtol=1e-10, atol=1e-12))

    @jax.jit
    def impact(level):
        event = ds.Event(lambda t, y: y[0] - level, direction=-1)
        sol = ds.simulate(BALL, jnp.array([DROP, 0.0]), ts, events=event, **options)
        return sol.event_time

    level = 0.5
    t = math.sqrt(2 * (DROP - level) / G)
    assert float(impact(level)) == pytest.approx(t, abs=1e-12)
    assert float(jax.grad(impact)(level)) == pytest.approx(-1 / (G * t), rel=1e-9)


def test_bad_events_are_refused_with_a_reason():
    y0, ts = jnp.array([DROP, 0.0]), jnp.array([0.0, 1.0])
    with pytest.raises(ValueError, match="direction"):
        ds.Event(_height, direction=2)
    with pytest.raises(ValueError, match="terminal"):
        ds.Event(_height, terminal=True, reset=lambda t, y: y)
    with pytest.raises(ValueError, match="max_events"):
        ds.Event(_height, terminal=False, max_events=0)
    with pytest.raises(TypeError, match="terminal must be True or False.*max_events=n"):
        ds.Event(_height, terminal=3.5)
    with pytest.raises(TypeError, match="callable"):
        ds.Event(1.0)

    def run(events, **kwargs):
        options = dict(solver=ds.RK4(), dt=0.1) | kwargs
        return ds.simulate(BALL, y0, ts, events=events, **options)

    with pytest.raises(ValueError, match="scalar"):
        run(ds.Event(lambda t, y: y))
    with pytest.raises(TypeError, match="float that crosses zero"):
        run(ds.Event(lambda t, y: jnp.int32(1)))
    with pytest.raises(ValueError, match="reset"):
        run(ds.Event(_height, reset=lambda t, y: y[:1]))
    with pytest.raises(TypeError, match=r"events\[1\]"):
        run((ds.Event(_height), "floor"))
    with pytest.raises(ValueError, match="empty"):
        run(())
    from models.stochastic import OrnsteinUhlenbeck

    with pytest.raises(NotImplementedError, match="ds.iterate"):
        ds.simulate(
            OrnsteinUhlenbeck(),
            jnp.zeros(1),
            ts,
            solver=ds.EulerMaruyama(),
            dt=0.1,
            key=jax.random.key(0),
            events=ds.Event(_height),
        )


@pytest.mark.parametrize("name", [*SOLVERS, "Kvaerno5"])
def test_a_condition_on_zero_at_t0_follows_one_rule_in_every_solver(name):
    # a ball on the floor at t0: thrown down it lands at once (the flow leaves zero in the
    # event's direction), thrown up it lands at 2 v / g
    options = SOLVERS.get(name) or dict(solver=ds.Kvaerno5(rtol=1e-10, atol=1e-12))
    ts = jnp.array([0.0, 1.0])
    down = ds.simulate(BALL, jnp.array([0.0, -1.0]), ts, events=LANDING, **options)
    assert float(down.event_time) == 0.0
    up = ds.simulate(BALL, jnp.array([0.0, 1.0]), ts, events=LANDING, **options)
    assert float(up.event_time) == pytest.approx(2 / G, abs=1e-9)
