"""`ds.sample(problem)`: the posterior of a study's unknowns by NUTS, with its own
likelihood (every experiment, observable and noise model) and priors.

Each unknown is sampled on its scale, mapped into its bounds by a logistic (a bounded box is
all a posterior can reach, and the map keeps the sampler's coordinates unbounded): the density
is the likelihood times each unknown's prior (over its natural value; flat on its scale within
its bounds where it has none, PEtab's default), times the Jacobians of the maps. The chains
start around `ds.fit(problem)`'s optimum, spread by its Fisher covariance, which also seeds the
mass matrix; warm-up and draws of every chain run in one compiled program (`nuts.chain`).
"""

import time
import warnings
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._compile import jit
from .._provenance import module_text
from .._validate import check_key, check_real, check_static_count
from .._warn import warn
from . import nuts
from .data import FitWarning
from .libraries import third_party_promotion
from .posterior import Posterior, PosteriorSettings
from .study import Problem, require_estimated
from .study_fit import fit_problem, ProblemFit
from .study_objective import (
    negative_log_likelihood,
    scaled_from_u,
    to_natural_values,
    u_from_scaled,
)


def sample_problem(
    problem: Problem,
    *,
    chains: int = 4,
    draws: int = 1000,
    warmup: int = 1000,
    key=None,
    start: ProblemFit | None = None,
    target_accept: float = 0.8,
    dense_mass: bool = True,
) -> Posterior:
    """See `ds.sample`: the posterior of `problem`'s estimated unknowns (natural values in
    `Posterior.samples`, one array (chains, draws) per unknown)."""
    start_time = time.perf_counter()
    require_estimated(problem, "ds.sample")
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
    tables = problem.tables
    clock = time.perf_counter()
    if start is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FitWarning)  # the posterior reports its own notes
            start = fit_problem(problem)
    elif not isinstance(start, ProblemFit) or start.problem is not problem:
        raise TypeError("start must be the ds.ProblemFit of ds.fit(problem) of this problem")
    timings = dict(fit=time.perf_counter() - clock)
    dtype = jnp.result_type(float)
    scaled = np.asarray([start.params_on_scale[n] for n in problem.names])
    # strictly inside the box: a bound is at infinity in the sampler's coordinates
    width = np.where(np.isfinite(tables.upper - tables.lower), tables.upper - tables.lower, 1.0)
    scaled = np.clip(scaled, tables.lower + 1e-6 * width, tables.upper - 1e-6 * width)
    covariance = np.asarray(start.covariance)
    usable = np.all(np.isfinite(covariance)) and np.all(np.linalg.eigvalsh(covariance) > 0)
    open_ended = [
        n
        for i, n in enumerate(problem.names)
        if problem.unknowns[n].prior is None
        and not (np.isfinite(tables.lower[i]) and np.isfinite(tables.upper[i]))
    ]
    if not usable and open_ended:
        # a flat prior over an unbounded range along a direction the data do not determine
        # has no finite mass: the chains wander, and R-hat and divergences would be the only,
        # and misleading, signs
        warn(
            f"the data do not determine every unknown (the fit's Fisher information is "
            f"singular) and {open_ended} have neither both bounds nor a prior: the posterior "
            "may be improper (infinite mass along that direction) and no sampler can converge "
            "on it; give those unknowns bounds or priors",
            FitWarning,
        )
    if not usable:  # a direction the data do not determine: a diagonal of its own scale
        variance = np.where(np.isfinite(np.diag(covariance)), np.diag(covariance), 1.0)
        covariance = np.diag(np.clip(variance, 1e-8, 1.0))
    plan = _Plan(chains, draws, warmup, float(target_accept), bool(dense_mass))
    key_run = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    with third_party_promotion():
        windows = jax.device_put(nuts.schedule(warmup, draws))
        arguments = (
            _Study(problem),
            jnp.asarray(scaled, dtype),
            jnp.asarray(covariance, dtype),
            windows,
            key_run,
            plan,
        )
        clock = time.perf_counter()
        compiled = _run.lower(*arguments).compile()
        timings["compile"] = time.perf_counter() - clock
        clock = time.perf_counter()
        run = jax.device_get(compiled(*arguments))
        timings["sample"] = time.perf_counter() - clock
    if not bool(run["start_ok"]):
        raise ValueError(
            "the log posterior is not finite where the chains start (the fit's optimum): a "
            "prior gives it zero density, or the study cannot be simulated there"
        )
    natural = np.asarray(run["theta"])
    samples = {n: natural[:, :, i] for i, n in enumerate(problem.names)}
    posterior = Posterior(
        samples=samples,
        names=tuple(problem.names),
        sample_stats=dict(
            diverging=np.asarray(run["diverging"]),
            lp=np.asarray(run["lp"]),
            acceptance_rate=np.asarray(run["acceptance"]),
            n_steps=np.asarray(run["steps"]),
            step_size=np.asarray(run["step_size"]),
        ),
        warmup_divergences=np.asarray(run["warmup_diverging"]).sum(axis=1),
        predictions=None,
        replicated=None,
        data=None,
        likelihood="study",
        t0=0.0,
        seconds=time.perf_counter() - start_time,
        timings=timings,
        settings=PosteriorSettings(
            chains=chains,
            draws=draws,
            warmup=warmup,
            thin=1,
            target_accept=float(target_accept),
            dense_mass=bool(dense_mass),
            priors={n: _prior_text(problem, n) for n in problem.names},
            solver=module_text(problem.solver),
            model=type(problem.model).__name__,
        ),
    )
    for note in posterior.warnings:
        warn(note, FitWarning)
    return posterior


def _prior_text(problem: Problem, name: str) -> str:
    from .priors import describe

    unknown = problem.unknowns[name]
    if unknown.prior is not None:
        on = f" of its {unknown.scale} value" if unknown.prior_on_scale else ""
        return describe(unknown.prior) + on
    low, high = unknown.bounds
    return f"flat on its {unknown.scale} scale within ({low:g}, {high:g})"


class _Study(eqx.Module):
    """A problem as a static argument of the compiled sampler (its tables are constants)."""

    problem: Problem = eqx.field(static=True)


class _Plan(NamedTuple):
    """Static settings of one sampling program."""

    chains: int
    draws: int
    warmup: int
    target_accept: float
    dense_mass: bool


def log_posterior(problem: Problem, u):
    """The log density in the sampler's coordinates u (each unknown's scale, mapped into its
    bounds): log-likelihood + log-priors + the log-Jacobians of u → scale (→ natural value,
    for an unknown whose prior is over its natural value)."""
    tables = problem.tables
    scaled, jacobian = jax.jvp(
        lambda u: scaled_from_u(u, tables), (u,), (jnp.ones_like(u),)
    )  # an elementwise map: its Jacobian is diagonal
    theta = to_natural_values(scaled, tables.scales)
    nll, prior = negative_log_likelihood(problem, theta)
    log_jacobian = jnp.sum(jnp.log(jnp.abs(jacobian)))
    # a prior over the natural value: its density needs the Jacobian scale → natural value
    with_prior = np.asarray(
        [
            problem.unknowns[n].prior is not None and not problem.unknowns[n].prior_on_scale
            for n in problem.names
        ]
    )
    if with_prior.any():
        dx = jax.jvp(
            lambda s: to_natural_values(s, tables.scales), (scaled,), (jnp.ones_like(scaled),)
        )[1]
        log_jacobian += jnp.sum(jnp.where(with_prior, jnp.log(jnp.abs(dx)), 0.0))
    total = -nll - prior + log_jacobian
    return jnp.where(jnp.isfinite(total), total, -jnp.inf)


@jit
def _run(study: _Study, scaled0, covariance_scaled, windows, key, plan):
    problem = study.problem
    tables = problem.tables

    def density(u):
        return log_posterior(problem, u)

    u0 = u_from_scaled(scaled0, tables)
    # the fit's covariance on the scales, carried into u (dθ/du is diagonal)
    slope = jax.jvp(lambda u: scaled_from_u(u, tables), (u0,), (jnp.ones_like(u0),))[1]
    covariance = covariance_scaled / jnp.outer(slope, slope)
    key = jax.random.wrap_key_data(key)
    key_init, key_chains = jax.random.split(key)
    records, step_size, start_ok = nuts.chains(
        density, u0, covariance, windows, key_init, key_chains, plan
    )
    warm = plan.warmup
    positions = records.position[:, warm:]
    theta = jax.vmap(
        jax.vmap(lambda u: to_natural_values(scaled_from_u(u, tables), tables.scales))
    )(positions)
    return dict(
        theta=theta,
        lp=records.logdensity[:, warm:],
        diverging=records.diverging[:, warm:],
        acceptance=records.acceptance[:, warm:],
        steps=records.steps[:, warm:],
        step_size=step_size,
        warmup_diverging=records.diverging[:, :warm],
        start_ok=start_ok,
    )
