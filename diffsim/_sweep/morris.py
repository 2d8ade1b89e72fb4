"""`ds.morris`: Morris screening (elementary effects) of a scalar quantity of a simulation over
parameter ranges, from one `ds.sweep` of one-at-a-time trajectories.

Each of r trajectories starts at a random point of a p-level grid in the unit box (levels
0, 1/(p−1), …, restricted to those at most 1 − Δ) and moves each parameter once, in random
order, by Δ = p / (2(p − 1)) of its range: d + 1 points and d elementary effects
EE_i = (f(x + Δ e_i) − f(x)) / Δ per trajectory, in units of the quantity per whole range
(Morris 1991). Reported: μ* = mean |EE_i| (Campolongo et al. 2007; the importance of
parameter i, robust to effects of both signs), μ = mean EE_i and σ = their standard
deviation (large σ: nonlinear or interacting), with bootstrap intervals of μ* over the
trajectories. r (d + 1) simulations, far fewer than Sobol' indices need: a screen to find the
parameters that can be fixed before a variance decomposition of the rest.

Why by hand: the design and the three statistics are these lines (SALib's are NumPy code outside
the JAX stack, as for `ds.sobol`); the simulations are what `ds.sweep` runs.
"""

import numpy as np

from .design import check_bootstrap, design_space, evaluate_design


def morris(
    model,
    ranges=None,
    y0=None,
    ts=None,
    *,
    solver=None,
    reduce,
    trajectories: int = 64,
    levels: int = 4,
    dt: float | None = None,
    bootstrap: int = 256,
    level: float = 0.95,
    seed: int = 0,
    chunk_size: int | None = None,
    store=None,
    progress: bool = True,
    max_steps: int = 100_000,
):
    """Morris elementary effects of a scalar quantity of the simulation over parameter
    `ranges`: which parameters matter at all (μ*) and which act nonlinearly or through
    interactions (σ), from `trajectories` × (d + 1) simulations.

    **Arguments:**

    - `model`, `y0`, `ts`, `solver`, `dt`, `chunk_size`, `store`, `progress`, `max_steps`,
      `reduce`, `ranges`: as for `ds.sobol`, a `ds.Problem` included (its unknowns vary on
      their scales: μ* is then per whole range on that scale).
    - `trajectories`: r, the one-at-a-time paths (each d + 1 simulations); `levels`: p, the
      grid's levels per parameter (even, ≥ 2; the step is Δ = p / (2(p − 1)) of the range).
    - `bootstrap`, `level`: resamples of the trajectories for the intervals of μ*, and their
      coverage; `seed`: of the design and the resampling (the same seed, the same points).

    **Returns:** an `xarray.Dataset` over `parameter` with `mu_star`, `mu`, `sigma` (in units
    of the quantity per whole range of the parameter) and `mu_star_low`, `mu_star_high`;
    attributes `trajectories`, `levels`, `delta`, `simulations`, `level`.
    """
    names, low, high = design_space("morris", model, ranges, y0, ts, solver)
    for name, value, minimum in (("trajectories", trajectories, 2), ("levels", levels, 2)):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"morris: {name} must be an int >= {minimum}, got {value!r}")
    if levels % 2:
        raise ValueError(
            f"morris: levels must be even (Δ = p / (2(p − 1)) then lands on the grid), got {levels}"
        )
    check_bootstrap("morris", bootstrap, level, seed)
    d, r = len(names), trajectories
    unit, order, delta = _trajectories(d, r, levels, np.random.default_rng(seed))
    design = low + (high - low) * unit.reshape(-1, d)
    values = evaluate_design(
        "morris",
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
    ).reshape(r, d + 1)
    effects = np.empty((r, d))
    rows = np.arange(r)[:, None]
    effects[rows, order] = np.diff(values, axis=1) / delta  # step k of path j moved order[j, k]
    mu_star = np.mean(np.abs(effects), axis=0)
    low_high = np.full((2, d), np.nan)
    if bootstrap:
        picks = np.random.default_rng(seed + 1).integers(0, r, size=(bootstrap, r))
        resampled = np.mean(np.abs(effects[picks]), axis=1)  # (bootstrap, d)
        tail = 100 * (1 - level) / 2
        low_high = np.percentile(resampled, [tail, 100 - tail], axis=0)
    import xarray as xr

    def variable(values):
        return ("parameter", np.asarray(values, dtype=np.float64))

    return xr.Dataset(
        {
            "mu_star": variable(mu_star),
            "mu": variable(np.mean(effects, axis=0)),
            "sigma": variable(np.std(effects, axis=0, ddof=1)),
            "mu_star_low": variable(low_high[0]),
            "mu_star_high": variable(low_high[1]),
        },
        coords={"parameter": list(names)},
        attrs={
            "trajectories": r,
            "levels": levels,
            "delta": float(delta),
            "simulations": int(values.size),
            "level": float(level),
            "method": "Morris 1991 trajectories; mu_star: Campolongo et al. 2007",
        },
    )


def _trajectories(d: int, r: int, levels: int, rng):
    """`r` one-at-a-time paths in the unit box, (r, d + 1, d); the order in which each path
    moves the parameters, (r, d); and the step Δ."""
    delta = levels / (2 * (levels - 1))
    starts = rng.integers(0, levels // 2, size=(r, d)) / (levels - 1)  # levels at most 1 − Δ
    order = np.argsort(rng.random((r, d)), axis=1)
    steps = np.zeros((r, d + 1, d))
    for k in range(d):  # after step k, the first k + 1 parameters of the order have moved
        steps[np.arange(r), k + 1 :, order[:, k]] = delta
    return starts[:, None, :] + steps, order, delta
