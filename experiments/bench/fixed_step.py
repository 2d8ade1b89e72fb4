"""Fixed-step ensemble benchmark: a damped pendulum ensemble, RK4, float32.

10,000 parameter sets (length, damping), 1,000 RK4 steps of dt = 0.01 over t in [0, 10], final
state only. Compared in one process run against
  (a) the same method written by hand as `jax.vmap` over `lax.scan`,
  (b) `diffrax.diffeqsolve` with the same RK4 tableau and a constant step, under `jax.vmap`,
  (c) NumPy, vectorized over the ensemble, and
  (d) scipy `solve_ivp` (RK45, rtol 1e-6, atol 1e-9; scipy has no fixed-step RK4) looped over a
      sample of the ensemble and scaled up to its size, and
  (e) torchdiffeq `rk4` (its 3/8-rule variant: same cost) on one batched CPU tensor, when the
      `bench` extra is installed.
Compile time (trace + lower + compile) and run time (median of repeats after warm-up,
`block_until_ready`) are reported separately; ratios are against diffsim in the same run.

Run: `python experiments/bench/fixed_step.py [--members N] [--steps N] [--quick]`
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
from _timing import (
    fresh_compile_seconds,
    machine_line,
    record,
    table,
    targets_table,
)

import diffsim as ds
import models

GRAVITY = 9.81
T1 = 10.0
Y0 = (1.0, 0.0)


def ensemble(members: int):
    rng = np.random.default_rng(0)
    lengths = rng.uniform(0.5, 2.0, members).astype(np.float32)
    dampings = rng.uniform(0.0, 0.5, members).astype(np.float32)
    return jnp.asarray(lengths), jnp.asarray(dampings)


def make_diffsim(steps: int):
    ts = jnp.array([0.0, T1], jnp.float32)
    y0 = jnp.array(Y0, jnp.float32)

    def one(length, damping):
        model = models.DampedPendulum(length=length, gravity=GRAVITY, damping=damping)
        return ds.simulate(model, y0, ts, solver=ds.RK4(), dt=T1 / steps, throw=False).ys[-1]

    return jax.jit(jax.vmap(one))


def _pendulum(length, damping):
    def field(t, y):
        return jnp.stack([y[1], -(GRAVITY / length) * jnp.sin(y[0]) - damping * y[1]])

    return field


def make_hand_scan(steps: int):
    dt = jnp.float32(T1 / steps)

    def one(length, damping):
        f = _pendulum(length, damping)

        def step(carry, _):
            t, y = carry
            k1 = f(t, y)
            k2 = f(t + dt / 2, y + dt / 2 * k1)
            k3 = f(t + dt / 2, y + dt / 2 * k2)
            k4 = f(t + dt, y + dt * k3)
            return (t + dt, y + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)), None

        (_, y), _ = lax.scan(
            step, (jnp.float32(0.0), jnp.array(Y0, jnp.float32)), None, length=steps
        )
        return y

    return jax.jit(jax.vmap(one))


class _DiffraxRK4(diffrax.AbstractERK):
    """Classical RK4 in diffrax (which ships no RK4 of its own), for a like-for-like comparison."""

    tableau = diffrax.ButcherTableau(
        c=np.array([0.5, 0.5, 1.0]),
        b_sol=np.array([1 / 6, 1 / 3, 1 / 3, 1 / 6]),
        b_error=np.zeros(4),
        a_lower=(np.array([0.5]), np.array([0.0, 0.5]), np.array([0.0, 0.0, 1.0])),
    )
    interpolation_cls = diffrax.ThirdOrderHermitePolynomialInterpolation.from_k

    def order(self, terms):
        return 4


def make_diffrax(steps: int):
    def one(length, damping):
        f = _pendulum(length, damping)
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(lambda t, y, args: f(t, y)),
            _DiffraxRK4(),
            t0=0.0,
            t1=T1,
            dt0=T1 / steps,
            y0=jnp.array(Y0, jnp.float32),
            saveat=diffrax.SaveAt(t1=True),
            stepsize_controller=diffrax.ConstantStepSize(),
            max_steps=steps,
            throw=False,
        )
        return sol.ys[-1]

    return jax.jit(jax.vmap(one))


def numpy_rk4(lengths, dampings, steps: int):
    lengths, dampings = np.asarray(lengths), np.asarray(dampings)
    dt = np.float32(T1 / steps)
    theta = np.full_like(lengths, Y0[0])
    omega = np.full_like(lengths, Y0[1])
    g_over_l = np.float32(GRAVITY) / lengths

    def f(th, om):
        return om, -g_over_l * np.sin(th) - dampings * om

    for _ in range(steps):
        a1, b1 = f(theta, omega)
        a2, b2 = f(theta + dt / 2 * a1, omega + dt / 2 * b1)
        a3, b3 = f(theta + dt / 2 * a2, omega + dt / 2 * b2)
        a4, b4 = f(theta + dt * a3, omega + dt * b3)
        theta = theta + dt / 6 * (a1 + 2 * a2 + 2 * a3 + a4)
        omega = omega + dt / 6 * (b1 + 2 * b2 + 2 * b3 + b4)
    return np.stack([theta, omega], axis=-1)


def scipy_sample(lengths, dampings, sample: int):
    from scipy.integrate import solve_ivp

    start = time.perf_counter()
    finals = []
    for length, damping in zip(np.asarray(lengths)[:sample], np.asarray(dampings)[:sample]):

        def rhs(t, y, length=float(length), damping=float(damping)):
            return [y[1], -(GRAVITY / length) * np.sin(y[0]) - damping * y[1]]

        finals.append(solve_ivp(rhs, (0.0, T1), Y0, method="RK45", rtol=1e-6, atol=1e-9).y[:, -1])
    return time.perf_counter() - start, np.array(finals)


def _kepler_ensemble(members: int):
    eccentricities = jnp.asarray(np.linspace(0.0, 0.7, members), jnp.float32)
    return eccentricities, jax.vmap(models.Kepler().initial_state)(eccentricities)


def make_leapfrog_diffsim(steps: int, t1: float):
    ts = jnp.array([0.0, t1], jnp.float32)

    def one(y0):
        return ds.simulate(
            models.Kepler(), y0, ts, solver=ds.Leapfrog(), dt=t1 / steps, throw=False
        ).ys[-1]

    return jax.jit(jax.vmap(one))


def make_leapfrog_hand(steps: int, t1: float):
    """Velocity Verlet written by hand: one force evaluation per step (the closing force is
    carried into the next step)."""
    dt = jnp.float32(t1 / steps)

    def force(q):
        inverse_r = lax.rsqrt(jnp.sum(q**2))
        return -q * (inverse_r * inverse_r * inverse_r)

    def one(y0):
        def step(carry, _):
            q, p, f = carry
            p_half = p + dt / 2 * f
            q = q + dt * p_half
            f = force(q)
            return (q, p_half + dt / 2 * f, f), None

        (q, p, _), _ = lax.scan(step, (y0[0], y0[1], force(y0[0])), None, length=steps)
        return jnp.stack([q, p])

    return jax.jit(jax.vmap(one))


def symplectic_section(members: int, steps: int, repeats: int):
    """Leapfrog on a Kepler ensemble (eccentricities 0 ... 0.7, 2-D, float32) against velocity
    Verlet written by hand; both evaluate the force once per step."""
    t1 = 2 * np.pi  # one orbit
    _, y0 = _kepler_ensemble(members)
    print(
        f"\n# Symplectic: Leapfrog, Kepler ensemble, {members:,} orbits x {steps:,} steps, "
        "float32\n"
    )
    peers = {
        "diffsim Leapfrog": make_leapfrog_diffsim,
        "hand-written velocity Verlet": make_leapfrog_hand,
    }
    compiled, compile_s, run_s = {}, {}, {}
    for name, make in peers.items():
        compile_s[name], compiled[name] = fresh_compile_seconds(make(steps, t1), y0)
        jax.block_until_ready(compiled[name](y0))
    for name, fn in compiled.items():
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            jax.block_until_ready(fn(y0))
            times.append(time.perf_counter() - start)
        run_s[name] = statistics.median(times)
        record(
            "Kepler Leapfrog",
            name,
            members=members,
            steps=steps,
            compile_s=compile_s[name],
            run_s=run_s[name],
        )
    ours = run_s["diffsim Leapfrog"]
    finals = [np.asarray(fn(y0)) for fn in compiled.values()]
    difference = float(np.max(np.abs(finals[0] - finals[1])))
    print(
        table(
            [
                [
                    name,
                    f"{compile_s[name]:.3f}",
                    f"{run_s[name] * 1e3:.1f}",
                    f"{run_s[name] / ours:.2f}",
                ]
                for name in compiled
            ],
            ["method", "compile s", "run ms", "run / diffsim"],
        )
    )
    print(f"\nmax |final - hand| = {difference:.1e}")
    hand = run_s["hand-written velocity Verlet"]
    return ("Leapfrog: run <= 1.1x hand-written velocity Verlet", ours / hand, ours <= 1.1 * hand)


def compile_scaling(steps_list, members: int):
    """Compile time of diffsim's ensemble at different step counts (should not grow)."""
    lengths, dampings = ensemble(members)
    return [fresh_compile_seconds(make_diffsim(n), lengths, dampings)[0] for n in steps_list]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=1_000)
    parser.add_argument("--scipy-sample", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--quick", action="store_true", help="small sizes, for smoke tests")
    args = parser.parse_args(argv)
    if args.quick:
        args.members, args.steps, args.scipy_sample, args.repeats = 500, 100, 5, 2

    lengths, dampings = ensemble(args.members)
    print(
        f"# Fixed-step ensemble: damped pendulum, RK4, float32, {args.members:,} members x "
        f"{args.steps:,} steps"
    )
    print(machine_line())

    # Compile time: the median over three fresh compilations (_timing.fresh_compile_seconds).
    peers = [
        ("diffsim", make_diffsim),
        ("hand-written vmap(scan)", make_hand_scan),
        ("diffrax (constant step)", make_diffrax),
    ]
    compiled, compile_s = {}, {}
    for name, make in peers:
        compile_s[name], compiled[name] = fresh_compile_seconds(make(args.steps), lengths, dampings)
    # Run time: rounds that time each method once, in a shuffled order, so that drifts in machine
    # speed hit all of them alike; the median over rounds.
    for name in compiled:
        jax.block_until_ready(compiled[name](lengths, dampings))
    rounds = {name: [] for name in compiled}
    order = np.random.default_rng(1)
    for _ in range(args.repeats):
        for name in order.permutation(list(compiled)):  # no method always follows the same one
            fn = compiled[name]
            start = time.perf_counter()
            jax.block_until_ready(fn(lengths, dampings))
            rounds[name].append(time.perf_counter() - start)
    results = {
        name: (
            compile_s[name],
            statistics.median(rounds[name]),
            np.asarray(compiled[name](lengths, dampings)),
        )
        for name in compiled
    }

    start = time.perf_counter()
    numpy_final = numpy_rk4(lengths, dampings, args.steps)
    results["NumPy (vectorized)"] = (None, time.perf_counter() - start, numpy_final)

    scipy_s, scipy_final = scipy_sample(lengths, dampings, args.scipy_sample)
    results[
        f"scipy solve_ivp RK45 (x{args.members // args.scipy_sample} of {args.scipy_sample})"
    ] = (None, scipy_s * args.members / args.scipy_sample, None)

    if _torch_peers.available() is None:
        out = _torch_peers.pendulum_rk4(
            np.asarray(lengths),
            np.asarray(dampings),
            gravity=GRAVITY,
            t1=T1,
            steps=args.steps,
            y0=Y0,
            repeats=max(1, args.repeats // 3),
        )
        results["torchdiffeq rk4 (CPU, batched)"] = (None, out["run_s"], out["final"])
    else:
        print(f"torchdiffeq skipped: {_torch_peers.available()}")

    ours_compile, ours_run, ours_final = results["diffsim"]
    for name, (compile_s, run_s, _) in results.items():
        record(
            "pendulum fixed-step RK4",
            name,
            members=args.members,
            steps=args.steps,
            compile_s=compile_s,
            run_s=run_s,
        )
    rows = []
    for name, (compile_s, run_s, final) in results.items():
        diff = "" if final is None else f"{np.max(np.abs(final - ours_final)):.1e}"
        rows.append(
            [
                name,
                "-" if compile_s is None else f"{compile_s:.3f}",
                f"{run_s * 1e3:.1f}",
                f"{run_s / ours_run:.2f}",
                "-" if compile_s is None else f"{compile_s / ours_compile:.2f}",
                diff,
            ]
        )
    print()
    print(
        table(
            rows,
            [
                "method",
                "compile s",
                "run ms",
                "run / diffsim",
                "compile / diffsim",
                "max abs(final - diffsim)",
            ],
        )
    )
    scipy_diff = np.max(np.abs(scipy_final - ours_final[: args.scipy_sample]))
    print(f"\nscipy sample max |final - diffsim| = {scipy_diff:.1e} (RK45 at rtol 1e-6 vs RK4)")

    steps_list = [100, 100_000] if not args.quick else [10, 1_000]
    scaling = compile_scaling(steps_list, args.members)
    print(
        f"\ndiffsim compile time at {steps_list[0]:,} steps: {scaling[0]:.3f} s, at "
        f"{steps_list[1]:,} steps: {scaling[1]:.3f} s (ratio {scaling[1] / scaling[0]:.2f})"
    )

    hand = results["hand-written vmap(scan)"]
    dfx = results["diffrax (constant step)"]
    numpy_run = results["NumPy (vectorized)"][1]
    checks = [
        ("run <= 1.1x hand-written scan", ours_run / hand[1], ours_run <= 1.1 * hand[1]),
        (">= 2x faster than diffrax", dfx[1] / ours_run, dfx[1] >= 2 * ours_run),
        (">= 5x faster than NumPy", numpy_run / ours_run, numpy_run >= 5 * ours_run),
        ("compile <= 0.3x diffrax", ours_compile / dfx[0], ours_compile <= 0.3 * dfx[0]),
        (
            "compile within 1.2x, 100 vs 100,000 steps",
            scaling[1] / scaling[0],
            scaling[1] <= 1.2 * scaling[0],
        ),
    ]
    if args.quick:
        checks.append(symplectic_section(500, 100, args.repeats))
    else:
        checks.append(symplectic_section(args.members, args.steps, args.repeats))
    print()
    print(targets_table(checks))


if __name__ == "__main__":
    main()
