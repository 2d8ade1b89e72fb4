"""Barrier crossing of an underdamped Langevin particle against Kramers' rate.

A particle of mass 1 in the double well U(x) = ΔU (x² − 1)² (ΔU = 1, friction γ = 1) starts at
the bottom of the left well with a Maxwellian velocity; its first passage to the bottom of the
right well (x = +1) is recorded for an ensemble of independent paths, one `jax.random` key
each, run as one vmapped `ds.iterate` (a batched while loop that stops when the last member has
crossed or reached the horizon). Paths still in the left well at the horizon (4 / Kramers rate)
are censored, and the rate is estimated as crossings / total observed time (the maximum
likelihood estimate of an exponential waiting time under censoring), with standard error
rate / √crossings. For ΔU/k_BT from 3 to 6 the estimates are compared with Kramers' formula
(moderate to high friction, `models.Langevin.kramers_rate`) for two integrators at the same
step: BAOAB (`ds.BAOAB`, exact Ornstein–Uhlenbeck velocity update) and Euler–Maruyama, which
heats the particle and so crosses too often. A second figure shows the survival function of
the first-passage times at the highest barrier against exp(−k t).

Run: `python experiments/kramers.py [--out DIR] [--quick]`
"""

import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import equinox as eqx
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import _output

import diffsim as ds
import models

DT = 0.01
HORIZON = 4.0  # in units of the Kramers time 1/k
SEED = 0  # barrier i draws its paths from jax.random.key(SEED + i)


@eqx.filter_jit
def first_passages(model, solver, keys, horizon_steps, *, max_steps: int):
    """Per key: (first-passage time to x ≥ 1 or the horizon, whether it crossed)."""

    def one(key):
        start_key, path_key = jax.random.split(key)
        v0 = jnp.sqrt(model.temperature / model.mass) * jax.random.normal(start_key, ())
        start = (jnp.stack([-jnp.ones_like(v0), v0]), jnp.array(0, jnp.int32))

        def step(k, state):
            y, i = state
            dw = ds.brownian_increment(k, 0, y.shape, DT)
            return solver.step(model, i.astype(y.dtype) * DT, y, DT, dw), i + 1

        def stop(state):
            y, i = state
            return (y[0] >= 1.0) | (i >= horizon_steps)

        out = ds.iterate(step, start, path_key, stop=stop, max_steps=max_steps)
        y, steps = out.state
        return steps.astype(y.dtype) * DT, y[0] >= 1.0

    return jax.vmap(one)(keys)


def estimate(times, crossed):
    """Exponential rate under right censoring and its standard error."""
    times, crossed = np.asarray(times), np.asarray(crossed)
    count = int(crossed.sum())
    rate = count / times.sum()
    return rate, rate / np.sqrt(max(count, 1)), count


def run(out_dir="out/kramers", quick: bool = False) -> dict:
    out, plt = _output.prepare(out_dir)
    ratios = [3.0] if quick else [3.0, 4.0, 5.0, 6.0]  # ΔU / k_B T
    members = 200 if quick else 1000
    solvers = {"BAOAB": ds.BAOAB(), "Euler–Maruyama": ds.EulerMaruyama()}
    probe = models.Langevin(barrier=1.0, friction=1.0, temperature=1.0 / max(ratios))
    max_steps = int(np.ceil(HORIZON / float(probe.kramers_rate()) / DT))
    rows, passages = [], {}
    for name, solver in solvers.items():
        for index, ratio in enumerate(ratios):
            model = models.Langevin(barrier=1.0, friction=1.0, temperature=1.0 / ratio)
            kramers = float(model.kramers_rate())
            horizon_steps = int(np.ceil(HORIZON / kramers / DT))
            keys = jax.random.split(jax.random.key(SEED + index), members)
            start = time.perf_counter()
            times, crossed = first_passages(model, solver, keys, horizon_steps, max_steps=max_steps)
            times = np.asarray(times)
            seconds = time.perf_counter() - start
            rate, error, count = estimate(times, crossed)
            passages[(name, ratio)] = (times, np.asarray(crossed))
            rows.append(
                dict(
                    solver=name,
                    barrier_over_kT=ratio,
                    kramers_rate=kramers,
                    rate=rate,
                    stderr=error,
                    crossings=count,
                    members=members,
                    ratio_to_kramers=rate / kramers,
                )
            )
            print(
                f"{name:15s} ΔU/kT={ratio:.0f}: rate {rate:.3e} ± {error:.1e} "
                f"(Kramers {kramers:.3e}, ratio {rate / kramers:.3f}), {count}/{members} "
                f"crossed, {seconds:.1f} s"
            )

    fig, axis = plt.subplots(figsize=(5.6, 4.2))
    grid = np.linspace(min(ratios) - 0.2, max(ratios) + 0.2, 50)
    kramers_line = [
        float(models.Langevin(barrier=1.0, friction=1.0, temperature=1 / r).kramers_rate())
        for r in grid
    ]
    axis.semilogy(grid, kramers_line, "k-", lw=1, label="Kramers (moderate–high friction)")
    for name, marker in zip(solvers, ("o", "s")):
        mine = [r for r in rows if r["solver"] == name]
        axis.errorbar(
            [r["barrier_over_kT"] for r in mine],
            [r["rate"] for r in mine],
            yerr=[2 * r["stderr"] for r in mine],
            fmt=marker,
            ms=4,
            capsize=2,
            label=f"{name}, dt = {DT} (±2 SE)",
        )
    axis.set_xlabel("barrier / $k_BT$")
    axis.set_ylabel("escape rate")
    axis.set_title(f"double well, γ = 1: {members} paths per point", fontsize=10)
    axis.legend(fontsize=8)
    fig.tight_layout()
    files = ds.plot.save(fig, out, "kramers_rate")

    ratio = max(ratios)
    times, crossed = passages[("BAOAB", ratio)]
    kramers = next(r["kramers_rate"] for r in rows if r["barrier_over_kT"] == ratio)
    order = np.sort(times[crossed])
    survival = 1.0 - np.arange(1, order.size + 1) / times.size
    fig, axis = plt.subplots(figsize=(5.6, 4.2))
    axis.semilogy(order * kramers, survival, drawstyle="steps-post", label="BAOAB paths")
    axis.semilogy(order * kramers, np.exp(-kramers * order), "k--", lw=1, label="exp(−k t)")
    axis.set_xlabel("first-passage time × Kramers rate")
    axis.set_ylabel("fraction not yet crossed")
    axis.set_title(f"$\\Delta U / k_BT$ = {ratio:.0f}: {times.size} paths", fontsize=10)
    axis.legend(fontsize=8)
    fig.tight_layout()
    files += ds.plot.save(fig, out, "kramers_survival")
    plt.close("all")
    files.append(_output.table(out, "kramers_rates", {k: [r[k] for r in rows] for k in rows[0]}))
    config = {
        "dt": DT,
        "horizon_in_kramers_times": HORIZON,
        "barriers_over_kT": ratios,
        "members": members,
        "seed": SEED,
    }
    record = {"config": config, "rows": rows}
    files.append(_output.summary(out, "kramers", record))
    return {"files": files, **record}


if __name__ == "__main__":
    _output.main(__file__, __doc__)
