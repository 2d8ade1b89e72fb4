"""Stiff ensemble: Robertson's reaction with Kvaerno5, against diffrax and scipy.

An ensemble over the rate constant k1 = 0.04 · logspace(-1, 1, N) (k2 = 3e7, k3 = 1e4),
y0 = (1, 0, 0), t in [0, 100], float64, rtol = 1e-6, atol = 1e-10, final state only; N = 2^6,
2^8, 2^10. Compared in one process run: diffsim `Kvaerno5` under `jax.vmap`; diffrax
`Kvaerno5` with a `PIDController` at the same tolerances, under `jax.vmap`, on the same model and
on a vector field with the constants written in; scipy `solve_ivp`
(BDF and Radau, with the analytic Jacobian) looped over a sample of members and scaled to N.
Errors are the largest relative error of y(100) over the sample against scipy Radau at
rtol 1e-12. diffsim's implicit solves run in diffrax (its lean loop covers explicit methods
only), so this table measures what `simulate` adds to diffrax there.

Run: `python experiments/bench/robertson.py [--quick]`
"""

import argparse
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

import diffsim as ds
import models

jax.config.update("jax_enable_x64", True)

T1 = 100.0
RTOL, ATOL = 1e-6, 1e-10
K2, K3 = 3e7, 1e4


def rates(n: int):
    return jnp.asarray(0.04 * np.logspace(-1, 1, n))


def make_diffsim():
    ts = jnp.array([0.0, T1])
    y0 = jnp.array([1.0, 0.0, 0.0])
    solver = ds.Kvaerno5(rtol=RTOL, atol=ATOL)

    def one(k1):
        sol = ds.simulate(models.Robertson(k1=k1, k2=K2, k3=K3), y0, ts, solver=solver, throw=False)
        return sol.ys[-1], sol.stats["num_steps"]

    return jax.jit(jax.vmap(one))


def make_diffrax(inline_constants: bool):
    """diffrax's Kvaerno5 on the same model (its parameters traced arrays, as in diffsim), or
    on a vector field with k2, k3 written in as Python constants, which XLA can fold into the
    Newton Jacobian (a diffsim model's parameters are traced: new values never recompile)."""

    def one(k1):
        if inline_constants:

            def field(t, y, args):
                forward, back, production = k1 * y[0], K3 * y[1] * y[2], K2 * y[1] ** 2
                return jnp.stack([-forward + back, forward - production - back, production])
        else:
            model = models.Robertson(k1=k1, k2=K2, k3=K3)

            def field(t, y, args):
                return model.vector_field(t, y)

        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(field),
            diffrax.Kvaerno5(),
            t0=0.0,
            t1=T1,
            dt0=None,
            y0=jnp.array([1.0, 0.0, 0.0]),
            saveat=diffrax.SaveAt(t1=True),
            stepsize_controller=diffrax.PIDController(rtol=RTOL, atol=ATOL),
            throw=False,
        )
        return sol.ys[-1], sol.stats["num_accepted_steps"]

    return jax.jit(jax.vmap(one))


def scipy_finals(k1s, method: str, rtol: float, atol: float):
    from scipy.integrate import solve_ivp

    finals = []
    for k1 in np.asarray(k1s):

        def rhs(t, y, k1=float(k1)):
            return [
                -k1 * y[0] + K3 * y[1] * y[2],
                k1 * y[0] - K2 * y[1] ** 2 - K3 * y[1] * y[2],
                K2 * y[1] ** 2,
            ]

        def jac(t, y, k1=float(k1)):
            return [
                [-k1, K3 * y[2], K3 * y[1]],
                [k1, -2 * K2 * y[1] - K3 * y[2], -K3 * y[1]],
                [0.0, 2 * K2 * y[1], 0.0],
            ]

        sol = solve_ivp(
            rhs, (0.0, T1), [1.0, 0.0, 0.0], method=method, rtol=rtol, atol=atol, jac=jac
        )
        finals.append(sol.y[:, -1])
    return np.array(finals)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sample", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="small sizes, for smoke tests")
    args = parser.parse_args(argv)
    sizes = [2**6, 2**8, 2**10]
    if args.quick:
        sizes, args.repeats, args.sample = [2**4], 1, 4  # compiling dominates: one size
    print(
        f"# Stiff ensemble: Robertson, Kvaerno5, rtol {RTOL:g}, atol {ATOL:g}, t in [0, {T1:g}]"
        ", float64"
    )
    print(machine_line())
    makers = {
        "diffsim Kvaerno5": make_diffsim(),
        "diffrax Kvaerno5, same model": make_diffrax(False),
        "diffrax Kvaerno5, constants inlined": make_diffrax(True),
    }
    rows, ratios, compiles = [], [], {name: [] for name in makers}
    for n in sizes:
        k1s = rates(n)
        index = np.linspace(0, n - 1, min(args.sample, n)).astype(int)
        reference = scipy_finals(np.asarray(k1s)[index], "Radau", 1e-12, 1e-14)
        times, errors, steps = {}, {}, {}
        for name, fn in makers.items():
            seconds, compiled = compile_seconds(fn, k1s)
            compiles[name].append(seconds)
            ys, counts = jax.block_until_ready(compiled(k1s))  # warm-up
            runs = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                jax.block_until_ready(compiled(k1s))
                runs.append(time.perf_counter() - start)
            times[name] = statistics.median(runs)
            errors[name] = float(
                np.max(
                    np.abs(np.asarray(ys)[index] - reference) / np.maximum(np.abs(reference), 1e-20)
                )
            )
            steps[name] = int(np.sum(np.asarray(counts)))
        for method in ("BDF", "Radau"):
            start = time.perf_counter()
            finals = scipy_finals(np.asarray(k1s)[index], method, RTOL, ATOL)
            times[f"scipy {method} (scaled)"] = (time.perf_counter() - start) * n / index.size
            errors[f"scipy {method} (scaled)"] = float(
                np.max(np.abs(finals - reference) / np.maximum(np.abs(reference), 1e-20))
            )
        ours = times["diffsim Kvaerno5"]
        ratios.append(times["diffrax Kvaerno5, same model"] / ours)
        for name, seconds in times.items():
            record(
                "Robertson Kvaerno5 (stiff)",
                name,
                members=n,
                run_s=seconds,
                compile_s=compiles[name][-1] if name in compiles else None,
                error=errors[name],
                steps=steps.get(name),
            )
            rows.append(
                [
                    f"{n:,}",
                    name,
                    f"{seconds * 1e3:.1f}",
                    f"{seconds / ours:.2f}",
                    f"{errors[name]:.1e}",
                    f"{steps[name]:,}" if name in steps else "-",
                ]
            )
    print()
    print(
        table(
            rows,
            [
                "N",
                "method",
                "run ms",
                "run / diffsim",
                "max rel. error",
                "accepted steps (all members)",
            ],
        )
    )
    print()
    print(
        table(
            [[name, f"{statistics.median(c):.2f}"] for name, c in compiles.items()],
            ["method", "compile s (median over N)"],
        )
    )
    compile_ratio = statistics.median(compiles["diffsim Kvaerno5"]) / statistics.median(
        compiles["diffrax Kvaerno5, same model"]
    )
    print()
    print(
        targets_table(
            [
                (
                    "stiff: run no slower than diffrax on the same model (diffrax / diffsim >= 1)",
                    statistics.median(ratios),
                    statistics.median(ratios) >= 1.0,
                ),
                ("stiff: compile <= 0.3x diffrax", compile_ratio, compile_ratio <= 0.3),
            ]
        )
    )


if __name__ == "__main__":
    main()
