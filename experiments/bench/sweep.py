"""Sweep benchmark: members per second of `ds.sweep`, storage included, against peers.

A damped pendulum over a length x damping grid (400 x 250 = 100,000 members), RK4, float32,
1,000 steps of dt = 0.01 over t in [0, 10], final state kept. In one process run:
  (a) `ds.sweep` writing a zarr store (a fresh store each repeat, so nothing is resumed),
  (b) `ds.sweep` returning the dataset in memory,
  (c) the same work written by hand: `jax.jit(jax.vmap(...))` of an RK4 `lax.scan` over the
      flattened grid (no storage),
  (d) `diffrax.diffeqsolve` with the same RK4 tableau and constant step, under `jax.vmap`.
`ds.sweep` compiles inside the call, so each of its calls is timed whole (its programs dropped
before it, the persistent cache off) and its compile time is read from JAX's own compile events
(`_timing.CompileClock`); run = total - compile. The peers are
compiled once (median of three fresh compilations) and run in shuffled interleaved rounds. Members
per second are on run time, and also on total time (what a script that runs one sweep sees).

Run: `python experiments/bench/sweep.py [--lengths N --dampings N --steps N] [--quick]`
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _timing import (
    CompileClock,
    fresh_compile_seconds,
    machine_line,
    record,
    table,
    targets_table,
)
from fixed_step import GRAVITY, make_diffrax, make_hand_scan, T1, Y0

import diffsim as ds
import models


def grid(n_lengths: int, n_dampings: int):
    return (
        np.linspace(0.5, 2.0, n_lengths, dtype=np.float32),
        np.linspace(0.0, 0.5, n_dampings, dtype=np.float32),
    )


def run_sweep(lengths, dampings, steps: int, store: str | None):
    """One `ds.sweep` call → (total seconds, compile seconds, final states (members, 2)), its
    program compiled afresh (as the peers' are, and as a script's one sweep is): the programs
    of earlier calls are dropped and the persistent cache is off (`main`)."""
    jax.clear_caches()
    with CompileClock() as clock:
        start = time.perf_counter()
        result = ds.sweep(
            models.DampedPendulum(gravity=GRAVITY),
            {"length": lengths, "damping": dampings},
            jnp.array(Y0, jnp.float32),
            jnp.array([0.0, T1], jnp.float32),
            solver=ds.RK4(),
            dt=T1 / steps,
            reduce="final_state",
            store=store,
            progress=False,
        )
        final = np.asarray(result["final_state"].values)  # read back from the store
        total = time.perf_counter() - start
    return total, clock.seconds, final.reshape(-1, 2)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, default=400)
    parser.add_argument("--dampings", type=int, default=250)
    parser.add_argument("--steps", type=int, default=1_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="small sizes, for smoke tests")
    args = parser.parse_args(argv)
    # every method compiles afresh: no program loaded from diffsim's persistent cache
    ds.config(cache=False)
    if args.quick:
        args.lengths, args.dampings, args.steps, args.repeats = 20, 10, 100, 1

    lengths, dampings = grid(args.lengths, args.dampings)
    members = lengths.size * dampings.size
    flat_l, flat_d = (jnp.asarray(a.ravel()) for a in np.meshgrid(lengths, dampings, indexing="ij"))
    print(
        f"# Sweep: damped pendulum, RK4, float32, {args.lengths} x {args.dampings} = "
        f"{members:,} members x {args.steps:,} steps, final state kept"
    )
    print(machine_line())

    peers = {"hand-written jit(vmap(scan))": make_hand_scan, "diffrax vmap": make_diffrax}
    compiled, compile_s = {}, {}
    for name, make in peers.items():
        compile_s[name], compiled[name] = fresh_compile_seconds(make(args.steps), flat_l, flat_d)
        jax.block_until_ready(compiled[name](flat_l, flat_d))

    workdir = tempfile.mkdtemp(prefix="diffsim-bench-sweep-")
    timings = {"ds.sweep + zarr store": [], "ds.sweep in memory": [], **{n: [] for n in peers}}
    finals = {}
    order = np.random.default_rng(1)
    try:
        run_sweep(lengths, dampings, args.steps, None)  # warm-up: imports, first-call costs
        for round_ in range(args.repeats):
            for name in order.permutation(list(timings)):
                if name in compiled:
                    start = time.perf_counter()
                    finals[name] = np.asarray(jax.block_until_ready(compiled[name](flat_l, flat_d)))
                    seconds = time.perf_counter() - start
                    timings[name].append((seconds + compile_s[name], compile_s[name]))
                else:
                    store = None
                    if "zarr" in name:
                        store = os.path.join(workdir, f"round{round_}.zarr")
                    total, comp, finals[name] = run_sweep(lengths, dampings, args.steps, store)
                    timings[name].append((total, comp))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    summary = {}
    for name, runs in timings.items():
        total = statistics.median(t for t, _ in runs)
        comp = statistics.median(c for _, c in runs)
        run = statistics.median(t - c for t, c in runs)
        summary[name] = (total, comp, run)
    for name, (total, comp, run) in summary.items():
        record(
            "sweep (pendulum grid, RK4)",
            name,
            members=members,
            compile_s=comp,
            run_s=run,
            total_s=total,
        )
    ours = summary["ds.sweep + zarr store"]
    reference = finals["hand-written jit(vmap(scan))"]
    rows = [
        [
            name,
            f"{comp:.2f}",
            f"{run:.3f}",
            f"{members / run:,.0f}",
            f"{members / total:,.0f}",
            f"{(members / run) / (members / ours[2]):.2f}",
            f"{np.max(np.abs(finals[name] - reference)):.1e}",
        ]
        for name, (total, comp, run) in summary.items()
    ]
    print()
    print(
        table(
            rows,
            [
                "method",
                "compile s",
                "run s",
                "members/s (run)",
                "members/s (total)",
                "speed / ds.sweep+store",
                "max abs(final - hand)",
            ],
        )
    )
    hand, dfx = summary["hand-written jit(vmap(scan))"], summary["diffrax vmap"]
    checks = [
        (
            ">= 0.9x hand-written members/s, storage included (run)",
            hand[2] / ours[2],
            ours[2] <= hand[2] / 0.9,
        ),
        (
            ">= 0.9x hand-written members/s, storage included (total)",
            hand[0] / ours[0],
            ours[0] <= hand[0] / 0.9,
        ),
        (">= 2x diffrax members/s (run)", dfx[2] / ours[2], dfx[2] >= 2 * ours[2]),
    ]
    print()
    print(targets_table(checks))


if __name__ == "__main__":
    main()
