"""`ds.profile`: profile-likelihood confidence intervals for one fitted unknown."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from .._compile import jit
from .._validate import check_real, check_static_count
from .._warn import warn
from . import optimize as opt
from .data import FitWarning
from .optimize import FIT_RESULTS
from .result import BEATEN, FitResult
from .uncertainty import chi2_quantile_1dof


@dataclasses.dataclass(frozen=True)
class Profile:
    """The profile of one unknown: at each fixed `values[i]` every other unknown is refitted.

    - `loss`: the refitted sum of squared weighted residuals; `deviance`: −2 log of the
      likelihood ratio against the best fit (`loss − min loss` when the noise is known,
      `n log(loss / min loss)` when it is estimated, n the number of observed values).
    - `interval`: (lower, upper) where the deviance crosses `threshold` (the χ²₁ quantile at
      `level`), linearly interpolated; an end is None when the deviance stays below the
      threshold over the profiled range (the data do not bound the parameter on that side).
    - `converged`: per point, whether its refit converged.
    - `name`, `estimate` (the fitted value), `values` (the profiled grid), `level`,
      `threshold`; `wald`: the Wald interval at `level`, for comparison.
    """

    name: str
    estimate: float
    values: np.ndarray
    loss: np.ndarray
    deviance: np.ndarray
    threshold: float
    level: float
    interval: tuple[float | None, float | None]
    converged: np.ndarray
    wald: tuple[float, float]

    def plot(self, ax=None):
        """The deviance against the parameter, with the cut and both intervals; returns the
        figure."""
        import matplotlib.pyplot as plt

        if ax is None:
            fig, ax = plt.subplots(figsize=(4.5, 3.4))
        else:
            fig = ax.figure
        ax.plot(self.values, self.deviance, "o-", ms=3, label="profile")
        ax.axhline(self.threshold, color="0.5", ls="--", lw=1, label=f"χ²₁ {self.level:.0%} cut")
        for end in self.interval:
            if end is not None:
                ax.axvline(end, color="C0", lw=0.8)
        ax.axvspan(*self.wald, color="C1", alpha=0.15, label="Wald interval")
        values = np.asarray(self.values, dtype=float)
        if np.all(values > 0) and values.max() > 10 * values.min():
            ax.set_xscale("log")  # a grid over decades (an unknown on a log scale)
        ax.set_xlabel(self.name)
        ax.set_ylabel("deviance")
        ax.legend(frameon=False)
        return fig


def profile(
    result: FitResult,
    name: str,
    *,
    points: int = 21,
    span: float = 4.0,
    range: tuple[float, float] | None = None,
    level: float | None = None,
) -> Profile:
    """Profile likelihood of the unknown `name` of a fit: refit every other unknown with `name`
    fixed at each of `points` values (all at once under `vmap`, each starting from the best fit;
    one compiled program for every unknown of the fit).

    **Arguments:**

    - `result`: a `ds.FitResult` from `ds.fit`.
    - `name`: one of `result.names`.
    - `points`: how many values to profile (odd counts include the estimate itself).
    - `span`: the values run over estimate ± span × standard error, or over `range=(low, high)`
      when given; either is clipped to the unknown's bounds (a fit cannot leave them).
    - `level`: confidence level (default: the fit's).

    **Returns:** a `ds.Profile` with the likelihood-based `interval`.
    """
    if not isinstance(result, FitResult):
        raise TypeError(
            f"profile takes the ds.FitResult (or ds.ProblemFit) of ds.fit, got "
            f"{type(result).__name__}: fit first (result = ds.fit(problem)), then "
            f"ds.profile(result, ...)"
        )
    if name not in result.names:
        raise ValueError(f"{name!r} is not a fitted unknown; the fit has: {list(result.names)}")
    points = check_static_count("points", points, minimum=3)
    level = result.level if level is None else check_real("level", level)
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if range is None:
        check_real("span", span, positive=True)
    else:
        if not (isinstance(range, (tuple, list)) and len(range) == 2):
            raise TypeError(f"range must be (low, high), got {range!r}")
        low, high = (check_real("range", v) for v in range)
        if not low < high:
            raise ValueError(f"range must have low < high, got {range!r}")
    problem = result._problem
    j = result.names.index(name)
    estimate = result.params[name]
    values = _grid(result, j, points, span, range)
    dtype = problem.y0.dtype
    p_hat = jnp.asarray(np.array([result.params[n] for n in result.names]), dtype)
    grid = jnp.asarray(values, dtype)
    optimizer = result._settings.optimizer
    optimum = jax.device_get(_profile_run(problem, p_hat, grid, jnp.asarray(j), optimizer))
    loss = np.asarray(optimum.loss, np.float64)
    best = min(result.loss, float(np.nanmin(loss)))
    if best < result.loss * (1 - BEATEN):
        at = values[int(np.nanargmin(loss))]
        warn(
            f"the profile of {name} reached loss {best:.6g} at {name} = {at:.6g}, below the fit's "
            f"loss {result.loss:.6g}: the fit stopped at a local optimum. Fit again from there "
            "(or with more starts); the profile is measured against the lower loss",
            FitWarning,
        )
    n = result.num_observed
    if result._settings.noise_known:
        deviance = loss - best
    else:
        deviance = n * np.log(loss / best)
    threshold = chi2_quantile_1dof(level)
    interval = (
        _crossing(values, deviance, estimate, threshold, -1),
        _crossing(values, deviance, estimate, threshold, +1),
    )
    return Profile(
        name=name,
        estimate=estimate,
        values=values,
        loss=loss,
        deviance=deviance,
        threshold=threshold,
        level=level,
        interval=interval,
        converged=np.asarray(optimum.code) == FIT_RESULTS.converged,
        wald=result.confidence_intervals[name],
    )


def _grid(result: FitResult, j: int, points: int, span: float, range) -> np.ndarray:
    """The profiled values of unknown `j`: `range`, else the estimate ± span standard errors,
    kept strictly inside its bounds."""
    problem, estimate = result._problem, result.params[result.names[j]]
    if range is not None:
        low, high = float(range[0]), float(range[1])
        if not low < high:
            raise ValueError(f"range must be (low, high) with low < high, got {range}")
    else:
        se = result.stderr[result.names[j]]
        width = span * se if np.isfinite(se) and se > 0 else 0.5 * max(abs(estimate), 1e-12)
        low, high = estimate - width, estimate + width
    kind = problem.layout.kinds[j]
    lower, upper = float(np.asarray(problem.lower)[j]), float(np.asarray(problem.upper)[j])
    if kind in ("log", "logit"):
        low = max(low, lower + 1e-6 * (estimate - lower))
    if kind in ("upper-log", "logit"):
        high = min(high, upper - 1e-6 * (upper - estimate))
    return np.linspace(low, high, points)


@jit
def _profile_run(problem, p_hat, grid, j, optimizer):
    """Refit the other unknowns at each value of unknown `j` in `grid`, from the best fit
    `p_hat` (one program: the transforms of the start are inside it too). `j` is an input of
    the program, not a constant of it: the profile of another unknown of the fit runs the
    same program."""
    n = p_hat.shape[0]
    index = jnp.arange(n)
    others = jnp.where(index[:-1] < j, index[:-1], index[:-1] + 1)  # (n - 1,) but j
    # u from (the others, u_j): u[i] = combined[order[i]]
    order = jnp.where(index < j, index, jnp.where(index == j, n - 1, index - 1))
    fixed_u = jax.vmap(lambda v: problem.unconstrained(p_hat.at[j].set(v))[j])(grid)
    rest_u = problem.unconstrained(p_hat)[others]

    def one(u_j):
        def residuals(rest):
            u = jnp.concatenate([rest, u_j[None]])[order]
            return problem.residuals(problem.natural(u))

        return opt.optimize(residuals, rest_u, optimizer, problem.num_residuals)

    return jax.vmap(one)(fixed_u)


def _crossing(values, deviance, estimate, threshold, direction, to_natural=None):
    """Where the deviance first exceeds the threshold walking from the estimate outwards.

    Interpolated linearly in √deviance, which is linear on each side of the estimate for a
    quadratic profile: exact for a Gaussian likelihood however coarse the grid (linear in the
    deviance itself, the chord from the estimate lay above the parabola and the interval came
    out narrower: 85% too narrow on a 5-point grid over a wide range). `values` and
    `estimate` are in the coordinate to interpolate in (an unknown's scale), `to_natural`
    maps the crossing back. A crossing bracketed only by a point far beyond the threshold is
    warned about: the interval there rests on the interpolation."""
    order = np.argsort(values)
    values, deviance = values[order], deviance[order]
    side = values > estimate if direction > 0 else values < estimate
    indices = np.flatnonzero(side)
    indices = indices if direction > 0 else indices[::-1]
    previous_value, previous_root = estimate, 0.0
    target = np.sqrt(threshold)
    for i in indices:
        if np.isfinite(deviance[i]) and deviance[i] > threshold:
            root = np.sqrt(deviance[i])
            if root > 3 * target:
                warn(
                    f"the profile grid is coarse where the interval ends (the deviance jumps "
                    f"to {deviance[i]:.3g} against the threshold {threshold:.3g}): the end is "
                    "interpolated; raise points= or narrow range= for a resolved one",
                    FitWarning,
                )
            fraction = (target - previous_root) / (root - previous_root)
            crossing = previous_value + fraction * (values[i] - previous_value)
            return float(crossing if to_natural is None else to_natural(crossing))
        if np.isfinite(deviance[i]):
            previous_value, previous_root = values[i], np.sqrt(max(deviance[i], 0.0))
    return None
