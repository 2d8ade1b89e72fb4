"""Names of a model's parameters for `ds.fit(..., params=...)` and `ds.sweep` axes: a field
(`"k"`), an entry of the model's dict of named parameters (a `ds.ODE`'s or an SBML model's `params`:
`"k"`, `"params.k"` or `'params["k"]'`), or a field of a nested module (`"drag.coefficient"`).

A name is read into a path of steps, each an attribute or, where the value is a dict, a key;
`get(model, path)` reads the value and `eqx.tree_at(lambda m: get(m, path), …)` replaces it.
"""

import dataclasses
import re
from collections.abc import Mapping

import equinox as eqx

# a step: `.name` / a leading `name`, or `["key"]` / `['key']`
_STEP = re.compile(r"""\.?([A-Za-z_][\w]*)|\[(["'])(.*?)\2\]""")


def path_of(model, name: str) -> tuple[str, ...] | None:
    """The steps that `name` names in `model`, or None where it names nothing."""
    if not isinstance(name, str) or not name:
        return None
    steps, position = [], 0
    while position < len(name):
        match = _STEP.match(name, position)
        if match is None or (position == 0 and name.startswith(".")):
            return None
        steps.append(match.group(1) if match.group(1) is not None else match.group(3))
        position = match.end()
    # a bare name that is an entry of the model's dict of named parameters names that entry,
    # also where the model has a field of that name (a ds.ODE's parameter "mass" is not its
    # mass matrix `mass`: a physicist's spring has one)
    field = getattr(type(model), "parameters_field", None)
    if len(steps) == 1 and field is not None and steps[0] != field:
        named = getattr(model, field, None)
        if isinstance(named, Mapping) and steps[0] in named:
            steps = [field, steps[0]]
    value = model
    for step in steps:
        if isinstance(value, Mapping):
            if step not in value:
                return None
            value = value[step]
        elif dataclasses.is_dataclass(value) and step in _field_names(value):
            value = getattr(value, step)
        else:
            return None
    return tuple(steps)


def get(model, path: tuple[str, ...]):
    """The value at `path` (from `path_of`)."""
    value = model
    for step in path:
        value = value[step] if isinstance(value, Mapping) else getattr(value, step)
    return value


def floating_names(model) -> list[str]:
    """What `params=` can name without a path: the floating-point fields, and the floating
    entries of the model's dict of named parameters."""
    names = [n for n in _field_names(model) if eqx.is_inexact_array(getattr(model, n, None))]
    field = getattr(type(model), "parameters_field", None)
    named = getattr(model, field, None) if field is not None else None
    if isinstance(named, Mapping):
        names += [str(k) for k, v in named.items() if eqx.is_inexact_array(v) or _is_float(v)]
    return names


def _is_float(value) -> bool:
    return isinstance(value, float)


def _field_names(value) -> list[str]:
    return [f.name for f in dataclasses.fields(value)] if dataclasses.is_dataclass(value) else []
