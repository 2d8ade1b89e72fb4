"""The optimisation loops behind `ds.fit`: optimistix least squares / minimisation, or optax.

Each takes a residual function `u -> r` (flat vectors) and a start `u0`, and returns the optimum
with a loss history, all inside one compiled program (so that starts and profile points can be
batched with `vmap`). The optimistix solvers are stepped here rather than through
`optx.least_squares` only to record the loss at every iteration.
"""

import dataclasses
import enum
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import optimistix as optx
from jax import lax

from .lm import ScaledLevenbergMarquardt

METHODS = ("lm", "gauss-newton", "bfgs")


class FIT_RESULTS(enum.IntEnum):
    """How an optimisation ended; `Optimum.code` holds these values as an int array.

    `converged` (0), `max_iterations_reached` (1), `nonfinite_iterate` (2), `optimizer_failed`
    (3), `stalled` (4). `FIT_RESULTS(code).message` says what happened and what to do
    (`FitResult.reason`)."""

    converged = 0
    max_iterations_reached = 1
    nonfinite_iterate = 2
    optimizer_failed = 3
    stalled = 4

    @property
    def message(self) -> str:
        return _MESSAGES[self]


_MESSAGES = {
    FIT_RESULTS.converged: (
        "converged: the step and the change of the loss fell below rtol/atol, or no step "
        "above them lowers the loss"
    ),
    FIT_RESULTS.max_iterations_reached: (
        "stopped after max_iterations iterations before converging: raise max_iterations or "
        "improve the guess"
    ),
    FIT_RESULTS.nonfinite_iterate: (
        "the iterate became non-finite (the model could not be simulated there)"
    ),
    FIT_RESULTS.optimizer_failed: (
        "the optimiser failed (e.g. a singular linear solve); try method='lm'"
    ),
    FIT_RESULTS.stalled: (
        "stalled: no step lowers the loss although its gradient is far from zero (the "
        "derivatives disagree with the objective there: a simulation that fails or is inexact "
        "near the iterate); tighten the solver's rtol/atol, or start elsewhere"
    ),
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
    code: jax.Array  # a FIT_RESULTS value
    aux: Any = None  # `bounded_lm.minimize(..., has_aux=True)`: the residual function's
    # auxiliary output at `u`
    residuals: Any = None  # `bounded_lm.minimize`: the residuals at `u`
    jacobian: Any = None  # `bounded_lm.minimize`: their Jacobian there, (residuals, unknowns)


def optimize(residual_fn, u0, optimizer: Optimizer, num_residuals: int | None = None) -> Optimum:
    """Minimise `sum(residual_fn(u) ** 2)` from `u0`. Traceable (call it inside `jit`/`vmap`).
    `num_residuals`, the length of `residual_fn`'s output when known, spares a trace of it."""
    if optimizer.is_optax:
        return _optimize_optax(residual_fn, u0, optimizer)
    return _optimize_optimistix(residual_fn, u0, optimizer, num_residuals)


def _solver(optimizer: Optimizer):
    rtol, atol = optimizer.rtol, optimizer.atol
    if optimizer.method == "lm":
        return ScaledLevenbergMarquardt(rtol=rtol, atol=atol), True
    if optimizer.method == "gauss-newton":
        return optx.GaussNewton(rtol=rtol, atol=atol), True
    if optimizer.method == "bfgs":
        return optx.BFGS(rtol=rtol, atol=atol), False
    raise ValueError(f"unknown method {optimizer.method!r}; choose one of {METHODS} or optax")


class _OptimistixState(NamedTuple):
    """The carry of the optimistix loop."""

    u: jax.Array  # the current iterate, unconstrained coordinates
    solver_state: Any  # the array leaves of the optimistix solver's state (static part apart)
    step: jax.Array  # iterations taken so far
    history: jax.Array  # (max_steps + 1,) best loss after each step, NaN ahead of the loop
    done: jax.Array  # the solver terminated (converged or failed)
    code: jax.Array  # the FIT_RESULTS value the loop ends with, if it ends now


def _optimize_optimistix(residual_fn, u0, optimizer: Optimizer, num_residuals) -> Optimum:
    solver, least_squares = _solver(optimizer)

    def fn(u, args):
        r = residual_fn(u)
        loss = jnp.sum(r**2)
        return (r if least_squares else 0.5 * loss), loss

    options = {"jac": optimizer.jac} if least_squares else {}
    tags = frozenset()
    if num_residuals is None:
        f_struct, aux_struct = jax.eval_shape(lambda u: fn(u, None), u0)
    else:  # the shapes without tracing the residuals (a whole simulation) once more
        scalar = jax.ShapeDtypeStruct((), u0.dtype)
        f_struct = jax.ShapeDtypeStruct((num_residuals,), u0.dtype) if least_squares else scalar
        aux_struct = scalar
    state = _match_dtype(solver.init(fn, u0, None, options, f_struct, aux_struct, tags), u0.dtype)
    dynamic, static = eqx.partition(state, eqx.is_array)
    # history[i]: the smallest loss among the points evaluated in steps 0..i (step i evaluates
    # the point proposed by step i - 1; step 0 evaluates u0). Every evaluation of the residuals
    # happens inside the solver's step: each extra one would add a copy of the solve to the
    # compiled program.
    history = jnp.full(optimizer.max_steps + 1, jnp.nan, u0.dtype)

    def cond(carry: _OptimistixState):
        return ~carry.done & (carry.step < optimizer.max_steps)

    def body(carry: _OptimistixState) -> _OptimistixState:
        step = carry.step
        state = eqx.combine(static, carry.solver_state)
        u, state, loss = solver.step(fn, carry.u, None, options, state, tags)
        terminate, result = solver.terminate(fn, u, None, options, state, tags)
        terminate = terminate | (_negligible(state.y_eval - u, u, optimizer) & (step > 0))
        previous = jnp.where(step > 0, carry.history[jnp.maximum(step - 1, 0)], jnp.inf)
        history = carry.history.at[step].set(jnp.fmin(previous, loss))
        finite = jnp.all(jnp.isfinite(u))
        succeeded = result == optx.RESULTS.successful
        code = jnp.where(
            ~finite,
            FIT_RESULTS.nonfinite_iterate,
            jnp.where(succeeded, FIT_RESULTS.converged, FIT_RESULTS.optimizer_failed),
        )
        return _OptimistixState(
            u=u,
            solver_state=eqx.filter(state, eqx.is_array),
            step=step + 1,
            history=history,
            done=terminate | ~finite | ~succeeded,
            code=code,
        )

    init = _OptimistixState(
        u=u0,
        solver_state=dynamic,
        step=jnp.array(0),
        history=history,
        done=jnp.array(False),
        code=jnp.array(FIT_RESULTS.converged),
    )
    final = lax.while_loop(cond, body, init)
    code = jnp.where(final.done, final.code, FIT_RESULTS.max_iterations_reached)
    loss = final.history[jnp.maximum(final.step - 1, 0)]
    return Optimum(final.u, loss, final.history, final.step, final.step, code)


def _negligible(proposal, u, optimizer: Optimizer):
    """Whether the next proposed step is below the tolerances in every unknown (|δu| <= atol +
    rtol |u|): the trust region has shrunk until no step the iterate can resolve lowers the
    loss. MINPACK's `lmder` stops there too (its xtol test, applied after rejected steps as
    well); optimistix tests only after accepted steps and also asks the residuals to change
    by less than rtol, which an adaptive solve's own error (steps that change with the
    parameters) can keep from ever happening at an optimum: the fit would then spend its whole
    iteration budget there and report no convergence."""
    scale = optimizer.atol + optimizer.rtol * jnp.abs(u)
    return jnp.all(jnp.abs(proposal) <= scale)


def _match_dtype(state, dtype):
    """Cast the solver state's floating scalars to the problem's dtype: optimistix starts its
    trust-region radius as `jnp.array(1.0)`, which is float64 when x64 is enabled and then
    clashes with a float32 problem in the linear solve."""

    def cast(x):
        if eqx.is_inexact_array(x) and x.ndim == 0 and x.dtype != dtype:
            return x.astype(dtype)
        return x

    return jax.tree.map(cast, state)


class _OptaxState(NamedTuple):
    """The carry of the optax loop."""

    u: jax.Array  # the current iterate, unconstrained coordinates
    transform_state: Any  # the optax transformation's state
    best_u: jax.Array  # the iterate with the smallest loss so far
    best_loss: jax.Array  # its loss (inf until a finite one is seen)
    best_gradient: jax.Array  # the largest absolute gradient entry there


def _optimize_optax(residual_fn, u0, optimizer: Optimizer) -> Optimum:
    transform = optimizer.method

    def loss_fn(u):
        return jnp.sum(residual_fn(u) ** 2)

    def step(carry: _OptaxState, _):
        u = carry.u
        loss, grad = jax.value_and_grad(loss_fn)(u)
        better = loss < carry.best_loss  # NaN never counts as better
        best_loss = jnp.where(better, loss, carry.best_loss)
        updates, transform_state = transform.update(grad, carry.transform_state, u)
        return _OptaxState(
            u=u + updates,
            transform_state=transform_state,
            best_u=jnp.where(better, u, carry.best_u),
            best_loss=best_loss,
            best_gradient=jnp.where(better, jnp.max(jnp.abs(grad)), carry.best_gradient),
        ), best_loss

    # optax mixes its int32 step count with floats; under JAX's strict dtype promotion that
    # would fail inside optax, so its updates are traced with standard promotion.
    with jax.numpy_dtype_promotion("standard"):
        inf = jnp.asarray(jnp.inf, u0.dtype)
        init = _OptaxState(u0, transform.init(u0), u0, inf, inf)
        final, history = lax.scan(step, init, None, length=optimizer.max_steps)
    u, loss, grad = final.best_u, final.best_loss, final.best_gradient
    # An optax run spends its whole step budget; it counts as converged when the gradient at the
    # best point is small against the loss (no step rule of its own decides this).
    small = grad <= optimizer.atol + 1e-3 * (1.0 + loss)
    code = jnp.where(
        jnp.isfinite(loss),
        jnp.where(small, FIT_RESULTS.converged, FIT_RESULTS.max_iterations_reached),
        FIT_RESULTS.nonfinite_iterate,
    )
    steps = jnp.array(optimizer.max_steps)
    history = jnp.concatenate([history, jnp.full(1, jnp.nan, u0.dtype)])
    return Optimum(u, loss, history, steps, steps, code)
