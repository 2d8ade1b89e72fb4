"""Adaptive solvers: the tolerances every adaptive family shares, and the methods whose steps
are diffrax's (explicit pairs run by diffsim's lean loop, implicit ones by diffrax's loop), with a
PID step-size controller.

Tolerances are fields (traced), so changing `rtol`/`atol` does not recompile.
"""

import abc
from typing import ClassVar

import diffrax
import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .._results import PrecisionWarning
from .._validate import as_optional_parameter, as_parameter, check_parameter, is_traced
from .._warn import warn
from .base import AbstractSolver

# diffrax asks for the terms to report an order; an ODE method's order does not depend on them
_ANY_TERM = diffrax.ODETerm(lambda t, y, args: y)


class AbstractAdaptiveSolver(AbstractSolver):
    """An adaptive solver: `rtol`, `atol` (traced), optional `dtmin` below which the solve stops
    with `RESULTS.step_size_collapsed`, optional `dtmax` above which no step is taken (for a
    forcing the error estimate cannot see between steps, e.g. pulses of a periodic source:
    a fraction of its period).

    Every adaptive solver is built as `Solver(rtol=1e-6, atol=1e-9, dtmin=None, dtmax=None,
    step_to_outputs=None)` (these are the defaults; `ds.Diffrax(solver, rtol, atol, dtmin,
    dtmax, step_to_outputs)` takes the diffrax solver first). Outputs between steps come from
    the method's dense output; with `step_to_outputs=True` every output time ends a step
    instead (no interpolation error, at least one step per output interval). `None` picks
    True for the methods whose dense output is of lower order than the method (`Dopri8`,
    `Kvaerno5`: see docs/concepts/solvers.md for the measured difference). With
    `constant_step=True` the solver takes steps of `simulate(..., dt=...)` from t0 whatever its
    error estimate (diffrax's `ConstantStepSize`: the last one shortened to end at t1, outputs
    between steps from the dense output), for comparisons at a fixed step and order studies.
    A step is
    accepted when the root mean square over the state's components of its error estimate
    divided by `atol + rtol·|y|` is at most 1 (diffrax's `PIDController`); `rtol` and `atol`
    may be arrays with one tolerance per component of an array state. The tolerances are
    traced values, so new ones do not recompile."""

    rtol: Array = eqx.field(default=1e-6, converter=as_parameter)
    atol: Array = eqx.field(default=1e-9, converter=as_parameter)
    dtmin: Array | None = eqx.field(default=None, converter=as_optional_parameter)
    dtmax: Array | None = eqx.field(default=None, converter=as_optional_parameter)
    step_to_outputs: bool | None = eqx.field(default=None, static=True)
    constant_step: bool = eqx.field(default=False, static=True)

    # whether outputs come from step ends by default: for methods whose dense output is of
    # lower order than the method, so that interpolating would lose accuracy the steps have
    _interpolant_below_order: ClassVar[bool] = False

    @property
    def steps_to_outputs(self) -> bool:
        """Whether steps end at every output time (the outputs are then step ends, with no
        interpolation error), `step_to_outputs` resolved: by default for the methods whose
        dense output is of lower order than the method (Dopri8, Kvaerno5)."""
        if self.step_to_outputs is None:
            return self._interpolant_below_order
        return self.step_to_outputs

    def __check_init__(self):
        if not isinstance(self.constant_step, bool):
            raise TypeError(
                f"{type(self).__name__}(constant_step=...) must be True or False, got "
                f"{self.constant_step!r}"
            )
        if self.step_to_outputs is not None and not isinstance(self.step_to_outputs, bool):
            raise TypeError(
                f"{type(self).__name__}(step_to_outputs=...) must be True, False or None "
                f"(the method's default), got {self.step_to_outputs!r}"
            )
        check_parameter(self, "rtol", nonnegative=True, optional=False)
        check_parameter(self, "atol", nonnegative=True, optional=False)
        check_parameter(self, "dtmin", positive=True, ndim=0)
        check_parameter(self, "dtmax", positive=True, ndim=0)
        if not any(x is None or is_traced(x) for x in (self.dtmin, self.dtmax)):
            if float(self.dtmin) > float(self.dtmax):
                raise ValueError(
                    f"{type(self).__name__}: dtmin={float(self.dtmin):g} is above "
                    f"dtmax={float(self.dtmax):g}"
                )
        if not (is_traced(self.rtol) or is_traced(self.atol)):
            rtol, atol = np.asarray(self.rtol), np.asarray(self.atol)
            try:
                both_zero = bool(np.any((rtol == 0) & (atol == 0)))
            except ValueError:  # shapes that do not broadcast: refused against the state
                both_zero = False
            if both_zero:
                raise ValueError(
                    f"{type(self).__name__}: rtol and atol cannot both be 0 (for any component)"
                )

    adaptive: ClassVar[bool] = True
    stochastic: ClassVar[bool] = False
    supports_events: ClassVar[bool] = True

    def runs_own_loop(self, adjoint) -> bool:
        """Whether `simulate` steps this solver in diffsim's own adaptive loop."""
        return True


class AbstractDiffraxMethod(AbstractAdaptiveSolver):
    """An adaptive solver whose method (stages, error estimate, dense output) is a diffrax
    solver: explicit pairs are stepped by diffsim's lean loop, implicit ones and solves with
    events by diffrax's `diffeqsolve`."""

    @abc.abstractmethod
    def to_diffrax(self) -> diffrax.AbstractSolver:
        """The diffrax solver that does the stepping."""

    @property
    def order(self) -> int:  # type: ignore[override]
        """The order of the method this solver wraps (diffrax's, for its ODE term)."""
        return self.to_diffrax().order(_ANY_TERM)

    def runs_own_loop(self, adjoint) -> bool:
        """Whether `simulate` steps this solver in diffsim's own adaptive loop (an explicit
        pair with a plain Butcher tableau, differentiated by the default adjoint) rather than
        in diffrax's."""
        return adjoint == "auto" and is_plain_explicit_pair(self.to_diffrax())

    @property
    def delay_stepping(self) -> str | None:
        """An explicit pair steps a delay equation in diffsim's own loop; others cannot."""
        return "explicit_pair" if self.runs_own_loop("auto") else None

    @property
    def implicit(self) -> bool:
        """Whether each step solves a nonlinear system (a stiff solver such as Kvaerno5)."""
        return isinstance(self.to_diffrax(), diffrax.AbstractImplicitSolver)


def is_plain_explicit_pair(inner) -> bool:
    """Whether `inner` (a diffrax solver) is an explicit Runge–Kutta pair given by a plain
    Butcher tableau, which diffsim's own adaptive loop steps."""
    return isinstance(inner, diffrax.AbstractERK) and isinstance(
        getattr(inner, "tableau", None), diffrax.ButcherTableau
    )


class Tsit5(AbstractDiffraxMethod):
    """Tsitouras' 5(4) explicit Runge–Kutta pair, the default for non-stiff problems.

    Ch. Tsitouras, *Runge–Kutta pairs of order 5(4) satisfying only the first column simplifying
    assumption*, Comput. Math. Appl. 62 (2011)."""

    def to_diffrax(self):
        return diffrax.Tsit5()


class Dopri5(AbstractDiffraxMethod):
    """Dormand–Prince 5(4) explicit Runge–Kutta pair (MATLAB's ode45)."""

    def to_diffrax(self):
        return diffrax.Dopri5()


class Dopri8(AbstractDiffraxMethod):
    """Dormand–Prince 8(7) explicit Runge–Kutta pair, for tight tolerances on smooth problems.
    Its outputs are step ends by default (`step_to_outputs`): diffrax's dense output for it is
    far less accurate than its steps."""

    _interpolant_below_order: ClassVar[bool] = True

    def to_diffrax(self):
        return diffrax.Dopri8()


class Kvaerno5(AbstractDiffraxMethod):
    """Kværnø's 5(4) ESDIRK method, L-stable, for stiff problems.

    A. Kværnø, *Singly diagonally implicit Runge–Kutta methods with an explicit first stage*,
    BIT 44 (2004). Its outputs are step ends by default (`step_to_outputs`): its dense output
    is a cubic Hermite polynomial."""

    _interpolant_below_order: ClassVar[bool] = True

    def to_diffrax(self):
        return diffrax.Kvaerno5()


class Diffrax(AbstractDiffraxMethod):
    """Any diffrax ODE solver with an embedded error estimate, e.g.
    `ds.Diffrax(diffrax.Kvaerno3(), rtol=1e-6)`."""

    solver: diffrax.AbstractSolver = eqx.field(default=None)

    def __init__(
        self,
        solver,
        rtol=1e-6,
        atol=1e-9,
        dtmin=None,
        dtmax=None,
        step_to_outputs=None,
        constant_step=False,
    ):
        if not isinstance(solver, diffrax.AbstractSolver):
            raise TypeError(f"ds.Diffrax(solver): expected a diffrax solver, got {solver!r}")
        if not isinstance(solver, diffrax.AbstractAdaptiveSolver):
            raise TypeError(
                f"ds.Diffrax({type(solver).__name__}()): this solver has no error estimate, so it "
                "cannot adapt its step; use a fixed-step solver of diffsim (e.g. ds.RK4) instead"
            )
        self.solver = solver
        self.rtol = as_parameter(rtol)
        self.atol = as_parameter(atol)
        self.dtmin = as_optional_parameter(dtmin)
        self.dtmax = as_optional_parameter(dtmax)
        self.step_to_outputs = step_to_outputs
        self.constant_step = constant_step

    def to_diffrax(self):
        return self.solver


def unresolved_tolerance(solver: AbstractAdaptiveSolver, dtype) -> str | None:
    """Why `solver`'s (concrete) tolerances cannot be met in `dtype`, or None: an rtol below
    the type's epsilon asks for errors smaller than the rounding of every step."""
    if not isinstance(solver, AbstractAdaptiveSolver) or is_traced(solver.rtol):
        return None
    eps = float(jnp.finfo(dtype).eps)
    rtols = np.asarray(solver.rtol)
    small = rtols[(rtols > 0) & (rtols < eps)]
    if small.size:
        rtol = float(small.min())
        return (
            f"rtol={rtol:g} is below {np.dtype(dtype).name}'s epsilon ({eps:.2g}): the solve "
            "cannot be that accurate (each step rounds at the level of eps), and the rounding "
            "in the error estimates rejects steps needlessly (many more steps, or a stop at "
            f"max_steps or dtmin). Use rtol >= {_resolvable(eps):g} in "
            f"{np.dtype(dtype).name}, or compute in float64 "
            "(jax.config.update('jax_enable_x64', True) and a float64 y0)"
        )
    return None


def working_tolerances(rtol: float, atol: float, dtype) -> tuple[float, float]:
    """Default tolerances chosen for float64, loosened to what `dtype` resolves: unchanged in
    float64; in float32 (rtol, atol) = (1e-5, 1e-7), the tightest its rounding lets a solve
    or a rest test meet (a float64 default there fails: every step rejected, or a steady
    state never "at rest")."""
    floor = _resolvable(float(jnp.finfo(dtype).eps))
    if rtol >= floor:
        return rtol, atol
    return floor, max(atol, 1e-2 * floor)


def _resolvable(eps: float) -> float:
    """A tolerance the type resolves comfortably: 10 eps, rounded up to a power of ten."""
    return float(10.0 ** np.ceil(np.log10(10 * eps)))


def warn_unresolved_tolerance(solver: AbstractAdaptiveSolver, dtype) -> None:
    """Warn (`ds.PrecisionWarning`) when `unresolved_tolerance` finds a reason."""
    reason = unresolved_tolerance(solver, dtype)
    if reason is not None:
        warn(f"{type(solver).__name__}: {reason}", PrecisionWarning)
