"""Gradient benchmark: cost of derivatives through simulate, and memory of long reverse-mode runs.

1. Time of `jax.grad` over the time of the forward solve, for a 10,000-step RK4 run and an
   adaptive Tsit5 run of a damped pendulum (target <= 4x), against diffrax's default setup
   (RecursiveCheckpointAdjoint) for the same problem.
2. Time of `jax.hessian` over the time of `jax.grad` for p = 3 parameters (target <= p + 2).
3. Peak memory of the gradient of a 256-member pendulum ensemble (state of 512 floats) at 1e3, 1e4
   and 1e5 RK4 steps, each measured in its own process: XLA's temporary buffer size of the compiled
   gradient, and the process's peak resident memory (target: <= 4x from 1e4 to 1e5 steps).

Run: `python experiments/bench/gradients.py [--quick]`
"""

import argparse
import json
import os
import resource
import subprocess
import sys

import diffrax
import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(__file__))
from _timing import compile_seconds, record, run_seconds, table, targets_table
from fixed_step import _DiffraxRK4

import diffsim as ds
import models

jax.config.update("jax_enable_x64", True)

Y0 = jnp.array([1.0, 0.0])
PARAMS = jnp.array([1.0, 9.81, 0.1])  # length, gravity, damping


def _model(params):
    return models.DampedPendulum(length=params[0], gravity=params[1], damping=params[2])


def diffsim_loss(solver, steps, t1=10.0):
    ts = jnp.linspace(0.0, t1, 11)
    kwargs = {"dt": t1 / steps} if solver.needs_dt else {}

    def loss(params):
        return jnp.sum(ds.simulate(_model(params), Y0, ts, solver=solver, **kwargs).ys ** 2)

    return loss


def hand_scan_loss(steps, t1=10.0):
    """The same RK4 run written by hand as a `lax.scan` (10 saves of steps/10 steps each)."""
    dt = t1 / steps

    def loss(params):
        field = _model(params).vector_field

        def step(y, _):
            k1 = field(0.0, y)
            k2 = field(0.0, y + dt / 2 * k1)
            k3 = field(0.0, y + dt / 2 * k2)
            k4 = field(0.0, y + dt * k3)
            return y + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4), None

        def save(y, _):
            y, _ = jax.lax.scan(step, y, None, length=steps // 10)
            return y, y

        _, ys = jax.lax.scan(save, Y0, None, length=10)
        return jnp.sum(Y0**2) + jnp.sum(ys**2)

    return loss


def diffrax_loss(adaptive: bool, steps, t1=10.0):
    ts = jnp.linspace(0.0, t1, 11)

    def loss(params):
        model = _model(params)
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(model.vector_field),
            diffrax.Tsit5() if adaptive else _DiffraxRK4(),
            0.0,
            t1,
            None if adaptive else t1 / steps,
            Y0,
            saveat=diffrax.SaveAt(ts=ts),
            stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-8)
            if adaptive
            else diffrax.ConstantStepSize(),
            max_steps=100_000 if adaptive else steps,
        )
        return jnp.sum(sol.ys**2)

    return loss


def time_transforms(loss, with_hessian: bool, repeats: int):
    out = {}
    transforms = [("forward", loss), ("grad", jax.grad(loss))]
    if with_hessian:
        transforms.append(("hessian", jax.hessian(loss)))
    for name, fn in transforms:
        compile_s, compiled = compile_seconds(jax.jit(fn), PARAMS)
        out[name] = (compile_s, run_seconds(compiled, PARAMS, repeats=repeats))
    return out


def memory_child(steps: int, checkpoint) -> dict:
    """Runs in its own process: memory of the gradient of an ensemble run of `steps` RK4 steps."""
    members = 256
    lengths = jnp.linspace(0.5, 2.0, members)
    ts = jnp.array([0.0, 10.0])

    def loss(lengths):
        def final(length):
            model = models.DampedPendulum(length=length, gravity=9.81, damping=0.1)
            sol = ds.simulate(
                model, Y0, ts, solver=ds.RK4(), dt=10.0 / steps, throw=False, checkpoint=checkpoint
            )
            return sol.ys[-1, 0]

        return jnp.sum(jax.vmap(final)(lengths))

    compiled = jax.jit(jax.grad(loss)).lower(lengths).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    jax.block_until_ready(compiled(lengths))
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"temp_bytes": int(temp), "peak_rss_bytes": int(peak_kib) * 1024}


def memory_table(step_counts, checkpoints):
    rows, raw = [], {}
    for checkpoint in checkpoints:
        for steps in step_counts:
            here = os.path.dirname(os.path.abspath(__file__))
            code = (
                f"import json, sys; sys.path.insert(0, {here!r}); import gradients; "
                f"print(json.dumps(gradients.memory_child({steps}, {checkpoint!r})))"
            )
            out = subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, check=True
            )
            raw[(checkpoint, steps)] = json.loads(out.stdout.strip().splitlines()[-1])
    for checkpoint in checkpoints:
        base = raw[(checkpoint, step_counts[1])]
        for steps in step_counts:
            m = raw[(checkpoint, steps)]
            rows.append(
                [
                    repr(checkpoint),
                    f"{steps:,}",
                    f"{m['temp_bytes'] / 2**20:.2f}",
                    f"{m['peak_rss_bytes'] / 2**20:.0f}",
                    f"{m['temp_bytes'] / base['temp_bytes']:.2f}",
                ]
            )
    return rows, raw


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for smoke tests")
    args = parser.parse_args(argv)
    steps = 1_000 if args.quick else 10_000
    repeats = 2 if args.quick else 5

    print(f"# Gradients through simulate (damped pendulum, float64, p = {PARAMS.size} parameters)")
    rows, ratios, grad_times = [], {}, {}
    cases = [
        (f"diffsim RK4, {steps:,} steps", diffsim_loss(ds.RK4(), steps)),
        (f"hand-written scan RK4, {steps:,} steps", hand_scan_loss(steps)),
        (f"diffrax RK4, {steps:,} steps (default adjoint)", diffrax_loss(False, steps)),
        ("diffsim Tsit5, rtol 1e-8", diffsim_loss(ds.Tsit5(rtol=1e-8, atol=1e-8), None)),
        ("diffrax Tsit5, rtol 1e-8 (default adjoint)", diffrax_loss(True, None)),
    ]
    for name, loss in cases:
        hessian = not name.startswith("diffrax")  # its default adjoint cannot do forward mode
        t = time_transforms(loss, hessian, repeats)
        forward, grad = t["forward"][1], t["grad"][1]
        hess = t.get("hessian", (None, None))[1]
        for transform, (compile_s, run_s) in t.items():
            record(
                "gradients (pendulum, float64)",
                f"{name}: {transform}",
                compile_s=compile_s,
                run_s=run_s,
            )
        ratios[name] = (grad / forward, None if hess is None else hess / grad)
        grad_times[name] = (t["grad"][0], grad)  # (compile s, run s)
        rows.append(
            [
                name,
                f"{forward * 1e3:.2f}",
                f"{grad * 1e3:.2f}",
                f"{grad / forward:.2f}",
                "fails (custom_vjp)" if hess is None else f"{hess * 1e3:.2f}",
                "-" if hess is None else f"{hess / grad:.2f}",
                f"{t['forward'][0]:.2f} / {t['grad'][0]:.2f}",
            ]
        )
    print(
        table(
            rows,
            [
                "case",
                "forward ms",
                "grad ms",
                "grad / forward",
                "hessian ms",
                "hessian / grad",
                "compile s (fwd / grad)",
            ],
        )
    )

    step_counts = [100, 1_000, 10_000] if args.quick else [1_000, 10_000, 100_000]
    # the smoke run measures the default only: each size is a process of its own (~12 s each)
    mem_rows, raw = memory_table(step_counts, ["auto"] if args.quick else ["auto", None])
    print("\n# Peak memory of the gradient, 256-member ensemble, each size in its own process")
    print(
        table(
            mem_rows,
            [
                "checkpoint",
                "steps",
                "XLA temp MiB",
                "peak RSS MiB",
                f"temp / temp at {step_counts[1]:,}",
            ],
        )
    )
    growth = (
        raw[("auto", step_counts[2])]["temp_bytes"] / raw[("auto", step_counts[1])]["temp_bytes"]
    )
    checks = []
    for name, (grad_ratio, hess_ratio) in ratios.items():
        if name.startswith("diffsim"):
            checks.append((f"{name}: grad / forward <= 4", grad_ratio, grad_ratio <= 4))
            checks.append(
                (
                    f"{name}: hessian / grad <= p + 2 = {PARAMS.size + 2}",
                    hess_ratio,
                    hess_ratio <= PARAMS.size + 2,
                )
            )
    ours, theirs = (
        grad_times["diffsim Tsit5, rtol 1e-8"],
        grad_times["diffrax Tsit5, rtol 1e-8 (default adjoint)"],
    )
    run_ratio, compile_ratio = ours[1] / theirs[1], ours[0] / theirs[0]
    checks.append(
        (
            "Tsit5 jax.grad run <= 1.0x diffrax RecursiveCheckpointAdjoint",
            run_ratio,
            run_ratio <= 1.0,
        )
    )
    checks.append(("Tsit5 jax.grad compile <= 0.5x diffrax's", compile_ratio, compile_ratio <= 0.5))
    checks.append(
        (
            f"gradient memory (checkpoint='auto'), {step_counts[1]:,} -> "
            f"{step_counts[2]:,} steps: growth <= 4x",
            growth,
            growth <= 4,
        )
    )
    print()
    print(targets_table(checks))


if __name__ == "__main__":
    main()
