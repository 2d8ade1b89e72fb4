"""`ds.Samples`: zipped parameter samples for `ds.sweep`, and samplers that fill a box.

A grid sweep takes the Cartesian product of its axes; `Samples` instead pairs the i-th value of
every named array, so that space-filling designs (Latin hypercube, Halton) cover many parameters
with far fewer members than a grid.
"""

import math

import jax
import numpy as np

from .._quasirandom import halton_unit
from .._validate import check_key, check_static_count, is_count


class Samples:
    """Zipped samples for `ds.sweep`: member `i` takes `values[name][i]` for every name.

    **Arguments:**

    - `values`: dict name → array with a leading axis of length `n` (the number of members),
      the same for every name. Names are model fields, `"y0[i]"` (component `i` of the flattened
      initial state) or `"y0"` (whole initial states, shape `(n, *y0.shape)`).

    The sweep's result has one dimension, `sample`, with each name as a coordinate along it.
    """

    def __init__(self, values: dict):
        if not isinstance(values, dict) or not values:
            raise TypeError(
                f"Samples takes a non-empty dict name -> array of samples, got {values!r}"
            )
        arrays = {}
        for name, value in values.items():
            array = np.array(value)  # a copy: later changes to the caller's array stay out
            if array.ndim == 0 or array.shape[0] == 0:
                raise ValueError(
                    f"Samples[{name!r}] must have a leading axis of at least one sample, got "
                    f"shape {array.shape}"
                )
            arrays[str(name)] = array
        lengths = {name: a.shape[0] for name, a in arrays.items()}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"every Samples entry needs the same number of samples, got {lengths}")
        self.values = arrays

    def __len__(self) -> int:
        return next(iter(self.values.values())).shape[0]

    def __repr__(self) -> str:
        return f"Samples({list(self.values)}, n={len(self)})"

    @classmethod
    def latin_hypercube(cls, bounds: dict, n: int, *, key, log=()) -> "Samples":
        """`n` Latin-hypercube samples of the box `bounds` (name → `(low, high)`): each
        parameter's range is cut into `n` equal strata and every stratum holds exactly one
        sample, at a uniform position inside it; strata are paired across parameters by
        independent random permutations drawn from `key` (a `jax.random` key). Names in `log`
        are sampled uniformly in log space (both bounds must be > 0)."""
        check_key("key", key)
        _check_bounds_and_log(bounds, log)
        unit = _latin_hypercube_unit(key, n, len(bounds))
        return cls(_scale(unit, bounds, log))

    @classmethod
    def halton(cls, bounds: dict, n: int, *, log=(), skip: int = 0) -> "Samples":
        """`n` points of the Halton sequence (bases 2, 3, 5, …, one per parameter, in the order
        of `bounds`) scaled to the box `bounds` (name → `(low, high)`), skipping the first `skip`
        points. Deterministic and low-discrepancy; best for up to ~10 parameters (higher bases
        correlate). Names in `log` are sampled uniformly in log space."""
        _check_bounds_and_log(bounds, log)
        check_static_count("skip", skip, minimum=0)
        unit = _halton_unit(n, len(bounds), skip)
        return cls(_scale(unit, bounds, log))


def _latin_hypercube_unit(key, n: int, dims: int) -> np.ndarray:
    _check_count(n)
    columns = []
    for k in jax.random.split(key, dims):
        permute_key, jitter_key = jax.random.split(k)
        strata = np.asarray(jax.random.permutation(permute_key, n))
        jitter = np.asarray(jax.random.uniform(jitter_key, (n,), dtype=float))
        columns.append((strata + jitter) / n)
    return np.stack(columns, axis=1)


def _halton_unit(n: int, dims: int, skip: int) -> np.ndarray:
    _check_count(n)
    return halton_unit(n, dims, skip)


def _check_bounds_and_log(bounds, log) -> None:
    if not isinstance(bounds, dict) or not bounds:
        raise TypeError(f"bounds must be a non-empty dict name -> (low, high), got {bounds!r}")
    if isinstance(log, str) or not isinstance(log, (list, tuple, set)):
        raise TypeError(
            f"log must be a list of names, e.g. log=['{next(iter(bounds))}'], got {log!r}"
        )


def _scale(unit: np.ndarray, bounds: dict, log) -> dict:
    unknown = set(log) - set(bounds)
    if unknown:
        raise ValueError(f"log names {sorted(unknown)} are not in bounds {list(bounds)}")
    values = {}
    for column, (name, bound) in zip(unit.T, bounds.items()):
        low, high = _bound(name, bound)
        if name in log:
            if low <= 0:
                raise ValueError(f"log-scaled bound of {name!r} must be > 0, got {bound}")
            values[name] = np.exp(np.log(low) + column * (np.log(high) - np.log(low)))
        else:
            values[name] = low + column * (high - low)
    return values


def _bound(name, bound) -> tuple[float, float]:
    if not (isinstance(bound, (list, tuple, np.ndarray)) and len(bound) == 2) or any(
        isinstance(b, (str, bytes, bool)) for b in bound
    ):
        raise TypeError(f"bound of {name!r} must be (low, high), got {bound!r}")
    try:
        low, high = (float(b) for b in bound)
    except (TypeError, ValueError):
        raise TypeError(f"bound of {name!r} must be (low, high), got {bound!r}") from None
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ValueError(f"bound of {name!r} must be finite with low < high, got {bound!r}")
    return low, high


def _check_count(n) -> None:
    if not is_count(n):  # its own words first: the bad-input catalogue asserts them
        raise TypeError(f"the number of samples n must be an int, got {n!r}")
    check_static_count("the number of samples n", n)
