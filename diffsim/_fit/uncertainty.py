"""Uncertainty of fitted parameters: covariances, standard errors, intervals, identifiability.

At the optimum p̂ of S(p) = Σ rᵢ(p)² (residuals already divided by the noise when it is known):

- Gauss–Newton / Fisher covariance  C = s² (JᵀJ)⁻¹, J = ∂r/∂p;
- Laplace covariance                C = s² H⁻¹,     H = ∇²(S/2) (includes the curvature of r;
  computed when first asked for);
- s² = 1 when the noise is known, else S(p̂)/(n − k) (n observed values, k fitted unknowns);
- Wald intervals with q the normal quantile (noise known) or Student's t with n − k degrees of
  freedom (noise estimated): p̂ ± q·se for an unbounded unknown; for one fitted through a
  transform u = g(p) (log for one bound, logit for two), g⁻¹(û ± q·se_u) with se_u = |g'(p̂)|·se
  (the delta method), so the interval respects the bounds and is skewed as the transform is;
- identifiability: eigenvalues of the scaled information matrix (J·diag|p̂|)ᵀ(J·diag|p̂|),
  relative to the largest; a tiny one is a direction the data do not determine.
"""

import functools
import math
import statistics
from typing import NamedTuple

import numpy as np

# Relative eigenvalue of the scaled information matrix below which a direction counts as not
# identifiable: its relative standard error is then >= 1e4 times that of the best direction.
NONIDENTIFIABLE_RCOND = 1e-8


@functools.lru_cache(maxsize=256)
def quantile(level: float, dof: int | None) -> float:
    """Two-sided quantile: P(|X| <= q) = level for X normal (dof None) or Student's t."""
    z = statistics.NormalDist().inv_cdf(0.5 + level / 2)
    if dof is None:
        return z
    if dof < 1:
        return float("nan")
    nu = float(dof)

    def two_sided(x):  # P(|T| <= x) = 1 - I_{ν/(ν+x²)}(ν/2, 1/2)
        return 1.0 - _betainc(nu / 2, 0.5, nu / (nu + x * x))

    low, high = z, z
    while two_sided(high) < level:
        high *= 2.0
    for _ in range(80):
        middle = 0.5 * (low + high)
        low, high = (middle, high) if two_sided(middle) < level else (low, middle)
    return 0.5 * (low + high)


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b): the continued fraction of Numerical Recipes
    (modified Lentz), on the side where it converges fast; double precision in ~20 terms."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - _betainc(b, a, 1.0 - x)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    fraction = d
    for m in range(1, 300):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            fraction *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return math.exp(log_front) * fraction / a


def chi2_quantile_1dof(level: float) -> float:
    """The `level` quantile of χ² with one degree of freedom (the profile likelihood cut)."""
    return statistics.NormalDist().inv_cdf(0.5 + level / 2) ** 2


def inverse(matrix: np.ndarray) -> np.ndarray:
    """Inverse of a symmetric positive semi-definite matrix, through its eigenvalues, with the
    ones at round-off level raised to it: a direction the data do not determine gets a huge
    (not a silently small or negative) variance."""
    values, vectors = np.linalg.eigh(matrix)
    floor = max(values.max(), 0.0) * np.finfo(np.float64).eps * matrix.shape[0]
    values = np.maximum(values, floor) if floor > 0 else np.where(values > 0, values, np.inf)
    return (vectors / values) @ vectors.T


def correlation(covariance: np.ndarray) -> np.ndarray:
    sd = np.sqrt(np.diag(covariance))
    with np.errstate(invalid="ignore", divide="ignore"):
        return covariance / np.outer(sd, sd)


def nonidentifiable(jacobian: np.ndarray, p: np.ndarray, names) -> list[tuple[str, set]]:
    """Sentences naming the parameter combinations the data do not determine, each with the set
    of names it involves."""
    scaled = jacobian * np.where(np.abs(p) > 0, np.abs(p), 1.0)
    info = scaled.T @ scaled
    values, vectors = np.linalg.eigh(info)
    top = values.max()
    notes = []
    if not top > 0:
        return [
            (
                "the residuals do not depend on any fitted unknown: nothing is identifiable",
                set(names),
            )
        ]
    for value, vector in zip(values, vectors.T):
        if value / top >= NONIDENTIFIABLE_RCOND:
            continue
        weights = vector / np.abs(vector).max()
        involved = [(w, name) for w, name in zip(weights, names) if abs(w) >= 0.1]
        direction = " ".join(f"{w:+.2f}·{name}" for w, name in involved)
        notes.append(
            (
                "practically non-identifiable: the data do not determine the direction "
                f"{direction} (relative changes; eigenvalue {value / top:.1e} of the largest). Fix "
                "one of these parameters, or add data that separate them",
                {name for _, name in involved},
            )
        )
    return notes


def laplace_covariance(hessian, noise_variance: float) -> tuple[np.ndarray, str | None]:
    """s² H⁻¹, or NaN and the reason when H is not positive definite."""
    symmetric = 0.5 * (np.asarray(hessian, np.float64) + np.asarray(hessian, np.float64).T)
    if np.all(np.isfinite(symmetric)) and np.linalg.eigvalsh(symmetric).min() > 0:
        return noise_variance * np.linalg.inv(symmetric), None
    return np.full(symmetric.shape, np.nan), (
        "the Hessian of the loss is not positive definite at the result (not a strict "
        "minimum): the Laplace covariance is undefined"
    )


class Uncertainty(NamedTuple):
    """What `analyse` finds at a fit's result (NumPy, float64, in the order of the unknowns)."""

    covariance: np.ndarray  # (k, k) Fisher covariance s² (JᵀJ)⁻¹
    stderr: np.ndarray  # (k,) standard errors, the square roots of its diagonal
    lower: np.ndarray  # (k,) lower ends of the Wald intervals (in the transformed space where
    # the unknown is fitted through one, then mapped back)
    upper: np.ndarray  # (k,) upper ends
    correlation: np.ndarray  # (k, k)
    noise_variance: float  # s²: 1 when the noise is known, NaN without degrees of freedom
    dof: int  # observed values − unknowns
    quantile: float  # the normal or Student's t quantile of the intervals
    notes: list[str]  # identifiability and other warnings, in the order they were found


def wald_interval(p, stderr, q, kinds, lower, upper) -> tuple[np.ndarray, np.ndarray]:
    """Wald intervals of natural values `p` with standard errors `stderr`, each computed in the
    space its transform (`kinds`: "identity", "log", "upper-log", "logit") makes unbounded and
    mapped back; `lower` / `upper` the bounds (ignored where a kind does not use them)."""
    p, stderr = np.asarray(p, np.float64), np.asarray(stderr, np.float64)
    kinds = np.asarray(kinds)
    lower, upper = np.asarray(lower, np.float64), np.asarray(upper, np.float64)
    low, high = p - q * stderr, p + q * stderr
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        # one bound: u = log(p − lower) (or log(upper − p)), se_u = se / distance
        for kind, bound, sign in (("log", lower, 1.0), ("upper-log", upper, -1.0)):
            distance = sign * (p - bound)
            spread = np.exp(q * stderr / distance)
            here = kinds == kind
            ends = (bound + sign * distance / spread, bound + sign * distance * spread)
            low = np.where(here, np.minimum(*ends), low)
            high = np.where(here, np.maximum(*ends), high)
        # two bounds: u = logit(f), f = (p − lower)/(upper − lower), se_u = se / (width·f(1−f))
        width = upper - lower
        f = (p - lower) / width
        u = np.log(f) - np.log1p(-f)
        se_u = stderr / (width * f * (1 - f))
        here = kinds == "logit"
        sigmoid = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
        low = np.where(here, lower + width * sigmoid(u - q * se_u), low)
        high = np.where(here, lower + width * sigmoid(u + q * se_u), high)
    return low, high


def analyse(
    jacobian,
    p,
    *,
    loss,
    num_observed,
    noise_known,
    level,
    names,
    at_optimum=True,
    kinds=None,
    lower=None,
    upper=None,
) -> Uncertainty:
    """Fisher covariance, standard errors, intervals and identifiability notes (NumPy);
    `kinds`, `lower`, `upper` (the unknowns' transforms and bounds, default none) set the space
    each interval is computed in (`wald_interval`)."""
    jacobian = np.asarray(jacobian, np.float64)
    p = np.asarray(p, np.float64)
    k = p.shape[0]
    dof = num_observed - k
    notes = []
    if noise_known:
        s2 = 1.0
    elif dof > 0:
        s2 = float(loss) / dof
    else:
        s2 = float("nan")
        notes.append(
            f"{num_observed} observed values for {k} unknowns: no degrees of freedom are left "
            "to estimate the noise, so there are no standard errors (give the data's noise)"
        )
    fisher = s2 * inverse(jacobian.T @ jacobian)
    if not at_optimum:
        notes.append(
            "the uncertainties are evaluated at the last iterate, which is not an optimum: "
            "they describe no confidence region"
        )
    stderr = np.sqrt(np.clip(np.diag(fisher), 0, None))
    q = quantile(level, None if noise_known else dof)
    named = nonidentifiable(jacobian, p, names) if at_optimum else []
    notes += [text for text, _ in named]
    flagged = set().union(*(involved for _, involved in named))
    with np.errstate(invalid="ignore", divide="ignore"):
        relative = stderr / np.abs(p)
    for name, r in zip(names, relative):
        if at_optimum and np.isfinite(r) and r > 1 and name not in flagged:
            # a value at round-off of zero (a bound at 0 reached) makes the ratio astronomic
            share = f"{100 * r:.0f}%" if r < 1e4 else f"{r:.1e} times it"
            notes.append(
                f"{name}: its standard error exceeds its value ({share}); the data "
                "constrain it weakly (see ds.profile for a likelihood-based interval)"
            )
    if kinds is None:
        kinds, lower, upper = ("identity",) * k, np.zeros(k), np.zeros(k)
    low, high = wald_interval(p, stderr, q, kinds, lower, upper)
    return Uncertainty(
        covariance=fisher,
        stderr=stderr,
        lower=low,
        upper=high,
        correlation=correlation(fisher),
        noise_variance=s2,
        dof=dof,
        quantile=q,
        notes=notes,
    )
