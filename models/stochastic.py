"""Stochastic models (Itô SDEs): solve with `ds.EulerMaruyama()` or `ds.Milstein()` and a key."""

import jax.numpy as jnp
from jaxtyping import Array

import diffsim as ds


class OrnsteinUhlenbeck(ds.AbstractSDE):
    """Mean-reverting Ornstein–Uhlenbeck process  dX = θ(μ − X) dt + σ dW.

    `theta` θ (reversion rate, 1/time, > 0), `mu` μ (long-run mean), `sigma` σ (noise amplitude,
    ≥ 0). From X(0) = x0: E[X(t)] = μ + (x0 − μ)e^{−θt}, Var X(t) = σ²/(2θ)(1 − e^{−2θt})
    (`mean`, `variance`). Additive noise: Euler–Maruyama has strong order 1 here. State: any
    array shape, components independent.
    """

    theta: Array = ds.parameter(1.0, positive=True, ndim=0)
    mu: Array = ds.parameter(0.0, ndim=0)
    sigma: Array = ds.parameter(1.0, nonnegative=True, ndim=0)

    def drift(self, t, y):
        return self.theta * (self.mu - y)

    def diffusion(self, t, y):
        return jnp.broadcast_to(self.sigma, jnp.shape(y)).astype(y.dtype)

    def mean(self, x0, t):
        return self.mu + (x0 - self.mu) * jnp.exp(-self.theta * t)

    def variance(self, t):
        return self.sigma**2 / (2 * self.theta) * (1 - jnp.exp(-2 * self.theta * t))


class GeometricBrownianMotion(ds.AbstractSDE):
    """Geometric Brownian motion  dX = μX dt + σX dW  (e.g. an asset price).

    `mu` μ (drift rate, 1/time), `sigma` σ (volatility, 1/√time, ≥ 0). Exact solution driven by
    the Brownian path W: X(t) = x0 exp((μ − σ²/2) t + σ W(t)) (`exact`); E[X(t)] = x0 e^{μt}.
    Multiplicative noise: Euler–Maruyama has strong order 0.5, Milstein 1.
    """

    mu: Array = ds.parameter(0.05, ndim=0)
    sigma: Array = ds.parameter(0.2, nonnegative=True, ndim=0)

    def drift(self, t, y):
        return self.mu * y

    def diffusion(self, t, y):
        return self.sigma * y

    def exact(self, x0, t, w):
        """X(t) for the Brownian value W(t) = `w`."""
        return x0 * jnp.exp((self.mu - 0.5 * self.sigma**2) * t + self.sigma * w)


class Langevin(ds.AbstractLangevin):
    """Underdamped Langevin particle in the double well U(x) = ΔU (x² − 1)²:

        dx = v dt,   dv = (−U'(x)/m − γ v) dt + √(2γ k_B T / m) dW.

    `barrier` ΔU (energy, > 0: the height of the barrier at x = 0 between the wells at x = ±1),
    `friction` γ (1/time, > 0), `temperature` k_B T (energy, ≥ 0), `mass` m (> 0). State `[x, v]`;
    noise acts on v only. At equilibrium the velocity is Maxwellian, ⟨v²⟩ = k_B T / m, and
    crossings of the barrier follow Kramers' rate for k_B T ≪ ΔU (`kramers_rate`). `ds.BAOAB`
    keeps that equilibrium; Euler–Maruyama heats it at practical steps.
    """

    barrier: Array = ds.parameter(1.0, positive=True, ndim=0)
    friction: Array = ds.parameter(1.0, positive=True, ndim=0)
    temperature: Array = ds.parameter(0.25, nonnegative=True, ndim=0)
    mass: Array = ds.parameter(1.0, positive=True, ndim=0)

    state_names = ("position", "velocity")

    def force(self, x):
        return -4 * self.barrier * x * (x**2 - 1)

    def kramers_rate(self):
        """Kramers' escape rate from one well over the barrier (moderate to high friction):
        (√(λ² + ω_b²) − λ)/ω_b · ω_0/(2π) · exp(−ΔU/k_BT), with λ = γ/2, ω_0² = U''(±1)/m = 8ΔU/m,
        ω_b² = |U''(0)|/m = 4ΔU/m."""
        omega0 = jnp.sqrt(8 * self.barrier / self.mass)
        omega_b = jnp.sqrt(4 * self.barrier / self.mass)
        half = self.friction / 2
        prefactor = (jnp.sqrt(half**2 + omega_b**2) - half) / omega_b
        return prefactor * omega0 / (2 * jnp.pi) * jnp.exp(-self.barrier / self.temperature)


class StochasticSIR(ds.AbstractSDE):
    """SIR epidemic with demographic noise (the chemical Langevin equation of the SIR reactions
    S + I → 2I at rate βSI/N and I → R at rate γI):

        dS = −a dt − √a dW₁,   dI = (a − b) dt + √a dW₁ − √b dW₂,   dR = b dt + √b dW₂,

    a = βSI/N, b = γI (people/day; rates clipped at 0 so the square roots stay real). `beta` β,
    `gamma` γ (1/day), `population` N. Two Brownian motions (general noise, diffusion (3, 2)); every
    increment moves people between compartments, so S + I + R = N holds exactly along each path.
    For large N the paths concentrate around the deterministic `models.SIR` (fluctuations
    ~ √N).
    """

    beta: Array = ds.parameter(0.3, positive=True, ndim=0)
    gamma: Array = ds.parameter(0.1, positive=True, ndim=0)
    population: Array = ds.parameter(1000.0, positive=True, ndim=0)

    state_names = ("S", "I", "R")
    noise = "general"

    def _rates(self, y):
        s, i = y[0], y[1]
        infection = jnp.maximum(self.beta * s * i / self.population, 0.0)
        recovery = jnp.maximum(self.gamma * i, 0.0)
        return infection, recovery

    def drift(self, t, y):
        infection, recovery = self._rates(y)
        return jnp.stack([-infection, infection - recovery, recovery])

    def diffusion(self, t, y):
        infection, recovery = self._rates(y)
        a, b = jnp.sqrt(infection), jnp.sqrt(recovery)
        zero = jnp.zeros_like(a)
        return jnp.stack([jnp.stack([-a, zero]), jnp.stack([a, -b]), jnp.stack([zero, b])])
