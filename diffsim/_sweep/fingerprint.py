"""The config of a sweep: a JSON-able fingerprint of everything that decides its stored numbers.

A store records the config it was written with, and a later sweep resumes it only if its own
config is the same (`store.check_matches`). Invariants:

- Deterministic across processes and runs: no memory addresses, no reprs of arbitrary objects;
  small arrays appear in full, large ones by SHA-256 digest.
- Code counts as config: a model function, a model class or a reduce function is described by
  its qualified name and a digest of its source, plus the values a function reads from outside
  (closure cells, defaults, global constants), so that editing it between runs is caught.
- It includes the chunk block, since the store's zarr chunks are laid out by it.
"""

import dataclasses
import hashlib
import inspect

import equinox as eqx
import jax
import numpy as np

from .axes import Axes
from .chunks import ChunkPlan
from .members import MemberSpec

_FULL_ARRAY_SIZE = 32  # arrays up to this many elements are described by value, larger by digest


def sweep_config(axes: Axes, spec: MemberSpec, plan: ChunkPlan) -> dict:
    """Everything that decides the stored numbers and layout, as JSON-able values; a store is
    resumed only by a sweep with the same config."""
    return {
        "kind": axes.kind,
        "axes": {name: describe(v) for name, v in axes.values.items()},
        # the axes' order sets the layout of the stored arrays; the digest's JSON sorts dict
        # keys, so without this a resume with the axes given in another order (of the same
        # shape) wrote its chunks transposed into the store
        "axis_order": list(axes.values),
        "model": describe(spec.model),
        "y0": describe(spec.flat_y0),
        "ts": describe(spec.ts),
        "solver": describe(spec.solver),
        "dt": None if spec.dt is None else float(spec.dt),
        "max_steps": int(spec.max_steps),
        "reduce": spec.reduce_name or _describe_code(spec.reduce),
        "chunk_block": list(plan.block),
        "dtype": str(spec.dtype),
        "key": None if spec.key is None else describe(_key_data(spec.key)),
    }


def describe(obj):
    """A JSON-able, deterministic description: small arrays in full, large ones by digest."""
    if isinstance(obj, (jax.Array, np.ndarray, np.generic)):
        return _describe_array(_key_data(obj) if isinstance(obj, jax.Array) else np.asarray(obj))
    if isinstance(obj, eqx.Module) or dataclasses.is_dataclass(obj):
        return {
            "type": _describe_code(type(obj)),
            **{f.name: describe(getattr(obj, f.name)) for f in dataclasses.fields(obj)},
        }
    if isinstance(obj, (list, tuple)):
        return [describe(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): describe(v) for k, v in obj.items()}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if callable(obj):
        return _describe_code(obj)
    # Other objects by type only: their repr may hold a memory address, which would make every
    # run's config differ and block resuming.
    return f"<{type(obj).__module__}.{type(obj).__qualname__}>"


def _describe_array(array: np.ndarray) -> dict:
    description = {"dtype": str(array.dtype), "shape": list(array.shape)}
    if array.size <= _FULL_ARRAY_SIZE:
        return {**description, "values": array.ravel().tolist()}
    digest = hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()
    return {**description, "sha256": digest}


def _key_data(key) -> np.ndarray:
    # a typed PRNG key has no numbers of its own until unwrapped
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        return np.asarray(jax.random.key_data(key))
    return np.asarray(key)


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
            described[name] = describe(value)
    return described
