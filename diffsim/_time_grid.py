"""Output times and the static step plan of fixed-step solvers.

A fixed-step solve takes a static number of steps per output interval, so that the whole run is one
`lax.scan` of known length. The count is derived here, in Python, from a concrete `ts` (a constant
array closed over by the user's `jit` is concrete), or given as `steps_per_save` when `ts` is
traced.
"""

from typing import NamedTuple

import numpy as np

from ._validate import check_positive_number, check_static_count, is_traced

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


def check_ts(ts) -> None:
    """Shape checks always; value checks when `ts` is concrete."""
    if np.ndim(ts) != 1:
        raise ValueError(f"ts must be a 1-D array of output times, got shape {np.shape(ts)}")
    if np.shape(ts)[0] < 2:
        raise ValueError(
            "ts must hold the initial time and at least one later output time; got "
            f"{np.shape(ts)[0]} time(s). Example: ts = jnp.linspace(0.0, 10.0, 101)"
        )
    if is_traced(ts):
        return
    values = np.asarray(ts, dtype=np.float64)
    if not np.all(np.isfinite(values)):
        raise ValueError(
            f"ts must be finite; got NaN or inf at index {int(np.argmin(np.isfinite(values)))}"
        )
    steps = np.diff(values)
    if not np.all(steps > 0):
        i = int(np.argmin(steps > 0))
        raise ValueError(
            f"ts must be strictly increasing (t1 > t0); ts[{i + 1}] = {values[i + 1]} follows "
            f"ts[{i}] = {values[i]}. Integration backwards in time is not supported: substitute "
            "s = -t in the model instead."
        )


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
    eps = (
        float(np.finfo(np.asarray(ts).dtype).eps)
        if np.issubdtype(np.asarray(ts).dtype, np.floating)
        else 0.0
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
            f"{solver_name} is a fixed-step solver: pass dt=<step size> (it must divide every "
            "interval of ts into whole steps) or steps_per_save=N"
        )
    ratios = intervals / float(dt)
    counts = np.rint(ratios)
    magnitude = np.abs(np.asarray(ts, dtype=np.float64))
    slack = (
        _ULPS
        * max(eps, np.finfo(np.float64).eps)
        * (magnitude[:-1] + magnitude[1:] + counts * float(dt))
    )
    misfit = np.abs(intervals - counts * float(dt)) > slack
    if np.any(misfit | (counts < 1)):
        i = int(np.argmax(misfit | (counts < 1)))
        interval, ratio = intervals[i], ratios[i]
        lower, upper = max(int(np.floor(ratio)), 1), int(np.floor(ratio)) + 1
        raise ValueError(
            f"dt={dt} does not divide the output interval ts[{i + 1}] - ts[{i}] = {interval:.6g} "
            f"into whole steps ({ratio:.9g} steps). Choose dt so that every interval is a whole "
            f"number of steps, e.g. dt={interval / upper:.6g} ({upper} steps) or "
            f"dt={interval / lower:.6g} ({lower} steps), or pass steps_per_save=N for N equal "
            "steps per interval."
        )
    counts = counts.astype(np.int64)
    if np.all(counts == counts[0]):
        return StepPlan(int(counts[0]), None)
    return StepPlan(int(counts.max()), counts.astype(np.int32))
