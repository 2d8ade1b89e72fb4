"""Fitting benchmark: `ds.fit` against the same least-squares problem written by hand, and scipy.

The problem: a damped pendulum's length and damping from 101 noisy angle values over 10 s
(`experiments/fit_pendulum.py`), from the guess (0.8 m, 0.1 1/s), float64. In one process run:
  (a) `ds.fit(..., method="lm")` with RK4, dt = 0.01 (1,000 steps) — the whole call: setup,
      Levenberg–Marquardt, covariances (Fisher and Laplace), identifiability check;
  (b) the same fit written by hand: `diffrax.diffeqsolve` (RK4 tableau, constant step 0.01)
      inside `optimistix.least_squares` with `LevenbergMarquardt`, log-transformed parameters,
      jitted — the optimum only, no covariance; the residual Jacobian in forward mode through
      `diffrax.ForwardMode()` (diffrax's default adjoint is reverse mode only, and far slower
      here: 2 unknowns, 101 residuals);
  (c) `scipy.optimize.least_squares` (trust-region reflective, 2-point finite differences)
      over `scipy.integrate.solve_ivp` (RK45, rtol 1e-8, atol 1e-10) with a NumPy vector field;
  (d), (e) as (a), (b) with the adaptive Tsit5 (rtol = atol = 1e-8); `ds.fit` builds the
      Jacobian in forward mode too.
Compile time (first call, read from JAX's compile events for `ds.fit`) and run time (median of
repeats of the compiled fit) are reported separately; every fit must reach the same optimum.

Run: `python experiments/bench/fit.py [--repeats N] [--quick]`
"""

import argparse
import os
import sys
import time
import warnings

import jax

jax.config.update("jax_enable_x64", True)

import diffrax
import jax.numpy as jnp
import numpy as np
import optimistix as optx

sys.path.insert(0, os.path.dirname(__file__))
from _timing import (
    compile_seconds,
    CompileClock,
    machine_line,
    record,
    run_seconds,
    table,
    targets_table,
)
from fixed_step import _DiffraxRK4

import diffsim as ds
import models

TS = np.linspace(0.0, 10.0, 101)
Y0 = np.array([1.0, 0.0])
GUESS = (0.8, 0.1)
TRUTH = (1.3, 0.25)
DT = 0.01


def data() -> np.ndarray:
    truth = models.DampedPendulum(length=TRUTH[0], damping=TRUTH[1])
    clean = ds.simulate(truth, jnp.asarray(Y0), TS, solver=ds.RK4(), dt=DT).ys[:, 0]
    return np.asarray(clean) + 0.05 * np.random.default_rng(0).standard_normal(TS.size)


def angle(y):
    return y[0]


def make_ds_fit(values, solver, dt):
    guess = models.DampedPendulum(length=GUESS[0], damping=GUESS[1])
    y0 = jnp.asarray(Y0)

    def run():
        result = ds.fit(
            guess,
            y0,
            (TS, values),
            params=["length", "damping"],
            observe=angle,
            solver=solver,
            dt=dt,
        )
        return np.array([result.params["length"], result.params["damping"]])

    return run


def make_hand_fit(values, solver, adaptive: bool):
    values = jnp.asarray(values)
    y0 = jnp.asarray(Y0)
    term = diffrax.ODETerm(
        lambda t, y, p: jnp.stack([y[1], -(9.81 / p[0]) * jnp.sin(y[0]) - p[1] * y[1]])
    )
    if adaptive:
        options = dict(dt0=None, stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-8))
    else:
        options = dict(dt0=DT)

    def residuals(u, _):
        p = jnp.exp(u)
        solution = diffrax.diffeqsolve(
            term,
            solver,
            TS[0],
            TS[-1],
            y0=y0,
            args=p,
            saveat=diffrax.SaveAt(ts=jnp.asarray(TS)),
            max_steps=4096,
            adjoint=diffrax.ForwardMode(),
            **options,
        )
        return solution.ys[:, 0] - values

    lm = optx.LevenbergMarquardt(rtol=1e-8, atol=1e-10)

    @jax.jit
    def fit(u0):
        solution = optx.least_squares(residuals, lm, u0, options={"jac": "fwd"}, max_steps=256)
        return jnp.exp(solution.value)

    return fit


def scipy_fit(values):
    from scipy.integrate import solve_ivp
    from scipy.optimize import least_squares

    def field(t, y, length, damping):
        return [y[1], -(9.81 / length) * np.sin(y[0]) - damping * y[1]]

    def residuals(u):
        length, damping = np.exp(u)
        solution = solve_ivp(
            field, (TS[0], TS[-1]), Y0, t_eval=TS, args=(length, damping), rtol=1e-8, atol=1e-10
        )
        return solution.y[0] - values

    result = least_squares(residuals, np.log(GUESS), xtol=1e-10, ftol=1e-10)
    return np.exp(result.x)


def first_call(fn, *args) -> tuple[float, float, object]:
    """(compile seconds from JAX's events, total seconds, value) of a first call."""
    with CompileClock() as clock:
        start = time.perf_counter()
        value = jax.block_until_ready(fn(*args))
        total = time.perf_counter() - start
    return clock.seconds, total, value


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="fewer repeats, for smoke tests")
    args = parser.parse_args(argv)
    repeats = 1 if args.quick else args.repeats
    warnings.simplefilter("ignore", ds.FitWarning)
    values = data()
    print(machine_line())
    print(f"problem: pendulum length and damping, {TS.size} angle values, float64\n")
    u0 = jnp.log(jnp.asarray(GUESS))
    rows, results, run = [], {}, {}
    cases = [
        ("ds.fit, RK4 dt=0.01", "ds", make_ds_fit(values, ds.RK4(), DT)),
        ("diffrax + optimistix by hand, RK4", "hand", make_hand_fit(values, _DiffraxRK4(), False)),
    ]
    if not args.quick:  # the smoke run skips the adaptive pair (the slowest to compile)
        cases += [
            ("ds.fit, Tsit5 1e-8", "ds", make_ds_fit(values, ds.Tsit5(rtol=1e-8, atol=1e-8), None)),
            (
                "diffrax + optimistix by hand, Tsit5",
                "hand",
                make_hand_fit(values, diffrax.Tsit5(), True),
            ),
        ]
    for label, kind, fn in cases:
        if kind == "ds":
            compile_s, total, value = first_call(fn)
            run_s = run_seconds(fn, repeats=repeats)
        else:
            compile_s, compiled = compile_seconds(fn, u0)
            value = compiled(u0)
            run_s = run_seconds(compiled, u0, repeats=repeats)
        results[label] = np.asarray(value)
        run[label] = run_s
        rows.append([label, f"{compile_s:.2f}", f"{1e3 * run_s:.1f}", _params(value)])
        record("fit (pendulum length, damping)", label, compile_s=compile_s, run_s=run_s)
    start = time.perf_counter()
    value = scipy_fit(values)
    scipy_s = time.perf_counter() - start
    results["scipy"] = value
    run["scipy"] = scipy_s
    record("fit (pendulum length, damping)", "scipy least_squares + solve_ivp", run_s=scipy_s)
    rows.append(
        ["scipy least_squares + solve_ivp (RK45)", "-", f"{1e3 * scipy_s:.1f}", _params(value)]
    )
    print(table(rows, ["fit", "compile s", "run ms", "length, damping"]))
    reference = results["ds.fit, RK4 dt=0.01"]
    spread = max(np.max(np.abs(v / reference - 1)) for v in results.values())
    print(f"\nlargest relative difference between the optima: {spread:.1e}")
    ratio_rk4 = run["ds.fit, RK4 dt=0.01"] / run["diffrax + optimistix by hand, RK4"]
    speedup = run["scipy"] / run["ds.fit, RK4 dt=0.01"]
    checks = [("RK4: ds.fit run <= 1.2x hand-written", ratio_rk4, ratio_rk4 <= 1.2)]
    if not args.quick:
        ratio_tsit5 = run["ds.fit, Tsit5 1e-8"] / run["diffrax + optimistix by hand, Tsit5"]
        checks.append(("Tsit5: ds.fit run <= 1.2x hand-written", ratio_tsit5, ratio_tsit5 <= 1.2))
    checks.append(("ds.fit (RK4) >= 20x faster than scipy", speedup, speedup >= 20))
    print()
    print(targets_table(checks))


def _params(value) -> str:
    return ", ".join(f"{v:.6f}" for v in np.asarray(value))


if __name__ == "__main__":
    main()
