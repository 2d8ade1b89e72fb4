"""Output times and the static step plan of fixed-step solvers.

A fixed-step solve takes a static number of steps per output interval, so that the whole run is one
`lax.scan` of known length. The count is derived here, in Python, from a concrete `ts` (a constant
array closed over by the user's `jit` is concrete), or given as `steps_per_save` when `ts` is
traced.
"""

from typing import NamedTuple

import numpy as np

from .._results import PrecisionWarning
from .._validate import check_positive_number, check_static_count, is_traced
from .._warn import warn

# When is (interval / dt) a whole number? Output times carry rounding errors of a few ulps of
# their magnitude (float32 linspace(0, 10, 101) has intervals 0.1 +- 1e-6), so an interval counts
# as k steps when |interval - k*dt| is within 16 ulps of the times involved: far below any dt that
# truly does not fit, far above the rounding of linspace/arange grids.
_ULPS = 16


class StepPlan(NamedTuple):
    """`steps_per_save`: static inner loop length. `steps`: per-interval counts when the grid is
    non-uniform (each interval masks the steps it does not need), else None."""

    steps_per_save: int
    steps: np.ndarray | None


def check_ts(ts, dtype=None) -> None:
    """Shape checks always; value checks when `ts` is concrete, also in `dtype` (the precision
    the solve computes the times in: in float32, 1e8 and 1e8 + 1 are one number)."""
    if np.ndim(ts) != 1:
        raise ValueError(f"ts must be a 1-D array of output times, got shape {np.shape(ts)}")
    if np.shape(ts)[0] < 2:
        raise ValueError(
            "ts must hold the initial time and at least one later output time; got "
            f"{np.shape(ts)[0]} time(s). Example: ts = jnp.linspace(0.0, 10.0, 101)"
        )
    if np.iscomplexobj(ts):
        raise ValueError("ts must be real output times, got complex numbers")
    if is_traced(ts):
        return
    if np.asarray(ts).dtype.kind not in "biuf":
        raise TypeError(f"ts must be an array of numbers (times), got dtype {np.asarray(ts).dtype}")
    values = np.asarray(ts, dtype=np.float64)
    # the last time may be infinite (an open end that a terminal event closes: open_end)
    body = values if not np.isinf(values[-1]) else values[:-1]
    if not np.all(np.isfinite(body)) or np.isnan(values[-1]):
        bad = int(np.argmin(np.isfinite(values)))
        raise ValueError(
            f"ts must be finite (only its last time may be inf, ended by a terminal event); "
            f"got NaN or inf at index {bad}"
        )
    if np.all(values == values[0]):
        return  # an empty span: the solution is y0 at every output
    sign = 1.0 if values[-1] > values[0] else -1.0  # decreasing: integrated backwards
    i = _first_not_increasing(sign * values)
    if i is not None:
        raise ValueError(
            f"ts must be strictly increasing (or strictly decreasing, to integrate backwards "
            f"in time); ts[{i + 1}] = {values[i + 1]} follows ts[{i}] = {values[i]}"
        )
    in_dtype = None if dtype is None else sign * np.asarray(ts).astype(dtype)
    i = None if dtype is None else _first_not_increasing(in_dtype)
    if i is not None:
        raise ValueError(
            f"ts[{i}] = {values[i]} and ts[{i + 1}] = {values[i + 1]} are the same number in "
            f"{np.dtype(dtype).name}, the precision of y0 (the times are computed in it): use "
            "float64 (a float64 y0, with jax_enable_x64), or measure time from a nearer origin"
        )


def open_end(ts) -> bool:
    """Whether a concrete `ts` ends at ±inf: the solve runs until a terminal event."""
    return not is_traced(ts) and bool(np.isinf(np.asarray(ts, np.float64)[-1]))


def runs_backward(ts) -> bool:
    """Whether a concrete `ts` decreases (a traced `ts` must increase)."""
    return not is_traced(ts) and float(ts[-1]) < float(ts[0])


def is_empty_span(ts) -> bool:
    """Whether a concrete `ts` holds one time only (repeated): nothing to integrate."""
    return not is_traced(ts) and bool(np.all(np.asarray(ts) == np.asarray(ts)[0]))


def _first_not_increasing(values) -> int | None:
    steps = np.diff(values)
    return None if np.all(steps > 0) else int(np.argmin(steps > 0))


def plan_fixed_steps(ts, dt, steps_per_save, solver_name: str) -> StepPlan:
    if steps_per_save is not None:
        check_static_count("steps_per_save", steps_per_save)
    check_positive_number("dt", dt)
    if is_traced(ts):
        if steps_per_save is None:
            raise ValueError(
                f"{solver_name} takes a static number of steps, which cannot be derived from dt "
                "because ts is a traced value here (an argument of jit/vmap/grad). Pass "
                "steps_per_save=N (N equal steps between consecutive output times), or close over "
                "ts as a constant instead of passing it as an argument (inside a jitted function, "
                "build it with NumPy, e.g. np.linspace, which stays concrete; jnp arrays made "
                "there are traced)."
            )
        if dt is not None:
            raise ValueError(
                "ts is traced, so dt cannot be checked against it: pass steps_per_save alone"
            )
        return StepPlan(int(steps_per_save), None)
    if is_traced(dt):
        raise ValueError(
            "dt is a traced value, but the number of fixed steps must be static: pass dt as a "
            "Python float (not an argument of jit/vmap/grad), or pass steps_per_save=N"
        )
    # the rounding of the times and of dt itself (a float32 dt of 0.1 is 0.10000000149)
    eps = max(
        float(np.finfo(x.dtype).eps) if np.issubdtype(x.dtype, np.floating) else 0.0
        for x in (np.asarray(ts), np.asarray(dt))
    )
    intervals = np.diff(np.asarray(ts, dtype=np.float64))
    if steps_per_save is not None:
        if dt is not None and not np.allclose(intervals / steps_per_save, float(dt), rtol=1e-6):
            raise ValueError(
                f"dt={dt} disagrees with steps_per_save={steps_per_save} for these ts; pass one"
            )
        return StepPlan(int(steps_per_save), None)
    if dt is None:
        raise ValueError(
            f"{solver_name} is a fixed-step solver: pass dt=<longest step> (an interval of ts "
            "it does not divide takes equal shorter steps) or steps_per_save=N"
        )
    ratios = intervals / float(dt)
    counts = np.rint(ratios)
    magnitude = np.abs(np.asarray(ts, dtype=np.float64))
    slack = (
        _ULPS
        * max(eps, np.finfo(np.float64).eps)
        * (magnitude[:-1] + magnitude[1:] + counts * float(dt))
    )
    # dt is the longest step: an interval it does not divide into whole steps (data times are
    # rarely multiples of a round step) takes ceil(interval / dt) equal, shorter steps, so the
    # solve lands on every output time; an interval within rounding of k steps takes k.
    misfit = np.abs(intervals - counts * float(dt)) > slack
    counts = np.where(misfit, np.ceil(ratios), counts)
    counts = np.maximum(counts, 1)
    counts = counts.astype(np.int64)
    if np.all(counts == counts[0]):
        return StepPlan(int(counts[0]), None)
    return StepPlan(int(counts.max()), counts.astype(np.int32))


# A step below this many spacings of the floating-point numbers around the times (or the span)
# it steps through is not resolved: its rounding (up to one spacing per step) then exceeds 1/16
# of the step, and the rounding of a state's increments accumulates over ~1/(16 eps) steps.
_RESOLVED_SPACINGS = 16


def warn_unresolved_step(ts, plan: StepPlan, dtype) -> None:
    """Warn (`ds.PrecisionWarning`) when the smallest step of a fixed-step plan over the
    concrete times `ts` is below what `dtype` resolves."""
    eps = float(np.finfo(dtype).eps)
    times = np.asarray(ts, dtype=np.float64)
    intervals = np.diff(times)
    counts = plan.steps if plan.steps is not None else np.full(intervals.shape, plan.steps_per_save)
    step = float(np.min(intervals / counts))
    scale = max(float(np.max(np.abs(times))), float(times[-1] - times[0]))
    if step >= _RESOLVED_SPACINGS * eps * scale:
        return
    total = int(np.sum(counts))
    warn(
        f"the step {step:.3g} is below what {np.dtype(dtype).name} resolves over t in "
        f"[{times[0]:g}, {times[-1]:g}] (its numbers are {eps * scale:.2g} apart near "
        f"{scale:g}): the rounding of {total:,} steps can swamp the solution, and a state "
        "stops changing once a step's increment falls below its spacing. Compute in float64 "
        "(jax.config.update('jax_enable_x64', True) and a float64 y0), or take larger steps",
        PrecisionWarning,
    )
