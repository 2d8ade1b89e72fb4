"""Fixed-step solvers for Itô stochastic differential equations dy = f(t, y) dt + g(t, y) dW.

The Brownian increment of step j (counted from t0 over the whole solve) is
`brownian_increment(key, j, shape, dt)`: it depends on the key and the step index only, so a
path does not change with the saved times, the chunking of a sweep or the number of devices.
"""

from typing import ClassVar

import equinox as eqx
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
    """A fixed-step SDE method: `advance(model, t, y, dt, state, dw)` with the step's Brownian
    increment `dw` (the fixed-step contract of `AbstractFixedStepSolver`). `order` is the
    weak order (of expectations), `strong_order` the strong order (of paths)."""

    strong_order: eqx.AbstractClassVar[float]
    stochastic: ClassVar[bool] = True
    # a first passage of a stochastic path is a stop condition of ds.iterate, not an event
    supports_events: ClassVar[bool] = False

    def check_model(self, model, t0, y0) -> None:
        if not isinstance(model, AbstractSDE):
            raise TypeError(
                f"{type(self).__name__} solves stochastic models (ds.AbstractSDE); "
                f"{type(model).__name__} is deterministic: use an ODE solver such as ds.RK4()"
            )

    def noise(self, key, index, shape, dt):
        """What `advance` receives as `dw` for step `index`: by default the Brownian increment
        `brownian_increment(key, index, shape, dt)`."""
        return brownian_increment(key, index, shape, dt)


class EulerMaruyama(AbstractStochasticSolver):
    """Euler–Maruyama: y + f dt + g dW. Strong order 0.5 (1.0 for additive noise), weak
    order 1; diagonal or general noise."""

    order = 1
    strong_order = 0.5
    evals_per_step = 1

    def advance(self, model, t, y, dt, state, dw):
        return y + model.drift(t, y) * dt + model.noise_term(t, y, dw), None


class Milstein(AbstractStochasticSolver):
    """Milstein's method for diagonal noise (Itô): y + f dt + g dW + ½ g ∂g/∂y (dW² − dt),
    with ∂gᵢ/∂yᵢ from one forward-mode derivative (so gᵢ must depend on yᵢ only, as diagonal
    noise does; a diffusion whose Jacobian at y0 is not diagonal is refused where the solve's
    inputs are concrete). Strong order 1."""

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
        _check_diagonal_dependence(model, t0, y0)

    def advance(self, model, t, y, dt, state, dw):
        g, dg = jax.jvp(lambda x: model.diffusion(t, x), (y,), (jnp.ones_like(y),))
        return y + model.drift(t, y) * dt + g * dw + 0.5 * g * dg * (dw**2 - dt), None


def concrete_inputs(model, t0, y0) -> bool:
    """Whether t0, y0 and the model's arrays are concrete (not traced): where a diffusion can
    be probed before the solve."""
    values = [t0, *jax.tree.leaves(y0), *jax.tree.leaves(eqx.filter(model, eqx.is_array))]
    return not any(isinstance(v, jax.core.Tracer) for v in values)


def _check_diagonal_dependence(model, t0, y0, largest: int = 256) -> None:
    """Milstein's ∂gᵢ/∂yᵢ by one forward-mode derivative is right only where gᵢ depends on yᵢ
    alone: refuse a diffusion whose Jacobian at (t0, y0) has an entry off its diagonal (it
    would add a wrong term silently). Checked where everything is concrete and the state is
    small (a traced solve, or a large state, is left unchecked)."""
    if not concrete_inputs(model, t0, y0) or jnp.size(y0) > largest:
        return
    y0 = jnp.asarray(y0)
    size = y0.size
    jacobian = jax.jacfwd(lambda x: model.diffusion(t0, x))(y0).reshape(size, size)
    off = jacobian * (1 - jnp.eye(size, dtype=jacobian.dtype))
    scale = jnp.maximum(jnp.max(jnp.abs(jacobian)), 1.0)
    if bool(jnp.max(jnp.abs(off)) > 1e-12 * scale):
        i, j = (int(k) for k in jnp.unravel_index(jnp.argmax(jnp.abs(off)), off.shape))
        raise ValueError(
            f"Milstein needs each diffusion component g_i to depend on y_i only; "
            f"{type(model).__name__}'s g_{i} depends on y_{j} (∂g_{i}/∂y_{j} = "
            f"{float(jacobian[i, j]):g} at y0): use ds.EulerMaruyama(), or write the model "
            "with general noise and use a diffrax solver (ds.DiffraxSDE)"
        )


class BAOAB(AbstractStochasticSolver):
    """The BAOAB splitting for Langevin dynamics (`ds.AbstractLangevin` models): half a kick
    (B), half a drift (A), the exact Ornstein–Uhlenbeck velocity update (O:
    v ← e^{−γh} v + √(k_B T/m (1 − e^{−2γh})) ξ), half a drift, half a kick. One force
    evaluation per step: the closing kick's force, at the new positions, is carried as the
    solver state into the next step's opening kick (first same as last). Configurational
    averages are second order in dt (weak), and the sampled equilibrium stays close to
    Boltzmann's at steps where Euler–Maruyama overheats. ξ = dW_v/√dt from the velocity
    components of the step's Brownian increment, so a key gives the same noise as for the other
    solvers.

    B. Leimkuhler and C. Matthews, *Rational construction of stochastic numerical methods for
    molecular sampling*, Appl. Math. Res. Express (2013).
    """

    order = 2
    strong_order = 1.0
    evals_per_step = 1
    init_evals = 1

    def check_model(self, model, t0, y0) -> None:
        if not isinstance(model, AbstractLangevin):
            raise TypeError(
                f"BAOAB steps Langevin dynamics (ds.AbstractLangevin, e.g. models.Langevin); "
                f"{type(model).__name__} is not one: use ds.EulerMaruyama() or ds.Milstein()"
            )

    def init(self, model, t0, y0):
        return model.force(y0[0])

    def advance(self, model, t, y, dt, state, dw):
        q, v = y[0], y[1]
        xi = dw[1] / jnp.sqrt(dt)
        decay = jnp.exp(-model.friction * dt)
        spread = jnp.sqrt(model.temperature / model.mass * (1 - decay**2))
        v = v + 0.5 * dt * state / model.mass  # state: the force at q, from the last step
        q = q + 0.5 * dt * v
        v = decay * v + spread * xi
        q = q + 0.5 * dt * v
        force = model.force(q)
        v = v + 0.5 * dt * force / model.mass
        return jnp.stack([q, v]), force
