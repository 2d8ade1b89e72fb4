"""LU factorisation with partial pivoting for the small systems of stiff ensembles, written as
`fori_loop`s of whole-row operations.

Why by hand: on CPU, `jax.scipy.linalg.lu_factor` and `lu_solve` under `jax.vmap` call LAPACK
once per member (a loop of tiny `getrf`/`trsm` calls whose overhead dwarfs the arithmetic of a
3 × 3 matrix), and lineax's LU is the same call. An elimination of whole rows does the
arithmetic of every member of the batch at once. Measured on the Robertson ensemble (256
members, `experiments/bench/stiff.py`'s problem) and random stiff linear systems: 2.6x faster
runs for n = 3, 1.8x for n = 8, slower from n = 16 on, and no longer to compile. The pivoting
is LAPACK's (the largest entry of the column), so the factors are those of `getrf`.
"""

import jax.numpy as jnp
from jax import lax

# Up to this many unknowns a stiff step factorises with `factor` below; above it with LAPACK.
SMALL_SYSTEM = 8


def factor(a):
    """(LU packed in one matrix with a unit lower triangle, the row permutation) of PA = LU."""
    n = a.shape[0]
    rows = jnp.arange(n)

    def eliminate(k, carry):
        a, perm = carry
        candidates = jnp.where(rows >= k, jnp.abs(a[:, k]), -1)
        pivot = jnp.argmax(candidates)
        swap = jnp.where(rows == k, pivot, jnp.where(rows == pivot, k, rows))
        a, perm = a[swap], perm[swap]
        below = rows > k
        multipliers = jnp.where(below, a[:, k] / a[k, k], 0)
        a = a - jnp.outer(multipliers, jnp.where(below, a[k], 0))
        return a.at[:, k].set(jnp.where(below, multipliers, a[:, k])), perm

    return lax.fori_loop(0, n, eliminate, (a, rows))


def solve(lu, perm, b):
    """x with A x = b from `factor(A)`: forward then back substitution, one row a pass."""
    n = lu.shape[0]
    rows = jnp.arange(n)
    b = b[perm]

    def forward(i, x):
        return x.at[i].set(b[i] - jnp.sum(jnp.where(rows < i, lu[i] * x, 0)))

    def backward(j, x):
        i = n - 1 - j
        return x.at[i].set((x[i] - jnp.sum(jnp.where(rows > i, lu[i] * x, 0))) / lu[i, i])

    x = lax.fori_loop(0, n, forward, jnp.zeros_like(b))
    return lax.fori_loop(0, n, backward, x)
