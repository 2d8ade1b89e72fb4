"""`ds.profile` and `ds.refit` of a study (`ds.ProblemFit`): the profile likelihood of one
unknown (every other unknown refitted within its bounds at each value, one compiled program),
and the same fit repeated on replicate datasets of the study's measurements (bootstrap,
calibration of intervals)."""

import jax
import jax.numpy as jnp
import numpy as np

from .._validate import check_real, check_static_count
from . import bounded_lm
from .optimize import FIT_RESULTS
from .profile import _crossing, Profile, profile as _profile_of_fit
from .refit import FitBatch, refit as _refit_of_fit
from .study_fit import (
    _closed_form_refinement,
    _information,
    _inverse,
    information_from_least_squares,
    last_jacobian_serves,
    ProblemFit,
)
from .study_objective import (
    natural_on_host,
    residuals_and_terms,
    scaled_on_host,
    to_natural_values,
)
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
    fixed at each of `points` values (each starting from the best fit, in one compiled
    program).

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
    """Fit `result`'s problem again to each dataset in `values`, all in one compiled program.

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
    out = jax.device_get(_profile(problem, jnp.asarray(best, dtype), jnp.asarray(grid, dtype), j))
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


def _fit_within(problem, start, lower, upper, measured=None):
    """Levenberg–Marquardt within (lower, upper) from `start` (on the scales), with the noise
    levels in closed form, as `ds.fit(problem)` runs it; the `Optimum`'s `aux` is (NLL,
    −log-prior, `smallest_logged`) at its end (`residuals_and_terms`)."""
    tables = problem.tables

    def residual_scaled(scaled):
        return residuals_and_terms(problem, to_natural_values(scaled, tables.scales), measured)

    return bounded_lm.minimize(
        residual_scaled,
        start,
        lower,
        upper,
        max_steps=512,
        rtol=1e-8,
        atol=1e-10,
        refine=_closed_form_refinement(problem, measured),
        has_aux=True,
    )


def _profile_body(problem, best, grid, j):
    tables = problem.tables

    def one(value):
        lower = jnp.asarray(tables.lower, best.dtype).at[j].set(value)
        upper = jnp.asarray(tables.upper, best.dtype).at[j].set(value)
        optimum = _fit_within(problem, best.at[j].set(value), lower, upper)
        nll, prior, _ = optimum.aux
        return dict(nll=nll, prior=prior, code=optimum.code)

    return jax.lax.map(one, grid)


_profile = jax.jit(_profile_body, static_argnums=(0, 3))


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
    out = jax.device_get(_refit(problem, jnp.asarray(first, dtype), jnp.asarray(values, dtype)))
    scaled = np.asarray(out["scaled"])
    z = float(norm.ppf(0.5 + result.level / 2))
    stderr = np.full(scaled.shape, np.nan)
    for r, information in enumerate(np.asarray(out["information"])):
        if not out["usable"][r]:  # priors, Laplace noise, a clipped noise root: its own pass
            information = _information(
                problem, jnp.asarray(scaled[r], dtype), jnp.asarray(values[r], dtype)
            )
        covariance = _inverse(np.asarray(information), names, [])
        stderr[r] = np.sqrt(np.maximum(np.diag(covariance), 0.0))
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


def _refit_body(problem, first, values):
    """Each replicate's fit and its Fisher information from the Jacobian its fit ended with
    (`information_from_least_squares`: no third pass through the study's solves in this
    program), where that can give it; `usable` marks the replicates whose information
    `refit_problem` computes by `_information` instead."""
    tables = problem.tables
    rows = len(tables.row_time)
    serves = last_jacobian_serves(problem)

    def one(measured):
        optimum = _fit_within(problem, first, tables.lower, tables.upper, measured)
        if serves:
            information, usable = information_from_least_squares(
                optimum.residuals, optimum.jacobian, rows, jnp
            )
        else:
            information = jnp.zeros((len(first), len(first)), first.dtype)
            usable = jnp.asarray(False)
        nll = optimum.aux[0]
        return dict(
            scaled=optimum.u, nll=nll, code=optimum.code, information=information, usable=usable
        )

    return jax.lax.map(one, values)


_refit = jax.jit(_refit_body, static_argnums=(0,))
