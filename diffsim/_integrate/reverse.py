"""Integration backwards in time (a decreasing `ts`, as scipy's `solve_ivp(fun, (t1, t0))` and
diffrax's `t1 < t0` allow): the solve runs forward in s = -t on the model dy/ds = -f(-s, y),
with events seen in s, and its times are turned back.

Every loop then keeps its one direction (increasing times, positive steps): the step control,
the output clipping and the event location need no sign cases. An event's `direction` counts
along the integration, as scipy's does: `+1` fires where the condition goes from negative to
positive as the solve proceeds (here as t decreases).
"""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp

from .._events import Event
from .._model import AbstractODE, AbstractSDE


class Reversed(AbstractODE):
    """`model` in the time s = -t: dy/ds = -f(-s, y), with its mass matrix, band and
    Jacobian hook carried over."""

    model: AbstractODE

    def vector_field(self, t, y, args=None):
        return jax.tree.map(jnp.negative, self.model.vector_field(-t, y))

    def state_shape(self):
        return self.model.state_shape()

    @property
    def mass_matrix(self):
        return self.model.mass_matrix

    @property
    def jacobian_bandwidth(self):
        return self.model.jacobian_bandwidth

    def jacobian(self, t, y):
        jacobian = self.model.jacobian(-t, y)
        return None if jacobian is None else -jnp.asarray(jacobian)


class _AtNegatedTime(eqx.Module):
    """fn(t, y) called at -t (a condition or reset in the reversed solve); a Module, so the
    arrays of `fn` stay leaves."""

    fn: Callable

    def __call__(self, t, y):
        return self.fn(-t, y)


def reversed_event(event: Event) -> Event:
    event = eqx.tree_at(lambda e: e.condition, event, _AtNegatedTime(event.condition))
    if event.reset is None:
        return event
    return eqx.tree_at(lambda e: e.reset, event, _AtNegatedTime(event.reset))


def check_reversible(model, solver) -> None:
    """Backward integration is for deterministic models and solvers that step a vector field
    (Runge–Kutta, adaptive, Rosenbrock)."""
    if isinstance(model, AbstractSDE) or solver.stochastic:
        raise NotImplementedError(
            "ts decreases (integration backwards in time), which a stochastic model or solver "
            "does not support: a diffusion run backwards is not the same process"
        )
    if not solver.reversible:
        raise NotImplementedError(
            f"ts decreases (integration backwards in time), which {type(solver).__name__} does "
            "not support (it steps the model's Hamiltonian structure forward); use a "
            "Runge–Kutta or adaptive solver, or pass the negated momenta"
        )


def forward_times(event_time):
    """Event times of the reversed solve in the caller's time (inf stays: never happened)."""
    return jax.tree.map(lambda t: jnp.where(jnp.isfinite(t), -t, t), event_time)
