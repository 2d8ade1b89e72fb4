"""Step-size control shared by diffsim's own adaptive loops (the lean loop of the explicit
pairs, `erk_loop`, and the Rosenbrock loop, `rosenbrock_loop`): the first step, the error norm,
the integral controller with diffrax's `PIDController` defaults, the clipping of the last step
to t1, and writing the save times a step passes from its dense output."""

from typing import NamedTuple

import equinox.internal as eqxi
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array

from .._results import RESULTS
from .._solver.adaptive import warn_unresolved_tolerance
from .._validate import check_positive_number, check_static_count, describe, is_traced
from .common import guard_inputs
from .families import SolveRequest


def rms(tree):
    """The root mean square over every component of `tree`; 0 for a state without components
    (0/0 would make every step's error NaN, and every step rejected)."""
    leaves = [jnp.abs(x) ** 2 for x in jax.tree.leaves(tree)]
    size = sum(x.size for x in leaves)
    if size == 0:
        return jnp.zeros((), leaves[0].dtype if leaves else float)
    return jnp.sqrt(sum(jnp.sum(x) for x in leaves) / size)


def scale_tree(f, tree):
    return jax.tree.map(lambda x: f * x, tree)


def initial_step(error_order: int, vector_field, t0, t1, y0, rtol, atol):
    """The first step of an adaptive solve from t0 to t1 when none is given: Hairer's rule
    (Hairer, Nørsett & Wanner, Solving ODEs I, II.4), as diffrax's `_select_initial_step`
    writes it, for a method whose error estimate is O(h^error_order), with its trial step kept
    inside the span (as scipy's `select_initial_step` since gh-17341): the vector field is not
    evaluated beyond t1, where it may not be defined. (diffrax 0.7 never applies that rule
    itself: it receives its terms wrapped, and starts every solve with 0.01 whatever the time
    scale. `simulate` passes this step to diffrax as well, so that solves that run in diffrax
    take the same steps as the lean loop.)"""
    f0 = vector_field(t0, y0)
    scale = jax.tree.map(lambda y: atol + jnp.abs(y) * rtol, y0)
    ratio = lambda a: jax.tree.map(lambda x, s: x / s, a, scale)  # noqa: E731
    d0, d1 = rms(ratio(y0)), rms(ratio(f0))
    small = (d0 < 1e-5) | (d1 < 1e-5)
    h0 = jnp.where(small, 1e-6, 0.01 * (d0 / jnp.where(small, 1, d1)))
    span = t1 - t0
    h0 = jnp.minimum(h0, span)
    f1 = vector_field(t0 + h0, jax.tree.map(lambda y, k: y + h0 * k, y0, f0))
    d2 = rms(ratio(jax.tree.map(lambda a, b: a - b, f1, f0))) / h0
    max_d = jnp.maximum(d1, d2)
    h1 = jnp.where(
        max_d <= 1e-15, jnp.maximum(1e-6, h0 * 1e-3), (0.01 / max_d) ** (1 / error_order)
    )
    return lax.stop_gradient(jnp.minimum(jnp.minimum(100 * h0, h1), span).astype(t0.dtype))


class Controls(NamedTuple):
    """The step-size controller's settings, traced (new ones do not recompile)."""

    rtol: Array
    atol: Array  # a scalar, or one tolerance per component of an array state
    dtmin: Array | None  # the solve stops with step_size_collapsed below it
    dtmax: Array | None  # no step is longer
    dt0: Array  # the first step
    step_to_outputs: bool = False  # static: every output time ends a step
    constant_step: bool = False  # static: every step is dt0 (no error control)


def end_floor(t1):
    """The time above which a step is stretched to end at t1. diffrax rounds a step ending
    within 100 ULPs of t1 to end at t1 (it counts them down one by one; here from the spacing
    above t1: the same but at a power of two, twice as wide)."""
    t1_fixed = lax.stop_gradient(t1)  # the spacing is a constant (nextafter has no derivative)
    spacing = jnp.nextafter(t1_fixed, jnp.array(jnp.inf, t1.dtype)) - t1_fixed
    # an open end (t1 = inf, a solve stopped by its terminal event) is never reached
    return jnp.where(jnp.isfinite(t1), t1 - 100 * jnp.where(jnp.isfinite(spacing), spacing, 0), t1)


def first_step(controls: Controls, dtype):
    dt0 = jnp.asarray(controls.dt0, dtype)
    return dt0 if controls.dtmin is None else jnp.maximum(dt0, controls.dtmin)


def error_ratio(y, y1, error, controls: Controls):
    """The RMS over the state's components of the error estimate over atol + rtol·max(|y|,
    |y1|): the step is accepted below 1. NaN errors count as infinite (a step that blew up is
    rejected and shrinks)."""
    rtol, atol = controls.rtol, controls.atol
    error = jax.tree.map(lambda e: jnp.where(jnp.isnan(e), jnp.inf, e), error)

    def scaled(y, y1, e):
        y1 = jnp.where(jnp.isnan(y1).any(), y, y1)
        return e / (atol + jnp.maximum(jnp.abs(y), jnp.abs(y1)) * rtol)

    return rms(jax.tree.map(scaled, y, y1, error))


def next_step(t, t_next, ratio, error_order: int, controls: Controls, code):
    """Accept or reject the attempt from t to t_next with error `ratio`: (keep, the next step,
    code: step_size_collapsed when that step falls below dtmin). Integral control with
    diffrax's defaults: safety 0.9, factors within [0.2, 10], at most 0.9 after a rejection."""
    if controls.constant_step:
        return jnp.array(True), lax.stop_gradient(controls.dt0.astype(t.dtype)), code
    keep = ratio < 1
    factor = jnp.clip(
        0.9 * (1 / ratio) ** (1 / error_order),
        jnp.where(keep, 1.0, 0.2),
        jnp.where(keep, 10.0, 0.9),
    )
    dt = lax.stop_gradient((t_next - t) * factor.astype(t.dtype))
    if controls.dtmax is not None:
        dt = jnp.minimum(dt, controls.dtmax)
    if controls.dtmin is not None:
        code = jnp.where(dt < controls.dtmin, RESULTS.step_size_collapsed, code)
        dt = jnp.maximum(dt, controls.dtmin)
    return keep, dt, code


def advance_time(keep, t, t_next, dt, t1, t1_floor):
    """(the time reached, where the next attempt ends): a step that would end just short of t1
    ends at t1; after a rejection near t1, half the way there."""
    t_new = jnp.where(keep, t_next, t)
    t_next_new = t_new + dt
    t_next_new = jnp.where(
        t_next_new > t1_floor, jnp.where(keep, t1, t_new + 0.5 * (t1 - t_new)), t_next_new
    )
    return t_new, t_next_new


def empty_outputs(y0, n: int):
    """The output buffer (n,) + state shape: y0 first, inf where not reached (as diffrax's)."""
    return jax.tree.map(lambda y: jnp.full((n,) + y.shape, jnp.inf, y.dtype).at[0].set(y), y0)


def save_dense(ts, keep, t_next, y1, saved, ys, evaluate, kind: str = "lax"):
    """Write every save time that the accepted step ending at t_next passed, from the step's
    dense output `evaluate(t)` (y1 itself at t_next). Only the final time when len(ts) == 2:
    no save loop to run or compile. `kind` as `step_loop`'s.

    `ys` may be the loop's buffers (`step_loop`): they are only written, row by row, so that
    under `jax.vmap` a write touches one row rather than selecting the whole buffer."""
    n = ts.shape[0]
    if n == 2:
        done = keep & (t_next >= ts[-1])
        saved = jnp.where(done, 2, saved).astype(saved.dtype)  # what `reached` is read from
        return saved, jax.tree.map(lambda y, buf: buf.at[1].set(y, pred=done), y1, ys)

    def save_more(carry):
        index, _ = carry
        return keep & (index < n) & (ts[jnp.minimum(index, n - 1)] <= t_next)

    def save(carry):
        index, ys = carry
        t_save = ts[index]
        value = evaluate(t_save)
        # at the step's end y1 itself, with the interpolant's derivative: where the end moves
        # with an input (a delay equation's breakpoint t0 + kτ, or a step of its grid after
        # one) and an output time lies on it, y1's derivative is along the moving end, d y/dτ
        # off by k·y'(t) (Tsit5, τ = 1 and outputs every 0.1: −0.80 at t = 1 where it is 0)
        at_end = jax.tree.map(lambda a, b: b + lax.stop_gradient(a - b), y1, value)
        value = jax.tree.map(lambda a, b: jnp.where(t_save == t_next, a, b), at_end, value)
        # the values first: a buffer is a pytree of its own
        return index + 1, jax.tree.map(lambda v, buf: buf.at[index].set(v), value, ys)

    return eqxi.while_loop(
        save_more,
        save,
        (saved, ys),
        max_steps=n,
        buffers=lambda carry: carry[1],
        kind=kind,
        checkpoints=n if kind == "checkpointed" else None,
    )


def step_loop(going, step, init, buffers, *, kind: str = "lax", max_steps: int | None = None):
    """The loop of an adaptive solve: `lax.while_loop` semantics, with the output `buffers`
    (a function of the carry) written in place. Under `jax.vmap` a plain while loop selects
    its whole carry between old and new on every iteration (the predicate is batched), which
    made a solve with many save times quadratic in their number (5,120 members, 401 outputs:
    5.0 s against 0.31 s); equinox's buffers are exempt from that selection.

    `kind` is equinox's: "lax" (differentiable forward), "checkpointed" (reverse, with
    O(√max_steps) checkpoints: the memory of a reverse pass does not grow with the steps
    taken) or "bounded" (both, nested scans over `max_steps`: second derivatives through a
    reverse pass)."""
    return eqxi.while_loop(
        going,
        step,
        init,
        buffers=buffers,
        kind=kind,
        max_steps=None if kind == "lax" else max_steps,
    )


def unfinished(t, t1, steps, max_steps: int, code):
    return (t < t1) & (steps < max_steps) & (code == RESULTS.successful)


def final_code(t, t1, code):
    """The result code of a finished loop: max_steps_reached when it stopped short of t1."""
    short = (code == RESULTS.successful) & (t < t1)
    return jnp.where(short, RESULTS.max_steps_reached, code).astype(jnp.int32)


def check_adaptive_request(solver, request: SolveRequest):
    """The checks of `simulate`'s options every adaptive family shares; returns the first
    step `dt` as an array (or None)."""
    dt = request.dt
    if request.steps_per_save is not None or request.checkpoint != "auto":
        raise ValueError(
            "steps_per_save and checkpoint apply to fixed-step solvers; an adaptive solver "
            "chooses its steps (its derivatives are set by adjoint)"
        )
    check_positive_number("dt", dt)
    if solver.constant_step and dt is None:
        raise ValueError(
            f"{type(solver).__name__}(constant_step=True) steps by dt: pass simulate(..., dt=...)"
        )
    check_static_count("max_steps", request.max_steps)
    warn_unresolved_tolerance(solver, request.dtype)
    _check_tolerance_shape(solver, request.y0)
    if dt is not None and not is_traced(dt):
        # an array, not a Python float: the jitted solve would treat a float as static and
        # compile again for every new initial step
        dt = jnp.asarray(dt, request.ts.dtype)
    return dt


def prepare(solver, error_order: int, model, y0, ts, dt0):
    """The traced input guard (`common.guard_inputs`) and the step-size controls of an
    adaptive solve: (valid, model, y0, ts, `Controls`), with Hairer's first step when `dt0` is
    None."""
    dtype = ts.dtype
    rtol, atol = solver.rtol.astype(dtype), solver.atol.astype(dtype)
    tolerances_ok = jnp.all((rtol >= 0) & (atol >= 0) & ((rtol > 0) | (atol > 0)))
    dtmin = None if solver.dtmin is None else solver.dtmin.astype(dtype)
    dtmax = None if solver.dtmax is None else solver.dtmax.astype(dtype)
    # traced step bounds (concrete ones are checked when the solver is made): dtmin > dtmax
    # would fail the first step as "below dtmin", blaming stiffness
    bounds_ok = True if dtmin is None or dtmax is None else dtmin <= dtmax
    valid, model, y0, ts = guard_inputs(model, y0, ts, tolerances_ok & bounds_ok)
    # replaced only when they are bad themselves: shared tolerances stay unbatched under vmap
    rtol = jnp.where(tolerances_ok, rtol, 1e-3)
    atol = jnp.where(tolerances_ok, atol, 1e-6)
    if dt0 is None:
        dt0 = initial_step(error_order, model.vector_field, ts[0], ts[-1], y0, rtol, atol)
    dt0 = jnp.asarray(dt0, dtype)
    if dtmax is not None:
        dt0 = jnp.minimum(dt0, dtmax)
    # constant steps run on their own grid (diffrax's ConstantStepSize): outputs between them
    # come from the dense output
    to_outputs = solver.steps_to_outputs and not solver.constant_step
    controls = Controls(rtol, atol, dtmin, dtmax, dt0, to_outputs, solver.constant_step)
    return valid, model, y0, ts, controls


def _check_tolerance_shape(solver, y0) -> None:
    """An array `rtol` or `atol` has one tolerance per component of an array state (or
    broadcasts against it)."""
    for name in ("rtol", "atol"):
        tolerance = getattr(solver, name)
        if jnp.ndim(tolerance) == 0:
            continue
        leaves = jax.tree.leaves(y0)
        shape = leaves[0].shape if len(leaves) == 1 else None
        try:
            fits = shape is not None and np.broadcast_shapes(jnp.shape(tolerance), shape) == shape
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(
                f"{type(solver).__name__}({name}=...) has shape {jnp.shape(tolerance)}, which "
                f"does not fit the state ({describe(y0)}): give a scalar, or one tolerance per "
                "component of an array state"
            )
