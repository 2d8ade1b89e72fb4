"""Delay differential equations: feedback that acts after a lag."""

import jax.numpy as jnp
from jaxtyping import Array

import diffsim as ds


class MackeyGlass(ds.AbstractDDE):
    """Mackey–Glass model of blood-cell production (M. C. Mackey, L. Glass, *Science* 197,
    287 (1977)):

        x'(t) = β x(t − τ) / (1 + x(t − τ)^n) − γ x(t),

    x the cell density (arbitrary units), `beta` β (production rate, 1/day), `gamma` γ (death
    rate, 1/day), `n` the Hill exponent, `tau` τ (maturation delay, days), `x0` the constant
    history x(t) = x0 for t ≤ t0. The defaults (β = 0.2, γ = 0.1, n = 10, τ = 17) are the
    chaotic attractor of the time-series literature (chaotic for τ ≳ 16.8). State `[x]`.
    """

    beta: Array = ds.parameter(0.2, positive=True, ndim=0)
    gamma: Array = ds.parameter(0.1, positive=True, ndim=0)
    n: Array = ds.parameter(10.0, positive=True, ndim=0)
    tau: Array = ds.parameter(17.0, positive=True, ndim=0)
    x0: Array = ds.parameter(0.5, positive=True, ndim=0)

    state_names = ("x",)
    positive_state = True

    def delayed_field(self, t, y, y_delayed):
        (lagged,) = y_delayed
        return self.beta * lagged / (1.0 + lagged**self.n) - self.gamma * y

    def delays(self) -> tuple:
        return (self.tau,)

    def history(self, t):
        return jnp.stack([self.x0]) * jnp.ones((), jnp.result_type(t))


class DelayedNegativeFeedback(ds.AbstractDDE):
    """Hutchinson–Wright linear delayed feedback, the simplest delay oscillator:

        x'(t) = −k x(t − τ),   x(t) = x0 for t ≤ t0,

    `gain` k (1/time), `tau` τ (time), `x0` the constant history. Decays for kτ < π/2, and
    oscillates with period 4τ at the Hopf point kτ = π/2 (with the history cos(k t) the
    solution is cos(k t) for all t). Over the first lags the solution is a polynomial by the
    method of steps: x0 (1 − k t) on [0, τ], plus x0 k² (t − τ)²/2 on [τ, 2τ], minus
    x0 k³ (t − 2τ)³/6 on [2τ, 3τ] (t0 = 0). State `[x]`.
    """

    gain: Array = ds.parameter(1.0, ndim=0)
    tau: Array = ds.parameter(1.0, positive=True, ndim=0)
    x0: Array = ds.parameter(1.0, ndim=0)

    state_names = ("x",)

    def delayed_field(self, t, y, y_delayed):
        return -self.gain * y_delayed[0]

    def delays(self) -> tuple:
        return (self.tau,)

    def history(self, t):
        return jnp.stack([self.x0]) * jnp.ones((), jnp.result_type(t))
