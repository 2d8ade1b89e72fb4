"""`FitResult`: what `ds.fit` returns, with its summary table, figure and JSON form."""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._warn import warn
from .data import Data, FitWarning
from .evaluate import fine_times, loss_hessian, trajectory
from .optimize import Optimizer
from .plot import fit as _plot_fit
from .problem import Problem
from .uncertainty import laplace_covariance

# Two optima whose losses differ by more than this, relatively, are different optima (the
# optimiser's own tolerances put repeated fits to one optimum within ~1e-10 of each other)
BEATEN = 1e-6


@dataclasses.dataclass(frozen=True, eq=False)
class FitSettings:
    """What a fit's later uses (`ds.profile`, `ds.refit`, the Laplace covariance, the summary)
    reuse of how it was set up."""

    optimizer: Optimizer  # the final stage's method, budget, tolerances and Jacobian mode
    guess: jax.Array  # the natural initial guess of the fitted unknowns
    base_scale: np.ndarray  # (times, observables) 1/noise or sqrt(weight) before the missing
    # values were masked: refits of new data mask their own
    noise_known: bool  # the noise was given (s² = 1), else estimated from the residuals
    log_loss: bool  # residuals are differences of logarithms


@dataclasses.dataclass(frozen=True, eq=False)
class FitResult:
    """The outcome of `ds.fit`. Every value is in natural units (the model's own).

    - `model`, `y0`: the fitted model and initial state (at `t0`), ready for `ds.simulate`.
    - `params`: dict name → fitted value of each unknown (parameters, then initial-state
      components named `y0[<state name>]`); `stderr`: their standard errors (from
      `covariance`); `confidence_intervals`: name → (lower, upper) Wald intervals at `level`,
      computed in the space each unknown is fitted in and mapped back (log or logit for a
      bounded one, so a positive rate never gets a negative end; `interval_space(name)`).
    - `covariance`: Gauss–Newton / Fisher covariance s²(JᵀJ)⁻¹, shape (k, k) in the order of
      `names`; `covariance_laplace`: s²H⁻¹ from the Hessian of the loss (computed when
      first read); `correlation`.
    - `noise_variance`: s² (1 when the noise was given, else the residual variance estimate);
      `num_observed`: the values that count (not missing, weight > 0); `dof`: that − unknowns.
    - `converged`: the optimiser met its tolerances, not on a bound, and (noise given) with a
      loss that noise explains; `status` says it in words with how many starts agreed.
      `reason`, `iterations`, `num_solves` (simulations run, all starts and
      stages), `loss` (sum of squared weighted residuals), `loss_history` (best loss after each
      iteration of the chosen start's final stage).
    - `residuals`: weighted residuals shaped like the data values (NaN where data are missing);
      `predictions`: the fitted model's observables at the data times.
    - `starts`: dict with `loss`, `converged`, `evaluations` (simulations) and `params`
      (name → array) of every start;
      `best_start`: the index kept; `starts_reached`: how many starts reached its loss
      (within 1e-6 relative). `shooting`: the multiple-shooting stage's summary or None.
    - `screen`: where the starts came from, or None without a screen: `points` (how many were
      screened), `loss` (each point's loss on the first stage's data; row 0 is the guess;
      inf where it cannot be simulated), `params` (name → array of the points), `trials`
      and `trial_loss` (the lowest points' first-stage optima).
    - `warnings`: identifiability and other notes (also issued as Python warnings).
    """

    model: Any
    y0: Any
    names: tuple[str, ...]
    params: dict
    stderr: dict
    confidence_intervals: dict
    level: float
    covariance: np.ndarray
    correlation: np.ndarray
    noise_variance: float
    dof: int
    num_observed: int
    converged: bool
    reason: str
    iterations: int
    num_solves: int
    loss: float
    loss_history: np.ndarray
    residuals: np.ndarray
    predictions: np.ndarray
    starts: dict
    best_start: int
    starts_reached: int
    shooting: dict | None
    screen: dict | None
    warnings: tuple[str, ...]
    method: str
    data: Data
    t0: float
    seconds: float
    _problem: Problem = dataclasses.field(repr=False)
    _settings: FitSettings = dataclasses.field(repr=False)
    _cache: dict = dataclasses.field(default_factory=dict, repr=False)

    @property
    def covariance_laplace(self) -> np.ndarray:
        """s² H⁻¹ with H the Hessian of half the loss at the result (second derivatives of the
        residuals included); computed on first access (it costs second-order derivatives of
        the solve). NaN, with a `ds.FitWarning`, where H is not positive definite."""
        if "laplace" not in self._cache:
            p = jnp.asarray([self.params[n] for n in self.names], self._problem.y0.dtype)
            hessian = loss_hessian(self._problem, p, self._settings.optimizer.jac)
            covariance, note = laplace_covariance(hessian, self.noise_variance)
            if note is not None:
                warn(note, FitWarning)
            self._cache["laplace"] = covariance
        return self._cache["laplace"]

    @property
    def status(self) -> str:
        """What was checked, in words: whether the optimiser converged, and how many starts
        reached the kept optimum (one start shows a local optimum only)."""
        if not self.converged:
            return f"NOT converged ({self.reason})"
        total = len(self.starts["loss"])
        if total == 1:
            if self.screen is None:
                return "converged to a local optimum (one start; starts=8 checks for lower ones)"
            points, trials = self.screen["points"], self.screen["trials"]
            chosen = f"the lowest of {points} screened points"
            if trials > 1:
                chosen = f"the best of {points} screened points and {trials} first-stage fits"
            return f"converged to a local optimum (one start, {chosen}; starts=4 checks for more)"
        lower = total - self.starts_reached
        if lower and self.best_start != 0:
            first = "the given guess" if self.screen is None else "the lowest screened start"
            return (
                f"converged; {first} alone stops higher, and {self.starts_reached} of "
                f"{total} starts reached this optimum"
            )
        return f"converged; {self.starts_reached} of {total} starts reached this optimum"

    def interval_space(self, name: str) -> str:
        """Where the Wald interval of `name` is computed: "linear" (unbounded), "log" (one
        bound: symmetric in log(p − lower) or log(upper − p)) or "logit" (two bounds)."""
        kind = self._problem.layout.kinds[self.names.index(name)]
        return {"identity": "linear", "log": "log", "upper-log": "log", "logit": "logit"}[kind]

    def summary(self) -> str:
        """A text table of the fitted values, standard errors and intervals, with the fit's
        diagnostics and warnings."""
        sigma = "given noise" if self._settings.noise_known else "noise estimated"
        lines = [
            f"fit of {type(self.model).__name__}: {self.method}, {self.status}",
            f"{self.iterations} iterations, {self.num_solves} simulations, {self.seconds:.2f} s; "
            f"loss {self.loss:.6g} on {self.num_observed} values, dof {self.dof} "
            f"({sigma}, s² = {self.noise_variance:.4g})",
        ]
        if len(self.starts["loss"]) > 1:
            ok = int(np.sum(self.starts["converged"]))
            lines.append(
                f"{len(self.starts['loss'])} starts ({ok} converged); kept start "
                f"{self.best_start}; losses {_short(self.starts['loss'])}"
            )
        if self.shooting is not None:
            lines.append(
                f"multiple shooting: {self.shooting['segments']} segments, "
                f"{self.shooting['iterations']} iterations, largest continuity defect "
                f"{self.shooting['max_defect']:.2e}, then refined by single shooting"
            )
        percent = f"{100 * self.level:g}%"
        rows = [["parameter", "value", "std. error", "rel. error", f"{percent} interval", "in"]]
        for name in self.names:
            value, se = self.params[name], self.stderr[name]
            low, high = self.confidence_intervals[name]
            relative = abs(se / value) if value != 0 else float("nan")
            rows.append(
                [
                    name,
                    f"{value:.6g}",
                    f"{se:.3g}",
                    f"{100 * relative:.2g}%",
                    f"[{low:.5g}, {high:.5g}]",
                    self.interval_space(name),
                ]
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for i, row in enumerate(rows):
            lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
            if i == 0:
                lines.append("  ".join("-" * w for w in widths))
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """The result as plain JSON-ready values (no model object)."""
        return dict(
            model=type(self.model).__name__,
            method=self.method,
            converged=self.converged,
            reason=self.reason,
            iterations=self.iterations,
            num_solves=self.num_solves,
            loss=self.loss,
            dof=self.dof,
            noise_variance=self.noise_variance,
            level=self.level,
            t0=self.t0,
            params=self.params,
            stderr=self.stderr,
            confidence_intervals={k: list(v) for k, v in self.confidence_intervals.items()},
            names=list(self.names),
            covariance=self.covariance.tolist(),
            covariance_laplace=self.covariance_laplace.tolist(),
            correlation=self.correlation.tolist(),
            y0=np.asarray(self.y0).tolist(),
            starts=dict(
                loss=np.asarray(self.starts["loss"]).tolist(),
                converged=np.asarray(self.starts["converged"]).tolist(),
            ),
            best_start=self.best_start,
            starts_reached=self.starts_reached,
            interval_space={n: self.interval_space(n) for n in self.names},
            shooting=self.shooting,
            screen=None
            if self.screen is None
            else dict(
                points=self.screen["points"],
                trials=self.screen["trials"],
                loss=[float(v) for v in self.screen["loss"]],
                trial_loss=[float(v) for v in self.screen["trial_loss"]],
            ),
            warnings=list(self.warnings),
            seconds=self.seconds,
        )

    @property
    def log_loss(self) -> bool:
        """Whether residuals are differences of logarithms (`ds.fit(..., loss="log")`)."""
        return self._settings.log_loss

    def plot(self, *, points: int = 400):
        """Data, the fitted curve and the residuals, one column per observable; returns the
        matplotlib figure (`ds.plot.fit`)."""
        return _plot_fit(self, points=points)

    def curve(self, points: int = 400) -> tuple[np.ndarray, np.ndarray]:
        """The fitted model's observables on a fine grid from t0 to the last data time:
        (times, values of shape (times, observables))."""
        problem = self._problem
        ts = fine_times(problem, points)
        fine = dataclasses.replace(
            problem,
            ts=tuple(float(t) for t in ts),
            first_observed=0,
            windows=((0, len(ts) - 1),),
            batched=False,
            steps_per_save=None,
        )
        p = jnp.asarray([self.params[n] for n in self.names], problem.y0.dtype)
        states = trajectory(fine, p)
        return ts, np.asarray(fine.observed(states))


def _short(values) -> str:
    values = np.asarray(values)
    shown = ", ".join(f"{v:.4g}" for v in values[:8])
    return f"[{shown}{', …' if values.size > 8 else ''}]"
