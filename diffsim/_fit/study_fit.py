"""`ds.fit(problem)`: maximum likelihood (or, with priors, the posterior mode) of a `ds.Problem`
from one or many starts, and `ds.ProblemFit`, what it returns.

The starts: the unknowns' values, then points uniform on each unknown's scale within its
bounds (Halton, shifted at random by `key`); with `screen` more points than `starts`, the
objective is evaluated at each (one forward simulation of every experiment) and the lowest
are optimised. The optimisations run one after another (batched starts would each wait for
the slowest simulation) through one compiled program, by Levenberg–Marquardt on the
residual form of the negative log-likelihood (`study_objective`), or BFGS where a measurement
has Laplace noise (whose residual form is not smooth).

The uncertainty is the Fisher information at the optimum (the expected one for normal and
Laplace noise: Σ (∂y/∂θ)²/σ² + c (∂ log σ/∂θ)², c = 2 for normal and 1 for Laplace, plus the
priors' Hessian), on each unknown's scale: standard errors and Wald intervals there, mapped
back to natural values (a log10 unknown's interval is a factor either way).
"""

import collections
import dataclasses
import math
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._compile import jit
from .._progress import progress_bar
from .._quasirandom import halton_unit
from .._warn import warn
from . import bounded_lm, optimize as opt, study_plot
from .data import FitWarning
from .equal_optima import equal_optima_note
from .optimize import FIT_RESULTS
from .result import BEATEN
from .study import Problem, require_estimated
from .study_objective import (
    check_resolved,
    fisher_residuals,
    likelihood_and_smallest,
    natural_on_host,
    prior_hessian,
    residual_constant,
    RESIDUAL_OFFSET,
    residuals,
    residuals_and_terms,
    residuals_of_states,
    row_states,
    scaled_from_u,
    scaled_on_host,
    to_natural_values,
    to_scaled_values,
    u_from_scaled,
)

# `ds.fit(problem)`'s optimiser with its defaults; a study's profiles and refits run it too,
# so that they run the fit's compiled program (`optimize_within`)
DEFAULT_LM = opt.Optimizer("lm", 512, 1e-8, 1e-10)

# two starts reached the same optimum when their log-likelihoods differ by less than this
# (the benchmark collection's own criterion for "reached the best known value")
SAME_OPTIMUM = 0.1


@dataclasses.dataclass(frozen=True, eq=False)
class ProblemFit:
    """What `ds.fit(problem)` returns.

    - `params`: dict name → natural value of each estimated unknown (`names` order);
      `params_on_scale`: the same on each unknown's scale.
    - `llh`: the log-likelihood of every measurement at `params`; `log_posterior` with the
      log-priors (equal without priors); `nll` = −llh.
    - `stderr`: standard errors on each unknown's scale (from `covariance`, the inverse Fisher
      information there); `confidence_intervals`: name → (lower, upper) natural values, the
      Wald interval at `level` on the scale, clipped to the unknown's bounds and mapped back;
      `correlation`.
    - `converged`, `reason`: how the kept start's optimisation ended. An optimum on a bound
      counts as converged (the bounds are part of a study, as in PEtab: a constrained
      optimum), and a `FitWarning` names the unknowns there; `ds.fit(model, y0, data)`'s
      `converged` also asks that no fitted value sits on a bound.
    - `starts`: dict `llh`, `converged`, `iterations`, `params` (name → array) of every
      start, in the order of the starts (`order`: their indices, best first);
      `best_start`; `starts_reached`: how many starts came within 0.1 of the best
      log-likelihood.
    - `screen`: the screened points (`params`, `llh`) or None.
    - `model`: the model with the fitted parameters (as the problem's experiments without
      settings of their own see it); `problem`: the study.
    - `seconds`, `timings`: wall time; `compile` and `run` apart.
    """

    problem: Problem
    names: tuple[str, ...]
    params: dict
    params_on_scale: dict
    llh: float
    log_posterior: float
    stderr: dict
    covariance: np.ndarray
    correlation: np.ndarray
    confidence_intervals: dict
    level: float
    converged: bool
    reason: str
    iterations: int
    starts: dict
    best_start: int
    starts_reached: int
    screen: dict | None
    seconds: float
    timings: dict
    warnings: tuple[str, ...]

    @property
    def nll(self) -> float:
        return -self.llh

    @property
    def model(self):
        from .study_objective import simulation_model

        tables = self.problem.tables
        theta = jnp.asarray([self.params[n] for n in self.names])
        values = tables.rows.take(np.arange(1)).values(theta)[0] if len(tables.row_time) else None
        return simulation_model(self.problem, values)

    def predictions(self) -> list[dict]:
        """Per experiment: `time`, `observable`, `value` and `prediction` of every
        measurement at the fitted values (`ds.Problem.predictions`)."""
        return self.problem.predictions(self.params)

    def plot(self, *, experiments=None):
        """Measurements and fitted predictions, one panel per experiment (the first 12, or
        those named); returns the matplotlib figure (`ds.plot.fit`)."""
        return study_plot.fits(self, experiments=experiments)

    def plot_waterfall(self):
        """The starts' log-likelihoods, best first (`ds.plot.waterfall`); returns the figure."""
        return study_plot.waterfall(self, reached=SAME_OPTIMUM)

    def to_dict(self) -> dict:
        """The result as plain JSON-ready values (no problem object); every start's unknowns
        on their scales under `starts.params_on_scale`."""
        scales = self.problem.tables.scales
        natural = np.stack([np.asarray(self.starts["params"][n]) for n in self.names], axis=1)
        return _json_ready(
            dict(
                names=list(self.names),
                scales=dict(zip(self.names, scales)),
                params=self.params,
                params_on_scale=self.params_on_scale,
                llh=self.llh,
                log_posterior=self.log_posterior,
                stderr=self.stderr,
                confidence_intervals={k: list(v) for k, v in self.confidence_intervals.items()},
                level=self.level,
                covariance=np.asarray(self.covariance).tolist(),
                converged=self.converged,
                reason=self.reason,
                iterations=self.iterations,
                starts=dict(
                    llh=np.asarray(self.starts["llh"]).tolist(),
                    converged=np.asarray(self.starts["converged"]).tolist(),
                    iterations=np.asarray(self.starts["iterations"]).tolist(),
                    params_on_scale=scaled_on_host(natural, scales).tolist(),
                ),
                best_start=self.best_start,
                starts_reached=self.starts_reached,
                seconds=self.seconds,
                timings=self.timings,
                warnings=list(self.warnings),
            )
        )

    def summary(self) -> str:
        lines = [
            f"{self.problem!r}",
            f"llh {self.llh:.6g}"
            + (
                f", log posterior {self.log_posterior:.6g}"
                if self.log_posterior != self.llh
                else ""
            )
            + f"; {'converged' if self.converged else 'not converged'} ({self.reason}); "
            f"{self.starts_reached} of {len(self.starts['llh'])} starts reached it",
            f"{self.seconds:.1f} s (compile {self.timings.get('compile', 0):.1f} s, run "
            f"{self.timings.get('run', 0):.1f} s)",
        ]
        header = [
            "unknown",
            "scale",
            "value",
            "on scale",
            "stderr on scale",  # not in natural units (a log10 scale's: decades)
            f"{100 * self.level:g}% interval",
        ]
        rows = [header]
        for name in self.names:
            low, high = self.confidence_intervals[name]
            rows.append(
                [
                    name,
                    self.problem.unknowns[name].scale,
                    f"{self.params[name]:.6g}",
                    f"{self.params_on_scale[name]:.6g}",
                    f"{self.stderr[name]:.3g}",
                    f"[{low:.4g}, {high:.4g}]",
                ]
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)


def fit_problem(
    problem: Problem,
    *,
    starts=1,
    screen: int = 64,
    key=None,
    method: str | None = None,
    max_iterations: int | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    level: float = 0.95,
    progress: bool = True,
) -> ProblemFit:
    """`ds.fit(problem, ...)`: see `ds.fit`."""
    from .._validate import check_key, check_static_count

    start_time = time.perf_counter()
    if not isinstance(problem, Problem):
        raise TypeError(f"expected a ds.Problem, got {type(problem).__name__}")
    require_estimated(problem, "ds.fit")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    laplace = any(o.laplace for o in problem.observables.values())
    if method is None:
        method = "bfgs" if laplace else "lm"
    if method not in ("lm", "gauss-newton", "bfgs"):
        raise ValueError(
            f"method must be 'lm', 'gauss-newton' or 'bfgs' for a ds.Problem, got {method!r}"
        )
    if method != "bfgs" and laplace:
        raise ValueError(
            "a measurement has Laplace noise, whose least-squares form is not smooth: fit with "
            "method='bfgs' (the default for such a problem)"
        )
    if key is not None:
        check_key("key", key)
    max_iterations = (
        DEFAULT_LM.max_steps
        if max_iterations is None
        else check_static_count("max_iterations", max_iterations)
    )
    optimizer = opt.Optimizer(
        method,
        max_iterations,
        DEFAULT_LM.rtol if rtol is None else float(rtol),
        DEFAULT_LM.atol if atol is None else float(atol),
    )
    tables = problem.tables
    dtype = jnp.result_type(float)
    guess = scaled_on_host(problem.first_guess(), tables.scales)
    given = None
    if isinstance(starts, (int, np.integer)) and not isinstance(starts, bool):
        count = check_static_count("starts", int(starts))
    else:
        given = _given_starts(problem, starts, dtype)
        count = given.shape[0]
    screen = check_static_count("screen", screen, minimum=0)
    points = max(screen, count) if given is None else count
    if given is None:
        candidates = _candidates(tables, np.asarray(guess), points, key)
    else:
        candidates = given
    candidates = jnp.asarray(candidates, dtype)
    timings = dict(compile=0.0, run=0.0)
    screened = None
    if candidates.shape[0] > count:
        losses = _timed(_screen, timings, problem, candidates)
        screened = np.where(np.isfinite(losses), losses, np.inf)
        if not np.isfinite(screened).any():
            _no_likelihood_anywhere(problem, tables, np.asarray(candidates))
        chosen = candidates[np.argsort(screened, kind="stable")[:count]]
    else:
        chosen = candidates
    # one program per start, called once per start (not a scan over the starts): `starts`
    # does not change what is compiled, the bar advances as each ends, and an interrupted
    # multi-start keeps the starts that finished
    optima = []
    # the residuals and Jacobian a start ended with are kept for the best start so far only
    # (the information is computed from them): every start's would be starts × the Jacobian
    last, last_objective = None, np.inf
    bar = progress_bar(count, enabled=progress, description="starts", unit="start")
    box = Box.of_fit(problem, dtype)
    try:
        for s0 in chosen:
            optimum = optimize_within(problem, s0, box, optimizer, residual_count(problem), timings)
            ended = {k: optimum.pop(k) for k in ("residuals", "jacobian") if k in optimum}
            if ended and float(optimum["objective"]) < last_objective:  # NaN is not
                last, last_objective = (len(optima), ended), float(optimum["objective"])
            optima.append(optimum)
            bar.update(1)
    except KeyboardInterrupt:
        if not optima:
            raise
        interrupted = len(optima)
    else:
        interrupted = None
    finally:
        bar.close()
    out = {k: np.stack([o[k] for o in optima]) for k in optima[0]}
    best = int(np.argmin(np.where(np.isfinite(out["objective"]), out["objective"], np.inf)))
    out["best"] = best
    information = None
    if last is not None and last[0] == best:
        information = _information_from_last_jacobian(problem, **last[1])
    if information is None:
        information = _timed(_information, timings, problem, jnp.asarray(out["scaled"][best]))
    out["information"] = information
    out["screened"] = screened
    return _result(
        problem,
        out,
        np.asarray(candidates),
        screened is not None,
        optimizer,
        level,
        start_time,
        timings,
        interrupted=None if interrupted is None else (interrupted, count),
    )


def _timed(function, timings, *arguments):
    """Compile `function` for `arguments` ahead of time and run it, adding both times."""
    clock = time.perf_counter()
    compiled = function.lower(*arguments).compile()
    timings["compile"] += time.perf_counter() - clock
    clock = time.perf_counter()
    out = jax.device_get(compiled(*arguments))
    timings["run"] += time.perf_counter() - clock
    return out


def _json_ready(value):
    """`value` with every NaN or infinite float as None (JSON has neither)."""
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return float(value) if np.isfinite(value) else None
    return value


def _given_starts(problem: Problem, starts, dtype):
    array = np.asarray(starts, dtype=np.float64)
    k = len(problem.names)
    if array.ndim != 2 or array.shape[1] != k:
        raise ValueError(
            f"starts as an array must be (starts, {k}): natural values of {list(problem.names)}, "
            f"got shape {array.shape}"
        )
    if not np.all(np.isfinite(array)):
        raise ValueError("starts hold NaN or inf")
    tables = problem.tables
    scaled = scaled_on_host(array, tables.scales)
    inside = (scaled >= tables.lower) & (scaled <= tables.upper)
    if not np.all(inside):
        row, column = np.argwhere(~inside)[0]
        raise ValueError(
            f"starts[{row}] puts {problem.names[column]} = {array[row, column]:g} outside its "
            "bounds"
        )
    return scaled


def _candidates(tables, guess, points: int, key) -> np.ndarray:
    """The guess, then `points − 1` Halton points uniform on each unknown's scale within its
    bounds (± one unit of the scale around the guess where a bound is open), on the scale."""
    k = guess.size
    unit = halton_unit(points - 1, k) if points > 1 else np.zeros((0, k))
    if key is not None:
        shift = np.asarray(jax.random.uniform(_typed(key), (k,)))
        unit = (unit + shift[None]) % 1.0
    lower = np.where(np.isfinite(tables.lower), tables.lower, guess - 1.0)
    upper = np.where(np.isfinite(tables.upper), tables.upper, guess + 1.0)
    # strictly inside: the optimiser's coordinates are infinite on a bound
    margin = 1e-9 * (upper - lower)
    drawn = lower + margin + (upper - lower - 2 * margin) * unit
    return np.concatenate([guess[None], drawn])


def _typed(key):
    return key if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else jax.random.wrap_key_data(key)


def _scaled_residuals(problem: Problem):
    tables = problem.tables
    return lambda scaled: residuals(problem, to_natural_values(scaled, tables.scales))


def _no_likelihood_anywhere(problem: Problem, tables, candidates) -> None:
    """Raise where no screened point has a log-likelihood: every start would end where it
    began, so the reason (at the first point, the starting guess) is the user's to mend."""
    natural = natural_on_host(candidates[0], tables.scales)
    params = {n: float(natural[i]) for i, n in enumerate(problem.names)}
    why = problem.why_not_finite(params) or "the objective is not finite there"
    raise ValueError(
        f"ds.fit: none of the {len(candidates)} screened points has a log-likelihood; at the "
        f"starting guess {params}: {why}"
    )


@jit
def _screen(problem: Problem, candidates):
    """Σ r² at each candidate (rows, on the unknowns' scales): one forward simulation each."""
    residual_scaled = _scaled_residuals(problem)
    return jax.lax.map(lambda s: jnp.sum(residual_scaled(s) ** 2), candidates)


class Box(eqx.Module):
    """What a Levenberg–Marquardt run of `_optimize` is given at run time, so that a fit, a
    profile (one unknown pinned: its bounds equal) and a refit (other measured values) run
    one compiled program: the box on the unknowns' scales, the measured values (in the
    study's order of measurements) and the Levenberg steps first (`bounded_lm.minimize`)."""

    lower: jax.Array  # (unknowns,) on their scales
    upper: jax.Array  # (unknowns,)
    measured: jax.Array  # (measurements,)
    levenberg_steps: jax.Array  # integer scalar

    @classmethod
    def of_fit(cls, problem: Problem, dtype):
        """The fit's: the unknowns' bounds, the study's measurements and, where every unknown
        is on a log scale, `LEVENBERG_STEPS`."""
        tables = problem.tables
        return cls(
            jnp.asarray(tables.lower, dtype),
            jnp.asarray(tables.upper, dtype),
            jnp.asarray(tables.row_value, dtype),
            jnp.asarray(_levenberg_steps(tables), jnp.result_type(int)),
        )


# The compiled `_optimize` programs of the last few (study, settings), most recent last:
# `ds.profile` and `ds.refit` after `ds.fit` in one process run the fit's program instead of
# compiling their own (Boehm's profile of one unknown: 15.2 s before, ~6 s of it compiling).
# Bounded: a compiled program holds its study and keeps ~100s of memory mappings of XLA:CPU
# (tests/conftest.py), so an entry per study ever fitted would never be freed.
_PROGRAMS: "collections.OrderedDict[tuple, tuple]" = collections.OrderedDict()
_KEPT_PROGRAMS = 4


def residual_count(problem: Problem) -> int:
    """The length of the study's residual vector: two per measurement, one per prior."""
    priors = sum(problem.unknowns[n].prior is not None for n in problem.names)
    return 2 * len(problem.tables.row_time) + priors


def optimize_within(problem: Problem, s0, box: Box, optimizer, num_residuals: int, timings):
    """`_optimize` from `s0` within `box` (host values), compiled once per study and
    settings while it is among the last `_KEPT_PROGRAMS` used, adding its compile and run
    times to `timings`."""
    # the entry holds the study itself, so its id is not reused while the entry is kept
    key = (id(problem), optimizer, num_residuals, s0.dtype, s0.shape, box.lower.dtype)
    if key in _PROGRAMS:
        _PROGRAMS.move_to_end(key)
        compiled = _PROGRAMS[key][1]
    else:
        clock = time.perf_counter()
        compiled = _optimize.lower(problem, s0, box, optimizer, num_residuals).compile()
        timings["compile"] += time.perf_counter() - clock
        _PROGRAMS[key] = (problem, compiled)
        while len(_PROGRAMS) > _KEPT_PROGRAMS:
            _PROGRAMS.popitem(last=False)
    clock = time.perf_counter()
    optimum = jax.device_get(compiled(problem, s0, box, optimizer, num_residuals))
    timings["run"] += time.perf_counter() - clock
    return optimum


@jit
def _optimize(problem: Problem, s0, box: Box, optimizer, num_residuals: int):
    """One optimisation from `s0` (on the unknowns' scales) and the objective at its end;
    Levenberg–Marquardt within `box`, BFGS within the unknowns' bounds (a fit's only)."""
    tables = problem.tables
    residual_scaled = _scaled_residuals(problem)
    if optimizer.method == "bfgs":  # on unbounded coordinates: a logistic map onto the box

        def residual_u(u):
            return residual_scaled(scaled_from_u(u, tables))

        # strictly inside: a bound is at infinity in these coordinates
        width = jnp.asarray(
            np.where(np.isfinite(tables.upper - tables.lower), tables.upper - tables.lower, 1.0)
        )
        s0 = jnp.clip(s0, tables.lower + 1e-9 * width, tables.upper - 1e-9 * width)
        optimum = opt.optimize(residual_u, u_from_scaled(s0, tables), optimizer, num_residuals)
        scaled = scaled_from_u(optimum.u, tables)
        # optimistix's loss may lag its last iterate by a step: the likelihood at the end
        nll, prior, smallest = likelihood_and_smallest(
            problem, to_natural_values(scaled, tables.scales)
        )
    else:  # Levenberg–Marquardt within the bounds, on the scales themselves

        def residuals_and_likelihood(scaled):
            natural = to_natural_values(scaled, tables.scales)
            return residuals_and_terms(problem, natural, box.measured, forward=True)

        # the likelihood at the optimum from the pass that linearises there: another
        # simulation after the loop was one more copy of the study's solves in this program
        # (measured with the others taken out: `bounded_lm`)
        optimum = bounded_lm.minimize(
            residuals_and_likelihood,
            s0,
            box.lower,
            box.upper,
            max_steps=optimizer.max_steps,
            rtol=optimizer.rtol,
            atol=optimizer.atol,
            refine=_closed_form_refinement(problem, box.measured),
            levenberg_steps=box.levenberg_steps,
            has_aux=True,
            linearise=_linearisation(problem, box.measured),
        )
        scaled = optimum.u
        nll, prior, smallest = optimum.aux
        last = dict(residuals=optimum.residuals, jacobian=optimum.jacobian)
    return dict(
        **(last if optimizer.method != "bfgs" else {}),
        scaled=scaled,
        code=optimum.code,
        steps=optimum.steps,
        nll=nll,
        prior=prior,
        objective=nll + prior,
        smallest=smallest,
        chosen=s0,
    )


def _linearisation(problem: Problem, measured=None):
    """`linearise(scaled) -> (residuals, their Jacobian, (NLL, −log-prior, smallest))` on
    the unknowns' scales, for `bounded_lm.minimize`, where the solves need fewer tangents
    than there are unknowns; None where they need one each. Two savings, both from which
    unknowns each experiment's simulation reads (`Tables.reads`):

    - an unknown no simulation reads (a noise level, an observable's scaling or offset)
      takes no tangent through the solves: its column follows by the chain rule through the
      observation, J = ∂r/∂x (the states held) + ∂r/∂y · ∂y/∂x (Boehm's 9 unknowns: 6);
    - unknowns that no experiment reads together share a tangent (a Curtis–Powell–Reid
      colouring of the Jacobian's columns, `_colours`): each experiment's states then carry
      the derivative of the one it reads, and each column is taken back from its colour's
      tangent in the rows of the experiments that read it (Bruno's 13 unknowns, six of them
      an initial value of one condition each: 8 tangents).

    The same Jacobian as `jax.jacfwd` of the residuals to round-off, with fewer tangents
    through the solves, which are most of a fit's time."""
    tables = problem.tables
    simulated = np.nonzero(tables.simulated)[0]
    reads = tables.reads[:, simulated]  # (measurements, simulated unknowns)
    colour = _colours(reads)
    count = int(colour.max()) + 1 if len(colour) else 0
    if len(simulated) == len(problem.names) and count == len(simulated):
        return None
    seeds = np.zeros((len(simulated), count))
    seeds[np.arange(len(simulated)), colour] = 1.0

    def linearise(scaled):
        def states_of(c):
            shifted = scaled.at[simulated].add(jnp.asarray(seeds, scaled.dtype) @ c)
            states = row_states(
                problem, to_natural_values(shifted, tables.scales), scaled.dtype, forward=True
            )
            return states, states

        # (measurements, states, colours): each measurement's states carry the derivative of
        # the one unknown of a colour its simulation reads (zero where it reads none)
        by_colour, states = jax.jacfwd(states_of, has_aux=True)(jnp.zeros(count, scaled.dtype))
        d_states = jnp.where(reads[:, None, :], by_colour[..., colour], 0.0)

        def rows(x, y):
            r, terms = residuals_of_states(
                problem, to_natural_values(x, tables.scales), y, measured
            )
            return r, (r, terms)

        held, (r, terms) = jax.jacfwd(lambda x: rows(x, states), has_aux=True)(scaled)
        through = jax.vmap(
            lambda d: jax.jvp(lambda y: rows(scaled, y)[0], (states,), (d,))[1],
            in_axes=-1,
            out_axes=-1,
        )(d_states)
        return r, held.at[:, simulated].add(through), terms

    return linearise


def _colours(reads: np.ndarray) -> np.ndarray:
    """A colour per column of `reads` (rows × columns, bool) such that no row has two columns
    of one colour: greedy, the columns with the most conflicts first (Welsh–Powell). Finding
    the fewest colours is NP-hard; greedy is what sparse-Jacobian codes use (ColPack)."""
    overlap = reads.T.astype(np.int64) @ reads.astype(np.int64) > 0
    np.fill_diagonal(overlap, False)
    colour = np.full(reads.shape[1], -1)
    for column in np.argsort(-overlap.sum(axis=1), kind="stable"):
        taken = set(colour[overlap[column]].tolist())
        colour[column] = next(c for c in range(reads.shape[1] + 1) if c not in taken)
    return colour


# Where every unknown is on a log scale (a PEtab study's rates, noise levels and scalings), the
# first iterations damp them alike (`bounded_lm.minimize`). Measured on Boehm's study from
# 3 × 20 uniform starts (seeds 0, 1, 2 of `uniform_starts`): the published optimum from 7/60
# starts with MINPACK's scaling throughout (70 s of fits, 10 s a start that reached it); from
# 16/60 with 30 Levenberg steps first (116 s, 7.3 s a start that reached it; 100 steps: 5/20
# on seed 0, more time). On linear scales the units differ and MINPACK's scaling stays.
LEVENBERG_STEPS = 30


def _levenberg_steps(tables) -> int:
    return LEVENBERG_STEPS if all(scale != "lin" for scale in tables.scales) else 0


@jit
def _information(problem: Problem, scaled, measured=None):
    """The Fisher information on the unknowns' scales at `scaled` (priors' Hessian included);
    `measured` replaces the study's values (a refit's replicate)."""
    tables = problem.tables

    def fisher(scaled):
        return fisher_residuals(
            problem, to_natural_values(scaled, tables.scales), measured, forward=True
        )

    jacobian = jax.jacfwd(fisher)(scaled)
    return jacobian.T @ jacobian + prior_hessian(problem, scaled)


def last_jacobian_serves(problem: Problem) -> bool:
    """Whether Levenberg–Marquardt's last residuals and Jacobian can give the Fisher
    information (`information_from_least_squares`): no priors (their Hessian is not in
    them) and no Laplace noise (its least-squares rows have another form)."""
    return not any(problem.unknowns[n].prior is not None for n in problem.names) and not any(
        o.laplace for o in problem.observables.values()
    )


def information_from_least_squares(residuals, jacobian, rows: int, xp=np):
    """(the Fisher information, whether it is usable) at the point where Levenberg–Marquardt
    ended with `residuals` and their `jacobian` (`bounded_lm`), for a problem of `rows`
    measurements where `last_jacobian_serves`; `xp` is numpy on the host or jax.numpy
    inside a program (a refit's). Not usable where a noise level's root is clipped at 0 or
    anything is not finite: then `_information` computes it, another forward-mode pass
    through the study's solves, which took 1.8 s of a 3-experiment fit's 8.4 s of XLA
    compilation.

    Per measurement the least-squares rows are r₁ = (m − y)/σ and r₂ = √(log 2πσ² + C)
    (`residuals`), so with s = ∂log σ/∂θ = r₂ ∂r₂/∂θ the Fisher rows (`fisher_residuals`:
    ∂y/∂θ/σ with σ held, √2 ∂log σ/∂θ with y held) are ∂r₁/∂θ + r₁ s and √2 s."""
    first, second = residuals[:rows], residuals[rows : 2 * rows]
    log_sigma = second[:, None] * jacobian[rows : 2 * rows]
    fisher = xp.concatenate(
        [jacobian[:rows] + first[:, None] * log_sigma, math.sqrt(2.0) * log_sigma]
    )
    usable = xp.all(xp.isfinite(jacobian)) & xp.all(xp.isfinite(residuals)) & xp.all(second > 0)
    return fisher.T @ fisher, usable


def _information_from_last_jacobian(problem: Problem, residuals, jacobian):
    """The Fisher information at the best start's optimum from the residuals and Jacobian
    `_optimize` ended with there (`information_from_least_squares`), or None where they
    cannot give it."""
    if not last_jacobian_serves(problem):
        return None
    information, usable = information_from_least_squares(
        np.asarray(residuals, np.float64),
        np.asarray(jacobian, np.float64),
        len(problem.tables.row_time),
    )
    return information if usable else None


def _closed_form_refinement(problem: Problem, measured=None):
    """`refine(x, r, lower, upper)` for `bounded_lm` (None when the study has neither kind
    below), within the optimiser's box (a profile's pins it): each pure
    scaling unknown (`Tables.scalings`), then
    each pure noise unknown (`Tables.noise`), set to its closed-form optimum given the
    predictions. A scaling s of y = s·h: the weighted least-squares s* = Σ h m/σ² / Σ h²/σ²,
    with y = m − σ r and σ read from the residuals' log-σ roots; the residuals of its rows
    then become (m − s* h)/σ. A σ: σ² = mean((m − y)²) over its measurements, from the
    residuals (m − y)/σ: σ ← σ·√mean(r²), on its scale. `measured` replaces the study's
    values (a refit's replicates), as in the residuals."""
    tables = problem.tables
    if not (tables.noise or tables.scalings):
        return None
    rows = len(tables.row_time)
    measured = jnp.asarray(tables.row_value if measured is None else measured)

    def refine(x, r, lower, upper):
        scaled = r[:rows]
        if tables.scalings:
            # the second block holds √(log 2πσ² + C) for normal rows (study_objective)
            sigma = jnp.sqrt(jnp.exp(r[rows : 2 * rows] ** 2 - RESIDUAL_OFFSET) / (2 * jnp.pi))
            for k, mask in tables.scalings:
                x, scaled = _refine_scaling(
                    x, k, mask, scaled, sigma, measured, tables, lower, upper
                )
        for k, mask in tables.noise:
            weights = jnp.asarray(mask, x.dtype)
            mean = jnp.sum(weights * scaled**2) / float(mask.sum())
            scale = tables.scales[k]
            if scale == "log10":
                value = x[k] + 0.5 * jnp.log10(mean)
            elif scale == "log":
                value = x[k] + 0.5 * jnp.log(mean)
            else:
                value = x[k] * jnp.sqrt(mean)
            value = jnp.clip(value, lower[k], upper[k])
            x = x.at[k].set(jnp.where(jnp.isfinite(value), value, x[k]))
        return x

    return refine


def _refine_scaling(x, k, mask, scaled, sigma, measured, tables, lower, upper):
    """(x with scaling k at its weighted least-squares optimum within [lower, upper], the
    rows' new residuals at the value it takes)."""
    scale = tables.scales[k]
    natural = to_natural_values(x[k], scale)
    weights = jnp.asarray(mask, x.dtype)
    prediction = measured - sigma * scaled
    h = jnp.where(weights > 0, prediction / jnp.where(natural != 0, natural, 1.0), 0.0)
    denominator = jnp.sum(weights * h**2 / sigma**2)
    optimum = jnp.sum(weights * h * measured / sigma**2) / denominator
    representable = True if scale == "lin" else optimum > 0  # a log scale needs s > 0
    value = to_scaled_values(jnp.where(representable, optimum, natural), scale)
    value = jnp.clip(value, lower[k], upper[k])
    ok = representable & jnp.isfinite(value) & (natural != 0) & (denominator > 0)
    ok = ok & jnp.all(jnp.isfinite(sigma))
    value = jnp.where(ok, value, x[k])
    new_natural = to_natural_values(value, scale)
    new_scaled = jnp.where(weights > 0, (measured - new_natural * h) / sigma, scaled)
    return x.at[k].set(value), jnp.where(ok, new_scaled, scaled)


def _result(
    problem, out, candidates, screened, optimizer, level, start_time, timings, interrupted=None
):
    from scipy.stats import norm

    names = problem.names
    tables = problem.tables
    best = int(out["best"])
    scaled = np.asarray(out["scaled"])
    natural = natural_on_host(scaled, tables.scales)
    llh = -np.asarray(out["nll"])
    posterior = llh - np.asarray(out["prior"])
    objective = np.where(np.isfinite(posterior), posterior, -np.inf)
    order = np.argsort(-objective, kind="stable")
    reached = int(np.sum(objective >= objective[best] - SAME_OPTIMUM))
    codes = np.asarray(out["code"])
    information = np.asarray(out["information"])
    notes = []
    covariance = _inverse(information, names, notes)
    stderr_array = np.sqrt(np.maximum(np.diag(covariance), 0.0))
    scale = np.where(stderr_array > 0, stderr_array, np.nan)
    with np.errstate(invalid="ignore"):  # inf/inf of undetermined unknowns: NaN
        correlation = covariance / np.outer(scale, scale)
    z = float(norm.ppf(0.5 + level / 2))
    # within the unknowns' bounds: values the problem excludes are no part of an interval
    # (an offset held at its lower bound 0.5 had (0.44, 0.56))
    lower, upper = np.asarray(tables.lower), np.asarray(tables.upper)
    low = natural_on_host(np.clip(scaled[best] - z * stderr_array, lower, upper), tables.scales)
    high = natural_on_host(np.clip(scaled[best] + z * stderr_array, lower, upper), tables.scales)
    code = FIT_RESULTS(int(codes[best]))
    converged = code == FIT_RESULTS.converged
    # relative to the box where it is finite: an absolute margin called every unknown of a
    # study in small units (bounds (0, 1e-9)) "on a bound"
    width = tables.upper - tables.lower
    margin = 1e-6 * (1 + np.abs(scaled[best]))
    margin = np.where(np.isfinite(width), np.minimum(margin, 1e-6 * width), margin)
    touches = (np.isfinite(tables.lower) & (scaled[best] - tables.lower <= margin)) | (
        np.isfinite(tables.upper) & (tables.upper - scaled[best] <= margin)
    )
    # of equal height: within the optimiser's own spread (`BEATEN`), not the 0.1 of "reached"
    same = objective >= objective[best] - BEATEN * (1.0 + abs(objective[best]))
    equal = equal_optima_note(scaled, same, best, stderr_array, names)
    if equal:
        notes.append(equal)
    loose = _looser_than_bounds(names, stderr_array, width)
    if loose:
        notes.append(loose)
    on_bound = [n for i, n in enumerate(names) if touches[i]]
    if on_bound:
        notes.append(
            f"{on_bound} ended on a bound: the optimum may lie beyond it (widen the bounds) or "
            "the data do not determine it"
        )
    unresolved = check_resolved(problem, float(np.asarray(out["smallest"])[best]))
    if unresolved:
        notes.append(unresolved)
    if not converged:
        notes.append(f"the best start did not converge: {code.message}")
    if not np.isfinite(llh[best]):
        # the optimiser's own words ("could not be simulated") may not be the reason
        why = problem.why_not_finite({n: float(natural[best, i]) for i, n in enumerate(names)})
        if why:
            notes.append(f"no likelihood at the best start's end: {why}")
    if interrupted is not None:
        notes.append(
            f"interrupted: {interrupted[0]} of {interrupted[1]} starts finished; the result is "
            "the best of those"
        )
    screen = None
    if screened:
        losses = np.asarray(out["screened"])
        constant = residual_constant(problem)
        screen = dict(
            params={
                n: natural_on_host(candidates, tables.scales)[:, i] for i, n in enumerate(names)
            },
            llh=-(losses - constant) / 2,
        )
    result = ProblemFit(
        problem=problem,
        names=names,
        params={n: float(natural[best, i]) for i, n in enumerate(names)},
        params_on_scale={n: float(scaled[best, i]) for i, n in enumerate(names)},
        llh=float(llh[best]),
        log_posterior=float(posterior[best]),
        stderr={n: float(stderr_array[i]) for i, n in enumerate(names)},
        covariance=covariance,
        correlation=correlation,
        confidence_intervals={n: (float(low[i]), float(high[i])) for i, n in enumerate(names)},
        level=level,
        converged=bool(converged),
        reason=code.message,
        iterations=int(np.asarray(out["steps"])[best]),
        starts=dict(
            llh=llh,
            log_posterior=posterior,
            converged=codes == FIT_RESULTS.converged,
            iterations=np.asarray(out["steps"]),
            params={n: natural[:, i] for i, n in enumerate(names)},
            order=order,
        ),
        best_start=best,
        starts_reached=reached,
        screen=screen,
        seconds=time.perf_counter() - start_time,
        timings=timings,
        warnings=tuple(notes),
    )
    for note in notes:
        warn(note, FitWarning)
    return result


def _looser_than_bounds(names, stderr, width) -> str | None:
    """The note for unknowns whose (finite) standard error exceeds the whole width of their
    bounds on their scale: the data barely see them there, which at a "converged" optimum
    usually means a plateau (a rate so fast that what it drives is gone before the first
    measurement), not a determined value."""
    loose = [
        f"{name} ({error:.3g} against {span:.3g})"
        for name, error, span in zip(names, stderr, width)
        if np.isfinite(error) and np.isfinite(span) and error > span
    ]
    if not loose:
        return None
    return (
        f"the standard errors of {', '.join(loose)} on their scales exceed the width of their "
        "bounds: the data barely determine them here, which may be a plateau away from the "
        "optimum; fit from more starts (e.g. starts=20) and compare"
    )


def _inverse(information, names, notes):
    """The covariance, the inverse Fisher information; NaN rows and columns, with a note, for
    directions the data do not determine (a singular information)."""
    k = len(names)
    if not np.all(np.isfinite(information)):
        notes.append("the Fisher information is not finite at the optimum: no standard errors")
        return np.full((k, k), np.nan)
    # singularity judged on the information scaled to a unit diagonal (its correlation form):
    # unknowns of very different magnitudes (an amount in mol/L, 1e-10, beside a rate on a
    # log10 scale) put its raw eigenvalues 1e19 apart, and a determined rate was called
    # singular, its standard error infinite and the amount's made conditional on it
    diagonal = np.sqrt(np.clip(np.diag(information), 0.0, None))
    d = np.where(diagonal > 0, diagonal, 1.0)
    scaled = information / np.outer(d, d)
    values, vectors = np.linalg.eigh(scaled)
    tiny = max(values.max(), 0.0) * 1e-12 * k
    if np.any(values <= tiny):
        weak = vectors[:, np.argmin(values)]
        involved = [names[i] for i in np.argsort(-np.abs(weak))[:3] if abs(weak[i]) > 0.1]
        notes.append(
            f"the data do not determine every unknown (the Fisher information is singular, "
            f"along {involved}): their standard errors are infinite"
        )
        covariance = np.linalg.pinv(scaled) / np.outer(d, d)
        unidentified = np.abs(vectors[:, values <= tiny]).max(axis=1) > 0.1
        covariance[unidentified, :] = np.inf
        covariance[:, unidentified] = np.inf
        return covariance
    return (vectors @ np.diag(1.0 / values) @ vectors.T) / np.outer(d, d)
