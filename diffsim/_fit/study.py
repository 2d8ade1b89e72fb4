"""`ds.Problem`: a study of several experiments, its observables and its unknowns, as one
object that `ds.fit` (and the capabilities built on it) take.

A study is PEtab's data model, experiments × observables × unknowns (PEtab.jl's
`PEtabODEProblem`, pyPESTO's objective), written in Python:

- the **model** is shared; its parameters are its scalar floating fields (or the keys of a
  `ds.ODE`'s `params` dict);
- each **experiment** (a condition) has its data, its initial state (an array, or a function
  of the parameters), its start time, the parameters it sets (to numbers or to other
  parameters, estimated or not) and, optionally, a pre-equilibration under other settings;
- each **observable** maps (t, y, p) to what is measured, with a noise model and its σ (a
  number, a parameter's name, or a function);
- the **unknowns** are estimated on their scale (lin, log, log10) within bounds, with
  optional priors; parameters that only observables or noise models use (a scale, an
  offset, σ) are unknowns like the model's.

The objective is the negative log-likelihood of every measurement (the log σ terms included,
so noise parameters are estimated with the rest) plus the negative log-priors. This module
checks the description and turns it into static index tables and arrays (`Tables`) that the
compiled objective (`study_objective.py`) reads.
"""

import dataclasses
import inspect
import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._model import AbstractODE, check_model
from .._solver.base import AbstractSolver, check_solver
from .._warn import warn
from .data import Data, FitWarning
from .study_changes import (
    checked_changes,
    functions_of,
    segment_grids,
    segment_of,
    SegmentTables,
    signature,
    state_assignments,
    working_precision,
    working_round_off,
)
from .study_objective import check_resolved, evaluate_llh, evaluate_predictions

SCALES = ("lin", "log", "log10")
NOISE_MODELS = ("normal", "laplace", "log-normal", "log10-normal", "log-laplace", "log10-laplace")


def _finite_number(value, what: str) -> float:
    """`value` as a float, else a TypeError (not a number) or ValueError (NaN, inf) naming
    `what`."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"{what} must be finite, got {value!r}")
    return number


@dataclasses.dataclass(frozen=True)
class Unknown:
    """A parameter of a study estimated from its data (or held at `value` with
    `estimate=False`).

    - `value`: its value in natural units: the nominal value (where `Problem.llh()`
      evaluates) and the start of a fit. A value outside `bounds` is allowed with a warning
      (PEtab's nominal values may lie there); fits start from the nearest bound.
    - `bounds`: `(lower, upper)` in natural units (`None` for an open side); on a log scale
      a lower bound ≤ 0 is read as 0, open on that scale (a PEtab file's log-scale bound of 0
      is refused instead: the format asks for positive ones). A fit stays inside them.
    - `scale`: `"lin"`, `"log"` or `"log10"`: the coordinate it is optimised, screened
      (uniformly between its bounds on that scale, so 1e-5 … 1e5 is ten equal decades) and
      reported in (`ProblemFit.params_on_scale`, standard errors and intervals).
    - `prior`: a numpyro distribution over the natural value, or None (flat within the
      bounds): `ds.fit` then maximises the posterior density (MAP).
    - `estimate`: False holds it at `value` (a parameter the study names but does not fit).
    - `prior_on_scale`: True reads `prior` as a distribution of the value on its `scale`
      (log10 k ~ Normal(−2, 1) for `scale="log10"`; PEtab's `parameterScale*` priors), so
      its density is that of the scaled value (no Jacobian to the natural value).
    """

    value: float
    bounds: tuple | None = None
    scale: str = "lin"
    prior: Any = None
    estimate: bool = True
    prior_on_scale: bool = False

    def __post_init__(self):
        value = _finite_number(self.value, "Unknown(value=...)")
        if self.scale not in SCALES:
            raise ValueError(f"Unknown(scale={self.scale!r}) must be one of {SCALES}")
        if not isinstance(self.estimate, (bool, np.bool_)):
            raise TypeError(f"Unknown(estimate=...) must be True or False, got {self.estimate!r}")
        low, high = -math.inf, math.inf
        if self.bounds is not None:
            if isinstance(self.bounds, (str, bytes)) or len(self.bounds) != 2:
                raise ValueError(f"Unknown(bounds=...) must be (lower, upper), got {self.bounds!r}")
            low = -math.inf if self.bounds[0] is None else float(self.bounds[0])
            high = math.inf if self.bounds[1] is None else float(self.bounds[1])
            if math.isnan(low) or math.isnan(high) or not low < high:
                raise ValueError(f"Unknown(bounds={self.bounds!r}) needs lower < upper")
        if self.scale != "lin":
            low = max(low, 0.0)
            if value <= 0:
                raise ValueError(
                    f"Unknown(value={value}, scale={self.scale!r}): a value on a log scale must "
                    "be positive"
                )
        if self.estimate and not low <= value <= high:
            # PEtab allows it (a published value where the likelihood is evaluated, bounds
            # for the search); a fit starts from the nearest bound (`Problem.first_guess`)
            warn(
                f"Unknown(value={value}) lies outside its bounds ({low}, {high}): llh() is "
                "evaluated there, but fits, profiles and training start from the nearest bound"
            )
        if self.prior is not None and not hasattr(self.prior, "log_prob"):
            raise TypeError(
                f"Unknown(prior=...) must be a numpyro distribution, got {self.prior!r}"
            )
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "bounds", (low, high))
        object.__setattr__(self, "estimate", bool(self.estimate))
        if not isinstance(self.prior_on_scale, (bool, np.bool_)):
            raise TypeError(
                f"Unknown(prior_on_scale=...) must be True or False, got {self.prior_on_scale!r}"
            )
        if self.prior_on_scale and self.prior is None:
            raise ValueError("Unknown(prior_on_scale=True) needs a prior")
        object.__setattr__(self, "prior_on_scale", bool(self.prior_on_scale))

    def to_scale(self, x):
        """A natural value on this unknown's scale."""
        return {"lin": lambda v: v, "log": np.log, "log10": np.log10}[self.scale](x)


@dataclasses.dataclass(frozen=True)
class Observable:
    """What is measured: `fn(t, y, p) -> scalar`, with `p` a dict of every parameter of the
    study (model parameters as the experiment sets them, and the extras), `t` the time and `y`
    the state.

    - `noise`: the noise model of its measurements m around the prediction y: `"normal"`,
      `"laplace"`, or either on log or log10 values (`"log-normal"`, `"log10-normal"`,
      `"log-laplace"`, `"log10-laplace"`: then m and y must be positive).
    - `sigma`: the noise's scale (standard deviation for normal, b for Laplace; on the log
      scale for the log models): a number, the name of a parameter (an unknown: estimated
      with the rest), or a function `sigma(t, y, p)`.
    """

    fn: Callable
    noise: str = "normal"
    sigma: Any = 1.0

    def __post_init__(self):
        if not callable(self.fn):
            raise TypeError(
                f"Observable(fn, ...): fn must be callable as fn(t, y, p), got {self.fn!r}"
            )
        if self.noise not in NOISE_MODELS:
            raise ValueError(f"Observable(noise={self.noise!r}) must be one of {NOISE_MODELS}")
        sigma = self.sigma
        if isinstance(sigma, numbers.Real) and not isinstance(sigma, bool):
            if not (math.isfinite(sigma) and sigma > 0):
                raise ValueError(f"Observable(sigma={sigma}) must be positive and finite")
        elif not isinstance(sigma, str) and not callable(sigma):
            raise TypeError(
                "Observable(sigma=...) must be a number, the name of a parameter, or a "
                f"function sigma(t, y, p), got {sigma!r}"
            )

    @property
    def log_base(self) -> float | None:
        """None on linear values, e or 10 for the log models."""
        if self.noise.startswith("log10-"):
            return 10.0
        if self.noise.startswith("log-"):
            return math.e
        return None

    @property
    def laplace(self) -> bool:
        return self.noise.endswith("laplace")


@dataclasses.dataclass(frozen=True)
class Experiment:
    """One experiment (condition) of a study.

    - `data`: its measurements: a long table (a pandas DataFrame, or a dict of columns) with
      columns `time`, `observable` (an observable's name) and `value`, one row per measurement
      (repeated rows at one time are replicates; NaN values are left out); further columns
      named after parameters override them for that row (a number, or another parameter's
      name: PEtab's measurement-specific observable and noise parameters). Or a `ds.Data`
      whose observables are named after the study's observables.
    - `y0`: the initial state at `t0`: an array, or a function of the parameters `p -> y0`.
    - `t0`: the start time (default 0).
    - `set`: parameter name → a number or another parameter's name: this experiment's own
      values (a dose, a condition-specific unknown such as `{"k2": "k2_treated"}`).
    - `pre_equilibrate`: None; True (start from the steady state under this experiment's own
      settings, reached from y0); or a dict of settings (as `set`, applied on top of the
      experiment's) of the condition the system rested in before (its steady state, reached
      from y0 under those settings, is the start). Derivatives by the implicit function
      theorem (`ds.steady_state`).
    - `reinitialize`: with a pre-equilibration, the states (names, or indices into the state)
      that start anew from `y0` under this experiment's settings instead of at rest (a dose
      added after the system settled; PEtab's species set by the simulation condition).
    - `changes`: what happens at given times: a list of `(time, {name: value})` (or a dict
      time → assignments). A parameter's name takes a number or another parameter's name
      from that time on (an input switched on, a rate that changes); a state's name (or
      index) is set to a number, a parameter's value, or `fn(y, p)` of the state and
      parameters just before the change (a dose: `{"A": lambda y, p: y[0] + p["dose"]}`).
      A parameter's name as a value means its value just before the change.
      The solver stops at every change; a measurement at a change's time sees the state
      after it.
    - `name`: a label for tables and plots (default `"experiment <i>"`).
    """

    data: Any
    y0: Any
    t0: float = 0.0
    set: Mapping | None = None
    pre_equilibrate: Any = None
    name: str | None = None
    reinitialize: tuple = ()
    changes: Any = None


@dataclasses.dataclass(frozen=True)
class Rows:
    """The measurements of one experiment in long form (one row each)."""

    time: np.ndarray  # (rows,)
    observable: np.ndarray  # (rows,) int: index into the study's observables
    value: np.ndarray  # (rows,)
    overrides: dict  # parameter name -> (rows,) object array of numbers or names


class Problem:
    """A study: a shared `model`, its `experiments`, its `observables` and its `unknowns`,
    which `ds.fit` takes (`ds.fit(problem)`). See the module text and docs/fitting.md,
    "Studies with many experiments".

    **Arguments:**

    - `model`: the model (`ds.AbstractODE`, or a `ds.ODE` whose `params` is a dict); its
      scalar floating fields (or `params` keys) are the study's model parameters, at the
      values the model holds unless an unknown or an experiment sets them.
    - `experiments`: a list of `ds.Experiment`.
    - `observables`: dict name → `ds.Observable`.
    - `unknowns`: dict name → `ds.Unknown` (or a number: an estimated unknown without bounds
      on the linear scale): model parameters and extra parameters (noise, scales, offsets,
      condition-specific values) alike.
    - `solver`, `max_steps`: how every experiment is simulated (default `ds.Rodas5P(rtol=1e-8,
      atol=1e-10)`, in float32 `rtol=1e-5, atol=1e-7`: stiff-safe, as models of biochemistry
      often are). Adaptive solvers only:
      the experiments run as one batch with their own times.

    `problem.llh(params)` is the log-likelihood (with the log-priors, `log_posterior`) at a
    dict of natural values (default: every unknown's `value`); `problem.names` the estimated
    unknowns in the order of every vector a fit reports.
    """

    def __init__(
        self,
        model: AbstractODE,
        experiments,
        observables: Mapping,
        unknowns: Mapping,
        *,
        solver: AbstractSolver | None = None,
        max_steps: int = 100_000,
    ):
        from .._solver.adaptive import working_tolerances
        from .._solver.rosenbrock import Rodas5P
        from .._validate import check_static_count

        check_model("model", model)
        if not isinstance(observables, Mapping) or not observables:
            raise ValueError(
                "observables must be a non-empty dict name -> ds.Observable(fn, noise=, sigma=)"
            )
        for name, observable in observables.items():
            if not isinstance(observable, Observable):
                raise TypeError(
                    f"observables[{name!r}] must be a ds.Observable, got "
                    f"{type(observable).__name__}"
                )
        self.observables = {str(k): v for k, v in observables.items()}
        self.unknowns = _checked_unknowns(unknowns)
        if isinstance(experiments, Experiment):
            experiments = [experiments]
        if not isinstance(experiments, (list, tuple)) or not experiments:
            raise ValueError("experiments must be a non-empty list of ds.Experiment")
        for i, experiment in enumerate(experiments):
            if not isinstance(experiment, Experiment):
                raise TypeError(
                    f"experiments[{i}] must be a ds.Experiment, got {type(experiment).__name__}"
                )
        named = [e.name or f"experiment {i}" for i, e in enumerate(experiments)]
        if len(set(named)) != len(named):
            raise ValueError(f"experiment names must differ, got {named}")
        if getattr(model, "timed_events", ()):
            # an SBML model's time-triggered events: each experiment's changes at the times
            # its settings give (each solve starts at its own t0, and changes cut it)
            model, experiments = model.with_events_as_changes(experiments, self.unknowns)
        self.model = model
        self.model_parameters = model_parameters(model)
        self.experiment_names = tuple(named)
        self.experiments = tuple(experiments)
        if solver is None:
            solver = Rodas5P(*working_tolerances(1e-8, 1e-10, jnp.result_type(float)))
        check_solver("solver", solver)
        if not solver.adaptive:
            raise TypeError(
                f"a ds.Problem is simulated with an adaptive solver (each experiment runs its "
                f"own times in one batch); {type(solver).__name__} takes fixed steps: use "
                "ds.Rodas5P() (stiff-safe) or ds.Tsit5()"
            )
        self.solver = solver
        self.max_steps = check_static_count("max_steps", max_steps)
        self.parameter_names = tuple(self.model_parameters) + tuple(
            n for n in self.unknowns if n not in self.model_parameters
        )
        self.names = tuple(n for n, u in self.unknowns.items() if u.estimate)
        self.rows = tuple(
            _rows(experiment, name, self.observables)
            for experiment, name in zip(self.experiments, self.experiment_names)
        )
        self._check_references()
        size = (
            _state_size(self, _base_values(self)) if any(e.changes for e in self.experiments) else 0
        )
        self.changes = tuple(
            checked_changes(
                experiment,
                label,
                self.parameter_names,
                getattr(self.model, "state_names", None),
                size,
            )
            for experiment, label in zip(self.experiments, self.experiment_names)
        )
        _check_functions(self)
        for name, observable in self.observables.items():
            if observable.log_base is None:
                continue
            o = list(self.observables).index(name)
            for rows, label in zip(self.rows, self.experiment_names):
                bad = rows.value[(rows.observable == o) & ~(rows.value > 0)]
                if bad.size:
                    raise ValueError(
                        f"{label}: observable {name!r} has {observable.noise} noise, but a "
                        f"measurement of it is {bad[0]:g}: its logarithm is undefined (use "
                        "normal noise, or leave the value out)"
                    )
        self.tables = build_tables(self)
        # where the problem came from, for tools that write its tables back (ds.petab: the
        # file and, per row of its measurement table, the index of that measurement here)
        self.source: dict | None = None

    # --- checks --------------------------------------------------------------------------------

    def _check_references(self):
        known = set(self.parameter_names)

        def check(name, where):
            if name not in known:
                raise ValueError(_undefined(self, f"{where} names {name!r}"))

        for name, observable in self.observables.items():
            if isinstance(observable.sigma, str):
                check(observable.sigma, f"observables[{name!r}].sigma")
        for experiment, label, rows in zip(self.experiments, self.experiment_names, self.rows):
            for key, value in (experiment.set or {}).items():
                check(key, f"{label}'s set")
                if isinstance(value, str):
                    check(value, f"{label}'s set[{key!r}]")
            if isinstance(experiment.pre_equilibrate, Mapping):
                for key, value in experiment.pre_equilibrate.items():
                    check(key, f"{label}'s pre_equilibrate")
                    if isinstance(value, str):
                        check(value, f"{label}'s pre_equilibrate[{key!r}]")
            for key, column in rows.overrides.items():
                check(key, f"{label}'s data column")
                for value in column:
                    if isinstance(value, str):
                        check(value, f"{label}'s data column {key!r}")

    # --- evaluation ----------------------------------------------------------------------------

    def __repr__(self) -> str:
        rows = sum(len(r.time) for r in self.rows)
        return (
            f"Problem({type(self.model).__name__}: {len(self.experiments)} experiments, "
            f"{len(self.observables)} observables, {rows} measurements, {len(self.names)} "
            "unknowns)"
        )

    def uniform_starts(self, count: int, *, seed: int = 0) -> np.ndarray:
        """Starts for `ds.fit(problem, starts=...)`: `(count, len(names))` natural values,
        each estimated unknown uniform on its scale within its bounds (± one unit of the scale
        around its value where a bound is open), from NumPy's generator seeded with `seed`.
        These are the starts the PEtab benchmark collection and pyPESTO draw, and those of
        `diffsim fit problem.yaml`; the unknowns' values (in a published problem, often the
        published optimum) are not among them, unlike `ds.fit(problem, starts=N)`'s screen."""
        from .._validate import check_static_count
        from .study_objective import natural_on_host, scaled_on_host

        count = check_static_count("count", count)
        tables = self.tables
        guess = scaled_on_host(self.first_guess(), tables.scales)
        lower = np.where(np.isfinite(tables.lower), tables.lower, guess - 1.0)
        upper = np.where(np.isfinite(tables.upper), tables.upper, guess + 1.0)
        unit = np.random.default_rng(seed).uniform(size=(count, len(self.names)))
        return natural_on_host(lower + (upper - lower) * unit, tables.scales)

    def theta(self, params: Mapping | None = None) -> np.ndarray:
        """The estimated unknowns as a vector of natural values in the order of `names`
        (`params` name → value overrides their `value`s)."""
        params = dict(params or {})
        unknown = sorted(set(params) - set(self.names))
        if unknown:
            raise ValueError(f"params names {unknown}, which are not estimated unknowns")
        return np.asarray(
            [float(params.get(n, self.unknowns[n].value)) for n in self.names], np.float64
        )

    def first_guess(self) -> np.ndarray:
        """`theta()` with each value outside its unknown's bounds moved onto the nearest bound:
        where a fit, a profile from the guess and training start."""
        lower = np.asarray([self.unknowns[n].bounds[0] for n in self.names], np.float64)
        upper = np.asarray([self.unknowns[n].bounds[1] for n in self.names], np.float64)
        return np.clip(self.theta(), lower, upper)

    def llh(self, params: Mapping | None = None) -> float:
        """The log-likelihood of every measurement at `params` (natural values of estimated
        unknowns; the others at their `value`), without the priors. Where it is not finite, a
        warning names the first measurement without a likelihood and why."""
        value, _, smallest = self._evaluate(params)
        value = float(value)
        unresolved = check_resolved(self, float(smallest))
        if unresolved:
            warn(unresolved, FitWarning)
        if not math.isfinite(value):
            reason = self.why_not_finite(params)
            if reason:
                warn(f"the log-likelihood is {value}: {reason}")
        return value

    def why_not_finite(self, params: Mapping | None = None) -> str | None:
        """Why the log-likelihood at `params` is not finite: the first measurement (experiment,
        observable, time) whose prediction is not finite (the solve failed there, or the
        observable is undefined), whose σ is not positive, or whose log-scale noise meets a
        prediction ≤ 0; None where every measurement has a likelihood."""
        observable = self.observables
        predicted = zip(self.predictions(params), self.experiment_names, self.experiments)
        for experiment, label, definition in predicted:
            rested = definition.pre_equilibrate is not None
            for t, name, y, sigma in zip(
                experiment["time"],
                experiment["observable"],
                experiment["prediction"],
                experiment["sigma"],
            ):
                where = f"{label}'s {name} at t = {t:g}"
                if not np.isfinite(y):
                    return f"{where} is predicted as {y} (" + (
                        "its pre-equilibration reached no steady state (a state that keeps "
                        "growing has none), or the simulation failed before it, or the "
                        "observable is undefined there)"
                        if rested
                        else "the simulation failed before it, or the observable is undefined "
                        "there)"
                    )
                if not (np.isfinite(sigma) and sigma > 0):
                    return f"{where} has σ = {sigma:g}: a noise level must be positive"
                if observable[name].log_base is not None and not y > 0:
                    return (
                        f"{where} is predicted as {y:g}, but its {observable[name].noise} "
                        "noise needs a positive prediction"
                    )
        return None

    def with_model(self, model, *, unknowns: Mapping | None = None) -> "Problem":
        """The same problem (experiments, observables, unknowns, solver) about `model`, a model
        of the same parameters with other values elsewhere: `ds.fit(problem.with_model(
        trained))` estimates the mechanistic unknowns, with their uncertainty, given a hybrid
        model's trained network. Observable formulas keep reading the model they were built
        with (a PEtab problem's read states and parameters, not the networks). `unknowns`
        replaces the problem's (e.g. the same with other starting values)."""
        problem = Problem(
            model,
            self.experiments,
            self.observables,
            self.unknowns if unknowns is None else unknowns,
            solver=self.solver,
            max_steps=self.max_steps,
        )
        if hasattr(self, "source"):
            problem.source = self.source
        return problem

    def log_likelihood(self, theta=None, *, model=None):
        """The log-likelihood as a JAX scalar that `jax.grad` and `jax.jit` go through: at
        `theta` (natural values of the estimated unknowns in `problem.names` order, shape
        (len(names),); default: their values), with `model` in place of `problem.model` (the
        same structure with other values: a hybrid model's trained network). Without priors.
        For training a network inside the model (docs/howto/hybrid-models.md); `llh` gives the
        same number on the host. The study's model parameters (`problem.model_parameters`)
        are not read from `model`: they take `theta`'s values where estimated and the values
        the problem was built with elsewhere (so `model`'s gradient is zero in them): move
        them through `theta`, or build the problem anew (`problem.with_model(model)`)."""
        from .study_objective import evaluate_log_likelihood

        if theta is None:
            theta = self._theta_array(None)
        theta = jnp.asarray(theta)
        if theta.shape != (len(self.names),):
            raise ValueError(
                f"theta must have shape ({len(self.names)},), one natural value per estimated "
                f"unknown {list(self.names)}, got {theta.shape}"
            )
        return evaluate_log_likelihood(self, theta, model)

    def design_ranges(self, caller: str, ranges, extras: dict):
        """For `ds.sobol`/`ds.morris` of the problem: (names, lows, highs) on the unknowns'
        scales (`study_design.problem_ranges`)."""
        from .study_design import problem_ranges

        return problem_ranges(caller, self, ranges, extras)

    def design_values(self, caller: str, names, design, *, reduce, chunk_size, progress):
        """For `ds.sobol`/`ds.morris` of the problem: the quantity at every point of `design`
        (`study_design.run_problem_design`)."""
        from .study_design import run_problem_design

        return run_problem_design(
            caller, self, names, design, reduce=reduce, chunk_size=chunk_size, progress=progress
        )

    def log_posterior(self, params: Mapping | None = None) -> float:
        """The log-likelihood plus the log-priors (unnormalised)."""
        llh, log_prior, _ = self._evaluate(params)
        return float(llh + log_prior)

    def predictions(self, params: Mapping | None = None) -> list[dict]:
        """Per experiment: `time`, `observable` (names), `value` (measured), `prediction` (the
        model's), `sigma` (the noise's scale) and `residual` ((m − y)/σ on the noise model's
        scale: its square summed is the χ²) of every measurement, at `params`."""
        theta = self._theta_array(params)
        predicted, sigma, residual = (np.asarray(x) for x in evaluate_predictions(self, theta))
        out, start = [], 0
        names = np.asarray(list(self.observables), dtype=object)
        for rows in self.rows:
            end = start + len(rows.time)
            out.append(
                dict(
                    time=rows.time,
                    observable=names[rows.observable],
                    value=rows.value,
                    prediction=predicted[start:end],
                    sigma=sigma[start:end],
                    residual=residual[start:end],
                )
            )
            start = end
        return out

    def _theta_array(self, params):
        dtype = jnp.result_type(float)
        return jnp.asarray(self.theta(params), dtype)

    def _evaluate(self, params):
        return tuple(np.asarray(v) for v in evaluate_llh(self, self._theta_array(params)))


# --- parameters of a model ------------------------------------------------------------------------


def model_parameters(model) -> dict[str, Callable]:
    """name → accessor `model -> value` of every scalar floating parameter of `model`: its
    fields, or the keys of its dict of named parameters (`parameters_field`: a `ds.ODE`'s or an
    SBML model's `params`)."""
    found = {}
    field = model.parameters_field
    if field is not None and isinstance(getattr(model, field), Mapping):
        for key, value in getattr(model, field).items():
            if _is_scalar_float(value):
                found[str(key)] = lambda m, key=key: getattr(m, field)[key]
        return found
    for field in dataclasses.fields(model):
        value = getattr(model, field.name, None)
        if _is_scalar_float(value):
            found[field.name] = lambda m, name=field.name: getattr(m, name)
    return found


def _is_scalar_float(value) -> bool:
    # a Python float field (`k: float`, as ds.fit(model, params=["k"]) takes it) is a parameter
    # as a 0-d floating array is: leaving it out made an unknown of that name move nothing
    if isinstance(value, float):
        return True
    return (
        hasattr(value, "dtype")
        and jnp.ndim(value) == 0
        and jnp.issubdtype(jnp.result_type(value), jnp.floating)
    )


def _checked_unknowns(unknowns) -> dict[str, Unknown]:
    if not isinstance(unknowns, Mapping):
        raise TypeError(
            "unknowns must be a dict name -> ds.Unknown(value, bounds=, scale=), got "
            f"{type(unknowns).__name__}"
        )
    out = {}
    for name, unknown in unknowns.items():
        if isinstance(unknown, numbers.Real) and not isinstance(unknown, bool):
            unknown = Unknown(float(unknown))
        if not isinstance(unknown, Unknown):
            raise TypeError(f"unknowns[{name!r}] must be a ds.Unknown or a number, got {unknown!r}")
        out[str(name)] = unknown
    return out


def require_estimated(problem: "Problem", call: str) -> None:
    """Refuse `call` (ds.fit, ds.profile, ds.sample) on a problem that estimates nothing; such
    a problem still evaluates (`llh`, `predictions`) at the values it is given."""
    if not any(u.estimate for u in problem.unknowns.values()):
        raise ValueError(
            f"{call}: no unknown of the problem is estimated: nothing to fit (estimate=True on "
            "at least one; a network inside the model is trained by ds.train(problem, "
            "networks=...))"
        )


# --- measurements in long form -------------------------------------------------------------------


def _numbers(column, label: str, name: str) -> np.ndarray:
    """A data column as float64, or an error naming the experiment, column and row of the
    first cell that is no number."""
    try:
        return np.asarray(column, dtype=np.float64).ravel()
    except (TypeError, ValueError):
        for row, cell in enumerate(np.asarray(column, dtype=object).ravel()):
            try:
                float(cell)
            except (TypeError, ValueError):
                raise ValueError(
                    f"{label}: its {name} column holds {cell!r} at row {row}, which is no "
                    "number (mark a missing value with NaN)"
                ) from None
        raise


def _rows(experiment: Experiment, label: str, observables: dict) -> Rows:
    names = list(observables)
    data = experiment.data
    if isinstance(data, Data):
        if data.noise is not None or data.weights is not None:
            # a study's noise is its observables' (σ, noise model); ignoring these would fit
            # with σ the data did not state
            raise ValueError(
                f"{label}: its ds.Data carries {'noise' if data.noise is not None else 'weights'}"
                ", which a study does not read: give each observable its σ "
                "(ds.Observable(..., sigma=0.1), an estimated unknown's name, or a function), "
                "or pass the measurements as a long table with a column per σ parameter"
            )
        # unnamed columns are unambiguous only for a single observable: with several, their
        # order against the observables' would be a guess (columns (B, A) were read as (A, B))
        columns = data.names or (tuple(names) if data.num_observables == len(names) == 1 else None)
        if columns is None:
            raise ValueError(
                f"{label}: its ds.Data has no observable names; name its columns after the "
                f"study's observables ({names}), e.g. ds.Data(ts, values, names={tuple(names)})"
            )
        values = data.values.reshape(len(data.ts), -1)
        table = {"time": [], "observable": [], "value": []}
        for j, column in enumerate(columns):
            for t, v in zip(data.ts, values[:, j]):
                table["time"].append(t)
                table["observable"].append(column)
                table["value"].append(v)
    elif type(data).__module__.split(".")[0] == "pandas":
        table = {str(c): data[c].to_numpy() for c in data.columns}
    elif isinstance(data, Mapping):
        table = {str(k): v for k, v in data.items()}
    else:
        raise TypeError(
            f"{label}: data must be a long table (a pandas DataFrame or a dict with columns "
            f"time, observable, value) or a ds.Data, got {type(data).__name__}"
        )
    missing = [c for c in ("time", "observable", "value") if c not in table]
    if missing:
        raise ValueError(f"{label}: its data have no column {missing} (it has {list(table)})")
    time, value = (_numbers(table[c], label, c) for c in ("time", "value"))
    observable = np.asarray(table["observable"], dtype=object).ravel()
    if not len(time) == len(value) == len(observable):
        raise ValueError(f"{label}: the columns time, observable and value differ in length")
    unknown_names = sorted({str(o) for o in observable} - set(names))
    if unknown_names:
        raise ValueError(
            f"{label}: its data name observables {unknown_names} the study does not define "
            f"(it has {names})"
        )
    if np.any(np.isinf(value)):
        raise ValueError(f"{label}: its data values hold inf; mark missing values with NaN")
    if not np.all(np.isfinite(time)):
        raise ValueError(f"{label}: its data times hold NaN or inf")
    # a NaN start time gave an llh of NaN whose warning blamed a failed simulation
    t0 = _finite_number(experiment.t0, f"{label}: t0")
    if len(time) and time.min() < t0:
        raise ValueError(
            f"{label}: a measurement at t = {time.min():g} precedes its t0 = {experiment.t0:g}"
        )
    keep = ~np.isnan(value)
    index = np.asarray([names.index(str(o)) for o in observable], dtype=np.int32)
    overrides = {}
    for column, cells in table.items():
        if column in ("time", "observable", "value"):
            continue
        cells = np.asarray(cells, dtype=object).ravel()
        if len(cells) != len(time):
            raise ValueError(f"{label}: its data column {column!r} differs in length")
        overrides[column] = cells[keep]
    if not np.any(keep):
        raise ValueError(f"{label}: every value of its data is missing")
    return Rows(time[keep], index[keep], value[keep], overrides)


# --- the index tables the compiled objective reads ------------------------------------------------

CONSTANT, ESTIMATED = 0, 1


@dataclasses.dataclass(frozen=True)
class ParameterTable:
    """Every parameter's value in a set of settings (rows: experiments, measurements …),
    from the estimated unknowns θ: `kind` CONSTANT takes `constant`, ESTIMATED takes
    θ[index]."""

    kind: np.ndarray  # (rows, parameters) int
    index: np.ndarray  # (rows, parameters) int: into θ
    constant: np.ndarray  # (rows, parameters) float

    def values(self, theta):
        """(rows, parameters) values for natural θ (traced)."""
        if theta.shape[0] == 0:  # a problem that estimates nothing: every value is constant
            return jnp.asarray(self.constant, theta.dtype)
        picked = theta[jnp.asarray(self.index)]
        return jnp.where(
            jnp.asarray(self.kind) == ESTIMATED, picked, self.constant.astype(theta.dtype)
        )

    def take(self, rows) -> "ParameterTable":
        return ParameterTable(self.kind[rows], self.index[rows], self.constant[rows])


@dataclasses.dataclass(frozen=True)
class Group:
    """Experiments simulated as one batch (the same kind of initial state and
    pre-equilibration): their settings, start times and padded output times."""

    members: tuple[int, ...]  # experiment indices
    settings: ParameterTable  # (members, parameters)
    pre: ParameterTable | None  # (members, parameters) settings of the pre-equilibration
    reset: np.ndarray | None  # (members, n) bool: states started anew after it
    y0: np.ndarray | None  # (members, n) arrays, or None when y0 is a function
    y0_fn: Callable | None
    ts: np.ndarray  # (members, times) t0 first, padded past the last time
    # per measurement row of these experiments (in study order): member and time index
    row_member: np.ndarray
    row_time: np.ndarray
    rows: np.ndarray  # indices of these rows among all the study's rows
    # with changes at given times: the segments between them (`ts` is then the first's)
    segments: SegmentTables | None = None


@dataclasses.dataclass(frozen=True)
class Tables:
    """Everything static the objective needs, as index arrays and constants."""

    groups: tuple[Group, ...]
    rows: ParameterTable  # (measurements, parameters): each measurement's settings
    row_time: np.ndarray  # (measurements,)
    row_value: np.ndarray  # (measurements,)
    row_observable: np.ndarray  # (measurements,)
    lower: np.ndarray  # (unknowns,) bounds on each unknown's scale
    upper: np.ndarray
    scales: tuple[str, ...]
    # (measurements, unknowns) bool: whether the simulation giving a measurement's state reads
    # the estimated unknown (`_simulations_read`)
    reads: np.ndarray
    # the estimated unknowns that are only the σ of normal-type noise: (index in θ, bool mask
    # of the measurements whose σ it is); a fit sets them to their closed-form optimum
    noise: tuple = ()
    # the estimated unknowns that only scale the predictions of normal measurements, y = s·h:
    # (index in θ, bool mask of those measurements); a fit sets them to their closed-form
    # optimum (weighted least squares given h and σ)
    scalings: tuple = ()

    @property
    def simulated(self) -> np.ndarray:
        """(unknowns,) bool: whether any experiment's simulation reads the unknown."""
        return self.reads.any(axis=0)


def build_tables(problem: Problem) -> Tables:
    names = problem.parameter_names
    position = {n: k for k, n in enumerate(names)}
    estimated = {n: i for i, n in enumerate(problem.names)}
    base_kind = np.zeros(len(names), np.int32)
    base_index = np.zeros(len(names), np.int32)
    base_constant = np.zeros(len(names), np.float64)
    for k, name in enumerate(names):
        if name in estimated:
            base_kind[k], base_index[k] = ESTIMATED, estimated[name]
        elif name in problem.unknowns:
            base_constant[k] = problem.unknowns[name].value
        else:
            base_constant[k] = float(problem.model_parameters[name](problem.model))

    def resolve(value, where):
        """A setting's source: (kind, index, constant)."""
        if isinstance(value, str):
            k = position[value]
            return base_kind[k], base_index[k], base_constant[k]
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(
                f"{where} must be a number or a parameter's name, got {value!r}"
            ) from None
        if not math.isfinite(number):
            raise ValueError(f"{where} = {number} is not finite")
        return CONSTANT, 0, number

    def settings(overrides: Mapping | None, where: str, start=None, current=False):
        """Settings from `start` (default the base) with `overrides`; with `current`, a
        name in them takes that parameter's value in `start` (a change at a time sees the
        values just before it), else its base value (as `set` does)."""
        kind = base_kind.copy() if start is None else start[0].copy()
        index = base_index.copy() if start is None else start[1].copy()
        constant = base_constant.copy() if start is None else start[2].copy()
        for key, value in (overrides or {}).items():
            k = position[key]
            if current:
                kind[k], index[k], constant[k] = resolve_in(value, start, f"{where}[{key!r}]")
            else:
                kind[k], index[k], constant[k] = resolve(value, f"{where}[{key!r}]")
        return kind, index, constant

    def resolve_in(value, current, where):
        """A value's source where a name takes the parameter's value in `current` settings."""
        if isinstance(value, str):
            k = position[value]
            return current[0][k], current[1][k], current[2][k]
        return resolve(value, where)

    per_experiment, per_pre, per_segment = [], [], []
    for experiment, label, changes in zip(
        problem.experiments, problem.experiment_names, problem.changes
    ):
        own = settings(experiment.set, f"{label}'s set")
        per_experiment.append(own)
        segments = [own]
        for change in changes:
            where = f"{label}'s change at t = {change.time:g}"
            segments.append(settings(change.parameters, where, start=segments[-1], current=True))
        per_segment.append(segments)
        pre = experiment.pre_equilibrate
        if pre is None or pre is False:
            per_pre.append(None)
        elif pre is True:
            per_pre.append(own)
        elif isinstance(pre, Mapping):
            per_pre.append(settings(pre, f"{label}'s pre_equilibrate", start=own))
        else:
            raise TypeError(
                f"{label}: pre_equilibrate must be None, True or a dict of settings, got {pre!r}"
            )

    # each measurement's settings: its experiment's, then its row's overrides
    row_kind, row_index, row_constant = [], [], []
    times, values, observables = [], [], []
    for e, rows in enumerate(problem.rows):
        # a measurement sees the settings of the segment (between changes) it lies in
        segment = segment_of(problem.changes[e], rows.time)
        kinds, indices, constants = (
            np.stack([per_segment[e][j][i] for j in segment]).reshape(len(segment), -1)
            for i in range(3)
        )
        for column, cells in rows.overrides.items():
            k = position[column]
            for r, cell in enumerate(cells):
                if cell is None or (isinstance(cell, float) and math.isnan(cell)):
                    continue
                kinds[r, k], indices[r, k], constants[r, k] = resolve(
                    cell, f"{problem.experiment_names[e]}'s data column {column!r}"
                )
        row_kind.append(kinds)
        row_index.append(indices)
        row_constant.append(constants)
        times.append(rows.time)
        values.append(rows.value)
        observables.append(rows.observable)
    row_table = ParameterTable(
        np.concatenate(row_kind), np.concatenate(row_index), np.concatenate(row_constant)
    )
    offsets = np.cumsum([0] + [len(r.time) for r in problem.rows])

    groups = _groups(
        problem,
        per_experiment,
        per_pre,
        offsets,
        per_segment,
        # a state set to a parameter's name takes its value just before the change
        lambda value, before: resolve_in(value, before, "a change's value"),
    )
    lower, upper = [], []
    for name in problem.names:
        unknown = problem.unknowns[name]
        low, high = unknown.bounds
        with np.errstate(divide="ignore"):
            lower.append(float(unknown.to_scale(low)) if low > -math.inf else -math.inf)
            upper.append(float(unknown.to_scale(high)) if high < math.inf else math.inf)
    row_observable = np.concatenate(observables)
    referenced = _set_by_experiments(problem)
    return Tables(
        groups=groups,
        rows=row_table,
        row_time=np.concatenate(times),
        row_value=np.concatenate(values),
        row_observable=row_observable,
        lower=np.asarray(lower),
        upper=np.asarray(upper),
        scales=tuple(problem.unknowns[n].scale for n in problem.names),
        reads=_simulations_read(problem, groups, len(row_observable)),
        noise=_noise_unknowns(problem, row_table, row_observable, referenced),
        scalings=_scaling_unknowns(problem, row_table, row_observable, referenced),
    )


def _simulations_read(problem: Problem, groups, measurements: int) -> np.ndarray:
    """(measurements, unknowns) bool: whether the simulation that gives a measurement's state
    reads the estimated unknown, as a model parameter's setting of its experiment (the
    experiment's own, its pre-equilibration's or a segment's), a value one of its changes
    assigns to a state, or a name its initial-state function or a change's function reads
    (`_inputs_read`, which may over-count, never under-count). An unknown no simulation
    reads (a noise level, an observable's scaling or offset) reaches only the observation of
    the states, and one that an experiment's simulation does not read has no derivative in
    its states: a fit's Jacobian takes no tangent of the solves for the first and shares
    tangents between unknowns no experiment reads together (`study_fit._linearisation`)."""
    names = list(problem.parameter_names)
    reads = np.zeros((measurements, len(problem.names)), bool)

    def columns_read(fn, args, where):
        return {names.index(n) for n in _inputs_read(fn, args, where, problem)[0]}

    dtype = jnp.result_type(float)
    for group in groups:
        columns = set(range(len(problem.model_parameters)))
        if group.y0_fn is not None:
            columns |= columns_read(group.y0_fn, (), "y0")
        segments = group.segments
        if segments is not None:
            y = jax.ShapeDtypeStruct(segments.assigned.shape[-1:], dtype)
            for _, _, fn in segments.functions:
                columns |= columns_read(fn, (y,), "a change")
        columns = sorted(columns)
        member_reads = np.zeros((len(group.members), len(problem.names)), bool)
        for m in range(len(group.members)):
            tables = [(group.settings, columns), (group.pre, columns)]
            if segments is not None:
                tables += [(segments.settings, columns), (segments.values, slice(None))]
            for table, read in tables:
                if table is not None:
                    kind, index = table.kind[m][..., read], table.index[m][..., read]
                    member_reads[m, index[kind == ESTIMATED]] = True
        reads[group.rows] = member_reads[group.row_member]
    return reads


def _undefined(problem: Problem, what: str) -> str:
    """The message for a name that is neither a model parameter nor an unknown."""
    return (
        f"{what}, which is neither a parameter of {type(problem.model).__name__} "
        f"({', '.join(problem.model_parameters) or 'none'}) nor an unknown "
        f"({', '.join(problem.unknowns) or 'none'}): add it to unknowns"
    )


def _check_signature(fn, count: int, where: str) -> None:
    """`fn` takes `count` positional arguments, else a TypeError naming `where` and its call
    (a function of another shape would fail deep inside tracing)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C function: let the call decide
        return
    try:
        signature.bind(*range(count))
    except TypeError as error:
        call = "p" if count == 1 else "t, y, p"
        raise TypeError(
            f"{where} is called as fn({call}), which {fn!r} does not accept ({error})"
        ) from None


def _inputs_read(fn, args: tuple, where: str, problem: Problem):
    """(the names of `p` that `fn(*args, p)` reads, its output's shape), traced abstractly
    (nothing computed); `p` holds every parameter of the study. A name `p` lacks is refused
    naming `where`."""
    from jax.extend.core import Var  # literals (constants) are not

    dtype = jnp.result_type(float)
    names = sorted(problem.parameter_names)
    abstract = {n: jax.ShapeDtypeStruct((), dtype) for n in names}
    _check_signature(fn, len(args) + 1, where)
    try:
        closed = jax.make_jaxpr(lambda args, p: fn(*args, p))(args, abstract)
    except KeyError as error:
        key = error.args[0] if error.args else error
        raise ValueError(_undefined(problem, f"{where} reads p[{key!r}]")) from None
    jaxpr = closed.jaxpr
    first = len(jax.tree.leaves(args))  # the arguments' leaves, then p's in sorted key order
    reads = {v: {n} for v, n in zip(jaxpr.invars[first:], names)}
    for eqn in jaxpr.eqns:
        found = set().union(*(reads.get(v, set()) for v in eqn.invars if isinstance(v, Var)))
        for v in eqn.outvars:
            reads[v] = found
    out = set().union(*(reads.get(v, set()) for v in jaxpr.outvars if isinstance(v, Var)))
    shapes = [tuple(v.aval.shape) for v in jaxpr.outvars]
    return out, shapes[0] if len(shapes) == 1 else None


def _check_row_columns(rows, simulated: set, label: str) -> None:
    """A data column sets its parameter for the observables and σ of its rows only: the
    experiment is simulated once, so a column naming a parameter of the simulation (the
    model's or its initial state's) would be silently ignored there."""
    for column in rows.overrides:
        if column in simulated:
            raise ValueError(
                f"{label}'s data column {column!r} names a parameter its simulation reads: "
                "a column's values apply to its rows' observables and noise only (the "
                "experiment is simulated once). Give each value of it an experiment of its "
                f"own, with set={{{column!r}: value}}"
            )


def _check_functions(problem: Problem) -> None:
    """Every experiment's state of one shape; every observable and σ function one number,
    reading only parameters the study has; no σ fixed at a value ≤ 0; and a warning for each
    estimated unknown nothing reads (a typo in its name would leave it without any effect:
    its fit would "converge" anywhere)."""
    dtype = jnp.result_type(float)
    read = set(problem.model_parameters) | _named_by_experiments(problem)
    for rows in problem.rows:
        for key, column in rows.overrides.items():
            read |= {key} | {cell for cell in column if isinstance(cell, str)}
    shapes = []
    for experiment, label, rows in zip(problem.experiments, problem.experiment_names, problem.rows):
        simulated = set(problem.model_parameters)
        if callable(experiment.y0):
            names, shape = _inputs_read(experiment.y0, (), f"{label}'s y0 function", problem)
            read |= names
            simulated |= names
        else:
            shape = np.shape(np.asarray(experiment.y0))
        shapes.append(shape)
        _check_row_columns(rows, simulated, label)
        if shape != shapes[0]:
            raise ValueError(
                f"{label}'s initial state has shape {shape}, {problem.experiment_names[0]}'s "
                f"{shapes[0]}: the experiments of a study start states of one model"
            )
    t = jax.ShapeDtypeStruct((), dtype)
    y = jax.ShapeDtypeStruct(shapes[0], dtype)
    for name, observable in problem.observables.items():
        functions = [("", observable.fn)]
        if callable(observable.sigma):
            functions.append((".sigma", observable.sigma))
        else:
            read |= {observable.sigma} if isinstance(observable.sigma, str) else set()
        for suffix, fn in functions:
            where = f"observables[{name!r}]{suffix}"
            try:
                names, shape = _inputs_read(fn, (t, y), where, problem)
            except IndexError as error:  # y[0] of a scalar state: say whose state it is
                scalar = (
                    f" ({problem.experiment_names[0]}'s y0 is a scalar: give "
                    "y0=jnp.array([value]) for a state of one component)"
                    if shapes[0] == ()
                    else ""
                )
                raise ValueError(
                    f"{where} cannot read the state, of shape {shapes[0]}{scalar}: {error}"
                ) from None
            read |= names
            if shape is None or math.prod(shape) != 1:
                raise ValueError(
                    f"{where} returns {'several arrays' if shape is None else f'shape {shape}'}:"
                    " one number per measurement is expected (e.g. y[0], not y)"
                )
    for changes in problem.changes:
        for change in changes:
            for fn in change.states.values():
                if callable(fn):
                    read |= _inputs_read(fn, (y,), "a change", problem)[0]
    unread = [n for n in problem.names if n not in read]
    networks = [n for n in unread if _holds_arrays(getattr(problem.model, n, None))]
    if networks:
        raise ValueError(
            f"unknowns {networks} name networks of {type(problem.model).__name__}: an unknown "
            "is one number; train a network with ds.train(problem, "
            f"{networks[0]!r}) (docs/howto/hybrid-models.md)"
        )
    if unread:
        # a warning, not an error: one set of unknowns may serve studies of some experiments
        warn(
            f"unknowns {unread} are estimated but read by nothing: not a parameter of "
            f"{type(problem.model).__name__} ({', '.join(problem.model_parameters) or 'none'}), "
            "not named by a σ, an experiment's settings or data columns, and no observable, σ or "
            "initial-state function reads them (a typo in the name?): their values do not "
            "change the likelihood, and a fit leaves them where they start"
        )
    overridden = _overridden_everywhere(problem)
    if overridden:
        warn(
            f"unknowns {overridden} are estimated, but every experiment's set gives them "
            "other values: their own values are never used, so they do not change the "
            "likelihood and a fit leaves them where they start. Estimate what the experiments "
            "set them to (set={'k': 'k_treated'} with 'k_treated' an unknown), or leave them "
            "out of the unknowns"
        )
    _check_fixed_sigmas(problem)


def _overridden_everywhere(problem: Problem) -> list:
    """The estimated parameters whose own value nothing uses: every experiment's `set` gives
    them another value, and no setting, change or data cell names them as its value."""
    named = _named_as_values(problem)
    for rows in problem.rows:
        for cells in rows.overrides.values():
            named |= {cell for cell in cells if isinstance(cell, str)}
    return [
        name
        for name in problem.names
        if name not in named
        and all(isinstance(e.set, Mapping) and name in e.set for e in problem.experiments)
    ]


def _holds_arrays(value) -> bool:
    """A module holding arrays (a network), not one array or number."""
    return (
        value is not None
        and not eqx.is_array(value)
        and bool(jax.tree.leaves(eqx.filter(value, eqx.is_array)))
    )


def _check_fixed_sigmas(problem: Problem) -> None:
    """A σ named by an observable and fixed (not estimated) at a value ≤ 0, by default or by
    an experiment's settings or data column, has no likelihood."""
    base = _base_values(problem)
    for o, (name, observable) in enumerate(problem.observables.items()):
        sigma = observable.sigma
        if not isinstance(sigma, str):
            continue
        places = []
        for experiment, label, rows in zip(
            problem.experiments, problem.experiment_names, problem.rows
        ):
            # each measurement's σ: its data column's cell, else the experiment's setting,
            # else the value (an estimated unknown's moves with the fit: not checked)
            settings = experiment.set or {}
            default = settings.get(sigma, None if sigma in problem.names else base[sigma])
            cells = rows.overrides.get(sigma, np.full(len(rows.time), np.nan, object))
            for cell in np.asarray(cells, object)[rows.observable == o]:
                given = isinstance(cell, str) or not (cell is None or np.isnan(float(cell)))
                value = cell if given else default
                if value is not None and not isinstance(value, str) and not float(value) > 0:
                    where = "data column" if given else "σ"
                    places.append(f"{label}'s {where} {float(value):g}")
                    break
        if places:
            raise ValueError(
                f"observables[{name!r}].sigma is {sigma!r}, fixed at a value that is not "
                f"positive ({', '.join(places)}): a noise level must be > 0"
            )


def _named_by_experiments(problem: Problem) -> set:
    """The names an experiment's settings, pre-equilibration or changes set or set things to."""
    referenced = _named_as_values(problem)
    for experiment in problem.experiments:
        for settings in (experiment.set or {}, experiment.pre_equilibrate):
            if isinstance(settings, Mapping):
                referenced |= set(settings)
    for changes in problem.changes:
        for change in changes:
            referenced |= set(change.parameters)
    return referenced


def _named_as_values(problem: Problem) -> set:
    """The names an experiment's settings, pre-equilibration or changes set things to."""
    named = set()
    for experiment in problem.experiments:
        for settings in (experiment.set or {}, experiment.pre_equilibrate):
            if isinstance(settings, Mapping):
                named |= {v for v in settings.values() if isinstance(v, str)}
    for changes in problem.changes:
        for change in changes:
            values = (*change.parameters.values(), *change.states.values())
            named |= {v for v in values if isinstance(v, str)}
    return named


def _set_by_experiments(problem: Problem) -> set:
    """The parameters an experiment (or its pre-equilibration) sets, the unknowns it sets
    them to, and those its initial-state function or a change's function reads: none can be
    a pure σ or scaling (they reach the model's states)."""
    referenced = _named_by_experiments(problem)
    base = _base_values(problem)
    y = jnp.zeros(_state_size(problem, base))
    functions = [
        (lambda p, fn=fn: fn(y, p))
        for changes in problem.changes
        for c in changes
        for fn in c.states.values()
        if callable(fn)
    ]
    functions += [e.y0 for e in problem.experiments if callable(e.y0)]
    from .._model import inputs_reaching_output

    names = list(problem.names)
    values = tuple(base[n] for n in names)
    for fn in functions:
        reaching = inputs_reaching_output(
            lambda *v, fn=fn: fn({**base, **dict(zip(names, v))}), values
        )
        referenced.update(n for n, read in zip(names, reaching) if read)
    return referenced


def _noise_unknowns(
    problem: Problem, rows: ParameterTable, row_observable, referenced: set
) -> tuple:
    """The estimated unknowns that are nothing but the σ of normal, log-normal or
    log10-normal measurements: not a model parameter, not a setting of an experiment, not read
    by any observable's function or σ function, and wherever a measurement takes its value
    (itself, or a measurement's override of a placeholder such as PEtab's
    `noiseParameter1_<observable>`), that parameter is the σ of the measurement's observable;
    and without a prior.
    Given the predictions, the likelihood is then maximal at σ² = the mean squared difference
    of its measurements, in closed form (hierarchical optimisation, Loos et al.,
    *Bioinformatics* 34 (2018))."""
    observables = list(problem.observables.values())
    base = _base_values(problem)
    y = jnp.zeros(_state_size(problem, base))
    names = problem.parameter_names

    def reads(fn, name):
        return _reads(fn, name, base, y)

    read = {}

    def read_by_a_function(name):
        if name not in read:
            read[name] = any(
                reads(o.fn, name) or (callable(o.sigma) and reads(o.sigma, name))
                for o in observables
            )
        return read[name]

    sigma_of_row = np.asarray(
        [o.sigma if isinstance(o.sigma, str) else None for o in observables], dtype=object
    )[row_observable]
    laplace_row = np.asarray([o.laplace for o in observables], dtype=bool)[row_observable]
    found = []
    for k, name in enumerate(problem.names):
        if name in problem.model_parameters or name in referenced or read_by_a_function(name):
            continue
        if not _flat_within_bounds(problem.unknowns[name]):  # the closed form ignores it
            continue
        taken = (rows.kind == ESTIMATED) & (rows.index == k)  # (measurements, parameters)
        columns = np.flatnonzero(taken.any(axis=0))
        if not len(columns):
            continue
        mask = np.zeros(len(row_observable), dtype=bool)
        for column in columns:
            # a measurement reads the column only as its σ: no function reads it
            if names[column] in problem.model_parameters or read_by_a_function(names[column]):
                break
            where = taken[:, column] & (sigma_of_row == names[column])
            if np.any(laplace_row[where]):
                break
            mask |= where
        else:
            if mask.any():
                found.append((k, mask))
    return tuple(found)


def _flat_within_bounds(unknown: Unknown) -> bool:
    """Whether the unknown's prior is constant within its bounds (none, or a uniform over
    them or wider: PEtab v2's implicit prior), so that a closed-form optimum holds."""
    prior = unknown.prior
    if prior is None:
        return True
    low, high = getattr(prior, "low", None), getattr(prior, "high", None)
    return (
        type(prior).__name__ == "Uniform"
        and not unknown.prior_on_scale
        and float(low) <= unknown.bounds[0]
        and float(high) >= unknown.bounds[1]
    )


def _reads(fn, name: str, base: dict, y) -> bool:
    """Whether an observable's (or σ's) `fn(t, y, p)` depends on `p[name]` at state `y`
    (traced to a jaxpr, nothing computed)."""
    from .._model import output_depends_on

    t = jnp.zeros(())
    return output_depends_on(lambda v: fn(t, y, {**base, name: v}), (base[name],), 0)


def _scaling_unknowns(
    problem: Problem, rows: ParameterTable, row_observable, referenced: set
) -> tuple:
    """The estimated unknowns that are nothing but a factor of the predictions of normal
    (linear-scale) measurements: not a model parameter, not a setting of an experiment, no
    measurement's σ nor read by a σ function, and every observable that reads it (itself, or a
    placeholder such as PEtab's `observableParameter1_<observable>` that a measurement sets to
    it) is linear and homogeneous in it, y = s·h; and without a prior. Given h and σ the
    likelihood is then maximal at the weighted least-squares s = Σ h m/σ² / Σ h²/σ²
    (hierarchical optimisation of scaling factors, Loos et al., *Bioinformatics* 34 (2018)).
    Linearity is tested by evaluating the function at several states and values (a function
    linear at all of them is taken as linear)."""
    observables = list(problem.observables.values())
    base = _base_values(problem)
    probe = np.random.default_rng(0).uniform(0.5, 2.0, (3, _state_size(problem, base)))
    # the parameters whose values can differ from their base values: estimated, or set by an
    # experiment, a change or a data column (a fixed offset of 0 stays 0)
    movable = set(problem.names) | referenced
    for measured in problem.rows:
        movable |= set(measured.overrides)
    y = jnp.asarray(probe[0])
    sigma_names = {o.sigma for o in observables if isinstance(o.sigma, str)}

    def only_scales(name) -> bool:
        """Neither the model, a σ nor an experiment's setting reads `name`."""
        return (
            name not in problem.model_parameters
            and name not in sigma_names
            and not any(callable(o.sigma) and _reads(o.sigma, name, base, y) for o in observables)
        )

    def linear_in(fn, name) -> bool:
        """fn(s) = s·fn(1) at every probe state, for s in 0, 0.5, 3, -2: at the other
        parameters' base values, then at values moved away from them (v·u + w): an offset
        that is 0 by default but set by an experiment or estimated (y = s·h + off) makes
        fn inhomogeneous in s where it is not 0. Only the parameters that can move are moved
        (`movable`): a fixed offset of 0 leaves a pure scaling."""
        # round-off of the working precision, not a tolerance on linearity
        rtol = working_round_off()
        rng = np.random.default_rng(1)
        others = [
            base,
            *(
                {
                    n: v * rng.uniform(0.5, 2.0) + rng.uniform(0.1, 1.0) if n in movable else v
                    for n, v in base.items()
                }
                for _ in range(len(probe) - 1)
            ),
        ]
        # and at other times (an offset d·t is no scaling either)
        for t, state, values in zip((0.0, 0.7, 2.3), probe, others):

            def at(value, state=jnp.asarray(state), values=values, t=jnp.asarray(t)):
                value = jnp.asarray(value, jnp.result_type(float))
                return float(fn(t, state, {**values, name: value}))

            one = at(1.0)
            if not np.isfinite(one):
                return False
            for value in (0.0, 0.5, 3.0, -2.0):
                if not np.isclose(at(value), value * one, rtol=rtol, atol=rtol * 1e-3 * abs(one)):
                    return False
        return True

    def scaled_rows(k):
        """The rows that θ[k] scales, or None where it does more than scale."""
        taken = (rows.kind == ESTIMATED) & (rows.index == k)  # (measurements, parameters)
        mask = np.zeros(len(row_observable), dtype=bool)
        for column in np.flatnonzero(taken.any(axis=0)):
            column_name = problem.parameter_names[column]
            if not only_scales(column_name):
                return None
            for j, observable in enumerate(observables):
                where = taken[:, column] & (row_observable == j)
                if not where.any() or not _reads(observable.fn, column_name, base, y):
                    continue
                if observable.noise != "normal" or not linear_in(observable.fn, column_name):
                    return None
                mask |= where
        return mask

    found = []
    for k, name in enumerate(problem.names):
        # a prior that is not flat: the closed form would ignore it
        if name in referenced or not _flat_within_bounds(problem.unknowns[name]):
            continue
        if not only_scales(name):
            continue
        mask = scaled_rows(k)
        if mask is not None and mask.any():
            found.append((k, mask))
    return tuple(found)


def state_shape(problem: Problem, base: dict | None = None) -> tuple[int, ...]:
    """The shape of the model's state: the first experiment's y0 (a function of the
    parameters evaluated abstractly, at `base`, default their base values)."""
    experiment = problem.experiments[0]
    if callable(experiment.y0):
        base = _base_values(problem) if base is None else base
        return tuple(jax.eval_shape(experiment.y0, base).shape)
    return np.shape(np.asarray(experiment.y0))


def vector_state_size(problem: Problem, caller: str, why: str) -> int:
    """The length of the model's state, which `caller` needs to be a vector (`why`: a
    parenthesised reason for the error, or "")."""
    shape = state_shape(problem)
    if len(shape) != 1:
        raise ValueError(
            f"{caller}: the model's state must be a vector{why}, got a state of shape {shape}"
        )
    return int(shape[0])


def _state_size(problem: Problem, base: dict) -> int:
    return int(np.prod(state_shape(problem, base)))


def _groups(problem, per_experiment, per_pre, offsets, per_segment, resolve) -> tuple[Group, ...]:
    """Experiments that share the kind of their initial state (an array, or the same
    function), of their pre-equilibration and of their changes run as one vmapped batch."""
    keys = {}
    for e, experiment in enumerate(problem.experiments):
        y0 = experiment.y0
        if callable(y0):
            kind = ("function", id(y0))
        else:
            kind = ("array",)
        changes = signature(problem.changes[e])
        keys.setdefault((kind, per_pre[e] is not None, changes), []).append(e)
    groups = []
    for (kind, pre, changes), members in keys.items():
        if changes[0]:
            groups.append(_changing_group(problem, members, per_pre, offsets, per_segment, resolve))
            continue
        members = tuple(members)
        table = ParameterTable(
            *(np.stack([per_experiment[e][i] for e in members]) for i in range(3))
        )
        pre_table = None
        if pre:
            pre_table = ParameterTable(
                *(np.stack([per_pre[e][i] for e in members]) for i in range(3))
            )
        y0s, y0_fn = None, None
        if kind[0] == "function":
            y0_fn = problem.experiments[members[0]].y0
        else:
            y0s = np.stack([_y0_array(problem, e) for e in members])
        reset = None
        if pre:
            size = _state_size(problem, _base_values(problem))
            reset = np.stack([_reset_mask(problem, e, size) for e in members])
        grids = [_grid(problem.experiments[e].t0, problem.rows[e].time) for e in members]
        # at least t0 and one later time, which a solve needs (an experiment measured only
        # at its start, e.g. at a pre-equilibrated rest, reads nothing after it)
        width = max(2, max(len(g) for g in grids))
        ts = np.stack([_padded(g, width) for g in grids])
        row_member, row_time, row_ids = [], [], []
        for m, e in enumerate(members):
            grid = grids[m]
            times = problem.rows[e].time
            row_member.append(np.full(len(times), m, np.int32))
            row_time.append(np.searchsorted(grid, working_precision(times)).astype(np.int32))
            row_ids.append(np.arange(offsets[e], offsets[e + 1]))
        groups.append(
            Group(
                members=members,
                settings=table,
                pre=pre_table,
                reset=reset,
                y0=y0s,
                y0_fn=y0_fn,
                ts=ts,
                row_member=np.concatenate(row_member),
                row_time=np.concatenate(row_time),
                rows=np.concatenate(row_ids),
            )
        )
    return tuple(groups)


def _changing_group(problem, members, per_pre, offsets, per_segment, resolve) -> "Group":
    """A batch of experiments with changes at given times (`study_changes`): its settings
    and output times per segment; a measurement's time index counts through the segments'
    padded times in turn."""
    members = tuple(members)
    size = _state_size(problem, _base_values(problem))

    def stacked(per_member):
        return ParameterTable(*(np.stack([m[i] for m in per_member]) for i in range(3)))

    first = members[0]
    function_y0 = callable(problem.experiments[first].y0)
    pre = per_pre[first] is not None
    grids = [
        segment_grids(problem.experiments[e].t0, problem.changes[e], problem.rows[e].time)
        for e in members
    ]
    width = max(2, max(len(g) for member in grids for g in member))
    assignments = [
        state_assignments(
            problem.changes[e], size, lambda value, j, e=e: resolve(value, per_segment[e][j - 1])
        )
        for e in members
    ]
    row_member, row_time, row_ids = [], [], []
    for m, e in enumerate(members):
        times = problem.rows[e].time
        segment = segment_of(problem.changes[e], times)
        position = np.asarray(
            [np.searchsorted(grids[m][j], t) for j, t in zip(segment, working_precision(times))],
            np.int32,
        )
        row_member.append(np.full(len(times), m, np.int32))
        row_time.append((segment * width + position).astype(np.int32))
        row_ids.append(np.arange(offsets[e], offsets[e + 1]))
    tables = SegmentTables(
        settings=ParameterTable(
            *(
                np.stack([np.stack([s[i] for s in per_segment[e]]) for e in members])
                for i in range(3)
            )
        ),
        assigned=np.stack([a[0] for a in assignments]),
        values=ParameterTable(*(np.stack([a[1][i] for a in assignments]) for i in range(3))),
        functions=functions_of(problem.changes[first]),
        ts=np.stack([np.stack([_padded(g, width) for g in member]) for member in grids]),
        end=np.asarray([[len(g) - 1 for g in member] for member in grids], np.int32),
    )
    return Group(
        members=members,
        settings=stacked([per_segment[e][0] for e in members]),
        pre=stacked([per_pre[e] for e in members]) if pre else None,
        reset=(np.stack([_reset_mask(problem, e, size) for e in members]) if pre else None),
        y0=None if function_y0 else np.stack([_y0_array(problem, e) for e in members]),
        y0_fn=problem.experiments[first].y0 if function_y0 else None,
        ts=tables.ts[:, 0],
        row_member=np.concatenate(row_member),
        row_time=np.concatenate(row_time),
        rows=np.concatenate(row_ids),
        segments=tables,
    )


def _reset_mask(problem, e, size: int) -> np.ndarray:
    """bool (n,): the states experiment `e` starts anew after its pre-equilibration."""
    experiment = problem.experiments[e]
    label = problem.experiment_names[e]
    names = getattr(problem.model, "state_names", None) or ()
    mask = np.zeros(size, bool)
    for item in experiment.reinitialize:
        if isinstance(item, str):
            if item not in names:
                raise ValueError(
                    f"{label}: reinitialize names {item!r}, which is no state ({names})"
                )
            mask[names.index(item)] = True
        elif isinstance(item, (int, np.integer)) and 0 <= item < size:
            mask[int(item)] = True
        else:
            raise ValueError(f"{label}: reinitialize holds {item!r}: a state's name or index")
    return mask


def _base_values(problem) -> dict:
    base = {}
    for name in problem.parameter_names:
        if name in problem.unknowns:
            base[name] = jnp.asarray(problem.unknowns[name].value)
        else:
            base[name] = jnp.asarray(float(problem.model_parameters[name](problem.model)))
    return base


def _y0_array(problem, e) -> np.ndarray:
    experiment = problem.experiments[e]
    label = problem.experiment_names[e]
    try:
        y0 = np.asarray(experiment.y0, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(
            f"{label}: y0 must be an array or a function of the parameters p -> y0, got "
            f"{experiment.y0!r}"
        ) from None
    if y0.ndim != 1 or not np.all(np.isfinite(y0)):
        raise ValueError(f"{label}: y0 must be a finite 1-D array, got {y0!r}")
    return y0


def _grid(t0, times) -> np.ndarray:
    """The output times of one experiment: t0, then its distinct measurement times (distinct
    in the precision the solves run in)."""
    return np.unique(working_precision(np.concatenate([[float(t0)], np.asarray(times)])))


def _padded(grid: np.ndarray, width: int) -> np.ndarray:
    """`grid` extended to `width` strictly increasing times just past its end (their states
    are not read: a batch needs one shape, and the step to them is negligible)."""
    extra = width - len(grid)
    if extra == 0:
        return grid
    end = grid[-1]
    # 1e-9 relative, but at least a few units of the last place of the working precision
    # (float32: times 1e-9 apart are one time, and a solve to them fails)
    step = working_round_off() * max(1.0, abs(end))
    return np.concatenate([grid, end + step * np.arange(1, extra + 1)])
