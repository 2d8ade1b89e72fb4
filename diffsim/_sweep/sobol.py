"""`ds.sobol`: global sensitivity (Sobol' indices) of a scalar quantity of a simulation over
parameter ranges, from one `ds.sweep` of a Saltelli design.

The design (Saltelli 2002; estimators of Saltelli et al. 2010, Table 2): two matrices A and B of
N points each in the parameter box, from a 2d-dimensional Halton sequence, and for every
parameter i the matrix A_B^(i), A with its column i taken from B: N (d + 2) simulations, all
one sweep (chunked, sharded over devices, storable and resumable like any). With f the
quantity of each point,

    first order  S_i  = mean((f(B) − f̄) (f(A_B^(i)) − f(A))) / V     (Saltelli 2010)
    total        ST_i = mean((f(A) − f(A_B^(i)))²) / (2 V)          (Jansen 1999)

with f̄ and V the mean and variance of f over A and B together; bootstrap intervals resample
the N rows.

Why by hand: the estimators are these two lines. SALib, the standard package, is NumPy code
outside the JAX stack (its design and its analysis would add a dependency for ~40 lines), and
the simulations, the costly part, are what `ds.sweep` runs.
"""

import numpy as np

from .._quasirandom import halton_unit
from .._warn import warn
from .design import check_bootstrap, design_space, evaluate_design

# below this many base points the estimators' sampling error is of the size of the indices
# (Saltelli et al. 2010 use 512 and more; SALib warns below a power of two, not below a size)
MIN_BASE_SAMPLES = 64


def sobol(
    model,
    ranges=None,
    y0=None,
    ts=None,
    *,
    solver=None,
    reduce,
    base_samples: int = 1024,
    dt: float | None = None,
    bootstrap: int = 256,
    level: float = 0.95,
    seed: int = 0,
    chunk_size: int | None = None,
    store=None,
    progress: bool = True,
    max_steps: int = 100_000,
):
    """First-order and total Sobol' indices of a scalar quantity of the simulation over
    parameter `ranges`.

    **Arguments:**

    - `model`, `y0`, `ts`, `solver`, `dt`, `chunk_size`, `store`, `progress`, `max_steps`: as
      for `ds.sweep` (`model` an instance whose fields are varied, or a function
      `**params -> model`; names may be `"y0[i]"`).
    - `ranges`: dict name → `(low, high)`: the parameters varied, uniformly over these bounds.
    - `reduce`: a function `solution -> scalar`, the quantity whose variance is apportioned
      (e.g. `lambda sol: jnp.max(sol.ys[:, 1])` for an epidemic's peak).
    - `base_samples`: N, the points of each of the two base matrices; the sweep runs
      N (d + 2) simulations for d parameters. The indices' Monte Carlo error falls like
      1/sqrt(N): the bootstrap intervals say how large it is.
    - `bootstrap`: resamples for the intervals (0: none); `level`: their coverage.
    - `seed`: of the bootstrap's resampling (the design itself is deterministic).

    **A `ds.Problem`** in place of `model` (then no `y0`, `ts`, `solver`, `dt`, `store` or
    `max_steps`: its solves take the problem's solver and `max_steps`):
    `ranges` is None (every estimated unknown within its bounds), a list of unknowns, or a
    dict name → (low, high) in natural units; each is sampled uniformly **on its scale**
    (log-uniform on a log scale, as a fit screens it), the others held at their values.
    `reduce` is `"llh"` (the log-likelihood) or a function of a dict experiment name → its
    predictions (one per measurement, in its data's order) to a scalar, e.g.
    `lambda p: p["dose 1"][-1]`. The points run in chunks of `chunk_size` (default 256),
    each chunk one compiled program over its points and their experiments.

    **Returns:** an `xarray.Dataset` over the dimension `parameter` with `first_order`,
    `total`, and their interval bounds `first_order_low`, `first_order_high`, `total_low`,
    `total_high`; attributes: `base_samples`, `simulations`, `variance` (V), `level`.

    **Raises:** `ValueError` for an empty or malformed `ranges`, a `reduce` that does not give
    one number per simulation, a quantity with no variance over the box, or simulations that
    failed (their quantity is NaN: the indices would be silently wrong without them).
    """
    names, low, high = design_space("sobol", model, ranges, y0, ts, solver)
    if isinstance(base_samples, bool) or not isinstance(base_samples, int) or base_samples < 2:
        raise ValueError(f"sobol: base_samples must be an int >= 2, got {base_samples!r}")
    check_bootstrap("sobol", bootstrap, level, seed)
    if base_samples < MIN_BASE_SAMPLES:
        warn(
            f"sobol: base_samples = {base_samples} is too few for the indices to mean much: "
            f"their estimates and bootstrap intervals are unreliable below {MIN_BASE_SAMPLES} "
            "(first-order indices can exceed total ones); use 1024 (the default) or more",
            UserWarning,
        )
    d, n = len(names), base_samples
    unit = halton_unit(n, 2 * d)
    a = low + (high - low) * unit[:, :d]
    b = low + (high - low) * unit[:, d:]
    blocks = [a, b] + [np.where(np.arange(d) == i, b, a) for i in range(d)]
    design = np.concatenate(blocks)  # (n (d + 2), d)
    values = evaluate_design(
        "sobol",
        model,
        names,
        design,
        y0,
        ts,
        solver=solver,
        dt=dt,
        reduce=reduce,
        chunk_size=chunk_size,
        store=store,
        progress=progress,
        max_steps=max_steps,
    )
    f_a, f_b = values[:n], values[n : 2 * n]
    f_ab = values[2 * n :].reshape(d, n)
    first, total, variance = _indices(f_a, f_b, f_ab)
    if not variance > 0:
        raise ValueError(
            "sobol: the quantity does not vary over the ranges (variance 0), so it has no "
            "variance to apportion"
        )
    bounds = _bootstrap(f_a, f_b, f_ab, bootstrap, level, seed)
    import xarray as xr

    def variable(values):
        return ("parameter", np.asarray(values, dtype=np.float64))

    data = {"first_order": variable(first), "total": variable(total)}
    for key, (lower, upper) in bounds.items():
        data[f"{key}_low"] = variable(lower)
        data[f"{key}_high"] = variable(upper)
    return xr.Dataset(
        data,
        coords={"parameter": list(names)},
        attrs={
            "base_samples": n,
            "simulations": int(values.size),
            "variance": float(variance),
            "level": float(level),
            "estimators": "first order: Saltelli et al. 2010; total: Jansen 1999",
        },
    )


def _indices(f_a, f_b, f_ab):
    """(first-order, total, variance) from the quantities of A, B and each A_B^(i) (rows)."""
    both = np.concatenate([f_a, f_b])
    variance = np.var(both)
    # f_B centred: the estimator's expectation is unchanged (f_AB − f_A has mean zero) but a
    # large mean no longer multiplies the noise of f_AB − f_A (13x less variance of S1 on
    # the SIR peak of experiments/bench/sobol_salib.py; SALib standardises likewise)
    first = np.mean((f_b - np.mean(both))[None] * (f_ab - f_a[None]), axis=1) / variance
    total = 0.5 * np.mean((f_a[None] - f_ab) ** 2, axis=1) / variance
    return first, total, variance


def _bootstrap(f_a, f_b, f_ab, resamples: int, level: float, seed: int) -> dict:
    """Percentile intervals of both indices from `resamples` resamplings of the N rows (NaN
    bounds without resamples)."""
    d = f_ab.shape[0]
    if resamples == 0:
        nan = np.full(d, np.nan)
        return {"first_order": (nan, nan), "total": (nan, nan)}
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, f_a.size, size=(resamples, f_a.size))
    firsts, totals = [], []
    for index in rows:
        first, total, _ = _indices(f_a[index], f_b[index], f_ab[:, index])
        firsts.append(first)
        totals.append(total)
    tail = 100 * (1 - level) / 2
    quantiles = [tail, 100 - tail]
    first_bounds = np.percentile(np.array(firsts), quantiles, axis=0)
    total_bounds = np.percentile(np.array(totals), quantiles, axis=0)
    return {"first_order": tuple(first_bounds), "total": tuple(total_bounds)}
