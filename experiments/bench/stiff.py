"""Stiff work–precision: the Robertson ensemble with diffsim's Rosenbrock methods against
diffrax's Kvaerno5 and scipy's Radau and BDF, at equal achieved error.

An ensemble over the rate constant k1 = 0.04 · logspace(-1, 1, N) (k2 = 3e7, k3 = 1e4),
y0 = (1, 0, 0), t in [0, 100], float64, final state only, each method at several tolerances
(atol = 1e-4 · rtol, so y2 ~ 1e-5 is resolved): diffsim `Rodas5P` and `Rosenbrock23` under
`jax.vmap`; diffrax `Kvaerno5` with a `PIDController`, under `jax.vmap`, on the same model;
scipy `solve_ivp` (Radau and BDF with the analytic Jacobian) looped over a sample of members
and scaled to N. The tolerances are traced arguments of every JAX method, so each compiles once
for all its tolerances. Error: the largest relative error of y(100) over the sample against
scipy Radau at rtol 1e-12. "At equal error" interpolates each method's run time against its
achieved error in log–log and compares the times at the same error.

A third table: the cost of the gradient of a stiff fit's loss (Robertson, 4 unknowns: k1, k2,
k3 and a scale of y0; squared residuals at 4 times) against its forward solve, Rodas5P and
diffrax-run Kvaerno5.

A second table: large method-of-lines systems, one solve each with `Rodas5P` (rtol 1e-6), with
the model's tridiagonal `jacobian_bandwidth` (Jacobian by colouring, O(n) solves) and without
it (a dense Jacobian and LU of n × n per step): `models.Heat1D` and the stiff reaction–diffusion
`models.Nagumo1D` with 1,000 cells.

Run: `python experiments/bench/stiff.py [--quick]`
"""

import argparse
import dataclasses
import os
import statistics
import sys
import time

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _timing import compile_seconds, machine_line, record, table, targets_table
from robertson import K2, K3, rates, scipy_finals, T1

import diffsim as ds
import models

jax.config.update("jax_enable_x64", True)
# compile times are measured: no persistent cache to read programs back from an earlier run
ds.config(cache=False)

Y0 = (1.0, 0.0, 0.0)
RTOLS = {
    "diffsim Rodas5P": (1e-3, 1e-4, 1e-6, 1e-8),
    "diffsim Rosenbrock23": (1e-3, 1e-4, 1e-5),
    "diffrax Kvaerno5": (1e-3, 1e-4, 1e-6, 1e-8),
    "scipy Radau (scaled)": (1e-3, 1e-4, 1e-6, 1e-8),
    "scipy BDF (scaled)": (1e-3, 1e-4, 1e-6),
}


def make_diffsim(solver_class):
    def one(k1, rtol):
        solver = solver_class(rtol=rtol, atol=1e-4 * rtol)
        model = models.Robertson(k1=k1, k2=K2, k3=K3)
        sol = ds.simulate(model, jnp.array(Y0), jnp.array([0.0, T1]), solver=solver, throw=False)
        return sol.ys[-1], sol.stats["num_steps"]

    return jax.jit(jax.vmap(one, in_axes=(0, None)))


def make_diffrax():
    def one(k1, rtol):
        model = models.Robertson(k1=k1, k2=K2, k3=K3)
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(lambda t, y, args: model.vector_field(t, y)),
            diffrax.Kvaerno5(),
            t0=0.0,
            t1=T1,
            dt0=None,
            y0=jnp.array(Y0),
            saveat=diffrax.SaveAt(t1=True),
            stepsize_controller=diffrax.PIDController(rtol=rtol, atol=1e-4 * rtol),
            max_steps=100_000,
            throw=False,
        )
        return sol.ys[-1], sol.stats["num_accepted_steps"]

    return jax.jit(jax.vmap(one, in_axes=(0, None)))


def relative_error(finals, reference) -> float:
    finals = np.asarray(finals)
    return float(np.max(np.abs(finals - reference) / np.maximum(np.abs(reference), 1e-20)))


def time_at_error(points, error: float) -> float | None:
    """Run time at `error`, interpolated in log–log between the method's measured points
    (None outside their range)."""
    points = sorted((e, t) for e, t in points if e > 0)
    errors = np.log([e for e, _ in points])
    times = np.log([t for _, t in points])
    if not errors.size or np.log(error) < errors.min() or np.log(error) > errors.max():
        return None
    return float(np.exp(np.interp(np.log(error), errors, times)))


def _without_band(model):
    """The same model with the structure hint hidden: a dense Jacobian and LU."""

    class Dense(type(model)):
        @property
        def jacobian_bandwidth(self):
            return None

    Dense.__name__ = type(model).__name__
    fields = [f.name for f in dataclasses.fields(model)]
    return Dense(**{name: getattr(model, name) for name in fields})


def method_of_lines(cells: int, repeats: int):
    """Run and compile time of Rodas5P with and without the band on two large systems."""
    heat = models.Heat1D(diffusivity=0.1, n=cells)
    nagumo = models.Nagumo1D(n=cells, length=5.0 * cells / 1000)
    cases = {
        f"Heat1D, {cells} cells, t in [0, 1]": (
            heat,
            jnp.sin(jnp.pi * heat.grid()),
            jnp.array([0.0, 1.0]),
        ),
        f"Nagumo1D, {cells} cells, t in [0, 0.1]": (
            nagumo,
            nagumo.front(nagumo.grid(), 0.0, nagumo.length / 5),
            jnp.array([0.0, 0.1]),
        ),
    }
    rows, ratios = [], []
    for label, (model, y0, ts) in cases.items():
        times = {}
        for variant, m in (("banded", model), ("dense", _without_band(model))):
            solver = ds.Rodas5P(rtol=1e-6, atol=1e-9)
            fn = jax.jit(lambda y0, m=m: ds.simulate(m, y0, ts, solver=solver).ys[-1])
            seconds, compiled = compile_seconds(fn, y0)
            runs = []
            jax.block_until_ready(compiled(y0))
            for _ in range(repeats):
                start = time.perf_counter()
                jax.block_until_ready(compiled(y0))
                runs.append(time.perf_counter() - start)
            times[variant] = statistics.median(runs)
            rows.append([label, variant, f"{times[variant] * 1e3:.1f}", f"{seconds:.2f}"])
            record(
                "method of lines, Rodas5P",
                f"{label}, {variant}",
                members=1,
                run_s=times[variant],
                compile_s=seconds,
            )
        ratios.append(times["dense"] / times["banded"])
    return rows, ratios


def gradient_cost(repeats: int):
    """(rows, Rodas5P's gradient / forward run time) of a 4-unknown stiff loss."""
    ts = jnp.array([0.0, 0.4, 4.0, 40.0, 400.0])
    y0 = jnp.array(Y0)
    observed = ds.simulate(models.Robertson(), y0, ts, solver=ds.Rodas5P(rtol=1e-8)).ys
    rows, ratio = [], None
    for solver in (ds.Rodas5P(rtol=1e-8, atol=1e-12), ds.Kvaerno5(rtol=1e-8, atol=1e-12)):

        def loss(p, solver=solver):
            model = models.Robertson(k1=p[0], k2=p[1], k3=p[2])
            ys = ds.simulate(model, y0 * p[3], ts, solver=solver).ys
            return jnp.sum((ys - observed) ** 2)

        p = jnp.array([0.05, 2e7, 2e4, 1.0])
        forward_compile, forward = compile_seconds(jax.jit(loss), p)
        gradient_compile, gradient = compile_seconds(jax.jit(jax.grad(loss)), p)
        runs = {}
        for label, fn in (("forward", forward), ("gradient", gradient)):
            jax.block_until_ready(fn(p))
            samples = []
            for _ in range(max(repeats, 5)):
                start = time.perf_counter()
                jax.block_until_ready(fn(p))
                samples.append(time.perf_counter() - start)
            runs[label] = statistics.median(samples)
        name = type(solver).__name__
        rows.append(
            [
                name,
                f"{runs['forward'] * 1e3:.2f}",
                f"{runs['gradient'] * 1e3:.2f}",
                f"{runs['gradient'] / runs['forward']:.2f}",
                f"{forward_compile:.2f} / {gradient_compile:.2f}",
            ]
        )
        if ratio is None:
            ratio = runs["gradient"] / runs["forward"]
    return rows, ratio


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sample", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="small sizes, for smoke tests")
    args = parser.parse_args(argv)
    if args.quick:
        args.members, args.repeats, args.sample = 16, 1, 2
    n = args.members
    print(f"# Stiff work–precision: Robertson ensemble, N = {n}, t in [0, {T1:g}], float64")
    print(machine_line())
    k1s = rates(n)
    index = np.linspace(0, n - 1, min(args.sample, n)).astype(int)
    reference = scipy_finals(np.asarray(k1s)[index], "Radau", 1e-12, 1e-14)
    makers = {
        "diffsim Rodas5P": make_diffsim(ds.Rodas5P),
        "diffsim Rosenbrock23": make_diffsim(ds.Rosenbrock23),
        "diffrax Kvaerno5": make_diffrax(),
    }
    rows, points, compiles, by_rtol = [], {}, {}, {}
    for name, fn in makers.items():
        # the median of three fresh compilations (N-2, N-1, N members), so that one-time costs of
        # the process are not charged to whichever method compiles first
        drops = (0,) if args.quick else (2, 1, 0)  # --quick: a smoke test, one compilation
        timings = [compile_seconds(fn, k1s[drop:], jnp.asarray(1e-6)) for drop in drops]
        seconds, compiled = statistics.median(t for t, _ in timings), timings[-1][1]
        compiles[name] = seconds
        for rtol in RTOLS[name]:
            ys, counts = jax.block_until_ready(compiled(k1s, jnp.asarray(rtol)))  # warm-up
            runs = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                jax.block_until_ready(compiled(k1s, jnp.asarray(rtol)))
                runs.append(time.perf_counter() - start)
            run = statistics.median(runs)
            error = relative_error(np.asarray(ys)[index], reference)
            points.setdefault(name, []).append((error, run))
            by_rtol[(name, rtol)] = run
            steps = int(np.sum(np.asarray(counts)))
            rows.append([name, f"{rtol:.0e}", f"{error:.1e}", f"{run * 1e3:.1f}", f"{steps:,}"])
            record(
                "Robertson work-precision",
                name,
                members=n,
                rtol=rtol,
                run_s=run,
                compile_s=seconds,
                error=error,
                steps=steps,
            )
    for method in ("Radau", "BDF"):
        name = f"scipy {method} (scaled)"
        for rtol in RTOLS[name]:
            start = time.perf_counter()
            finals = scipy_finals(np.asarray(k1s)[index], method, rtol, 1e-4 * rtol)
            run = (time.perf_counter() - start) * n / index.size
            error = relative_error(finals, reference)
            points.setdefault(name, []).append((error, run))
            by_rtol[(name, rtol)] = run
            rows.append([name, f"{rtol:.0e}", f"{error:.1e}", f"{run * 1e3:.1f}", "-"])
            record("Robertson work-precision", name, members=n, rtol=rtol, run_s=run, error=error)
    print()
    print(table(rows, ["method", "rtol", "max rel. error", "run ms", "accepted steps (all)"]))

    levels = [1e-3, 1e-4, 1e-5, 1e-6]
    equal = []
    for name in points:
        times = [time_at_error(points[name], level) for level in levels]
        equal.append([name] + [f"{t * 1e3:.1f}" if t else "-" for t in times])
    print()
    print("Run time (ms) at equal achieved error, interpolated:")
    print(table(equal, ["method"] + [f"error {level:.0e}" for level in levels]))
    print()
    print(table([[k, f"{v:.2f}"] for k, v in compiles.items()], ["method", "compile s"]))

    ratios = []
    for level in levels:
        ours = time_at_error(points["diffsim Rodas5P"], level)
        peer = time_at_error(points["diffrax Kvaerno5"], level)
        if ours and peer:
            ratios.append(peer / ours)
    speedup = min(ratios) if ratios else float("nan")
    cells = 200 if args.quick else 1000
    mol_rows, mol_ratios = method_of_lines(cells, args.repeats)
    print()
    print(table(mol_rows, ["system", "Jacobian", "run ms", "compile s"]))
    grad_rows, grad_ratio = gradient_cost(args.repeats)
    print()
    print("Gradient of a stiff loss (Robertson, 4 unknowns) against its forward solve:")
    print(
        table(
            grad_rows,
            ["solver", "forward ms", "gradient ms", "gradient / forward", "compile s (f / grad)"],
        )
    )
    compile_ratio = compiles["diffsim Rodas5P"] / compiles["diffrax Kvaerno5"]
    loose = by_rtol[("diffsim Rosenbrock23", 1e-3)]
    loose_ratio = (
        min(by_rtol[("diffsim Rodas5P", 1e-3)], by_rtol[("diffrax Kvaerno5", 1e-3)]) / loose
    )
    print()
    print(
        targets_table(
            [
                (
                    "Rodas5P >= 3x faster than diffrax Kvaerno5 at equal error (the least "
                    "ratio over the common error levels)",
                    speedup,
                    speedup >= 3,
                ),
                ("Rodas5P compile <= 0.3x diffrax Kvaerno5's", compile_ratio, compile_ratio <= 0.3),
                (
                    "Rosenbrock23 faster than Rodas5P and Kvaerno5 at rtol 1e-3 (their time / its)",
                    loose_ratio,
                    loose_ratio > 1,
                ),
                (
                    f"Heat1D, {cells:,} cells, Rodas5P: >= 10x faster with the band than dense"
                    + (" (the target is at 1,000 cells)" if args.quick else ""),
                    mol_ratios[0],
                    mol_ratios[0] >= 10,
                ),
                (
                    "gradient of a stiff loss (4 unknowns, Rodas5P) <= 5x its forward solve",
                    grad_ratio,
                    grad_ratio <= 5,
                ),
            ]
        )
    )


if __name__ == "__main__":
    main()
