"""diffsim: differentiable physics and ODE simulation on JAX.

`simulate(model, y0, ts, solver=...)` is the core; models are `equinox.Module`s whose fields are
their parameters; every solver composes with `jax.jit`, `jax.vmap` and `jax.grad`.
"""

from importlib.metadata import PackageNotFoundError, version

from . import distributed as distributed, petab as petab, plot as plot, sbml as sbml
from ._analysis.iterate import iterate as iterate, Iterated as Iterated
from ._analysis.lyapunov import lyapunov_exponent as lyapunov_exponent
from ._analysis.sensitivity import jacobian as jacobian, sensitivity as sensitivity
from ._apps.experiment import ExperimentError as ExperimentError, run_experiment as run_experiment
from ._apps.reproduce import (
    compare_outputs as compare_outputs,
    Outcome as Outcome,
    reproduce as reproduce,
    ReproduceError as ReproduceError,
)
from ._cache import config as config, setup_at_import as _setup_cache
from ._events import Event as Event
from ._fit.data import Data as Data
from ._fit.fit import fit as fit, FitWarning as FitWarning
from ._fit.posterior import Posterior as Posterior
from ._fit.posterior_file import PosteriorFileError as PosteriorFileError
from ._fit.profile import Profile as Profile
from ._fit.refit import FitBatch as FitBatch
from ._fit.result import FitResult as FitResult
from ._fit.sample import sample as sample
from ._fit.study import (
    Experiment as Experiment,
    Observable as Observable,
    Problem as Problem,
    Unknown as Unknown,
)
from ._fit.study_collocate import collocate as collocate
from ._fit.study_fit import ProblemFit as ProblemFit
from ._fit.study_profile import profile as profile, refit as refit
from ._fit.study_shooting import multiple_shooting as multiple_shooting
from ._fit.study_train import train as train, Trained as Trained
from ._integrate.dae import consistent_initial_state as consistent_initial_state
from ._integrate.dense import DenseOutput as DenseOutput
from ._integrate.simulate import simulate as simulate, Solution as Solution
from ._integrate.steady_state import steady_state as steady_state, SteadyState as SteadyState
from ._model import (
    AbstractDDE as AbstractDDE,
    AbstractHamiltonian as AbstractHamiltonian,
    AbstractLagrangian as AbstractLagrangian,
    AbstractLangevin as AbstractLangevin,
    AbstractODE as AbstractODE,
    AbstractSDE as AbstractSDE,
    AbstractSecondOrder as AbstractSecondOrder,
    AbstractSeparableHamiltonian as AbstractSeparableHamiltonian,
    DDE as DDE,
    join_pair as join_pair,
    ODE as ODE,
    split_pair as split_pair,
)
from ._parameter import parameter as parameter
from ._results import (
    PrecisionWarning as PrecisionWarning,
    result_message as result_message,
    RESULTS as RESULTS,
    SimulationError as SimulationError,
)
from ._solver import (
    AbstractAdaptiveSolver as AbstractAdaptiveSolver,
    AbstractDiffraxMethod as AbstractDiffraxMethod,
    AbstractFixedStepSolver as AbstractFixedStepSolver,
    AbstractRosenbrock as AbstractRosenbrock,
    AbstractRungeKutta as AbstractRungeKutta,
    AbstractSolver as AbstractSolver,
    AbstractStochasticSolver as AbstractStochasticSolver,
    AbstractSymplectic as AbstractSymplectic,
    BAOAB as BAOAB,
    brownian_increment as brownian_increment,
    ButcherTableau as ButcherTableau,
    Diffrax as Diffrax,
    DiffraxSDE as DiffraxSDE,
    Dopri5 as Dopri5,
    Dopri8 as Dopri8,
    Euler as Euler,
    EulerMaruyama as EulerMaruyama,
    Heun as Heun,
    Kvaerno5 as Kvaerno5,
    Leapfrog as Leapfrog,
    Midpoint as Midpoint,
    Milstein as Milstein,
    Ralston as Ralston,
    RK4 as RK4,
    RK38 as RK38,
    Rodas4 as Rodas4,
    Rodas5P as Rodas5P,
    Rosenbrock23 as Rosenbrock23,
    RosenbrockTableau as RosenbrockTableau,
    SymplecticEuler as SymplecticEuler,
    Tsit5 as Tsit5,
    Yoshida4 as Yoshida4,
    Yoshida6 as Yoshida6,
    Yoshida8 as Yoshida8,
)
from ._sweep.morris import morris as morris
from ._sweep.samples import Samples as Samples
from ._sweep.sobol import sobol as sobol
from ._sweep.store import SweepStoreError as SweepStoreError
from ._sweep.sweep import open_sweep as open_sweep, sweep as sweep, sweep_summary as sweep_summary

try:
    __version__ = version("diffsim")
except PackageNotFoundError:  # running from a source checkout that is not installed
    __version__ = "0+unknown"
del version, PackageNotFoundError  # not part of the API

_setup_cache()  # the persistent compilation cache, on unless turned off (see `ds.config`)
del _setup_cache
