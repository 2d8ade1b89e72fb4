"""`ds.sample`: the posterior distribution of a model's parameters and initial states given data,
by the No-U-Turn sampler through `simulate`.

The problem is described as for `ds.fit` (the same data forms, `observe`, events, unknowns
named as the fit names them) and built by the same setup; priors are numpyro distributions,
the sampler is blackjax's NUTS with its window adaptation (Stan's), and the diagnostics are
numpyro's. What is written here is only the glue: the log density in unconstrained
coordinates, the start from a fit, and every chain of warm-up and sampling as one vmapped
compiled program.
"""

import dataclasses
import time
import warnings
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._compile import jit
from .._model import AbstractODE
from .._provenance import module_text
from .._solver.adaptive import Tsit5
from .._solver.base import AbstractSolver
from .._validate import check_key, check_real, check_static_count
from .._warn import warn
from . import likelihood as lik, nuts, priors as prior_tools
from .data import as_data, FitWarning
from .fit import fit as run_fit
from .libraries import third_party_promotion
from .posterior import Posterior, PosteriorSettings
from .problem import BOTH, LOWER, Problem, UPPER
from .result import FitResult
from .setup import assemble, FitSpec
from .study import Problem as StudyProblem
from .study_sample import sample_problem

# The solver when none is given: the integration error then lies far below any noise a
# posterior can resolve (relative 1e-6 against noise of a percent or more), at a third of the
# steps of ds.fit's default 1e-8 (NUTS takes ~10^4–10^5 gradients per chain)
DEFAULT_RTOL = 1e-6
# Replicated data are kept for at most this many values (draws × times × observables); beyond
# it the draws are thinned for the posterior predictive
PREDICTIVE_VALUES = 5_000_000


def sample(
    model: AbstractODE,
    y0=None,
    data=None,
    *,
    params=None,
    initial_state=False,
    priors: dict | None = None,
    likelihood: str = "normal",
    observe=None,
    solver: AbstractSolver | None = None,
    dt: float | None = None,
    events=None,
    t0: float | None = None,
    chains: int = 4,
    draws: int = 1000,
    warmup: int = 1000,
    key=None,
    start: FitResult | None = None,
    target_accept: float = 0.8,
    dense_mass: bool = True,
    max_steps: int = 4096,
) -> Posterior:
    """Sample the posterior of parameters and/or initial-state components of `model` given
    `data`, with the No-U-Turn sampler (NUTS) through `ds.simulate`.

    **Arguments** (as for `ds.fit` where the names agree):

    - `model`, `y0`, `data`, `params`, `initial_state`, `observe`, `solver`, `dt`, `events`,
      `t0`: the problem, exactly as `ds.fit` takes it. The default solver is
      `ds.Tsit5(rtol=1e-6, atol=1e-6)`.
    - `max_steps`: an adaptive solve that needs more steps fails, and its proposal counts as
      a divergence (default 4096, as diffrax's: early warm-up proposals can be wild, and a
      solve allowed 100,000 steps there made the lynx–hare posterior 14x slower).
    - `priors`: dict name → numpyro distribution for every unknown, named as `ds.fit` names it
      (`"alpha"`, `"y0[prey]"`; a vector parameter by its field name with a scalar prior for
      each entry or one of its shape), and for the likelihood's own parameter: `"sigma"` for
      `"normal"` / `"lognormal"`, `"phi"` for `"negative_binomial"`. A prior on `"sigma"` (or
      `"phi"`) of shape `(k,)`, k the observables, gives one per observable; a scalar prior one
      shared value. Each prior's support must lie in its unknown's domain (a positive rate needs
      a positive prior, e.g. `TruncatedNormal(1.0, 0.5, low=0.0)` or `LogNormal`).
    - `likelihood`: how the data scatter around the model's observables μ: `"normal"` (N(μ,
      σ)), `"lognormal"` (log y ~ N(log μ, σ)), `"poisson"` (counts of mean μ) or
      `"negative_binomial"` (counts of mean μ and variance μ + μ²/φ). Missing values (NaN)
      do not count.
    - `chains`, `draws`, `warmup`: NUTS chains (run together, vmapped, in one compiled
      program), draws kept per chain, and warm-up iterations per chain (Stan's window
      adaptation of the step size and the mass matrix).
    - `key`: a `jax.random.key` (required: the draws are random).
    - `start`: a `ds.FitResult` of this problem to start from; by default `ds.fit` runs first
      (its screen included) and the chains start around its optimum, spread by its standard
      errors.
    - `target_accept`: the acceptance rate the step size adapts to (raise it, e.g. to 0.95,
      when there are divergences).
    - `dense_mass`: adapt a dense mass matrix (default; parameters of ODE models are often
      strongly correlated, and a dense metric then takes far fewer leapfrog steps per draw)
      or a diagonal one.

    **Returns:** a `ds.Posterior`: `samples[name]` of shape `(chains, draws, *shape)`,
    `summary()`, `to_arviz()`, `predict(ts)`, `plot()`, `save(path)`.

    Divergent transitions (a proposal whose simulation fails counts as one) are counted per
    chain and warned about, with split R-hat above 1.01; nothing is dropped.

    **A study**: `ds.sample(problem, chains=, draws=, warmup=, key=, start=, target_accept=,
    dense_mass=)` samples a `ds.Problem`'s estimated unknowns with its own likelihood and
    priors (each `ds.Unknown`'s `prior`, or flat on its scale within its bounds), started
    around `ds.fit(problem)` (or `start=`, its `ds.ProblemFit`).
    """
    if isinstance(model, StudyProblem):
        given = dict(
            y0=y0,
            data=data,
            params=params,
            observe=observe,
            solver=solver,
            dt=dt,
            events=events,
            t0=t0,
        )
        extra = sorted(k for k, v in given.items() if v is not None)
        if extra or priors is not None or initial_state is not False or likelihood != "normal":
            raise TypeError(
                "ds.sample(problem) takes its data, likelihood and priors from the problem; "
                f"{extra or 'priors/likelihood/initial_state'} apply to ds.sample(model, y0, "
                "data) only"
            )
        return sample_problem(
            model,
            chains=chains,
            draws=draws,
            warmup=warmup,
            key=key,
            start=start,
            target_accept=target_accept,
            dense_mass=dense_mass,
        )
    if y0 is None or data is None:
        raise TypeError("ds.sample(model, y0, data, ...) needs y0 and data (or a ds.Problem)")
    start_time = time.perf_counter()
    if key is None:
        raise ValueError(
            "ds.sample needs key=jax.random.key(seed): the draws are random, and an explicit "
            "key makes them reproducible"
        )
    check_key("key", key)
    chains = check_static_count("chains", chains)
    draws = check_static_count("draws", draws)
    warmup = check_static_count("warmup", warmup, minimum=0)
    if not 0 < check_real("target_accept", target_accept) < 1:
        raise ValueError(f"target_accept must be in (0, 1), got {target_accept}")
    if not isinstance(dense_mass, (bool, np.bool_)):
        raise TypeError(f"dense_mass must be True or False, got {dense_mass!r}")
    parsed = as_data(data, None, None)
    values = parsed.values.reshape(len(parsed.ts), -1)
    extra_name = lik.check_family(likelihood, values)
    if solver is None:
        solver = Tsit5(rtol=DEFAULT_RTOL, atol=DEFAULT_RTOL)
    spec = FitSpec(
        model=model,
        y0=y0,
        data=parsed,
        params=params,
        initial_state=initial_state,
        observe=observe,
        solver=solver,
        dt=dt,
        method="lm",
        loss="log" if likelihood == "lognormal" else "squared",
        segments=1,
        starts=1,
        screen=0,
        horizon=1,
        bounds=None,
        noise=None,
        weights=None,
        t0=t0,
        key=None,
        max_iterations=None,
        rtol=None,
        atol=None,
        continuity_weight=10.0,
        level=0.95,
        max_steps=max_steps,
        events=events,
    )
    setup = assemble(spec)
    problem = setup.problem
    if not isinstance(priors, dict):
        raise TypeError(
            f"priors must be a dict name -> numpyro distribution, got {type(priors).__name__}"
        )
    entries, groups, extra_count = _entries(problem, parsed, extra_name, priors, values.shape[1])
    lower, upper = _domains(problem, extra_count)
    blocks, distributions = prior_tools.blocks_for(priors, entries, groups)
    prior_tools.check_supports(blocks, distributions, lower, upper)
    clock = time.perf_counter()
    fitted = _start_fit(start, spec, problem, setup)
    timings = dict(fit=time.perf_counter() - clock)
    with third_party_promotion():
        density = _Density(
            problem=dataclasses.replace(problem, forward_only=False),
            distributions=distributions,
            observed=jnp.asarray(~np.isnan(values)),
            blocks=blocks,
            likelihood=likelihood,
            extra_count=extra_count,
        )
        theta0 = np.concatenate(
            [
                np.asarray([fitted.params[n] for n in problem.layout.names]),
                _initial_extra(likelihood, values, fitted, extra_count),
            ]
        )
        dtype = problem.y0.dtype
        key_start, key_run = jax.random.split(key)
        u0, covariance = _start(
            density,
            jnp.asarray(theta0, dtype),
            jnp.asarray(fitted.covariance, dtype),
            jnp.asarray(_extra_scale(values, extra_count), dtype),
            key_start,
        )
        thin = max(1, int(np.ceil(chains * draws * values.size / PREDICTIVE_VALUES)))
        plan = _Plan(chains, draws, warmup, float(target_accept), bool(dense_mass), thin)
        windows = jax.device_put(nuts.schedule(warmup, draws))
        # compiled ahead of the call, so that the compile and the sampling are timed apart
        clock = time.perf_counter()
        compiled = _run.lower(density, u0, covariance, windows, key_run, plan).compile()
        timings["compile"] = time.perf_counter() - clock
        clock = time.perf_counter()
        run = jax.device_get(compiled(density, u0, covariance, windows, key_run, plan))
        timings["sample"] = time.perf_counter() - clock
    if not bool(run.start_ok):
        raise ValueError(
            "the log posterior is not finite where the chains start (the fit's optimum): the "
            "priors give it zero density, or the model cannot be simulated there"
        )
    names = tuple(b.name for b in blocks)
    theta = np.asarray(run.theta)
    samples = {
        b.name: theta[:, :, b.start : b.start + b.size].reshape(chains, draws, *b.shape)
        for b in blocks
    }
    posterior = Posterior(
        samples=samples,
        names=names,
        sample_stats=dict(
            diverging=np.asarray(run.diverging),
            lp=np.asarray(run.lp),
            acceptance_rate=np.asarray(run.acceptance),
            n_steps=np.asarray(run.steps),
            step_size=np.asarray(run.step_size),
        ),
        warmup_divergences=np.asarray(run.warmup_diverging).sum(axis=1),
        predictions=np.asarray(run.predictions),
        replicated=_replicated(likelihood, run),
        data=parsed,
        likelihood=likelihood,
        t0=setup.t0,
        seconds=time.perf_counter() - start_time,
        timings=timings,
        settings=PosteriorSettings(
            chains=chains,
            draws=draws,
            warmup=warmup,
            thin=thin,
            target_accept=float(target_accept),
            dense_mass=bool(dense_mass),
            priors={b.name: prior_tools.describe(d) for b, d in zip(blocks, distributions)},
            solver=module_text(solver),
            model=type(model).__name__,
        ),
        _density=density,
    )
    for note in posterior.warnings:
        warn(note, FitWarning)
    return posterior


def _entries(problem: Problem, data, extra_name, priors, observables: int):
    """The names of the flat unknowns (the fit's, then the likelihood's parameter), the groups
    of names that cover several entries, and how many entries the likelihood's parameter has."""
    entries = list(problem.layout.names)
    groups = {}
    offset = 0
    for field, shape in problem.layout.fields:
        size = int(np.prod(shape, dtype=int))
        if shape:
            groups[field] = tuple(range(offset, offset + size))
        offset += size
    if extra_name is None:
        return tuple(entries), groups, 0
    if extra_name not in priors:
        what = "noise scale" if extra_name == "sigma" else "dispersion"
        raise ValueError(
            f"no prior for {extra_name!r}, the {what} "
            f"of the likelihood: ds.sample needs one (e.g. priors={{'{extra_name}': "
            "numpyro.distributions.LogNormal(-1.0, 1.0)})"
        )
    prior = priors[extra_name]
    full = tuple(getattr(prior, "batch_shape", ())) + tuple(getattr(prior, "event_shape", ()))
    count = int(np.prod(full, dtype=int))
    if count not in (1, observables):
        raise ValueError(
            f"priors[{extra_name!r}] has shape {full}: give a scalar prior (one {extra_name} for "
            f"every observable) or one of shape ({observables},) (one per observable)"
        )
    start = len(entries)
    if count == 1:
        entries.append(extra_name)
    else:
        labels = data.names or tuple(str(j) for j in range(observables))
        entries += [f"{extra_name}[{label}]" for label in labels]
    groups[extra_name] = tuple(range(start, start + count))
    return tuple(entries), groups, count


def _domains(problem: Problem, extra_count: int):
    """Each flat unknown's natural domain (lower, upper), ±inf where open; the likelihood's
    parameter is positive."""
    kinds = np.asarray(problem.layout.kinds)
    lower = np.where(np.isin(kinds, (LOWER, BOTH)), np.asarray(problem.lower, float), -np.inf)
    upper = np.where(np.isin(kinds, (UPPER, BOTH)), np.asarray(problem.upper, float), np.inf)
    return (
        np.concatenate([lower, np.zeros(extra_count)]),
        np.concatenate([upper, np.full(extra_count, np.inf)]),
    )


def _start_fit(start, spec: FitSpec, problem: Problem, setup) -> FitResult:
    """The fit the chains start around: the given one (checked against this problem), or a
    fresh `ds.fit` of the same problem, its screen included."""
    if start is not None:
        if not isinstance(start, FitResult):
            raise TypeError(f"start must be a ds.FitResult, got {type(start).__name__}")
        if tuple(start.names) != tuple(problem.layout.names):
            raise ValueError(
                f"start fits {list(start.names)}, but this problem's unknowns are "
                f"{list(problem.layout.names)}"
            )
        return start
    with warnings.catch_warnings():
        # the fit is only where the chains start: its notes (an estimated noise, a flat
        # direction) are the posterior's to report
        warnings.simplefilter("ignore", FitWarning)
        return run_fit(
            spec.model,
            spec.y0,
            spec.data,
            params=spec.params,
            initial_state=spec.initial_state,
            observe=spec.observe,
            solver=spec.solver,
            dt=spec.dt,
            loss=spec.loss,
            t0=spec.t0,
            max_steps=spec.max_steps,
            events=spec.events,
        )


def _extra_scale(values, count: int) -> np.ndarray:
    """The rough posterior spread of log σ (or log φ): 1/sqrt(2m) for m observed values of
    each observable (the sampling spread of a log standard deviation)."""
    if count == 0:
        return np.zeros(0)
    observed = np.sum(~np.isnan(values), axis=0) if count > 1 else np.sum(~np.isnan(values))
    return np.broadcast_to(1.0 / np.sqrt(2.0 * np.maximum(observed, 1)), (count,))


def _initial_extra(likelihood, values, fitted: FitResult, count: int) -> np.ndarray:
    if count == 0:
        return np.zeros(0)
    residuals = np.asarray(fitted.residuals).reshape(values.shape)
    predictions = np.asarray(fitted.predictions).reshape(values.shape)
    return lik.initial_extra(likelihood, values, predictions, residuals, count)


class _Density(eqx.Module):
    """The log posterior density in unconstrained coordinates (flat `u`)."""

    problem: Problem
    distributions: tuple  # numpyro distributions, one per block
    observed: jax.Array  # (times, observables) bool: the values that count
    blocks: tuple = eqx.field(static=True)
    likelihood: str = eqx.field(static=True)
    extra_count: int = eqx.field(static=True)

    def natural(self, u):
        """Natural θ (flat) and the log prior density (with the Jacobian of u → θ)."""
        maps = prior_tools.transforms(self.distributions)
        return prior_tools.log_prior(u, self.blocks, self.distributions, maps)

    def unconstrained(self, theta):
        maps = prior_tools.transforms(self.distributions)
        return prior_tools.to_unconstrained(theta, self.blocks, maps)

    def predictions(self, theta):
        """The model's observables at the data times, (times, observables). (Its gradient
        is `simulate`'s own: for a few unknowns the forward-mode Jacobian through the solve's
        loop, transposed.)"""
        model, y0, nodes = self.problem.assemble(theta[: self.problem.layout.size])
        states, _ = self.problem.states(model, y0, nodes)
        return self.problem.observed(states)

    def extra(self, theta):
        if self.extra_count == 0:
            return None
        extra = theta[self.problem.layout.size :]
        return extra if self.extra_count > 1 else extra[0]

    def __call__(self, u):
        theta, log_prior = self.natural(u)
        log_like = lik.log_likelihood(
            self.likelihood,
            self.problem.values,
            self.observed,
            self.predictions(theta),
            self.extra(theta),
        )
        total = log_prior + log_like
        return jnp.where(jnp.isfinite(total), total, -jnp.inf)


@jit
def _start(density: _Density, theta0, covariance, extra_scale, key):
    """The chains' centre in unconstrained coordinates and a covariance there: the fit's
    covariance carried through the map θ → u (J C Jᵀ, J its Jacobian), the likelihood's own
    parameter given `extra_scale` on its unconstrained scale, independent of the rest. It
    seeds the mass matrix and spreads the chains' starts, so that the warm-up begins with the
    posterior's rough shape: with an identity metric its first window takes trajectories of
    hundreds of steps through the narrow, correlated valleys of an ODE model's parameters.
    One compiled program (its pieces run eagerly would compile one small program each)."""
    u0 = density.unconstrained(theta0)
    jacobian = jax.jacfwd(density.unconstrained)(theta0)
    n, k = theta0.size, covariance.shape[0]
    full = jnp.zeros((n, n), theta0.dtype).at[:k, :k].set(covariance)
    full = full.at[jnp.arange(k, n), jnp.arange(k, n)].set(extra_scale**2)
    cov_u = jacobian @ full @ jacobian.T
    # an unidentified direction (a covariance that is not finite or not positive definite):
    # the diagonal, 0.01 where it is not usable
    usable = jnp.all(jnp.isfinite(jnp.linalg.cholesky(cov_u)))
    variance = jnp.diag(cov_u)
    fallback = jnp.diag(jnp.where(jnp.isfinite(variance) & (variance > 0), variance, 0.01))
    cov_u = jnp.where(usable, cov_u, fallback)
    # where the fit's optimum lies outside a prior's support, start from a draw of the prior
    keys = jax.random.split(key, len(density.distributions))
    drawn = jnp.concatenate(
        [jnp.ravel(d.sample(k)).astype(theta0.dtype) for d, k in zip(density.distributions, keys)]
    )
    u0 = jnp.where(jnp.isfinite(u0), u0, density.unconstrained(drawn))
    return u0, cov_u


class _Plan(NamedTuple):
    """Static settings of one sampling program."""

    chains: int
    draws: int
    warmup: int
    target_accept: float
    dense_mass: bool
    thin: int  # every thin-th draw gets replicated data


class _Run(NamedTuple):
    theta: jax.Array  # (chains, draws, unknowns) natural values
    lp: jax.Array  # (chains, draws) log posterior density (unconstrained coordinates)
    diverging: jax.Array  # (chains, draws) bool
    acceptance: jax.Array  # (chains, draws)
    steps: jax.Array  # (chains, draws) leapfrog steps
    step_size: jax.Array  # (chains,) the adapted step size
    warmup_diverging: jax.Array  # (chains, warmup) bool
    predictions: jax.Array  # (chains, kept draws, times, observables) the model's observables
    extra: jax.Array | None  # (chains × kept draws[, observables]) the likelihood's parameter
    replicate_seed: jax.Array  # the key's data, which seeds the replicated data's draws
    start_ok: jax.Array  # the chains' centre has a finite log density


# members of one batch of the posterior predictive's solves (`_run`)
_PREDICTIVE_BATCH = 64


def _replicated(likelihood: str, run: _Run) -> np.ndarray:
    """Data drawn around the predictions of `run`'s kept draws, (chains, kept, times,
    observables), from a generator seeded by the run's key."""
    predictions = np.asarray(run.predictions)
    flat = predictions.reshape(-1, *predictions.shape[2:])
    drawn = lik.draw(likelihood, lik.generator(run.replicate_seed), flat, run.extra)
    return drawn.reshape(predictions.shape).astype(predictions.dtype)


@jit
def _run(density: _Density, u0, covariance, windows, key, plan: _Plan) -> _Run:
    """Warm-up and sampling of every chain, vmapped, in one compiled program; then the
    predictions of (every `thin`-th) draw, around which `_replicated` draws data."""
    key_init, key_chains, key_replicate = jax.random.split(key, 3)
    records, step_size, start_ok = nuts.chains(
        density, u0, covariance, windows, key_init, key_chains, plan
    )
    warm = plan.warmup
    theta = jax.vmap(jax.vmap(lambda u: density.natural(u)[0]))(records.position[:, warm:])
    kept = theta[:, :: plan.thin]
    flat = kept.reshape(-1, kept.shape[-1])
    # the model's observables of each kept draw, 64 members at a time, padded to a multiple
    # of 64: lax.map vmaps a remainder batch apart, a second batched copy of the solves (the
    # lynx–hare posterior's 4,000 draws: XLA 1.4 s against 0.8 s in batches of 50; one draw
    # at a time 0.4 s, but 7x the run time). The replicated data are drawn on the host
    # (`likelihood.draw`).
    padding = -flat.shape[0] % _PREDICTIVE_BATCH
    padded = jnp.concatenate([flat, jnp.broadcast_to(flat[:1], (padding, flat.shape[1]))])
    predictions = jax.lax.map(density.predictions, padded, batch_size=_PREDICTIVE_BATCH)
    predictions = predictions[: flat.shape[0]]
    extra = jax.vmap(density.extra)(flat) if density.extra_count else None
    shape = kept.shape[:2] + predictions.shape[1:]
    return _Run(
        theta=theta,
        lp=records.logdensity[:, warm:],
        diverging=records.diverging[:, warm:],
        acceptance=records.acceptance[:, warm:],
        steps=records.steps[:, warm:],
        step_size=step_size,
        warmup_diverging=records.diverging[:, :warm],
        predictions=predictions.reshape(shape),
        extra=extra,
        replicate_seed=jax.random.key_data(key_replicate),
        start_ok=start_ok,
    )
