"""A `ds.Problem` as the subject of a global-sensitivity design (`ds.sobol(problem, ...)`,
`ds.morris(problem, ...)`): its unknowns' ranges on their scales, and a quantity of its
predictions (or its log-likelihood) evaluated at every point of a design, chunk by chunk in
one compiled program (the experiments of each point as one batch, as a fit runs them)."""

import math
from collections.abc import Mapping

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._progress import progress_bar
from .study_objective import (
    negative_log_likelihood,
    observe,
    row_states,
    scaled_on_host,
    to_natural_values,
)


def problem_ranges(caller: str, problem, ranges, extras: dict):
    """(names, lows, highs) on each unknown's scale: `ranges` None (every estimated unknown
    within its bounds), a list of names (those, within their bounds) or a dict name →
    (low, high) in natural units. A log-scale unknown is thus sampled uniformly in its
    logarithm, as a fit screens it."""
    given = [k for k, v in extras.items() if v is not None]
    if given:
        raise TypeError(
            f"{caller}: {', '.join(given)} belong to a model; a ds.Problem brings its own "
            "(its experiments' initial states, times and solver)"
        )
    if ranges is None:
        ranges = list(problem.names)
    if isinstance(ranges, Mapping):
        items = list(ranges.items())
    elif isinstance(ranges, (list, tuple)):
        items = [(name, None) for name in ranges]
    else:
        raise TypeError(
            f"{caller}: ranges of a ds.Problem must be None (every estimated unknown within "
            f"its bounds), a list of unknowns or a dict name -> (low, high), got {ranges!r}"
        )
    if not items:
        raise ValueError(f"{caller}: the problem estimates nothing, so nothing can vary")
    names, low, high = [], [], []
    for name, bounds in items:
        if name not in problem.names:
            raise ValueError(
                f"{caller}: {name!r} is not an estimated unknown of the problem "
                f"({', '.join(problem.names)})"
            )
        unknown = problem.unknowns[name]
        if bounds is None:
            bounds = unknown.bounds
        try:
            lo, hi = (float(v) for v in bounds)
        except (TypeError, ValueError):
            raise ValueError(
                f"{caller}: ranges[{name!r}] must be a pair (low, high) of numbers, got {bounds!r}"
            ) from None
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(
                f"{caller}: {name!r} ranges over ({lo}, {hi}); give finite bounds, low < high "
                "(ranges={name: (low, high)} or the unknown's bounds)"
            )
        bound_lo, bound_hi = unknown.bounds  # floats, ±inf where open (`Unknown` says so)
        if lo < bound_lo or hi > bound_hi:
            raise ValueError(
                f"{caller}: {name!r} ranges over ({lo}, {hi}), beyond its bounds "
                f"{unknown.bounds}: a range narrows the bounds (widen the unknown's bounds "
                "to explore further)"
            )
        if unknown.scale != "lin" and lo <= 0:
            raise ValueError(
                f"{caller}: {name!r} is on a {unknown.scale} scale, so its range must be "
                f"positive, got ({lo}, {hi})"
            )
        names.append(name)
        low.append(float(unknown.to_scale(lo)))
        high.append(float(unknown.to_scale(hi)))
    return tuple(names), np.asarray(low), np.asarray(high)


def run_problem_design(
    caller: str, problem, names, design, *, reduce, chunk_size=None, progress=True
) -> np.ndarray:
    """The quantity at every row of `design` (points, names) on the unknowns' scales:
    `reduce` = "llh" (the log-likelihood) or a function of a dict experiment name → its
    predictions (one per measurement, in its data's order) to a scalar. Raises when the
    quantity is not a scalar or a point's simulation failed."""
    if not (reduce == "llh" or callable(reduce)):
        raise TypeError(
            f"{caller}: reduce of a ds.Problem must be 'llh' or a function of a dict "
            f"experiment name -> predictions to a scalar, got {reduce!r}"
        )
    points = design.shape[0]
    chunk = min(points, 256 if chunk_size is None else int(chunk_size))
    if chunk < 1:
        raise ValueError(f"{caller}: chunk_size must be a positive int, got {chunk_size!r}")
    dtype = jnp.result_type(float)
    base = scaled_on_host(problem.theta(), problem.tables.scales)
    index = np.asarray([problem.names.index(n) for n in names])
    # every chunk of one shape (the last padded with its own last point): one program
    count = -(-points // chunk)
    padded = np.concatenate([design, np.repeat(design[-1:], count * chunk - points, axis=0)])
    values = []
    bar = progress_bar(points, enabled=progress, description=caller, unit="point")
    try:
        for k in range(count):
            rows = jnp.asarray(padded[k * chunk : (k + 1) * chunk], dtype)
            out = _quantities(problem, reduce, jnp.asarray(base, dtype), index, rows)
            if out.ndim != 1:
                raise ValueError(
                    f"{caller}: reduce must return one number per point (a scalar), got an "
                    f"array of shape {out.shape[1:]}"
                )
            values.append(np.asarray(out, np.float64))
            bar.update(min(chunk, points - k * chunk))
    finally:
        bar.close()
    values = np.concatenate(values)[:points]
    failed = ~np.isfinite(values)
    if failed.any():
        raise ValueError(
            f"{caller}: at {int(failed.sum())} of {values.size} points the quantity is NaN or "
            "inf (a simulation failed); the indices need every one. Narrow the ranges or "
            "choose a solver that suits the whole box (ds.Problem(solver=, max_steps=))"
        )
    return values


# XLA's default emitters, not diffsim's faster-compiling ones (`_compile.py`): as a sweep's
# chunk, a design's points are many `vmap`ped solves whose run is the wall time
@eqx.filter_jit
def _quantities(problem, reduce, base, index, rows):
    tables = problem.tables
    offsets = np.cumsum([0] + [len(r.time) for r in problem.rows])

    def one(point):
        theta = to_natural_values(base.at[index].set(point), tables.scales)
        if isinstance(reduce, str):
            return -negative_log_likelihood(problem, theta)[0]
        states = row_states(problem, theta, theta.dtype)
        predictions, _ = observe(problem, theta, states, theta.dtype)
        per_experiment = _ByExperiment(
            (name, predictions[offsets[i] : offsets[i + 1]])
            for i, name in enumerate(problem.experiment_names)
        )
        return jnp.asarray(reduce(per_experiment), theta.dtype)

    return jax.vmap(one)(rows)


class _ByExperiment(dict):
    """Experiment name → predictions, for `reduce`; a name it lacks lists those it has."""

    def __missing__(self, key):
        raise KeyError(f"{key!r} is no experiment of the problem; its experiments: {list(self)}")
