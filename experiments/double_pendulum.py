"""Divergence of nearby double pendula.

A double pendulum (`models.DoublePendulum`: unit masses and rods, g = 9.81 m/s², equations of
motion from its Lagrangian by autodiff) is released from rest at θ₁ = θ₂ = 120°, and seven
more members start with θ₂ larger by δ = 10⁻⁹, 10⁻⁸, …, 10⁻³ rad; all eight are one
`jax.vmap` of `ds.simulate` with RK4 (dt = 1 ms; quick: 2 ms) over 20 s (quick: 10 s). The
figure shows the tips of three members (δ = 0, 10⁻⁵, 10⁻³) tracing the same path until they
part, the angle separation √(Δθ₁² + Δθ₂²) (wrapped to (−π, π]) of every member from the
reference on a log axis, and the relative energy error |E(t) − E(0)| / |E(0)| of the solver.
The separations are parallel lines, each δ ten times larger ahead by ln(10)/λ, growing in
bursts (when the outer rod swings over) at a mean rate λ ≈ 1.2–1.3 /s until they saturate at
≈ π.

The rate is measured twice: as the least-squares slope of log separation against t, pooled over
the members (each with its own intercept) over 1 s ≤ t until its separation reaches 0.01 rad,
and from the divergence times (separation > 1 rad) against ln(1/δ), whose slope is 1/λ (≈ 1.6
/s: the bursts make them differ). The smallest perturbation gives the finite-time Lyapunov
exponent of the reference path, ln(‖Δy(t)‖/δ)/t (full state norm) at the last t with ‖Δy‖ <
10⁻³ (≈ 1.2–1.35 /s over 10 s). RK4's energy error stays ≈ 10⁻⁸ of the energy (quick: ≈ 10⁻⁷).

Run: `python experiments/double_pendulum.py [--out DIR] [--quick]`
"""

import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import xarray as xr

sys.path.insert(0, str(Path(__file__).parent))
import _output

import diffsim as ds
import models

THETA0 = 2 * np.pi / 3  # both rods released from rest at 120° from the downward vertical
DELTAS = (0.0, 1e-9, 1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3)  # added to θ₂ (rad)
SAVE_DT = 0.01  # s
FIT_START = 1.0  # s: the first second turns the perturbation into the growing direction
LINEAR_LIMIT = 0.01  # rad: separations below it grow linearly (exponentially in t)
DIVERGED = 1.0  # rad: a member has diverged when its angle separation exceeds it
TIP_MEMBERS = (0.0, 1e-5, 1e-3)
TIP_DURATION = 10.0  # s of tip paths drawn


@eqx.filter_jit
def ensemble(model, starts, ts, *, steps_per_save: int):
    """States (members, times, 2, 2) and energies (members, times) of every start."""

    def one(y0):
        ys = ds.simulate(model, y0, ts, solver=ds.RK4(), steps_per_save=steps_per_save).ys
        return ys, jax.vmap(model.energy)(ys)

    return jax.vmap(one)(starts)


def wrapped(angle):
    return np.arctan2(np.sin(angle), np.cos(angle))


def tips(ys, model):
    """(x, y) of the outer bob for states (..., 2, 2), m."""
    t1, t2 = ys[..., 0, 0], ys[..., 0, 1]
    l1, l2 = float(model.length1), float(model.length2)
    return l1 * np.sin(t1) + l2 * np.sin(t2), -l1 * np.cos(t1) - l2 * np.cos(t2)


def run(out_dir="out/double_pendulum", quick: bool = False) -> dict:
    out, plt = _output.prepare(out_dir)
    duration, dt = (10.0, 2e-3) if quick else (20.0, 1e-3)
    steps_per_save = round(SAVE_DT / dt)
    ts = np.linspace(0.0, duration, round(duration / SAVE_DT) + 1)
    model = models.DoublePendulum()
    deltas = np.asarray(DELTAS)
    starts = np.zeros((deltas.size, 2, 2))
    starts[:, 0, 0] = THETA0
    starts[:, 0, 1] = THETA0 + deltas

    start = time.perf_counter()
    ys, energy = (
        np.asarray(a)
        for a in ensemble(
            model, jnp.asarray(starts), jnp.asarray(ts), steps_per_save=steps_per_save
        )
    )
    print(
        f"{deltas.size} pendula × {round(duration / dt)} RK4 steps: "
        f"{time.perf_counter() - start:.1f} s"
    )

    # --- energy ------------------------------------------------------------------------------
    energy_error = np.abs(energy - energy[:, :1]) / np.abs(energy[:, :1])
    max_energy_error = float(energy_error.max())
    print(
        f"energy E(0) = {energy[0, 0]:.4f} J; largest relative error over {duration:g} s: "
        f"{max_energy_error:.2e}"
    )

    # --- separations -------------------------------------------------------------------------
    difference = ys[1:] - ys[:1]
    difference[:, :, 0] = wrapped(difference[:, :, 0])
    angle_separation = np.linalg.norm(difference[:, :, 0], axis=-1)  # (members - 1, times)
    state_separation = np.linalg.norm(difference.reshape(*difference.shape[:2], -1), axis=-1)
    perturbed = deltas[1:]
    later = ts >= FIT_START
    log_t, log_s = [], []
    rates, diverged_at = [], []
    for sep in angle_separation:
        linear_end = np.argmax(sep > LINEAR_LIMIT) if np.any(sep > LINEAR_LIMIT) else ts.size
        window = later & (np.arange(ts.size) < linear_end)
        if window.sum() >= 10:
            rates.append(float(np.polyfit(ts[window], np.log(sep[window]), 1)[0]))
            log_t.append(ts[window] - ts[window].mean())
            log_s.append(np.log(sep[window]) - np.log(sep[window]).mean())
        else:
            rates.append(float("nan"))
        gone = sep > DIVERGED
        diverged_at.append(float(ts[np.argmax(gone)]) if gone.any() else float("nan"))
    pooled_rate = float(np.polyfit(np.concatenate(log_t), np.concatenate(log_s), 1)[0])
    diverged_at = np.array(diverged_at)
    done = np.isfinite(diverged_at)
    rate_from_times = (
        float(1.0 / np.polyfit(np.log(1.0 / perturbed[done]), diverged_at[done], 1)[0])
        if done.sum() >= 3
        else float("nan")
    )
    for delta, rate, when in zip(perturbed, rates, diverged_at):
        print(
            f"  δ = {delta:.0e}: growth rate {rate:.3f} /s, separation > {DIVERGED} rad at "
            f"t = {when:.2f} s"
        )
    print(
        f"pooled growth rate {pooled_rate:.3f} /s; from the divergence times "
        f"{rate_from_times:.3f} /s"
    )

    # the finite-time Lyapunov exponent of the reference path: ln(‖Δy(t)‖/δ)/t of the
    # smallest perturbation (full state norm) at the last time it is still linear
    smallest = state_separation[0]
    linear_time = float(ts[(smallest < 1e-3) & (ts > 0)].max())
    at = np.flatnonzero(ts == linear_time)[0]
    finite_time_exponent = float(np.log(smallest[at] / perturbed[0]) / linear_time)
    print(
        f"finite-time exponent of the reference path over {linear_time:.1f} s: "
        f"{finite_time_exponent:.3f} /s"
    )

    # --- figure ------------------------------------------------------------------------------
    widths = dict(width_ratios=[1, 1.35, 1])
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(12.0, 4.2), gridspec_kw=widths)
    shown = ts <= TIP_DURATION
    colours = {0.0: "k", 1e-5: "C0", 1e-3: "C1"}
    for delta in TIP_MEMBERS:
        i = DELTAS.index(delta)
        x, y = tips(ys[i, shown], model)
        label = "reference" if delta == 0 else f"δ = 10$^{{{int(np.log10(delta))}}}$"
        left.plot(x, y, color=colours[delta], lw=0.6, alpha=0.85, label=label)
        left.plot(x[-1], y[-1], "o", color=colours[delta], ms=4)
    x0, y0 = tips(starts[0], model)
    elbow = (np.sin(THETA0), -np.cos(THETA0))
    left.plot([0, elbow[0], x0], [0, elbow[1], y0], "-o", color="0.3", lw=2, ms=4, zorder=5)
    left.set_aspect("equal")
    left.set_xlim(-2.2, 2.2)
    left.set_ylim(-2.3, 2.9)
    left.set_xlabel("x (m)")
    left.set_ylabel("y (m)")
    left.set_title(f"outer bob, 0 ≤ t ≤ {min(TIP_DURATION, duration):g} s (dots: the end)")
    left.legend(loc="upper center", fontsize=7, ncol=3, handlelength=1.2, columnspacing=0.8)

    colour_map = plt.get_cmap("viridis")
    for k, (delta, sep) in enumerate(zip(perturbed, angle_separation)):
        middle.semilogy(
            ts[1:],
            sep[1:],
            color=colour_map(k / (perturbed.size - 1)),
            lw=1.0,
            label=f"10$^{{{int(np.log10(delta))}}}$",
        )
    guide = ts[ts >= FIT_START]
    guide_values = 10 * perturbed[0] * np.exp(pooled_rate * (guide - guide[0]))
    keep = guide_values < 3e1
    middle.semilogy(
        guide[keep], guide_values[keep], "k:", lw=1.0, label=f"∝ exp({pooled_rate:.2f} t)"
    )
    middle.axhline(np.pi, color="0.5", lw=0.8, ls="-.")
    middle.text(0.2, np.pi * 1.6, "π", color="0.4", fontsize=8)
    middle.set_ylim(1e-10, 1e2)
    middle.set_xlim(0, duration)
    middle.set_xlabel("time t (s)")
    middle.set_ylabel("angle separation (rad)")
    middle.set_title(f"initial δθ₂ = δ: pooled growth rate {pooled_rate:.2f} /s")
    middle.legend(title="δ (rad)", fontsize=7, title_fontsize=7, loc="lower right", ncol=2)

    for k, err in enumerate(energy_error):
        colour = "k" if k == 0 else colour_map((k - 1) / (perturbed.size - 1))
        right.semilogy(ts[1:], err[1:], color=colour, lw=0.7)
    right.set_xlim(0, duration)
    right.set_ylim(1e-14, 1e-5)
    right.set_xlabel("time t (s)")
    right.set_ylabel("|E(t) − E(0)| / |E(0)|")
    right.set_title(f"energy error, RK4 dt = {dt * 1e3:g} ms: max {max_energy_error:.1e}")
    fig.tight_layout()
    files = ds.plot.save(fig, out, "double_pendulum")
    plt.close("all")

    data = xr.Dataset(
        {
            "angle": (("delta", "time", "rod"), ys[:, :, 0], {"units": "rad"}),
            "angular_velocity": (("delta", "time", "rod"), ys[:, :, 1], {"units": "rad/s"}),
            "energy": (("delta", "time"), energy, {"units": "J"}),
            "angle_separation": (("perturbed", "time"), angle_separation, {"units": "rad"}),
            "state_separation": (("perturbed", "time"), state_separation),
        },
        coords={"delta": deltas, "perturbed": perturbed, "time": ts, "rod": [1, 2]},
        attrs={"theta0": THETA0, "dt": dt, "solver": "RK4"},
    )
    files.append(_output.dataset(out, "double_pendulum", data))
    config = {
        "theta0": THETA0,
        "deltas": list(DELTAS),
        "perturbed_angle": "theta2",
        "duration": duration,
        "dt": dt,
        "save_dt": SAVE_DT,
        "solver": "RK4",
        "masses": [1.0, 1.0],
        "lengths": [1.0, 1.0],
        "gravity": 9.81,
        "fit_start": FIT_START,
        "linear_limit": LINEAR_LIMIT,
        "diverged_threshold": DIVERGED,
    }
    record = {
        "config": config,
        "energy": float(energy[0, 0]),
        "max_energy_error": max_energy_error,
        "energy_error_per_member": energy_error.max(axis=1).tolist(),
        "growth_rates": rates,
        "pooled_growth_rate": pooled_rate,
        "divergence_times": [None if np.isnan(t) else t for t in diverged_at.tolist()],
        "rate_from_divergence_times": rate_from_times,
        "finite_time_exponent": finite_time_exponent,
        "finite_time_window": linear_time,
        "final_angle_separation": angle_separation[:, -1].tolist(),
    }
    files.append(_output.summary(out, "double_pendulum", record))
    return {"files": files, **record}


if __name__ == "__main__":
    _output.main(__file__, __doc__)
