"""The adaptive loop of the Rosenbrock methods (`ds.Rosenbrock23`, `ds.Rodas5P`): stiff ODEs
and mass-matrix DAEs M y' = f(t, y), one Jacobian and one LU factorisation per attempted step.

The loop is diffsim's own (as the lean loop of the explicit pairs, with the same step-size
control, `step_control`): a bounded `while_loop` per member, so under `jax.vmap` every member
keeps its own step sizes, and tolerances are traced. The state is flattened into one vector for
the linear algebra and unflattened for the model. Derivatives in every mode by the forward-mode
Jacobian of the loop (`forward_jacobian`): the loop holds no custom rule inside, so forward mode
runs through the Jacobian, the LU and the stages, and the step sizes are held fixed.
"""

from typing import NamedTuple

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
from jax import lax
from jax.flatten_util import ravel_pytree
from jaxtyping import Array, PyTree

from .._events import crossed, evaluate, EventTable, Records
from .._results import RESULTS
from .._solver.rosenbrock import AbstractRosenbrock, factorise, flat_field, linearise
from .common import events_result, mask_invalid, nonfinite_code
from .dae import consistency_error, mass_matrix_of
from .event_loop import locate
from .families import Solved, SolveRequest, solves
from .forward_jacobian import jvp_by_jacobian
from .step_control import (
    advance_time,
    check_adaptive_request,
    Controls,
    empty_outputs,
    end_floor,
    error_ratio,
    final_code,
    first_step,
    next_step,
    prepare,
    save_dense,
    step_loop,
    unfinished,
)


@solves(AbstractRosenbrock)
def solve_rosenbrock_family(solver: AbstractRosenbrock, request: SolveRequest) -> Solved:
    dt = check_adaptive_request(solver, request)
    if request.adjoint != "auto":
        raise ValueError(
            f"adjoint={request.adjoint!r} selects how diffrax differentiates its solves; "
            f"{type(solver).__name__} runs diffsim's own loop, differentiated in every mode "
            "by its forward-mode Jacobian: leave adjoint='auto'"
        )
    if any(jnp.iscomplexobj(leaf) for leaf in jax.tree.leaves(request.y0)):
        raise TypeError(
            f"{type(solver).__name__} solves real states: split a complex state into its real "
            "and imaginary parts"
        )
    return _solve(
        solver,
        request.model,
        request.y0,
        request.ts,
        dt,
        request.events,
        max_steps=request.max_steps,
    )


@eqx.filter_jit
def _solve(solver, model, y0, ts, dt0, events, *, max_steps: int):
    valid, model, y0, ts, controls = prepare(solver, solver.error_order, model, y0, ts, dt0)
    if model.mass_matrix is not None:
        # an inconsistent start is refused with its own code (simulate checks it eagerly too)
        consistent = consistency_error(model, ts[0], y0, controls.rtol, controls.atol) <= 1
    else:
        consistent = jnp.array(True)
    out = _rosenbrock_any_order(solver, model, y0, ts, controls, events, max_steps=max_steps)
    valid = valid & consistent
    if events is None:
        code = jnp.where(out.code == RESULTS.successful, nonfinite_code(out.ys), out.code)
        result = jnp.where(valid, code, RESULTS.invalid_input)
    else:
        result = events_result(valid, out.ys, out.reached, out.code)
    result = jnp.where(consistent, result, RESULTS.inconsistent_initial_state).astype(jnp.int32)
    attempts = out.accepted + out.rejected
    stats = {
        "num_steps": out.accepted,
        "num_rejected_steps": out.rejected,
        # vector field evaluations of the stages (each attempt also takes one Jacobian)
        "num_function_evals": attempts * solver.stages,
    }
    if events is None:
        return Solved(mask_invalid(valid, out.ys), stats, result)
    stats["num_events"] = jnp.sum(out.records.counts, dtype=jnp.int32)
    return Solved(
        ys=mask_invalid(valid, out.ys),
        stats=stats,
        result=result,
        reached=out.reached & valid,
        records=out.records,
    )


class _Out(NamedTuple):
    ys: PyTree  # the states at ts (inf where not reached; NaN with events)
    code: Array  # int32 RESULTS code
    accepted: Array  # int32
    rejected: Array  # int32
    records: Records | None = None  # with events: every occurrence
    reached: Array | None = None  # with events: bool (times,), False after a terminal event


@eqx.filter_custom_jvp
def _rosenbrock_any_order(solver, model, y0, ts, controls, events, *, max_steps):
    return _loop(solver, model, y0, ts, controls, events, max_steps=max_steps)


@_rosenbrock_any_order.def_jvp
def _rosenbrock_any_order_jvp(primals, tangents, *, max_steps):
    def solve(*args):
        out = _loop(*args, max_steps=max_steps)
        times = None if out.records is None else (out.records.times, out.records.states)
        return (out.ys, times), out

    out, (ys_tangent, times_tangent) = jvp_by_jacobian(solve, primals, tangents)
    records = None
    if out.records is not None:
        records = Records(times=times_tangent[0], states=times_tangent[1], counts=None)
    tangent = _Out(
        ys=ys_tangent, code=None, accepted=None, rejected=None, records=records, reached=None
    )
    return out, tangent


class _State(NamedTuple):
    """The carry of the Rosenbrock loop."""

    t: Array  # the time reached (the start of the next attempt)
    t_next: Array  # where the next attempt ends
    y: Array  # the flat state at t
    ys: PyTree  # the output buffer (times,) + state shape; inf where not reached
    saved: Array  # int32: the number of output rows written
    accepted: Array  # int32
    rejected: Array  # int32
    code: Array  # int32 RESULTS code
    # with events (else None): the condition values the next crossing test starts from,
    # every occurrence so far, and whether the member has stopped (a terminal event)
    g: tuple | None = None
    records: Records | None = None
    done: Array | None = None


def _loop(solver, model, y0, ts, controls: Controls, events, *, max_steps: int) -> _Out:
    y0_flat, unravel = ravel_pytree(y0)
    dtype = ts.dtype
    t0, t1 = ts[0], ts[-1]
    t1_floor = end_floor(t1)
    f = flat_field(model, unravel)
    mass = mass_matrix_of(model, y0_flat.shape[0], dtype)
    table = None if events is None else EventTable(events)
    time_scale = jnp.maximum(jnp.abs(t1), t1 - t0)

    def step(state: _State) -> _State:
        t, t_next, y, code = state.t, state.t_next, state.y, state.code
        h = t_next - t
        system = linearise(model, f, unravel, mass, t, y)
        y1, error, dense = solver.attempt(system, t, y, h, factorise(system, h, solver.gamma))
        ratio = error_ratio(y, y1, error, controls)
        keep, dt, code = next_step(t, t_next, ratio, solver.error_order, controls, code)

        def interpolate(theta):
            return unravel(solver.interpolate(dense, y, y1, theta))

        def evaluate_at(t_save):
            return interpolate((t_save - t) / h)

        if table is None:
            saved, ys = save_dense(
                ts, keep, t_next, unravel(y1), state.saved, state.ys, evaluate_at
            )
            t_new, t_next_new = advance_time(keep, t, t_next, dt, t1, t1_floor)
            y_new, extra = jnp.where(keep, y1, y), {}
        else:
            found = _event_in_step(
                table, model, t, h, interpolate, state, keep, unravel(y1), code, time_scale
            )
            code = found.code
            saved, ys = save_dense(
                ts, keep, found.t_end, found.y_end, state.saved, state.ys, evaluate_at
            )
            t_new, t_next_new = advance_time(keep, t, found.t_end, dt, t1, t1_floor)
            y_new = jnp.where(keep, ravel_pytree(found.y_after)[0], y)
            done = state.done | found.stop | (keep & (t_new >= t1))
            extra = dict(g=found.g, records=found.records, done=done)
        return _State(
            t=t_new,
            t_next=t_next_new,
            y=y_new,
            ys=ys,
            saved=saved,
            accepted=state.accepted + keep.astype(jnp.int32),
            rejected=state.rejected + (~keep).astype(jnp.int32),
            code=code,
            **extra,
        )

    def going(state: _State):
        steps = state.accepted + state.rejected
        more = unfinished(state.t, t1, steps, max_steps, state.code)
        return more if state.done is None else more & ~state.done

    zero = jnp.array(0, jnp.int32)
    init = _State(
        t=t0,
        t_next=jnp.minimum(t0 + first_step(controls, dtype), t1),
        y=y0_flat,
        ys=empty_outputs(y0, ts.shape[0]),
        saved=jnp.array(1, jnp.int32),
        accepted=zero,
        rejected=zero,
        code=jnp.array(RESULTS.successful, jnp.int32),
    )
    if table is not None:
        g0, untracked, code0 = table.start(model, t0, y0, time_scale)
        # outputs after a terminal event are NaN, as in the other event loops
        ys = jax.tree.map(lambda b: jnp.where(jnp.isinf(b), jnp.nan, b), init.ys)
        init = init._replace(
            ys=ys, code=code0, g=g0, records=Records.empty(events, y0, dtype), done=untracked
        )
    final = step_loop(going, step, init, buffers=lambda state: state.ys)
    if table is None:
        return _Out(final.ys, final_code(final.t, t1, final.code), final.accepted, final.rejected)
    stopped_early = final.done & (final.t < t1)  # a terminal event (or a limit) ended it
    code = jnp.where(stopped_early, final.code, final_code(final.t, t1, final.code))
    reached = jnp.arange(ts.shape[0], dtype=jnp.int32) < final.saved
    return _Out(final.ys, code, final.accepted, final.rejected, final.records, reached)


class _EventStep(NamedTuple):
    """Where an attempted step ends with events: the located event or its own end."""

    t_end: Array  # the event's time, or t + h
    y_end: PyTree  # the state there, before a reset
    y_after: PyTree  # the state the next step starts from (after a reset)
    g: tuple  # the condition values the next crossing test starts from
    records: Records  # every occurrence so far
    stop: Array  # bool: the member stops here (terminal event, limit, lost condition)
    code: Array  # int32 RESULTS code


def _event_in_step(table, model, t, h, interpolate, state: _State, keep, y1, code, time_scale):
    """The event logic of the attempted step from t to t + h (`y1`, a pytree, at its end):
    whether the accepted step crossed an event's condition, the earliest crossing located on
    the method's dense output `interpolate(theta)`, its record and reset."""
    events = table.events
    t_next = t + h
    g1 = tuple(evaluate(e, t_next, y1) for e in events)
    counts = state.records.counts
    watched = table.watched(counts)
    live = ~state.done & keep
    hits = [live & crossed(e, state.g[i], g1[i]) & watched[i] for i, e in enumerate(events)]
    any_hit = jnp.any(jnp.stack(hits))
    no = jnp.array(False)
    plain = (t_next, y1, y1, g1, state.records, no, no)

    def event():
        which, t_ev, y_ev = locate(events, t, h, interpolate, state.g, g1, hits)
        over = table.over_limit(any_hit, which, counts)
        y_after = table.after(which, ~over, t_ev, y_ev)
        g_after = table.restart(model, t_ev, y_after, time_scale)
        records = state.records.add(which, any_hit & ~over, t_ev, y_ev, events)
        stops = table.stops(any_hit, which, over)
        located = (t_ev, y_ev, y_after, g_after, records, stops, over)
        return jax.tree.map(lambda a, b: jnp.where(any_hit, a, b), located, plain)

    # the root finding, and the writes into the records (scatters under vmap), only run on
    # steps where some member crossed
    t_end, y_end, y_after, g_new, records, stops, over = lax.cond(
        eqxi.unvmap_any(any_hit), event, lambda: plain
    )
    lost = live & table.lost(g1, y1)
    code = jnp.where(live, table.code(code, over, lost), code)
    g_new = tuple(jnp.where(keep, a, b) for a, b in zip(g_new, state.g))
    return _EventStep(t_end, y_end, y_after, g_new, records, stops | lost, code)
