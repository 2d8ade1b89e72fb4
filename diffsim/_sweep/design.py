"""What the global-sensitivity designs (`ds.sobol`, `ds.morris`) share: their parameter ranges
checked, and a design's points run as one `ds.sweep` down to one finite number each (or, for
a `ds.Problem`, evaluated by `_fit/study_design.py`)."""

import numpy as np

from .samples import Samples
from .sweep import sweep


def check_ranges(caller: str, ranges):
    """(names, lows, highs) of `ranges` (dict name → (low, high)), each pair finite, low < high."""
    if not isinstance(ranges, dict) or not ranges:
        raise ValueError(
            f"{caller}: ranges must be a non-empty dict name -> (low, high), e.g. "
            "{'beta': (0.1, 0.5), 'gamma': (0.05, 0.2)}"
        )
    names, low, high = [], [], []
    for name, bounds in ranges.items():
        try:
            if isinstance(bounds, (str, bytes)):  # "01" would iterate as ("0", "1")
                raise TypeError
            lo, hi = (float(v) for v in bounds)
        except (TypeError, ValueError):
            raise ValueError(
                f"{caller}: ranges[{name!r}] must be a pair (low, high) of numbers, got {bounds!r}"
            ) from None
        if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
            raise ValueError(f"{caller}: ranges[{name!r}] = ({lo}, {hi}) needs finite low < high")
        names.append(str(name))
        low.append(lo)
        high.append(hi)
    return tuple(names), np.array(low), np.array(high)


def check_bootstrap(caller: str, bootstrap, level, seed) -> None:
    """The resamples of a design's bootstrap intervals (an int >= 0), their coverage and the
    seed of their resampling (an int >= 0), checked before any simulation runs."""
    if isinstance(bootstrap, bool) or not isinstance(bootstrap, int) or bootstrap < 0:
        raise ValueError(f"{caller}: bootstrap must be an int >= 0, got {bootstrap!r}")
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise ValueError(f"{caller}: level must be in (0, 1), got {level!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise TypeError(f"{caller}: seed must be an int >= 0, got {seed!r}")


def run_design(caller: str, model, names, design, y0, ts, *, reduce, **options) -> np.ndarray:
    """The scalar quantity `reduce(solution)` of every row of `design` (points, parameters),
    from one `ds.sweep` (`options`: its solver, dt, chunk_size, store, progress, max_steps).
    Raises when `reduce` is not a scalar or a simulation failed: an index computed without
    some of its points would be silently wrong."""
    if not callable(reduce):
        raise TypeError(
            f"{caller}: reduce must be a function solution -> scalar (the quantity whose "
            f"sensitivity is measured), got {reduce!r}"
        )
    result = sweep(
        model,
        Samples({name: design[:, j] for j, name in enumerate(names)}),
        y0,
        ts,
        reduce=reduce,
        **options,
    )
    if "output" not in result.data_vars or result["output"].ndim != 1:
        shape = None if "output" not in result.data_vars else result["output"].shape[1:]
        raise ValueError(
            f"{caller}: reduce must return one number per simulation (a scalar), got "
            f"{'a dict' if shape is None else f'an array of shape {shape}'}"
        )
    values = np.asarray(result["output"].values, dtype=np.float64)
    failed = ~np.isfinite(values)
    if failed.any():
        raise ValueError(
            f"{caller}: {int(failed.sum())} of {values.size} simulations failed (their quantity "
            "is NaN or inf; see ds.sweep_summary of the sweep); the indices need every one. "
            "Narrow the ranges, raise max_steps or use a solver that suits the whole box"
        )
    return values


# A ds.Problem answers for itself (`Problem.design_ranges`, `Problem.design_values`): _sweep
# and _fit are peers that do not import each other, so it is recognised by these methods.


def design_space(caller: str, model, ranges, y0, ts, solver):
    """(names, lows, highs) of what the design varies: `ranges` of a model's parameters, or a
    `ds.Problem`'s unknowns on their scales."""
    if callable(getattr(model, "design_ranges", None)):
        return model.design_ranges(caller, ranges, dict(y0=y0, ts=ts, solver=solver))
    missing = [name for name, v in (("y0", y0), ("ts", ts), ("solver", solver)) if v is None]
    if missing:
        raise TypeError(
            f"{caller}: {', '.join(missing)} must be given for a model (a ds.Problem brings "
            "its own)"
        )
    return check_ranges(caller, ranges)


def evaluate_design(caller: str, model, names, design, y0, ts, *, reduce, **options):
    """`run_design` for a model; for a `ds.Problem`, its quantity at each point (on the
    unknowns' scales)."""
    if not callable(getattr(model, "design_values", None)):
        return run_design(caller, model, names, design, y0, ts, reduce=reduce, **options)
    if (
        options.get("store") is not None
        or options.get("dt") is not None
        or options.get("max_steps", 100_000) != 100_000
    ):
        raise TypeError(
            f"{caller}: store, dt and max_steps apply to a model's sweep, not to a ds.Problem "
            "(its solves take the problem's solver and max_steps)"
        )
    return model.design_values(
        caller,
        names,
        design,
        reduce=reduce,
        chunk_size=options.get("chunk_size"),
        progress=options.get("progress", True),
    )
