"""`ds.fit`: fit model parameters and initial states to observations."""

import dataclasses
import time
import warnings
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._model import AbstractODE
from .._solver.base import AbstractSolver
from . import optimize as opt
from .data import FitWarning
from .evaluate import at_optimum, largest_defects, trajectory
from .optimize import FIT_RESULTS
from .problem import (
    batchable_windows,
    Problem,
    windows,
)
from .result import BEATEN, FitResult, FitSettings
from .setup import assemble, FitSetup, FitSpec, with_jacobian
from .uncertainty import analyse


def fit(
    model: AbstractODE,
    y0,
    data,
    *,
    params=None,
    initial_state=False,
    observe=None,
    solver: AbstractSolver | None = None,
    dt: float | None = None,
    method="lm",
    loss: str = "squared",
    segments: int = 1,
    starts=1,
    horizon: int = 2,
    bounds: dict | None = None,
    noise=None,
    weights=None,
    t0: float | None = None,
    key=None,
    max_iterations: int | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    continuity_weight: float = 10.0,
    level: float = 0.95,
    max_steps: int = 100_000,
    events=None,
) -> FitResult:
    """Fit parameters and/or initial-state components of `model` to `data`.

    **Arguments:**

    - `model`: the model with initial guesses in the fitted fields (the others stay fixed).
    - `y0`: initial state at `t0`: the guess for the fitted components, fixed elsewhere; an array.
    - `data`: a `ds.Data`, a `(ts, values)` tuple (`values` of shape `(times,)` or
      `(times, observables)`, NaN = missing), a CSV path (first column the time), a pandas
      DataFrame (the index is the time) or an xarray object.
    - `params`: the fitted model fields: a name, a list of names, a dict name → `(lower, upper)`
      bounds, or a function `(name, value) -> bool` selecting among the floating fields.
    - `initial_state`: fit all (`True`), none (`False`) or the listed components (indices into
      the flattened state, or state names such as `"prey"`) of `y0`.
    - `observe`: `observe(y) -> observable` maps one state to what is measured (default: the
      whole state); applied at each data time. E.g. `lambda y: y[0]` for the angle only.
    - `solver`, `dt`, `max_steps`: as for `ds.simulate` (default `ds.Tsit5(rtol=1e-8,
      atol=1e-8)`).
    - `events`: events with resets (impacts, switches) as for `ds.simulate`, or a function
      `model -> events` when they depend on fitted parameters (e.g. a restitution
      coefficient: `events=lambda m: m.impacts(max_events=20)`). Derivatives flow through the
      event times. Terminal events are refused: data after the stop would be unexplained.
    - `method`: `"lm"` (Levenberg–Marquardt with MINPACK's scaling of the unknowns on
      optimistix's trust region, default), `"gauss-newton"`,
      `"bfgs"` (minimises the loss), or an optax `GradientTransformation` run for
      `max_iterations` steps (default 256 for optimistix, 2000 for optax).
    - `loss`: `"squared"` (residuals `(model − data)`) or `"log"` (residuals of logarithms, for
      positive data with multiplicative noise such as populations).
    - `segments`: multiple shooting: the time span is cut into this many windows whose initial
      states are extra unknowns, with the continuity defects among the residuals (divided by
      the data's typical noise when `noise` is given, else in the data's own units, and
      multiplied by `continuity_weight`); the result is then refined by single
      shooting, so the reported fit is continuous and its covariance is that of the model.
    - `starts`: fit from this many initial guesses at once (`vmap`): the given guess and
      `starts − 1` drawn with `key` (log-uniform within a factor of 10 for positive parameters,
      uniform within two-sided bounds, ±max(|guess|, 1) otherwise); the lowest loss is kept.
      Or an array `(starts, unknowns)` of the guesses themselves (natural units, columns in
      the order of `FitResult.names`), which then replace the model's and y0's.
    - `horizon`: fit a growing share of the record in this many stages, each started from the
      last one's optimum: first the data up to 1/horizon of the time span, then 2/horizon, …,
      then all of it (default 2; 1 fits the whole record at once). Long records of oscillating
      systems have a local optimum for every wrong phase; their first part has fewer, so a
      neutral guess reaches the right basin far more often. It costs the earlier stages'
      iterations (often fewer than the whole fit takes) and no extra compilation.
    - `bounds`: dict name → `(lower, upper)` (`None` for an open side) for parameters and
      initial-state components (`"y0[prey]"`); the optimiser works through log / logit
      transforms, so bounds hold strictly. Parameters declared `positive` / `nonnegative` get
      `(0, None)` by default.
    - `noise` / `weights`: the data's noise standard deviation (absolute: the covariance is not
      rescaled) or relative weights (the noise is estimated from the residuals); override those
      of a `ds.Data`.
    - `t0`: the time of `y0` (default: the first data time).
    - `rtol`, `atol`: the optimiser's convergence tolerances (on the step and the loss);
      default 1e-8 and 1e-10 in float64, 1e-5 and 1e-7 in float32 (what its precision can
      resolve).
    - `level`: the confidence level of the reported intervals.

    **Returns:** a `ds.FitResult` (see its documentation): `.model`, `.y0`, `.params`,
    `.stderr`, `.covariance`, `.converged`, `.summary()`, `.plot()`.
    """
    start_time = time.perf_counter()
    spec = FitSpec(
        model=model,
        y0=y0,
        data=data,
        params=params,
        initial_state=initial_state,
        observe=observe,
        solver=solver,
        dt=dt,
        method=method,
        loss=loss,
        segments=segments,
        starts=starts,
        horizon=horizon,
        bounds=bounds,
        noise=noise,
        weights=weights,
        t0=t0,
        key=key,
        max_iterations=max_iterations,
        rtol=rtol,
        atol=atol,
        continuity_weight=continuity_weight,
        level=level,
        max_steps=max_steps,
        events=events,
    )
    setup = assemble(spec)
    if setup.starts is not None:
        p0s = jax.device_put(setup.starts.astype(setup.guess.dtype))
    else:
        p0s = _start_points(setup.problem, setup.guess, spec.starts, spec.key)
    shooting, solves = None, 0
    if spec.segments > 1:
        p0s, shooting, solves = _shooting_stage(setup, spec, p0s)
    horizon = spec.horizon if shooting is None else 1  # shooting has cut the record already
    final = _fetch(_run(setup.problem, p0s, setup.optimizer, evaluate=True, horizon=horizon))
    if shooting is None:
        _check_guess(final.optimum, setup.problem)
    solves += int(np.sum(final.optimum.evaluations))
    result = _result(setup, final, shooting=shooting, solves=solves, start_time=start_time)
    for note in result.warnings:
        warnings.warn(note, FitWarning, stacklevel=2)
    return result


class _Stage(NamedTuple):
    """One optimisation stage run from every start at once (NumPy arrays once fetched)."""

    optimum: opt.Optimum  # batched along a leading axis, one entry per start
    p: jax.Array  # (starts, unknowns) the natural values of each optimum
    best: jax.Array | None = None  # the start of the lowest finite loss
    # at the best optimum (the final stage only): the residual Jacobian, the predictions and
    # the data residuals (times, observables), the loss there, and the model and y0 it gives
    jacobian: jax.Array | None = None
    predictions: jax.Array | None = None
    residuals: jax.Array | None = None
    loss: jax.Array | None = None
    model: AbstractODE | None = None
    y0: jax.Array | None = None


def _check_guess(optimum: opt.Optimum, problem: Problem) -> None:
    """The loss at the given guess (start 0) must be finite, else nothing was fitted."""
    if not np.isfinite(float(optimum.history[0, 0])):
        detail = ""
        if problem.log_loss:
            detail = " (with loss='log', the model's observables must stay positive)"
        raise ValueError(
            "the model cannot be simulated, or gives non-finite predictions, at the initial "
            f"guess{detail}: start from a guess where ds.simulate succeeds"
        )


@eqx.filter_jit
def _run(
    problem: Problem, p0s, optimizer: opt.Optimizer, *, evaluate: bool, horizon: int = 1
) -> _Stage:
    """Optimise from each start (natural values, one per row); with `evaluate`, also evaluate
    the residual Jacobian and the predictions at the best optimum, in the same program (one
    compilation for the whole fit instead of one per stage and small eager operations).
    `horizon` > 1 fits a growing share of the data first (`_horizon_masks`)."""
    masks = _horizon_masks(problem, horizon)

    def one(p0):
        def stage(u, mask):
            staged = dataclasses.replace(problem, scale=problem.scale * mask[:, None])
            residuals = lambda u: staged.residuals(staged.natural(u))  # noqa: E731
            optimum = opt.optimize(residuals, u, optimizer, problem.num_residuals)
            # a stage that fails (a simulation blew up) hands on its own start
            usable = jnp.all(jnp.isfinite(optimum.u)) & jnp.isfinite(optimum.loss)
            return jnp.where(usable, optimum.u, u), optimum

        u0 = problem.unconstrained(p0)
        if masks is None:
            _, optimum = stage(u0, jnp.ones(problem.scale.shape[0], problem.scale.dtype))
        else:  # one trace of the optimiser, scanned over the stages
            _, optima = jax.lax.scan(stage, u0, masks)
            optimum = jax.tree.map(lambda x: x[-1], optima)
            optimum = eqx.tree_at(lambda o: o.evaluations, optimum, jnp.sum(optima.evaluations))
        return _Stage(optimum, problem.natural(optimum.u))

    if p0s.shape[0] == 1:  # no vmap around a single start: its batching rules cost compile time
        stage = jax.tree.map(lambda x: x[None], one(p0s[0]))
    else:
        stage = jax.vmap(one)(p0s)
    loss = stage.optimum.loss
    best = jnp.argmin(jnp.where(jnp.isfinite(loss), loss, jnp.inf))
    if not evaluate:
        return stage._replace(best=best)
    p = stage.p[best]
    jacobian, predictions, residuals = at_optimum(problem, p, optimizer.jac)
    model, y0, _ = problem.assemble(p)
    return stage._replace(
        best=best,
        jacobian=jacobian,
        predictions=predictions,
        residuals=residuals,
        loss=jnp.sum(residuals**2),  # at the result itself, exactly
        model=model,
        y0=y0.reshape(problem.y0_shape),
    )


def _horizon_masks(problem: Problem, horizon: int):
    """The data each stage of a growing horizon fits, (stages, times) of 0/1: stage j of
    `horizon` the observation times up to the fraction (j + 1)/horizon of the span, the last
    stage all of them; None for a single stage.

    Why: the loss of a long record of an oscillating or otherwise history-dependent system has
    a local optimum for every wrong phase or period, and a neutral guess lands in one. The first
    part of the record constrains the dynamics with fewer such optima; its optimum then starts
    the fit of the whole record close to the right basin. A careful scientist fits a growing
    window by hand; here it is one scanned loop in the same compiled program."""
    if horizon <= 1:
        return None
    times = np.asarray(problem.ts[problem.first_observed :])
    span = times[-1] - times[0]
    ends = [times[0] + span * (j + 1) / horizon for j in range(horizon)]
    masks = np.stack([times <= end + 1e-9 * span for end in ends]).astype(float)
    masks[-1] = 1.0
    return jnp.asarray(masks, problem.scale.dtype)


def _fetch(stage: _Stage) -> _Stage:
    """The stage's arrays on the host in one transfer (NumPy: indexing them compiles nothing);
    the model stays as the program returned it."""
    model = stage.model
    return jax.device_get(stage._replace(model=None))._replace(model=model)


def _start_points(problem: Problem, guess_p, starts: int, key):
    """Natural starting values, one per row: the guess, then `starts - 1` drawn ones."""
    if starts == 1:
        return jnp.asarray(np.asarray(guess_p)[None], guess_p.dtype)
    return _drawn_starts(problem, guess_p, key, starts=starts)


@eqx.filter_jit
def _drawn_starts(problem: Problem, guess_p, key, *, starts: int):
    guess_u = problem.unconstrained(guess_p)
    if key is None:
        key = jax.random.key(0)
    layout = problem.layout
    kinds = np.asarray(layout.kinds)
    k = layout.num_fitted
    shape = (starts - 1, k)
    draws = jax.random.uniform(key, shape, guess_u.dtype, -1.0, 1.0)
    positive = np.broadcast_to((kinds == "log") | (kinds == "upper-log"), shape)
    logit = np.broadcast_to(kinds == "logit", shape)
    # log: u = log(p - lower) moves by ±log(10); logit: uniform in (0, 1) through the logit
    u_log = guess_u[None] + draws * jnp.log(10.0).astype(guess_u.dtype)
    fraction = jnp.clip((draws + 1) / 2, 1e-6, 1 - 1e-6)
    u_logit = jnp.log(fraction) - jnp.log1p(-fraction)
    u_plain = guess_p[None] + draws * jnp.maximum(jnp.abs(guess_p), 1.0)[None]
    drawn = jnp.where(positive, u_log, jnp.where(logit, u_logit, u_plain))
    return jnp.concatenate([guess_p[None], jax.vmap(problem.natural)(drawn)])


def _shooting_stage(setup: FitSetup, spec: FitSpec, p0s) -> tuple[jax.Array, dict, int]:
    """Multiple shooting from every start; returns the single-shooting starts it leads to,
    the stage's summary (`FitResult.shooting`) and the simulations it ran."""
    problem = setup.problem
    shooting_problem = _shooting_problem(problem, spec.segments, spec.continuity_weight)
    shooting_optimizer = with_jacobian(setup.optimizer, shooting_problem)
    shooting_problem = dataclasses.replace(
        shooting_problem,
        forward_only=problem.forward_only and shooting_optimizer.jac == "fwd",
    )
    nodes = _initial_nodes(problem, shooting_problem, setup.guess)
    starts = np.concatenate(
        [np.asarray(p0s), np.broadcast_to(nodes, (p0s.shape[0], nodes.size))], 1
    )
    stage = _run(
        shooting_problem, jnp.asarray(starts, p0s.dtype), shooting_optimizer, evaluate=False
    )
    defects = np.asarray(largest_defects(shooting_problem, stage.p))
    stage = _fetch(stage)
    _check_guess(stage.optimum, problem)
    solves = int(np.sum(stage.optimum.evaluations)) * len(shooting_problem.windows)
    best = int(stage.best)
    summary = dict(
        segments=spec.segments,
        iterations=int(stage.optimum.steps[best]),
        loss=float(stage.optimum.loss[best]),
        converged=bool(stage.optimum.code[best] == FIT_RESULTS.converged),
        max_defect=float(defects[best]),
    )
    return jnp.asarray(stage.p[:, : problem.layout.size]), summary, solves


def _shooting_problem(problem: Problem, segments, continuity_weight) -> Problem:
    spans = windows(len(problem.ts), segments)
    batched, steps_per_save = batchable_windows(problem.ts, spans, problem.solver, problem.dt)
    n = problem.y0.size
    layout = dataclasses.replace(problem.layout, num_nodes=(segments - 1) * n)
    return dataclasses.replace(
        problem,
        layout=layout,
        windows=spans,
        batched=batched,
        steps_per_save=steps_per_save,
        continuity=jnp.asarray(continuity_weight / _typical_noise(problem), problem.y0.dtype),
    )


def _typical_noise(problem: Problem) -> np.ndarray:
    """Per state component, what a continuity defect is measured against: the data's typical
    absolute noise (1/scale: the given noise, else 1/sqrt(weight), i.e. the data's own units),
    from the observed component itself when the state is observed directly, else the median
    over all data."""
    scale = np.asarray(problem.scale)
    values = np.asarray(problem.values)
    observed = scale > 0
    with np.errstate(divide="ignore"):
        sigma = np.where(observed, 1.0 / np.where(observed, scale, 1.0), np.nan)
    if problem.log_loss:
        sigma = sigma * np.abs(values)
    overall = float(np.nanmedian(sigma))
    n = problem.y0.size
    if problem.observe is None and sigma.shape[1] == n:
        per = np.nanmedian(sigma, axis=0)
        return np.where(np.isfinite(per), per, overall)
    return np.full(n, overall)


def _initial_nodes(problem: Problem, shooting: Problem, guess_p):
    """Window-start states: the data there when they observe the whole state, else the
    guess's own trajectory."""
    states = np.asarray(trajectory(problem, guess_p))
    nodes = []
    values = np.asarray(problem.values)
    observed = np.asarray(problem.scale) > 0
    for a, _ in shooting.windows[1:]:
        node = states[a].copy()
        row = a - problem.first_observed
        if problem.observe is None and values.shape[1] == node.size and row >= 0:
            node = np.where(observed[row], values[row], node)
        nodes.append(node)
    return np.concatenate(nodes).astype(np.asarray(problem.y0).dtype)


# --- the result ---------------------------------------------------------------------------------


def _result(
    setup: FitSetup, final: _Stage, *, shooting: dict | None, solves: int, start_time: float
) -> FitResult:
    problem, data, optimum = setup.problem, setup.data, final.optimum
    names = problem.layout.names
    best = int(final.best)
    p = final.p[best]
    jacobian, predictions, residuals = final.jacobian, final.predictions, final.residuals
    loss = float(final.loss)
    code = FIT_RESULTS(int(optimum.code[best]))
    p_np = np.asarray(p, np.float64)
    bound_notes = _at_bounds(problem, p_np, np.asarray(setup.guess))
    misfit = _misfit(loss, setup) if code == FIT_RESULTS.converged else None
    start_notes, reached = _start_agreement(np.asarray(optimum.loss), best)
    converged = code == FIT_RESULTS.converged and not bound_notes and misfit is None
    reason = code.message
    if code == FIT_RESULTS.converged and bound_notes:
        reason = "the optimiser stopped, but on a bound: not an optimum of the model"
    elif misfit is not None:
        reason = "the optimiser stopped, but " + misfit
    stats = analyse(
        jacobian,
        p,
        loss=loss,
        num_observed=setup.num_observed,
        noise_known=setup.noise_known,
        level=setup.level,
        names=names,
        at_optimum=code == FIT_RESULTS.converged,
        kinds=problem.layout.kinds,
        lower=np.asarray(problem.lower),
        upper=np.asarray(problem.upper),
    )
    model, y0 = final.model, final.y0
    predictions = np.asarray(predictions)
    residuals = np.where(np.asarray(problem.scale) > 0, np.asarray(residuals), np.nan)
    p_all = np.asarray(final.p)
    notes = bound_notes + start_notes + stats.notes
    if code != FIT_RESULTS.converged:
        notes.insert(0, f"the fit did not converge: {code.message}")
    elif misfit is not None:
        notes.insert(0, f"{misfit}: a local optimum, or a model that cannot follow the data")
    if shooting is not None and not shooting["converged"]:
        notes.insert(
            0,
            "the multiple-shooting stage did not converge; the refinement started "
            "from its last iterate",
        )
    history = np.asarray(optimum.history[best])
    return FitResult(
        model=model,
        y0=jnp.asarray(y0, y0.dtype),
        names=names,
        params={n: float(v) for n, v in zip(names, p_np)},
        stderr={n: float(v) for n, v in zip(names, stats.stderr)},
        confidence_intervals={
            n: (float(lo), float(hi)) for n, lo, hi in zip(names, stats.lower, stats.upper)
        },
        level=setup.level,
        covariance=stats.covariance,
        correlation=stats.correlation,
        noise_variance=stats.noise_variance,
        dof=stats.dof,
        num_observed=setup.num_observed,
        converged=converged,
        reason=reason,
        iterations=int(optimum.steps[best]),
        num_solves=solves,
        loss=loss,
        loss_history=history[np.isfinite(history)],
        residuals=residuals.reshape(data.values.shape),
        predictions=predictions.reshape(data.values.shape),
        starts=dict(
            loss=np.asarray(optimum.loss),
            converged=np.asarray(optimum.code) == FIT_RESULTS.converged,
            evaluations=np.asarray(optimum.evaluations),
            params={n: p_all[:, i] for i, n in enumerate(names)},
        ),
        best_start=best,
        starts_reached=reached,
        shooting=shooting,
        warnings=tuple(notes),
        method=setup.method,
        data=data,
        t0=setup.t0,
        seconds=time.perf_counter() - start_time,
        _problem=problem,
        _settings=FitSettings(
            optimizer=setup.optimizer,
            guess=setup.guess,
            base_scale=setup.base_scale,
            noise_known=setup.noise_known,
            log_loss=problem.log_loss,
        ),
    )


def _start_agreement(losses: np.ndarray, best: int) -> tuple[list[str], int]:
    """How many starts reached the kept optimum (loss within `BEATEN`, relatively), and a note
    when the landscape showed several optima: only one start of many found the lowest, or the
    given guess (start 0) on its own stopped at a higher one."""
    lowest = losses[best]
    reached = np.isfinite(losses) & (losses <= lowest + BEATEN * abs(lowest))
    count, total = int(np.sum(reached)), losses.size
    notes = []
    if total == 1:
        return notes, count
    if not reached[0]:
        notes.append(
            f"the given guess alone stops at a local optimum (loss {losses[0]:.6g}); "
            f"{count} of {total} starts reached the kept loss {lowest:.6g}"
        )
    elif count == 1 and total >= 4:
        notes.append(
            f"only 1 of {total} starts reached the kept loss {lowest:.6g}: the loss has several "
            "optima and a lower one may exist; fit with more starts to check"
        )
    return notes, count


def _misfit(loss: float, setup: FitSetup) -> str | None:
    """With the noise given, a loss far above what that noise explains (χ² with the degrees of
    freedom left: p < 1e-6 by the Wilson–Hilferty approximation) says the optimum is not the
    model's best account of the data; without it no such check is possible."""
    dof = setup.num_observed - setup.problem.layout.size
    if not setup.noise_known or dof < 1:
        return None
    ratio = loss / dof
    spread = 2.0 / (9.0 * dof)
    z = (ratio ** (1.0 / 3.0) - (1.0 - spread)) / np.sqrt(spread)
    if z < 4.75:  # the upper normal tail beyond 4.75: p ≈ 1e-6
        return None
    return (
        f"the loss {loss:.6g} is far above what the given noise explains ({dof} degrees of "
        f"freedom expect about {dof})"
    )


def _at_bounds(problem: Problem, p, guess) -> list[str]:
    """Notes for fitted values that ended on a bound (the transform's far end): the data pull
    them beyond it, so the optimiser cannot converge there and the intervals assume otherwise."""
    notes = []
    lower, upper = np.asarray(problem.lower), np.asarray(problem.upper)
    for i, (name, kind) in enumerate(zip(problem.layout.names, problem.layout.kinds)):
        reach = {
            "log": guess[i] - lower[i],
            "upper-log": upper[i] - guess[i],
            "logit": upper[i] - lower[i],
        }.get(kind)
        if reach is None:
            continue
        for bound, side, used in (
            (lower[i], "lower", kind in ("log", "logit")),
            (upper[i], "upper", kind in ("upper-log", "logit")),
        ):
            if used and abs(p[i] - bound) < 1e-6 * reach:
                notes.append(
                    f"{name} = {p[i]:.6g} is at its {side} bound {bound:g}: the data favour a "
                    "value beyond it. Widen the bound if that is physical; the standard errors "
                    "assume an optimum inside the bounds"
                )
    return notes
