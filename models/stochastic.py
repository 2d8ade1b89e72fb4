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
