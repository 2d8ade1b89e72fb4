"""The fixed-step families' solve (Runge–Kutta, symplectic and stochastic methods alike): the
steps planned on the output grid, run in a `lax.scan` over output intervals of `fori_loop`s over
steps (checkpointed in blocks for reverse mode), or in the event loop when there are events."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._compile import jit
from .._results import RESULTS
from .._solver.base import AbstractFixedStepSolver
from .._validate import is_count, is_traced, MAX_COUNT
from .common import advance, guard_inputs, loop_unroll, mask_invalid, nonfinite_code
from .dense import coefficients, DenseOutput, hermite_values
from .event_loop import loop_bound, solve_fixed_events
from .families import Solved, SolveRequest, solves
from .time_grid import plan_fixed_steps, warn_unresolved_step


@solves(AbstractFixedStepSolver)
def solve_fixed_family(solver: AbstractFixedStepSolver, request: SolveRequest) -> Solved:
    """Plan the steps of `request` on its output grid and run the fixed-step loop."""
    plan = plan_fixed_steps(
        request.host_ts, request.dt, request.steps_per_save, type(solver).__name__
    )
    if request.adjoint != "auto":
        raise ValueError("adjoint applies to adaptive solvers; fixed-step ones use checkpoint")
    times, events = request.ts, request.events
    total = plan.steps_per_save * (times.shape[0] - 1)
    _check_step_count(total, events)
    if not is_traced(request.host_ts):
        warn_unresolved_step(request.host_ts, plan, request.dtype)
    if request.dense and events is not None:
        raise NotImplementedError(
            "dense=True with events: a fixed-step solve keeps its steps' interpolants without "
            "events only; use an adaptive solver (ds.Tsit5, ds.Rodas5P, ...), whose dense "
            "output follows events and resets"
        )
    if events is None:
        return _solve_fixed(
            solver,
            request.model,
            request.y0,
            times,
            plan.steps,
            steps_per_save=plan.steps_per_save,
            block=_checkpoint_block(request.checkpoint, total, plan.steps_per_save),
            key=request.key,
            dense=request.dense,
        )
    counts = (
        np.full(times.shape[0] - 1, plan.steps_per_save, np.int32)
        if plan.steps is None
        else plan.steps
    )
    bound = loop_bound(events, total)
    # Short runs store every step for reverse mode: checkpoint blocks would double the compile
    # time of the event loop for memory that does not matter at this length.
    stored = request.checkpoint == "auto" and bound <= _EVENT_STEPS_STORED
    return solve_fixed_events(
        solver,
        request.model,
        request.y0,
        times,
        jnp.asarray(counts),
        events,
        grid_steps=total,
        block=None if stored else _checkpoint_block(request.checkpoint, bound, 1),
    )


# Fixed-step event loops up to this many iterations keep every step for reverse mode under
# checkpoint="auto" (~100 kB for a 10-component state and RK4's stages).
_EVENT_STEPS_STORED = 4096


def _check_step_count(total: int, events) -> None:
    """A fixed-step solve counts its steps (and the iterations of its event loop) in int32."""
    iterations = total if events is None else loop_bound(events, total)
    if iterations > MAX_COUNT:
        raise ValueError(
            f"this fixed-step solve would take {iterations:,} steps, more than its int32 step "
            f"counter holds (2**31 - 1 = {MAX_COUNT:,}): use a larger dt, or an adaptive "
            "solver, or split the time span into several simulate calls"
        )


def _checkpoint_block(checkpoint, total_steps: int, steps_per_save: int) -> int | None:
    """Steps per checkpointed block for a fixed-step run of `total_steps` steps."""
    if checkpoint is None or jax.config.jax_disable_jit:
        # Under `jax.disable_jit()` (debugging, e.g. with jax_debug_nans) every operation runs
        # on its own; a checkpointed block would run as one, hiding the operation that failed.
        return None
    if checkpoint == "auto":
        target = math.isqrt(total_steps - 1) + 1  # ceil(sqrt(total_steps))
        if steps_per_save <= target:
            return target
        # Prefer a divisor of the interval's step count near the target: no tail loop to compile.
        divisors = [
            d for d in range(max(1, target // 2), 2 * target + 1) if steps_per_save % d == 0
        ]
        return min(divisors, key=lambda d: abs(d - target)) if divisors else target
    if not is_count(checkpoint) or checkpoint < 1:
        raise ValueError(
            f"checkpoint must be 'auto', None (store every step) or an int >= 1 (steps per "
            f"checkpointed block), got {checkpoint!r}"
        )
    return int(checkpoint)


@jit
def _solve_fixed(
    solver, model, y0, ts, steps, *, steps_per_save: int, block: int | None, key, dense: bool
):
    valid, model, y0, ts = guard_inputs(model, y0, ts)
    masked = steps is not None
    counts = steps if masked else jnp.full(ts.shape[0] - 1, steps_per_save, jnp.int32)
    # index of each interval's first step in the whole solve (the Brownian path's clock)
    offsets = jnp.cumsum(counts) - counts
    # the Brownian increments' shape (stochastic methods); ODE methods' noise is None
    noise_shape = model.brownian_shape(y0) if solver.stochastic else None

    def interval(y, xs):
        t_start, t_end, count, offset = xs
        h = (t_end - t_start) / count.astype(ts.dtype)

        def one_step(j, carry):
            t = t_start + jnp.asarray(j).astype(ts.dtype) * h  # a Python int under disable_jit
            y, state = carry
            dw = solver.noise(key, offset + j, noise_shape, h)
            carry_next = solver.advance(model, t, y, h, state, dw)
            if masked:  # steps beyond this interval's own count leave the state unchanged
                carry_next = jax.tree.map(
                    lambda a, b: jnp.where(j < count, a, b), carry_next, carry
                )
            return carry_next

        # each output interval is a loop of its own (the scan over intervals saves its end), so
        # a carried evaluation starts afresh there: one more evaluation an interval
        carry = (y, solver.init(model, t_start, y))
        if dense:  # every step's start state kept (dense output stores every step anyway)

            def kept_step(carry, j):
                return one_step(j, carry), carry[0]

            (y, _), starts = lax.scan(kept_step, carry, jnp.arange(steps_per_save, dtype=jnp.int32))
            return y, (y, starts)
        y, _ = advance(one_step, carry, steps_per_save, block, loop_unroll())
        return y, y

    if block is not None and steps_per_save <= block and not dense:
        # Short intervals: reverse mode keeps one state per output time and recomputes the steps
        # of one interval at a time.
        interval = jax.checkpoint(interval)
    if ts.shape[0] == 2:
        # One output interval (e.g. only the final state is wanted): no loop over intervals,
        # which saves XLA a while loop to compile.
        _, last = interval(y0, (ts[0], ts[1], counts[0], offsets[0]))
        outs = jax.tree.map(lambda y: y[None], last)
    else:
        _, outs = lax.scan(interval, y0, (ts[:-1], ts[1:], counts, offsets))
    ys, starts = outs if dense else (outs, None)
    ys = jax.tree.map(lambda first, rest: jnp.concatenate([first[None], rest]), y0, ys)
    num_steps = jnp.sum(counts) if masked else jnp.asarray(steps_per_save * (ts.shape[0] - 1))
    stats = {"num_steps": num_steps, "num_rejected_steps": jnp.zeros_like(num_steps)}
    evals = solver.function_evals(num_steps, ts.shape[0] - 1)
    if evals is not None:
        stats["num_function_evals"] = evals
    result = jnp.where(valid, nonfinite_code(ys), RESULTS.invalid_input).astype(jnp.int32)
    pieces = None
    if dense:
        pieces = _hermite_pieces(model, ts, counts, steps_per_save, starts, ys)
        pieces = eqx.tree_at(lambda d: d.coeffs, pieces, mask_invalid(valid, pieces.coeffs))
    return Solved(mask_invalid(valid, ys), stats, result, dense=pieces)


def _hermite_pieces(model, ts, counts, steps_per_save: int, starts, ys) -> DenseOutput:
    """The dense output of a fixed-step solve: a cubic Hermite interpolant on every step from
    the states and the vector field at its ends. Steps that an uneven grid masks (beyond an
    interval's own count) are pieces of zero width at the interval's end."""
    j = jnp.arange(steps_per_save, dtype=ts.dtype)
    h = (ts[1:] - ts[:-1]) / counts.astype(ts.dtype)
    times = jnp.minimum(ts[:-1, None] + j[None, :] * h[:, None], ts[1:, None]).reshape(-1)
    times = jnp.concatenate([times, ts[-1:]])
    states = jax.tree.map(
        lambda s, y: jnp.concatenate([s.reshape((-1,) + s.shape[2:]), y[-1:]]), starts, ys
    )
    slopes = jax.vmap(model.vector_field)(times, states)
    first = lambda tree: jax.tree.map(lambda x: x[:-1], tree)  # noqa: E731
    rest = lambda tree: jax.tree.map(lambda x: x[1:], tree)  # noqa: E731

    def piece(y_a, f_a, y_b, f_b, width):
        return coefficients(hermite_values(y_a, f_a, y_b, f_b, width))

    coeffs = jax.vmap(piece)(
        first(states), first(slopes), rest(states), rest(slopes), jnp.diff(times)
    )
    count = jnp.asarray(times.shape[0] - 1, jnp.int32)
    return DenseOutput(times, coeffs, count)
