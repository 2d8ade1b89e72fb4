"""What `ds.sweep` keeps of each member's solution: named reductions and the naming of outputs.

A reduction maps one member's `Solution` to a small pytree, so that a sweep's memory and storage
grow with the number of members, not with members × times.
"""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp

from .._integrate.simulate import Solution


def _trajectory(sol: Solution):
    return {"y": sol.ys}


def _final_state(sol: Solution):
    return {"final_state": jax.tree.map(lambda y: y[-1], sol.ys)}


def _max_abs(sol: Solution):
    return {"max_abs": jax.tree.map(lambda y: jnp.max(jnp.abs(y), axis=0), sol.ys)}


def _mean(sol: Solution):
    return {"mean": jax.tree.map(lambda y: jnp.mean(y, axis=0), sol.ys)}


# name -> (function, the dimensions each output adds after the member dimensions, for a flat
# array state; "state" is labelled with the model's state_names).
REDUCERS: dict[str, tuple[Callable, dict[str, tuple[str, ...]]]] = {
    "trajectory": (_trajectory, {"y": ("time", "state")}),
    "final_state": (_final_state, {"final_state": ("state",)}),
    "max_abs": (_max_abs, {"max_abs": ("state",)}),
    "mean": (_mean, {"mean": ("state",)}),
}


def resolve_reduce(reduce) -> tuple[Callable, dict[str, tuple[str, ...]], str | None]:
    """`reduce` (None, a name from `REDUCERS`, or a callable) → (function, known output dims,
    its name, None for a user's function)."""
    if reduce is None:
        reduce = "trajectory"
    if isinstance(reduce, str):
        if reduce not in REDUCERS:
            raise ValueError(
                f"unknown reduce {reduce!r}; choose one of {sorted(REDUCERS)} or pass a function "
                "solution -> pytree"
            )
        function, dims = REDUCERS[reduce]
        return function, dims, reduce
    if not callable(reduce):
        raise TypeError(f"reduce must be None, a name or a function, got {reduce!r}")
    return reduce, {}, None


def name_outputs(tree) -> dict[str, jax.Array]:
    """Flatten a reduction's output into named variables: a dict's keys name its entries (a
    nested pytree under a key becomes `key_0`, `key_1`, …); a bare array is `output`."""
    if not isinstance(tree, dict):
        tree = {"output": tree}
    named = {}
    for key, value in tree.items():
        if not isinstance(key, str) or not key.isidentifier():
            raise ValueError(f"reduce output names must be identifiers, got {key!r}")
        leaves = jax.tree.leaves(value)
        if not leaves:
            raise ValueError(f"the reduce output {key!r} holds no arrays (got {value!r})")
        for leaf in leaves:
            if not (isinstance(leaf, (int, float, bool)) or eqx.is_array(leaf)) or not (
                jnp.issubdtype(jnp.result_type(leaf), jnp.number)
                or jnp.result_type(leaf) == jnp.bool_
            ):
                raise TypeError(f"the reduce output {key!r} must be numbers (arrays), got {leaf!r}")
        if len(leaves) == 1 and not isinstance(value, (tuple, list, dict)):
            named[key] = jnp.asarray(leaves[0])
        else:
            for i, leaf in enumerate(leaves):
                named[f"{key}_{i}"] = jnp.asarray(leaf)
    return named
