"""Levenberg–Marquardt with MINPACK's scaling of the unknowns.

`optimistix.LevenbergMarquardt` damps the Gauss–Newton step with λI: the trust region is a
ball in the optimiser's coordinates, so an unknown whose residuals are a thousand times more
sensitive than another's gets the same step bound. From a neutral start that lets the
insensitive unknowns (initial states in units of thousands next to rates of order 0.01) wander
while the sensitive ones are throttled, and the fit settles in a poor local optimum. MINPACK's
`lmder` (Moré 1978) damps with λDᵀD instead, D the running maximum of the Jacobian's column
norms: the step is then invariant to rescaling an unknown. No JAX library offers that (optimistix
has only the identity damping), so the descent is written here; the trust-region update, the
termination test and the loop stay optimistix's own.
"""

from collections.abc import Callable

import equinox as eqx
import jax.numpy as jnp
import lineax as lx
import optimistix as optx
from jaxtyping import Array, Float, PyTree, Scalar


class _ScaledState(eqx.Module):
    """The Jacobian and residuals at the last accepted point, and the scale of each unknown."""

    jacobian: Float[Array, "residuals unknowns"]
    residual: Float[Array, " residuals"]
    scale: Float[Array, " unknowns"]  # D: running maximum of the Jacobian's column norms
    seen: Array  # a Jacobian has been queried (the first sets D)


class ScaledDampedNewtonDescent(optx.AbstractDescent):
    """Solve `min ‖J δ + r‖² + λ‖D δ‖²` (λ = 1/step size) by QR of `[J; √λ D]`."""

    def init(self, y, f_info_struct) -> _ScaledState:
        residuals = f_info_struct.residual.size
        unknowns = y.size
        dtype = y.dtype
        return _ScaledState(
            jacobian=jnp.zeros((residuals, unknowns), dtype),
            residual=jnp.zeros(residuals, dtype),
            scale=jnp.ones(unknowns, dtype),
            seen=jnp.array(False),
        )

    def query(self, y, f_info, state: _ScaledState) -> _ScaledState:
        del y
        jacobian = f_info.jac.as_matrix()
        norms = jnp.sqrt(jnp.sum(jacobian**2, axis=0))
        # MINPACK: D starts at the column norms (1 for a column of zeros) and never shrinks,
        # so the trust region cannot collapse along an unknown that becomes insensitive
        first = jnp.where(norms > 0, norms, 1.0)
        scale = jnp.where(state.seen, jnp.maximum(state.scale, norms), first)
        return _ScaledState(jacobian, f_info.residual.ravel(), scale, jnp.array(True))

    def step(self, step_size: Scalar, state: _ScaledState) -> tuple[Array, optx.RESULTS]:
        dtype = state.jacobian.dtype
        tiny = jnp.finfo(dtype).eps
        usable = step_size > tiny
        damping = jnp.where(usable, 1 / jnp.where(usable, step_size, 1), jnp.finfo(dtype).max)
        stacked = jnp.concatenate([state.jacobian, jnp.diag(jnp.sqrt(damping) * state.scale)])
        target = jnp.concatenate([state.residual, jnp.zeros_like(state.scale)])
        solution = lx.linear_solve(lx.MatrixLinearOperator(stacked), target, lx.QR(), throw=False)
        return -solution.value, optx.RESULTS.promote(solution.result)


class ScaledLevenbergMarquardt(optx.AbstractGaussNewton):
    """`optimistix.LevenbergMarquardt` with the damping scaled as MINPACK scales it."""

    rtol: float
    atol: float
    norm: Callable[[PyTree], Scalar]
    descent: ScaledDampedNewtonDescent
    search: optx.ClassicalTrustRegion
    verbose: Callable[..., None]

    def __init__(self, rtol: float, atol: float, norm=optx.max_norm):
        self.rtol = rtol
        self.atol = atol
        self.norm = norm
        self.descent = ScaledDampedNewtonDescent()
        self.search = optx.ClassicalTrustRegion()
        self.verbose = lambda **_: None
