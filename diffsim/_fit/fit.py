"""`ds.fit`: fit model parameters and initial states to observations."""

import dataclasses
import time
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._compile import jit
from .._model import AbstractODE
from .._quasirandom import halton_unit
from .._solver.base import AbstractSolver
from .._warn import warn
from . import optimize as opt
from .data import FitWarning
from .equal_optima import equal_optima_note
from .evaluate import at_optimum, largest_defects, trajectory
from .optimize import FIT_RESULTS
from .problem import (
    batchable_windows,
    Problem,
    windows,
)
from .result import BEATEN, FitResult, FitSettings
from .setup import assemble, FitSetup, FitSpec, with_jacobian
from .study import Problem as StudyProblem
from .study_fit import fit_problem
from .uncertainty import analyse


def fit(
    model: AbstractODE,
    y0=None,
    data=None,
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
    screen: int = 64,
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
    pre_equilibrate=False,
    progress: bool = True,
) -> FitResult:
    """Fit parameters and/or initial-state components of `model` to `data`; or, given a
    `ds.Problem` (a study of many experiments with observation and noise models), its
    unknowns by maximum likelihood: `ds.fit(problem, starts=, screen=, key=, method=,
    max_iterations=, rtol=, atol=, level=, progress=)` returns a `ds.ProblemFit` (see
    docs/fitting.md, "Studies with many experiments").

    **Arguments:**

    - `model`: the model with initial guesses in the fitted fields (the others stay fixed).
    - `y0`: initial state at `t0`: the guess for the fitted components, fixed elsewhere; an array.
    - `data`: a `ds.Data`, a `(ts, values)` tuple (`values` of shape `(times,)` or
      `(times, observables)`, NaN = missing), a CSV path (first column the time), a pandas
      DataFrame (the index is the time) or an xarray object.
    - `params`: the fitted model parameters: a name, a list of names, a dict name →
      `(lower, upper)` bounds, or a function `(name, value) -> bool` selecting among the
      floating-point parameters. A name is a field (`"damping"`), an entry of a `ds.ODE`'s
      params dict (`"k"`, `"params.k"`, `'params["k"]'`) or a nested module's field
      (`"drag.coefficient"`).
    - `initial_state`: fit all (`True`), none (`False`) or the listed components (indices into
      the flattened state, or state names such as `"prey"`) of `y0`.
    - `observe`: `observe(y) -> observable` maps one state to what is measured (default: the
      whole state); applied at each data time. E.g. `lambda y: y[0]` for the angle only.
    - `solver`, `dt`, `max_steps`: as for `ds.simulate` (default `ds.Tsit5(rtol=1e-8,
      atol=1e-8)`; with a float32 `y0`, `rtol=1e-5, atol=1e-7`, what float32 resolves).
    - `events`: events with resets (impacts, switches) as for `ds.simulate`, or a function
      `model -> events` when they depend on fitted parameters (e.g. a restitution
      coefficient: `events=lambda m: m.impacts(max_events=20)`). Derivatives flow through the
      event times. Terminal events are refused: data after the stop would be unexplained.
    - `pre_equilibrate`: start the simulation at `t0` from the steady state of the model
      (`True`), or of the model a function returns (`lambda m: <m with the stimulus off>`,
      the pre-stimulus condition), reached from `y0` (`ds.steady_state`): a system measured
      after it settled, as systems-biology fitters expect. Its derivatives with respect to the
      parameters come from the implicit function theorem.
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
    - `screen`: before optimising, evaluate the loss at the guess and `screen − 1`
      quasi-random (Halton) points around it, one forward simulation each: a decade either
      way for positive unknowns (log space), the whole range for two-sided bounds,
      ±max(|guess|, 1) for unbounded ones. With a growing horizon the loss is that of the
      first stage's data, and the 3 lowest points (or `starts`, if more) are each fitted to
      that data first; the `starts` best of them go on to the whole record. Default 64; 0 (or
      1) starts from the guess alone. The points are ranked with an adaptive solver's rtol
      loosened to 1e-4 and at most max_steps/16 steps each. Deterministic: the same call
      gives the same answer (with `key`, the points are shifted at random).
    - `starts`: how many optimisations run to the end, from the lowest screened points (from
      the guess and `starts − 1` of those points when `screen <= starts`); the lowest loss is
      kept and `FitResult.status` says how many reached it. Or an array `(starts, unknowns)`
      of the guesses themselves (natural units, columns in the order of `FitResult.names`),
      which then replace the model's and y0's; they are not screened. Starts run one after
      another in one compiled program.
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
    - `key`: a `jax.random.key` that shifts the screened points at random (default: none,
      the same points every call).
    - `rtol`, `atol`: the optimiser's convergence tolerances (on the step and the loss);
      default 1e-8 and 1e-10 in float64, 1e-5 and 1e-7 in float32 (what its precision can
      resolve).
    - `level`: the confidence level of the reported intervals.
    - `progress`: for a `ds.Problem`, a bar over the starts when stderr is a terminal.

    **Returns:** a `ds.FitResult` (see its documentation): `.model`, `.y0`, `.params`,
    `.stderr`, `.covariance`, `.converged`, `.summary()`, `.plot()`.
    """
    if isinstance(model, StudyProblem):
        arguments = locals()
        given = [n for n, default in _FIT_DEFAULTS.items() if arguments[n] is not default]
        if given:
            raise TypeError(
                f"ds.fit(problem) takes its model, data, observables and solver from the "
                f"problem; {sorted(given)} apply to ds.fit(model, y0, data) only"
            )
        return fit_problem(
            model,
            starts=starts,
            screen=screen,
            key=key,
            method=None if method == "lm" else method,
            max_iterations=max_iterations,
            rtol=rtol,
            atol=atol,
            level=level,
            progress=progress,
        )
    if y0 is None or data is None:
        raise TypeError("ds.fit(model, y0, data, ...) needs y0 and data (or give it a ds.Problem)")
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
        screen=screen,
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
        pre_equilibrate=pre_equilibrate,
    )
    setup = assemble(spec)
    horizon = spec.horizon if spec.segments == 1 else 1  # shooting cuts the record instead
    if setup.starts is not None:  # given guesses: each optimised, none screened
        p0s = jax.device_put(setup.starts.astype(setup.guess.dtype))
        plan = _Plan(points=0, trials=len(p0s), starts=len(p0s), horizon=horizon)
    else:
        p0s = jnp.asarray(np.asarray(setup.guess)[None], setup.guess.dtype)
        plan = _plan(spec.screen, spec.starts, horizon)
    key = spec.key
    if key is not None and jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)  # raw data: a typed key would not cross the jit
    shooting, screen, solves = None, None, 0
    if spec.segments > 1:
        p0s, shooting, screen, solves = _shooting_stage(setup, spec, p0s, plan, key)
        plan = _Plan(points=0, trials=len(p0s), starts=len(p0s))
    final = _fetch(_run(setup.problem, p0s, setup.optimizer, plan, key, evaluate=True))
    if shooting is None:
        _check_start(final, setup.problem, plan)
        screen = _screen_summary(final, setup.problem, plan)
    solves += int(final.evaluations)
    result = _result(
        setup, final, shooting=shooting, screen=screen, solves=solves, start_time=start_time
    )
    for note in result.warnings:
        warn(note, FitWarning)
    return result


# what ds.fit(model, y0, data) takes and ds.fit(problem) does not: their defaults
_FIT_DEFAULTS = dict(
    y0=None,
    data=None,
    params=None,
    initial_state=False,
    observe=None,
    solver=None,
    dt=None,
    loss="squared",
    segments=1,
    horizon=2,
    bounds=None,
    noise=None,
    weights=None,
    t0=None,
    events=None,
    pre_equilibrate=False,
)


# The screen: where a fit starts. A neutral guess is often far from the optimum's basin (a
# wrong period, a ball that bounces at the wrong times); the loss at a few dozen quasi-random
# points around it, a cheap forward simulation each, finds a better start far more often than
# the guess itself (measured in experiments/bench/fit_robustness.py and docs/fitting.md).
SCREEN_RTOL = 1e-4  # an adaptive solver's rtol is loosened to this to rank the points
SCREEN_STEP_SHARE = 16  # a screened point gets max_steps / this steps (a wild one stops early)
FIRST_STAGE_TRIALS = 3  # with a growing horizon: the lowest screened points fitted to the first
# stage's data, the best of them then fitted to the whole record


class _Plan(NamedTuple):
    """Static: how a fit's starts are chosen and run. `points` candidates (the guess, then
    quasi-random points around it; 0 when the starts are given) are screened by their loss when
    there are more than `trials`; the `trials` lowest are each optimised on the first stage's
    data, and the `starts` best of those through every stage."""

    points: int
    trials: int
    starts: int
    horizon: int = 1


def _plan(screen: int, starts: int, horizon: int) -> _Plan:
    trials = max(FIRST_STAGE_TRIALS, starts) if horizon > 1 and screen > starts else starts
    return _Plan(points=max(screen, trials), trials=trials, starts=starts, horizon=horizon)


class _Stage(NamedTuple):
    """One optimisation stage run from every start at once (NumPy arrays once fetched)."""

    optimum: opt.Optimum  # batched along a leading axis, one entry per start (the last
    # stage's loss history, steps and code; evaluations over all its stages)
    p: jax.Array  # (starts, unknowns) the natural values of each optimum
    best: jax.Array  # the start of the lowest finite loss
    evaluations: jax.Array  # simulations run in all: the screen, every trial and stage
    start_loss: jax.Array  # (trials,) the loss where each first-stage trial began
    candidates: jax.Array | None  # (points, unknowns) natural: the guess, then the screened
    screened: jax.Array | None  # (points,) their losses on the first stage's data (inf where
    # they cannot be simulated); None without a screen
    trial_loss: jax.Array  # (trials,) the first-stage optimum of each trial
    # at the best optimum (the final stage only): the residual Jacobian, the predictions and
    # the data residuals (times, observables), the loss there, and the model and y0 it gives
    jacobian: jax.Array | None = None
    predictions: jax.Array | None = None
    residuals: jax.Array | None = None
    loss: jax.Array | None = None
    model: AbstractODE | None = None
    y0: jax.Array | None = None


def _check_start(stage: _Stage, problem: Problem, plan: _Plan) -> None:
    """The loss where the first optimisation began must be finite, else nothing was fitted:
    the guess (and every screened point) cannot be simulated."""
    if not np.isfinite(float(stage.start_loss[0])):
        detail = ""
        if problem.log_loss:
            detail = " (with loss='log', the model's observables must stay positive)"
        if problem.pre_equilibrate is not False:
            detail += (
                " (with pre_equilibrate, the simulation starts from the model's steady state: "
                "a model that has none reachable from y0, or none that Newton can polish, fails "
                "here; ds.steady_state(model, y0) says which)"
            )
        where = "guess"
        if plan.points > plan.trials:
            where = f"guess and at the {plan.points - 1} screened points around it"
        raise ValueError(
            "the model cannot be simulated, or gives non-finite predictions, at the initial "
            f"{where}{detail}: start from a guess where ds.simulate succeeds (its result says "
            f"why: a solve that needs more than max_steps = {problem.max_steps} steps fails "
            "too; raise max_steps then)"
        )


def _screen_summary(stage: _Stage, problem: Problem, plan: _Plan) -> dict | None:
    """`FitResult.screen`: the screened points and their losses, or None without a screen."""
    if stage.screened is None:
        return None
    names = problem.layout.names
    candidates = np.asarray(stage.candidates)
    return dict(
        points=plan.points,
        trials=plan.trials,
        loss=np.asarray(stage.screened),
        params={n: candidates[:, i] for i, n in enumerate(names)},
        trial_loss=np.asarray(stage.trial_loss),
    )


@jit
def _run(problem: Problem, p0s, optimizer: opt.Optimizer, plan: _Plan, key, *, evaluate: bool):
    """Screen, then optimise from each start (natural values, one per row: the guess, or the
    given starts), all in one compiled program; with `evaluate`, also the residual Jacobian
    and the predictions at the best optimum (one compilation for the whole fit instead of one
    per stage and small eager operations).

    The optimisations run one after another in a single `lax.scan` over "slots" with one
    trace of the optimiser: first the `plan.trials` first-stage fits, then the later stages of
    the `plan.starts` best of them (`_horizon_masks`). Not `vmap`: batched, every iteration of
    every start waits for the slowest start's simulation, and the batching rules of the
    optimiser's loops cost compile time (on a CPU a vmapped batch of 50 starts took 1.7-4.4x
    as long as the same starts one after another, compilation included)."""
    masks = _horizon_masks(problem, plan.horizon)
    candidates = screened = None
    if plan.points > p0s.shape[0]:
        candidates = _candidates(problem, p0s[0], plan.points, key)
        if plan.points > plan.trials:
            screened = _screen(problem, candidates, masks[0])
            # stable: among equal losses the guess (row 0) comes first
            trials = candidates[jnp.argsort(screened, stable=True)[: plan.trials]]
        else:
            trials = candidates
    else:
        trials = p0s

    def fit_stage(u, mask):
        staged = dataclasses.replace(problem, scale=problem.scale * mask[:, None])
        residuals = lambda u: staged.residuals(staged.natural(u))  # noqa: E731
        optimum = opt.optimize(residuals, u, optimizer, problem.num_residuals)
        # a stage that fails (a simulation blew up) hands on its own start
        usable = jnp.all(jnp.isfinite(optimum.u)) & jnp.isfinite(optimum.loss)
        return jnp.where(usable, optimum.u, u), optimum

    optima, ends = _run_slots(fit_stage, jax.vmap(problem.unconstrained)(trials), masks, plan)
    loss = optima.loss
    best = jnp.argmin(jnp.where(jnp.isfinite(loss), loss, jnp.inf))
    evaluations = ends.evaluations + (0 if screened is None else plan.points)
    stage = _Stage(
        optimum=optima,
        p=jax.vmap(problem.natural)(optima.u),
        best=best,
        evaluations=evaluations,
        start_loss=ends.start_loss,
        candidates=candidates if screened is not None else None,
        screened=screened,
        trial_loss=ends.trial_loss,
    )
    if not evaluate:
        return stage
    p = stage.p[best]
    jacobian, predictions, residuals = at_optimum(problem, p, optimizer.jac)
    model, y0, _ = problem.assemble(p)
    return stage._replace(
        jacobian=jacobian,
        predictions=predictions,
        residuals=residuals,
        loss=jnp.sum(residuals**2),  # at the result itself, exactly
        model=model,
        y0=y0.reshape(problem.y0_shape),
    )


class _SlotsEnd(NamedTuple):
    """What the slot scan reports besides each start's final optimum."""

    evaluations: jax.Array  # simulations of every slot together
    start_loss: jax.Array  # (trials,) the loss at each trial's start
    trial_loss: jax.Array  # (trials,) each trial's first-stage optimum (inf where it failed)


def _run_slots(fit_stage, trials_u, masks, plan: _Plan) -> tuple[opt.Optimum, _SlotsEnd]:
    """Run `plan.trials` first-stage fits from `trials_u` (trials, unknowns), then each later
    stage of the `plan.starts` trials with the lowest first-stage loss, as one scan over
    `trials + starts × (stages − 1)` slots: one trace of the optimiser whatever the counts.
    Returns each start's final optimum (batched; evaluations summed over its stages)."""
    trials, starts, stages = plan.trials, plan.starts, masks.shape[0]
    slots = trials + starts * (stages - 1)
    template = jax.eval_shape(fit_stage, trials_u[0], masks[0])[1]
    zeros = lambda leading: jax.tree.map(  # noqa: E731
        lambda x: jnp.zeros((leading, *x.shape), x.dtype), template
    )

    class Carry(NamedTuple):
        trial_u: jax.Array  # (trials, unknowns) each trial's first-stage result
        trial: opt.Optimum  # (trials, ...) each trial's first-stage optimum
        kept: jax.Array  # (starts,) the trials that go on (set when the trials end)
        u: jax.Array  # the current start's iterate between its stages
        used: jax.Array  # the current start's evaluations so far
        final: opt.Optimum  # (starts, ...) each start's final optimum

    def body(carry: Carry, slot):
        in_trials = slot < trials
        j = jnp.maximum(slot - trials, 0)
        member = j // max(stages - 1, 1)
        later = 1 + j % max(stages - 1, 1)  # the stage index of a later slot
        first_later = in_trials | (later == 1)
        kept_trial = carry.kept[member]
        u_in = jnp.where(
            in_trials,
            trials_u[jnp.minimum(slot, trials - 1)],
            jnp.where(first_later, carry.trial_u[kept_trial], carry.u),
        )
        mask = masks[jnp.where(in_trials, 0, later)]
        u_out, optimum = fit_stage(u_in, mask)
        index = jnp.minimum(slot, trials - 1)
        trial_u = jnp.where(in_trials, carry.trial_u.at[index].set(u_out), carry.trial_u)
        trial = jax.tree.map(
            lambda all_, one: jnp.where(in_trials, all_.at[index].set(one), all_),
            carry.trial,
            optimum,
        )
        trial_loss = jnp.where(jnp.isfinite(trial.loss), trial.loss, jnp.inf)
        kept = carry.kept
        if trials > starts:  # once the last trial ends, the `starts` lowest go on
            lowest = jnp.argsort(trial_loss, stable=True)[:starts]
            kept = jnp.where(slot == trials - 1, lowest, carry.kept)
        used = jnp.where(
            in_trials, 0, jnp.where(first_later, trial.evaluations[kept_trial], carry.used)
        ) + jnp.where(in_trials, 0, optimum.evaluations)
        last = ~in_trials & (later == stages - 1)
        done = eqx.tree_at(lambda o: o.evaluations, optimum, used)
        final = jax.tree.map(
            lambda all_, one: jnp.where(last, all_.at[member].set(one), all_), carry.final, done
        )
        return Carry(trial_u, trial, kept, u_out, used, final), optimum.evaluations

    init = Carry(
        trial_u=trials_u,
        trial=zeros(trials),
        kept=jnp.arange(starts),
        u=trials_u[0],
        used=jnp.zeros((), template.evaluations.dtype),
        final=zeros(starts),
    )
    carry, evaluations = jax.lax.scan(body, init, jnp.arange(slots))
    final = carry.final
    if stages == 1:  # every trial is a start: its first-stage optimum is final
        final = carry.trial
    trial_loss = jnp.where(jnp.isfinite(carry.trial.loss), carry.trial.loss, jnp.inf)
    end = _SlotsEnd(jnp.sum(evaluations), carry.trial.history[:, 0], trial_loss)
    return final, end


def _candidates(problem: Problem, guess_p, points: int, key):
    """The guess, then `points − 1` Halton points around it (natural values): a decade either
    way for a positive unknown (log space), the whole range for two-sided bounds (logit space),
    ±max(|guess|, 1) for an unbounded one; multiple-shooting nodes held. With `key` (its raw
    key data), the points are shifted at random modulo 1 (a Cranley–Patterson rotation)."""
    k = problem.layout.num_fitted
    unit = jnp.asarray(halton_unit(points - 1, k), guess_p.dtype)
    if key is not None:
        shift = jax.random.uniform(jax.random.wrap_key_data(key), (k,), guess_p.dtype)
        unit = (unit + shift[None]) % 1.0
    draws = 2 * unit - 1
    guess_u = problem.unconstrained(guess_p)
    fitted = guess_u[:k]
    kinds = np.asarray(problem.layout.kinds)
    positive = np.broadcast_to((kinds == "log") | (kinds == "upper-log"), draws.shape)
    logit = np.broadcast_to(kinds == "logit", draws.shape)
    u_log = fitted[None] + draws * jnp.log(10.0).astype(fitted.dtype)
    fraction = jnp.clip((draws + 1) / 2, 1e-6, 1 - 1e-6)
    u_logit = jnp.log(fraction) - jnp.log1p(-fraction)
    width = jnp.maximum(jnp.abs(guess_p[:k]), 1.0)
    u_plain = guess_p[None, :k] + draws * width[None]
    drawn = jnp.where(positive, u_log, jnp.where(logit, u_logit, u_plain))
    rest = jnp.broadcast_to(guess_u[k:], (points - 1, guess_u.size - k))
    around = jax.vmap(problem.natural)(jnp.concatenate([drawn, rest], axis=1))
    return jnp.concatenate([guess_p[None], around])


def _screen(problem: Problem, candidates, mask):
    """The loss of each candidate on the first stage's data, inf where it cannot be simulated;
    one forward simulation each, run one after another (`lax.map`: a vmapped batch would run
    every member until the slowest finishes). An adaptive solver's rtol is loosened to
    `SCREEN_RTOL` and its steps capped: the points are only ranked."""
    staged = dataclasses.replace(problem, scale=problem.scale * mask[:, None])
    solver = problem.solver
    if solver.adaptive:
        loose = jnp.maximum(solver.rtol, jnp.asarray(SCREEN_RTOL, solver.rtol.dtype))
        staged = dataclasses.replace(
            staged,
            solver=eqx.tree_at(lambda s: s.rtol, solver, loose),
            max_steps=max(problem.max_steps // SCREEN_STEP_SHARE, 1),
        )
    losses = jax.lax.map(lambda p: jnp.sum(staged.residuals(p) ** 2), candidates)
    return jnp.where(jnp.isfinite(losses), losses, jnp.inf)


def _horizon_masks(problem: Problem, horizon: int):
    """The data each stage of a growing horizon fits, (stages, times) of 0/1: stage j of
    `horizon` the observation times up to the fraction (j + 1)/horizon of the span, the last
    stage all of them; a single row of ones for one stage.

    Why: the loss of a long record of an oscillating or otherwise history-dependent system has
    a local optimum for every wrong phase or period, and a neutral guess lands in one. The first
    part of the record constrains the dynamics with fewer such optima; its optimum then starts
    the fit of the whole record close to the right basin. A careful scientist fits a growing
    window by hand; here it is one scanned loop in the same compiled program."""
    if horizon <= 1:
        return jnp.ones((1, problem.scale.shape[0]), problem.scale.dtype)
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


def _shooting_stage(
    setup: FitSetup, spec: FitSpec, p0s, plan: _Plan, key
) -> tuple[jax.Array, dict, dict | None, int]:
    """Multiple shooting (screened as single shooting is) from every start; returns the
    single-shooting starts it leads to, the stage's summary (`FitResult.shooting`), the screen's
    (`FitResult.screen`) and the simulations it ran."""
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
        shooting_problem,
        jnp.asarray(starts, p0s.dtype),
        shooting_optimizer,
        plan,
        key,
        evaluate=False,
    )
    defects = np.asarray(largest_defects(shooting_problem, stage.p))
    stage = _fetch(stage)
    _check_start(stage, problem, plan)
    windows = len(shooting_problem.windows)
    solves = int(stage.evaluations) * windows
    best = int(stage.best)
    summary = dict(
        segments=spec.segments,
        iterations=int(stage.optimum.steps[best]),
        loss=float(stage.optimum.loss[best]),
        converged=bool(stage.optimum.code[best] == FIT_RESULTS.converged),
        max_defect=float(defects[best]),
    )
    screen = _screen_summary(stage, shooting_problem, plan)
    if screen is not None:  # the parameters only: the nodes are held while screening
        size = problem.layout.size
        screen["params"] = dict(list(screen["params"].items())[:size])
    p = jnp.asarray(stage.p[:, : problem.layout.size])
    return p, summary, screen, solves


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
    setup: FitSetup,
    final: _Stage,
    *,
    shooting: dict | None,
    screen: dict | None,
    solves: int,
    start_time: float,
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
    start_notes, reached = _start_agreement(np.asarray(optimum.loss), best, screen)
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
    losses = np.asarray(optimum.loss)
    same = np.isfinite(losses) & (losses <= loss_kept(losses, best))
    equal = equal_optima_note(p_all, same, best, stats.stderr, names)
    notes = bound_notes + start_notes + ([equal] if equal else []) + stats.notes
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
        screen=screen,
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


def loss_kept(losses: np.ndarray, best: int) -> float:
    """The loss up to which a start counts as having reached the kept optimum."""
    return losses[best] + BEATEN * abs(losses[best])


def _start_agreement(losses: np.ndarray, best: int, screen: dict | None):
    """How many starts reached the kept optimum (loss within `BEATEN`, relatively), and notes:
    the given guess could not be simulated (the screen found a start that can), or the
    landscape showed several optima: only one start of many found the lowest, or start 0 (the
    given guess, or the lowest screened point) on its own stopped at a higher one."""
    lowest = losses[best]
    reached = np.isfinite(losses) & (losses <= loss_kept(losses, best))
    count, total = int(np.sum(reached)), losses.size
    notes = []
    if screen is not None and not np.isfinite(screen["loss"][0]):
        notes.append(
            "the model cannot be simulated, or gives non-finite predictions, at the given "
            "guess within the screen's step budget (max_steps / "
            f"{SCREEN_STEP_SHARE}); the fit started from the lowest of the screened points "
            "around it"
        )
    if total == 1:
        return notes, count
    first = "the given guess" if screen is None else "the lowest screened start"
    if not reached[0]:
        notes.append(
            f"{first} alone stops at a local optimum (loss {losses[0]:.6g}); "
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
