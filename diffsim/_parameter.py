"""`ds.parameter`: declare a model parameter field with its constraints.

A parameter is converted to an array (so `jit` traces it and new values never recompile) and
checked at construction when its value is concrete, with an error that names the model and field.
"""

import dataclasses

import equinox as eqx
import jax.numpy as jnp

from ._validate import as_optional_parameter, as_parameter, check_parameter

_METADATA_KEY = "diffsim_parameter"


def parameter(
    default=dataclasses.MISSING,
    *,
    positive: bool = False,
    nonnegative: bool = False,
    ndim: int | None = None,
    optional: bool = False,
):
    """A model field holding a physical parameter.

    **Arguments:**

    - `default`: default value (omit for a required parameter; `None` makes it optional).
    - `positive` / `nonnegative`: the constraint checked at construction.
    - `ndim`: the required number of dimensions (0 for a scalar).
    - `optional`: the field may be `None` (a term of the model that is switched off).

    Every parameter must be finite.
    """
    optional = optional or default is None
    constraint = dict(positive=positive, nonnegative=nonnegative, ndim=ndim, optional=optional)
    return eqx.field(
        default=default,
        converter=as_optional_parameter if optional else as_parameter,
        metadata={_METADATA_KEY: constraint},
    )


def check_parameters(model) -> None:
    """Check every field declared with `parameter` (called from `AbstractODE.__check_init__`)."""
    for field in dataclasses.fields(model):
        constraint = parameter_constraints(field)
        if constraint is not None:
            check_parameter(model, field.name, **constraint)


def parameter_constraints(field: dataclasses.Field) -> dict | None:
    """The constraints `parameter` recorded on a model field (None for other fields)."""
    return field.metadata.get(_METADATA_KEY)


def constraints_hold(model):
    """A traced boolean: every `parameter` field of `model` satisfies its `positive` /
    `nonnegative` constraint (for values that were traced at construction, where
    `check_parameters` could not look)."""
    ok = jnp.array(True)
    for field in dataclasses.fields(model):
        constraint = parameter_constraints(field)
        value = getattr(model, field.name)
        if constraint is None or value is None:
            continue
        if constraint["positive"]:
            ok = ok & jnp.all(value > 0)
        if constraint["nonnegative"]:
            ok = ok & jnp.all(value >= 0)
    return ok


def replace_unconstrained_parameters(model, fill):
    """`model` with every `parameter` field that breaks its constraint replaced by `fill`
    (traced, field by field: a field that holds stays as it is, batched or not)."""
    replacements = {}
    for field in dataclasses.fields(model):
        constraint = parameter_constraints(field)
        value = getattr(model, field.name)
        if (
            constraint is None
            or value is None
            or not (constraint["positive"] or constraint["nonnegative"])
        ):
            continue
        ok = jnp.all(value > 0) if constraint["positive"] else jnp.all(value >= 0)
        replacements[field.name] = jnp.where(ok, value, jnp.asarray(fill, value.dtype))
    if not replacements:
        return model
    names = list(replacements)
    return eqx.tree_at(
        lambda m: [getattr(m, name) for name in names], model, [replacements[n] for n in names]
    )
