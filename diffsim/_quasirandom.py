"""Quasi-random points in the unit cube: the Halton sequence, shared by `ds.Samples.halton`
(sweep designs) and the screen of `ds.fit` (where a fit starts)."""

import numpy as np


def halton_unit(n: int, dims: int, skip: int = 0) -> np.ndarray:
    """Points `skip + 1 … skip + n` of the Halton sequence in [0, 1)^dims, shape (n, dims)
    (bases 2, 3, 5, …: one prime per dimension). Deterministic and low-discrepancy; best for
    up to ~10 dimensions (higher bases correlate)."""
    index = np.arange(skip + 1, skip + n + 1)
    unit = np.empty((n, dims))
    for d, base in enumerate(_primes(dims)):
        # Radical inverse: mirror the base-`base` digits of the index around the point.
        value, factor, i = np.zeros(n), 1.0 / base, index.copy()
        while np.any(i > 0):
            value += factor * (i % base)
            i //= base
            factor /= base
        unit[:, d] = value
    return unit


def _primes(count: int) -> list[int]:
    primes, candidate = [], 2
    while len(primes) < count:
        if all(candidate % p for p in primes):
            primes.append(candidate)
        candidate += 1
    return primes
