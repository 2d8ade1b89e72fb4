"""Compiled evaluations of a fitting problem at given natural unknowns: the trajectory, the
continuity defects of multiple shooting, the residual Jacobian and the Hessian of the loss; and
the fine time grid of a fitted curve.

`ds.fit` computes them while fitting, `ds.FitResult` again on demand (its curve, its Laplace
covariance), so they live below both.
"""

import jax
import jax.numpy as jnp
import numpy as np

from .._compile import jit
from .problem import Problem


@jit
def trajectory(problem: Problem, p):
    """The states at every simulation time of `problem` for the natural unknowns `p` (window
    starts, if any, included), shape (times, state size)."""
    model, y0, nodes = problem.assemble(p)
    states, _ = problem.states(model, y0, nodes)
    return states


@jit
def largest_defects(problem: Problem, p_batch):
    """The largest continuity defect of each multiple-shooting solution in the batch."""

    def one(p):
        model, y0, nodes = problem.assemble(p)
        _, defects = problem.states(model, y0, nodes)
        return jnp.max(jnp.abs(defects))

    return jax.vmap(one)(p_batch)


@jit
def at_optimum(problem: Problem, p, jac: str):
    """Residual Jacobian, the predictions and the data residuals (times, observables) at `p`,
    in one compiled program."""

    def residuals(q):  # the residuals, and (them, the predictions) as auxiliary outputs
        model, y0, nodes = problem.assemble(q)
        states, _ = problem.states(model, y0, nodes)
        observed = problem.observed(states)
        r = problem.data_residuals(observed)
        return r.ravel(), (r, observed)

    differentiate = jax.jacfwd if jac == "fwd" else jax.jacrev
    jacobian, (r, observed) = differentiate(residuals, has_aux=True)(p)
    return jacobian, observed, r


@jit
def loss_hessian(problem: Problem, p, jac: str):
    """The Hessian of half the loss at `p` (natural coordinates)."""
    if jac == "fwd":
        # H = JᵀJ + Σ rᵢ ∇²rᵢ, forward over forward (faster to compile than reverse mode); the
        # inner pass's value and Jacobian come out of the outer pass as auxiliary outputs.
        def first(q):
            jacobian, r = jax.jacfwd(
                lambda x: (lambda y: (y, y))(problem.residuals(x)), has_aux=True
            )(q)
            return jacobian, (jacobian, r)

        second, (jacobian, r) = jax.jacfwd(first, has_aux=True)(p)
        return jacobian.T @ jacobian + jnp.einsum("i,ijk->jk", r, second)
    return jax.hessian(lambda q: 0.5 * jnp.sum(problem.residuals(q) ** 2))(p)


def fine_times(problem: Problem, points: int) -> np.ndarray:
    """About `points` times from t0 to the last data time on which the model can be simulated
    (multiples of dt for a fixed-step solver)."""
    t0, t1 = problem.ts[0], problem.ts[-1]
    if problem.solver.needs_dt:
        total = int(round((t1 - t0) / problem.dt))
        stride = max(1, total // points)
        count = total // stride
        return t0 + problem.dt * stride * np.arange(count + 1)
    return np.linspace(t0, t1, points)
