"""The layout of a sweep's dataset: its variables, their dimensions, coordinates and chunks.

The same `Variable` list describes the in-memory result and the zarr store, so a store and the
dataset read back from it always agree. Invariants:

- Every per-member variable has the member dimensions first (the grid axes, or `sample`), then
  the dimensions of one member's output; it is chunked by the sweep's block along the member
  dimensions and whole along the rest.
- An output's trailing dimensions are named by its reduction where the sizes fit (`time`,
  `state`), otherwise `<output>_dim<k>`; `time` and `state` get coordinates only where an
  output uses them.
- No output shares its name with a coordinate, a dimension or a per-member variable, and no
  sweep axis with an output's dimension: a clash is refused before anything runs.
"""

import numpy as np

from . import store as _store
from .axes import Axes, SAMPLE_DIM
from .chunks import ChunkPlan
from .members import MemberSpec, PER_MEMBER


def dataset_variables(
    axes: Axes, spec: MemberSpec, outputs: dict, plan: ChunkPlan
) -> list[_store.Variable]:
    """The dataset's variables: coordinates of the axes (and of time/state where used), then the
    per-member outputs, `result` and `num_steps`, chunked like the sweep."""
    variables, used_dims = [], {}
    for name, shape in outputs.items():
        if name in PER_MEMBER:
            continue
        extra = _extra_dims(name, shape.shape, spec)
        used_dims.update(zip(extra, shape.shape))
        variables.append(
            _store.Variable(
                name=name,
                dims=axes.dims + extra,
                shape=axes.shape + tuple(shape.shape),
                chunks=plan.block + tuple(shape.shape),
                dtype=np.dtype(shape.dtype),
                fill_value=_store.fill_value(shape.dtype),
            )
        )
    for name, attrs in PER_MEMBER.items():
        dtype = np.dtype(outputs[name].dtype)
        variables.append(
            _store.Variable(
                name, axes.dims, axes.shape, plan.block, dtype, _store.fill_value(dtype), attrs
            )
        )
    coordinates = [_axis_coordinate(name, axes, spec, plan) for name in axes.names]
    if "y0" in axes.names:
        used_dims["state"] = spec.flat_y0.size
    coordinates += _time_and_state(spec, used_dims)
    _check_names(coordinates, variables, axes)
    return coordinates + variables


def _check_names(coordinates, variables, axes: Axes) -> None:
    taken = {}
    for v in coordinates:
        taken[v.name] = "a coordinate"
        for dim in v.dims:
            taken.setdefault(dim, "a dimension")
    for v in variables:
        if v.name in PER_MEMBER:
            continue
        if v.name in taken:
            raise ValueError(
                f"the reduce output {v.name!r} has the name of {taken[v.name]}; rename it"
            )
        for dim in v.dims[len(axes.dims) :]:
            if dim in axes.dims:
                raise ValueError(
                    f"the sweep axis {dim!r} has the name of a dimension of the output "
                    f"{v.name!r}; sweep axes cannot be called 'time', 'state' or "
                    "'<output>_dim<k>'"
                )


def _extra_dims(name, shape, spec: MemberSpec) -> tuple[str, ...]:
    """Names of an output's dimensions after the member dimensions: those its reduction declares
    (for `name`, or for the entry it was split from: `y_0` from `y`), where the sizes fit, else
    `<name>_dim<k>`."""
    sizes = {"state": spec.flat_y0.size, "time": spec.ts.shape[0]}
    auto = [f"{name}_dim{k}" for k in range(len(shape))]
    base = name if name in spec.known_dims else name.rsplit("_", 1)[0]
    known = spec.known_dims.get(base)
    if known is None:
        return tuple(auto)
    if name == base and len(known) == len(shape):
        if all(sizes.get(d, n) == n for d, n in zip(known, shape)):
            return tuple(known)
    # a trajectory of a scalar or pytree state: its leading dimension is still time
    if known[0] == "time" and shape and shape[0] == sizes["time"]:
        return ("time", *auto[1:])
    return tuple(auto)


def _axis_coordinate(name: str, axes: Axes, spec: MemberSpec, plan: ChunkPlan) -> _store.Variable:
    """The coordinate of one axis name: its values along its member dimension."""
    values = axes.values[name]
    if name == "y0":
        values = np.asarray(values, dtype=spec.dtype).reshape(values.shape[0], -1)
    elif values.dtype.kind in "iub":
        values = values.astype(spec.dtype)
    component_dims = (
        ("state",) if name == "y0" else tuple(f"{name}_dim{k}" for k in range(values.ndim - 1))
    )
    if axes.kind == "samples":
        dims, coord_name, chunks = (SAMPLE_DIM, *component_dims), name, plan.block
    else:
        # a grid axis with non-scalar values cannot be its own index coordinate
        coord_name = name if values.ndim == 1 else f"{name}_values"
        dims, chunks = (name, *component_dims), (values.shape[0],)
    return _store.Variable(
        coord_name,
        dims,
        values.shape,
        tuple(chunks) + values.shape[1:],
        values.dtype,
        _store.fill_value(values.dtype),
        values=values,
    )


def _time_and_state(spec: MemberSpec, used_dims: dict) -> list[_store.Variable]:
    """The `time` and `state` coordinates, for the dimensions that some variable uses."""
    coordinates = []
    if "time" in used_dims:
        ts = np.asarray(spec.ts, dtype=spec.dtype)
        coordinates.append(
            _store.Variable("time", ("time",), ts.shape, ts.shape, ts.dtype, np.nan, values=ts)
        )
    if "state" in used_dims and spec.state_names is not None:
        names = np.array(spec.state_names, dtype=np.dtypes.StringDType())
        coordinates.append(
            _store.Variable(
                "state", ("state",), names.shape, names.shape, names.dtype, "", values=names
            )
        )
    return coordinates
