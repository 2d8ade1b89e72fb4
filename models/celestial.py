"""Gravitational dynamics as separable Hamiltonians (for symplectic solvers)."""

import jax.numpy as jnp
from jaxtyping import Array

import diffsim as ds


class Kepler(ds.AbstractSeparableHamiltonian):
    """The two-body problem in relative coordinates, per unit reduced mass:

        H(q, p) = |p|²/2 − μ/|q|,   μ = G(m₁ + m₂).

    `mu` μ: gravitational parameter (length³/time², > 0). Positions in 2-D or 3-D. State `[q, p]`
    stacked (shape (2, d)) or a tuple. Invariants: energy H = −μ/(2a) and angular momentum.
    `initial_state(eccentricity, semi_major_axis)` starts at periapsis; `period(a)` = 2π√(a³/μ).
    """

    mu: Array = ds.parameter(1.0, positive=True, ndim=0)

    def kinetic(self, p):
        return 0.5 * jnp.sum(p**2)

    def potential(self, q):
        # A collision (q = 0) is a true singularity of the model: -inf, not a made-up number.
        return -self.mu / jnp.sqrt(jnp.sum(q**2))

    def initial_state(self, eccentricity, semi_major_axis=1.0):
        """`[q, p]` at periapsis of an orbit with the given eccentricity (0 ≤ e < 1) and a."""
        e, a = jnp.asarray(eccentricity), jnp.asarray(semi_major_axis)
        r = a * (1 - e)
        speed = jnp.sqrt(self.mu * (1 + e) / r)
        zero = jnp.zeros_like(r)
        return jnp.stack([jnp.stack([r, zero]), jnp.stack([zero, speed])])

    def period(self, semi_major_axis=1.0):
        return 2 * jnp.pi * jnp.sqrt(semi_major_axis**3 / self.mu)

    def angular_momentum(self, y):
        q, p = ds.split_pair(y)
        return q[..., 0] * p[..., 1] - q[..., 1] * p[..., 0]


class NBody(ds.AbstractSeparableHamiltonian):
    """Gravitational N-body problem with optional Plummer softening ε:

        H = Σᵢ |pᵢ|²/(2mᵢ) − G Σ_{i<j} mᵢmⱼ / √(|qᵢ − qⱼ|² + ε²).

    - `masses` (n,) (> 0), `G` gravitational constant (> 0), `softening` ε (≥ 0, length).

    State `[q, p]` stacked (shape (2, n, d)) or a tuple of (n, d) arrays; p are momenta. The
    self-interaction terms are masked with a double-where, so gradients stay finite even when two
    bodies coincide. Invariants: energy, total momentum, angular momentum.
    """

    masses: Array = ds.parameter(positive=True, ndim=1)
    G: Array = ds.parameter(1.0, positive=True, ndim=0)
    softening: Array = ds.parameter(0.0, nonnegative=True, ndim=0)

    def __check_init__(self):
        if self.masses is not None and self.masses.shape[0] < 1:
            raise ValueError("NBody(masses=...): give at least one mass, got an empty array")

    def kinetic(self, p):
        self._check_bodies(p)
        return 0.5 * jnp.sum(jnp.sum(p**2, axis=-1) / self.masses)

    def _check_bodies(self, x):
        if x.ndim < 2 or x.shape[-2] != self.masses.shape[0]:
            raise ValueError(
                f"NBody has {self.masses.shape[0]} masses, but the state's positions or momenta "
                f"have shape {x.shape}; each must be (bodies, dimensions) = "
                f"({self.masses.shape[0]}, d)"
            )

    def potential(self, q):
        self._check_bodies(q)
        n = self.masses.shape[0]
        separation = q[:, None, :] - q[None, :, :]
        distance2 = jnp.sum(separation**2, axis=-1) + self.softening**2
        off_diagonal = ~jnp.eye(n, dtype=bool)
        usable = off_diagonal & (distance2 > 0)
        inverse = jnp.where(usable, 1.0 / jnp.sqrt(jnp.where(usable, distance2, 1.0)), 0.0)
        pair_masses = self.masses[:, None] * self.masses[None, :]
        return -0.5 * self.G * jnp.sum(pair_masses * inverse)

    def total_momentum(self, y):
        return jnp.sum(ds.split_pair(y, "(q, p)")[1], axis=-2)
