"""`ds.iterate`: a discrete-time stochastic simulator run until it stops, batchable with `vmap`."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from .._compile import jit
from .._validate import check_key, check_static_count, once


class Iterated(NamedTuple):
    """What `ds.iterate` returns: the last `state`, the number of `steps` taken, and whether
    `stop` held (`stopped`; False means `max_steps` ran out first)."""

    state: object
    steps: jax.Array
    stopped: jax.Array


def iterate(step, state, key, *, stop, max_steps: int) -> Iterated:
    """Apply `state = step(key_i, state)` for i = 0, 1, … until `stop(state)` is True or
    `max_steps` steps have run.

    **Arguments:**

    - `step(key, state) -> state`: one step of a discrete-time (e.g. Monte Carlo) simulator;
      the same pytree structure, shapes and dtypes in and out.
    - `state`: the initial state (a pytree).
    - `key`: a `jax.random` key; step i draws from `jax.random.fold_in(key, i)`, so a member's
      path depends on its key and the step only (not on the batch it runs in).
    - `stop(state) -> bool`: checked before every step (a state that starts stopped takes none).
    - `max_steps`: static bound on the number of steps.

    **Returns:** an `Iterated(state, steps, stopped)`.

    One `lax.while_loop`: alone it exits as soon as `stop` holds. Under `jax.vmap` (one key per
    member) JAX runs the batched loop until the last member stops, and members that have stopped
    keep their state unchanged meanwhile (they still cost their share of each batched step; see
    `experiments/bench/early_exit.py` for the cost against a fixed-horizon scan).
    """
    check_static_count("max_steps", max_steps)
    check_key("key", key)
    if not callable(step) or not callable(stop):
        raise TypeError(
            "step and stop must be functions: step(key, state) -> state, stop(state) -> bool; "
            f"got step={step!r}, stop={stop!r}"
        )
    once(_check_functions, step, stop, state, key)
    return _iterate(step, stop, state, key, max_steps=max_steps)


@jit
def _iterate(step, stop, state, key, *, max_steps: int) -> Iterated:
    """The loop, compiled once per (step, stop) pair and state structure: run eagerly, the
    while loop and the first stop test would each compile again on every call."""

    def cond(carry):
        state, i, stopped = carry
        return ~stopped & (i < max_steps)

    def body(carry):
        state, i, _ = carry
        state = step(jax.random.fold_in(key, i), state)
        return state, i + 1, jnp.asarray(stop(state))

    state, steps, stopped = lax.while_loop(
        cond, body, (state, jnp.array(0, jnp.int32), jnp.asarray(stop(state)))
    )
    return Iterated(state, steps, stopped)


def _check_functions(step, stop, state, key) -> None:
    """At trace time: `stop` returns one boolean, `step` keeps the state's structure, shapes
    and dtypes, and takes the key first."""
    try:
        stopped = jax.eval_shape(stop, state)
    except Exception as error:
        raise TypeError(f"ds.iterate: stop(state) failed on the initial state: {error}") from None
    if not (hasattr(stopped, "dtype") and stopped.shape == () and stopped.dtype == jnp.bool_):
        raise TypeError(
            "ds.iterate: stop(state) must return one boolean (e.g. state[0] > 1.0), got "
            f"{getattr(stopped, 'shape', stopped)} {getattr(stopped, 'dtype', '')}; a number "
            "is not a stop condition"
        )
    try:
        stepped = jax.eval_shape(lambda k, s: step(jax.random.fold_in(k, 0), s), key, state)
    except Exception as error:
        raise TypeError(
            f"ds.iterate: step(key, state) failed ({error}); step takes the key first, then the "
            "state"
        ) from None

    def shapes(tree):
        return jax.tree.map(lambda x: (jnp.shape(x), jnp.result_type(x)), tree)

    if jax.tree.structure(stepped) != jax.tree.structure(state) or shapes(stepped) != shapes(state):
        raise TypeError(
            "ds.iterate: step(key, state) must return a state like the one it takes (same "
            f"structure, shapes and dtypes): got {shapes(stepped)} for {shapes(state)}"
        )
