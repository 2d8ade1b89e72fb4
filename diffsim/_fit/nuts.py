"""One NUTS chain, warm-up and draws, as a single `lax.scan` over blackjax's kernel.

blackjax's `window_adaptation` runs its warm-up in a scan of its own and the draws then need a
second scan over the kernel: two traces of NUTS and of the gradient through the solve, which
measured 6–10 s of extra compile time on the lynx–hare posterior (more than the warm-up's
run). Here Stan's warm-up schedule (blackjax's `build_schedule`), its step-size adaptation
(`dual_averaging_adaptation`) and its mass-matrix adaptation (`mass_matrix_adaptation`) are
composed around one call of the NUTS kernel per iteration, as blackjax composes them in its
(deprecated) `window_adaptation.base`; the iterations after the warm-up use the final step
size and metric and adapt nothing.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class _Adaptation(NamedTuple):
    step: Any  # dual averaging state
    metric: Any  # mass-matrix (Welford) state
    step_size: jax.Array  # in force during the warm-up
    inverse_mass: jax.Array
    final_step_size: jax.Array  # in force after the warm-up
    final_inverse_mass: jax.Array


class Record(NamedTuple):
    """What each iteration of a chain records."""

    position: jax.Array
    logdensity: jax.Array
    diverging: jax.Array
    acceptance: jax.Array
    steps: jax.Array


def schedule(warmup: int, draws: int) -> np.ndarray:
    """Stan's warm-up windows (blackjax's `build_schedule`), then zeros for the draws:
    (warmup + draws, 2) of (slow window?, window ends?). Built outside any trace."""
    from blackjax.adaptation.staged_adaptation import build_schedule

    rows = np.zeros((warmup + draws, 2), np.int32)
    if warmup:
        rows[:warmup] = np.asarray(build_schedule(warmup))
    return rows


def chain(
    logdensity,
    key,
    state,
    inverse_mass,
    windows,
    *,
    warmup: int,
    draws: int,
    target_accept: float,
    dense_mass: bool,
    initial_step_size: float = 0.5,
):
    """Run one chain from the blackjax NUTS `state`: `warmup` adapting iterations, then `draws`.

    `windows` is `schedule(warmup, draws)`. Returns the records of every iteration (each of
    leading size warmup + draws) and the final step size."""
    import blackjax
    from blackjax.adaptation.mass_matrix import mass_matrix_adaptation
    from blackjax.adaptation.step_size import dual_averaging_adaptation

    step_init, step_update, step_final = dual_averaging_adaptation(target_accept)
    metric_init, metric_update, metric_final = mass_matrix_adaptation(not dense_mass)
    kernel = blackjax.nuts.build_kernel()
    dtype = state.position.dtype
    metric = metric_init(state.position.size, inverse_mass)
    first = jnp.asarray(initial_step_size, dtype)
    adaptation = _Adaptation(
        step_init(first), metric, first, metric.inverse_mass_matrix, first, inverse_mass
    )

    def adapt(a: _Adaptation, stage, window_end, position, acceptance):
        """Stan's window adaptation: the step size in every window, the metric's statistics in
        the slow ones, a new metric (and a restarted step size) at each slow window's end."""
        step = step_update(a.step, acceptance)
        metric = jax.lax.cond(
            stage == 1, lambda m: metric_update(m, position), lambda m: m, a.metric
        )
        step_size = jnp.exp(step.log_step_size)

        def close_window(step, metric):
            metric = metric_final(metric)
            step = step_init(step_final(step))
            return step, metric, jnp.exp(step.log_step_size), metric.inverse_mass_matrix

        step, metric, step_size, inverse_mass = jax.lax.cond(
            window_end,
            close_window,
            lambda step, metric: (step, metric, step_size, a.inverse_mass),
            step,
            metric,
        )
        return a._replace(step=step, metric=metric, step_size=step_size, inverse_mass=inverse_mass)

    def body(carry, inputs):
        state, a = carry
        index, key, (stage, window_end) = inputs
        warming = index < warmup
        step_size = jnp.where(warming, a.step_size, a.final_step_size)
        inverse_mass = jnp.where(warming, a.inverse_mass, a.final_inverse_mass)
        state, info = kernel(key, state, logdensity, step_size, inverse_mass)
        adapted = adapt(a, stage, window_end.astype(bool), state.position, info.acceptance_rate)
        last = index == warmup - 1
        adapted = adapted._replace(
            final_step_size=jnp.where(last, step_final(adapted.step), a.final_step_size),
            final_inverse_mass=jnp.where(
                last, adapted.metric.inverse_mass_matrix, a.final_inverse_mass
            ),
        )
        a = jax.tree.map(lambda new, old: jnp.where(warming, new, old), adapted, a)
        record = Record(
            state.position,
            state.logdensity,
            info.is_divergent,
            info.acceptance_rate,
            info.num_integration_steps,
        )
        return (state, a), record

    steps = warmup + draws
    inputs = (jnp.arange(steps), jax.random.split(key, steps), windows)
    (_, a), records = jax.lax.scan(body, (state, adaptation), inputs)
    return records, a.final_step_size


def chains(density, u0, covariance, windows, key_init, key_chains, plan):
    """Every chain of `plan` (chains, warmup, draws, target_accept, dense_mass), vmapped: the
    first starts at `u0`, the others at `u0` spread by `covariance` (`key_init`); a start whose
    density is not finite (a wild member of the spread) starts at `u0`. Returns the chains'
    `records` (iterations first after the chain axis), their step sizes and whether `u0`'s own
    density was finite."""
    import blackjax

    spread = jax.random.normal(key_init, (plan.chains, u0.size), u0.dtype)
    starts = jnp.concatenate([u0[None], u0[None] + spread @ jnp.linalg.cholesky(covariance).T])
    # the log density and its gradient at the centre and at each chain's start in one pass
    states = jax.vmap(lambda u: blackjax.nuts.init(u, density))(starts)
    start_ok = jnp.isfinite(states.logdensity[0])
    finite = jnp.isfinite(states.logdensity[1:])
    states = jax.tree.map(
        lambda x: jnp.where(finite.reshape((-1,) + (1,) * (x.ndim - 1)), x[1:], x[:1]), states
    )
    inverse_mass = covariance if plan.dense_mass else jnp.diag(covariance)
    records, step_size = jax.vmap(
        lambda key, state: chain(
            density,
            key,
            state,
            inverse_mass,
            windows,
            warmup=plan.warmup,
            draws=plan.draws,
            target_accept=plan.target_accept,
            dense_mass=plan.dense_mass,
        )
    )(jax.random.split(key_chains, plan.chains), states)
    return records, step_size, start_ok
