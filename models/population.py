"""Population dynamics and epidemics."""

import jax.numpy as jnp
from jaxtyping import Array

import diffsim as ds


class LotkaVolterra(ds.AbstractODE):
    """Predator–prey model

        du/dt = (α − βv) u,   dv/dt = (−γ + δu) v,

    u prey, v predators (e.g. thousands of pelts). `alpha` α (prey growth, 1/time), `beta` β
    (predation), `gamma` γ (predator death, 1/time), `delta` δ (predator growth per prey), all > 0.
    State `[u, v]`. Conserved: V = δu − γ ln u + βv − α ln v (`conserved_quantity`).
    """

    alpha: Array = ds.parameter(0.55, positive=True, ndim=0)
    beta: Array = ds.parameter(0.028, positive=True, ndim=0)
    gamma: Array = ds.parameter(0.84, positive=True, ndim=0)
    delta: Array = ds.parameter(0.026, positive=True, ndim=0)

    state_names = ("prey", "predator")
    positive_state = True

    def vector_field(self, t, y, args=None):
        u, v = y[0], y[1]
        return jnp.stack([(self.alpha - self.beta * v) * u, (-self.gamma + self.delta * u) * v])

    def conserved_quantity(self, y):
        u, v = y[..., 0], y[..., 1]
        return self.delta * u - self.gamma * jnp.log(u) + self.beta * v - self.alpha * jnp.log(v)


class SIR(ds.AbstractODE):
    """Kermack–McKendrick SIR epidemic model

        dS/dt = −βSI/N,   dI/dt = βSI/N − γI,   dR/dt = γI.

    `beta` β (transmission rate, 1/day), `gamma` γ (recovery rate, 1/day), `population` N (> 0).
    State `[S, I, R]` (people). S + I + R = N is conserved; R₀ = β/γ.
    """

    beta: Array = ds.parameter(0.3, positive=True, ndim=0)
    gamma: Array = ds.parameter(0.1, positive=True, ndim=0)
    population: Array = ds.parameter(1000.0, positive=True, ndim=0)

    state_names = ("S", "I", "R")
    positive_state = True

    def vector_field(self, t, y, args=None):
        s, i = y[0], y[1]
        infection = self.beta * s * i / self.population
        recovery = self.gamma * i
        return jnp.stack([-infection, infection - recovery, recovery])


class SEIR(ds.AbstractODE):
    """SEIR epidemic model with an exposed (latent) compartment

        dS/dt = −βSI/N,  dE/dt = βSI/N − σE,  dI/dt = σE − γI,  dR/dt = γI.

    `beta` β (transmission, 1/day), `sigma` σ (1/latent period, 1/day), `gamma` γ (recovery,
    1/day), `population` N. State `[S, E, I, R]`; S + E + I + R = N is conserved.
    """

    beta: Array = ds.parameter(0.5, positive=True, ndim=0)
    sigma: Array = ds.parameter(0.2, positive=True, ndim=0)
    gamma: Array = ds.parameter(0.1, positive=True, ndim=0)
    population: Array = ds.parameter(1000.0, positive=True, ndim=0)

    state_names = ("S", "E", "I", "R")
    positive_state = True

    def vector_field(self, t, y, args=None):
        s, e, i = y[0], y[1], y[2]
        infection = self.beta * s * i / self.population
        return jnp.stack(
            [
                -infection,
                infection - self.sigma * e,
                self.sigma * e - self.gamma * i,
                self.gamma * i,
            ]
        )
