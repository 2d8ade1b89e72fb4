"""Sobol' benchmark: `ds.sobol` against SALib driving the same simulations.

Two workloads, float64, in one process run:

(a) An ODE quantity: the peak infected fraction max_t I(t) of the SIR epidemic (`models.SIR`,
    population 1, state [S, I, R] from [1, i0, 0]), over t in [0, 200] days at 401 output times,
    with β ~ U(0.25, 0.5), γ ~ U(0.05, 0.15) and the initial infected i0 ~ U(0.001, 0.01)
    (`ds.sobol` varies an initial-state component by the name "y0[1]"; it varies each
    component alone, so S starts at 1 whatever i0 is: the population is 1 + i0, for every
    method alike). N base samples (N (d + 2) simulations, d = 3; first-order and total indices
    only), N = 2^10 (quick 2^6):
      - `ds.sobol` with Tsit5 (rtol 1e-8, atol 1e-10), and with RK4 (dt 0.05);
      - SALib (`SALib.sample.sobol.sample`, `SALib.analyze.sobol.analyze`, no second order)
        driving a Python loop of `scipy.integrate.solve_ivp` (RK45, the same tolerances, the
        same output times): the peer of the target;
      - SALib driving RK4 (dt 0.05) written in NumPy, vectorised over all members at once.
    `ds.sobol` compiles inside the call: each call is timed whole, its compile time read from
    JAX's compile events (`_timing.CompileClock`), run = call − compile; it is called twice
    with the same shapes (the second call reuses the compiled program). One-time costs of the
    process (imports, first dispatches) are paid by a tiny warm-up call of each library first.
    SALib's time is its design + the simulations + its analysis. The indices of every
    method are compared with a reference: SALib + NumPy RK4 at 16 N (the designs differ, Halton
    against scrambled Sobol', so they agree to their Monte Carlo error, not exactly).

(b) The Ishigami function (a = 7, b = 0.1, x_i ~ U(−π, π)), whose indices are known in closed
    form. `ds.sobol` runs simulations only (a model and a `reduce` of its solution; no plain
    function), so the function is written as an ODE whose solution at t = 1 is its value:
    dy/dt = f(x1, x2, x3), y(0) = 0, one Euler step of dt = 1 (exact). Against SALib on
    `SALib.test_functions.Ishigami.evaluate` and the closed form, N = 2^12 (quick 2^8).

Run: `python experiments/bench/sobol_salib.py [--quick]`
"""

import argparse
import os
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

sys.path.insert(0, os.path.dirname(__file__))
from _timing import CompileClock, machine_line, record, table, targets_table

import diffsim as ds
import models

RANGES = {"beta": (0.25, 0.5), "gamma": (0.05, 0.15), "y0[1]": (1e-3, 1e-2)}
T1 = 200.0
TS = np.linspace(0.0, T1, 401)
RTOL, ATOL = 1e-8, 1e-10
RK4_DT = 0.05
SAVE_EVERY = round((TS[1] - TS[0]) / RK4_DT)  # RK4 steps between output times
BOOTSTRAP = 256  # resamples of both ds.sobol's and SALib's intervals
ISHIGAMI_A, ISHIGAMI_B = 7.0, 0.1


def salib_problem(ranges: dict) -> dict:
    return {
        "num_vars": len(ranges),
        "names": list(ranges),
        "bounds": [list(bounds) for bounds in ranges.values()],
    }


def peak_infected(solution):
    return jnp.max(solution.ys[:, 1])


def run_ds_sobol(model, ranges, y0, ts, n, reduce, solver, dt=None):
    """One `ds.sobol` call → (seconds, compile seconds, dataset)."""
    with CompileClock() as clock:
        start = time.perf_counter()
        result = ds.sobol(
            model,
            ranges,
            y0,
            ts,
            solver=solver,
            dt=dt,
            reduce=reduce,
            base_samples=n,
            bootstrap=BOOTSTRAP,
            progress=False,
        )
        seconds = time.perf_counter() - start
    return seconds, clock.seconds, result


def ds_indices(result) -> dict:
    return {
        "S1": np.asarray(result["first_order"].values),
        "ST": np.asarray(result["total"].values),
        "S1 interval": np.stack(
            [result["first_order_low"].values, result["first_order_high"].values]
        ),
        "ST interval": np.stack([result["total_low"].values, result["total_high"].values]),
    }


def salib_indices(problem, outputs) -> dict:
    from SALib.analyze import sobol as sobol_analyze

    found = sobol_analyze.analyze(
        problem, outputs, calc_second_order=False, num_resamples=BOOTSTRAP, seed=0
    )
    return {
        "S1": np.asarray(found["S1"]),
        "ST": np.asarray(found["ST"]),
        "S1 ±": np.asarray(found["S1_conf"]),
        "ST ±": np.asarray(found["ST_conf"]),
    }


def salib_design(problem, n: int) -> np.ndarray:
    from SALib.sample import sobol as sobol_sample

    return sobol_sample.sample(problem, n, calc_second_order=False, seed=0)


def scipy_peaks(design: np.ndarray) -> np.ndarray:
    """The peak infected fraction of each row (β, γ, i0), one `solve_ivp` at a time."""
    from scipy.integrate import solve_ivp

    def field(t, y, beta, gamma):
        infection = beta * y[0] * y[1]
        recovery = gamma * y[1]
        return [-infection, infection - recovery, recovery]

    peaks = np.empty(len(design))
    for k, (beta, gamma, i0) in enumerate(design):
        solution = solve_ivp(
            field,
            (0.0, T1),
            [1.0, i0, 0.0],
            method="RK45",
            t_eval=TS,
            args=(beta, gamma),
            rtol=RTOL,
            atol=ATOL,
        )
        peaks[k] = solution.y[1].max()
    return peaks


def numpy_rk4_peaks(design: np.ndarray) -> np.ndarray:
    """The peak infected fraction of every row at once: classical RK4, dt = RK4_DT, in NumPy."""
    beta, gamma, i0 = (np.ascontiguousarray(design[:, j]) for j in range(3))
    y = np.stack([np.ones_like(i0), i0, np.zeros_like(i0)])

    def field(y):
        infection = beta * y[0] * y[1]
        recovery = gamma * y[1]
        return np.stack([-infection, infection - recovery, recovery])

    peak = y[1].copy()
    h = RK4_DT
    for step in range(1, round(T1 / h) + 1):
        k1 = field(y)
        k2 = field(y + 0.5 * h * k1)
        k3 = field(y + 0.5 * h * k2)
        k4 = field(y + h * k3)
        y = y + (h / 6) * (k1 + 2 * k2 + 2 * k3 + k4)
        if step % SAVE_EVERY == 0:
            np.maximum(peak, y[1], out=peak)
    return peak


def timed(fn, *args):
    start = time.perf_counter()
    value = fn(*args)
    return time.perf_counter() - start, value


def run_salib(problem, n: int, evaluate) -> dict:
    """SALib's design, the simulations by `evaluate`, SALib's analysis; each timed."""
    design_s, design = timed(salib_design, problem, n)
    model_s, outputs = timed(evaluate, design)
    analyze_s, indices = timed(salib_indices, problem, outputs)
    return dict(
        design_s=design_s,
        model_s=model_s,
        analyze_s=analyze_s,
        seconds=design_s + model_s + analyze_s,
        indices=indices,
        simulations=len(design),
    )


class Ishigami(ds.AbstractODE):
    """dy/dt = sin x1 + a sin² x2 + b x3⁴ sin x1, constant in time: y(1) − y(0) is the Ishigami
    function of (x1, x2, x3)."""

    x1: Array = ds.parameter(0.0, ndim=0)
    x2: Array = ds.parameter(0.0, ndim=0)
    x3: Array = ds.parameter(0.0, ndim=0)

    def vector_field(self, t, y, args=None):
        value = (
            jnp.sin(self.x1)
            + ISHIGAMI_A * jnp.sin(self.x2) ** 2
            + ISHIGAMI_B * self.x3**4 * jnp.sin(self.x1)
        )
        return jnp.broadcast_to(value, y.shape)


def ishigami_exact() -> dict:
    """The closed-form first-order and total indices of the Ishigami function."""
    a, b, pi = ISHIGAMI_A, ISHIGAMI_B, np.pi
    v1 = 0.5 * (1 + b * pi**4 / 5) ** 2
    v2 = a**2 / 8
    v13 = 8 * b**2 * pi**8 / 225
    total = v1 + v2 + v13
    return {"S1": np.array([v1, v2, 0.0]) / total, "ST": np.array([v1 + v13, v2, v13]) / total}


def final_value(solution):
    return solution.ys[-1, 0]


def _interval(indices: dict, key: str, j: int) -> str:
    value = indices[key][j]
    if f"{key} interval" in indices:
        low, high = indices[f"{key} interval"][:, j]
        return f"{value:.3f} [{low:.3f}, {high:.3f}]"
    if f"{key} ±" in indices:
        return f"{value:.3f} ± {indices[f'{key} ±'][j]:.3f}"
    return f"{value:.3f}"


def indices_table(names, methods: dict) -> str:
    rows = []
    for j, name in enumerate(names):
        for label, indices in methods.items():
            rows.append([name, label, _interval(indices, "S1", j), _interval(indices, "ST", j)])
    return table(rows, ["parameter", "method", "S1 (interval)", "ST (interval)"])


def largest_difference(indices: dict, reference: dict) -> float:
    return float(
        max(np.max(np.abs(indices[k] - reference[k])) for k in ("S1", "ST") if k in reference)
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for smoke tests")
    args = parser.parse_args(argv)
    n = 2**6 if args.quick else 2**10
    n_ishigami = 2**8 if args.quick else 2**12
    # compile times are measured: no persistent cache to read programs back from an earlier run
    ds.config(cache=False)
    d = len(RANGES)
    print(
        f"# Sobol' indices: SIR peak infected fraction over (β, γ, i0), N = {n:,} "
        f"({n * (d + 2):,} simulations), float64"
    )
    print(machine_line())

    # (a) the SIR peak
    sir = models.SIR(population=1.0)
    y0 = jnp.array([1.0, 5e-3, 0.0])
    ts = jnp.asarray(TS)
    solvers = {
        "Tsit5": dict(solver=ds.Tsit5(rtol=RTOL, atol=ATOL)),
        "RK4": dict(solver=ds.RK4(), dt=RK4_DT),
    }
    # one-time costs of the process (imports, first dispatches) charged to no method: a tiny
    # ds.sobol of another model (its own compilation) and a tiny SALib design and analysis
    problem = salib_problem(
        {"beta": RANGES["beta"], "gamma": RANGES["gamma"], "i0": RANGES["y0[1]"]}
    )
    warm = dict(zip(("x1", "x2", "x3"), [(-np.pi, np.pi)] * 3))
    run_ds_sobol(
        Ishigami(), warm, jnp.zeros(1), jnp.array([0.0, 1.0]), 4, final_value, ds.Euler(), 1.0
    )
    run_salib(problem, 4, numpy_rk4_peaks)
    timings, found = {}, {}
    for label, options in solvers.items():
        calls = [run_ds_sobol(sir, RANGES, y0, ts, n, peak_infected, **options) for _ in (1, 2)]
        timings[f"ds.sobol, {label}"] = calls
        found[f"ds.sobol, {label}"] = ds_indices(calls[0][2])
        assert np.allclose(found[f"ds.sobol, {label}"]["S1"], ds_indices(calls[1][2])["S1"])
    salib = {
        "SALib + solve_ivp loop (RK45)": run_salib(problem, n, scipy_peaks),
        "SALib + NumPy RK4 (vectorised)": run_salib(problem, n, numpy_rk4_peaks),
    }
    reference_n = 16 * n
    reference = run_salib(problem, reference_n, numpy_rk4_peaks)["indices"]
    for label, outcome in salib.items():
        found[label] = outcome["indices"]

    peer = salib["SALib + solve_ivp loop (RK45)"]["seconds"]
    rows = []
    for label, calls in timings.items():
        (first, first_compile, _), (second, second_compile, _) = calls
        rows.append(
            [
                label,
                f"{first:.2f}",
                f"{first_compile:.2f}",
                f"{first - first_compile:.2f}",
                f"{second:.2f} ({second_compile:.2f} compiling)",
                f"{peer / first:.1f}",
                f"{largest_difference(found[label], reference):.3f}",
            ]
        )
        record(
            "Sobol SIR peak",
            label,
            members=n * (d + 2),
            compile_s=first_compile,
            run_s=first - first_compile,
            whole_s=first,
            second_call_s=second,
        )
    for label, outcome in salib.items():
        rows.append(
            [
                label,
                f"{outcome['seconds']:.2f}",
                "-",
                f"{outcome['model_s']:.2f} (design {outcome['design_s']:.2f}, analysis "
                f"{outcome['analyze_s']:.2f})",
                "-",
                f"{peer / outcome['seconds']:.1f}",
                f"{largest_difference(found[label], reference):.3f}",
            ]
        )
        record(
            "Sobol SIR peak",
            label,
            members=outcome["simulations"],
            run_s=outcome["seconds"],
            model_s=outcome["model_s"],
        )
    print()
    print(
        table(
            rows,
            [
                "method",
                "first call s",
                "compile s",
                "run s",
                "second call s",
                "SALib + solve_ivp ÷ this (first call)",
                f"largest |Δ index| vs reference (N = {reference_n:,})",
            ],
        )
    )
    print()
    print(
        f"Indices (ds.sobol: percentile bootstrap interval; SALib: ± its confidence half-width, "
        f"both {BOOTSTRAP} resamples at 95 %); reference: SALib + NumPy RK4 at N = {reference_n:,}:"
    )
    print(indices_table(["β", "γ", "i0"], {**found, "reference": reference}))

    # (b) Ishigami
    from SALib.test_functions import Ishigami as salib_ishigami

    bounds = (-np.pi, np.pi)
    ishigami_ranges = {"x1": bounds, "x2": bounds, "x3": bounds}
    calls = [
        run_ds_sobol(
            Ishigami(),
            ishigami_ranges,
            jnp.zeros(1),
            jnp.array([0.0, 1.0]),
            n_ishigami,
            final_value,
            ds.Euler(),
            1.0,
        )
        for _ in (1, 2)
    ]
    ishigami_salib = run_salib(salib_problem(ishigami_ranges), n_ishigami, salib_ishigami.evaluate)
    exact = ishigami_exact()
    ishigami_found = {
        "ds.sobol (an ODE whose y(1) is the function)": ds_indices(calls[0][2]),
        "SALib": ishigami_salib["indices"],
        "closed form": exact,
    }
    (first, first_compile, _), (second, second_compile, _) = calls
    record(
        "Sobol Ishigami",
        "ds.sobol",
        members=n_ishigami * 5,
        compile_s=first_compile,
        run_s=first - first_compile,
        whole_s=first,
    )
    record("Sobol Ishigami", "SALib", members=n_ishigami * 5, run_s=ishigami_salib["seconds"])
    print()
    print(
        f"# Ishigami function (a = {ISHIGAMI_A:g}, b = {ISHIGAMI_B:g}), N = {n_ishigami:,} "
        f"({5 * n_ishigami:,} evaluations)"
    )
    print()
    errors = {
        label: largest_difference(indices, exact)
        for label, indices in ishigami_found.items()
        if label != "closed form"
    }
    print(
        table(
            [
                [
                    "ds.sobol",
                    f"{first:.2f}",
                    f"{first_compile:.2f}",
                    f"{second:.2f} ({second_compile:.2f} compiling)",
                    f"{errors['ds.sobol (an ODE whose y(1) is the function)']:.3f}",
                ],
                [
                    "SALib",
                    f"{ishigami_salib['seconds']:.3f}",
                    "-",
                    "-",
                    f"{errors['SALib']:.3f}",
                ],
            ],
            ["method", "first call s", "compile s", "second call s", "largest |Δ index| vs exact"],
        )
    )
    print()
    print(indices_table(["x1", "x2", "x3"], ishigami_found))

    first_ratio = peer / timings["ds.sobol, Tsit5"][0][0]
    run_ratio = peer / (timings["ds.sobol, Tsit5"][0][0] - timings["ds.sobol, Tsit5"][0][1])
    agreement = largest_difference(found["ds.sobol, Tsit5"], reference)
    # the indices' Monte Carlo error falls like 1/sqrt(N): 0.05 at N = 1,024 is 0.2 at N = 64
    tolerance = 0.05 * np.sqrt(1024 / n)
    print()
    print(
        targets_table(
            [
                (
                    "SIR peak: ds.sobol (Tsit5) >= 10x faster than SALib driving a Python loop "
                    "of solve_ivp (first call, compile included)",
                    first_ratio,
                    first_ratio >= 10,
                ),
                (
                    "SIR peak: the same, compile excluded (ds.sobol's run time)",
                    run_ratio,
                    run_ratio >= 10,
                ),
                (
                    f"SIR peak: ds.sobol's indices within {tolerance:.2g} of the reference "
                    "(largest |Δ|)",
                    agreement,
                    agreement <= tolerance,
                ),
            ]
        )
    )


if __name__ == "__main__":
    main()
