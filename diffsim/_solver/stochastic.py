"""Fixed-step solvers for Itô stochastic differential equations dy = f(t, y) dt + g(t, y) dW.

The Brownian increment of step j (counted from t0 over the whole solve) is
`brownian_increment(key, j, shape, dt)`: it depends on the key and the step index only, so a
path does not change with the saved times, the chunking of a sweep or the number of devices.
"""

import abc
from typing import ClassVar

import jax
import jax.numpy as jnp

from .._model import AbstractLangevin, AbstractSDE
from .base import AbstractFixedStepSolver


def brownian_increment(key, index, shape, dt):
    """W(t_{j+1}) − W(t_j) for step `index`: √dt times a standard normal draw from
    `jax.random.fold_in(key, index)`, of the given shape and of dt's dtype."""
    dt = jnp.asarray(dt)
    return jnp.sqrt(dt) * jax.random.normal(jax.random.fold_in(key, index), shape, dt.dtype)


class AbstractStochasticSolver(AbstractFixedStepSolver):
    """A fixed-step SDE method: `step(model, t, y, dt, dw)` with the step's Brownian increment."""

    strong_order: ClassVar[float]

    def check_model(self, model, t0, y0) -> None:
        if not isinstance(model, AbstractSDE):
            raise TypeError(
                f"{type(self).__name__} solves stochastic models (ds.AbstractSDE); "
                f"{type(model).__name__} is deterministic: use an ODE solver such as ds.RK4()"
            )

    def noise(self, key, index, shape, dt):
        """What `step` receives as `dw` for step `index`: by default the Brownian increment
        `brownian_increment(key, index, shape, dt)`."""
        return brownian_increment(key, index, shape, dt)

    @abc.abstractmethod
    def step(self, model, t, y, dt, dw):
        """Advance `y` from `t` to `t + dt` driven by the increment `dw`."""


class EulerMaruyama(AbstractStochasticSolver):
    """Euler–Maruyama: y + f dt + g dW. Strong order 0.5 (1.0 for additive noise), weak
    order 1; diagonal or general noise."""

    order = 1
    strong_order = 0.5
    evals_per_step = 1

    def step(self, model, t, y, dt, dw):
        return y + model.drift(t, y) * dt + model.noise_term(t, y, dw)


class Milstein(AbstractStochasticSolver):
    """Milstein's method for diagonal noise (Itô): y + f dt + g dW + ½ g ∂g/∂y (dW² − dt),
    with ∂gᵢ/∂yᵢ from one forward-mode derivative (so gᵢ must depend on yᵢ only, as diagonal
    noise does). Strong order 1."""

    order = 1
    strong_order = 1.0
    evals_per_step = 2

    def check_model(self, model, t0, y0) -> None:
        super().check_model(model, t0, y0)
        if model.noise != "diagonal":
            raise TypeError(
                f"Milstein needs diagonal noise; {type(model).__name__} has {model.noise!r} "
                "noise: use ds.EulerMaruyama()"
            )

    def step(self, model, t, y, dt, dw):
        g, dg = jax.jvp(lambda x: model.diffusion(t, x), (y,), (jnp.ones_like(y),))
        return y + model.drift(t, y) * dt + g * dw + 0.5 * g * dg * (dw**2 - dt)


class BAOAB(AbstractStochasticSolver):
    """The BAOAB splitting for Langevin dynamics (`ds.AbstractLangevin` models): half a kick
    (B), half a drift (A), the exact Ornstein–Uhlenbeck velocity update (O:
    v ← e^{−γh} v + √(k_B T/m (1 − e^{−2γh})) ξ), half a drift, half a kick. Two force
    evaluations per step (the last kick's force equals the next step's first, but the step
    does not carry it over). Configurational
    averages are second order in dt (weak), and the sampled equilibrium stays close to
    Boltzmann's at steps where Euler–Maruyama overheats. ξ = dW_v/√dt from the velocity
    components of the step's Brownian increment, so a key gives the same noise as for the other
    solvers.

    B. Leimkuhler and C. Matthews, *Rational construction of stochastic numerical methods for
    molecular sampling*, Appl. Math. Res. Express (2013).
    """

    order = 2
    strong_order = 1.0
    evals_per_step = 2

    def check_model(self, model, t0, y0) -> None:
        if not isinstance(model, AbstractLangevin):
            raise TypeError(
                f"BAOAB steps Langevin dynamics (ds.AbstractLangevin, e.g. models.Langevin); "
                f"{type(model).__name__} is not one: use ds.EulerMaruyama() or ds.Milstein()"
            )

    def step(self, model, t, y, dt, dw):
        q, v = y[0], y[1]
        xi = dw[1] / jnp.sqrt(dt)
        decay = jnp.exp(-model.friction * dt)
        spread = jnp.sqrt(model.temperature / model.mass * (1 - decay**2))
        v = v + 0.5 * dt * model.force(q) / model.mass
        q = q + 0.5 * dt * v
        v = decay * v + spread * xi
        q = q + 0.5 * dt * v
        v = v + 0.5 * dt * model.force(q) / model.mass
        return jnp.stack([q, v])
