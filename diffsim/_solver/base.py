"""Solver base classes. A solver is how to step; the model is what to step."""

import abc
from typing import ClassVar

import equinox as eqx


class AbstractSolver(eqx.Module):
    """Base of every solver. `order` is the global order of accuracy of the method."""

    order: ClassVar[int]


class AbstractFixedStepSolver(AbstractSolver):
    """A one-step method with a fixed step, run by `simulate` inside `lax.scan`.

    Subclasses implement `step`, and may refuse a model in `check_model` (called once at trace
    time, never inside the loop).
    """

    evals_per_step: ClassVar[int]

    def check_model(self, model, t0, y0) -> None:
        """Raise a clear `TypeError` if this solver cannot step `model`."""

    @abc.abstractmethod
    def step(self, model, t, y, dt):
        """Advance the state `y` from time `t` to `t + dt`; returns the new state."""
