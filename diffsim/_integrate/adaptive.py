"""Adaptive solves of `simulate` with a PID step-size controller, with and without events: the
lean loop of `erk_loop` for explicit pairs without events, diffrax otherwise; derivatives by the
forward-mode Jacobian of either loop (`_jvp_by_jacobian`).

Events run as segments: one diffrax solve from the last event (or t0) that stops at the next
crossing located by diffrax's root finder on its dense output; the event is then recorded, its
reset applied, and the next segment starts there. The segments are a `lax.scan` with a static
count (one per event that can restart the integration, plus one), so the diffrax loop is
compiled once.
"""

import functools as ft
from typing import NamedTuple

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import optimistix as optx
from jax import lax
from jaxtyping import Array, PyTree

from .._compile import jit
from .._events import crossed, evaluate, EventTable, Records, start_value
from .._results import RESULTS
from .._solver.adaptive import AbstractDiffraxMethod, is_plain_explicit_pair
from .._validate import (
    all_finite,
)
from .adaptive_loop import run_any_order, solved
from .common import events_solved, leading_mask, plain_solved, scale_of_times
from .erk_loop import ExplicitPair, solve_erk
from .families import Solved, SolveRequest, solves
from .loop_derivatives import loop_jvp
from .step_control import check_adaptive_request, prepare


@solves(AbstractDiffraxMethod)
def solve_adaptive_family(solver: AbstractDiffraxMethod, request: SolveRequest) -> Solved:
    """Check the adaptive options of `request` and run diffrax (or the lean loop), with or
    without events."""
    dt = check_adaptive_request(solver, request)
    adjoint, max_steps = request.adjoint, request.max_steps
    if not (adjoint in ("auto", "checkpoint") or isinstance(adjoint, diffrax.AbstractAdjoint)):
        raise ValueError(
            f"adjoint must be 'auto', 'checkpoint' or a diffrax adjoint, got {adjoint!r}"
        )
    arguments = (solver, request.model, request.y0, request.ts, dt)
    if request.dense and not solver.runs_own_loop(adjoint):
        own = "an explicit pair (ds.Tsit5, ds.Dopri5, ds.Dopri8) or a Rosenbrock method"
        if adjoint == "auto":  # the solver itself runs in diffrax's loop (Kvaerno5, ds.Diffrax)
            advice = f"use {own} (ds.Rodas5P for a stiff model)"
        else:
            advice = f"use adjoint='auto' (the default) with {own} (ds.Rodas5P, ...)"
        raise NotImplementedError(
            f"dense=True with {type(solver).__name__} and adjoint={adjoint!r}: this solve "
            f"runs in diffrax's loop, whose dense output diffsim does not keep; {advice}"
        )
    if request.events is not None and isinstance(adjoint, diffrax.BacksolveAdjoint):
        # diffrax's own message names SaveAt(subs=...), which the caller never wrote
        raise NotImplementedError(
            "events= with adjoint=diffrax.BacksolveAdjoint(): the backsolve adjoint cannot "
            "run between events (diffrax refuses it); use adjoint='auto' (the default) or "
            "'checkpoint'"
        )
    try:
        if request.events is None and not request.dense:
            return solve_adaptive(*arguments, max_steps=int(max_steps), adjoint=adjoint)
        if solver.runs_own_loop(adjoint):
            return solve_pair_events(
                *arguments, request.events, max_steps=int(max_steps), dense=request.dense
            )
        return solve_adaptive_events(
            *arguments, request.events, max_steps=int(max_steps), adjoint=adjoint
        )
    except TypeError as error:
        if "forward-mode autodiff" not in str(error):
            raise
        raise TypeError(
            f"adjoint={adjoint!r} supports reverse mode only (jax.grad, jax.jacrev, "
            "jax.vjp); for forward mode (jax.jvp, jax.jacfwd, jax.hessian) use "
            "simulate(..., adjoint='auto'), the default"
        ) from None


def _prepare(solver, inner, model, y0, ts, dt0):
    error_order = inner.order(diffrax.ODETerm(model.vector_field))
    return prepare(solver, error_order, model, y0, ts, dt0)


def _solve(model, y0, ts, controls, t_start, conditions, *, inner, max_steps, adjoint, directions):
    """Dispatch to the solve whose derivatives `adjoint` asks for."""
    args = (model, y0, ts, controls, t_start, conditions)
    if isinstance(adjoint, diffrax.ForwardMode):
        # forward mode only: JAX's forward mode through the loop with one tangent per
        # direction asked (the lean loop where it applies), where "auto" takes the Jacobian
        # over every differentiated input of the solve so that reverse mode can transpose it
        return _solve_plain("lax", *args, inner=inner, max_steps=max_steps, directions=directions)
    if adjoint == "auto":
        return _diffeqsolve_any_order(
            *args, inner=inner, max_steps=max_steps, directions=directions
        )
    adjoint = diffrax.RecursiveCheckpointAdjoint() if adjoint == "checkpoint" else adjoint
    return _diffeqsolve(
        *args, inner=inner, max_steps=max_steps, adjoint=adjoint, directions=directions
    )


def _stats(inner, accepted, rejected):
    stats = {"num_steps": accepted, "num_rejected_steps": rejected}
    if isinstance(inner, diffrax.AbstractERK):
        tableau = inner.tableau
        per_step = tableau.num_stages - (1 if tableau.fsal else 0)
        stats["num_function_evals"] = (accepted + rejected) * per_step
    return stats


@jit
def solve_adaptive(solver, model, y0, ts, dt0, *, max_steps: int, adjoint):
    inner = solver.to_diffrax()
    valid, model, y0, ts, controls = _prepare(solver, inner, model, y0, ts, dt0)
    out = _solve(
        model,
        y0,
        ts,
        controls,
        None,
        None,
        inner=inner,
        max_steps=max_steps,
        adjoint=adjoint,
        directions=None,
    )
    return plain_solved(valid, out.ys, out.code, _stats(inner, out.accepted, out.rejected))


@jit
def solve_pair_events(solver, model, y0, ts, dt0, events, *, max_steps: int, dense: bool):
    """An explicit pair with events, or with dense output: diffsim's adaptive loop
    (`adaptive_loop`), which locates the earliest crossing in a step on the pair's dense
    output and keeps every step's interpolant when asked."""
    inner = solver.to_diffrax()
    valid, model, y0, ts, controls = _prepare(solver, inner, model, y0, ts, dt0)
    method = ExplicitPair(inner)
    out = run_any_order(method, model, y0, ts, controls, events, max_steps=max_steps, dense=dense)
    return solved(valid, out, _stats(inner, out.accepted, out.rejected), events)


class _Condition(eqx.Module):
    """An event condition as diffrax calls it. At the segment's start it reports the value
    `restart_value` chose (so the event that just fired does not fire again at once); an event
    that is not watched any more reports a constant."""

    event: object
    t_start: jax.Array
    value_at_start: jax.Array
    watched: jax.Array

    def __call__(self, t, y, args=None, **kwargs):
        value = evaluate(self.event, t, y)
        value = jnp.where(t == self.t_start, self.value_at_start, value)
        return jnp.where(self.watched, value, jnp.ones_like(value))


class _SegmentState(NamedTuple):
    """The carry of the scan over segments (one batch member's view)."""

    t: Array  # where the next segment starts: t0 or the last event's time
    y: PyTree  # the state there (after the event's reset)
    g: tuple  # the condition values the segment's crossing test starts from
    records: Records  # every occurrence so far
    done: Array  # bool: stopped (no further event, terminal, limit, failure)
    code: Array  # int32 RESULTS code
    ys: PyTree  # the output buffer, (times,) + state shape, NaN where not reached
    filled: Array  # bool (times,): output rows written
    accepted: Array  # int32 steps over all segments
    rejected: Array  # int32


@jit
def solve_adaptive_events(solver, model, y0, ts, dt0, events, *, max_steps: int, adjoint):
    """Adaptive solve with events: segments of diffrax solves between events."""
    inner = solver.to_diffrax()
    valid, model, y0, ts, controls = _prepare(solver, inner, model, y0, ts, dt0)
    dtype = ts.dtype
    table = EventTable(events)
    directions = tuple({-1: False, 0: None, 1: True}[e.direction] for e in events)
    time_scale = scale_of_times(ts)
    # one segment per event that restarts the integration, one more to catch a reset past its
    # limit
    segments = 1 + table.restarts + int(table.any_reset)

    g0, untracked, code0 = table.start(model, ts[0], y0, time_scale)
    init = _SegmentState(
        t=ts[0],
        y=y0,
        g=g0,
        records=Records.empty(events, y0, dtype),
        done=untracked,
        code=code0,
        ys=jax.tree.map(lambda x: jnp.full((ts.shape[0],) + x.shape, jnp.nan, x.dtype), y0),
        filled=jnp.zeros(ts.shape[0], bool),
        accepted=jnp.array(0, jnp.int32),
        rejected=jnp.array(0, jnp.int32),
    )

    def segment(c: _SegmentState, index):
        counts = c.records.counts
        watched = table.watched(counts)
        conditions = tuple(_Condition(e, c.t, c.g[i], watched[i]) for i, e in enumerate(events))
        # a finished member runs an empty segment (t1 = t0)
        t_end = jnp.where(c.done, c.t, ts[-1])
        out = _solve(
            model,
            c.y,
            ts,
            controls,
            (c.t, t_end),
            conditions,
            inner=inner,
            max_steps=max_steps,
            adjoint=adjoint,
            directions=directions,
        )
        active = ~c.done
        t_final, y_final = out.t_final, out.y_final
        mask = jnp.stack(out.event_mask)
        fired = active & out.event_occurred & jnp.any(mask)
        which = jnp.argmax(mask).astype(jnp.int32)
        after_start = jnp.where(index == 0, ts >= c.t, ts > c.t)
        take = active & after_start & (ts <= t_final) & ~c.filled
        ys = jax.tree.map(
            lambda buf, seg: jnp.where(leading_mask(take, buf), seg, buf), c.ys, out.ys
        )
        # diffrax locates the condition listed first among those that changed sign in the
        # step; one that is already past its crossing at that time crossed earlier. Not
        # located, it is reported rather than lost.
        overtaken = fired & _crossed_earlier(
            table, model, c.g, watched, which, t_final, y_final, time_scale
        )
        fired = fired & ~overtaken
        over_limit = table.over_limit(fired, which, counts)
        records = c.records.add(which, fired & ~over_limit, t_final, y_final, events)
        y_next = table.after(which, fired & ~over_limit, t_final, y_final)
        g_next = table.restart(model, t_final, y_next, time_scale)
        # diffrax would never see a condition that turned NaN or inf cross again
        lost = active & table.lost(g_next, y_next)
        # a reset that returned NaN or inf: nothing can be integrated from there
        broken = active & fired & ~all_finite(y_next)
        failed = (active & (out.code != RESULTS.successful)) | lost | broken | overtaken
        code = table.code(jnp.where(failed, out.code, c.code), over_limit, lost | overtaken)
        new = _SegmentState(
            t=t_final,
            y=y_next,
            g=g_next,
            records=records,
            done=c.done | ~fired | table.stops(fired, which, counts, over_limit) | failed,
            code=jnp.where(broken, RESULTS.nonfinite_state, code).astype(jnp.int32),
            ys=ys,
            filled=c.filled | take,
            accepted=c.accepted + jnp.where(active, out.accepted, 0),
            rejected=c.rejected + jnp.where(active, out.rejected, 0),
        )
        return jax.tree.map(lambda a, b: jnp.where(active, a, b), new, c), None

    if segments == 1:  # terminal events only: no loop over segments to compile
        final, _ = segment(init, jnp.array(0, jnp.int32))
    else:
        final, _ = lax.scan(segment, init, jnp.arange(segments, dtype=jnp.int32))
    stats = _stats(inner, final.accepted, final.rejected)
    return events_solved(valid, final.ys, final.filled, final.code, stats, final.records)


def _crossed_earlier(table, model, g_start, watched, which, t, y, time_scale):
    """Whether a watched condition other than `which` (the one diffrax located at (t, y)) is
    past a crossing there: it crossed earlier in the same step. A value on zero counts as not
    crossed yet (`start_value`), so simultaneous crossings are not flagged."""
    flags = [
        (which != i) & watched[i] & crossed(e, g_start[i], start_value(e, model, t, y, time_scale))
        for i, e in enumerate(table.events)
    ]
    return jnp.any(jnp.stack(flags))


class _Segment(NamedTuple):
    """What one diffrax solve returns to the loops above."""

    ys: PyTree  # the states at the save times (inf where not reached, as diffrax's)
    code: Array  # int32 RESULTS code
    accepted: Array  # int32 accepted steps
    rejected: Array  # int32 rejected steps
    # with events: where the segment ended, which events fired there, and whether one did
    t_final: Array | None = None
    y_final: PyTree | None = None
    event_mask: tuple | None = None
    event_occurred: Array | None = None


def _diffeqsolve(
    model, y0, ts, controls, span, conditions, *, inner, max_steps, adjoint, directions
):
    """One diffrax solve saving at `ts` (clipped to `span` = (t0, t1) when given, with the
    events `conditions`), as a `_Segment`."""
    # force_dtmin=False: a step that would have to be smaller than dtmin stops the solve with a
    # result code instead of being accepted with an error above the tolerance.
    if controls.constant_step:
        controller = diffrax.ConstantStepSize()
        if isinstance(inner, diffrax.AbstractImplicitSolver):
            # the Newton iteration takes the tolerances a PID controller would have passed it
            root_finder = diffrax.VeryChord(
                rtol=controls.rtol, atol=controls.atol, norm=optx.rms_norm
            )
            inner = eqx.tree_at(lambda s: s.root_finder, inner, root_finder)
    else:
        controller = diffrax.PIDController(
            rtol=controls.rtol,
            atol=controls.atol,
            dtmin=controls.dtmin,
            dtmax=controls.dtmax,
            force_dtmin=False,
            step_ts=ts if controls.step_to_outputs else None,
        )
    t0, t1 = (ts[0], ts[-1]) if span is None else span
    event = None
    # only the final state wanted: diffrax then runs no save loop inside its step loop
    two_times = ts.shape[0] == 2 and span is None
    saveat = diffrax.SaveAt(t0=True, t1=True) if two_times else diffrax.SaveAt(ts=ts)
    if conditions is not None:
        eps = jnp.finfo(ts.dtype).eps
        tol = jnp.sqrt(eps) * 1e-2  # Newton: the next iterate is then at round-off
        scale = jnp.maximum(jnp.abs(ts[-1]), 1.0)
        event = diffrax.Event(
            conditions,
            root_finder=optx.Newton(rtol=tol, atol=tol * scale),
            direction=directions,
        )
        saveat = diffrax.SaveAt(
            subs=(diffrax.SubSaveAt(ts=jnp.clip(ts, t0, t1)), diffrax.SubSaveAt(t1=True))
        )
    solution = diffrax.diffeqsolve(
        diffrax.ODETerm(model.vector_field),
        inner,
        t0=t0,
        t1=t1,
        dt0=controls.dt0,
        y0=y0,
        saveat=saveat,
        stepsize_controller=controller,
        max_steps=max_steps,
        throw=False,
        adjoint=adjoint,
        event=event,
    )
    status = solution.result
    # With events, an explicit solver has no Newton iteration of its own: a nonlinear failure
    # is the event's root finder, which cannot locate a crossing of a condition that jumps.
    explicit = not isinstance(inner, diffrax.AbstractImplicitSolver)
    nonlinear = (
        RESULTS.event_failed
        if conditions is not None and explicit
        else RESULTS.nonlinear_solver_failed
    )
    code = jnp.select(
        [
            (status == diffrax.RESULTS.successful) | (status == diffrax.RESULTS.event_occurred),
            status == diffrax.RESULTS.max_steps_reached,
            status == diffrax.RESULTS.dt_min_reached,
            (status == diffrax.RESULTS.nonlinear_divergence)
            | (status == diffrax.RESULTS.nonlinear_max_steps_reached),
        ],
        [
            RESULTS.successful,
            RESULTS.max_steps_reached,
            RESULTS.step_size_collapsed,
            nonlinear,
        ],
        RESULTS.solver_failed,
    ).astype(jnp.int32)
    stats = solution.stats
    # int32 like the lean loop's (under x64 diffrax counts in int64), so that the custom JVP's
    # primal and tangent solves return the same types
    accepted = stats["num_accepted_steps"].astype(jnp.int32)
    rejected = stats["num_rejected_steps"].astype(jnp.int32)
    if conditions is None:
        return _Segment(solution.ys, code, accepted, rejected)
    return _Segment(
        ys=solution.ys[0],
        code=code,
        accepted=accepted,
        rejected=rejected,
        t_final=solution.ts[1][0],
        y_final=jax.tree.map(lambda y: y[0], solution.ys[1]),
        event_mask=tuple(solution.event_mask),
        event_occurred=status == diffrax.RESULTS.event_occurred,
    )


@eqx.filter_custom_jvp
def _diffeqsolve_any_order(
    model, y0, ts, controls, span, conditions, *, inner, max_steps, directions
):
    """The default adaptive solve, differentiable in every mode (`jax.jvp`, `jax.jacfwd`,
    `jax.grad`, `jax.jacrev`, `jax.hessian`). Explicit Runge–Kutta solves without events run
    the lean loop of `erk_loop`; the others diffrax's loop. The derivative rule is
    `loop_derivatives`'."""
    return _solve_plain(
        "lax",
        model,
        y0,
        ts,
        controls,
        span,
        conditions,
        inner=inner,
        max_steps=max_steps,
        directions=directions,
    )


# a loop kind of `step_control.step_loop` as the diffrax adjoint that runs diffrax's loop so
_ADJOINT_OF_KIND = {
    "lax": diffrax.ForwardMode,
    "checkpointed": diffrax.RecursiveCheckpointAdjoint,
    "bounded": diffrax.DirectAdjoint,
}


def _solve_plain(kind, model, y0, ts, controls, span, conditions, **options):
    """One solve as a `_Segment`, its loop run as `kind` (`step_control.step_loop`): the lean
    loop where it applies (an explicit pair, no events), else diffrax's `diffeqsolve` with
    `options` (`inner`, `max_steps`, `directions`) and the adjoint that runs its loop so."""
    inner = options["inner"]
    if conditions is None and span is None and is_plain_explicit_pair(inner):
        segment = solve_erk(
            inner,
            model.vector_field,
            y0,
            ts,
            controls,
            max_steps=options["max_steps"],
            kind=kind,
        )
        return _Segment(*segment)
    adjoint = _ADJOINT_OF_KIND[kind]()
    return _diffeqsolve(model, y0, ts, controls, span, conditions, adjoint=adjoint, **options)


@_diffeqsolve_any_order.def_jvp
def _diffeqsolve_any_order_jvp(primals, tangents, *, inner, max_steps, directions):
    """The tangent by `loop_derivatives.loop_jvp`: the forward-mode Jacobian of the loop for
    few inputs, a checkpointed reverse pass for many."""
    options = dict(inner=inner, max_steps=max_steps, directions=directions)

    def solve(kind, *args):
        segment = _solve_plain(kind, *args, **options)
        return (segment.ys, segment.t_final, segment.y_final), segment

    any_order = ft.partial(_diffeqsolve_any_order, **options)
    segment, (ys_t, t_final_t, y_final_t) = loop_jvp(solve, any_order, primals, tangents)
    tangent = _Segment(
        ys=ys_t,
        code=None,
        accepted=None,
        rejected=None,
        t_final=t_final_t,
        y_final=y_final_t,
        event_mask=jax.tree.map(lambda _: None, segment.event_mask),  # None stays None
        event_occurred=None,
    )
    return segment, tangent
