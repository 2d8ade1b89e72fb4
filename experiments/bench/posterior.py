"""Posterior benchmark: effective samples per second of `ds.sample` against NumPyro + diffrax
written by hand, on the lynx–hare case study.

The problem is Carpenter's Stan case study (2018, "Predator-Prey Population Dynamics"): the
Hudson's Bay Company hare and lynx pelts of 1900–1920 (`experiments/data/lynx_hare.csv`, t in
years, t0 the first data time, whose observation is in the likelihood), du/dt = (α − βv)u,
dv/dt = (−γ + δu)v, float64, 8 unknowns: α, γ ~ TruncatedNormal(1, 0.5, low 0); β, δ ~
TruncatedNormal(0.05, 0.05, low 0); the initial hare and lynx ~ LogNormal(log 10, 1); σ, one per
species, ~ LogNormal(−1, 1); likelihood log y ~ N(log z, σ_k). In one process run:
  (a) `ds.sample(..., likelihood="lognormal", chains=4, warmup=1000, draws=1000)` with its
      defaults (Tsit5, rtol = atol = 1e-6, max_steps 4096, dense mass matrix, chains started
      around a `ds.fit` optimum); its parts are timed by the call itself (`Posterior.timings`:
      the start fit, the compilation, the sampling: warm-up, draws and posterior predictive);
  (b) the same posterior written by hand in NumPyro: `diffrax.diffeqsolve` (Tsit5, dt0 0.1,
      `PIDController` at the same tolerances, `RecursiveCheckpointAdjoint`, max_steps 4096,
      throw=False; a failed solve gives log density −inf), `init_to_median`, NUTS with
      `dense_mass=True`, 4 vectorized chains of 1000 warm-up + 1000 draws: like for like;
  (c) as (b) in the case study's reference setting: diagonal mass matrix, rtol = atol = 1e-8
      (full run only).
NumPyro compiles inside `MCMC.run`: its compile time is read from JAX's compile events
(`_timing.CompileClock`) during the call, and its sampling time is the call's wall time less
that. ESS: `numpyro.diagnostics.effective_sample_size` of each unknown's (chains, draws) draws,
the same estimator for every method; ESS/s is the least ESS of the 8 unknowns over the sampling
seconds (compile excluded) and over the whole call. Posterior means are compared with the case
study's Stan table. Finally, a script that runs (a) in a fresh Python process with the
persistent compilation cache off (`DIFFSIM_CACHE=off`) is timed from the process's start to the
answer (imports, fit, compilation and sampling: what a first run of a script costs).

`--quick` (CI's smoke run, under a minute): (a) only, 2 chains of 50 warm-up + 50 draws, run
as the fresh-process script alone. No NumPyro peer: its compilation alone takes ~35–40 s on a
2-core machine (and ~50 s with its quick run), which with (a)'s ~35 s would not fit in a minute,
run one after the other or side by side (the two compilations then slow each other down). The
quick timings mean little.

Run: `python experiments/bench/posterior.py [--quick]`
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import diffrax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.diagnostics import effective_sample_size, split_gelman_rubin
from numpyro.infer import init_to_median, MCMC, NUTS

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _timing import CompileClock, machine_line, record, table, targets_table
from posterior_lynx_hare import sample  # the experiment's ds.sample call, with its priors

import diffsim as ds

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "experiments" / "data" / "lynx_hare.csv"
RTOL = ATOL = 1e-6  # ds.sample's default solver, and the like-for-like peer's
# the case study's posterior means (Carpenter 2018, Stan), in the order of the unknowns
STAN = {
    "alpha": 0.545,
    "beta": 0.028,
    "gamma": 0.803,
    "delta": 0.024,
    "y0[prey]": 33.96,
    "y0[predator]": 5.93,
    "sigma[hare]": 0.250,
    "sigma[lynx]": 0.252,
}
SPECIES = ("hare", "lynx")


def summarize(samples: dict) -> dict:
    """entry → mean, ESS, split R-hat of the draws `samples[name]` of shape (chains, draws, ...)
    (σ split into its two species), by numpyro's diagnostics for every method alike."""
    out = {}
    for name, x in samples.items():
        x = np.asarray(x, dtype=np.float64)
        columns = (
            {name: x} if x.ndim == 2 else {f"{name}[{s}]": x[..., j] for j, s in enumerate(SPECIES)}
        )
        for entry, draws in columns.items():
            out[entry] = dict(
                mean=float(np.mean(draws)),
                ess=float(effective_sample_size(draws)),
                r_hat=float(split_gelman_rubin(draws)),
            )
    missing = set(STAN) - set(out)
    assert not missing, f"no draws of {sorted(missing)}"
    return {entry: out[entry] for entry in STAN}


def diffsim_sample(chains: int, warmup: int, draws: int) -> dict:
    """(a) in this process: `ds.sample` with its defaults."""
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ds.FitWarning)  # too few draws in the quick run
        post = sample(chains=chains, warmup=warmup, draws=draws)
    wall = time.perf_counter() - start
    return dict(
        fit=post.timings["fit"],
        compile=post.timings["compile"],
        sampling=post.timings["sample"],
        whole=wall,
        summary=summarize(post.samples),
        divergences=int(post.divergences.sum()),
        steps=float(np.mean(post.sample_stats["n_steps"])),
    )


# (a) as a script of its own: everything from the interpreter's start; the draws are handed back
# in a file and summarised by the benchmark, after the answer
_FRESH = """
import time, json, sys, warnings
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import numpy as np
import diffsim as ds
import models
sys.path.insert(0, {experiments!r})
from posterior_lynx_hare import priors
data = ds.Data.from_csv({data!r}, time="year", columns=["hare", "lynx"])
warnings.simplefilter("ignore", ds.FitWarning)
post = ds.sample(models.LotkaVolterra(alpha=1.0, beta=0.05, gamma=1.0, delta=0.05),
    jnp.asarray(data.values[0]), data, params=["alpha", "beta", "gamma", "delta"],
    initial_state=True, priors=priors(), likelihood="lognormal", key=jax.random.key(0),
    chains={chains}, warmup={warmup}, draws={draws})
answered = time.time()
np.savez({draws_file!r}, **post.samples)
print(json.dumps(dict(answered=answered, timings=post.timings, seconds=post.seconds,
    divergences=int(post.divergences.sum()), steps=float(np.mean(post.sample_stats["n_steps"])))))
"""


def start_fresh(chains: int, warmup: int, draws: int, folder: str):
    """Start (a) as a script in a fresh Python process, persistent compilation cache off."""
    draws_file = os.path.join(folder, "draws.npz")
    code = _FRESH.format(
        data=str(DATA),
        experiments=str(ROOT / "experiments"),
        chains=chains,
        warmup=warmup,
        draws=draws,
        draws_file=draws_file,
    )
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, DIFFSIM_CACHE="off", PYTHONPATH=path)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    started = time.time()
    process = subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return process, started, draws_file


def finish_fresh(process, started: float, draws_file: str) -> dict:
    stdout, stderr = process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"the fresh-process ds.sample failed:\n{stderr[-3000:]}")
    result = json.loads(stdout.strip().splitlines()[-1])
    with np.load(draws_file) as loaded:
        samples = {name: loaded[name] for name in loaded.files}
    return dict(
        answer=result["answered"] - started,
        fit=result["timings"]["fit"],
        compile=result["timings"]["compile"],
        sampling=result["timings"]["sample"],
        whole=result["seconds"],
        summary=summarize(samples),
        divergences=result["divergences"],
        steps=result["steps"],
    )


def _field(t, y, p):
    alpha, beta, gamma, delta = p
    return jnp.stack([(alpha - beta * y[1]) * y[0], (-gamma + delta * y[0]) * y[1]])


def numpyro_model(ts, log_pelts, rtol, atol):
    """(b), (c): the case study's model by hand, diffrax for the solve."""
    alpha = numpyro.sample("alpha", dist.TruncatedNormal(1.0, 0.5, low=0.0))
    beta = numpyro.sample("beta", dist.TruncatedNormal(0.05, 0.05, low=0.0))
    gamma = numpyro.sample("gamma", dist.TruncatedNormal(1.0, 0.5, low=0.0))
    delta = numpyro.sample("delta", dist.TruncatedNormal(0.05, 0.05, low=0.0))
    prey = numpyro.sample("y0[prey]", dist.LogNormal(jnp.log(10.0), 1.0))
    predator = numpyro.sample("y0[predator]", dist.LogNormal(jnp.log(10.0), 1.0))
    sigma = numpyro.sample("sigma", dist.LogNormal(-1.0, 1.0).expand([2]))
    solution = diffrax.diffeqsolve(
        diffrax.ODETerm(_field),
        diffrax.Tsit5(),
        ts[0],
        ts[-1],
        0.1,
        jnp.stack([prey, predator]),
        args=(alpha, beta, gamma, delta),
        saveat=diffrax.SaveAt(ts=ts),
        stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
        adjoint=diffrax.RecursiveCheckpointAdjoint(),
        max_steps=4096,
        throw=False,
    )
    ok = (solution.result == diffrax.RESULTS.successful) & jnp.all(solution.ys > 0)
    z = jnp.where(ok, solution.ys, 1.0)
    numpyro.factor("solve_failed", jnp.where(ok, 0.0, -jnp.inf))
    numpyro.sample("pelts", dist.Normal(jnp.log(z), sigma), obs=log_pelts)


def numpyro_sample(chains: int, warmup: int, draws: int, dense: bool, rtol: float) -> dict:
    """(b) or (c) in this process: one `MCMC.run`, compile read from JAX's events."""
    values = np.loadtxt(DATA, delimiter=",", skiprows=1)
    ts, log_pelts = jnp.asarray(values[:, 0]), jnp.log(jnp.asarray(values[:, 1:3]))
    with CompileClock() as clock:
        start = time.perf_counter()
        mcmc = MCMC(
            NUTS(numpyro_model, dense_mass=dense, init_strategy=init_to_median),
            num_warmup=warmup,
            num_samples=draws,
            num_chains=chains,
            chain_method="vectorized",
            progress_bar=False,
        )
        mcmc.run(
            jax.random.key(0), ts, log_pelts, rtol, rtol, extra_fields=("diverging", "num_steps")
        )
        samples = jax.block_until_ready(mcmc.get_samples(group_by_chain=True))
        wall = time.perf_counter() - start
    extra = mcmc.get_extra_fields(group_by_chain=True)
    return dict(
        fit=None,
        compile=clock.seconds,
        sampling=wall - clock.seconds,
        whole=wall,
        summary=summarize(samples),
        divergences=int(np.sum(extra["diverging"])),
        steps=float(np.mean(extra["num_steps"])),
    )


def min_ess(result: dict) -> float:
    return min(row["ess"] for row in result["summary"].values())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for smoke tests")
    args = parser.parse_args(argv)
    chains, warmup, draws = (2, 50, 50) if args.quick else (4, 1000, 1000)
    # compile times are measured: nothing read back from an earlier run's persistent cache
    ds.config(cache=False)
    print(
        f"# Posterior: lynx–hare (Carpenter 2018), 8 unknowns, {chains} chains x "
        f"({warmup} warm-up + {draws} draws), float64"
    )
    print(machine_line())
    results = {}
    ours = "ds.sample (Tsit5 1e-6, dense)"
    peer = "NumPyro + diffrax (Tsit5 1e-6, dense)"
    with tempfile.TemporaryDirectory(prefix="diffsim-bench-posterior-") as folder:
        if args.quick:  # (a) in a fresh process only: no time for the peer (see above)
            fresh = results[ours] = finish_fresh(*start_fresh(chains, warmup, draws, folder))
        else:
            results[ours] = diffsim_sample(chains, warmup, draws)
            results[peer] = numpyro_sample(chains, warmup, draws, True, RTOL)
            results["NumPyro + diffrax (Tsit5 1e-8, diagonal)"] = numpyro_sample(
                chains, warmup, draws, False, 1e-8
            )
            fresh = finish_fresh(*start_fresh(chains, warmup, draws, folder))
            results["ds.sample, fresh process"] = fresh

    rate = {
        name: (min_ess(r) / r["sampling"], min_ess(r) / r["whole"]) for name, r in results.items()
    }
    rows = []
    for name, r in results.items():
        record(
            "lynx-hare posterior",
            name,
            compile_s=r["compile"],
            run_s=r["sampling"],
            whole_s=r["whole"],
            min_ess=min_ess(r),
            ess_per_s=rate[name][0],
            ess_per_s_whole=rate[name][1],
            divergences=r["divergences"],
        )
        rows.append(
            [
                name,
                "-" if r["fit"] is None else f"{r['fit']:.1f}",
                f"{r['compile']:.1f}",
                f"{r['sampling']:.1f}",
                f"{r['whole']:.1f}",
                f"{min_ess(r):.0f}",
                f"{rate[name][0]:.3g}",
                f"{rate[name][1]:.3g}",
                f"{rate[ours][0] / rate[name][0]:.2f} / {rate[ours][1] / rate[name][1]:.2f}",
                f"{max(row['r_hat'] for row in r['summary'].values()):.3f}",
                str(r["divergences"]),
                f"{r['steps']:.1f}",
            ]
        )
    print()
    print(
        table(
            rows,
            [
                "method",
                "fit s",
                "compile s",
                "sampling s",
                "whole call s",
                "min ESS",
                "ESS/s sampling",
                "ESS/s whole",
                "ds.sample ESS/s ÷ this (sampling / whole)",
                "max R-hat",
                "divergences",
                "leapfrog steps / draw",
            ],
        )
    )
    print()
    print("Posterior means against the case study's Stan table (ESS of each in brackets):")
    means = [
        [entry, f"{value:g}"]
        + [
            f"{r['summary'][entry]['mean']:.4g} ({r['summary'][entry]['ess']:.0f})"
            for r in results.values()
        ]
        for entry, value in STAN.items()
    ]
    print(table(means, ["unknown", "Stan", *results]))
    print()
    print(
        f"Fresh process (a script: imports, fit, compile, sampling; DIFFSIM_CACHE=off): "
        f"{fresh['answer']:.1f} s from start to answer"
    )
    record("lynx-hare posterior", "ds.sample, fresh process to answer", run_s=fresh["answer"])
    checks = []
    if peer in results:
        sampling_ratio = rate[ours][0] / rate[peer][0]
        whole_ratio = rate[ours][1] / rate[peer][1]
        checks += [
            (
                "lynx–hare: ds.sample ESS/s >= 3x NumPyro + diffrax (same tolerances, dense), "
                "sampling only (compile excluded)",
                sampling_ratio,
                sampling_ratio >= 3,
            ),
            (
                "lynx–hare: ds.sample ESS/s >= 3x NumPyro + diffrax (same tolerances, dense), "
                "whole call (start fit and compile included)",
                whole_ratio,
                whole_ratio >= 3,
            ),
        ]
    checks.append(
        (
            "lynx–hare ds.sample from a fresh process <= 60 s (seconds)"
            + (" (quick sizes: the target is at 4 x (1000 + 1000))" if args.quick else ""),
            fresh["answer"],
            fresh["answer"] <= 60,
        )
    )
    print()
    print(targets_table(checks))


if __name__ == "__main__":
    main()
