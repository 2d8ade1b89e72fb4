"""Differential-algebraic models M y' = f(t, y) with a constant, possibly singular M (index 1):
the checks `simulate` makes of a mass matrix and of the initial state, and
`consistent_initial_state`.

The algebraic equations are the directions in which M vanishes. With the singular value
decomposition M = U diag(s) Vᵀ, the columns of U with s = 0 (left null space) pick the
equations 0 = uᵀ f(t, y), and the columns of V with s = 0 (right null space) the directions of
the state that those equations determine; for the usual M = diag(1, …, 1, 0, …, 0) these are the
components whose rows of M are zero. Masks over all n singular directions keep the shapes
static (M may be traced, e.g. built from a swept parameter).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx
from jax.flatten_util import ravel_pytree
from jaxtyping import Array, PyTree

from .._compile import jit
from .._custom_types import State
from .._model import AbstractODE, check_model
from .._validate import as_state, as_state_leaf, describe, is_traced
from .common import cast_floats
from .step_control import rms


def mass_matrix_of(model, n: int, dtype) -> Array | None:
    """The model's mass matrix in the solve's precision, or None for an ODE."""
    mass = model.mass_matrix
    return None if mass is None else jnp.asarray(mass, dtype).reshape(n, n)


def check_mass_matrix(model, y0, solver) -> None:
    """Trace-time checks of a model's mass matrix against the state and the solver."""
    mass = model.mass_matrix
    if mass is None:
        return
    name = type(model).__name__
    if not solver.supports_mass_matrix:
        raise TypeError(
            f"{name} has a mass matrix (M y' = f(t, y), a differential-algebraic system when M "
            f"is singular), which {type(solver).__name__} cannot solve: use a Rosenbrock "
            "method, ds.Rodas5P() (or ds.Rosenbrock23() at loose tolerances)"
        )
    n = sum(np.size(leaf) for leaf in jax.tree.leaves(y0))
    if jnp.ndim(mass) != 2 or tuple(jnp.shape(mass)) != (n, n):
        raise ValueError(
            f"{name}.mass_matrix has shape {tuple(jnp.shape(mass))}, but the state "
            f"({describe(y0)}) has {n} components: M must be ({n}, {n}), one row per equation "
            "and one column per component of the flattened state"
        )
    if not jnp.issubdtype(jnp.result_type(mass), jnp.floating) and not jnp.issubdtype(
        jnp.result_type(mass), jnp.integer
    ):
        raise TypeError(f"{name}.mass_matrix must hold real numbers, got {jnp.result_type(mass)}")
    if is_traced(mass):
        return
    if not np.all(np.isfinite(np.asarray(mass))):
        raise ValueError(f"{name}.mass_matrix holds NaN or inf; it must be finite")
    band = model.jacobian_bandwidth
    if band is not None:
        lower, upper = band
        rows, cols = np.nonzero(np.asarray(mass))
        outside = (cols - rows > upper) | (rows - cols > lower)
        if np.any(outside):
            raise ValueError(
                f"{name}.mass_matrix has entries outside its jacobian_bandwidth {band} (e.g. "
                f"M[{rows[outside][0]}, {cols[outside][0]}]): the banded solves of a stiff step "
                "need M within the band; widen jacobian_bandwidth or return None"
            )


def null_directions(mass):
    """(U, V, mask): the singular vectors of M and the mask of its null directions (singular
    values below NumPy's `matrix_rank` tolerance)."""
    u, s, vt = jnp.linalg.svd(mass)
    tol = jnp.max(s) * max(mass.shape) * jnp.finfo(mass.dtype).eps
    return u, vt.T, s <= tol


def _newton_correction(model, t0, y0_flat, unravel, mass):
    """The first Newton step δ of the algebraic equations from y0 (y0 − δ is closer to
    consistent; δ = 0 when y0 is consistent); NaN when the algebraic equations do not determine
    the algebraic components (index above 1)."""
    u, v, mask = null_directions(mass)

    def f(y):
        return ravel_pytree(model.vector_field(t0, unravel(y)))[0]

    residual = jnp.where(mask, u.T @ f(y0_flat), 0)
    block = u.T @ jax.jacfwd(f)(y0_flat) @ v
    both = mask[:, None] & mask[None, :]
    block = jnp.where(both, block, jnp.eye(mask.size, dtype=block.dtype))
    return v @ jnp.linalg.solve(block, residual)


def consistency_error(model, t0, y0, rtol, atol):
    """How far y0 is from satisfying the algebraic equations, in units of the solve's
    tolerance: the RMS of the first Newton correction over atol + rtol·|y0| (≤ 1: consistent to
    within the tolerance; inf when the correction is not finite)."""
    return _consistency(model, t0, y0, rtol, atol)[0]


# a Newton correction below this many spacings of the state's numbers is rounding
_ROUNDING_EPS = 100


def _consistency(model, t0, y0, rtol, atol):
    """(`consistency_error`, the Newton correction δ over the flattened state)."""
    y0_flat, unravel = ravel_pytree(y0)
    mass = mass_matrix_of(model, y0_flat.shape[0], y0_flat.dtype)
    delta = _newton_correction(model, t0, y0_flat, unravel, mass)
    rtol, atol = jnp.asarray(rtol).astype(y0_flat.dtype), jnp.asarray(atol).astype(y0_flat.dtype)
    # A correction within the rounding of the state's dtype is no inconsistency: in float32 a
    # state from `consistent_initial_state` moves by ~1e-7 relative under one more Newton step,
    # above a tolerance of rtol = 1e-8 that float32 cannot resolve.
    magnitude = jnp.abs(y0_flat) + jnp.max(jnp.abs(y0_flat), initial=0.0)
    rounding = _ROUNDING_EPS * jnp.finfo(y0_flat.dtype).eps * magnitude
    ratio = rms(delta / jnp.maximum(atol + rtol * jnp.abs(y0_flat), rounding))
    return jnp.where(jnp.isfinite(ratio), ratio, jnp.inf), delta


# one compiled program for the eager check (op by op, the SVD and the Jacobian would dispatch
# dozens of small ones)
_consistency_eagerly = jit(_consistency)


def check_consistent_start(model, t0, y0, solver) -> None:
    """Refuse an inconsistent y0 of a differential-algebraic model before solving (when the
    values are concrete; under `jit` the solve returns `RESULTS.inconsistent_initial_state`)."""
    if model.mass_matrix is None:
        return
    leaves = jax.tree.leaves((model, t0, y0, solver.rtol, solver.atol))
    if any(is_traced(x) for x in leaves):
        return
    error, delta = _consistency_eagerly(model, t0, y0, solver.rtol, solver.atol)
    error, delta = float(error), np.asarray(delta)
    if error <= 1:
        return
    name = type(model).__name__
    if not np.all(np.isfinite(delta)):
        raise ValueError(
            f"{name}: the algebraic equations (the zero rows of its mass matrix) do not "
            "determine the algebraic components at y0 (their Jacobian block is singular): the "
            "system is of index above 1 there, which Rosenbrock methods do not solve; reduce "
            "its index (differentiate the constraint) or check the model"
        )
    worst = int(np.argmax(np.abs(delta)))
    raise ValueError(
        f"y0 is not a consistent initial state of {name}: its algebraic equations (the zero "
        f"rows of the mass matrix) are not satisfied; one Newton step would move component "
        f"{worst} of the flattened state by {-delta[worst]:.3g} ({error:.3g} times the "
        "tolerance atol + rtol·|y0|). Start from y0 = ds.consistent_initial_state(model, y0, "
        "t0), which solves the algebraic equations for those components"
    )


def consistent_initial_state(
    model: AbstractODE, y0: State, t0: float | Array = 0.0, *, tolerance: float | None = None
) -> PyTree[Array]:
    """A consistent initial state of a differential-algebraic model M y' = f(t, y): `y0` with
    its algebraic components changed so that the algebraic equations hold at `t0`.

    The algebraic equations are the directions in which the mass matrix vanishes (its zero rows
    for the usual diagonal M: 0 = f_i(t0, y)); they are solved by Newton's method
    (`optimistix.Newton`) for the components M does not act on (its zero columns), the others
    are kept. For a model without a mass matrix `y0` is returned unchanged.

    **Arguments:**

    - `model`: a `ds.AbstractODE` whose `mass_matrix` is an (n, n) array.
    - `y0`: the initial guess, a state of the model (its differential components are kept).
    - `t0`: the initial time.
    - `tolerance`: Newton's stopping tolerance on the change of the algebraic components,
      relative and absolute; default eps^(3/4) of the state's dtype (1.8e-12 in float64),
      after which the quadratic convergence leaves the next iterate at round-off.

    **Returns:** the consistent state, a pytree like `y0`.

    **Raises:** `ValueError` when Newton's method does not converge (no consistent state near
    `y0`, or an algebraic block that is singular: index above 1).
    """
    check_model("model", model)
    y0 = jax.tree.map(as_state_leaf, as_state(y0))
    if model.mass_matrix is None:
        return y0
    y0_flat, _ = ravel_pytree(y0)
    model = cast_floats(model, y0_flat.dtype)  # computed in the state's precision, as simulate
    if tolerance is None:
        tolerance = float(jnp.finfo(y0_flat.dtype).eps) ** 0.75
    y, ok = _consistent(model, y0, jnp.asarray(t0, y0_flat.dtype), tolerance)
    if not is_traced(ok) and not bool(ok):
        raise ValueError(
            f"consistent_initial_state: Newton's method found no state of "
            f"{type(model).__name__} near y0 that satisfies its algebraic equations (the zero "
            "rows of the mass matrix): check that they can be solved for the algebraic "
            "components (a nonsingular Jacobian block, index 1) and start nearer a solution"
        )
    return y


@jit
def _consistent(model, y0, t0, tolerance):
    y0_flat, unravel = ravel_pytree(y0)
    mass = mass_matrix_of(model, y0_flat.shape[0], y0_flat.dtype)
    u, v, mask = null_directions(mass)

    def equations(z, _):
        y = y0_flat + v @ jnp.where(mask, z, 0)
        residual = u.T @ ravel_pytree(model.vector_field(t0, unravel(y)))[0]
        return jnp.where(mask, residual, z)

    solution = optx.root_find(
        equations,
        optx.Newton(rtol=tolerance, atol=tolerance),
        jnp.zeros_like(y0_flat),
        throw=False,
        max_steps=64,
    )
    z = solution.value
    ok = (solution.result == optx.RESULTS.successful) & jnp.all(jnp.isfinite(z))
    return unravel(y0_flat + v @ jnp.where(mask, z, 0)), ok
