"""The members of a sweep on the host: the axes a user names, checked and copied.

A grid sweep's members form an array with one dimension per axis (the Cartesian product, in the
dict's order); zipped `ds.Samples` form a single `sample` dimension. `Axes` holds each name's
values with their leading axis along that name's dimension, as NumPy copies taken once, so a
caller who later changes their arrays cannot change a running or resumed sweep.
"""

import dataclasses
import math

import jax
import numpy as np

from .samples import Samples

SAMPLE_DIM = "sample"


@dataclasses.dataclass(frozen=True)
class Axes:
    """The sweep's members on the host: `dims`/`shape` of the member array, each axis name's
    values (leading axis over that axis's positions) and the dimension it runs along."""

    kind: str  # "grid" or "samples"
    names: tuple[str, ...]
    values: dict[str, np.ndarray]
    dims: tuple[str, ...]
    shape: tuple[int, ...]

    @classmethod
    def build(cls, axes) -> "Axes":
        """Check `ds.sweep`'s `axes` argument (a dict name → 1-D array, or `ds.Samples`)."""
        if isinstance(axes, Samples):
            values = dict(axes.values)
            return cls("samples", tuple(values), values, (SAMPLE_DIM,), (len(axes),))
        if not isinstance(axes, dict) or not axes:
            raise TypeError(
                "axes must be a non-empty dict name -> 1-D array (a grid) or ds.Samples({...}) "
                f"(zipped samples), got {axes!r}"
            )
        values = {str(name): _grid_axis(name, value) for name, value in axes.items()}
        names = tuple(values)
        return cls("grid", names, values, names, tuple(v.shape[0] for v in values.values()))

    @property
    def num_members(self) -> int:
        return math.prod(self.shape)

    def values_at(self, positions: tuple[np.ndarray, ...]) -> dict[str, np.ndarray]:
        """Per-member values of every name for the members at grid `positions` (one index array
        per dimension)."""
        if self.kind == "samples":
            return {name: v[positions[0]] for name, v in self.values.items()}
        return {name: self.values[name][positions[i]] for i, name in enumerate(self.names)}


def _grid_axis(name, value) -> np.ndarray:
    if not isinstance(value, (list, tuple, np.ndarray, jax.Array)):
        raise TypeError(
            f"sweep axis {name!r} must be a list or an array of values, got "
            f"{type(value).__name__} (a set or a generator has no order: pass a list)"
        )
    try:
        array = np.array(value)  # a copy: the result must not change with the caller's
    except ValueError:
        raise ValueError(
            f"sweep axis {name!r}: its values have different shapes; every value along "
            "an axis must have the same shape"
        ) from None
    if array.dtype.kind not in "iuf":
        raise TypeError(
            f"sweep axis {name!r} must hold real numbers, got dtype {array.dtype}"
            + (" (complex)" if array.dtype.kind == "c" else "")
        )
    if array.ndim == 0 or array.shape[0] == 0:
        raise ValueError(
            f"sweep axis {name!r} must be a non-empty array of values along the axis, "
            f"got shape {array.shape}"
        )
    return array
