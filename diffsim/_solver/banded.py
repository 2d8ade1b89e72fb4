"""Banded Jacobians of method-of-lines models: taken by column colouring in (lower + upper + 1)
forward-mode passes instead of n, and the linear solves of a stiff step with them.

Why by hand: lineax has tridiagonal operators but no banded Jacobian or colouring, and no
package on the index does forward-mode colouring for JAX; a band is the structure every
one-dimensional method-of-lines model has (a point couples to its neighbours), so this covers
them with a few lines. Columns j and j' share a colour when they are (lower + upper + 1) apart:
no row then sees both, so one jvp with the sum of their unit vectors gives both columns.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
from jax.lax.linalg import tridiagonal_solve
from jaxtyping import Array, Float


class Banded(NamedTuple):
    """A square matrix that is zero outside `lower` diagonals below and `upper` above the main
    one, stored by diagonals: `diagonals[lower + k][i]` = A[i, i + k] for k in -lower..upper
    (entries outside the matrix are 0)."""

    diagonals: Float[Array, "bands n"]
    lower: int
    upper: int

    def dense(self) -> Array:
        n = self.diagonals.shape[1]
        out = jnp.zeros((n, n), self.diagonals.dtype)
        rows = jnp.arange(n)
        for k in range(-self.lower, self.upper + 1):
            cols = rows + k
            valid = (cols >= 0) & (cols < n)
            out = out.at[rows, jnp.clip(cols, 0, n - 1)].add(
                jnp.where(valid, self.diagonals[self.lower + k], 0)
            )
        return out


def banded_jacobian(f, t, y, lower: int, upper: int):
    """(f(t, y), ∂f/∂y as `Banded`, ∂f/∂t) in (lower + upper + 2) jvps of `f` on flat states."""
    n = y.shape[0]
    width = lower + upper + 1
    colours = jnp.arange(n) % width
    seeds = (colours[None, :] == jnp.arange(width)[:, None]).astype(y.dtype)  # (width, n)

    def along(direction):
        return jax.jvp(lambda y: f(t, y), (y,), (direction,))

    f0, compressed = jax.vmap(along, out_axes=(None, 0))(seeds)  # compressed (width, n)
    _, dfdt = jax.jvp(lambda t: f(t, y), (t,), (jnp.ones_like(t),))
    rows = jnp.arange(n)
    diagonals = []
    for k in range(-lower, upper + 1):
        cols = rows + k
        valid = (cols >= 0) & (cols < n)
        # row i of column j = i + k is in the compressed column of j's colour
        diagonals.append(jnp.where(valid, compressed[(rows + k) % width, rows], 0))
    return f0, Banded(jnp.stack(diagonals), lower, upper), dfdt


def banded_mass(mass, lower: int, upper: int, n: int, dtype) -> Banded:
    """The mass matrix's diagonals within the band (the identity when None)."""
    if mass is None:
        eye = jnp.zeros((lower + upper + 1, n), dtype).at[lower].set(1)
        return Banded(eye, lower, upper)
    rows = jnp.arange(n)
    diagonals = []
    for k in range(-lower, upper + 1):
        cols = rows + k
        valid = (cols >= 0) & (cols < n)
        diagonals.append(jnp.where(valid, mass[rows, jnp.clip(cols, 0, n - 1)], 0))
    return Banded(jnp.stack(diagonals), lower, upper)


def banded_solver(w: Banded):
    """W⁻¹ as a function of the right-hand side: a tridiagonal band by LAPACK's gtsv (O(n),
    partial pivoting); a wider band by a dense LU of W (the Jacobian still costs only
    bandwidth + 2 evaluations)."""
    if (w.lower, w.upper) == (1, 1):
        # gtsv's layout is the band's: dl[0] = A[0, −1] and du[n−1] = A[n−1, n] are the zeros
        dl, d, du = w.diagonals
        return lambda rhs: tridiagonal_solve(dl, d, du, rhs[:, None])[:, 0]
    factors = jsl.lu_factor(w.dense())
    return lambda rhs: jsl.lu_solve(factors, rhs)
