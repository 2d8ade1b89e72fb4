"""Checks of user input that run at construction or trace time, with messages that name the culprit.

Concrete values are checked in Python and raise at once. Traced values (a model built inside
`jax.vmap` or `jax.grad`) cannot be inspected here; `simulate` checks them for finiteness inside
the compiled solve and reports through its result code.
"""

import math
import os
from collections import OrderedDict
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np


def is_traced(x) -> bool:
    return isinstance(x, jax.core.Tracer)


def to_device(x, dtype=None):
    """`x` as an array (of `dtype` when given): traced values cast in the trace, concrete ones
    put on the device from the host (jnp.asarray of a concrete value compiles a small program
    of its own, in every fresh process)."""
    if is_traced(x):
        return jnp.asarray(x, dtype)
    return jax.device_put(np.asarray(x, dtype))


class HostArray:
    """A concrete NumPy array as a hashable static value (by shape, dtype and bytes): for a
    jitted function that must see it concretely (a fixed-step plan), or a cache key."""

    def __init__(self, value):
        self.value = np.asarray(value)

    def _key(self):
        return (self.value.shape, self.value.dtype.str, self.value.tobytes())

    def __hash__(self):
        return hash(self._key())

    def __eq__(self, other):
        return isinstance(other, HostArray) and self._key() == other._key()


class Bounded(OrderedDict):
    """A mapping that keeps its `size` most recently added entries (a cache of traces or
    programs that must not grow without bound in a long session)."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        while len(self) > self.size:
            self.popitem(last=False)


def any_traced(tree) -> bool:
    return any(is_traced(leaf) for leaf in jax.tree.leaves(tree))


def as_parameter(x):
    """Convert a physical parameter to an array so that `jit` traces it (no recompilation when
    its value changes). Integers become the default float dtype; floats keep their dtype."""
    # device_put of a NumPy value, not jnp.asarray: that compiles a small program (once per
    # dtype and shape, but in every fresh process, before the user's first answer)
    if isinstance(x, (bool, int, float)):  # Python scalars: the default float, not weakly typed
        return to_device(x, jnp.result_type(float))
    if not _numeric(x):
        return x  # a string, None, an object: check_parameter names the field it was given for
    x = x if isinstance(x, jax.Array) or any_traced(x) else to_device(x)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        x = x.astype(jnp.result_type(float))
    return x


def as_optional_parameter(x):
    return None if x is None else as_parameter(x)


def _numeric(x) -> bool:
    """An array, a tracer or array-like data of numbers (not text, None or other objects)."""
    if is_traced(x) or isinstance(x, (jax.Array, np.ndarray, np.number)):
        return True
    try:
        return np.asarray(x).dtype.kind in "biufc"
    except (ValueError, TypeError):  # ragged lists and the like
        return False


def check_parameter(
    owner, name: str, *, positive=False, nonnegative=False, ndim=None, optional=True
) -> None:
    """Validate the field `name` of `owner` (a model or solver) when its value is concrete;
    `optional=False` refuses None."""
    value = getattr(owner, name)
    if value is None:
        if not optional:
            raise ValueError(
                f"{type(owner).__name__}({name}=None): {name} is required; pass a number"
            )
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
    if not _numeric(value) or jnp.issubdtype(jnp.result_type(value), jnp.complexfloating):
        raise TypeError(f"{where}: expected a real number (or an array of them), got {value!r}")
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


# The most steps, iterations or members a loop counter holds: diffsim's loops count in int32
# (also under x64), so a larger bound would wrap around and stop the loop at once.
MAX_COUNT = 2**31 - 1


def is_count(value) -> bool:
    """Whether `value` is a concrete integer (a Python or NumPy int, not a bool): what a count
    that sets a shape or a loop length must be."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def check_static_count(name: str, value, *, minimum: int = 1, maximum: int = MAX_COUNT) -> int:
    """Validate a count that sets a shape or loop length: a Python int in [`minimum`,
    `maximum`] (by default what an int32 loop counter holds); returns it as an int."""
    if not is_count(value):
        raise TypeError(f"{name} must be a Python int (static), got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if value > maximum:
        limit = "2**31 - 1, what the int32 step counter holds" if maximum == MAX_COUNT else maximum
        raise ValueError(f"{name} must be at most {limit}; got {value}")
    return int(value)


def check_real(name: str, value, *, positive=False, nonnegative=False, finite=True) -> float:
    """Validate a concrete real scalar argument (a Python or NumPy number, or a 0-d array;
    not a bool, a string or a complex number); returns it as a float."""
    if not _is_real_scalar(value):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    v = float(value)
    if finite and not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if positive and not v > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    if nonnegative and not v >= 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return v


def _is_real_scalar(value) -> bool:
    """A Python or NumPy real number or a 0-d real array (not a bool, string or complex)."""
    if isinstance(value, (bool, np.bool_)):
        return False
    if isinstance(value, (int, float, np.integer, np.floating)):
        return True
    return (
        isinstance(value, (jax.Array, np.ndarray))
        and np.ndim(value) == 0
        and jnp.result_type(value).kind in "iuf"
    )


def check_key(name: str, key) -> None:
    """A concrete or traced `jax.random` key: a typed key (`jax.random.key(seed)`) or a legacy
    uint32 key of shape (..., 2) (`jax.random.PRNGKey(seed)`)."""
    if isinstance(key, (jax.Array, np.ndarray)) or is_traced(key):
        dtype = key.dtype
        if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
            return
        if dtype == np.uint32 and np.shape(key)[-1:] == (2,):
            return
    raise TypeError(
        f"{name} must be a JAX random key such as jax.random.key(0), got {key!r}"
        + (f" (an int seed? pass jax.random.key({key}))" if isinstance(key, int) else "")
    )


def check_positive_number(name: str, value, *, allow_none=True) -> None:
    """Validate a concrete scalar argument such as `dt` or `max_steps`."""
    if value is None and allow_none:
        return
    if is_traced(value):
        return
    if not _is_real_scalar(value):
        raise TypeError(f"{name} must be a positive number, got {value!r}")
    v = float(value)
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def as_state(y0):
    """The initial state as `simulate` reads it: a list (of numbers, or of arrays of one shape)
    is one array, as `jnp.asarray` reads it, not a pytree of its items. A pytree state is a
    tuple, a dict or a Module. (A list `[1.0, 0.0]` read as a pytree would make a second-order
    model take it as `(q, v)`, a silent change of meaning.)"""
    if isinstance(y0, list):
        try:
            return jnp.asarray(y0) if any_traced(y0) else np.asarray(y0)
        except (ValueError, TypeError):
            raise TypeError(
                "y0 is a list of items of different shapes; pass an array, or a tuple (or "
                "dict) of arrays for a state that is a pytree"
            ) from None
    return y0


def probe_indices(where: str, fn, *args) -> None:
    """Call `fn` once on NumPy arrays shaped like `args` (ones) to catch an index beyond the
    state's shape: JAX clamps such indices (`y[5]` of a 2-component state reads `y[1]`) where
    NumPy raises. Any other failure of the NumPy call is left to the traced checks."""
    import warnings

    def concrete(x):
        shape, dtype = np.shape(x), jnp.result_type(x)
        return np.ones(shape, dtype) if shape else np.asarray(1, dtype)

    probes = jax.tree.map(concrete, args)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            # traced abstractly: NumPy indexes the arrays (and raises), while whatever JAX
            # computes from them is only staged, never compiled and run op by op
            jax.eval_shape(lambda: fn(*probes))
    except IndexError as error:
        shapes = ", ".join(str(np.shape(x)) for x in jax.tree.leaves(args[-1]))
        raise ValueError(
            f"{where} indexes the state beyond its shape ({error}); the state has shape "
            f"{shapes}. (Under JAX an out-of-bounds index is silently clamped to the last "
            "element, so this would read the wrong component.)"
        ) from None
    except Exception:  # noqa: BLE001 - only indexing is probed here
        pass


def as_state_leaf(x):
    """A state leaf as an inexact array (integers become the default float); traced values
    pass through."""
    if not is_traced(x):
        kind = np.asarray(x).dtype.kind if not isinstance(x, jax.Array) else "f"
        if kind not in "biufc":
            raise TypeError(f"the state must hold numbers, got {x!r}")
        x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        x = x.astype(jnp.result_type(float))
    return x


def check_can_write(folder) -> None:
    """Write and remove an empty file in `folder`: raises the `OSError` (read-only, no space,
    no permission) that writing results there would meet, before any expensive work."""
    import os

    probe = os.path.join(os.fspath(folder), f".diffsim-write-test-{os.getpid()}")
    try:
        with open(probe, "w"):
            pass
    finally:
        if os.path.exists(probe):
            os.remove(probe)


def describe(tree, dtypes: bool = False) -> str:
    """The shapes of a pytree of arrays (with their dtypes: `(2,) float32`)."""
    if dtypes:
        leaves = [f"{tuple(x.shape)} {x.dtype}" for x in jax.tree.leaves(tree)]
        return leaves[0] if eqx.is_array(tree) or len(leaves) == 1 else f"[{', '.join(leaves)}]"
    shapes = jax.tree.map(lambda x: tuple(x.shape), tree)
    return str(shapes) if not eqx.is_array(tree) else str(tuple(tree.shape))


# Trace-time checks that passed, by abstract signature (structure, shapes, dtypes, static values)
_PASSED_CHECKS = Bounded(1024)


def once(check, *args) -> None:
    """Run a trace-time check, skipping it when it already passed for arguments of the same
    structure, shapes and dtypes (what these checks depend on). Saves a trace per eager call:
    a second call with new values of the same shapes traces nothing."""
    key = _abstract_signature(check, *args)
    if key is not None and key in _PASSED_CHECKS:
        return
    check(*args)
    if key is not None:
        _PASSED_CHECKS[key] = None


def _abstract_signature(*trees):
    leaves, treedef = jax.tree.flatten(trees)
    signature = []
    for leaf in leaves:
        if isinstance(leaf, (jax.Array, np.ndarray)):
            signature.append((leaf.shape, leaf.dtype, getattr(leaf, "weak_type", False)))
        else:
            signature.append(("value", type(leaf), leaf))
    key = (treedef, tuple(signature))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def user_path(path, what: str = "path") -> Path:
    """A path as a user gives it (str, bytes or os.PathLike): `~` expanded, so that "~/x"
    means the home folder and never a folder named "~" in the working directory; an empty path
    or one holding a NUL character refused (`what` names the argument in the message)."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"{what} must be a path (str or os.PathLike), got {path!r}")
    text = os.fsdecode(os.fspath(path))
    if not text.strip():
        raise ValueError(f"{what} is an empty path")
    if "\x00" in text:
        raise ValueError(f"{what} {text!r} holds a NUL character, which no file system accepts")
    return Path(text).expanduser()
