"""The observation models of `ds.sample`: how data scatter around the model's predictions.

Each family is a numpyro distribution with the prediction as its location or mean; the
likelihood's own parameter (`sigma`, `phi`) is an unknown with its own prior. Values that are
missing (NaN) do not count; a prediction outside the family's domain (a non-positive mean for
a log-normal or count family) makes the log density −inf, which the sampler rejects.
"""

import numpy as np

# family -> the name of its own parameter (None: it has none)
FAMILIES = {"normal": "sigma", "lognormal": "sigma", "poisson": None, "negative_binomial": "phi"}


def check_family(likelihood: str, values: np.ndarray) -> str | None:
    """The family's parameter name, after checking the data fit its support."""
    if likelihood not in FAMILIES:
        raise ValueError(f"likelihood must be one of {tuple(FAMILIES)}, got {likelihood!r}")
    observed = values[~np.isnan(values)]
    if likelihood == "lognormal" and np.any(observed <= 0):
        raise ValueError("likelihood='lognormal' needs positive data, but some values are <= 0")
    if likelihood in ("poisson", "negative_binomial"):
        if np.any(observed < 0) or np.any(observed != np.round(observed)):
            raise ValueError(
                f"likelihood={likelihood!r} is a count model: the data must be non-negative "
                "integers (counts), but some values are not"
            )
    return FAMILIES[likelihood]


def log_likelihood(likelihood: str, values, observed, predictions, extra):
    """Sum of log p(values | predictions, extra) over the observed entries.

    `values`, `observed` (bool) and `predictions` have shape (times, observables); `extra` is
    the family's parameter, shape (observables,) (broadcast from one shared value), or None."""
    import jax.numpy as jnp
    import numpyro.distributions as dist

    positive = predictions > 0
    mean = jnp.where(positive, predictions, 1.0)
    if likelihood == "normal":
        terms = dist.Normal(predictions, extra).log_prob(values)
        valid = jnp.isfinite(predictions)
    elif likelihood == "lognormal":
        terms = dist.LogNormal(jnp.log(mean), extra).log_prob(values)
        valid = positive
    elif likelihood == "poisson":
        terms = dist.Poisson(mean).log_prob(values)
        valid = positive
    else:  # negative binomial with mean μ and variance μ + μ²/φ
        terms = dist.NegativeBinomial2(mean, extra).log_prob(values)
        valid = positive
    terms = jnp.where(valid, terms, -jnp.inf)
    return jnp.sum(jnp.where(observed, terms, 0.0))


def generator(key_data) -> np.random.Generator:
    """numpy's generator seeded by a JAX PRNG key's data (`jax.random.key_data`): the host's
    draws (`draw`) follow the key a caller passed."""
    return np.random.default_rng(np.asarray(key_data, np.uint32).ravel())


def draw(likelihood: str, rng: np.random.Generator, predictions, extra) -> np.ndarray:
    """Replicated data (the posterior predictive) around `predictions`, drawn on the host.

    `predictions`: (draws, times, observables); `extra`: the family's parameter of each draw,
    (draws,) or (draws, observables), or None. A prediction outside the family's domain (a
    non-positive mean of a log-normal or count family, NaN) gives NaN. On the host because
    the draws only post-process the sampler's output: inside the sampling program the
    random draws (threefry and an inverse error function per family) compiled in ~1 s of the
    lynx–hare posterior's ~12 s, for a few milliseconds of work."""
    predictions = np.asarray(predictions, float)
    n = predictions.shape[0]
    if extra is not None:
        extra = np.asarray(extra, float).reshape(n, *([1] * (predictions.ndim - 2)), -1)
    valid = np.isfinite(predictions) if likelihood == "normal" else predictions > 0
    mean = np.where(valid, predictions, 1.0)
    if likelihood == "normal":
        drawn = rng.normal(mean, extra * np.ones_like(mean))
    elif likelihood == "lognormal":
        drawn = rng.lognormal(np.log(mean), extra * np.ones_like(mean))
    elif likelihood == "poisson":
        drawn = rng.poisson(mean).astype(float)
    else:  # negative binomial with mean μ and variance μ + μ²/φ: Poisson of a Gamma(φ, μ/φ)
        phi = extra * np.ones_like(mean)
        drawn = rng.poisson(rng.gamma(phi, mean / phi)).astype(float)
    return np.where(valid, drawn, np.nan)


def initial_extra(likelihood: str, values, predictions, residuals, size: int) -> np.ndarray:
    """A start for the family's parameter from a least-squares fit: the residuals' spread per
    observable (sigma), or the moment estimate of the dispersion φ = μ²/(var − μ) (phi)."""
    values = np.asarray(values, float)
    observed = ~np.isnan(values)
    columns = values.shape[1]
    if likelihood in ("normal", "lognormal"):
        spread = np.sqrt(np.nanmean(np.where(observed, residuals, np.nan) ** 2, axis=0))
        spread = np.where(np.isfinite(spread) & (spread > 0), spread, 1.0)
        return spread if size == columns else np.full(size, np.sqrt(np.mean(spread**2)))
    mu = np.asarray(predictions, float)
    excess = np.where(observed, (values - mu) ** 2 - mu, np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        phi = np.nansum(np.where(observed, mu**2, 0.0), axis=0) / np.nansum(excess, axis=0)
    phi = np.where(np.isfinite(phi) & (phi > 0), phi, 10.0)
    phi = np.clip(phi, 0.1, 1e4)
    return phi if size == columns else np.full(size, float(np.exp(np.mean(np.log(phi)))))
