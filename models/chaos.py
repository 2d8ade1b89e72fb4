"""Chaotic flows."""

import jax.numpy as jnp
from jaxtyping import Array

import diffsim as ds


class Lorenz(ds.AbstractODE):
    """The Lorenz system (Lorenz 1963):

        x' = σ(y − x),   y' = x(ρ − z) − y,   z' = xy − βz.

    `sigma` σ (Prandtl number), `rho` ρ (Rayleigh number ratio), `beta` β (geometry); defaults
    σ = 10, ρ = 28, β = 8/3, where the largest Lyapunov exponent is ≈ 0.9056. State `[x, y, z]`
    (dimensionless). Volume contracts at the constant rate −(σ + 1 + β).
    """

    sigma: Array = ds.parameter(10.0, ndim=0)
    rho: Array = ds.parameter(28.0, ndim=0)
    beta: Array = ds.parameter(8.0 / 3.0, ndim=0)

    state_names = ("x", "y", "z")

    def vector_field(self, t, y, args=None):
        x, yy, z = y[0], y[1], y[2]
        return jnp.stack([self.sigma * (yy - x), x * (self.rho - z) - yy, x * yy - self.beta * z])
