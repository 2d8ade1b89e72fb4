"""diffsim's own adaptive loop, shared by the explicit pairs (`erk_loop`) and the Rosenbrock
methods (`rosenbrock_loop`): attempt a step, accept or reject it by the error norm, write the
save times it passed from its dense output, and, with events, find the earliest crossing in
an accepted step on that dense output, record it and stop or reset there.

A method enters as a `Stepper` (its first step carry, one attempted step with its dense
output), so both families step, save, fire events and count alike. The loop is a bounded
`while_loop` per member: under `jax.vmap` every member keeps its own step sizes, and the
output buffers are written row by row (`step_loop`). Derivatives in every mode by the
forward-mode Jacobian of the loop (`run_any_order`, `forward_jacobian`); the step sizes are held
fixed, event times carry their derivatives (`event_loop.locate`).
"""

import functools as ft
from collections.abc import Callable
from typing import NamedTuple, Protocol

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
from jaxtyping import Array, PyTree

from .._events import crossed, evaluate, EventTable, Records
from .._results import RESULTS
from .._validate import all_finite
from .common import events_solved, mask_invalid, plain_solved, scale_of_times
from .dense import DenseOutput, empty_pieces, sample_step
from .event_loop import locate
from .families import Solved
from .forward_jacobian import jvp_by_jacobian
from .loop_derivatives import loop_jvp
from .step_control import (
    advance_time,
    Controls,
    empty_outputs,
    end_floor,
    error_ratio,
    final_code,
    first_step,
    next_step,
    save_dense,
    step_loop,
    unfinished,
)


class Attempt(NamedTuple):
    """One attempted step from t to t + h."""

    y1: PyTree  # the state at t + h
    error: PyTree  # the error estimate of y1
    evaluate: Callable  # the dense output: the state at a time in [t, t + h]
    carry: PyTree  # what the method carries into the next step if this one is accepted


class Stepper(Protocol):
    """A method as the loop sees it."""

    error_order: int  # the error estimate is O(h^error_order)
    dense_nodes: int  # the degree of its dense output + 1 (`dense.sample_step`)

    def start(self, t, y) -> PyTree:
        """The carry of the first step from (t, y), and of the step after an event moved or
        reset the state (an FSAL method's vector field there)."""

    def attempt(self, t, h, y, carry) -> Attempt: ...


class Method(eqx.Module):
    """A family's method as `run_any_order` takes it: a pytree (its arrays are traced) that
    builds the `Stepper` for a model."""

    def stepper(self, model, y0) -> Stepper:
        raise NotImplementedError


class Out(NamedTuple):
    """What the loop returns."""

    ys: PyTree  # the states at ts (inf where not reached; NaN after a terminal event)
    code: Array  # int32 RESULTS code
    accepted: Array  # int32
    rejected: Array  # int32
    records: Records | None = None  # with events: every occurrence
    reached: Array | None = None  # with events: bool (times,), False after a terminal event
    dense: DenseOutput | None = None  # with dense=True: every accepted step's interpolant


class _State(NamedTuple):
    """The carry of the loop."""

    t: Array  # the time reached (the start of the next attempt)
    t_next: Array  # where the next attempt ends
    y: PyTree  # the state at t
    carry: PyTree  # the method's carry at (t, y)
    ys: PyTree  # the output buffer (times,) + state shape
    saved: Array  # int32: the number of output rows written
    accepted: Array  # int32
    rejected: Array  # int32
    code: Array  # int32 RESULTS code (step_size_collapsed below dtmin)
    # with events (else None): the condition values the next crossing test starts from,
    # every occurrence so far, and whether the member has stopped (a terminal event)
    g: tuple | None = None
    records: Records | None = None
    done: Array | None = None
    # with dense output (else None): the step boundaries and each step's interpolant
    pieces: tuple | None = None
    # a delay equation's breakpoints to come (sorted, inf-terminated; else None)
    breaks: Array | None = None


def run(
    stepper: Stepper,
    model,
    y0,
    ts,
    controls: Controls,
    events,
    *,
    max_steps: int,
    dense: bool = False,
    kind: str = "lax",
) -> Out:
    """Solve from y0 at ts[0] to ts[-1] with `stepper`, saving at every time in ts, with the
    step-size `controls` and `events` (a tuple of `ds.Event`, or None); with `dense`, every
    accepted step's interpolant is kept (`dense.DenseOutput`). `kind`: the loop's, as
    `step_control.step_loop` takes it (which derivatives it supports)."""
    dtype = ts.dtype
    t0, t1 = ts[0], ts[-1]
    table = None if events is None else EventTable(events)
    time_scale = scale_of_times(ts)
    select = lambda keep, a, b: jax.tree.map(lambda a, b: jnp.where(keep, a, b), a, b)  # noqa: E731

    delayed = hasattr(stepper, "with_history")  # a delay equation reads its own past
    dense = dense or delayed
    breaks0 = stepper.breaks(t0) if delayed else None
    if delayed and table is not None:
        # room for the breakpoints of resets to come (`_with_jump_breaks`)
        spare = jnp.full((_JUMPS_AHEAD * stepper.breaks_per_jump,), jnp.inf, dtype)
        breaks0 = jnp.concatenate([breaks0, spare])

    def target(saved, t_reached, breaks):
        """(where the next step must end at the latest, the time above which it is stretched
        to end there): t1, or with `step_to_outputs` the next output time; for a delay
        equation no later than its next breakpoint (where its solution is not smooth)."""
        if not controls.step_to_outputs:
            t_out = t1
        else:
            t_out = ts[jnp.minimum(saved, ts.shape[0] - 1)]
        if breaks is not None:
            # at a tie the output time, whose derivative is its own: jnp.minimum splits a tie's
            # derivative between both, and a breakpoint t0 + kτ at an output time moved the
            # step's end with half of kτ̇ (dy(1)/dτ = −0.80 where it is −0.32, τ = 0.5)
            upcoming = breaks[jnp.searchsorted(breaks, t_reached, side="right")]
            t_out = jnp.where(upcoming < t_out, upcoming, t_out)
        return t_out, end_floor(t_out)

    def going(state: _State):
        steps = state.accepted + state.rejected
        more = unfinished(state.t, t1, steps, max_steps, state.code)
        return more if state.done is None else more & ~state.done

    def step(state: _State) -> _State:
        t, t_next, y, code = state.t, state.t_next, state.y, state.code
        # Under `jax.vmap` a member that has finished still runs the body (its result is
        # discarded), with t_next = t: a step of zero length divides by zero (an FSAL pair's
        # last stage, a Rosenbrock matrix) and a reverse pass multiplies the discarded inf by
        # a zero cotangent, NaN for every member. It attempts a short harmless step instead.
        h = jnp.where(going(state), t_next - t, jnp.sqrt(jnp.finfo(dtype).eps) * (1 + jnp.abs(t)))
        if delayed:  # the model as this step sees it: its past read from the buffers
            view = _history_view(state.pieces, y0, state.accepted)
            present = stepper.present(view, t, t_next)
            now = stepper.with_history(present)
            # the carry (an FSAL pair's first stage, a Hermite start slope) anew: the step
            # before may have read the other side of a breakpoint's jump in the delayed input
            carry = now.start(t, y)
        else:
            present, now, carry = model, stepper, state.carry
        attempt = now.attempt(t, h, y, carry)
        ratio = error_ratio(y, attempt.y1, attempt.error, controls)
        keep, dt, code = next_step(t, t_next, ratio, stepper.error_order, controls, code)
        if table is None:
            saved, ys = save_dense(
                ts, keep, t_next, attempt.y1, state.saved, state.ys, attempt.evaluate, kind
            )
            t_reached = jnp.where(keep, t_next, t)
            ends = target(saved, t_reached, state.breaks)
            t_new, t_next_new = advance_time(keep, t, t_next, dt, *ends)
            y_new, carry_new = select(keep, (attempt.y1, attempt.carry), (y, state.carry))
            extra = {}
        else:
            found = _event_in_step(
                table, present, now, t, h, attempt, state, keep, code, time_scale
            )
            code = found.code
            saved, ys = save_dense(
                ts, keep, found.t_end, found.y_end, state.saved, state.ys, attempt.evaluate, kind
            )
            t_reached = jnp.where(keep, found.t_end, t)
            breaks = state.breaks
            if delayed:
                breaks = _with_jump_breaks(stepper, breaks, keep, found, t_reached)
                extra_breaks = dict(breaks=breaks)
            else:
                extra_breaks = {}
            ends = target(saved, t_reached, breaks)
            t_new, t_next_new = advance_time(keep, t, found.t_end, dt, *ends)
            y_new, carry_new = select(keep, (found.y_after, found.carry), (y, state.carry))
            done = state.done | found.stop | (keep & (t_new >= t1))
            extra = dict(g=found.g, records=found.records, done=done, **extra_breaks)
        if dense:
            t_end, y_end = (t_next, attempt.y1) if table is None else (found.t_end, found.y_end)
            extra["pieces"] = _store_piece(
                state.pieces, state.accepted, keep, stepper, attempt, t, t_end, y, y_end
            )
        return _State(
            t=t_new,
            t_next=t_next_new,
            y=y_new,
            carry=carry_new,
            ys=ys,
            saved=saved,
            accepted=state.accepted + keep.astype(jnp.int32),
            rejected=state.rejected + (~keep).astype(jnp.int32),
            code=code,
            breaks=extra.pop("breaks", state.breaks),
            **extra,
        )

    zero = jnp.array(0, jnp.int32)
    init = _State(
        t=t0,
        t_next=jnp.minimum(t0 + first_step(controls, dtype), target(1, t0, breaks0)[0]),
        y=y0,
        carry=stepper.start(t0, y0),
        ys=empty_outputs(y0, ts.shape[0]),
        saved=jnp.array(1, jnp.int32),
        accepted=zero,
        rejected=zero,
        code=jnp.array(RESULTS.successful, jnp.int32),
        pieces=empty_pieces(y0, t0, max_steps, stepper.dense_nodes) if dense else None,
        breaks=breaks0,
    )
    if table is not None:
        g0, untracked, code0 = table.start(model, t0, y0, time_scale)
        # outputs after a terminal event are NaN, as in the other event loops
        ys = jax.tree.map(lambda b: jnp.where(jnp.isinf(b), jnp.nan, b), init.ys)
        init = init._replace(
            ys=ys, code=code0, g=g0, records=Records.empty(events, y0, dtype), done=untracked
        )
    buffers = lambda state: (state.ys, state.pieces)  # noqa: E731
    final = step_loop(going, step, init, buffers, kind=kind, max_steps=max_steps)
    pieces = None if not dense else DenseOutput(*final.pieces, final.accepted)
    if table is None:
        code = final_code(final.t, t1, final.code)
        return Out(final.ys, code, final.accepted, final.rejected, dense=pieces)
    stopped_early = final.done & (final.t < t1)  # a terminal event (or a limit) ended it
    code = jnp.where(stopped_early, final.code, final_code(final.t, t1, final.code))
    reached = jnp.arange(ts.shape[0], dtype=jnp.int32) < final.saved
    return Out(final.ys, code, final.accepted, final.rejected, final.records, reached, pieces)


# A delay equation keeps the breakpoints of this many resets ahead of its time at once (a
# further reset's, until those pass, push out the latest ones: steps may then straddle those
# kinks, still taken to the tolerance by an adaptive method)
_JUMPS_AHEAD = 4


def _with_jump_breaks(stepper, breaks, keep, found: "_EventStep", t_reached):
    """`breaks` with those of a reset in this step, if any: a jump of the state at t_e
    travels along the lags as the jump at t0 does (`stepper.jump_breaks(t_e)`). The breaks
    up to `t_reached` are dropped; the array keeps its size (the latest ones past it are
    lost)."""
    changed = jax.tree.leaves(
        jax.tree.map(lambda a, b: jnp.any(a != b), found.y_after, found.y_end)
    )
    jumped = keep & jnp.any(jnp.stack(changed))
    new = jnp.where(jumped, stepper.jump_breaks(found.t_end), jnp.inf)
    ahead = jnp.where(breaks > t_reached, breaks, jnp.inf)
    merged = jnp.sort(jnp.concatenate([ahead, new]))[: breaks.shape[0] - 1]
    return jnp.concatenate([merged, jnp.full((1,), jnp.inf, breaks.dtype)])


def _history_view(pieces, y0, count) -> DenseOutput:
    """The steps stored so far, read from the loop's buffers (a delay equation's past)."""
    knots, coeffs = pieces
    return DenseOutput(knots[...], jax.tree.map(lambda _, c: c[...], y0, coeffs), count)


def _store_piece(pieces, row, keep, stepper, attempt, t, t_end, y, y_end):
    """Write the accepted step's interpolant on [t, t_end] into row `row` of the dense
    buffers (a rejected attempt writes nothing)."""
    knots, coeffs = pieces
    sample = sample_step(attempt.evaluate, t, t_end, y, y_end, stepper.dense_nodes)
    knots = knots.at[row + 1].set(t_end, pred=keep)
    coeffs = jax.tree.map(lambda c, buf: buf.at[row].set(c, pred=keep), sample, coeffs)
    return knots, coeffs


def solved(valid, out: Out, stats: dict, events, code_override=None) -> Solved:
    """The loop's `Out` as `simulate` takes it (`common.plain_solved`, `common.events_solved`);
    `code_override`, where not successful, replaces the result code (a DAE's inconsistent
    start)."""
    if events is None:
        result = plain_solved(valid, out.ys, out.code, stats)
    else:
        result = events_solved(valid, out.ys, out.reached, out.code, stats, out.records)
    if out.dense is not None:  # a member whose inputs failed the guard: NaN between outputs too
        coeffs = mask_invalid(valid, out.dense.coeffs)
        result = result._replace(dense=eqx.tree_at(lambda d: d.coeffs, out.dense, coeffs))
    if code_override is None:
        return result
    code = jnp.where(code_override == RESULTS.successful, result.result, code_override)
    return result._replace(result=code.astype(jnp.int32))


@eqx.filter_custom_jvp
def run_any_order(
    method: Method, model, y0, ts, controls, events, *, max_steps: int, dense: bool = False
) -> Out:
    """`run` with `method.stepper(model, y0)`, differentiable in every mode: the loop holds no
    custom rule inside, so its tangent is the forward-mode Jacobian of the loop
    (`forward_jacobian`), through the stages, the dense output and the event location."""
    stepper = method.stepper(model, y0)
    return run(stepper, model, y0, ts, controls, events, max_steps=max_steps, dense=dense)


@run_any_order.def_jvp
def _run_any_order_jvp(primals, tangents, *, max_steps, dense=False):
    def solve(kind, *args):
        method, model, y0 = args[:3]
        stepper = method.stepper(model, y0)
        out = run(stepper, model, y0, *args[3:], max_steps=max_steps, dense=dense, kind=kind)
        times = None if out.records is None else (out.records.times, out.records.states)
        pieces = None if out.dense is None else (out.dense.knots, out.dense.coeffs)
        return (out.ys, times, pieces), out

    method, model, y0 = primals[:3]
    if hasattr(method.stepper(model, y0), "with_history"):
        # a delay equation reads its past from the loop's buffers, which a checkpointed
        # loop only writes: always the forward Jacobian
        out, tangent = jvp_by_jacobian(ft.partial(solve, "lax"), primals, tangents)
    else:
        any_order = ft.partial(run_any_order, max_steps=max_steps, dense=dense)
        out, tangent = loop_jvp(solve, any_order, primals, tangents)
    ys_tangent, times_tangent, pieces_tangent = tangent
    records = None
    if out.records is not None:
        records = Records(times=times_tangent[0], states=times_tangent[1], counts=None)
    pieces = None
    if out.dense is not None:
        pieces = DenseOutput(*pieces_tangent, None, out.dense.direction)
    tangent = Out(
        ys=ys_tangent,
        code=None,
        accepted=None,
        rejected=None,
        records=records,
        reached=None,
        dense=pieces,
    )
    return out, tangent


class _EventStep(NamedTuple):
    """Where an attempted step ends with events: the located event or its own end."""

    t_end: Array  # the event's time, or t + h
    y_end: PyTree  # the state there, before a reset
    y_after: PyTree  # the state the next step starts from (after a reset)
    carry: PyTree  # the method's carry there
    g: tuple  # the condition values the next crossing test starts from
    records: Records  # every occurrence so far
    stop: Array  # bool: the member stops here (terminal event, limit, lost condition)
    code: Array  # int32 RESULTS code


def _event_in_step(
    table, model, stepper, t, h, attempt: Attempt, state: _State, keep, code, time_scale
):
    """The event logic of the attempted step from t to t + h: whether the accepted step
    crossed an event's condition, the earliest crossing located on the method's dense output,
    its record and reset. `model` is the model as the step sees it (a delay equation's reads
    its past)."""
    events = table.events
    t_next, y1 = t + h, attempt.y1
    g1 = tuple(evaluate(e, t_next, y1, model.vector_field) for e in events)
    counts = state.records.counts
    watched = table.watched(counts)
    live = ~state.done & keep
    hits = [live & crossed(e, state.g[i], g1[i]) & watched[i] for i, e in enumerate(events)]
    any_hit = jnp.any(jnp.stack(hits))
    no = jnp.array(False)
    plain = (t_next, y1, y1, attempt.carry, g1, state.records, no, no)

    def event():
        which, t_ev, y_ev = locate(
            events,
            t,
            h,
            lambda theta: attempt.evaluate(t + theta * h),
            state.g,
            g1,
            hits,
            time_scale,
            model.vector_field,
        )
        over = table.over_limit(any_hit, which, counts)
        y_after = table.after(which, ~over, t_ev, y_ev)
        g_after = table.restart(model, t_ev, y_after, time_scale)
        records = state.records.add(which, any_hit & ~over, t_ev, y_ev, events)
        stops = table.stops(any_hit, which, counts, over)
        carry = stepper.start(t_ev, y_after)
        located = (t_ev, y_ev, y_after, carry, g_after, records, stops, over)
        return jax.tree.map(lambda a, b: jnp.where(any_hit, a, b), located, plain)

    # the root finding, and the writes into the records (scatters under vmap), only run on
    # steps where some member crossed
    t_end, y_end, y_after, carry, g_new, records, stops, over = jax.lax.cond(
        eqxi.unvmap_any(any_hit), event, lambda: plain
    )
    lost = live & table.lost(g1, y1)
    code = jnp.where(live, table.code(code, over, lost), code)
    # a reset that returned NaN or inf: nothing can be integrated from there
    broken = live & any_hit & ~all_finite(y_after)
    code = jnp.where(broken, RESULTS.nonfinite_state, code).astype(jnp.int32)
    g_new = tuple(jnp.where(keep, a, b) for a, b in zip(g_new, state.g))
    return _EventStep(t_end, y_end, y_after, carry, g_new, records, stops | lost | broken, code)
