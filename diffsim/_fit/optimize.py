"""The optimisation loops behind `ds.fit`: optimistix least squares / minimisation, or optax.

Each takes a residual function `u -> r` (flat vectors) and a start `u0`, and returns the optimum
with a loss history, all inside one compiled program (so that starts and profile points can be
batched with `vmap`). The optimistix solvers are stepped here rather than through
`optx.least_squares` only to record the loss at every iteration.
"""

import dataclasses
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import optimistix as optx
from jax import lax

METHODS = ("lm", "gauss-newton", "bfgs")

# How an optimisation ended (`Optimum.code`).
CONVERGED, MAX_STEPS, NONFINITE, FAILED = 0, 1, 2, 3
REASONS = {
    CONVERGED: "converged: the step and the change of the loss fell below rtol/atol",
    MAX_STEPS: (
        "stopped after max_iterations iterations before converging: raise max_iterations or "
        "improve the guess"
    ),
    NONFINITE: "the iterate became non-finite (the model could not be simulated there)",
    FAILED: "the optimiser failed (e.g. a singular linear solve); try method='lm'",
}


@dataclasses.dataclass(frozen=True)
class Optimizer:
    """A static description of the optimisation: `method` is "lm", "gauss-newton", "bfgs" or an
    optax `GradientTransformation`; `jac` is "fwd" or "bwd" (the residual Jacobian's mode)."""

    method: Any
    max_steps: int
    rtol: float
    atol: float
    jac: str = "fwd"

    @property
    def is_optax(self) -> bool:
        return not isinstance(self.method, str)

    def __hash__(self):
        return hash((id(self.method), self.max_steps, self.rtol, self.atol, self.jac))

    def __eq__(self, other):
        return isinstance(other, Optimizer) and hash(self) == hash(other)


class Optimum(eqx.Module):
    """What an optimisation returns (arrays; batched along a leading axis under `vmap`)."""

    u: jax.Array  # the optimum, unconstrained coordinates
    loss: jax.Array  # sum of squared residuals: the smallest evaluated, which for optimistix
    # lags the final accepted `u` by at most one step (within rtol at convergence); `ds.fit`
    # reports the exact loss at `u`, computed after the loop
    history: jax.Array  # (max_steps + 1,): history[0] the loss at u0, history[i] the best loss
    # evaluated up to step i; NaN after the last step
    steps: jax.Array  # iterations taken
    evaluations: jax.Array  # residual evaluations (simulations), Jacobians not counted
    code: jax.Array  # CONVERGED, MAX_STEPS, NONFINITE or FAILED


def optimize(residual_fn, u0, optimizer: Optimizer) -> Optimum:
    """Minimise `sum(residual_fn(u) ** 2)` from `u0`. Traceable (call it inside `jit`/`vmap`)."""
    if optimizer.is_optax:
        return _optimize_optax(residual_fn, u0, optimizer)
    return _optimize_optimistix(residual_fn, u0, optimizer)


def _solver(optimizer: Optimizer):
    rtol, atol = optimizer.rtol, optimizer.atol
    if optimizer.method == "lm":
        return optx.LevenbergMarquardt(rtol=rtol, atol=atol), True
    if optimizer.method == "gauss-newton":
        return optx.GaussNewton(rtol=rtol, atol=atol), True
    if optimizer.method == "bfgs":
        return optx.BFGS(rtol=rtol, atol=atol), False
    raise ValueError(f"unknown method {optimizer.method!r}; choose one of {METHODS} or optax")


def _optimize_optimistix(residual_fn, u0, optimizer: Optimizer) -> Optimum:
    solver, least_squares = _solver(optimizer)

    def fn(u, args):
        r = residual_fn(u)
        loss = jnp.sum(r**2)
        return (r if least_squares else 0.5 * loss), loss

    options = {"jac": optimizer.jac} if least_squares else {}
    tags = frozenset()
    f_struct, aux_struct = jax.eval_shape(lambda u: fn(u, None), u0)
    state = _match_dtype(solver.init(fn, u0, None, options, f_struct, aux_struct, tags), u0.dtype)
    dynamic, static = eqx.partition(state, eqx.is_array)
    # history[i]: the smallest loss among the points evaluated in steps 0..i (step i evaluates
    # the point proposed by step i - 1; step 0 evaluates u0). Every evaluation of the residuals
    # happens inside the solver's step: each extra one would add a copy of the solve to the
    # compiled program.
    history = jnp.full(optimizer.max_steps + 1, jnp.nan, u0.dtype)

    def cond(carry):
        u, dynamic, step, history, done, code = carry
        return ~done & (step < optimizer.max_steps)

    def body(carry):
        u, dynamic, step, history, done, code = carry
        state = eqx.combine(static, dynamic)
        u, state, loss = solver.step(fn, u, None, options, state, tags)
        terminate, result = solver.terminate(fn, u, None, options, state, tags)
        previous = jnp.where(step > 0, history[jnp.maximum(step - 1, 0)], jnp.inf)
        history = history.at[step].set(jnp.fmin(previous, loss))
        finite = jnp.all(jnp.isfinite(u))
        code = jnp.where(
            ~finite,
            NONFINITE,
            jnp.where(result == optx.RESULTS.successful, CONVERGED, FAILED),
        )
        done = terminate | ~finite | (result != optx.RESULTS.successful)
        return u, eqx.filter(state, eqx.is_array), step + 1, history, done, code

    carry = (u0, dynamic, jnp.array(0), history, jnp.array(False), jnp.array(CONVERGED))
    u, dynamic, steps, history, done, code = lax.while_loop(cond, body, carry)
    code = jnp.where(done, code, MAX_STEPS)
    loss = history[jnp.maximum(steps - 1, 0)]
    return Optimum(u, loss, history, steps, steps, code)


def _match_dtype(state, dtype):
    """Cast the solver state's floating scalars to the problem's dtype: optimistix starts its
    trust-region radius as `jnp.array(1.0)`, which is float64 when x64 is enabled and then
    clashes with a float32 problem in the linear solve."""

    def cast(x):
        if eqx.is_inexact_array(x) and x.ndim == 0 and x.dtype != dtype:
            return x.astype(dtype)
        return x

    return jax.tree.map(cast, state)


def _optimize_optax(residual_fn, u0, optimizer: Optimizer) -> Optimum:
    transform = optimizer.method

    def loss_fn(u):
        return jnp.sum(residual_fn(u) ** 2)

    def step(carry, _):
        u, opt_state, best_u, best, best_grad = carry
        loss, grad = jax.value_and_grad(loss_fn)(u)
        better = loss < best  # NaN never counts as better
        best_u = jnp.where(better, u, best_u)
        best = jnp.where(better, loss, best)
        best_grad = jnp.where(better, jnp.max(jnp.abs(grad)), best_grad)
        updates, opt_state = transform.update(grad, opt_state, u)
        return (u + updates, opt_state, best_u, best, best_grad), best

    # optax mixes its int32 step count with floats; under JAX's strict dtype promotion that
    # would fail inside optax, so its updates are traced with standard promotion.
    with jax.numpy_dtype_promotion("standard"):
        inf = jnp.asarray(jnp.inf, u0.dtype)
        init = (u0, transform.init(u0), u0, inf, inf)
        (_, _, u, loss, grad), history = lax.scan(step, init, None, length=optimizer.max_steps)
    # An optax run spends its whole step budget; it counts as converged when the gradient at the
    # best point is small against the loss (no step rule of its own decides this).
    small = grad <= optimizer.atol + 1e-3 * (1.0 + loss)
    code = jnp.where(jnp.isfinite(loss), jnp.where(small, CONVERGED, MAX_STEPS), NONFINITE)
    steps = jnp.array(optimizer.max_steps)
    history = jnp.concatenate([history, jnp.full(1, jnp.nan, u0.dtype)])
    return Optimum(u, loss, history, steps, steps, code)
