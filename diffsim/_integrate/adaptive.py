"""Adaptive solves of `simulate`, by diffrax with a PID step-size controller, with and without
events.

Events run as segments: one diffrax solve from the last event (or t0) that stops at the next
crossing located by diffrax's root finder on its dense output; the event is then recorded, its
reset applied, and the next segment starts there. The segments are a `lax.scan` with a static
count (one per event that can restart the integration, plus one), so the diffrax loop is
compiled once.
"""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import optimistix as optx
from jax import lax

from .._events import evaluate, Records, restart_value, start_value
from .._results import RESULTS
from .._validate import all_finite
from .common import events_result, guard_inputs, leading_mask, mask_invalid, nonfinite_code
from .erk_loop import initial_step, solve_erk, supports


def _prepare(solver, inner, model, y0, ts, dt0):
    dtype = ts.dtype
    rtol, atol = solver.rtol.astype(dtype), solver.atol.astype(dtype)
    tolerances_ok = (rtol >= 0) & jnp.all(atol >= 0) & ((rtol > 0) | jnp.any(atol > 0))
    valid, model, y0, ts = guard_inputs(model, y0, ts, tolerances_ok)
    # replaced only when they are bad themselves: shared tolerances stay unbatched under vmap
    rtol = jnp.where(tolerances_ok, rtol, 1e-3)
    atol = jnp.where(tolerances_ok, atol, 1e-6)
    dtmin = None if solver.dtmin is None else solver.dtmin.astype(dtype)
    if dt0 is None:
        dt0 = initial_step(inner, model.vector_field, ts[0], y0, rtol, atol)
    dt0 = jnp.asarray(dt0, dtype)
    return valid, model, y0, ts, (rtol, atol, dtmin, dt0)


def _solve(model, y0, ts, controls, t_start, conditions, *, inner, max_steps, adjoint, directions):
    """Dispatch to the solve whose derivatives `adjoint` asks for."""
    args = (model, y0, ts, *controls, t_start, conditions)
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


@eqx.filter_jit
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
    ys, code = out["ys"], out["code"]
    code = jnp.where(code == RESULTS.successful, nonfinite_code(ys), code)
    result = jnp.where(valid, code, RESULTS.invalid_input).astype(jnp.int32)
    return mask_invalid(valid, ys), _stats(inner, out["accepted"], out["rejected"]), result


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


@eqx.filter_jit
def solve_adaptive_events(solver, model, y0, ts, dt0, events, *, max_steps: int, adjoint):
    """Adaptive solve with events; returns (ys, reached, records, stats, result)."""
    inner = solver.to_diffrax()
    valid, model, y0, ts, controls = _prepare(solver, inner, model, y0, ts, dt0)
    dtype = ts.dtype
    directions = tuple({-1: False, 0: None, 1: True}[e.direction] for e in events)
    time_scale = jnp.maximum(jnp.abs(ts[-1]), ts[-1] - ts[0])
    terminal = jnp.array([e.terminal for e in events])
    resets = jnp.array([e.reset is not None for e in events])
    limits = jnp.array([e.max_events for e in events], jnp.int32)
    # one segment per event that restarts the integration, one more to catch a reset past its
    # limit
    any_reset = any(e.reset is not None for e in events)
    segments = 1 + sum(e.max_events for e in events if not e.terminal) + int(any_reset)

    g0 = tuple(start_value(e, model, ts[0], y0, time_scale) for e in events)
    # a condition that is not finite at t0 can never be tracked
    untracked = ~jnp.all(jnp.isfinite(jnp.stack(g0)))
    init = dict(
        t=ts[0],
        y=y0,
        g=g0,
        records=Records.empty(events, y0, dtype),
        done=untracked,
        code=jnp.where(untracked, RESULTS.event_failed, RESULTS.successful).astype(jnp.int32),
        ys=jax.tree.map(lambda x: jnp.full((ts.shape[0],) + x.shape, jnp.nan, x.dtype), y0),
        filled=jnp.zeros(ts.shape[0], bool),
        accepted=jnp.array(0, jnp.int32),
        rejected=jnp.array(0, jnp.int32),
    )

    def segment(c, index):
        counts = c["records"].counts
        conditions = tuple(
            _Condition(
                e,
                c["t"],
                c["g"][i],
                jnp.asarray(e.terminal or e.reset is not None) | (counts[i] < e.max_events),
            )
            for i, e in enumerate(events)
        )
        # a finished member runs an empty segment (t1 = t0)
        t_end = jnp.where(c["done"], c["t"], ts[-1])
        out = _solve(
            model,
            c["y"],
            ts,
            controls,
            (c["t"], t_end),
            conditions,
            inner=inner,
            max_steps=max_steps,
            adjoint=adjoint,
            directions=directions,
        )
        active = ~c["done"]
        t_final, y_final = out["t_final"], out["y_final"]
        mask = jnp.stack(out["event_mask"])
        fired = active & out["event_occurred"] & jnp.any(mask)
        which = jnp.argmax(mask).astype(jnp.int32)
        after_start = jnp.where(index == 0, ts >= c["t"], ts > c["t"])
        take = active & after_start & (ts <= t_final) & ~c["filled"]
        ys = jax.tree.map(
            lambda buf, seg: jnp.where(leading_mask(take, buf), seg, buf), c["ys"], out["ys"]
        )
        over_limit = fired & resets[which] & (counts[which] >= limits[which])
        records = c["records"].add(which, fired & ~over_limit, t_final, y_final, events)
        y_next = y_final
        for i, e in enumerate(events):
            if e.reset is not None:
                y_next = jax.tree.map(
                    lambda a, b: jnp.where(fired & ~over_limit & (which == i), a, b),
                    e.reset(t_final, y_final),
                    y_next,
                )
        g_next = tuple(restart_value(e, model, t_final, y_next, time_scale) for e in events)
        # a condition that turned NaN or inf where the state is finite: diffrax would never
        # see it cross again
        lost = active & ~jnp.all(jnp.isfinite(jnp.stack(g_next))) & all_finite(y_next)
        # a reset that returned NaN or inf: nothing can be integrated from there
        broken = active & fired & ~all_finite(y_next)
        failed = (active & (out["code"] != RESULTS.successful)) | lost | broken
        code = jnp.where(failed, out["code"], c["code"])
        code = jnp.where(over_limit, RESULTS.event_limit_reached, code)
        code = jnp.where(lost, RESULTS.event_failed, code)
        code = jnp.where(broken, RESULTS.nonfinite_state, code)
        new = dict(
            t=t_final,
            y=y_next,
            g=g_next,
            records=records,
            done=c["done"] | ~fired | (fired & terminal[which]) | over_limit | failed,
            code=code.astype(jnp.int32),
            ys=ys,
            filled=c["filled"] | take,
            accepted=c["accepted"] + jnp.where(active, out["accepted"], 0),
            rejected=c["rejected"] + jnp.where(active, out["rejected"], 0),
        )
        return jax.tree.map(lambda a, b: jnp.where(active, a, b), new, c), None

    if segments == 1:  # terminal events only: no loop over segments to compile
        final, _ = segment(init, jnp.array(0, jnp.int32))
    else:
        final, _ = lax.scan(segment, init, jnp.arange(segments, dtype=jnp.int32))
    reached = final["filled"]
    ys = final["ys"]
    result = events_result(valid, ys, reached, final["code"])
    stats = _stats(inner, final["accepted"], final["rejected"])
    stats["num_events"] = jnp.sum(final["records"].counts, dtype=jnp.int32)
    return mask_invalid(valid, ys), reached & valid, final["records"], stats, result


def _diffeqsolve(
    model,
    y0,
    ts,
    rtol,
    atol,
    dtmin,
    dt0,
    span,
    conditions,
    *,
    inner,
    max_steps,
    adjoint,
    directions,
):
    """One diffrax solve saving at `ts` (clipped to `span` = (t0, t1) when given, with the
    events `conditions`); returns a dict: ys, our result code, accepted and rejected steps, and
    with events the final time and state, which event fired and whether one did."""
    # force_dtmin=False: a step that would have to be smaller than dtmin stops the solve with a
    # result code instead of being accepted with an error above the tolerance.
    controller = diffrax.PIDController(rtol=rtol, atol=atol, dtmin=dtmin, force_dtmin=False)
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
        dt0=dt0,
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
    out = dict(
        ys=solution.ys,
        code=code,
        # int32 like the lean loop's (under x64 diffrax counts in int64), so that the custom
        # JVP's primal and tangent solves return the same types
        accepted=stats["num_accepted_steps"].astype(jnp.int32),
        rejected=stats["num_rejected_steps"].astype(jnp.int32),
    )
    if conditions is not None:
        out["ys"] = solution.ys[0]
        out["t_final"] = solution.ts[1][0]
        out["y_final"] = jax.tree.map(lambda y: y[0], solution.ys[1])
        out["event_mask"] = tuple(solution.event_mask)
        out["event_occurred"] = status == diffrax.RESULTS.event_occurred
    return out


@eqx.filter_custom_jvp
def _diffeqsolve_any_order(
    model, y0, ts, rtol, atol, dtmin, dt0, span, conditions, *, inner, max_steps, directions
):
    """The default adaptive solve. Undifferentiated it runs diffrax's plain loop;
    differentiated, the rule below runs forward mode through `diffrax.DirectAdjoint`, whose
    bounded loop JAX can also transpose. So `jax.grad`, `jax.jacfwd`, `jax.jvp` and
    `jax.hessian` (forward over reverse) all work, at the cost of DirectAdjoint's slower loop.
    Undifferentiated explicit Runge–Kutta solves without events run the lean loop of
    `_adaptive_loop` instead of diffrax's: the same steps and results, at a fraction of the
    cost."""
    if conditions is None and span is None and supports(inner):
        return solve_erk(
            inner, model.vector_field, y0, ts, rtol, atol, dtmin, dt0, max_steps=max_steps
        )
    return _diffeqsolve(
        model,
        y0,
        ts,
        rtol,
        atol,
        dtmin,
        dt0,
        span,
        conditions,
        inner=inner,
        max_steps=max_steps,
        adjoint=diffrax.RecursiveCheckpointAdjoint(),
        directions=directions,
    )


@_diffeqsolve_any_order.def_jvp
def _diffeqsolve_any_order_jvp(primals, tangents, *, inner, max_steps, directions):
    def solve(*args):
        return _diffeqsolve(
            *args,
            inner=inner,
            max_steps=max_steps,
            adjoint=diffrax.DirectAdjoint(),
            directions=directions,
        )

    primal_out, tangent_out = eqx.filter_jvp(solve, primals, tangents)
    return primal_out, tangent_out
