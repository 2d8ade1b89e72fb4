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


class HIRES(ds.AbstractODE):
    """HIRES ("High Irradiance RESponse"), Schäfer's model of the photomorphogenesis of plants
    by phytochrome, a stiff test problem of 8 species (Hairer & Wanner, *Solving ODEs II*,
    §IV.10; the IVP test set of Mazzia & Magherini):

        y1' = −k1 y1 + k2 y2 + k3 y3 + o         y5' = −k9 y5 + k2 y6 + k2 y7
        y2' =  k1 y1 − k5 y2                     y6' = −k10 y6 y8 + k11 y4 + k1 y5 − k2 y6 + k11 y7
        y3' = −k6 y3 + k2 y4 + k7 y5             y7' =  k10 y6 y8 − k12 y7
        y4' =  k3 y2 + k1 y3 − k8 y4             y8' = −k10 y6 y8 + k12 y7

    with k1 = 1.71, k2 = 0.43, k3 = 8.32, k5 = 8.75, k6 = 10.03, k7 = 0.035, k8 = 1.12,
    k9 = 1.745, k10 = 280, k11 = 0.69, k12 = 1.81 (1/time; k10 per concentration and time) and
    the source o = 0.0007. The usual run: y0 = (1, 0, 0, 0, 0, 0, 0, 0.0057) (`initial_state`)
    over t in [0, 321.8122], whose end state is a published reference (`reference_state`)."""

    k1: Array = ds.parameter(1.71, positive=True, ndim=0)
    k2: Array = ds.parameter(0.43, positive=True, ndim=0)
    k3: Array = ds.parameter(8.32, positive=True, ndim=0)
    k5: Array = ds.parameter(8.75, positive=True, ndim=0)
    k6: Array = ds.parameter(10.03, positive=True, ndim=0)
    k7: Array = ds.parameter(0.035, positive=True, ndim=0)
    k8: Array = ds.parameter(1.12, positive=True, ndim=0)
    k9: Array = ds.parameter(1.745, positive=True, ndim=0)
    k10: Array = ds.parameter(280.0, positive=True, ndim=0)
    k11: Array = ds.parameter(0.69, positive=True, ndim=0)
    k12: Array = ds.parameter(1.81, positive=True, ndim=0)
    source: Array = ds.parameter(0.0007, nonnegative=True, ndim=0)

    state_names = ("y1", "y2", "y3", "y4", "y5", "y6", "y7", "y8")
    end_time = 321.8122

    def vector_field(self, t, y, args=None):
        y1, y2, y3, y4, y5, y6, y7, y8 = (y[i] for i in range(8))
        binding = self.k10 * y6 * y8
        return jnp.stack(
            [
                -self.k1 * y1 + self.k2 * y2 + self.k3 * y3 + self.source,
                self.k1 * y1 - self.k5 * y2,
                -self.k6 * y3 + self.k2 * y4 + self.k7 * y5,
                self.k3 * y2 + self.k1 * y3 - self.k8 * y4,
                -self.k9 * y5 + self.k2 * y6 + self.k2 * y7,
                -binding + self.k11 * y4 + self.k1 * y5 - self.k2 * y6 + self.k11 * y7,
                binding - self.k12 * y7,
                -binding + self.k12 * y7,
            ]
        )

    @staticmethod
    def initial_state(dtype=None):
        """y0 = (1, 0, 0, 0, 0, 0, 0, 0.0057)."""
        return jnp.array([1.0, 0, 0, 0, 0, 0, 0, 0.0057], dtype=dtype)

    @staticmethod
    def reference_state():
        """y(321.8122) from the IVP test set (Mazzia & Magherini), computed with RADAU5 at
        tolerances near round-off."""
        return jnp.array(
            [
                0.7371312573325668e-3,
                0.1442485726316185e-3,
                0.5888729740967575e-4,
                0.1175651343283149e-2,
                0.2386356198831331e-2,
                0.6238968252742796e-2,
                0.2849998395185769e-2,
                0.2850001604814231e-2,
            ]
        )
