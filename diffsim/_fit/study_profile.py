"""`ds.profile` and `ds.refit` of a study (`ds.ProblemFit`): the profile likelihood of one
unknown (every other unknown refitted within its bounds at each value), and the same fit
repeated on replicate datasets of the study's measurements (bootstrap, calibration of
intervals); both through the program `ds.fit` compiled for the study."""

import jax.numpy as jnp
import numpy as np

from .._validate import check_real, check_static_count
from .optimize import FIT_RESULTS
from .profile import _crossing, Profile, profile as _profile_of_fit
from .refit import FitBatch, refit as _refit_of_fit
from .study_fit import (
    _information,
    _information_from_last_jacobian,
    _inverse,
    Box,
    DEFAULT_LM,
    optimize_within,
    ProblemFit,
    residual_count,
)
from .study_objective import natural_on_host, scaled_on_host
from .uncertainty import chi2_quantile_1dof


def profile(
    result,
    name: str,
    *,
    points: int = 21,
    span: float = 4.0,
    range: tuple[float, float] | None = None,
    level: float | None = None,
) -> Profile:
    """Profile likelihood of the unknown `name` of a fit: refit every other unknown with `name`
    fixed at each of `points` values (each starting from the best fit). One compiled program
    serves every unknown of the fit; for a `ds.ProblemFit` it is the fit's own (nothing is
    compiled after `ds.fit` in the same process).

    **Arguments:**

    - `result`: a `ds.FitResult` from `ds.fit(model, y0, data)`, or a `ds.ProblemFit` from
      `ds.fit(problem)` (the other unknowns then refitted within their bounds, noise levels in
      closed form, and `loss` is −2 × the log posterior).
    - `name`: one of `result.names`.
    - `points`: how many values to profile (odd counts include the estimate itself).
    - `span`: the values run over estimate ± span × standard error (on the unknown's scale for
      a study), or over `range=(low, high)` (natural values) when given; either is clipped to
      the unknown's bounds (a fit cannot leave them).
    - `level`: confidence level (default: the fit's).

    **Returns:** a `ds.Profile` with the likelihood-based `interval`.
    """
    if isinstance(result, ProblemFit):
        return profile_problem(result, name, points=points, span=span, range=range, level=level)
    return _profile_of_fit(result, name, points=points, span=span, range=range, level=level)


def refit(result, values, *, start: str = "guess") -> FitBatch:
    """Fit `result`'s problem again to each dataset in `values`: for a `ds.FitResult` all at
    once in one compiled program, for a `ds.ProblemFit` one after another through the fit's
    own program.

    **Arguments:**

    - `result`: a `ds.FitResult` (its model, unknowns, bounds, solver, times, noise or weights
      and method are reused), or a `ds.ProblemFit` (its study, with other measured values).
    - `values`: for a `ds.FitResult`, shape `(replicates, *result.data.values.shape)` (NaN marks
      a missing value); for a `ds.ProblemFit`, `(replicates, measurements)` in the study's
      order of measurements (`ds.Problem.predictions` lists them per experiment).
    - `start`: `"guess"` starts every replicate from the original initial guess (an honest
      repeat of the whole fit), `"fit"` from `result`'s optimum (faster, e.g. for a bootstrap).

    **Returns:** a `ds.FitBatch` with per-replicate values, standard errors (on each unknown's
    scale for a study) and intervals. Multiple shooting and multiple starts are not repeated.
    """
    if isinstance(result, ProblemFit):
        return refit_problem(result, values, start=start)
    return _refit_of_fit(result, values, start=start)


def profile_problem(
    result: ProblemFit, name: str, *, points: int, span: float, range, level
) -> Profile:
    """See `ds.profile`: the values run over the estimate ± `span` standard errors on the
    unknown's scale (or `range`, natural values), within its bounds; `loss` is −2 × the log
    posterior (the log-likelihood without priors), `deviance` its rise above the best."""
    if name not in result.names:
        raise ValueError(f"{name!r} is not an estimated unknown; the fit has: {list(result.names)}")
    points = check_static_count("points", points, minimum=3)
    level = result.level if level is None else check_real("level", level)
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    problem = result.problem
    tables = problem.tables
    j = result.names.index(name)
    scale = tables.scales[j]
    best = np.asarray([result.params_on_scale[n] for n in result.names])
    if range is None:
        check_real("span", span, positive=True)
        se = result.stderr[name]
        width = span * se if np.isfinite(se) and se > 0 else 1.0
        low, high = best[j] - width, best[j] + width
    else:
        if not (isinstance(range, (tuple, list)) and len(range) == 2):
            raise TypeError(f"range must be (low, high), got {range!r}")
        low, high = (check_real("range", v) for v in range)
        if not low < high:
            raise ValueError(f"range must have low < high, got {range!r}")
        low, high = scaled_on_host(np.asarray([low, high]), (scale, scale))
    low, high = max(low, tables.lower[j]), min(high, tables.upper[j])
    if not low < high:
        raise ValueError(
            f"profile of {name!r}: range {range!r} lies outside its bounds "
            f"{problem.unknowns[name].bounds}: profile within them"
        )
    grid = np.linspace(low, high, points)
    dtype = jnp.result_type(float)
    timings, box = dict(compile=0.0, run=0.0), Box.of_fit(problem, dtype)
    optima = []
    for value in grid:  # unknown j pinned at the value, from the estimate of the others
        start, lower, upper = best.copy(), tables.lower.copy(), tables.upper.copy()
        start[j] = lower[j] = upper[j] = value
        optimum = _refit(problem, start, box, dict(lower=lower, upper=upper), timings)
        optima.append({k: optimum[k] for k in ("nll", "prior", "code")})
    out = {k: np.stack([o[k] for o in optima]) for k in optima[0]}
    loss = 2 * (np.asarray(out["nll"]) + np.asarray(out["prior"]))
    reference = -2 * result.log_posterior
    minimum = min(reference, float(np.nanmin(loss)))
    deviance = loss - minimum
    threshold = chi2_quantile_1dof(level)
    values = natural_on_host(grid, (scale,) * points)
    estimate = result.params[name]
    return Profile(
        name=name,
        estimate=estimate,
        values=values,
        loss=loss,
        deviance=deviance,
        threshold=threshold,
        level=level,
        # interpolated on the unknown's scale, where the profile is closest to a parabola
        interval=tuple(
            _crossing(
                grid,
                deviance,
                best[j],
                threshold,
                direction,
                lambda v: float(natural_on_host(np.asarray([v]), (scale,))[0]),
            )
            for direction in (-1, +1)
        ),
        converged=np.asarray(out["code"]) == FIT_RESULTS.converged,
        wald=result.confidence_intervals[name],
    )


def _refit(problem, start, fit_box: Box, changes: dict, timings) -> dict:
    """Levenberg–Marquardt from `start` within the fit's `fit_box` with `changes` (host
    values of `Box` fields: `lower`, `upper`, `measured`), without Levenberg steps first (a
    profile's point starts next to its optimum; a refit as the profile's), through the fit's
    compiled program (`study_fit.optimize_within`: one compile per study and process)."""
    dtype = fit_box.lower.dtype
    box = Box(
        **{
            name: jnp.asarray(changes.get(name, getattr(fit_box, name)), dtype)
            for name in ("lower", "upper", "measured")
        },
        levenberg_steps=jnp.asarray(0, fit_box.levenberg_steps.dtype),
    )
    start = jnp.asarray(start, dtype)
    return optimize_within(problem, start, box, DEFAULT_LM, residual_count(problem), timings)


def refit_problem(result: ProblemFit, values, *, start: str) -> FitBatch:
    """See `ds.refit`: `values` (replicates, measurements) in the study's order of
    measurements (`ds.Problem.predictions` lists them per experiment); `loss` is the negative
    log-likelihood of each refit, `stderr` on each unknown's scale."""
    from scipy.stats import norm

    problem = result.problem
    tables = problem.tables
    rows = len(tables.row_time)
    values = np.asarray(values)
    if values.dtype.kind not in "iuf":
        raise TypeError(f"values must be real numbers, got an array of dtype {values.dtype}")
    values = values.astype(np.float64)
    if values.ndim != 2 or values.shape[1] != rows:
        raise ValueError(
            f"values must have shape (replicates, {rows}): one value per measurement of the "
            f"study, in its order, per replicate; got {values.shape}"
        )
    if not np.all(np.isfinite(values)):
        raise ValueError("values hold NaN or inf: a replicate needs every measurement")
    logged = np.asarray([o.log_base is not None for o in problem.observables.values()])
    if np.any(values[:, logged[tables.row_observable]] <= 0):
        raise ValueError("values of measurements with log noise must be positive")
    if start not in ("guess", "fit"):
        raise ValueError(f"start must be 'guess' or 'fit', got {start!r}")
    names = result.names
    if start == "fit":
        first = np.asarray([result.params_on_scale[n] for n in names])
    else:
        first = scaled_on_host(problem.first_guess(), tables.scales)
    dtype = jnp.result_type(float)
    timings, box = dict(compile=0.0, run=0.0), Box.of_fit(problem, dtype)
    z = float(norm.ppf(0.5 + result.level / 2))
    optima, stderr = [], np.full((len(values), len(names)), np.nan)
    for r, row in enumerate(values):
        optimum = _refit(problem, first, box, dict(measured=row), timings)
        # the information from the Jacobian the fit ended with, kept for this replicate only
        ended = {k: optimum.pop(k) for k in ("residuals", "jacobian")}
        information = _information_from_last_jacobian(problem, **ended)
        if information is None:  # priors, Laplace noise, a clipped noise root: its own pass
            information = _information(
                problem, jnp.asarray(optimum["scaled"], dtype), jnp.asarray(row, dtype)
            )
        covariance = _inverse(np.asarray(information), names, [])
        stderr[r] = np.sqrt(np.maximum(np.diag(covariance), 0.0))
        optima.append(optimum)
    out = {k: np.stack([o[k] for o in optima]) for k in optima[0]}
    scaled = out["scaled"]
    low = natural_on_host(scaled - z * stderr, tables.scales)
    high = natural_on_host(scaled + z * stderr, tables.scales)
    natural = natural_on_host(scaled, tables.scales)
    return FitBatch(
        names=names,
        params={n: natural[:, i] for i, n in enumerate(names)},
        stderr={n: stderr[:, i] for i, n in enumerate(names)},
        intervals={n: np.stack([low[:, i], high[:, i]], axis=1) for i, n in enumerate(names)},
        converged=np.asarray(out["code"]) == FIT_RESULTS.converged,
        loss=np.asarray(out["nll"]),
        level=result.level,
    )
