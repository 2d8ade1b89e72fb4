"""The solves of `simulate(..., events=...)`: fixed-step and adaptive loops that locate zero
crossings of event conditions inside steps, stop or reset there, and record them.

Fixed-step solvers run one loop whose iterations either take a step to the next point of the step
grid or, when a condition changed sign over that step, move to the located event time instead
(applying its reset) and take the rest of the step afterwards. So the step grid is kept, outputs
fall on grid points as without events, and the loop has a static bound: the steps plus one
iteration per allowed event. Work is skipped where JAX allows: the root finding runs only on
steps where some member of the batch crossed (`unvmap_any`), and iterations after every member
has finished do nothing.

Adaptive solvers run diffrax's own event detection and root finding, one diffrax solve per
segment between events, in a `lax.scan` over segments.
"""

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
from jax import lax

from .._events import crossed, evaluate, Records, restart_value, start_value
from .._results import RESULTS
from .._validate import all_finite
from .common import advance, events_result, guard_inputs, mask_invalid

# Iterations of the bracketing (Illinois) root finder on a step's interpolant; it converges
# superlinearly, so this reaches round-off on any step in double precision.
_BRACKET_ITERATIONS = 40
# Differentiable Newton steps after it: k of them make the k-th derivative of the event time
# exact (the implicit function theorem, unrolled), so gradients and Hessians flow through events.
_NEWTON_POLISH = 2


def loop_bound(events, grid_steps: int) -> int:
    """Static iterations of the fixed-step event loop: every grid step, every event that can
    restart the integration, and one more for the event that exceeds its limit."""
    return grid_steps + sum(e.max_events for e in events if not e.terminal) + 1


@eqx.filter_jit
def solve_fixed_events(solver, model, y0, ts, counts, events, *, grid_steps: int, block):
    """Fixed-step solve with events. `counts`: steps in each output interval (int array);
    `grid_steps`: static upper bound of their sum. Returns (ys, reached, records, stats,
    result)."""
    valid, model, y0, ts = guard_inputs(model, y0, ts)
    dtype = ts.dtype
    counts = counts.astype(jnp.int32)
    ends = jnp.cumsum(counts, dtype=jnp.int32)
    total = ends[-1]
    n_intervals = ts.shape[0] - 1
    time_scale = jnp.maximum(jnp.abs(ts[-1]), ts[-1] - ts[0])

    def grid_time(j):
        i = jnp.clip(
            jnp.searchsorted(ends, j, side="left", method="compare_all"), 0, n_intervals - 1
        ).astype(jnp.int32)
        k = j - (ends[i] - counts[i])
        inside = ts[i] + k.astype(dtype) * ((ts[i + 1] - ts[i]) / counts[i].astype(dtype))
        return jnp.where(k >= counts[i], ts[i + 1], inside), i, k >= counts[i]

    ys = jax.tree.map(
        lambda x: jnp.full((ts.shape[0],) + x.shape, jnp.nan, x.dtype).at[0].set(x), y0
    )
    g0 = tuple(start_value(e, model, ts[0], y0, time_scale) for e in events)
    # a condition that is not finite at t0 can never be tracked
    untracked = ~jnp.all(jnp.isfinite(jnp.stack(g0)))
    init = dict(
        t=ts[0],
        y=y0,
        j=jnp.array(0, jnp.int32),
        g=g0,
        records=Records.empty(events, y0, dtype),
        done=untracked,
        code=jnp.where(untracked, RESULTS.event_failed, RESULTS.successful).astype(jnp.int32),
        ys=ys,
        last_saved=jnp.array(0, jnp.int32),
        steps=jnp.array(0, jnp.int32),
    )
    terminal = jnp.array([e.terminal for e in events])
    resets = jnp.array([e.reset is not None for e in events])
    limits = jnp.array([e.max_events for e in events], jnp.int32)

    def body(c):
        target, interval, is_output = grid_time(c["j"] + 1)
        h = target - c["t"]
        y1 = solver.step(model, c["t"], c["y"], h)
        g1 = tuple(evaluate(e, target, y1) for e in events)
        counts_now = c["records"].counts
        hits = [
            (h > 0)
            & crossed(e, c["g"][i], g1[i])
            # a recording-only event stops being watched once its slots are full
            & (e.terminal | (e.reset is not None) | (counts_now[i] < e.max_events))
            for i, e in enumerate(events)
        ]
        live = ~c["done"]
        any_hit = jnp.any(jnp.stack(hits)) & live

        def no_event():
            plain = dict(t=target, y=y1, g=g1, which=jnp.array(0, jnp.int32), t_ev=target, y_ev=y1)
            return plain, c["records"]

        def event():
            which, t_ev, y_ev = _locate(model, events, c["t"], c["y"], h, y1, c["g"], g1, hits)
            y_next = y_ev
            for i, e in enumerate(events):
                if e.reset is not None:
                    y_next = jax.tree.map(
                        lambda a, b: jnp.where(which == i, a, b), e.reset(t_ev, y_ev), y_next
                    )
            g_next = tuple(restart_value(e, model, t_ev, y_next, time_scale) for e in events)
            out = dict(t=t_ev, y=y_next, g=g_next, which=which, t_ev=t_ev, y_ev=y_ev)
            # batch members without a crossing keep their plain step
            out = jax.tree.map(lambda a, b: jnp.where(any_hit, a, b), out, no_event()[0])
            over = any_hit & resets[which] & (counts_now[which] >= limits[which])
            records = c["records"].add(which, any_hit & ~over, t_ev, y_ev, events)
            return out, records

        # the root finding, and the writes into the records (scatters under vmap), only run on
        # steps where some member crossed
        new, records = lax.cond(eqxi.unvmap_any(any_hit), event, no_event)
        which = new["which"]
        over_limit = any_hit & resets[which] & (counts_now[which] >= limits[which])
        # past its limit a reset event stops the trajectory where it happened, not reset
        y_next = jax.tree.map(lambda a, b: jnp.where(over_limit, a, b), new["y_ev"], new["y"])
        j_next = jnp.where(any_hit, c["j"], c["j"] + 1)
        save = ~any_hit & is_output & live
        ys = lax.cond(
            eqxi.unvmap_any(save),
            lambda ys: jax.tree.map(
                lambda buf, x: buf.at[interval + 1].set(jnp.where(save, x, buf[interval + 1])),
                ys,
                y1,
            ),
            lambda ys: ys,
            c["ys"],
        )
        stopped = any_hit & (terminal[which] | over_limit)
        # a condition that turns NaN or inf where the state is finite: its crossings cannot be
        # found any more, so the member stops there rather than run on as if it had none
        lost = ~jnp.all(jnp.isfinite(jnp.stack(g1))) & all_finite(y1)
        code = jnp.where(over_limit, RESULTS.event_limit_reached, c["code"])
        code = jnp.where(lost, RESULTS.event_failed, code)
        small = dict(
            t=new["t"],
            y=y_next,
            j=j_next,
            g=new["g"],
            done=stopped | lost | (j_next >= total),
            code=code.astype(jnp.int32),
            last_saved=jnp.where(save, interval + 1, c["last_saved"]).astype(jnp.int32),
            steps=c["steps"] + 1,
        )
        # a finished member keeps its state; the buffers are only written where live, so they
        # are updated in place rather than selected whole
        small = jax.tree.map(lambda a, b: jnp.where(live, a, b), small, {k: c[k] for k in small})
        return dict(small, records=records, ys=ys)

    def iteration(_, c):
        return lax.cond(eqxi.unvmap_any(~c["done"]), body, lambda c: c, c)

    bound = loop_bound(events, grid_steps)
    final = advance(iteration, init, bound, block)
    reached = jnp.arange(ts.shape[0], dtype=jnp.int32) <= final["last_saved"]
    ys = final["ys"]
    result = events_result(valid, ys, reached, final["code"])
    num_events = jnp.sum(final["records"].counts, dtype=jnp.int32)
    stats = {
        "num_steps": final["steps"],
        "num_rejected_steps": jnp.zeros_like(final["steps"]),
        # per located event: both ends' vector fields for the interpolant, one for the restart
        "num_function_evals": final["steps"] * solver.evals_per_step + 3 * num_events,
        "num_events": num_events,
    }
    return mask_invalid(valid, ys), reached & valid, final["records"], stats, result


def _hermite(theta, h, y0, f0, y1, f1):
    """Cubic Hermite interpolant on a step of length h at fraction theta: exact for cubic
    trajectories (free fall), fourth-order accurate otherwise."""
    t2, t3 = theta * theta, theta * theta * theta
    h00, h10 = 2 * t3 - 3 * t2 + 1, t3 - 2 * t2 + theta
    h01, h11 = -2 * t3 + 3 * t2, t3 - t2
    return jax.tree.map(
        lambda a, fa, b, fb: h00 * a + (h10 * h) * fa + h01 * b + (h11 * h) * fb, y0, f0, y1, f1
    )


def _locate(model, events, t, y, h, y1, g0, g1, hits):
    """The earliest event in the step [t, t + h] (ties: the first in `events` order) as
    (index, time, interpolated state)."""
    f0 = model.vector_field(t, y)
    f1 = model.vector_field(t + h, y1)

    def state(theta):
        return _hermite(theta, h, y, f0, y1, f1)

    thetas = []
    for i, event in enumerate(events):

        def g(theta, event=event):
            return evaluate(event, t + theta * h, state(theta))

        theta = lax.stop_gradient(_illinois(g, g0[i], g1[i]))
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
