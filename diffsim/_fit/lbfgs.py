"""L-BFGS whose every step is one evaluation of the loss and its gradient, for `ds.train`.

Why by hand: optax's `lbfgs` runs its zoom line search as a loop of its own that evaluates
the loss and gradient besides the step's own evaluation, so a loss that is a differentiated
solve was traced and compiled twice (`ds.train`'s L-BFGS program 10.8 s against Adam's
5.3 s for the tests' UDE); optimistix's `LBFGS` evaluates once a step but its search starts
every step at the unscaled quasi-Newton step, which from a collocated start cost 17× the run
time of optax's for a worse loss at equal steps (measured 2026-12-07). Here the line search
is a state of the loop: each step evaluates the point it tries, and accepts it (Armijo's
sufficient decrease, finite) or tries a shorter one, so the solve is traced once.

The iterate is a flat vector; `project` holds it within bounds (the step actually taken,
projected, is what the decrease is measured along) and directions that point out of an
active bound are cut there.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

_MEMORY = 10  # pairs of steps and gradient changes (optax's and optimistix's default)
_ARMIJO = 1e-4  # sufficient decrease: f(x + s) ≤ f(x) + c ∇f·s
_TRIES = 30  # shortened tries in one search before it restarts from the gradient


class LBFGSState(NamedTuple):
    """The loop state. `x`, `f`, `g`: the last accepted point, its loss and gradient (`f`
    is inf before the first evaluation); `trial`: the point evaluated next, `d` and
    `alpha` the direction and step that gave it, `tries` how many it has shortened;
    `s`, `y`, `rho`: the memory (rows, newest at `count - 1` modulo its size); `done`:
    converged (no further evaluations)."""

    x: jax.Array
    f: jax.Array
    g: jax.Array
    trial: jax.Array
    d: jax.Array
    alpha: jax.Array
    tries: jax.Array
    s: jax.Array
    y: jax.Array
    rho: jax.Array
    count: jax.Array
    done: jax.Array


def lbfgs_init(x: jax.Array) -> LBFGSState:
    """The state whose first step evaluates `x` (flat, shape (n,))."""
    n, dtype = x.shape[0], x.dtype
    zero = jnp.zeros((), dtype)
    return LBFGSState(
        x=x,
        f=jnp.asarray(jnp.inf, dtype),
        g=jnp.zeros_like(x),
        trial=x,
        d=jnp.zeros_like(x),
        alpha=zero,
        tries=jnp.zeros((), jnp.int32),
        s=jnp.zeros((_MEMORY, n), dtype),
        y=jnp.zeros((_MEMORY, n), dtype),
        rho=jnp.zeros((_MEMORY,), dtype),
        count=jnp.zeros((), jnp.int32),
        done=jnp.zeros((), bool),
    )


def lbfgs_step(value_and_grad, project, state: LBFGSState) -> tuple[LBFGSState, jax.Array]:
    """One step: evaluates `state.trial` (`value_and_grad(x) -> (loss, gradient)`, flat)
    and accepts it or shortens the step; returns (the state, whether the loss and gradient
    there were finite). `project(x)`: x held within its bounds. Converged (`done`) where an
    accepted full step changes every coordinate and the loss by less than 100 ulp of their
    size, or where no direction is left (every component cut at a bound)."""
    f_new, g_new = value_and_grad(state.trial)
    finite = jnp.isfinite(f_new) & jnp.all(jnp.isfinite(g_new))
    step = state.trial - state.x
    started = jnp.isfinite(state.f)
    decrease = f_new <= state.f + _ARMIJO * jnp.dot(state.g, step)
    accept = finite & (~started | decrease)
    accepted = _accepted(project, state, f_new, g_new, step)
    shortened = _shortened(project, state)
    return jax.tree.map(lambda a, b: jnp.where(accept, a, b), accepted, shortened), finite


def _accepted(project, state, f_new, g_new, step) -> LBFGSState:
    """The state after the trial point is accepted: the memory takes the pair (step,
    gradient change) where its curvature is positive, and the next trial is the full
    quasi-Newton step from there."""
    started = jnp.isfinite(state.f)
    change = g_new - state.g
    curvature = jnp.dot(step, change)
    keep = started & (curvature > 1e-10 * jnp.linalg.norm(step) * jnp.linalg.norm(change))
    slot = state.count % _MEMORY
    s = jnp.where(keep, state.s.at[slot].set(step), state.s)
    y = jnp.where(keep, state.y.at[slot].set(change), state.y)
    rho = jnp.where(keep, state.rho.at[slot].set(1.0 / jnp.where(keep, curvature, 1.0)), state.rho)
    count = state.count + keep.astype(jnp.int32)
    x = state.trial
    d = _direction(g_new, s, y, rho, count)
    d = _within_bounds(project, x, d)
    # not a descent direction (the memory misleads where bounds cut it): the gradient
    restart = ~(jnp.dot(g_new, d) < 0)
    d = jnp.where(restart, _within_bounds(project, x, -_first_scale(g_new) * g_new), d)
    count = jnp.where(restart, 0, count)
    scale = lambda v: jnp.maximum(jnp.abs(v), 1.0)  # noqa: E731
    tolerance = 100 * jnp.finfo(x.dtype).eps
    # only a full step counts (a step the search shortened is small for another reason)
    converged = (
        started
        & (state.alpha == 1)
        & (jnp.max(jnp.abs(step) / scale(x)) < tolerance)
        & (jnp.abs(f_new - state.f) < tolerance * scale(f_new))
    )
    return LBFGSState(
        x=x,
        f=f_new,
        g=g_new,
        trial=project(x + d),
        d=d,
        alpha=jnp.ones_like(state.alpha),
        tries=jnp.zeros_like(state.tries),
        s=s,
        y=y,
        rho=rho,
        count=count,
        done=converged | ~jnp.any(d != 0),
    )


def _shortened(project, state) -> LBFGSState:
    """The state after the trial point is rejected (too little decrease, or a loss or
    gradient that is not finite: a failed solve): half the step; after `_TRIES` halvings,
    the memory is dropped and the search restarts along the (scaled) gradient."""
    alpha = 0.5 * state.alpha
    tries = state.tries + 1
    restart = tries > _TRIES
    gradient = _within_bounds(project, state.x, -_first_scale(state.g) * state.g)
    d = jnp.where(restart, gradient, state.d)
    alpha = jnp.where(restart, jnp.ones_like(alpha), alpha)
    return state._replace(
        trial=project(state.x + alpha * d),
        d=d,
        alpha=alpha,
        tries=jnp.where(restart, 0, tries),
        count=jnp.where(restart, 0, state.count),
        # a restart that cannot move (the gradient is cut at every bound) ends the search
        done=restart & ~jnp.any(d != 0),
    )


def _first_scale(g):
    """The first step's length along −g: at most 1 (optax's choice, a step of at most 1 in
    the norm before any curvature is known)."""
    return jnp.minimum(1.0, 1.0 / jnp.maximum(jnp.linalg.norm(g), 1e-300))


def _direction(g, s, y, rho, count):
    """−H g by the two-loop recursion over the `min(count, memory)` newest pairs (Nocedal
    & Wright, Algorithm 7.4), H₀ = (s·y / y·y) I from the newest pair."""
    used = jnp.minimum(count, _MEMORY)

    def backward(i, carry):
        q, a = carry
        slot = (count - 1 - i) % _MEMORY
        ai = jnp.where(i < used, rho[slot] * jnp.dot(s[slot], q), 0.0)
        return q - ai * y[slot], a.at[slot].set(ai)

    q, a = jax.lax.fori_loop(0, _MEMORY, backward, (g, jnp.zeros_like(rho)))
    newest = (count - 1) % _MEMORY
    yy = jnp.dot(y[newest], y[newest])
    gamma = jnp.where((used > 0) & (yy > 0), 1.0 / (rho[newest] * jnp.where(yy > 0, yy, 1.0)), 1.0)
    r = jnp.where(used > 0, gamma * q, _first_scale(g) * q)

    def forward(i, r):
        slot = (count - used + i) % _MEMORY
        b = rho[slot] * jnp.dot(y[slot], r)
        return jnp.where(i < used, r + s[slot] * (a[slot] - b), r)

    return -jax.lax.fori_loop(0, _MEMORY, forward, r)


def _within_bounds(project, x, d):
    """`d` without its components that point out of a bound `x` lies on."""
    lower = project(jnp.full_like(x, -jnp.inf))
    upper = project(jnp.full_like(x, jnp.inf))
    out = ((x <= lower) & (d < 0)) | ((x >= upper) & (d > 0))
    return jnp.where(out, 0.0, d)
