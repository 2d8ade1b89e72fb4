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
    time, never inside the loop). A method whose last evaluation is the next step's first
    (first same as last) sets `fsal = True` and implements `first_evaluation` and
    `step_fsal`; the loop then carries that evaluation from step to step.
    """

    evals_per_step: ClassVar[int]
    fsal: ClassVar[bool] = False

    def check_model(self, model, t0, y0) -> None:
        """Raise a clear `TypeError` if this solver cannot step `model`."""

    @abc.abstractmethod
    def step(self, model, t, y, dt):
        """Advance the state `y` from time `t` to `t + dt`; returns the new state."""

    def first_evaluation(self, model, t, y):
        """FSAL methods: the evaluation at (t, y) that `step_fsal` starts from."""
        raise NotImplementedError

    def step_fsal(self, model, t, y, dt, first):
        """FSAL methods: `step` given its first evaluation; returns (the new state, the
        evaluation at the new state), which is the next step's first."""
        raise NotImplementedError

    def function_evals(self, steps, intervals):
        """Evaluations of the model in `steps` steps run as `intervals` separate loops (an
        FSAL method evaluates once more at the start of each)."""
        if self.fsal:
            return steps * (self.evals_per_step - 1) + intervals
        return steps * self.evals_per_step
