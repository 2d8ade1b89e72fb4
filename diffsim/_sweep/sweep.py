"""`ds.sweep`: many simulations over named parameter axes → an `xarray.Dataset`.

Members (one simulation each) are the points of a grid (the Cartesian product of the axes) or of
zipped `ds.Samples`. They run in chunks of a fixed size (the last one padded), so one compilation
serves the whole sweep and memory is bounded by a chunk. A chunk is a rectangular block of the
grid, sharded over every local device along a "batch" mesh axis; with several processes
(`ds.distributed.initialize`) each computes and writes its own share of the chunks. With a store,
chunks land in a zarr store as they finish and a new call resumes the missing ones.

Every member's numbers depend only on its own inputs and its index in the sweep (keys come from
`jax.random.fold_in(key, member_index)`), never on the chunk size, device count or process count.
"""

import contextlib
import dataclasses
import hashlib
import inspect
import json
import math
import os
import re
import warnings
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .._integrate.simulate import simulate
from .._model import AbstractODE
from .._parameter import parameter_constraints
from .._results import RESULTS
from .._solver import AbstractSolver, AbstractStochasticSolver
from .._validate import (
    any_traced,
    as_state,
    check_key,
    check_parameter_value,
    check_static_count,
)
from . import distributed as _distributed, store as _store
from .progress import progress_bar
from .reduce import name_outputs, resolve_reduce
from .samples import Samples

_Y0_COMPONENT = re.compile(r"^y0\[(\d+)\]$")
_OUTPUT_BYTES_PER_CHUNK = 64 * 2**20  # default chunk: about this much output per chunk...
_MAX_DEFAULT_CHUNK = 2**16  # ...and at most this many members
_SAMPLE_DIM = "sample"


def sweep(
    model: AbstractODE | Callable[..., AbstractODE],
    axes: dict | Samples,
    y0,
    ts,
    *,
    solver: AbstractSolver,
    dt: float | None = None,
    reduce: str | Callable | None = None,
    chunk_size: int | None = None,
    store: str | os.PathLike | None = None,
    key=None,
    progress: bool = True,
    max_steps: int = 100_000,
):
    """Simulate every member of a parameter sweep and return the results as an `xarray.Dataset`.

    **Arguments:**

    - `model`: a model instance whose fields named in `axes` are replaced per member, or a
      function `**params -> model` (it also receives `key=` the member's key when `key` is given).
    - `axes`: a dict name → 1-D array for a full grid (the Cartesian product, one dimension per
      name, in the dict's order), or `ds.Samples({...})` for zipped samples (one dimension,
      `sample`). Names are model parameters, `"y0[i]"` (component `i` of the flattened initial
      state) or `"y0"` (whole initial states, shape `(n, *y0.shape)`).
    - `y0`: the initial state shared by all members (components named in `axes` replaced); may
      be None when `axes` has `"y0"`. Its float dtype sets the precision, as in `simulate`.
    - `ts`: output times, shape `(times,)`, concrete (the same for every member).
    - `solver`, `dt`, `max_steps`: as in `ds.simulate`.
    - `reduce`: what to keep of each member's `ds.Solution`: None or `"trajectory"` (states at
      every time, variable `y`), `"final_state"`, `"max_abs"` (max |y| over time), `"mean"`, or a
      function `solution -> pytree` (a dict names the variables; extra dimensions are named
      `<variable>_dim<k>`). Keep it small: memory and storage scale with it.
    - `chunk_size`: the most members per chunk (default: about 64 MiB of outputs, at most
      65,536). A chunk is a rectangular block of the grid (whole trailing rows, then an even split
      of the next dimension), so it can hold noticeably fewer members than `chunk_size`.
    - `store`: a path for a zarr store. Results are written chunk by chunk; if the store exists
      (an interrupted run), only the missing chunks are computed. A store written by a
      different sweep is refused with `SweepStoreError`.
    - `key`: a `jax.random` key; member `i` gets `jax.random.fold_in(key, i)`. Required with a
      stochastic solver (`ds.EulerMaruyama`, `ds.Milstein`): member `i`'s Brownian path is
      `fold_in(fold_in(key, i), 1)`, so it does not depend on chunks, devices or processes.
    - `progress`: show a progress bar (members/s, ETA) when stderr is a terminal.

    **Returns:** an `xarray.Dataset` with one dimension per grid axis (or `sample`), the axis
    values as coordinates, the outputs as variables (`time` and `state` dimensions labelled where
    they apply), and per member `result` (a `ds.RESULTS` code; failed members have NaN outputs)
    and `num_steps`. Output names must differ from those and from the coordinates. Attributes
    record the sweep's config (`sweep_config`, JSON), package versions, git commit, device kind,
    dtype and seed. With `store`, the variables are read lazily from it. If members failed, a
    warning counts them by code (`ds.sweep_summary`).

    Several processes (after `ds.distributed.initialize`) each compute chunks `p, p + P, …` and
    write them to the shared `store`; if one fails, all raise once they finish their share.
    """
    if store is not None:
        store = _store.normalize_path(store)
    axes_ = _Axes.build(axes)
    spec = _MemberSpec.build(model, axes_, y0, ts, solver, dt, reduce, key, max_steps)
    devices = jax.local_devices()
    outputs = spec.output_shapes()
    plan = _ChunkPlan.build(axes_.shape, chunk_size, _bytes_per_member(outputs), len(devices))
    variables = _variables(axes_, spec, outputs, plan)
    config = _config(axes_, spec, plan)
    layout = _distributed.layout()
    if store is None and layout.num_processes > 1:
        raise ValueError(
            "a sweep across several processes needs store=...: each process writes its own "
            "chunks there, and none holds the whole result in memory"
        )
    sink = _open_sink(store, variables, config, spec)
    mine = range(layout.process_id, plan.num_chunks, layout.num_processes)
    pending = [c for c in mine if c not in sink.done]
    description = "sweep"
    if layout.num_processes > 1:
        description += f" [process {layout.process_id}]"
    if sink.done:
        description += f" (resumed: {len(sink.done)} of {plan.num_chunks} chunks were done)"
    bar = progress_bar(
        sum(plan.members_in(c) for c in pending),
        enabled=progress,
        description=description,
        unit="member",
    )
    with _shared_failure("computing its chunks"):
        try:
            _run_chunks(pending, _ChunkRunner(spec, axes_, plan, devices), sink, bar)
        finally:
            bar.close()
    dataset = sink.dataset()
    _warn_failures(dataset)
    return dataset


@contextlib.contextmanager
def _shared_failure(what: str):
    """Run a step that each process does on its own; then every process learns whether any
    failed, and raises if so (the one that failed re-raises its own error), so that no process
    is left waiting for the others."""
    try:
        yield
    except Exception:
        _distributed.any_process_failed(True)
        raise
    if _distributed.any_process_failed(False):
        raise RuntimeError(
            f"another process of this sweep failed while {what} (its own log has the error); "
            "the chunks finished so far are kept in the store: fix the cause and run again to "
            "resume"
        )


def _run_chunks(chunks, runner, sink, bar) -> None:
    # Dispatch chunk i+1 before fetching and writing chunk i: JAX runs asynchronously, so the
    # devices compute while the host stores.
    in_flight = None
    for chunk in [*chunks, None]:
        launched = None if chunk is None else (chunk, runner.launch(chunk))
        if in_flight is not None:
            sink.write(*in_flight, runner)
            bar.update(runner.plan.members_in(in_flight[0]))
        in_flight = launched


def sweep_summary(dataset) -> dict[str, int]:
    """Count the members of a sweep result by outcome: `{"successful": n, "max_steps_reached":
    m, …}` (only codes that occur). Reads the `result` variable in slabs, so it also works on a
    large store."""
    if type(dataset).__name__ != "Dataset" or "result" not in getattr(dataset, "data_vars", {}):
        raise TypeError(
            "sweep_summary takes the xarray.Dataset of a sweep (from ds.sweep or ds.open_sweep), "
            f"which holds a 'result' variable; got {type(dataset).__name__}"
        )
    result = dataset["result"]
    counts = np.zeros(len(RESULTS) + 1, dtype=np.int64)  # the last bin: never computed
    first = result.dims[0]
    step = max(1, 2**24 // max(1, result.size // max(1, result.sizes[first])))
    for start in range(0, result.sizes[first], step):
        codes = np.asarray(result.isel({first: slice(start, start + step)}).values).ravel()
        codes = np.where((codes >= 0) & (codes < len(RESULTS)), codes, len(RESULTS))
        counts += np.bincount(codes, minlength=len(RESULTS) + 1)
    names = [r.name for r in RESULTS] + ["not_computed"]
    return {name: int(n) for name, n in zip(names, counts) if n}


def open_sweep(store: str | os.PathLike):
    """Open a sweep's zarr store as an `xarray.Dataset` whose variables are read lazily (no dask
    needed); e.g. `ds.open_sweep("out/sweep.zarr")["final_state"].sel(length=1.0)`. The store
    may be incomplete: members not yet computed hold NaN outputs and `result == -1`."""
    path = _store.normalize_path(store)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no sweep store at {path!r}")
    _store.check_is_sweep(path)
    return _store.open_dataset(path)


def _warn_failures(dataset) -> None:
    counts = sweep_summary(dataset)
    failed = {k: v for k, v in counts.items() if k != "successful"}
    if failed:
        total = sum(counts.values())
        detail = ", ".join(f"{k}: {v}" for k, v in failed.items())
        warnings.warn(
            f"ds.sweep: {sum(failed.values())} of {total} members did not succeed ({detail}); "
            "their outputs are NaN and `result` holds their codes (ds.RESULTS)",
            stacklevel=3,
        )


# --- the members: axes, their values and how one member is simulated ---------------------------


@dataclasses.dataclass(frozen=True)
class _Axes:
    """The sweep's members on the host: `dims`/`shape` of the member array, each axis name's
    values (leading axis over that axis's positions) and the dimension it runs along."""

    kind: str  # "grid" or "samples"
    names: tuple[str, ...]
    values: dict[str, np.ndarray]
    dims: tuple[str, ...]
    shape: tuple[int, ...]

    @classmethod
    def build(cls, axes) -> "_Axes":
        if isinstance(axes, Samples):
            values = dict(axes.values)
            return cls("samples", tuple(values), values, (_SAMPLE_DIM,), (len(axes),))
        if not isinstance(axes, dict) or not axes:
            raise TypeError(
                "axes must be a non-empty dict name -> 1-D array (a grid) or ds.Samples({...}) "
                f"(zipped samples), got {axes!r}"
            )
        values = {}
        for name, value in axes.items():
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
            values[str(name)] = array
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


@dataclasses.dataclass(frozen=True)
class _MemberSpec:
    """Everything that turns one member's axis values and index into its outputs."""

    model: object
    is_factory: bool
    parameter_names: tuple[str, ...]
    component_names: dict[str, int]  # "y0[i]" -> i
    whole_y0: bool
    flat_y0: jax.Array
    unravel: Callable
    dtype: np.dtype
    ts: jax.Array
    solver: AbstractSolver
    dt: float | None
    reduce: Callable
    reduce_name: str | None
    known_dims: dict[str, tuple[str, ...]]
    key: object
    max_steps: int
    parameter_shapes: dict[str, tuple[int, ...]]

    @classmethod
    def build(cls, model, axes: _Axes, y0, ts, solver, dt, reduce, key, max_steps):
        is_factory = not isinstance(model, AbstractODE)
        if is_factory and not callable(model):
            raise TypeError(
                "model must be a diffsim model instance or a function **params -> model, "
                f"got {type(model).__name__}"
            )
        if not isinstance(solver, AbstractSolver):
            raise TypeError(f"solver must be a diffsim solver such as ds.RK4(), got {solver!r}")
        check_static_count("max_steps", max_steps)
        if key is not None:
            check_key("key", key)
        if key is not None and axes.num_members > 2**32:
            raise ValueError(
                f"{axes.num_members} members: member keys fold_in a uint32 member index, so a "
                "sweep with a key has at most 2**32 members; split it into several sweeps"
            )
        stochastic = isinstance(solver, AbstractStochasticSolver)
        if stochastic and key is None:
            raise ValueError(
                f"{type(solver).__name__} draws Brownian paths: give the sweep a key (member i's "
                "path then comes from fold_in(fold_in(key, i), 1))"
            )
        if key is not None and not is_factory and not stochastic:
            raise TypeError(
                "key is handed to the model for each member, so model must be a function "
                "(**params, key) -> model when key is given"
            )
        reduce_fn, known_dims, reduce_name = resolve_reduce(reduce)
        components, whole = {}, False
        parameters = []
        for name in axes.names:
            match = _Y0_COMPONENT.match(name)
            if name == "y0":
                whole = True
            elif match:
                components[name] = int(match.group(1))
            else:
                parameters.append(name)
        if whole and components:
            raise ValueError(
                f"axes name both 'y0' and components {sorted(components)}; sweep one or the other"
            )
        flat_y0, unravel, dtype = _initial_state(y0, axes, whole, components)
        # a jax array: closed over, it stays concrete inside the traced member function
        ts = jnp.asarray(ts)
        spec = cls(
            model,
            is_factory,
            tuple(parameters),
            components,
            whole,
            flat_y0,
            unravel,
            dtype,
            ts,
            solver,
            dt,
            reduce_fn,
            reduce_name,
            known_dims,
            key,
            max_steps,
            {name: axes.values[name].shape[1:] for name in parameters},
        )
        spec._check_parameters(axes)
        return spec

    def _check_parameters(self, axes: _Axes) -> None:
        if self.is_factory:
            signature = inspect.signature(self.model)
            takes_any = any(
                p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()
            )
            needed = self.parameter_names + (("key",) if self.key is not None else ())
            missing = [n for n in needed if n not in signature.parameters]
            if missing and not takes_any:
                raise ValueError(
                    f"{missing} are not arguments of the model function "
                    f"{getattr(self.model, '__name__', self.model)}{signature}; it is called "
                    "with the sweep axes (and key= when a key is given) as keywords"
                )
            for name in self.parameter_names:
                _check_finite(name, axes.values[name])
            return
        fields = {f.name: f for f in dataclasses.fields(self.model)}
        for name in self.parameter_names:
            field = fields.get(name)
            if field is None or field.metadata.get("static", False):
                swept = [f for f, fl in fields.items() if not fl.metadata.get("static", False)]
                raise ValueError(
                    f"sweep axis {name!r} is not a parameter of {type(self.model).__name__}; its "
                    f"parameters are {swept}, and initial-state axes are 'y0' or 'y0[i]'"
                )
            current = getattr(self.model, name)
            if current is not None and not eqx.is_array(current):
                raise TypeError(
                    f"sweep axis {name!r}: {type(self.model).__name__}.{name} is a "
                    f"{type(current).__name__}, not an array, so an axis of numbers cannot "
                    "replace it; sweep a model function instead, e.g. model=lambda k: "
                    f"{type(self.model).__name__}(..., {{'k': k}}) with the axis 'k'"
                )
            constraint = parameter_constraints(field)
            where = f"sweep axis {name!r} of {type(self.model).__name__}"
            values = axes.values[name]
            _check_finite(name, values)
            if constraint is not None:
                ndim = constraint["ndim"]
                check_parameter_value(
                    where,
                    values,
                    positive=constraint["positive"],
                    nonnegative=constraint["nonnegative"],
                    ndim=None if ndim is None else ndim + 1,
                )

    def member(self, values: dict, index):
        """One member's outputs (traced; vmapped over a chunk)."""
        parameters = {n: values[n] for n in self.parameter_names}
        member_key = None if self.key is None else jax.random.fold_in(self.key, index)
        if self.is_factory:
            extra = {} if member_key is None else {"key": member_key}
            model = self.model(**parameters, **extra)
        else:
            # Rebuilt through the constructor, so converters and structural checks of the model
            # (e.g. "both drive parameters or neither") run for the swept values too.
            model = dataclasses.replace(self.model, **parameters)
        flat = values["y0"] if self.whole_y0 else self.flat_y0
        for name, i in self.component_names.items():
            flat = flat.at[i].set(values[name])
        solution = simulate(
            model,
            self.unravel(flat),
            self.ts,
            solver=self.solver,
            dt=self.dt,
            max_steps=self.max_steps,
            throw=False,
            **self._path_key(member_key),
        )
        failed = solution.result != RESULTS.successful
        outputs = {
            name: jnp.where(failed, jnp.asarray(_store.fill_value(x.dtype), x.dtype), x)
            for name, x in name_outputs(self.reduce(solution)).items()
        }
        return outputs, solution.result, solution.stats["num_steps"]

    def _path_key(self, member_key) -> dict:
        """The Brownian path's key of a stochastic solve: a stream of the member's key apart
        from the one its model function receives."""
        if not isinstance(self.solver, AbstractStochasticSolver):
            return {}
        return {"key": jax.random.fold_in(member_key, 1)}

    def output_shapes(self) -> dict:
        values = {n: jax.ShapeDtypeStruct(self._member_shape(n), self.dtype) for n in self.inputs}
        index = jax.ShapeDtypeStruct((), jnp.uint32)
        outputs, result, num_steps = jax.eval_shape(self.member, values, index)
        for name in set(outputs) & set(_PER_MEMBER):
            raise ValueError(
                f"the reduce output {name!r} has the name of a per-member variable of every "
                "sweep; rename it"
            )
        return {**outputs, "result": result, "num_steps": num_steps}

    @property
    def inputs(self) -> tuple[str, ...]:
        return self.parameter_names + tuple(self.component_names) + (("y0",) * self.whole_y0)

    def _member_shape(self, name: str) -> tuple[int, ...]:
        if name == "y0":
            return self.flat_y0.shape
        if name in self.component_names:
            return ()
        return self.parameter_shapes[name]

    @property
    def state_names(self) -> tuple[str, ...] | None:
        names = None if self.is_factory else type(self.model).state_names
        return names if names is not None and len(names) == self.flat_y0.size else None


def _initial_state(y0, axes: _Axes, whole: bool, components: dict):
    if whole:
        states = axes.values["y0"]
        if y0 is not None:
            expected = np.shape(ravel_pytree(y0)[0])
            flat_states = states.reshape(states.shape[0], -1)
            if flat_states.shape[1:] != expected:
                raise ValueError(
                    f"the 'y0' axis holds states of shape {states.shape[1:]}, but y0 has "
                    f"{expected[0]} components"
                )
        else:
            y0 = states[0]
    if y0 is None:
        raise ValueError("y0 is None: pass the initial state, or sweep it with a 'y0' axis")
    flat, unravel = ravel_pytree(jax.tree.map(jnp.asarray, as_state(y0)))
    if not jnp.issubdtype(flat.dtype, jnp.floating):
        flat = flat.astype(jnp.result_type(float))
    if not any_traced(flat) and not bool(jnp.all(jnp.isfinite(flat))):
        raise ValueError(
            "y0 holds NaN or inf; the initial state shared by the members must be finite"
        )
    for name, i in components.items():
        if i >= flat.size:
            raise ValueError(
                f"sweep axis {name!r}: the initial state has only {flat.size} components"
            )
    return flat, _unravel_as(unravel, flat.dtype), flat.dtype


def _unravel_as(unravel, dtype):
    # ravel_pytree's unravel restores the original leaf dtypes; keep the float dtype chosen here.
    return lambda flat: jax.tree.map(lambda x: x.astype(dtype), unravel(flat))


def _check_finite(name: str, values: np.ndarray) -> None:
    if np.issubdtype(values.dtype, np.number) and not np.all(np.isfinite(values)):
        bad = np.flatnonzero(~np.isfinite(values.reshape(values.shape[0], -1)).all(axis=1))
        raise ValueError(
            f"sweep axis {name!r} has non-finite values at positions {bad[:8].tolist()}"
            f"{' …' if bad.size > 8 else ''}; every value must be finite"
        )


# --- chunks ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _ChunkPlan:
    """The member array cut into rectangular blocks (chunks) of shape `block`; each runs padded
    to `padded` members (a multiple of the device count) so all share one compilation."""

    shape: tuple[int, ...]
    block: tuple[int, ...]
    padded: int

    @classmethod
    def build(cls, shape, chunk_size, bytes_per_member, num_devices) -> "_ChunkPlan":
        if chunk_size is None:
            by_memory = _OUTPUT_BYTES_PER_CHUNK // bytes_per_member
            chunk_size = max(1, min(_MAX_DEFAULT_CHUNK, by_memory))
        check_static_count("chunk_size", chunk_size)
        block = _block_shape(shape, min(int(chunk_size), math.prod(shape)))
        padded = -(-math.prod(block) // num_devices) * num_devices
        return cls(tuple(shape), block, padded)

    @property
    def blocks_per_dim(self) -> tuple[int, ...]:
        return tuple(-(-n // b) for n, b in zip(self.shape, self.block))

    @property
    def num_chunks(self) -> int:
        return math.prod(self.blocks_per_dim)

    def region(self, chunk: int) -> tuple[slice, ...]:
        corner = np.unravel_index(chunk, self.blocks_per_dim)
        return tuple(
            slice(c * b, min((c + 1) * b, n)) for c, b, n in zip(corner, self.block, self.shape)
        )

    def members_in(self, chunk: int) -> int:
        return math.prod(s.stop - s.start for s in self.region(chunk))


def _block_shape(shape, size: int) -> tuple[int, ...]:
    """A block of at most `size` members: whole trailing dimensions while they fit, then an even
    split of the next one (e.g. 100 rows of 100 in blocks of 4096 → 3 blocks of 34, 34, 32 rows
    rather than 40, 40, 20), then 1 along the leading ones."""
    block = [1] * len(shape)
    room = size
    for axis in reversed(range(len(shape))):
        n = shape[axis]
        if n <= room:
            block[axis] = n
            room //= n
        else:
            pieces = -(-n // room)
            block[axis] = -(-n // pieces)
            break
    return tuple(block)


class _ChunkRunner:
    """Computes chunks: host-side member values → one jitted, device-sharded vmap."""

    def __init__(self, spec: _MemberSpec, axes: _Axes, plan: _ChunkPlan, devices):
        self.spec, self.axes, self.plan = spec, axes, plan
        sharding = NamedSharding(Mesh(np.array(devices), ("batch",)), PartitionSpec("batch"))
        self._sharding = sharding
        self._run = jax.jit(jax.vmap(spec.member), in_shardings=sharding, out_shardings=sharding)

    def launch(self, chunk: int):
        """Start computing `chunk` (asynchronously); returns the device outputs."""
        region = self.plan.region(chunk)
        positions = np.meshgrid(*(np.arange(s.start, s.stop) for s in region), indexing="ij")
        positions = tuple(p.ravel() for p in positions)
        count = positions[0].size
        pad = np.minimum(np.arange(self.plan.padded), count - 1)  # repeat the last member
        positions = tuple(p[pad] for p in positions)
        index = np.ravel_multi_index(positions, self.plan.shape).astype(np.uint32)
        values = self.axes.values_at(positions)
        values = {n: self._as_input(n, values[n]) for n in self.spec.inputs}
        # placed on this process's devices first: under jax.distributed, jit refuses numpy
        # inputs with a sharding over several devices (each process runs its own chunks)
        values, index = jax.device_put((values, index), self._sharding)
        return self._run(values, index)

    def _as_input(self, name: str, values: np.ndarray) -> np.ndarray:
        if name == "y0":
            values = values.reshape(values.shape[0], -1)
        return np.asarray(values, dtype=self.spec.dtype)

    def fetch(self, chunk: int, device_outputs) -> tuple[tuple[slice, ...], dict[str, np.ndarray]]:
        """The chunk's region and its outputs as host arrays of the region's shape."""
        outputs, result, num_steps = device_outputs
        region = self.plan.region(chunk)
        region_shape = tuple(s.stop - s.start for s in region)
        count = math.prod(region_shape)
        host = {**outputs, "result": result, "num_steps": num_steps}
        return region, {
            name: np.asarray(x)[:count].reshape(region_shape + x.shape[1:])
            for name, x in host.items()
        }


def _bytes_per_member(outputs: dict) -> int:
    return max(1, sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize for x in outputs.values()))


# --- variables, config, storage ----------------------------------------------------------------


def _variables(axes: _Axes, spec: _MemberSpec, outputs: dict, plan: _ChunkPlan):
    """The dataset's variables: coordinates of the axes (and of time/state where used), then the
    per-member outputs, `result` and `num_steps`, chunked like the sweep."""
    variables, used_dims = [], {}
    for name, shape in outputs.items():
        if name in _PER_MEMBER:
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
    for name, attrs in _PER_MEMBER.items():
        dtype = np.dtype(outputs[name].dtype)
        variables.append(
            _store.Variable(
                name, axes.dims, axes.shape, plan.block, dtype, _store.fill_value(dtype), attrs
            )
        )
    coordinates = _coordinates(axes, spec, plan, used_dims)
    _check_names(coordinates, variables, axes)
    return coordinates + variables


_PER_MEMBER = {
    "result": {
        "flag_values": [r.value for r in RESULTS],
        "flag_meanings": " ".join(r.name for r in RESULTS),
        "long_name": "outcome of the member's solve (ds.RESULTS); -1: not computed",
    },
    "num_steps": {"long_name": "accepted steps"},
}


def _check_names(coordinates, variables, axes: _Axes) -> None:
    taken = {}
    for v in coordinates:
        taken[v.name] = "a coordinate"
        for dim in v.dims:
            taken.setdefault(dim, "a dimension")
    for v in variables:
        if v.name in _PER_MEMBER:
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


def _extra_dims(name, shape, spec) -> tuple[str, ...]:
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


def _coordinates(axes: _Axes, spec: _MemberSpec, plan: _ChunkPlan, used_dims: dict):
    coordinates = []
    member_chunks = plan.block if axes.kind == "samples" else None
    for name in axes.names:
        values = axes.values[name]
        if name == "y0":
            values = np.asarray(values, dtype=spec.dtype).reshape(values.shape[0], -1)
            used_dims["state"] = values.shape[1]
        elif values.dtype.kind in "iub":
            values = values.astype(spec.dtype)
        component_dims = (
            ("state",) if name == "y0" else tuple(f"{name}_dim{k}" for k in range(values.ndim - 1))
        )
        if axes.kind == "samples":
            dims, coord_name, chunks = (_SAMPLE_DIM, *component_dims), name, member_chunks
        else:
            # a grid axis with non-scalar values cannot be its own index coordinate
            coord_name = name if values.ndim == 1 else f"{name}_values"
            dims, chunks = (name, *component_dims), (values.shape[0],)
        coordinates.append(
            _store.Variable(
                coord_name,
                dims,
                values.shape,
                tuple(chunks) + values.shape[1:],
                values.dtype,
                _store.fill_value(values.dtype),
                values=values,
            )
        )
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


def _config(axes: _Axes, spec: _MemberSpec, plan: _ChunkPlan) -> dict:
    """Everything that decides the stored numbers and layout, as JSON-able values; a store is
    resumed only by a sweep with the same config."""
    return {
        "kind": axes.kind,
        "axes": {name: _describe(v) for name, v in axes.values.items()},
        "model": _describe(spec.model),
        "y0": _describe(spec.flat_y0),
        "ts": _describe(spec.ts),
        "solver": _describe(spec.solver),
        "dt": None if spec.dt is None else float(spec.dt),
        "max_steps": int(spec.max_steps),
        "reduce": spec.reduce_name or _describe_code(spec.reduce),
        "chunk_block": list(plan.block),
        "dtype": str(spec.dtype),
        "key": None if spec.key is None else _describe(_key_data(spec.key)),
    }


def _key_data(key):
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        return np.asarray(jax.random.key_data(key))
    return np.asarray(key)


def _describe(obj):
    """A JSON-able, deterministic description: small arrays in full, large ones by digest."""
    if isinstance(obj, (jax.Array, np.ndarray, np.generic)):
        array = _key_data(obj) if isinstance(obj, jax.Array) else np.asarray(obj)
        if array.size <= 32:
            return {
                "dtype": str(array.dtype),
                "shape": list(array.shape),
                "values": array.ravel().tolist(),
            }
        return {
            "dtype": str(array.dtype),
            "shape": list(array.shape),
            "sha256": hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest(),
        }
    if isinstance(obj, eqx.Module) or dataclasses.is_dataclass(obj):
        return {
            "type": _describe_code(type(obj)),
            **{f.name: _describe(getattr(obj, f.name)) for f in dataclasses.fields(obj)},
        }
    if isinstance(obj, (list, tuple)):
        return [_describe(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): _describe(v) for k, v in obj.items()}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if callable(obj):
        return _describe_code(obj)
    # Other objects by type only: their repr may hold a memory address, which would make every
    # run's config differ and block resuming.
    return f"<{type(obj).__module__}.{type(obj).__qualname__}>"


def _describe_code(obj, *, with_variables: bool = True) -> dict:
    """A function or class by name and source digest, plus the values a function reads from
    outside (closure cells, defaults, global constants), so that editing a model function or
    changing a constant it uses between runs is caught as a config change."""
    try:
        digest = hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()
    except (OSError, TypeError):  # built-ins, code typed at a prompt
        digest = None
    name = f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"
    description = {"code": name, "source_sha256": digest}
    if with_variables and inspect.isfunction(obj):
        description["reads"] = _outside_values(obj)
    return description


def _outside_values(function) -> dict:
    try:
        variables = inspect.getclosurevars(function)
    except (TypeError, ValueError):
        return {}
    values = {**variables.globals, **variables.nonlocals}
    if function.__defaults__:
        values["(defaults)"] = function.__defaults__
    if function.__kwdefaults__:
        values["(keyword defaults)"] = function.__kwdefaults__
    described = {}
    for name, value in sorted(values.items()):
        if inspect.ismodule(value):
            continue
        if callable(value) and not isinstance(value, (eqx.Module, jax.Array, np.ndarray)):
            # one level deep: a helper is identified by its code, not by what it reads in turn
            described[name] = _describe_code(value, with_variables=False)
        else:
            described[name] = _describe(value)
    return described


def _open_sink(store, variables, config, spec):
    attrs = {
        "sweep_config": _store.canonical_json(config),
        "sweep_config_sha256": _store.config_digest(config),
        "dtype": str(spec.dtype),
        "seed": json.dumps(config["key"]),
        **_store.provenance(),
    }
    if store is None:
        return _MemorySink(variables, attrs)
    return _ZarrSink(store, variables, attrs, config)


class _MemorySink:
    def __init__(self, variables, attrs):
        self.variables, self.attrs, self.done = variables, attrs, set()
        self.arrays = {
            v.name: (v.values if v.values is not None else np.full(v.shape, v.fill_value, v.dtype))
            for v in variables
        }

    def write(self, chunk, device_outputs, runner: _ChunkRunner) -> None:
        region, outputs = runner.fetch(chunk, device_outputs)
        for name, values in outputs.items():
            self.arrays[name][region] = values

    def dataset(self):
        import xarray as xr

        coords, data = {}, {}
        for v in self.variables:
            target = coords if v.values is not None else data
            target[v.name] = xr.Variable(v.dims, self.arrays[v.name], attrs=v.attrs)
        return xr.Dataset(data, coords=coords, attrs=self.attrs)


class _ZarrSink:
    def __init__(self, path, variables, attrs, config):
        exists = os.path.exists(path)
        with _shared_failure("checking the store"):
            if exists:
                _store.check_matches(path, config)
                _store.check_layout(path, variables)
            if _distributed.layout().process_id == 0:
                _store.check_writable(path)
        # (that collective also keeps every process from reading while process 0 creates)
        with _shared_failure("creating the store"):
            if not exists and _distributed.layout().process_id == 0:
                _store.create(path, variables, attrs)
        self.path = path
        self.group = _store.open_group(path)
        self.done = _store.done_chunks(path)

    def write(self, chunk, device_outputs, runner: _ChunkRunner) -> None:
        region, outputs = runner.fetch(chunk, device_outputs)
        _store.write_chunk(self.path, self.group, region, outputs, chunk)

    def dataset(self):
        return _store.open_dataset(self.path)
