"""The fixed-step solve of `simulate(..., events=...)`: a loop that locates zero crossings of
event conditions inside steps, stops or resets there, and records them (the adaptive event
solve, segments of diffrax solves, is in `adaptive`; the rules both follow are `EventTable`).

Fixed-step solvers run one loop whose iterations either take a step to the next point of the step
grid or, when a condition changed sign over that step, move to the located event time instead
(applying its reset) and take the rest of the step afterwards. So the step grid is kept, outputs
fall on grid points as without events, and the loop has a static bound: the steps plus one
iteration per allowed event. Work is skipped where JAX allows: the root finding runs only on
steps where some member of the batch crossed (`unvmap_any`), and iterations after every member
has finished do nothing.
"""

from typing import NamedTuple

import equinox.internal as eqxi
import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, PyTree

from .._compile import jit
from .._events import crossed, evaluate, EventTable, Records, restarts, round_off_time
from .common import advance, events_solved, guard_inputs, scale_of_times

# Iterations of the bracketing (Illinois) root finder on a step's interpolant; it converges
# superlinearly, so this reaches round-off on any step in double precision.
_BRACKET_ITERATIONS = 40
# Differentiable Newton steps after it: k of them make the k-th derivative of the event time
# exact (the implicit function theorem, unrolled), so gradients and Hessians flow through events.
_NEWTON_POLISH = 2


def loop_bound(events, grid_steps: int) -> int:
    """Static iterations of the fixed-step event loop: every grid step, every event that can
    restart the integration, and one more for the event that exceeds its limit."""
    return grid_steps + restarts(events) + 1


class _State(NamedTuple):
    """The carry of the fixed-step event loop (one batch member's view)."""

    t: Array  # the time reached: a grid point, or an event time inside a grid step
    y: PyTree  # the state at t (after any reset)
    solver_state: PyTree  # what the method carries into its next step (an FSAL evaluation)
    j: Array  # int32: index of the last grid point reached (the next step ends at j + 1)
    g: tuple  # the condition values at (t, y) the next crossing test starts from
    records: Records  # every occurrence so far
    done: Array  # bool: stopped (terminal event, limit, lost condition) or at the last time
    code: Array  # int32 RESULTS code
    ys: PyTree  # the output buffer, (times,) + state shape, NaN where not reached
    last_saved: Array  # int32: the last output row written
    steps: Array  # int32: loop iterations that stepped (grid steps and partial steps)


class _Step(NamedTuple):
    """Where one iteration ends: a plain grid step, or the event located inside it."""

    t: Array  # the end: the grid point, or the event time
    y: PyTree  # the state there, after the event's reset
    solver_state: PyTree
    g: tuple  # the condition values the next test starts from
    which: Array  # int32: the event that fired (0 when none did)


@jit
def solve_fixed_events(solver, model, y0, ts, counts, events, *, grid_steps: int, block):
    """Fixed-step solve with events. `counts`: steps in each output interval (int array);
    `grid_steps`: static upper bound of their sum."""
    valid, model, y0, ts = guard_inputs(model, y0, ts)
    dtype = ts.dtype
    table = EventTable(events)
    counts = counts.astype(jnp.int32)
    ends = jnp.cumsum(counts, dtype=jnp.int32)
    total = ends[-1]
    n_intervals = ts.shape[0] - 1
    time_scale = scale_of_times(ts)

    def grid_time(j):
        i = jnp.clip(
            jnp.searchsorted(ends, j, side="left", method="compare_all"), 0, n_intervals - 1
        ).astype(jnp.int32)
        k = j - (ends[i] - counts[i])
        inside = ts[i] + k.astype(dtype) * ((ts[i + 1] - ts[i]) / counts[i].astype(dtype))
        return jnp.where(k >= counts[i], ts[i + 1], inside), i, k >= counts[i]

    g0, untracked, code0 = table.start(model, ts[0], y0, time_scale)
    zero = jnp.array(0, jnp.int32)
    init = _State(
        t=ts[0],
        y=y0,
        solver_state=solver.init(model, ts[0], y0),
        j=zero,
        g=g0,
        records=Records.empty(events, y0, dtype),
        done=untracked,
        code=code0,
        ys=jax.tree.map(
            lambda x: jnp.full((ts.shape[0],) + x.shape, jnp.nan, x.dtype).at[0].set(x), y0
        ),
        last_saved=zero,
        steps=zero,
    )

    def body(c: _State) -> _State:
        target, interval, is_output = grid_time(c.j + 1)
        h = target - c.t
        y1, state1 = solver.advance(model, c.t, c.y, h, c.solver_state, None)
        g1 = tuple(evaluate(e, target, y1, model.vector_field) for e in events)
        counts_now = c.records.counts
        watched = table.watched(counts_now)
        hits = [(h > 0) & crossed(e, c.g[i], g1[i]) & watched[i] for i, e in enumerate(events)]
        live = ~c.done
        any_hit = jnp.any(jnp.stack(hits)) & live
        plain = _Step(target, y1, state1, g1, zero)

        def no_event():
            return plain, c.records

        def event():
            which, t_ev, y_ev = _locate(model, events, c.t, c.y, h, y1, c.g, g1, hits, time_scale)
            over = table.over_limit(any_hit, which, counts_now)
            y_next = table.after(which, ~over, t_ev, y_ev)
            located = _Step(
                t=t_ev,
                y=y_next,
                # the method restarts from the event: an FSAL evaluation is taken anew there
                solver_state=solver.init(model, t_ev, y_next),
                g=table.restart(model, t_ev, y_next, time_scale),
                which=which,
            )
            # batch members without a crossing keep their plain step
            step = jax.tree.map(lambda a, b: jnp.where(any_hit, a, b), located, plain)
            return step, c.records.add(which, any_hit & ~over, t_ev, y_ev, events)

        # the root finding, and the writes into the records (scatters under vmap), only run on
        # steps where some member crossed
        new, records = lax.cond(eqxi.unvmap_any(any_hit), event, no_event)
        over_limit = table.over_limit(any_hit, new.which, counts_now)
        j_next = jnp.where(any_hit, c.j, c.j + 1)
        save = ~any_hit & is_output & live
        ys = lax.cond(
            eqxi.unvmap_any(save),
            lambda ys: jax.tree.map(
                lambda buf, x: buf.at[interval + 1].set(jnp.where(save, x, buf[interval + 1])),
                ys,
                y1,
            ),
            lambda ys: ys,
            c.ys,
        )
        lost = table.lost(g1, y1)
        advanced = c._replace(
            t=new.t,
            y=new.y,
            solver_state=new.solver_state,
            j=j_next,
            g=new.g,
            done=table.stops(any_hit, new.which, counts_now, over_limit) | lost | (j_next >= total),
            code=table.code(c.code, over_limit, lost),
            last_saved=jnp.where(save, interval + 1, c.last_saved).astype(jnp.int32),
            steps=c.steps + 1,
        )
        # a finished member keeps its state; the buffers are only written where live, so they
        # are updated in place rather than selected whole (None: left out of the selection)
        unbuffered = dict(records=None, ys=None)
        kept = jax.tree.map(
            lambda a, b: jnp.where(live, a, b),
            advanced._replace(**unbuffered),
            c._replace(**unbuffered),
        )
        return kept._replace(records=records, ys=ys)

    def iteration(_, c: _State) -> _State:
        return lax.cond(eqxi.unvmap_any(~c.done), body, lambda c: c, c)

    final = advance(iteration, init, loop_bound(events, grid_steps), block)
    reached = jnp.arange(ts.shape[0], dtype=jnp.int32) <= final.last_saved
    num_events = jnp.sum(final.records.counts, dtype=jnp.int32)
    stats = {"num_steps": final.steps, "num_rejected_steps": jnp.zeros_like(final.steps)}
    # per located event: both ends' vector fields for the interpolant, one for the restart
    # value, and the method's restart (an FSAL evaluation)
    evals = solver.function_evals(final.steps, 1 + num_events)
    if evals is not None:
        stats["num_function_evals"] = evals + 3 * num_events
    return events_solved(valid, final.ys, reached, final.code, stats, final.records)


def _hermite(theta, h, y0, f0, y1, f1):
    """Cubic Hermite interpolant on a step of length h at fraction theta: exact for cubic
    trajectories (free fall), fourth-order accurate otherwise."""
    t2, t3 = theta * theta, theta * theta * theta
    h00, h10 = 2 * t3 - 3 * t2 + 1, t3 - 2 * t2 + theta
    h01, h11 = -2 * t3 + 3 * t2, t3 - t2
    return jax.tree.map(
        lambda a, fa, b, fb: h00 * a + (h10 * h) * fa + h01 * b + (h11 * h) * fb, y0, f0, y1, f1
    )


def _locate(model, events, t, y, h, y1, g0, g1, hits, time_scale):
    """The earliest event in the step [t, t + h] (ties: the first in `events` order) as
    (index, time, interpolated state), on the cubic Hermite interpolant of the step."""
    f0 = model.vector_field(t, y)
    f1 = model.vector_field(t + h, y1)

    def state(theta):
        return _hermite(theta, h, y, f0, y1, f1)

    return locate(events, t, h, state, g0, g1, hits, time_scale, model.vector_field)


def locate(events, t, h, state, g0, g1, hits, time_scale, field=None):
    """The earliest event in the step [t, t + h] (ties: the first in `events` order) as
    (index, time, state there), on the step's interpolant `state(theta)`, theta in [0, 1]:
    Illinois bracketing to round-off, then Newton steps that carry the derivatives. `field`:
    the vector field stepped (for conditions on dy/dt); `time_scale`: the solve's
    (`common.scale_of_times`)."""
    # Within the round-off of the step's start the bracketing sees the value the crossing test
    # started from (g0: after an event, `restart_value`'s, off the zero the state sits on).
    # Else a step spanning a whole flight after a bounce (h = 4.3 for a flight of 0.012)
    # brackets the zero it starts on: t + θh rounds to t for θ below 1e-16, the condition is 0
    # there, and the bounce fired again at once in the wrong direction (the ball fell through
    # the floor, reported successful).
    near = 2 * round_off_time(jnp.result_type(h), time_scale) / jnp.abs(h)
    thetas = []
    for i, event in enumerate(events):

        def g(theta, event=event):
            return evaluate(event, t + theta * h, state(theta), field)

        def bracketed(theta, g=g, start=g0[i]):
            return jnp.where(theta <= near, start.astype(theta.dtype), g(theta))

        theta = lax.stop_gradient(_illinois(bracketed, g0[i], g1[i]))
        for _ in range(_NEWTON_POLISH):
            value, slope = jax.jvp(g, (theta,), (jnp.ones_like(theta),))
            safe = jnp.where(slope != 0, slope, 1)
            theta = jnp.clip(theta - jnp.where(slope != 0, value / safe, 0), 0, 1)
        thetas.append(jnp.where(hits[i], theta, jnp.inf))
    thetas = jnp.stack(thetas)
    first = jnp.min(thetas)
    tie = thetas <= first + 16 * jnp.finfo(thetas.dtype).eps
    which = jnp.argmax(tie).astype(jnp.int32)
    theta = jnp.where(jnp.isfinite(thetas[which]), thetas[which], 1)
    return which, t + theta * h, state(theta)


def _illinois(g, g_start, g_end):
    """Zero of g on [0, 1] given the signs at the ends (regula falsi, Illinois variant)."""
    dtype = jnp.result_type(g_end)

    def body(_, s):
        a, fa, b, fb = s
        c = (a * fb - b * fa) / (fb - fa)
        exact = fb == 0  # converged on a zero: stay there
        inside = jnp.isfinite(c) & (c > jnp.minimum(a, b)) & (c < jnp.maximum(a, b))
        c = jnp.where(inside, c, 0.5 * (a + b))
        fc = g(c)
        flip = fc * fb < 0
        a, fa = jnp.where(flip, b, a), jnp.where(flip, fb, 0.5 * fa)
        new = (a, fa, c, fc)
        return jax.tree.map(lambda x, y: jnp.where(exact, x, y), s, new)

    zero, one = jnp.zeros((), dtype), jnp.ones((), dtype)
    start = (zero, g_start.astype(dtype), one, g_end.astype(dtype))
    _, _, b, _ = lax.fori_loop(0, _BRACKET_ITERATIONS, body, start)
    return b
