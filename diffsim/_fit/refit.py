"""`ds.refit`: the same fit on many datasets at once (replicates, bootstrap, calibration)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from .._compile import jit
from .._validate import check_real
from . import optimize as opt
from .optimize import FIT_RESULTS
from .result import FitResult
from .uncertainty import quantile, wald_interval


@dataclasses.dataclass(frozen=True)
class FitBatch:
    """Fits of one problem to a batch of datasets; every array has a leading `replicates` axis.

    - `params`, `stderr`: dict name → array; `intervals`: dict name → array (replicates, 2) of
      Wald intervals at `level` (in the transformed space of bounded unknowns, mapped back);
      `converged`, `loss`: per replicate.
    """

    names: tuple[str, ...]
    params: dict
    stderr: dict
    intervals: dict
    converged: np.ndarray
    loss: np.ndarray
    level: float

    def coverage(self, truth: dict) -> dict:
        """Fraction of the converged replicates whose interval holds `truth[name]`."""
        ok = self.converged
        out = {}
        for name, value in truth.items():
            if name not in self.intervals:
                raise ValueError(f"{name!r} is not fitted; fitted: {list(self.names)}")
            check_real(f"truth[{name!r}]", value)
            low, high = self.intervals[name][ok, 0], self.intervals[name][ok, 1]
            out[name] = float(np.mean((low <= value) & (value <= high)))
        return out


def refit(result: FitResult, values, *, start: str = "guess") -> FitBatch:
    """Fit `result`'s problem again to each dataset in `values`, all under one `vmap`.

    **Arguments:**

    - `result`: a `ds.FitResult`: its model, unknowns, bounds, solver, times, noise or weights
      and method are reused.
    - `values`: shape `(replicates, *result.data.values.shape)`: data at the same times (NaN
      marks a missing value).
    - `start`: `"guess"` starts every replicate from the original initial guess (an honest
      repeat of the whole fit), `"fit"` from `result`'s optimum (faster, e.g. for a bootstrap).

    **Returns:** a `ds.FitBatch` with per-replicate values, standard errors and intervals.
    Multiple shooting and multiple starts are not repeated: each replicate is refined by
    single shooting from its start.
    """
    if not isinstance(result, FitResult):
        raise TypeError(
            f"refit takes the ds.FitResult (or ds.ProblemFit) of ds.fit, got "
            f"{type(result).__name__}: fit first (result = ds.fit(problem)), then "
            f"ds.refit(result, ...)"
        )
    problem = result._problem
    shape = result.data.values.shape
    values = np.asarray(values)
    if values.dtype.kind not in "iuf":
        raise TypeError(f"values must be real numbers, got an array of dtype {values.dtype}")
    values = values.astype(np.float64)
    if values.ndim != len(shape) + 1 or values.shape[1:] != shape:
        raise ValueError(
            f"values must have shape (replicates, *{shape}) (one dataset like the fitted one "
            f"per replicate), got {values.shape}"
        )
    if start not in ("guess", "fit"):
        raise ValueError(f"start must be 'guess' or 'fit', got {start!r}")
    flat = values.reshape(values.shape[0], *problem.values.shape)
    missing = np.isnan(flat)
    if np.any(np.isinf(flat)):
        raise ValueError("values hold inf; mark missing values with NaN instead")
    empty = np.flatnonzero(missing.reshape(missing.shape[0], -1).all(axis=1))
    if empty.size:
        raise ValueError(
            f"replicate(s) {empty[:8].tolist()} hold no values (all NaN): there is nothing to fit"
        )
    if result.log_loss and np.any(flat[~missing] <= 0):
        raise ValueError("loss='log' needs positive data, but some values are <= 0")
    dtype = problem.y0.dtype
    # the replicate's own missing values decide what counts (not the original data's)
    base = np.asarray(result._settings.base_scale).reshape(problem.values.shape)
    scale_np = np.where(missing, 0.0, base[None])
    scale = jnp.asarray(scale_np, dtype)
    data = jnp.asarray(np.where(missing, 1.0, flat), dtype)
    if start == "guess":
        p0 = result._settings.guess
    else:
        p0 = jnp.asarray(np.array([result.params[n] for n in result.names]), dtype)
    optimizer = result._settings.optimizer
    p, loss, code, jacobians = _refit_run(problem, data, scale, p0, optimizer)
    counts = np.sum(scale_np > 0, axis=tuple(range(1, missing.ndim)))
    # float64 for the algebra and the intervals (a float32 fit's log-scale interval overflowed
    # float32 on the way: "overflow encountered in cast" for each replicate)
    fitted = np.asarray(p)  # the replicates' values, in the fit's own dtype
    p, loss = np.asarray(p, np.float64), np.asarray(loss, np.float64)
    jacobians = np.asarray(jacobians, np.float64)
    stderr = np.full_like(p, np.nan)
    noise_known = result._settings.noise_known
    lower, upper = np.full_like(p, np.nan), np.full_like(p, np.nan)
    kinds = problem.layout.kinds
    for r in range(p.shape[0]):  # small k x k algebra per replicate, in float64
        dof = int(counts[r]) - p.shape[1]
        s2 = 1.0 if noise_known else (loss[r] / dof if dof > 0 else np.nan)
        information = jacobians[r].T @ jacobians[r]
        with np.errstate(invalid="ignore"):
            stderr[r] = np.sqrt(s2 * np.diag(np.linalg.pinv(information)))
        q = quantile(result.level, None if noise_known else dof)
        lower[r], upper[r] = wald_interval(
            p[r], stderr[r], q, kinds, np.asarray(problem.lower), np.asarray(problem.upper)
        )
    names = result.names
    return FitBatch(
        names=names,
        params={n: fitted[:, i] for i, n in enumerate(names)},
        stderr={n: stderr[:, i] for i, n in enumerate(names)},
        intervals={n: np.stack([lower[:, i], upper[:, i]], 1) for i, n in enumerate(names)},
        converged=np.asarray(code) == FIT_RESULTS.converged,
        loss=loss,
        level=result.level,
    )


@jit
def _refit_run(problem, data, scale, p0, optimizer):
    """Every replicate's fit and its Jacobian at the optimum, from the natural start `p0`, in
    one program."""
    u0 = problem.unconstrained(p0)

    def one(values, scale):
        replicate = dataclasses.replace(problem, values=values, scale=scale)
        residuals = lambda u: replicate.residuals(replicate.natural(u))  # noqa: E731
        optimum = opt.optimize(residuals, u0, optimizer, replicate.num_residuals)
        p = replicate.natural(optimum.u)
        jacobian, r = jax.jacfwd(
            lambda q: (lambda y: (y, y))(replicate.residuals(q)), has_aux=True
        )(p)
        return p, jnp.sum(r**2), optimum.code, jacobian

    return jax.vmap(one)(data, scale)
