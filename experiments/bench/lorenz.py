"""Lorenz ensemble of the DiffEqGPU paper: fixed step and adaptive Tsit5, against every peer.

The problem (Utkarsh et al., *Automated translation and accelerated solving of differential
equations on multiple GPU platforms*, 2024): sigma = 10, beta = 8/3, rho = linspace(0, 21, N),
u0 = (1, 0, 0), t in [0, 1], float32, final state only.

1. Fixed step, dt = 0.001 (1,000 steps), RK4 (`--method tsit5`: the Tsit5 tableau at a fixed
   step, as in the paper), N = 2^8 ... 2^16: diffsim; the same method written by hand as
   `jax.vmap` over `lax.scan`; diffrax with `ConstantStepSize` (same tableau); NumPy vectorized
   over the ensemble; torchdiffeq (`rk4`, one batched tensor, CPU); scipy `solve_ivp` (RK45 at
   rtol 1e-6: it has no fixed-step method) over a sample of members, scaled to N.
2. Adaptive Tsit5 at rtol = atol = 1e-6 under `jax.vmap`, N = 2^8 ... 2^16: diffsim and diffrax
   (`PIDController`, same tolerances, each member its own steps); torchdiffeq dopri5 (one step
   size for the whole batch: its error norm spans every member).
3. Work-precision at one N: for tolerances 1e-3 ... 1e-8, the achieved error (largest absolute
   error of u(1) over 64 members spread over the ensemble, against scipy DOP853 in float64 at
   rtol = atol = 1e-12) and the run time of each adaptive method; "equal achieved error" ratios
   interpolate a peer's time, log-log, at diffsim's error.

Compile time is trace + lower + XLA compile of the jitted ensemble (median over the sizes, each
a fresh compilation); run time the median over rounds that time every method once in shuffled
order, after a warm-up call, `block_until_ready`.

Run: `python experiments/bench/lorenz.py [--quick] [--sizes 8-16] [--peers diffsim,diffrax]
[--method rk4|tsit5] [--no-work-precision]`; on a GPU: `experiments/bench/gpu.sh`.
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
from jax import lax

sys.path.insert(0, os.path.dirname(__file__))
import _torch_peers
from _timing import compile_seconds, machine_line, record, table, targets_table
from fixed_step import _DiffraxRK4

import diffsim as ds
import models

SIGMA, BETA = 10.0, 8.0 / 3.0
T1 = 1.0
DT = 0.001
U0 = (1.0, 0.0, 0.0)
PEERS = ("diffsim", "hand", "diffrax", "numpy", "torchdiffeq", "scipy")
NAMES = {
    "diffsim": "diffsim",
    "hand": "hand-written vmap(scan)",
    "diffrax": "diffrax",
    "numpy": "NumPy (vectorized)",
    "torchdiffeq": "torchdiffeq (CPU, batched)",
    "scipy": "scipy solve_ivp (sample, scaled)",
}


def rhos(n: int):
    return jnp.linspace(0.0, 21.0, n, dtype=jnp.float32)


def _field(rho):
    def field(t, u, args=None):
        x, y, z = u[0], u[1], u[2]
        return jnp.stack([SIGMA * (y - x), x * (rho - z) - y, x * y - BETA * z])

    return field


# --- the fixed-step methods ------------------------------------------------------------------


def _tsit5_tableau():
    """Tsit5's 6-stage tableau as a fixed-step method (its 7th, FSAL, stage carries no weight)."""
    t = diffrax.Tsit5().tableau
    return (
        [0.0, *map(float, t.c[:5])],
        [list(map(float, row)) for row in t.a_lower[:5]],
        list(map(float, t.b_sol[:6])),
    )


class FixedTsit5(ds.AbstractRungeKutta):
    """Tsit5's tableau at a fixed step (the DiffEqGPU paper's fixed-step Lorenz method)."""

    order = 5
    tableau = ds.ButcherTableau(
        *(tuple(map(tuple, x)) if i == 1 else tuple(x) for i, x in enumerate(_tsit5_tableau()))
    )


def fixed_diffsim(method: str):
    solver = ds.RK4() if method == "rk4" else FixedTsit5()
    ts = jnp.array([0.0, T1], jnp.float32)
    y0 = jnp.array(U0, jnp.float32)

    def one(rho):
        model = models.Lorenz(sigma=SIGMA, rho=rho, beta=BETA)
        return ds.simulate(model, y0, ts, solver=solver, dt=DT, throw=False).ys[-1]

    return jax.jit(jax.vmap(one))


def fixed_hand(method: str, unroll: int = 1):
    steps = round(T1 / DT)
    dt = jnp.float32(DT)
    c, a, b = _tsit5_tableau()

    def one(rho):
        f = _field(rho)

        def rk4(y, _):
            k1 = f(0, y)
            k2 = f(0, y + dt / 2 * k1)
            k3 = f(0, y + dt / 2 * k2)
            k4 = f(0, y + dt * k3)
            return y + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4), None

        def tsit5(y, _):
            ks = [f(0, y)]
            for row in a:
                ks.append(f(0, y + dt * sum(aij * k for aij, k in zip(row, ks))))
            return y + dt * sum(bj * k for bj, k in zip(b, ks)), None

        step = rk4 if method == "rk4" else tsit5
        return lax.scan(step, jnp.array(U0, jnp.float32), None, length=steps, unroll=unroll)[0]

    return jax.jit(jax.vmap(one))


def fixed_diffrax(method: str):
    solver = _DiffraxRK4() if method == "rk4" else diffrax.Tsit5()

    def one(rho):
        return diffrax.diffeqsolve(
            diffrax.ODETerm(_field(rho)),
            solver,
            t0=0.0,
            t1=T1,
            dt0=DT,
            y0=jnp.array(U0, jnp.float32),
            saveat=diffrax.SaveAt(t1=True),
            stepsize_controller=diffrax.ConstantStepSize(),
            max_steps=round(T1 / DT) + 1,
            throw=False,
        ).ys[-1]

    return jax.jit(jax.vmap(one))


def fixed_numpy(rho, method: str):
    rho = np.asarray(rho, np.float32)
    dt = np.float32(DT)
    c, a, b = _tsit5_tableau()
    if method == "rk4":
        a, b = [[0.5], [0.0, 0.5], [0.0, 0.0, 1.0]], [1 / 6, 1 / 3, 1 / 3, 1 / 6]
    a = [[np.float32(x) for x in row] for row in a]
    b = [np.float32(x) for x in b]
    u = np.tile(np.array(U0, np.float32)[:, None], (1, rho.size))

    def f(u):
        x, y, z = u
        return np.stack(
            [np.float32(SIGMA) * (y - x), x * (rho - z) - y, x * y - np.float32(BETA) * z]
        )

    for _ in range(round(T1 / DT)):
        ks = [f(u)]
        for row in a:
            ks.append(f(u + dt * sum(aij * k for aij, k in zip(row, ks) if aij)))
        u = u + dt * sum(bj * k for bj, k in zip(b, ks) if bj)
    return u.T


def _lorenz_numpy(t, u, rho):
    x, y, z = u
    return [SIGMA * (y - x), x * (rho - z) - y, x * y - BETA * z]


def scipy_final(rho_values, method: str, rtol: float, atol: float):
    from scipy.integrate import solve_ivp

    return np.array(
        [
            solve_ivp(
                _lorenz_numpy, (0.0, T1), U0, method=method, rtol=rtol, atol=atol, args=(float(r),)
            ).y[:, -1]
            for r in np.asarray(rho_values, np.float64)
        ]
    )


# --- the adaptive methods --------------------------------------------------------------------


def adaptive_diffsim(rtol, atol):
    ts = jnp.array([0.0, T1], jnp.float32)
    y0 = jnp.array(U0, jnp.float32)
    solver = ds.Tsit5(rtol=rtol, atol=atol)

    def one(rho):
        model = models.Lorenz(sigma=SIGMA, rho=rho, beta=BETA)
        sol = ds.simulate(model, y0, ts, solver=solver, throw=False)
        return sol.ys[-1], sol.stats["num_steps"]

    return jax.jit(jax.vmap(one))


def adaptive_diffrax(rtol, atol):
    def one(rho):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(_field(rho)),
            diffrax.Tsit5(),
            t0=0.0,
            t1=T1,
            dt0=None,
            y0=jnp.array(U0, jnp.float32),
            saveat=diffrax.SaveAt(t1=True),
            stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
            throw=False,
        )
        return sol.ys[-1], sol.stats["num_accepted_steps"]

    return jax.jit(jax.vmap(one))


# --- measuring -------------------------------------------------------------------------------


def _rounds(fns: dict, repeats: int, seed: int = 1) -> dict:
    """Median wall time of each no-argument function over `repeats` rounds in shuffled order
    (each called once first), waiting for its result."""
    for fn in fns.values():
        jax.block_until_ready(fn())
    times = {name: [] for name in fns}
    order = np.random.default_rng(seed)
    for _ in range(repeats):
        for name in order.permutation(list(fns)):
            start = time.perf_counter()
            jax.block_until_ready(fns[name]())
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def _compile_and_time(jitted: dict, rho, repeats: int, compile_s: dict):
    """Compile every method for `rho` (appending the seconds to `compile_s`), then time them in
    shuffled rounds; returns (the compiled functions, their median run seconds)."""
    compiled = {}
    for p, fn in jitted.items():
        seconds, compiled[p] = compile_seconds(fn, rho)
        compile_s[p].append(seconds)
    return compiled, _rounds({p: (lambda c=c: c(rho)) for p, c in compiled.items()}, repeats)


def fixed_section(sizes, peers, method, repeats, scipy_sample):
    print(f"\n# Fixed step: {method.upper()}, dt = {DT}, {round(T1 / DT):,} steps, float32\n")
    makers = {"diffsim": fixed_diffsim, "hand": fixed_hand, "diffrax": fixed_diffrax}
    jitted = {p: makers[p](method) for p in makers if p in peers}
    run = {p: {} for p in peers}
    compile_s = {p: [] for p in jitted}
    finals = {}
    for log2 in sizes:
        n = 2**log2
        rho = rhos(n)
        compiled, timed = _compile_and_time(jitted, rho, repeats, compile_s)
        for p, c in compiled.items():
            finals[p] = np.asarray(c(rho))
        if "numpy" in peers:
            start = time.perf_counter()
            finals["numpy"] = fixed_numpy(rho, method)
            timed["numpy"] = time.perf_counter() - start
        if "torchdiffeq" in peers and method == "rk4" and _torch_peers.available() is None:
            out = _torch_peers.lorenz_fixed(
                np.asarray(rho), dt=DT, t1=T1, repeats=max(1, repeats // 3)
            )
            timed["torchdiffeq"], finals["torchdiffeq"] = out["run_s"], out["final"]
        if "scipy" in peers:
            sample = np.asarray(rho)[np.linspace(0, n - 1, min(scipy_sample, n)).astype(int)]
            start = time.perf_counter()
            scipy_final(sample, "RK45", 1e-6, 1e-9)
            timed["scipy"] = (time.perf_counter() - start) * n / sample.size
        reference = finals.get("diffsim")
        for p, seconds in timed.items():
            run[p][n] = seconds
            diff = None
            if reference is not None and p in finals:
                diff = float(np.max(np.abs(finals[p] - reference)))
            record(
                f"Lorenz fixed-step {method.upper()}",
                NAMES[p],
                members=n,
                run_s=seconds,
                compile_s=compile_s[p][-1] if p in compile_s else None,
                max_abs_diff_vs_diffsim=diff,
            )
    if "torchdiffeq" in peers and method == "rk4" and _torch_peers.available() is not None:
        print(f"torchdiffeq skipped: {_torch_peers.available()}\n")
    measured = [p for p in peers if run.get(p)]
    ns = sorted(run["diffsim"])
    rows = [
        [
            f"2^{n.bit_length() - 1}",
            *(f"{run[p][n] * 1e3:.2f}" if n in run[p] else "-" for p in measured),
        ]
        for n in ns
    ]
    print(table(rows, ["N", *(f"{NAMES[p]} ms" for p in measured)]))
    ratios = {p: [run[p][n] / run["diffsim"][n] for n in ns if n in run[p]] for p in measured}
    print()
    print(
        table(
            [
                [
                    NAMES[p],
                    f"{statistics.median(ratios[p]):.2f}",
                    f"{min(ratios[p]):.2f} - {max(ratios[p]):.2f}",
                    f"{statistics.median(compile_s[p]):.3f}" if p in compile_s else "-",
                ]
                for p in measured
            ],
            ["method", "run / diffsim (median over N)", "range", "compile s (median)"],
        )
    )
    if "diffsim" in finals:
        diffs = {
            p: float(np.max(np.abs(finals[p] - finals["diffsim"])))
            for p in finals
            if p != "diffsim"
        }
        print(
            "\nmax |u(1) - diffsim| at the largest N: "
            + ", ".join(f"{NAMES[p]} {d:.1e}" for p, d in diffs.items())
        )
    return ratios, compile_s, run


def unroll_section(n, method, repeats, factors=(1, 2, 4, 8)):
    """The hand-written scan with `lax.scan(unroll=k)`: whether unrolling pays on this device."""
    print(f"\n# Hand-written scan with lax.scan(unroll=k), N = {n:,}\n")
    rho = rhos(n)
    compiled, compile_s = {}, {}
    for k in factors:
        compile_s[k], compiled[k] = compile_seconds(fixed_hand(method, unroll=k), rho)
    timed = _rounds({k: (lambda c=c: c(rho)) for k, c in compiled.items()}, repeats)
    for k in factors:
        record(
            f"Lorenz fixed-step {method.upper()}, unroll",
            f"hand-written, unroll={k}",
            members=None,
            compile_s=compile_s[k],
            run_s=timed[k],
        )
    print(
        table(
            [
                [k, f"{compile_s[k]:.2f}", f"{timed[k] * 1e3:.2f}", f"{timed[k] / timed[1]:.2f}"]
                for k in factors
            ],
            ["unroll", "compile s", "run ms", "run / unroll=1"],
        )
    )


def adaptive_section(sizes, peers, repeats, rtol=1e-6, atol=1e-6):
    print(
        f"\n# Adaptive Tsit5, rtol = atol = {rtol:g}, under jax.vmap (each member its own steps)\n"
    )
    makers = {"diffsim": adaptive_diffsim, "diffrax": adaptive_diffrax}
    jitted = {p: makers[p](rtol, atol) for p in makers if p in peers}
    run = {p: {} for p in [*jitted, "torchdiffeq"]}
    compile_s = {p: [] for p in jitted}
    steps = {}
    for log2 in sizes:
        n = 2**log2
        rho = rhos(n)
        compiled, timed = _compile_and_time(jitted, rho, repeats, compile_s)
        for p, c in compiled.items():
            steps[p] = int(np.sum(np.asarray(c(rho)[1])))
        if "torchdiffeq" in peers and _torch_peers.available() is None:
            out = _torch_peers.lorenz_adaptive(
                np.asarray(rho), rtol=rtol, atol=atol, t1=T1, repeats=max(1, repeats // 3)
            )
            timed["torchdiffeq"] = out["run_s"]
        for p, seconds in timed.items():
            run[p][n] = seconds
            record(
                "Lorenz adaptive Tsit5",
                NAMES[p] if p != "torchdiffeq" else "torchdiffeq dopri5 (one step size per batch)",
                members=n,
                run_s=seconds,
                compile_s=compile_s[p][-1] if p in compile_s else None,
            )
    measured = [p for p in run if run[p]]
    ns = sorted(run["diffsim"])
    rows = [[f"2^{n.bit_length() - 1}", *(f"{run[p][n] * 1e3:.2f}" for p in measured)] for n in ns]
    labels = {**NAMES, "torchdiffeq": "torchdiffeq dopri5"}
    print(table(rows, ["N", *(f"{labels[p]} ms" for p in measured)]))
    ratios = {p: [run[p][n] / run["diffsim"][n] for n in ns] for p in measured}
    print()
    print(
        table(
            [
                [
                    labels[p],
                    f"{statistics.median(ratios[p]):.2f}",
                    f"{statistics.median(compile_s[p]):.3f}" if p in compile_s else "-",
                    f"{steps[p]:,}" if p in steps else "-",
                ]
                for p in measured
            ],
            [
                "method",
                "run / diffsim (median over N)",
                "compile s (median)",
                "accepted steps, all members (largest N)",
            ],
        )
    )
    return ratios, compile_s


def work_precision_section(n, peers, repeats, tolerances, sample=64):
    print(
        f"\n# Work-precision, adaptive, N = {n:,} (error: max |u(1) - DOP853 float64| over "
        f"{sample} members)\n"
    )
    rho = rhos(n)
    index = np.linspace(0, n - 1, sample).astype(int)
    reference = scipy_final(np.asarray(rho)[index], "DOP853", 1e-12, 1e-12)
    curves = {}
    rows = []
    for tol in tolerances:
        fns = {}
        if "diffsim" in peers:
            fns["diffsim"] = jax.jit(adaptive_diffsim(tol, tol)).lower(rho).compile()
        if "diffrax" in peers:
            fns["diffrax"] = jax.jit(adaptive_diffrax(tol, tol)).lower(rho).compile()
        timed = _rounds({p: (lambda c=c: c(rho)) for p, c in fns.items()}, repeats)
        errors = {
            p: float(np.max(np.abs(np.asarray(c(rho)[0])[index] - reference)))
            for p, c in fns.items()
        }
        if "torchdiffeq" in peers and _torch_peers.available() is None:
            out = _torch_peers.lorenz_adaptive(
                np.asarray(rho), rtol=tol, atol=tol, t1=T1, repeats=max(1, repeats // 3)
            )
            timed["torchdiffeq"] = out["run_s"]
            errors["torchdiffeq"] = float(np.max(np.abs(out["final"][index] - reference)))
        if "scipy" in peers:
            start = time.perf_counter()
            finals = scipy_final(np.asarray(rho)[index], "RK45", tol, tol)
            timed["scipy"] = (time.perf_counter() - start) * n / sample
            errors["scipy"] = float(np.max(np.abs(finals - reference)))
        for p in timed:
            curves.setdefault(p, []).append((errors[p], timed[p]))
            label = {"torchdiffeq": "torchdiffeq dopri5", "scipy": "scipy RK45 (scaled)"}.get(
                p, NAMES[p] + " Tsit5"
            )
            record(
                "Lorenz work-precision",
                label,
                members=None,
                tolerance=tol,
                error=errors[p],
                run_s=timed[p],
            )
            rows.append([f"{tol:g}", label, f"{errors[p]:.2e}", f"{timed[p] * 1e3:.2f}"])
    print(table(rows, ["rtol = atol", "method", "achieved error", "run ms"]))
    at_equal = {}
    for p, curve in curves.items():
        if p == "diffsim":
            continue
        ratios = [
            t / ours for e, ours in curves["diffsim"] if (t := _time_at_error(curve, e)) is not None
        ]
        if ratios:
            at_equal[p] = ratios
    if at_equal:
        print()
        print(
            table(
                [
                    [p if p not in NAMES else NAMES[p], f"{statistics.median(r):.2f}", f"{len(r)}"]
                    for p, r in at_equal.items()
                ],
                ["peer", "peer time / diffsim time at equal error (median)", "tolerances compared"],
            )
        )
    return at_equal


def _time_at_error(curve, error):
    """The run time a method would need for `error`, interpolated log-log along its measured
    (error, time) points; None outside their range."""
    points = sorted(curve)
    for (e0, t0), (e1, t1) in zip(points, points[1:]):
        if e0 <= error <= e1 and e0 > 0:
            if e1 == e0:
                return min(t0, t1)
            w = (np.log(error) - np.log(e0)) / (np.log(e1) - np.log(e0))
            return float(np.exp((1 - w) * np.log(t0) + w * np.log(t1)))
    return None


def _sizes(text: str) -> list[int]:
    if "-" in text:
        low, high = map(int, text.split("-"))
        return list(range(low, high + 1))
    return [int(x) for x in text.split(",")]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8-16", help="log2 of N: a range 8-16 or a list 8,12")
    parser.add_argument("--peers", default=",".join(PEERS), help=f"among {','.join(PEERS)}")
    parser.add_argument("--method", default="rk4", choices=["rk4", "tsit5"])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--scipy-sample", type=int, default=16)
    parser.add_argument("--no-work-precision", action="store_true")
    parser.add_argument("--no-adaptive", action="store_true")
    parser.add_argument("--quick", action="store_true", help="small sizes, for smoke tests")
    args = parser.parse_args(argv)
    sizes = _sizes(args.sizes)
    peers = [p.strip() for p in args.peers.split(",")]
    unknown = sorted(set(peers) - set(PEERS))
    if unknown or "diffsim" not in peers:
        parser.error(f"--peers: unknown {unknown}; choose among {PEERS}, diffsim included")
    tolerances = [1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8]
    wp_n = 2**12
    if args.quick:
        sizes, args.repeats, args.scipy_sample = [8, 10], 2, 4
        tolerances, wp_n = [1e-4, 1e-6], 2**8
    print("# Lorenz ensemble (DiffEqGPU): rho = linspace(0, 21, N), float32, t in [0, 1]")
    print(machine_line())
    if _torch_peers.available() is None:
        print("torchdiffeq: " + ", ".join(f"{k} {v}" for k, v in _torch_peers.versions().items()))

    fixed_ratios, fixed_compile, fixed_run = fixed_section(
        sizes, peers, args.method, args.repeats, args.scipy_sample
    )
    if not args.quick and "hand" in peers:
        unroll_section(2**12, args.method, args.repeats)
    checks = []
    gpu = jax.devices()[0].platform == "gpu"
    if "hand" in fixed_ratios:
        r = statistics.median(fixed_ratios["hand"])
        checks.append(("fixed step: run <= 1.1x hand-written scan", 1 / r, 1 / r <= 1.1))
    if "diffrax" in fixed_ratios:
        r = statistics.median(fixed_ratios["diffrax"])
        checks.append(("fixed step: >= 2x faster than diffrax", r, r >= 2))
        c = statistics.median(fixed_compile["diffsim"]) / statistics.median(
            fixed_compile["diffrax"]
        )
        checks.append(("fixed step: compile <= 0.3x diffrax", c, c <= 0.3))
        if gpu:
            big = [
                fixed_run["diffrax"][n] / fixed_run["diffsim"][n]
                for n in fixed_run["diffsim"]
                if n >= 2**19 and n in fixed_run["diffrax"]
            ]
            if big:
                r = min(big)
                checks.append(
                    ("GPU fixed step: >= 30x faster than diffrax at N >= 2^19", r, r >= 30)
                )
    if gpu and 2**19 in fixed_run["diffsim"]:
        ms = fixed_run["diffsim"][2**19] * 1e3
        checks.append(("GPU fixed step: <= 10 ms at N = 524,288 (ms)", ms, ms <= 10))
    if not args.no_adaptive:
        adaptive_ratios, adaptive_compile = adaptive_section(sizes, peers, args.repeats)
        if "diffrax" in adaptive_ratios:
            c = statistics.median(adaptive_compile["diffsim"]) / statistics.median(
                adaptive_compile["diffrax"]
            )
            checks.append(("adaptive: compile <= 0.3x diffrax", c, c <= 0.3))
    if not (args.no_work_precision or args.no_adaptive):
        at_equal = work_precision_section(wp_n, peers, args.repeats, tolerances)
        if "diffrax" in at_equal:
            r = statistics.median(at_equal["diffrax"])
            checks.append(
                ("adaptive Tsit5: >= 1.5x faster than diffrax at equal error", r, r >= 1.5)
            )
    print()
    print(targets_table(checks))


if __name__ == "__main__":
    main()
