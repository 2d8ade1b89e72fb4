"""Chemical kinetics."""

import jax.numpy as jnp
from jaxtyping import Array

import diffsim as ds


class Robertson(ds.AbstractODE):
    """Robertson's autocatalytic reaction (Robertson 1966), the classic stiff test problem:

        y₁' = −k₁y₁ + k₃y₂y₃,   y₂' = k₁y₁ − k₂y₂² − k₃y₂y₃,   y₃' = k₂y₂².

    Rate constants `k1` = 0.04, `k2` = 3·10⁷, `k3` = 10⁴ (> 0). State `[y1, y2, y3]` (mass
    fractions); y₁ + y₂ + y₃ is conserved. Rates differing by ~10⁹ make it stiff: use
    `ds.Kvaerno5`. Hairer & Wanner, *Solving ODEs II*, §IV.1.
    """

    k1: Array = ds.parameter(0.04, positive=True, ndim=0)
    k2: Array = ds.parameter(3e7, positive=True, ndim=0)
    k3: Array = ds.parameter(1e4, positive=True, ndim=0)

    state_names = ("y1", "y2", "y3")

    def vector_field(self, t, y, args=None):
        y1, y2, y3 = y[0], y[1], y[2]
        forward = self.k1 * y1
        back = self.k3 * y2 * y3
        production = self.k2 * y2**2
        return jnp.stack([-forward + back, forward - production - back, production])


class EquilibriumReactor(ds.AbstractODE):
    """A batch reactor with a fast equilibrium and a slow reaction, A + B ⇌ C → D, written as a
    differential-algebraic system of index 1. The equilibrium is taken as instantaneous, so
    c_C is fixed by the law of mass action and only the totals change at the slow rate:

        (c_A + c_C)' = −k c_C,   (c_B + c_C)' = −k c_C,   0 = K c_A c_B − c_C,   c_D' = k c_C,

    i.e. M y' = f(y) for y = [c_A, c_B, c_C, c_D] (mol/L) with the singular, non-diagonal mass
    matrix [[1, 0, 1, 0], [0, 1, 1, 0], [0, 0, 0, 0], [0, 0, 0, 1]]. `equilibrium_constant` K
    (L/mol, > 0), `rate` k (1/s, > 0). Conserved: c_A + c_C + c_D and c_B + c_C + c_D.
    The stiff alternative (finite forward and backward rates) needs steps on the time scale of
    the equilibrium; this form has none."""

    equilibrium_constant: Array = ds.parameter(10.0, positive=True, ndim=0)
    rate: Array = ds.parameter(0.1, positive=True, ndim=0)

    state_names = ("A", "B", "C", "D")
    positive_state = True

    @property
    def mass_matrix(self):
        rows = [[1, 0, 1, 0], [0, 1, 1, 0], [0, 0, 0, 0], [0, 0, 0, 1]]
        return jnp.asarray(rows, jnp.result_type(self.rate))

    def vector_field(self, t, y, args=None):
        a, b, c = y[0], y[1], y[2]
        slow = self.rate * c
        return jnp.stack([-slow, -slow, self.equilibrium_constant * a * b - c, slow])
