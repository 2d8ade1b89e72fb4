from .adaptive import (
    AbstractAdaptiveSolver as AbstractAdaptiveSolver,
    AbstractDiffraxMethod as AbstractDiffraxMethod,
    Diffrax as Diffrax,
    Dopri5 as Dopri5,
    Dopri8 as Dopri8,
    Kvaerno5 as Kvaerno5,
    Tsit5 as Tsit5,
)
from .base import (
    AbstractFixedStepSolver as AbstractFixedStepSolver,
    AbstractSolver as AbstractSolver,
    check_solver as check_solver,
    SolverState as SolverState,
)
from .diffrax_sde import DiffraxSDE as DiffraxSDE
from .rosenbrock import (
    AbstractRosenbrock as AbstractRosenbrock,
    Rodas4 as Rodas4,
    Rodas5P as Rodas5P,
    Rosenbrock23 as Rosenbrock23,
    RosenbrockTableau as RosenbrockTableau,
)
from .runge_kutta import (
    AbstractRungeKutta as AbstractRungeKutta,
    Euler as Euler,
    Heun as Heun,
    Midpoint as Midpoint,
    Ralston as Ralston,
    RK4 as RK4,
    RK38 as RK38,
)
from .stochastic import (
    AbstractStochasticSolver as AbstractStochasticSolver,
    BAOAB as BAOAB,
    brownian_increment as brownian_increment,
    EulerMaruyama as EulerMaruyama,
    Milstein as Milstein,
)
from .symplectic import (
    AbstractSymplectic as AbstractSymplectic,
    Leapfrog as Leapfrog,
    SymplecticEuler as SymplecticEuler,
    Yoshida4 as Yoshida4,
    Yoshida6 as Yoshida6,
    Yoshida8 as Yoshida8,
)
from .tableau import ButcherTableau as ButcherTableau, combine as combine
