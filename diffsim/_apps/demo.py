"""The demo behind `diffsim demo`: simulate, differentiate, sweep, and draw one figure.

It exercises the core on a damped pendulum: a fixed-step and an adaptive solve that must agree,
the gradient of a fitting loss with respect to the pendulum length checked against a central
finite difference, and a `ds.sweep` over length x damping.
"""

import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from .._integrate.simulate import simulate
from .._solver import RK4, Tsit5
from .._sweep.sweep import sweep
from .._validate import user_path


def run(out_dir: str | Path = "out", quick: bool = False) -> dict:
    """Run the demo, write `demo.png` and `demo.json` into `out_dir`; returns the summary."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    from .config import model_class

    out = user_path(out_dir, "out_dir")
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    ts = jnp.linspace(0.0, 10.0, 201)
    y0 = jnp.array([1.0, 0.0])
    pendulum = model_class("DampedPendulum")
    truth = pendulum(length=1.0, gravity=9.81, damping=0.3)

    # 1. Simulate with a fixed-step and an adaptive solver; they must agree.
    fixed = simulate(truth, y0, ts, solver=RK4(), dt=0.01)
    adaptive = simulate(truth, y0, ts, solver=Tsit5(rtol=1e-8, atol=1e-8))
    solver_gap = float(jnp.max(jnp.abs(fixed.ys - adaptive.ys)))
    print(f"simulate: RK4 (dt=0.01) vs Tsit5 (rtol=1e-8) max difference {solver_gap:.2e}")

    # 2. Gradient of a least-squares loss with respect to the length, against finite differences.
    data = fixed.ys[:, 0]

    def loss(length):
        model = pendulum(length=length, gravity=9.81, damping=0.3)
        angle = simulate(model, y0, ts, solver=RK4(), dt=0.01).ys[:, 0]
        return jnp.mean((angle - data) ** 2)

    length = jnp.asarray(1.2)
    value, gradient = jax.jit(jax.value_and_grad(loss))(length)
    h = 1e-3  # central difference; float32 round-off in the loss limits smaller steps
    finite_difference = (loss(length + h) - loss(length - h)) / (2 * h)
    print(
        f"grad: dloss/dlength at L=1.2 = {float(gradient):.5f} "
        f"(central finite difference {float(finite_difference):.5f})"
    )

    # 3. Sweep: vmap over a grid of lengths and dampings, keeping the final energy.
    n = 16 if quick else 48
    lengths = np.linspace(0.5, 2.0, n)
    dampings = np.linspace(0.0, 0.6, n)
    result = sweep(
        pendulum(gravity=9.81),
        {"length": lengths, "damping": dampings},
        y0,
        ts,
        solver=RK4(),
        dt=0.01,
        reduce="final_state",
        progress=False,
    )
    angle = result["final_state"].sel(state="angle")
    speed = result["final_state"].sel(state="angular_velocity")
    swept = result["length"]
    energies = (0.5 * swept**2 * speed**2 + 9.81 * swept * (1 - np.cos(angle))).values
    print(
        f"sweep: {n * n} pendulums, final energy from {float(energies.min()):.3g} "
        f"to {float(energies.max()):.3g} J/kg"
    )

    # 4. The figure.
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), constrained_layout=True)
    axes[0].plot(ts, fixed.ys[:, 0], label="RK4, dt = 0.01")
    axes[0].plot(ts, adaptive.ys[:, 0], "--", label="Tsit5, rtol = 1e-8")
    axes[0].set(xlabel="t (s)", ylabel="angle (rad)", title="Damped pendulum")
    axes[0].legend()
    scan_lengths = jnp.linspace(0.7, 1.5, 41)
    axes[1].plot(scan_lengths, jax.vmap(loss)(scan_lengths), label="loss")
    axes[1].plot(
        [float(length) - 0.1, float(length) + 0.1],
        [float(value - 0.1 * gradient), float(value + 0.1 * gradient)],
        "r-",
        lw=2,
        label="tangent from jax.grad",
    )
    axes[1].set(xlabel="length (m)", ylabel="mean squared error", title="Gradient of a fit loss")
    axes[1].legend()
    image = axes[2].pcolormesh(
        lengths,
        dampings,
        energies.T,
        shading="auto",
        norm=matplotlib.colors.LogNorm(),  # energies span three decades
    )
    fig.colorbar(image, ax=axes[2], label="energy at t = 10 s (J/kg)")
    axes[2].set(xlabel="length (m)", ylabel="damping (1/s)", title="ds.sweep")
    figure = out / "demo.png"
    fig.savefig(figure, dpi=110, metadata={"Software": None})
    plt.close(fig)

    summary = {
        "rk4_vs_tsit5_max_difference": solver_gap,
        "gradient": float(gradient),
        "finite_difference": float(finite_difference),
        "sweep_members": n * n,
        "seconds": round(time.perf_counter() - start, 2),
        "figure": str(figure),
    }
    (out / "demo.json").write_text(json.dumps(summary, indent=2))
    print(f"wrote {figure} and {out / 'demo.json'} in {summary['seconds']} s")
    return summary
