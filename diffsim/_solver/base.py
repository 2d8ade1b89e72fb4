"""Solver base classes. A solver is how to step; the model is what to step.

Every family is a base class here or beside it, and says what it can do through class-level
capabilities (`adaptive`, `stochastic`, `supports_events`, `needs_dt`), which `simulate`,
`sweep`, `fit` and the analyses ask instead of testing for classes. Each family's solve (its
loop) is registered for its base class in `diffsim._integrate.families`, so a new family
touches `_solver/` and its own loop only.
"""

import abc
from typing import ClassVar

import diffrax
import equinox as eqx
from jaxtyping import Array, PyTree, Shaped

from .._model import AbstractODE

# What a fixed-step method carries from one step to the next (an FSAL evaluation), or None.
SolverState = PyTree[Array] | None
Scalar = Shaped[Array, ""] | float


class AbstractSolver(eqx.Module):
    """Base of every solver. `order` is the global order of accuracy of the method.

    Capabilities (class-level, read from an instance: `solver.stochastic`):

    - `adaptive`: the solver chooses its steps (tolerances); otherwise it takes a fixed `dt`.
    - `stochastic`: it solves stochastic models (`ds.AbstractSDE`) and needs a PRNG `key`.
    - `supports_events`: `simulate(..., events=...)` can locate events with it.
    - `supports_mass_matrix`: it solves models with a mass matrix, M y' = f(t, y) (DAEs).
    """

    order: eqx.AbstractClassVar[int]
    adaptive: eqx.AbstractClassVar[bool]
    stochastic: eqx.AbstractClassVar[bool]
    supports_events: eqx.AbstractClassVar[bool]
    supports_mass_matrix: ClassVar[bool] = False

    @property
    def needs_dt(self) -> bool:
        """Whether a solve needs `dt` (or `steps_per_save`): the fixed-step families."""
        return not self.adaptive

    @property
    def implicit(self) -> bool:
        """Whether each step solves a nonlinear system (its cost then varies with the Newton
        iterations, so it has no fixed count of function evaluations)."""
        return False

    @property
    def stiff(self) -> bool:
        """Whether the method is made for stiff problems (implicit or linearly implicit):
        there is no use suggesting a stiff solver when it fails."""
        return self.implicit

    @property
    def reversible(self) -> bool:
        """Whether it integrates backwards in time (a decreasing `ts`, solved forward in
        s = −t on the negated vector field): every deterministic family but the symplectic
        splittings, which step a Hamiltonian's structure forward."""
        return not self.stochastic

    @property
    def delay_stepping(self) -> str | None:
        """How the method of steps of a delay equation steps with it: `"runge_kutta"` (an
        explicit fixed-step method), `"rosenbrock"`, `"explicit_pair"` (diffsim's own adaptive
        loop), or None where it cannot."""
        return None

    def check_model(self, model, t0, y0) -> None:
        """Raise a clear `TypeError` if this solver cannot step `model` (called once at trace
        time, never inside the loop)."""


class AbstractFixedStepSolver(AbstractSolver):
    """A one-step method with a fixed step, run by `simulate` inside `lax.scan`.

    The step contract, the same for ODE and SDE methods: `init(model, t0, y0)` returns what
    the method carries between steps (None by default), and `advance(model, t, y, dt, state,
    dw)` returns `(y1, state1)`; `dw` is the step's noise (`noise(key, j, shape, dt)`, None for
    deterministic methods). A method whose last evaluation is the next step's first (first same
    as last) carries that evaluation as its state: `fsal = True`, one evaluation saved a step.

    Counts: `evals_per_step` model evaluations each step plus `init_evals` each time the loop
    (re)starts (`None`: not known, left out of `Solution.stats`).
    """

    adaptive: ClassVar[bool] = False
    stochastic: ClassVar[bool] = False
    supports_events: ClassVar[bool] = True
    evals_per_step: eqx.AbstractClassVar[int | None]
    init_evals: ClassVar[int] = 0

    @property
    def fsal(self) -> bool:
        """Whether the method carries its last evaluation into the next step."""
        return self.init_evals > 0

    def init(self, model: AbstractODE, t0: Scalar, y0: PyTree[Array]) -> SolverState:
        """What the first step starts from besides (t0, y0): None unless the method carries an
        evaluation (FSAL)."""
        return None

    @abc.abstractmethod
    def advance(
        self,
        model: AbstractODE,
        t: Scalar,
        y: PyTree[Array],
        dt: Scalar,
        state: SolverState,
        dw: PyTree[Array] | None,
    ) -> tuple[PyTree[Array], SolverState]:
        """Advance the state `y` from time `t` to `t + dt`, given the carried `state` and the
        step's noise `dw` (None for ODE methods); returns (the new state, the carried state of
        the next step)."""

    def noise(self, key, index, shape, dt):
        """The noise `advance` receives for step `index` (counted from t0): None for ODE
        methods, the Brownian increment for SDE methods."""
        return None

    def step(self, model, t, y, dt, dw=None):
        """One step from (t, y) to t + dt on its own (for hand-written loops such as
        `ds.iterate`); returns the new state. `dw`: the Brownian increment of an SDE step."""
        y1, _ = self.advance(model, t, y, dt, self.init(model, t, y), dw)
        return y1

    def function_evals(self, steps, restarts):
        """Model evaluations of `steps` steps run as `restarts` separate loops, or None when
        the method's count is not known."""
        if self.evals_per_step is None:
            return None
        return steps * self.evals_per_step + restarts * self.init_evals


_ANY_SOLVER = "a diffsim solver such as ds.RK4() or ds.Tsit5()"


def check_solver(name: str, solver, *, needs: str = _ANY_SOLVER) -> None:
    """The one check that `solver` is a diffsim solver instance, with the fixes users need:
    an instance for a class, `ds.Diffrax(...)` or `ds.DiffraxSDE(...)` for a diffrax solver
    (`needs`: what the caller takes, when it is narrower than any solver)."""
    if isinstance(solver, AbstractSolver):
        return
    if isinstance(solver, type) and issubclass(solver, AbstractSolver):
        raise TypeError(
            f"{name} must be {needs}, got the class {solver.__name__}. Pass an instance: "
            f"{name}=ds.{solver.__name__}()."
        )
    hint, got = "", repr(solver)
    if isinstance(solver, diffrax.AbstractSolver):
        got = f"diffrax.{type(solver).__name__}()"
    if needs == _ANY_SOLVER and isinstance(solver, diffrax.AbstractSRK):
        hint = (
            " To use a diffrax SDE solver, wrap it: "
            f"ds.DiffraxSDE(diffrax.{type(solver).__name__}())."
        )
    elif needs == _ANY_SOLVER and isinstance(solver, diffrax.AbstractSolver):
        hint = f" To use a diffrax solver, wrap it: ds.Diffrax(diffrax.{type(solver).__name__}())."
    what = "" if needs == _ANY_SOLVER else " (not a diffsim solver)"
    raise TypeError(f"{name} must be {needs}, got {got}{what}.{hint}")
