"""The setup of `ds.fit`: every argument checked, in the order the errors are raised, and the
problem, optimiser and data the fit runs assembled from them (`FitSpec` → `FitSetup`)."""

import dataclasses
import inspect
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._events import as_events, Event
from .._integrate.simulate import check_state_shape
from .._model import AbstractODE, check_model
from .._paths import floating_names, get, path_of
from .._solver.adaptive import Tsit5, warn_unresolved_tolerance, working_tolerances
from .._solver.base import AbstractSolver, check_solver
from .._validate import (
    as_state,
    as_state_leaf,
    check_key,
    check_positive_number,
    check_real,
    check_static_count,
    is_count,
    probe_indices,
)
from . import optimize as opt
from .data import as_data, Data
from .problem import (
    kind_of,
    Layout,
    parameter_bounds,
    Problem,
)

LOSSES = ("squared", "log")


@dataclasses.dataclass(frozen=True, eq=False)
class FitSpec:
    """The arguments of one `ds.fit` call as given (each documented there); `assemble` checks
    them and builds what the fit runs."""

    model: AbstractODE
    y0: Any
    data: Any
    params: Any
    initial_state: Any
    observe: Callable | None
    solver: AbstractSolver | None
    dt: float | None
    method: Any
    loss: str
    segments: int
    starts: Any  # a count, or an array (starts, unknowns) of natural guesses
    screen: int  # points whose loss chooses the starts (0 or 1: the guess alone)
    horizon: int
    bounds: dict | None
    noise: Any
    weights: Any
    t0: float | None
    key: Any
    max_iterations: int | None
    rtol: float | None
    atol: float | None
    continuity_weight: float
    level: float
    max_steps: int
    events: Any
    pre_equilibrate: Any = False


@dataclasses.dataclass(frozen=True, eq=False)
class FitSetup:
    """A checked `ds.fit` call, assembled: what its stages run and its result reports."""

    problem: Problem  # single shooting over all the data (its Jacobian mode settled)
    optimizer: opt.Optimizer  # method, iteration budget, tolerances, Jacobian mode
    guess: jax.Array  # (unknowns,) the natural initial guess, in the state's dtype
    data: Data  # the data, with the noise / weights of the call
    t0: float  # the time of y0
    method: str  # the method's name as reported ("optax" for a transformation)
    level: float  # the confidence level of the intervals
    base_scale: np.ndarray  # (times, observables) 1/noise or sqrt(weight), missing values
    # not yet masked: what refits of new data (with their own missing values) start from
    num_observed: int  # values that count: not missing and of weight > 0
    noise_known: bool  # the noise was given, so s² = 1 rather than estimated
    starts: np.ndarray | None = None  # (starts, unknowns) natural guesses given as `starts`


class _Unknowns(NamedTuple):
    """The fitted unknowns in their flat order, with their guesses and bounds."""

    layout: Layout
    guess: np.ndarray  # (unknowns,) float64 natural initial guesses
    lower: np.ndarray  # (unknowns,) natural lower bounds, -inf where open
    upper: np.ndarray  # (unknowns,) natural upper bounds, inf where open


class _Observations(NamedTuple):
    """The data as the residuals see them."""

    ts: tuple[float, ...]  # simulation times: t0, then the data times (t0 once if it is one)
    first_observed: int  # index in ts of the first data time
    t0: float  # the time of y0: as given, else the first data time
    values: np.ndarray  # (times, observables), NaN where missing
    scale: np.ndarray  # (times, observables) 1/noise or sqrt(weight), 0 where missing
    base_scale: np.ndarray  # the same before the missing values are masked


def assemble(spec: FitSpec) -> FitSetup:
    """Check every argument of a `ds.fit` call and assemble its problem and optimiser."""
    _check_arguments(spec)
    data = as_data(spec.data, spec.noise, spec.weights)
    y0 = _checked_y0(spec.y0)
    dtype = y0.dtype
    solver = spec.solver
    if solver is None:  # Tsit5(rtol=1e-8, atol=1e-8), loosened to what the state's type resolves
        solver = Tsit5(*working_tolerances(1e-8, 1e-8, dtype))
    else:  # as `ds.simulate` warns (of adaptive solvers); the fit's solves are traced once
        warn_unresolved_tolerance(solver, dtype)
    unknowns = _unknowns(spec, y0)
    observed = _observations(spec, data, y0)
    check_positive_number("dt", spec.dt)
    if solver.needs_dt and spec.dt is None:
        raise ValueError(
            f"{type(solver).__name__} is a fixed-step solver: pass dt, the longest step (an "
            "interval between data times that it does not divide takes equal, shorter steps)"
        )
    missing = np.isnan(observed.values)
    problem = Problem(
        model=spec.model,
        y0=jnp.asarray(np.asarray(y0).ravel(), dtype),
        # finite placeholders where a side is open, so that no inf meets a derivative
        lower=jnp.asarray(np.where(np.isfinite(unknowns.lower), unknowns.lower, 0.0), dtype),
        upper=jnp.asarray(np.where(np.isfinite(unknowns.upper), unknowns.upper, 1.0), dtype),
        values=jnp.asarray(np.where(missing, 1.0, observed.values), dtype),
        scale=jnp.asarray(observed.scale, dtype),
        continuity=jnp.asarray(np.zeros(y0.size), dtype),
        solver=solver,
        layout=unknowns.layout,
        ts=observed.ts,
        first_observed=observed.first_observed,
        y0_shape=tuple(y0.shape),
        observe=spec.observe,
        log_loss=spec.loss == "log",
        dt=None if spec.dt is None else float(spec.dt),  # static: a NumPy scalar would warn
        max_steps=int(spec.max_steps),
        events=_checked_events(spec.events, spec.model),
        windows=((0, len(observed.ts) - 1),),
        batched=False,
        steps_per_save=None,
        pre_equilibrate=_checked_pre_equilibrate(spec.pre_equilibrate),
    )
    single = dtype == jnp.float32
    rtol = (1e-5 if single else 1e-8) if spec.rtol is None else spec.rtol
    atol = (1e-7 if single else 1e-10) if spec.atol is None else spec.atol
    optimizer = with_jacobian(_optimizer(spec.method, spec.max_iterations, rtol, atol), problem)
    forward_only = not optimizer.is_optax and optimizer.method != "bfgs" and optimizer.jac == "fwd"
    return FitSetup(
        problem=dataclasses.replace(problem, forward_only=forward_only),
        optimizer=optimizer,
        guess=jnp.asarray(unknowns.guess, dtype),
        data=data,
        t0=observed.t0,
        method=spec.method if isinstance(spec.method, str) else "optax",
        level=spec.level,
        base_scale=observed.base_scale,
        # zero weights count as missing: neither residuals nor degrees of freedom
        num_observed=int(np.sum(observed.scale > 0)),
        noise_known=data.noise is not None,
        starts=_given_starts(spec.starts, unknowns),
    )


def _check_arguments(spec: FitSpec) -> None:
    """The scalar options and the model and solver types (the default solver, chosen by the
    state's type, is `assemble`'s)."""
    if spec.key is not None:
        check_key("key", spec.key)
    check_model("model", spec.model)
    if spec.solver is not None:
        check_solver("solver", spec.solver)
    if spec.loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {spec.loss!r}")
    check_static_count("segments", spec.segments)
    if is_count(spec.starts) or isinstance(spec.starts, (bool, np.bool_)):
        check_static_count("starts", spec.starts)
    check_static_count("max_steps", spec.max_steps)
    check_static_count("horizon", spec.horizon)
    check_static_count("screen", spec.screen, minimum=0, maximum=100_000)
    if not 0 < check_real("level", spec.level) < 1:
        raise ValueError(f"level must be in (0, 1), got {spec.level}")
    check_real("continuity_weight", spec.continuity_weight, positive=True)
    for name, value in (("rtol", spec.rtol), ("atol", spec.atol)):
        if value is not None:
            check_real(name, value, nonnegative=True)
    if spec.rtol is not None and spec.atol is not None and spec.rtol == 0 and spec.atol == 0:
        raise ValueError("rtol and atol cannot both be 0: the fit could never converge")
    if spec.t0 is not None:
        check_real("t0", spec.t0)


def _checked_y0(y0) -> jax.Array:
    """The initial state as one finite real array of float32 or float64."""
    y0 = as_state(y0)
    if isinstance(y0, (tuple, dict)) or isinstance(y0, eqx.Module):
        raise TypeError(
            f"ds.fit takes the initial state as one array, got a {type(y0).__name__}; stack "
            "its components (jnp.concatenate or ds.join_pair for (q, v))"
        )
    y0 = jnp.asarray(as_state_leaf(y0))
    if jnp.issubdtype(y0.dtype, jnp.complexfloating):
        raise TypeError("y0 is complex: ds.fit fits real states and parameters")
    if y0.dtype == jnp.float16 or y0.dtype == jnp.bfloat16:
        raise TypeError(
            f"y0 is {y0.dtype}: ds.fit computes covariances, which need float32 or float64"
        )
    if not np.all(np.isfinite(np.asarray(y0))):
        raise ValueError("y0 holds NaN or inf; give a finite initial state (or guess)")
    return y0


def _unknowns(spec: FitSpec, y0) -> _Unknowns:
    """The fitted parameter entries, then the fitted initial-state components, each with its
    guess, bounds and transform."""
    model = spec.model
    flat_y0 = np.asarray(y0).ravel()
    state_labels = _state_labels(model, y0)
    fields, guesses, names, kinds, lows, highs = [], [], [], [], [], []
    bounds = _checked_bounds(spec.bounds)
    selected, bounds_from_params = _select_params(model, spec.params)
    bounds.update(bounds_from_params)
    y0_indices = _select_state(spec.initial_state, state_labels)
    known = set(selected) | {f"y0[{state_labels[i]}]" for i in y0_indices}
    unknown_bounds = sorted(set(bounds) - known)
    if unknown_bounds:
        raise ValueError(
            f"bounds for {unknown_bounds}, which are not fitted; fitted: {sorted(known)}"
        )
    for name in selected:
        value = np.asarray(get(model, path_of(model, name)), dtype=np.float64)
        low, high = parameter_bounds(model, name, bounds)
        fields.append((name, tuple(value.shape)))
        for index, entry in np.ndenumerate(value):
            label = name if value.ndim == 0 else f"{name}[{','.join(map(str, index))}]"
            names.append(label)
            guesses.append(entry)
            lows.append(low)
            highs.append(high)
    positive = _positive_state(spec)
    for i in y0_indices:
        label = f"y0[{state_labels[i]}]"
        default = (0.0, None) if positive and flat_y0[i] > 0 else (None, None)
        low, high = bounds.get(label, default)
        names.append(label)
        guesses.append(float(flat_y0[i]))
        lows.append(-np.inf if low is None else float(low))
        highs.append(np.inf if high is None else float(high))
    if not names:
        raise ValueError("nothing to fit: name parameters in params= and/or set initial_state")
    for name, guess, low, high in zip(names, guesses, lows, highs):
        if not low < high:
            raise ValueError(f"bounds of {name}: lower {low} must be below upper {high}")
        if not low < guess < high:
            raise ValueError(
                f"the initial guess {name}={guess:g} is not strictly inside its bounds "
                f"({low:g}, {high:g}); start from a value inside them"
            )
        kinds.append(kind_of(low, high))
    return _Unknowns(
        layout=Layout(tuple(names), tuple(fields), tuple(y0_indices), tuple(kinds)),
        guess=np.asarray(guesses, dtype=np.float64),
        lower=np.asarray(lows, dtype=np.float64),
        upper=np.asarray(highs, dtype=np.float64),
    )


def _given_starts(starts, unknowns: _Unknowns) -> np.ndarray | None:
    """`starts` given as guesses: a finite array (starts, unknowns) inside the bounds."""
    if is_count(starts):
        return None
    names = unknowns.layout.names
    try:
        given = np.asarray(starts, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise TypeError(
            "starts must be a count or an array (starts, unknowns) of guesses, got "
            f"{type(starts).__name__}"
        ) from error
    if given.ndim != 2 or given.shape[1] != len(names) or given.shape[0] < 1:
        raise ValueError(
            f"starts as guesses must have shape (starts, {len(names)}): one row per start, one "
            f"column per unknown in the order {list(names)}; got shape {given.shape}"
        )
    if not np.all(np.isfinite(given)):
        raise ValueError("starts holds NaN or inf; give finite guesses")
    inside = (given > unknowns.lower) & (given < unknowns.upper)
    if not np.all(inside):
        row, column = np.argwhere(~inside)[0]
        raise ValueError(
            f"starts[{row}] puts {names[column]} = {given[row, column]:g} outside its bounds "
            f"({unknowns.lower[column]:g}, {unknowns.upper[column]:g})"
        )
    return given


def _positive_state(spec: FitSpec) -> bool:
    """Whether fitted initial-state components are positive unless bounded otherwise: the model
    declares its state positive, or `loss="log"` compares the state itself (no `observe`) with
    positive data, so a state that is not positive cannot be fitted. Those components are then
    fitted in log space, as their rates are: a neutral guess several-fold off no longer lets a
    step cross zero, and the trust region is relative."""
    return bool(spec.model.positive_state) or (spec.loss == "log" and spec.observe is None)


def _observations(spec: FitSpec, data: Data, y0) -> _Observations:
    """The simulation times and the data values with their scales, checked against the model's
    observables and the loss."""
    t0 = float(data.ts[0]) if spec.t0 is None else spec.t0
    if not np.isfinite(t0) or t0 > data.ts[0]:
        raise ValueError(f"t0={t0} must be finite and not after the first data time {data.ts[0]:g}")
    first = 0 if t0 == data.ts[0] else 1
    ts = tuple(float(t) for t in ([t0] * first + list(data.ts)))
    if len(ts) < 2:
        raise ValueError(
            "one data time and t0 at that time leave nothing to simulate: pass t0 (the time "
            "of y0) before the observation"
        )
    values = data.values.reshape(len(data.ts), -1)
    _check_observe(spec.model, y0, spec.observe, values.shape[1], data)
    missing = np.isnan(values)
    if spec.loss == "log" and np.any(values[~missing] <= 0):
        raise ValueError("loss='log' needs positive data, but some observed values are <= 0")
    if data.noise is not None:
        base_scale = 1.0 / data.noise.reshape(values.shape)
    elif data.weights is not None:
        base_scale = np.sqrt(data.weights.reshape(values.shape))
    else:
        base_scale = np.ones_like(values)
    scale = np.where(missing, 0.0, base_scale)
    _check_magnitude(values, scale, missing, y0.dtype, spec.loss)
    return _Observations(ts, first, t0, values, scale, base_scale)


def _checked_events(events, model):
    """`events` (or `events(model)`) checked: ds.Event(s) without terminal ones."""
    if events is None:
        return None
    resolved = events
    if callable(events) and not isinstance(events, Event):
        try:
            takes_one = len(inspect.signature(events).parameters) == 1
        except (TypeError, ValueError):
            takes_one = True
        if not takes_one:
            raise TypeError(
                "ds.fit: events as a function must map the model to its events "
                "(events=lambda m: m.impacts()); for a condition (t, y) -> value, pass "
                "events=ds.Event(condition, ...)"
            )
        resolved = events(model)
        if resolved is None:
            raise TypeError(
                "ds.fit: the events function returned None; it must return a ds.Event or a "
                "tuple of them"
            )
    for event in as_events(resolved):
        if event.terminal:
            raise ValueError(
                "ds.fit: a terminal event stops the trajectory, leaving later data unexplained; "
                "fit with events that reset (terminal=False) or end the data at the event"
            )
    return events


def _checked_bounds(bounds) -> dict:
    """`bounds` as a dict name -> (lower, upper), each side a real number or None."""
    if bounds is None:
        return {}
    if not isinstance(bounds, dict):
        raise TypeError(
            f"bounds must be a dict name -> (lower, upper), got {type(bounds).__name__}"
        )
    checked = {}
    for name, spec in bounds.items():
        if not (isinstance(spec, (tuple, list)) and len(spec) == 2):
            raise ValueError(
                f"bounds[{name!r}] must be (lower, upper), with None for an open side; got {spec!r}"
            )
        for side, value in zip(("lower", "upper"), spec):
            if value is not None:
                check_real(f"bounds[{name!r}] {side}", value, finite=False)
                if np.isnan(value):
                    raise ValueError(f"bounds[{name!r}] {side} is NaN; use None for no bound")
        checked[name] = tuple(spec)
    return checked


def _check_magnitude(values, scale, missing, dtype, loss) -> None:
    """The scaled data must leave room for their squares summed in `dtype` (else the loss is
    inf at every guess, which would read as a model that cannot be simulated)."""
    if loss == "log":
        return
    largest = float(np.max(np.abs(np.where(missing, 0.0, values) * scale)))
    room = float(np.sqrt(np.finfo(dtype).max / values.size)) / 1e3
    if largest > room:
        raise ValueError(
            f"the data reach {largest:.3g} (in units of their noise, where given): their "
            f"squared residuals overflow {np.dtype(dtype).name}. Rescale the data (and the "
            "model) to units in which the values are of order one, or use loss='log' for "
            "positive data spanning many orders of magnitude"
        )


def _state_labels(model, y0) -> list[str]:
    names = model.state_names
    if names is not None and y0.ndim == 1 and len(names) == y0.shape[0]:
        return list(names)
    return [str(i) for i in range(y0.size)]


def _select_params(model, params) -> tuple[list[str], dict]:
    """The fitted parameters' names (`paths`: fields, entries of a `ds.ODE`'s params dict,
    fields of nested modules) and the bounds `params` gives them."""
    floating = floating_names(model)
    bounds = {}
    if callable(params) and not isinstance(params, type):
        names = [n for n in floating if params(n, get(model, path_of(model, n)))]
        if not names:
            raise ValueError(
                f"params= selected no parameter of {type(model).__name__} (its floating-point "
                f"parameters: {', '.join(floating) or 'none'})"
            )
    elif isinstance(params, str):
        names = [params]
    elif isinstance(params, dict):
        names = list(params)
        for name, spec in params.items():
            if spec is not None:
                if not (isinstance(spec, (tuple, list)) and len(spec) == 2):
                    raise ValueError(
                        f"params[{name!r}] must be (lower, upper) bounds or None, got {spec!r}"
                    )
                bounds[name] = tuple(spec)
    elif params is None:
        names = []
    elif isinstance(params, (list, tuple)) and all(isinstance(n, str) for n in params):
        names = list(params)
    else:
        raise TypeError(
            "params must be a parameter name, a list of names, a dict name -> (lower, upper) "
            f"or a function (name, value) -> bool; got {params!r}"
        )
    for name in names:
        path = path_of(model, name)
        if path is None:
            raise ValueError(
                f"{type(model).__name__} has no parameter {name!r}; its parameters are: "
                f"{', '.join(floating) or 'none'} (a nested module's field as "
                "'module.field', an entry of a params dict as 'k' or 'params.k')"
            )
        value = get(model, path)
        if value is None:
            raise ValueError(
                f"{type(model).__name__}.{name} is None (that term is switched off): build the "
                f"model with a guess for {name} to fit it"
            )
        if not (eqx.is_inexact_array(value) or isinstance(value, float)):
            arrays = jax.tree.leaves(eqx.filter(value, eqx.is_inexact_array))
            weights = sum(x.size for x in arrays)
            if isinstance(value, eqx.Module) and weights:  # a network inside the model
                raise ValueError(
                    f"{type(model).__name__}.{name} is a {type(value).__name__} with {weights} "
                    "weights: ds.fit estimates a model's few scalar parameters; train a "
                    f"network inside a model with ds.train(problem, networks={name!r}) (a "
                    "ds.Problem of the model and its data; docs/howto/hybrid-models.md)"
                )
            raise ValueError(
                f"{type(model).__name__}.{name} is not a floating-point parameter (it holds "
                f"{type(value).__name__}); its floating-point parameters: "
                f"{', '.join(floating) or 'none'}"
            )
    paths = [path_of(model, n) for n in names]
    if len(set(paths)) != len(paths):
        raise ValueError(f"params names a parameter twice: {names}")
    return names, bounds


def _select_state(initial_state, labels) -> list[int]:
    if isinstance(initial_state, (bool, np.bool_)):
        return list(range(len(labels))) if initial_state else []
    if initial_state is None:
        return []
    single = isinstance(initial_state, (str, int, np.integer))
    if not single and not isinstance(initial_state, (list, tuple, np.ndarray)):
        raise TypeError(
            "initial_state must be True, False or a list of state indices or names, got "
            f"{initial_state!r}"
        )
    items = [initial_state] if single else list(initial_state)
    indices = []
    for item in items:
        if isinstance(item, (bool, np.bool_)):
            raise TypeError(
                f"initial_state lists {item!r}: give the fitted components by index or name "
                f"(e.g. initial_state=[0] or ['{labels[0]}']), not as a mask"
            )
        if isinstance(item, str):
            if item not in labels:
                raise ValueError(f"initial_state names {item!r}; the state's names: {labels}")
            indices.append(labels.index(item))
        elif isinstance(item, (int, np.integer)) and 0 <= item < len(labels):
            indices.append(int(item))
        else:
            raise ValueError(
                f"initial_state entries are state indices 0..{len(labels) - 1} or names, "
                f"got {item!r}"
            )
    if len(set(indices)) != len(indices):
        raise ValueError(f"initial_state lists a component twice: {items}")
    return sorted(indices)


def _check_observe(model, y0, observe, num_observables, data) -> None:
    check_state_shape(model, y0)  # before `observe` is blamed for a wrong state
    if observe is None:
        if y0.size != num_observables:
            raise ValueError(
                f"the data have {num_observables} value(s) per time but the state has "
                f"{y0.size} components: pass observe=lambda y: ... to map a state to what was "
                f"measured (e.g. observe=lambda y: y[0])"
            )
        return
    if not callable(observe):
        raise TypeError(f"observe must be a function state -> observable, got {observe!r}")
    try:
        out = jax.eval_shape(lambda y: jnp.asarray(observe(y)), y0)
    except Exception as error:
        raise ValueError(f"observe failed on a state of shape {y0.shape}: {error}") from error
    probe_indices("observe", observe, y0)
    if not jnp.issubdtype(out.dtype, jnp.inexact):
        raise TypeError(f"observe must return floats (what was measured), got {out.dtype}")
    size = math.prod(out.shape)
    if size != num_observables:
        raise ValueError(
            f"observe returns {size} value(s) per state (shape {out.shape}) but the data have "
            f"{num_observables} per time (values of shape {data.values.shape})"
        )


def _optimizer(method, max_iterations, rtol, atol) -> opt.Optimizer:
    is_optax = hasattr(method, "init") and hasattr(method, "update")
    if not is_optax and method not in opt.METHODS:
        raise ValueError(
            f"method must be one of {opt.METHODS} or an optax GradientTransformation (e.g. "
            f"optax.adam(1e-2)), got {method!r}"
        )
    if max_iterations is None:
        max_iterations = 2000 if is_optax else 256
    check_static_count("max_iterations", max_iterations)
    return opt.Optimizer(method, int(max_iterations), float(rtol), float(atol))


def with_jacobian(optimizer: opt.Optimizer, problem: Problem) -> opt.Optimizer:
    """Forward mode for the residual Jacobian when the unknowns are no more than the residuals
    (one tangent pass per unknown), reverse mode otherwise."""
    residuals = problem.values.size + (len(problem.windows) - 1) * problem.y0.size
    jac = "fwd" if problem.layout.size <= residuals else "bwd"
    return dataclasses.replace(optimizer, jac=jac)


def _checked_pre_equilibrate(value):
    """`pre_equilibrate`: False, True, or a function model -> the model to equilibrate."""
    if isinstance(value, bool) or (callable(value) and not isinstance(value, type)):
        return value
    raise TypeError(
        "pre_equilibrate must be True (start from the model's steady state), False, or a "
        f"function model -> model (the pre-stimulus condition), got {value!r}"
    )
