"""What one member of a sweep computes, checked once before anything is compiled.

`MemberSpec.member(values, index)` is the traced function that the chunks vmap: one member's
axis values and its index in the whole sweep in, its reduced outputs, `result` code and step
count out. Invariants:

- A member's numbers depend only on its own values and index: its key is
  `fold_in(key, index)` and a stochastic solve's Brownian path `fold_in(fold_in(key, index), 1)`
  (a stream apart from the key its model function receives), never on chunking, devices or
  processes.
- A member whose solve failed holds the store's fill value (NaN for floats) in every output,
  so a failure can never pass for a number; its `result` says why.
- A swept model is rebuilt through its constructor (`dataclasses.replace`), so the model's own
  converters and structural checks run for the swept values too.
- Every argument error is raised here, on the host, naming the argument and the fix, before
  the first chunk is traced.
"""

import dataclasses
import inspect
import re
from collections.abc import Callable
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from .._integrate.simulate import simulate
from .._model import AbstractODE
from .._parameter import parameter_constraints
from .._paths import floating_names, get, path_of
from .._results import RESULTS
from .._solver import AbstractSolver
from .._solver.base import check_solver
from .._validate import (
    any_traced,
    as_state,
    Bounded,
    check_key,
    check_parameter_value,
    check_static_count,
    HostArray,
    to_device,
)
from . import store as _store
from .axes import Axes
from .reduce import name_outputs, resolve_reduce

_Y0_COMPONENT = re.compile(r"^y0\[(\d+)\]$")

# What every member returns besides its reduce outputs, with the attributes of its variable.
PER_MEMBER = {
    "result": {
        "flag_values": [r.value for r in RESULTS],
        "flag_meanings": " ".join(r.name for r in RESULTS),
        "long_name": "outcome of the member's solve (ds.RESULTS); -1: not computed",
    },
    "num_steps": {"long_name": "accepted steps"},
}


class MemberOutputs(NamedTuple):
    """What `MemberSpec.member` returns (a pytree: batched over a chunk under vmap)."""

    outputs: dict  # the reduce outputs by variable name (fill values where the solve failed)
    result: jax.Array  # the solve's ds.RESULTS code
    num_steps: jax.Array  # accepted steps

    def by_name(self) -> dict:
        """Every variable of the member, the per-member ones (`PER_MEMBER`) included."""
        return {**self.outputs, "result": self.result, "num_steps": self.num_steps}


@dataclasses.dataclass(frozen=True)
class MemberSpec:
    """Everything that turns one member's axis values and index into its outputs."""

    model: object  # a model instance, or a function **params -> model
    is_factory: bool
    parameter_names: tuple[str, ...]  # axes that are model parameters (or factory arguments)
    component_names: dict[str, int]  # "y0[i]" -> i
    whole_y0: bool  # whether an axis "y0" gives whole initial states
    flat_y0: jax.Array  # the shared initial state, flattened
    unravel: Callable  # flat state -> the state's pytree, in `dtype`
    y0_structure: object  # the state's pytree structure (what `unravel` returns)
    dtype: np.dtype
    ts: jax.Array
    solver: AbstractSolver
    dt: float | None
    reduce: Callable
    reduce_name: str | None  # None for a user's function
    known_dims: dict[str, tuple[str, ...]]  # output name -> the dims its reduction declares
    key: object
    max_steps: int
    parameter_shapes: dict[str, tuple[int, ...]]  # one member's shape of each parameter

    @classmethod
    def build(
        cls, model, axes: Axes, *, y0, ts, solver, dt, reduce, key, max_steps
    ) -> "MemberSpec":
        """Check `ds.sweep`'s arguments that decide a member and gather them."""
        is_factory = _check_model(model)
        check_solver("solver", solver)
        check_static_count("max_steps", max_steps)
        _check_key(key, solver, axes, is_factory)
        reduce_fn, known_dims, reduce_name = resolve_reduce(reduce)
        parameters, components, whole = _split_names(axes.names)
        for name in tuple(components) + (("y0",) if whole else ()):
            _check_finite(name, axes.values[name])  # as the parameters' axes are
        flat_y0, unravel, dtype, y0_structure = _initial_state(y0, axes, whole, components)
        spec = cls(
            model=model,
            is_factory=is_factory,
            parameter_names=parameters,
            component_names=components,
            whole_y0=whole,
            flat_y0=flat_y0,
            unravel=unravel,
            y0_structure=y0_structure,
            dtype=dtype,
            # a jax array: closed over, it stays concrete inside the traced member function
            ts=to_device(ts) if not any_traced(ts) else ts,
            solver=solver,
            dt=dt,
            reduce=reduce_fn,
            reduce_name=reduce_name,
            known_dims=known_dims,
            key=key,
            max_steps=max_steps,
            parameter_shapes={name: axes.values[name].shape[1:] for name in parameters},
        )
        if is_factory:
            spec._check_factory_arguments(axes)
        else:
            spec._check_model_fields(axes)
        return spec

    def _check_factory_arguments(self, axes: Axes) -> None:
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

    def _check_model_fields(self, axes: Axes) -> None:
        model_name = type(self.model).__name__
        fields = {f.name: f for f in dataclasses.fields(self.model)}
        for name in self.parameter_names:
            field = fields.get(name)
            if self._path(name) is not None:
                _check_finite(name, axes.values[name])  # a dict entry or a nested field
                continue
            if field is None or field.metadata.get("static", False):
                swept = floating_names(self.model) or [
                    f for f, fl in fields.items() if not fl.metadata.get("static", False)
                ]
                raise ValueError(
                    f"sweep axis {name!r} is not a parameter of {model_name}; its "
                    f"parameters are {swept} (a nested module's field by its path, "
                    "e.g. 'drag.coefficient'), and initial-state axes are 'y0' or 'y0[i]'"
                )
            current = getattr(self.model, name)
            if current is not None and not eqx.is_array(current):
                raise TypeError(
                    f"sweep axis {name!r}: {model_name}.{name} is a "
                    f"{type(current).__name__}, not an array, so an axis of numbers cannot "
                    "replace it; sweep a model function instead, e.g. model=lambda k: "
                    f"{model_name}(..., {{'k': k}}) with the axis 'k'"
                )
            values = axes.values[name]
            _check_finite(name, values)
            constraint = parameter_constraints(field)
            if constraint is not None:
                ndim = constraint["ndim"]
                check_parameter_value(
                    f"sweep axis {name!r} of {model_name}",
                    values,
                    positive=constraint["positive"],
                    nonnegative=constraint["nonnegative"],
                    # the axis adds a leading dimension to the parameter's own
                    ndim=None if ndim is None else ndim + 1,
                )

    def member(self, values: dict, index) -> MemberOutputs:
        """One member's outputs (traced; vmapped over a chunk)."""
        parameters = {n: values[n] for n in self.parameter_names}
        member_key = None if self.key is None else jax.random.fold_in(self.key, index)
        if self.is_factory:
            extra = {} if member_key is None else {"key": member_key}
            model = self.model(**parameters, **extra)
        else:
            # through the constructor, so the model's converters and checks see the values
            replaced = {n: v for n, v in parameters.items() if self._path(n) is None}
            model = dataclasses.replace(self.model, **replaced) if replaced else self.model
            for name, value in parameters.items():  # dict entries and nested fields
                path = self._path(name)
                if path is not None:
                    model = eqx.tree_at(lambda m, path=path: get(m, path), model, value)
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
        return MemberOutputs(outputs, solution.result, solution.stats["num_steps"])

    def _path(self, name: str):
        """The path of an axis that names a dict entry or a nested field (None for a field)."""
        path = path_of(self.model, name)
        return path if path is not None and len(path) > 1 else None

    # the fields a member's program takes as traced arguments: new values of them (another base
    # model, initial state, tolerances or key) reuse the compiled program
    _DYNAMIC = ("flat_y0", "solver", "key")

    def dynamic(self) -> dict:
        """The spec's array-valued parts, passed to the compiled program as arguments."""
        names = self._DYNAMIC + (() if self.is_factory else ("model",))
        return {name: getattr(self, name) for name in names}

    def program_key(self) -> tuple:
        """What decides the compiled program apart from `dynamic()` (hashable): equal keys can
        share one program."""
        shape_of = lambda x: (tuple(np.shape(x)), str(jnp.result_type(x)))  # noqa: E731
        return (
            self.model if self.is_factory else None,  # a model function, by identity
            self.parameter_names,
            tuple(sorted(self.component_names.items())),
            self.whole_y0,
            shape_of(self.flat_y0),
            self.y0_structure,
            str(self.dtype),
            HostArray(self.ts),
            self.dt,
            self.reduce,
            self.key is None,
            self.max_steps,
            tuple(sorted(self.parameter_shapes.items())),
        )

    def _path_key(self, member_key) -> dict:
        """The Brownian path's key of a stochastic solve: a stream of the member's key apart
        from the one its model function receives."""
        if not self.solver.stochastic:
            return {}
        return {"key": jax.random.fold_in(member_key, 1)}

    def output_shapes(self) -> dict[str, jax.ShapeDtypeStruct]:
        """One member's shape and dtype of every variable, found by tracing (nothing runs);
        remembered per program, so that a sweep with new values traces nothing."""
        values = {n: jax.ShapeDtypeStruct(self._member_shape(n), self.dtype) for n in self.inputs}
        index = jax.ShapeDtypeStruct((), jnp.uint32)
        try:
            dynamic = jax.tree.flatten(self.dynamic())
            key = (self.program_key(), dynamic[1], tuple(_abstract(x) for x in dynamic[0]))
            shapes = _OUTPUT_SHAPES.get(key)
        except TypeError:  # an unhashable part: traced every time
            key, shapes = None, None
        if shapes is None:
            shapes = jax.eval_shape(self.member, values, index)
            if key is not None:
                _OUTPUT_SHAPES[key] = shapes
        for name in set(shapes.outputs) & set(PER_MEMBER):
            raise ValueError(
                f"the reduce output {name!r} has the name of a per-member variable of every "
                "sweep; rename it"
            )
        return shapes.by_name()

    @property
    def inputs(self) -> tuple[str, ...]:
        """The names of the values a member receives, in the order a chunk passes them."""
        return self.parameter_names + tuple(self.component_names) + (("y0",) * self.whole_y0)

    def _member_shape(self, name: str) -> tuple[int, ...]:
        if name == "y0":
            return self.flat_y0.shape
        if name in self.component_names:
            return ()
        return self.parameter_shapes[name]

    @property
    def state_names(self) -> tuple[str, ...] | None:
        """The model's names of the flattened state's components, when it declares them."""
        names = None if self.is_factory else type(self.model).state_names
        return names if names is not None and len(names) == self.flat_y0.size else None


def _check_model(model) -> bool:
    """Whether `model` is a factory (a function **params -> model) rather than a model."""
    is_factory = not isinstance(model, AbstractODE)
    if is_factory and not callable(model):
        raise TypeError(
            "model must be a diffsim model instance or a function **params -> model, "
            f"got {type(model).__name__}"
        )
    return is_factory


def _check_key(key, solver, axes: Axes, is_factory: bool) -> None:
    if key is not None:
        check_key("key", key)
    if key is not None and axes.num_members > 2**32:
        raise ValueError(
            f"{axes.num_members} members: member keys fold_in a uint32 member index, so a "
            "sweep with a key has at most 2**32 members; split it into several sweeps"
        )
    if solver.stochastic and key is None:
        raise ValueError(
            f"{type(solver).__name__} draws Brownian paths: give the sweep a key (member i's "
            "path then comes from fold_in(fold_in(key, i), 1))"
        )
    if key is not None and not is_factory and not solver.stochastic:
        raise TypeError(
            "key is handed to the model for each member, so model must be a function "
            "(**params, key) -> model when key is given"
        )


def _split_names(names) -> tuple[tuple[str, ...], dict[str, int], bool]:
    """Axis names → (model parameters, initial-state components "y0[i]" → i, whether "y0"
    gives whole initial states)."""
    parameters, components, whole = [], {}, False
    for name in names:
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
    return tuple(parameters), components, whole


def _initial_state(y0, axes: Axes, whole: bool, components: dict):
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
    if not any_traced(flat) and not np.all(np.isfinite(np.asarray(flat))):  # on the host
        raise ValueError(
            "y0 holds NaN or inf; the initial state shared by the members must be finite"
        )
    for name, i in components.items():
        if i >= flat.size:
            raise ValueError(
                f"sweep axis {name!r}: the initial state has only {flat.size} components"
            )
        if axes.values[name].ndim != 1:
            raise ValueError(
                f"sweep axis {name!r} sets one component of the initial state, so it takes one "
                f"number per member, got values of shape {axes.values[name].shape}; sweep "
                "whole initial states with an axis 'y0'"
            )
    structure = jax.tree.structure(as_state(y0))
    return flat, _unravel_as(unravel, flat.dtype), flat.dtype, structure


_OUTPUT_SHAPES = Bounded(64)  # (program key, dynamic structure and shapes) -> outputs' shapes


def _abstract(x):
    return (tuple(np.shape(x)), str(jnp.result_type(x))) if eqx.is_array(x) else x


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
