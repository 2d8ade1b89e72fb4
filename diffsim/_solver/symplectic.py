"""Symplectic splitting methods (fixed step) for separable systems.

A step alternates *kicks* p += c·h·F(t, q) and *drifts* q += d·h·∂T/∂p with the coefficients of the
method. They apply to `AbstractSeparableHamiltonian` models (F = −∂V/∂q) and to
`AbstractSecondOrder` models whose acceleration does not depend on the velocity (p is then v and
F the acceleration). Anything else is refused with a `TypeError`: a splitting of a non-separable
system is neither symplectic nor of the stated order.
"""

from typing import ClassVar

import jax
import jax.numpy as jnp

from .._model import (
    AbstractHamiltonian,
    AbstractSecondOrder,
    AbstractSeparableHamiltonian,
    acceleration_depends_on_velocity,
    join_pair,
    split_pair,
)
from .base import AbstractFixedStepSolver


def _drift_and_kick(model):
    """The two halves of a separable model: drift(p) = dq/dt and kick(t, q, p) = dp/dt."""
    if isinstance(model, AbstractSeparableHamiltonian):
        return jax.grad(model.kinetic), lambda t, q, p: jax.tree.map(
            jnp.negative, jax.grad(model.potential)(q)
        )
    return (lambda v: v), model.acceleration


def _axpy(x, scale, dx):
    return jax.tree.map(lambda a, b: a + scale * b, x, dx)


class AbstractSymplectic(AbstractFixedStepSolver):
    """A splitting method kick(k₀)·drift(d₀)·kick(k₁)·…·drift(d_{s−1})·kick(k_s)."""

    kicks: ClassVar[tuple[float, ...]]
    drifts: ClassVar[tuple[float, ...]]
    reversible: ClassVar[bool] = False  # type: ignore[assignment]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "kicks" in cls.__dict__:
            assert len(cls.kicks) == len(cls.drifts) + 1
            assert abs(sum(cls.kicks) - 1) < 1e-12 and abs(sum(cls.drifts) - 1) < 1e-12
            forces = sum(1 for k in cls.kicks if k != 0)
            # the closing kick's force, at the step's end, opens the next step (leapfrog's
            # velocity Verlet form): one force evaluation per step saved, carried as the state
            fsal = cls.kicks[0] != 0 and cls.kicks[-1] != 0
            cls.init_evals = int(fsal)
            cls.evals_per_step = forces - int(fsal)

    def check_model(self, model, t0, y0) -> None:
        name = type(self).__name__
        if isinstance(model, AbstractSeparableHamiltonian):
            return
        if isinstance(model, AbstractHamiltonian):
            raise TypeError(
                f"{name} needs a separable Hamiltonian H = T(p) + V(q); "
                f"{type(model).__name__} defines only hamiltonian(q, p). Subclass "
                "ds.AbstractSeparableHamiltonian with kinetic(p) and potential(q), or use a "
                "non-symplectic solver such as ds.RK4 or ds.Tsit5."
            )
        if isinstance(model, AbstractSecondOrder):
            q, v = split_pair(y0)
            if acceleration_depends_on_velocity(model, t0, q, v):
                raise TypeError(
                    f"{name} needs an acceleration that does not depend on the velocity, but "
                    f"{type(model).__name__}.acceleration uses v (damping or another "
                    "velocity-dependent force): the splitting would be neither symplectic nor of "
                    f"order {self.order}. Use ds.RK4 or an adaptive solver such as ds.Tsit5."
                )
            return
        raise TypeError(
            f"{name} steps second-order or separable Hamiltonian models only; got "
            f"{type(model).__name__}, a general first-order ODE. Use ds.RK4 or ds.Tsit5, or write "
            "the model as a ds.AbstractSecondOrder or ds.AbstractSeparableHamiltonian."
        )

    def init(self, model, t0, y0):
        if not self.fsal:
            return None
        q, p = split_pair(y0)
        return _drift_and_kick(model)[1](t0, q, p)

    def advance(self, model, t, y, dt, state, dw):
        """The splitting from (t, y); an FSAL method's `state` is the force of the opening kick.
        Returns the new state and the force of the closing kick (None without one)."""
        first = state
        drift, kick = _drift_and_kick(model)
        q, p = split_pair(y)
        t_q = t  # the time the positions have reached; kicks are evaluated there
        for i, (k, d) in enumerate(zip(self.kicks, self.drifts)):
            if k != 0:
                force = first if i == 0 and first is not None else kick(t_q, q, p)
                p = _axpy(p, k * dt, force)
            if d != 0:
                q = _axpy(q, d * dt, drift(p))
                t_q = t_q + d * dt
        last = None
        if self.kicks[-1] != 0:
            # the force depends on the positions only (checked in check_model), so this is
            # also the next step's opening force
            last = kick(t_q, q, p)
            p = _axpy(p, self.kicks[-1] * dt, last)
        return join_pair(y, q, p), (last if self.fsal else None)


class SymplecticEuler(AbstractSymplectic):
    """Symplectic Euler (kick then drift): p₁ = p₀ + h F(q₀), q₁ = q₀ + h ∂T/∂p(p₁). Order 1."""

    order = 1
    kicks = (1.0, 0.0)
    drifts = (1.0,)


class Leapfrog(AbstractSymplectic):
    """Velocity Verlet / leapfrog, kick–drift–kick. Order 2, time-reversible."""

    order = 2
    kicks = (0.5, 0.5)
    drifts = (1.0,)


def _composition(outer: tuple[float, ...]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(kicks, drifts) of Yoshida's symmetric composition of leapfrog steps of sizes
    w_m h, …, w_1 h, w_0 h, w_1 h, …, w_m h, given `outer` = (w_1, …, w_m) and w_0 = 1 − 2 Σ w_i:
    each leapfrog is kick(w/2)·drift(w)·kick(w/2), and adjacent half kicks merge into one."""
    w0 = 1.0 - 2.0 * sum(outer)
    weights = tuple(reversed(outer)) + (w0,) + tuple(outer)
    kicks = (weights[0] / 2,)
    kicks += tuple((a + b) / 2 for a, b in zip(weights, weights[1:]))
    kicks += (weights[-1] / 2,)
    return kicks, weights


_YOSHIDA4 = _composition((1.0 / (2.0 - 2.0 ** (1.0 / 3.0)),))
# Yoshida (1990), table 1: solution A of the sixth-order equations, solution D of the eighth
_YOSHIDA6 = _composition((-1.17767998417887, 0.235573213359357, 0.784513610477560))
_YOSHIDA8 = _composition(
    (
        0.102799849391985,
        -1.96061023297549,
        1.93813913762276,
        -0.158240635368243,
        -1.44485223686048,
        0.253693336566229,
        0.914844246229740,
    )
)


class Yoshida4(AbstractSymplectic):
    """Yoshida's fourth-order method: the triple-jump composition of leapfrog steps of sizes
    w₁h, w₀h, w₁h with w₁ = 1/(2 − 2^(1/3)), w₀ = 1 − 2w₁. Order 4.

    H. Yoshida, *Construction of higher order symplectic integrators*, Phys. Lett. A 150 (1990)."""

    order = 4
    kicks, drifts = _YOSHIDA4


class Yoshida6(AbstractSymplectic):
    """Yoshida's sixth-order method: a symmetric composition of 7 leapfrog steps (his solution
    A), 7 force evaluations a step. Order 6; for long orbits at tight accuracy, where Yoshida4
    needs far smaller steps.

    H. Yoshida, *Construction of higher order symplectic integrators*, Phys. Lett. A 150 (1990)."""

    order = 6
    kicks, drifts = _YOSHIDA6


class Yoshida8(AbstractSymplectic):
    """Yoshida's eighth-order method: a symmetric composition of 15 leapfrog steps (his
    solution D), 15 force evaluations a step. Order 8 (its weights are given to 15 digits, so
    in float64 the error stops falling near 1e-14 relative).

    H. Yoshida, *Construction of higher order symplectic integrators*, Phys. Lett. A 150 (1990)."""

    order = 8
    kicks, drifts = _YOSHIDA8
