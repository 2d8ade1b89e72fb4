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
