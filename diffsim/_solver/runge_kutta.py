"""Explicit Runge–Kutta methods from Butcher tableaus (fixed step).

A method is its tableau plus a few lines: see `RK4`. Zero coefficients are skipped at trace time,
so the compiled step does only the arithmetic the tableau needs.
"""

from typing import ClassVar

from .base import AbstractFixedStepSolver
from .tableau import ButcherTableau, combine


class AbstractRungeKutta(AbstractFixedStepSolver):
    """An explicit Runge–Kutta method given by a class-level `tableau`."""

    tableau: ClassVar[ButcherTableau]
    delay_stepping: ClassVar[str] = "runge_kutta"  # type: ignore[assignment]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "tableau" in cls.__dict__:
            cls.tableau.check()
            cls.evals_per_step = len(cls.tableau.b)

    def advance(self, model, t, y, dt, state, dw):
        tableau = self.tableau
        ks = [model.vector_field(t, y)]
        for c_i, a_i in zip(tableau.c[1:], tableau.a):
            ks.append(model.vector_field(t + c_i * dt, combine(y, dt, a_i, ks)))
        return combine(y, dt, tableau.b, ks), None


class Euler(AbstractRungeKutta):
    """Forward Euler, order 1."""

    order = 1
    tableau = ButcherTableau(c=(0.0,), a=(), b=(1.0,))


class Midpoint(AbstractRungeKutta):
    """Explicit midpoint rule, order 2."""

    order = 2
    tableau = ButcherTableau(c=(0.0, 0.5), a=((0.5,),), b=(0.0, 1.0))


class Heun(AbstractRungeKutta):
    """Heun's method (explicit trapezoid), order 2."""

    order = 2
    tableau = ButcherTableau(c=(0.0, 1.0), a=((1.0,),), b=(0.5, 0.5))


class Ralston(AbstractRungeKutta):
    """Ralston's second-order method (minimum error bound among 2-stage methods), order 2.

    Ralston, *Runge–Kutta methods with minimum error bounds*, Math. Comp. 16 (1962)."""

    order = 2
    tableau = ButcherTableau(c=(0.0, 2 / 3), a=((2 / 3,),), b=(0.25, 0.75))


class RK4(AbstractRungeKutta):
    """The classical fourth-order Runge–Kutta method, order 4."""

    order = 4
    tableau = ButcherTableau(
        c=(0.0, 0.5, 0.5, 1.0),
        a=((0.5,), (0.0, 0.5), (0.0, 0.0, 1.0)),
        b=(1 / 6, 1 / 3, 1 / 3, 1 / 6),
    )


class RK38(AbstractRungeKutta):
    """Kutta's 3/8 rule, order 4."""

    order = 4
    tableau = ButcherTableau(
        c=(0.0, 1 / 3, 2 / 3, 1.0),
        a=((1 / 3,), (-1 / 3, 1.0), (1.0, -1.0, 1.0)),
        b=(1 / 8, 3 / 8, 3 / 8, 1 / 8),
    )
