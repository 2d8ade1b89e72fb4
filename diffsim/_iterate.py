"""`ds.iterate`: a discrete-time stochastic simulator run until it stops, batchable with `vmap`."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from ._validate import check_static_count


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

    def cond(carry):
        state, i, stopped = carry
        return ~stopped & (i < max_steps)

    def body(carry):
        state, i, _ = carry
        state = step(jax.random.fold_in(key, i), state)
        return state, i + 1, jnp.asarray(stop(state), bool)

    state, steps, stopped = lax.while_loop(
        cond, body, (state, jnp.array(0, jnp.int32), jnp.asarray(stop(state), bool))
    )
    return Iterated(state, steps, stopped)
