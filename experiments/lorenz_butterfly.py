"""The Lorenz butterfly and its sensitivity to ρ.

The Lorenz system (σ = 10, β = 8/3, ρ = 28) is solved with RK4 (dt = 0.005; quick: 0.01) from
(1, 1, 20) and from 31 nearby starts (quick: 15; seeded offsets of size ~1), each twice: with
ρ = 28 and with ρ = 28 + 10⁻⁹, with the forward-mode sensitivity dy(t)/dρ from `jax.jvp` of
the solve, all members in one `jax.vmap`. The figure shows the butterfly (x–z
projection), x(t) of the two runs from (1, 1, 20), identical to the eye until t ≈ 20 and
unrelated after, and the separation ‖Δy(t)‖ on a log axis: it grows like exp(λt) with the
largest Lyapunov exponent λ ≈ 0.9056 until it saturates at the size of the attractor (the mean
distance between two of its points, ≈ 17–19) near t ≈ 25, while 10⁻⁹ ‖dy/dρ‖, the linearised
separation, equal to it until then, keeps growing at the same rate. The growth rates are the
least-squares slopes of the ensemble-mean log separation (t ≥ 2 until the first member's
separation reaches 0.1, t ≈ 17) and of the mean log sensitivity (all t ≥ 2). Expect ≈ 0.90 for
the sensitivity and ≈ 0.88 for the separation: a change of ρ is a perturbation injected all
along the path, not only at t = 0, and the part injected recently has not yet turned into the
most expanding direction, which slows the growth by ~3% over the first ~15 time units (fits
over later windows of dy/dρ give 0.905).

Run: `python experiments/lorenz_butterfly.py [--out DIR] [--quick]`
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

RHO = 28.0
DELTA = 1e-9  # the perturbation of ρ
LYAPUNOV = 0.9056  # published largest exponent at ρ = 28 (Sprott 2003)
Y0 = (1.0, 1.0, 20.0)
SEED = 0  # offsets of the other starts: jax.random.normal(jax.random.key(SEED), (members-1, 3))
FIT_START = 2.0  # before it, the separation is still turning into the most expanding direction
LINEAR_LIMIT = 0.1  # separations below this stay in the linear regime (attractor size ~ 20)


@eqx.filter_jit
def divergence(starts, ts, *, steps_per_save: int):
    """For each start: states with ρ and ρ + δ, and dy/dρ at ρ, each of shape (times, 3)."""

    def one(y0):
        def states(rho):
            model = models.Lorenz(rho=rho)
            return ds.simulate(model, y0, ts, solver=ds.RK4(), steps_per_save=steps_per_save).ys

        # forward mode (jax.jvp) gives the states and their derivative in one pass; both values
        # of ρ go through the same compiled solve (the tangent at ρ + δ is not used)
        rhos = jnp.array([RHO, RHO + DELTA])
        pair, tangents = jax.vmap(lambda r: jax.jvp(states, (r,), (jnp.ones_like(r),)))(rhos)
        return pair[0], pair[1], tangents[0]

    return jax.vmap(one)(starts)


def slope(ts, values, mask) -> float:
    """Least-squares slope of values against ts where mask holds."""
    return float(np.polyfit(ts[mask], values[mask], 1)[0])


def run(out_dir="out/lorenz_butterfly", quick: bool = False) -> dict:
    out, plt = _output.prepare(out_dir)
    duration, dt, save_dt, members = (30.0, 0.01, 0.02, 16) if quick else (60.0, 0.005, 0.01, 32)
    steps_per_save = round(save_dt / dt)
    ts = np.linspace(0.0, duration, round(duration / save_dt) + 1)
    offsets = np.asarray(jax.random.normal(jax.random.key(SEED), (members - 1, 3)))
    starts = np.concatenate([[Y0], np.asarray(Y0) + offsets])

    start = time.perf_counter()
    base, perturbed, tangent = (
        np.asarray(a)
        for a in divergence(jnp.asarray(starts), jnp.asarray(ts), steps_per_save=steps_per_save)
    )
    print(
        f"{members} members × 2 values of ρ with dy/dρ, {round(duration / dt)} RK4 steps each: "
        f"{time.perf_counter() - start:.1f} s"
    )

    separation = np.linalg.norm(perturbed - base, axis=-1)  # (members, times)
    sensitivity = np.linalg.norm(tangent, axis=-1)
    later = ts > FIT_START
    with np.errstate(divide="ignore"):  # the separation is exactly 0 at t = 0
        mean_log_separation = np.log(separation).mean(axis=0)
        mean_log_sensitivity = np.log(sensitivity).mean(axis=0)
    # the linear regime ends when the first member's separation reaches LINEAR_LIMIT
    linear_end = float(ts[np.argmax(separation.max(axis=0) > LINEAR_LIMIT)])
    window = later & (ts < linear_end)
    rate_separation = slope(ts, mean_log_separation, window)
    rate_sensitivity = slope(ts, mean_log_sensitivity, later)
    rate_members = [slope(ts[window], np.log(s[window]), ...) for s in separation]
    # the attractor's size: the mean distance between two of its points (the runs from Y0,
    # after t = 5, sampled 1 time unit apart)
    samples = base[0, round(5.0 / save_dt) :: round(1.0 / save_dt)]
    pairs = np.linalg.norm(samples[:, None] - samples[None], axis=-1)
    attractor = float(pairs[np.triu_indices(len(samples), 1)].mean())
    saturated = separation[:, ts > linear_end + 10.0]
    saturation = float(saturated.mean()) if saturated.size else float("nan")
    diverged = float(ts[np.argmax(np.abs(perturbed[0, :, 0] - base[0, :, 0]) > 1.0)])
    print(
        f"growth rate of the separation {rate_separation:.4f} (t in [{FIT_START}, "
        f"{linear_end:.1f}]), of dy/dρ {rate_sensitivity:.4f} (t ≥ {FIT_START}); Lyapunov "
        f"exponent {LYAPUNOV}"
    )
    print(
        f"member rates {np.min(rate_members):.3f} … {np.max(rate_members):.3f}; x differs by "
        f"1 at t = {diverged:.2f}; saturated separation {saturation:.1f}, attractor size "
        f"{attractor:.1f}"
    )

    # --- figure ----------------------------------------------------------------------------
    fig = plt.figure(figsize=(11.0, 4.4))
    grid = fig.add_gridspec(2, 2, width_ratios=[1.0, 1.55], height_ratios=[1, 1.5])
    wings = fig.add_subplot(grid[:, 0])
    ds.plot.phase_portrait(base[0], x=0, y=2, names=("x", "y", "z"), ax=wings, lw=0.35, color="C0")
    wings.plot(*base[0, 0, [0, 2]], "o", color="k", ms=4, label=f"start {Y0}")
    wings.set_title(f"Lorenz attractor, ρ = {RHO:g}, 0 ≤ t ≤ {duration:g}")
    wings.legend(loc="upper left", fontsize=7.5)

    xs = fig.add_subplot(grid[0, 1])
    xs.plot(ts, base[0, :, 0], color="C0", lw=0.9, label="ρ = 28")
    xs.plot(ts, perturbed[0, :, 0], color="C1", lw=0.9, ls="--", label="ρ = 28 + 10⁻⁹")
    xs.axvline(diverged, color="0.4", lw=0.8, ls=":")
    xs.set_ylabel("x")
    xs.set_xlim(0, duration)
    xs.legend(
        loc="upper left", ncol=2, fontsize=7.5, frameon=True, framealpha=0.9, edgecolor="none"
    )
    xs.set_title(f"same start, ρ differing by 10⁻⁹: |Δx| > 1 from t = {diverged:.1f}")
    xs.tick_params(labelbottom=False)

    log = fig.add_subplot(grid[1, 1], sharex=xs)
    for i, path in enumerate(separation):
        log.semilogy(
            ts[1:],
            path[1:],
            color="0.65",
            lw=0.5,
            label=f"{members} starts: ‖Δy(t)‖" if i == 0 else None,
        )
    log.semilogy(
        ts[1:], np.exp(mean_log_separation[1:]), color="C0", lw=1.6, label="geometric mean of ‖Δy‖"
    )
    log.semilogy(
        ts[1:],
        DELTA * np.exp(mean_log_sensitivity[1:]),
        color="C2",
        lw=1.2,
        ls="--",
        label="10⁻⁹ × geometric mean of ‖dy/dρ‖ (jax.jvp)",
    )
    anchor = np.flatnonzero(window)[0]
    # a slope guide two decades above the mean, so that it does not hide the data
    reference = 100 * np.exp(mean_log_separation[anchor] + LYAPUNOV * (ts - ts[anchor]))
    shown = (ts > FIT_START) & (reference < 1e3 * attractor)
    log.semilogy(
        ts[shown],
        reference[shown],
        color="C3",
        lw=1.1,
        ls=":",
        label=f"∝ exp({LYAPUNOV} t): the published λ",
    )
    log.axhline(attractor, color="k", lw=0.8, ls="-.", label=f"attractor size {attractor:.0f}")
    log.axvspan(FIT_START, linear_end, color="C0", alpha=0.07, lw=0)
    log.set_xlabel("time t")
    log.set_ylabel("separation")
    log.set_ylim(1e-14, 1e16)
    log.set_title(
        f"fitted growth rates: ‖Δy‖ {rate_separation:.3f}, ‖dy/dρ‖ "
        f"{rate_sensitivity:.3f} (shaded: fit window)",
        fontsize=9,
    )
    log.legend(loc="lower right", fontsize=7, frameon=True, framealpha=0.92, edgecolor="none")
    fig.tight_layout()
    files = ds.plot.save(fig, out, "lorenz_butterfly")
    plt.close("all")

    data = xr.Dataset(
        {
            "state": (("time", "component"), base[0], {"long_name": f"y(t) from {Y0}, ρ = 28"}),
            "state_perturbed": (
                ("time", "component"),
                perturbed[0],
                {"long_name": f"y(t) from {Y0}, ρ = 28 + {DELTA:g}"},
            ),
            "separation": (
                ("member", "time"),
                separation,
                {"long_name": "‖y(t; ρ + δ) − y(t; ρ)‖"},
            ),
            "sensitivity": (("member", "time"), sensitivity, {"long_name": "‖dy(t)/dρ‖"}),
            "start": (("member", "component"), starts),
        },
        coords={"time": ts, "member": np.arange(members), "component": ["x", "y", "z"]},
        attrs={"rho": RHO, "delta_rho": DELTA, "dt": dt, "solver": "RK4"},
    )
    files.append(_output.dataset(out, "lorenz_butterfly", data))
    config = {
        "sigma": 10.0,
        "beta": 8.0 / 3.0,
        "rho": RHO,
        "delta_rho": DELTA,
        "dt": dt,
        "save_dt": save_dt,
        "duration": duration,
        "members": members,
        "y0": list(Y0),
        "solver": "RK4",
        "fit_start": FIT_START,
        "linear_limit": LINEAR_LIMIT,
        "seed": SEED,
    }
    record = {
        "config": config,
        "lyapunov_published": LYAPUNOV,
        "separation_growth_rate": rate_separation,
        "sensitivity_growth_rate": rate_sensitivity,
        "member_growth_rates": rate_members,
        "fit_window": [FIT_START, linear_end],
        "divergence_time_x": diverged,
        "attractor_size": attractor,
        "saturated_separation": saturation,
        "final_sensitivity": float(np.exp(mean_log_sensitivity[-1])),
    }
    files.append(_output.summary(out, "lorenz_butterfly", record))
    return {"files": files, **record}


if __name__ == "__main__":
    _output.main(__file__, __doc__)
