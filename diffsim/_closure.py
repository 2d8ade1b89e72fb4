"""Functions that close over traced values: a model function or an event condition written
inside a function that `jax.grad`, `jax.jit` or `jax.vmap` transforms (`lambda t, y, p: -k * y`
with `k` traced).

The adaptive solves carry custom derivative rules and compiled loops that take the model and
the events as arguments; a traced value hidden in a closure would leak into them as a constant
("No constant handler for type ... Tracer"). `lift_closure` turns such a function into an
equivalent pytree whose closed-over arrays are leaves (`equinox.filter_closure_convert`), so
they are traced and differentiated like parameters. Functions without closed-over tracers are
left as they are: a converted function is a new object on every call, which a jitted solve
would compile again for.
"""

import functools
from collections.abc import Callable

import equinox as eqx
import jax

# how deep nested closures (a closure over a function that closes over a tracer) are searched
_DEPTH = 4


def closes_over_tracer(fn, depth: int = _DEPTH) -> bool:
    """Whether `fn` (a function, a `functools.partial`, a bound method) holds a traced value in
    its closure cells, default arguments, partial arguments or bound object."""
    if depth == 0 or isinstance(fn, eqx.Module):  # a Module's arrays are leaves already
        return False
    held = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            held.append(cell.cell_contents)
        except ValueError:  # a cell not filled yet
            continue
    held += list(getattr(fn, "__defaults__", None) or ())
    if isinstance(fn, functools.partial):
        held += [fn.func, *fn.args, *fn.keywords.values()]
    if hasattr(fn, "__self__"):
        held.append(fn.__self__)
    for obj in held:
        if isinstance(obj, jax.core.Tracer):
            return True
        if callable(obj) and not isinstance(obj, type) and closes_over_tracer(obj, depth - 1):
            return True
        if isinstance(obj, (list, tuple, dict, eqx.Module)) and any(
            isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(obj)
        ):
            return True
    return False


def lift_closure(fn: Callable, *example) -> Callable:
    """`fn`, or, when it closes over traced values, an equivalent pytree callable holding them
    as leaves (traced at `example`, the arguments it will be called with: same structure,
    shapes and dtypes)."""
    if not closes_over_tracer(fn):
        return fn
    return eqx.filter_closure_convert(fn, *example)
