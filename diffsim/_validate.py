"""Checks of user input that run at construction or trace time, with messages that name the culprit.

Concrete values are checked in Python and raise at once. Traced values (a model built inside
`jax.vmap` or `jax.grad`) cannot be inspected here; `simulate` checks them for finiteness inside
the compiled solve and reports through its result code.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np


def is_traced(x) -> bool:
    return isinstance(x, jax.core.Tracer)


def any_traced(tree) -> bool:
    return any(is_traced(leaf) for leaf in jax.tree.leaves(tree))


def as_parameter(x):
    """Convert a physical parameter to an array so that `jit` traces it (no recompilation when
    its value changes). Integers become the default float dtype; floats keep their dtype."""
    if isinstance(x, (bool, int, float)):  # Python scalars: the default float, not weakly typed
        return jnp.asarray(x, dtype=jnp.result_type(float))
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        x = x.astype(jnp.result_type(float))
    return x


def as_optional_parameter(x):
    return None if x is None else as_parameter(x)


def check_parameter(owner, name: str, *, positive=False, nonnegative=False, ndim=None) -> None:
    """Validate the field `name` of `owner` (a model or solver) when its value is concrete."""
    value = getattr(owner, name)
    if value is None:
        return
    check_parameter_value(
        f"{type(owner).__name__}({name}=...)",
        value,
        positive=positive,
        nonnegative=nonnegative,
        ndim=ndim,
    )


def check_parameter_value(where: str, value, *, positive=False, nonnegative=False, ndim=None):
    """Validate a parameter value (concrete or traced); `where` names it in the message."""
    if ndim is not None and jnp.ndim(value) != ndim:
        raise ValueError(
            f"{where}: expected a {'scalar' if ndim == 0 else f'{ndim}-D array'}, "
            f"got shape {jnp.shape(value)}"
        )
    if is_traced(value):
        return
    array = np.asarray(value)
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{where}: must be finite, got {_short(array)}")
    if positive and not np.all(array > 0):
        raise ValueError(f"{where}: must be > 0, got {_short(array)}")
    if nonnegative and not np.all(array >= 0):
        raise ValueError(f"{where}: must be >= 0, got {_short(array)}")


def nonfinite_leaves(tree) -> list[str]:
    """Paths (like `.length` or `[0]`) of the concrete floating leaves of `tree` that hold NaN or
    inf. Traced leaves are skipped."""
    bad = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if is_traced(leaf) or not _is_float_array(leaf):
            continue
        if not np.all(np.isfinite(np.asarray(leaf))):
            bad.append(jax.tree_util.keystr(path) or "(the value itself)")
    return bad


def all_finite(tree):
    """A traced boolean: every floating leaf of `tree` is finite."""
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if _is_float_array(x)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


def _is_float_array(x) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, float)) and jnp.issubdtype(
        jnp.result_type(x), jnp.inexact
    )


def _short(array) -> str:
    return str(array.item()) if array.size == 1 else np.array2string(array, threshold=6)


def check_static_count(name: str, value, *, minimum: int = 1) -> int:
    """Validate a count that sets a shape or loop length: a Python int >= `minimum`; returns
    it as an int."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be a Python int (static), got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_positive_number(name: str, value, *, allow_none=True) -> None:
    """Validate a concrete scalar argument such as `dt` or `max_steps`."""
    if value is None and allow_none:
        return
    if is_traced(value):
        return
    if not (isinstance(value, (int, float, np.number)) or jnp.ndim(value) == 0):
        raise TypeError(f"{name} must be a positive number, got {value!r}")
    v = float(value)
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def as_state_leaf(x):
    """A state leaf as an inexact array (integers become the default float); traced values
    pass through."""
    x = x if is_traced(x) else jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        x = x.astype(jnp.result_type(float))
    return x
