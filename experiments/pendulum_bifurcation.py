"""Bifurcation diagram of the driven damped pendulum (Baker & Gollub's classic set).

The pendulum θ'' + θ'/q + sin θ = g cos(ω_D t) with q = 2 and ω_D = 2/3 (Baker & Gollub,
"Chaotic Dynamics: An Introduction", 1990; `models.DampedPendulum(length=1, gravity=1,
damping=1/q, drive_frequency=2/3, drive_amplitude=g)`) is integrated from rest, (θ, ω) = (0, 0),
for a fine grid of drive amplitudes g ∈ [0.9, 1.5] and, ten times finer, for the
period-doubling cascade of g ∈ [1.40, 1.50]: fixed-step RK4 with 100 steps per drive period
T = 3π, output times at whole periods, and a `reduce` function that keeps (θ, ω) at the
periods after a 300-period transient (the stroboscopic Poincaré section at drive phase 0).
All members run in one vmapped `ds.sweep` over zipped samples, together with 100 (quick: 16)
members at g = 1.5 from slightly different angles, whose sections sample the strange attractor.

Per amplitude the section is classified by its distinct values (sorted samples more than 1e-4
rad/s apart) and its period p (the smallest p ≤ 32 with |ω_{k+p} − ω_k| ≤ 1e-4 for all k; 0 for
none: chaos, or a period above 32). The figure shows ω at every section time against g (one dot
per sample), the zoom on the cascade, and the attractor (θ mod 2π, ω). Numbers to expect (full
run, steps of 5e-4 in g, 1e-4 in the zoom): period 1 up to g = 1.0655 (but for a sliver at
1.027–1.0325: periods 4, 3, then chaos); the first period doubling at g = 1.066; period 4 at
1.082, 8 at 1.0825 and chaos from 1.083, interleaved with a coexisting period-3 running orbit
that the pendulum falls onto from rest (1.077–1.0815 and windows up to 1.148); a broad chaotic
band from 1.1485 to 1.26 (95% of the amplitudes in [1.15, 1.26] aperiodic); a reverse
cascade 8 → 4 → 2 into the period-1 window 1.2905–1.423; then the cascade 2 → 4 → 8 → 16
at g = 1.4232, 1.4590, 1.4762, 1.4775, chaos from 1.4778, windows beyond (period 3 near 1.492),
and chaos at 1.5. Coexisting attractors make the diagram that of one initial condition, as in
the book.

Run: `python experiments/pendulum_bifurcation.py [--out DIR] [--quick]`
"""

import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp
import numpy as np
import xarray as xr

sys.path.insert(0, str(Path(__file__).parent))
import _output

import diffsim as ds
import models

Q = 2.0  # quality factor: damping 1/q
DRIVE_FREQUENCY = 2.0 / 3.0
PERIOD = 2 * np.pi / DRIVE_FREQUENCY  # 3π
STEPS_PER_PERIOD = 100  # RK4 at dt = T/100 ≈ 0.094: section values agree with T/200 to ~1e-6
DT = PERIOD / STEPS_PER_PERIOD
TRANSIENT_PERIODS = 300
Y0 = (0.0, 0.0)  # (θ, ω): from rest, for every amplitude
TOLERANCE = 1e-4  # rad/s: two section values closer than this are the same point
MAX_PERIOD = 32
RANGE = (0.9, 1.5)
ZOOM = (1.40, 1.50)
ATTRACTOR_AMPLITUDE = 1.5
PROBES = (0.95, 1.0, 1.07, 1.2, 1.35, 1.45, 1.5)  # on both grids: steps 0.01 (quick), 5e-4


def pendulum(amplitude: float = 1.0):
    return models.DampedPendulum(
        length=1.0,
        gravity=1.0,
        damping=1.0 / Q,
        drive_frequency=DRIVE_FREQUENCY,
        drive_amplitude=amplitude,
    )


def section_times(periods: int) -> np.ndarray:
    """t = 0, T, 2T, …: every output interval is one drive period of STEPS_PER_PERIOD steps."""
    return PERIOD * np.arange(TRANSIENT_PERIODS + periods + 1)


def keep_section(solution):
    """The sweep's reduction: (θ, ω) at the drive periods after the transient."""
    section = solution.ys[TRANSIENT_PERIODS + 1 :]
    return {"omega": section[:, 1], "theta": section[:, 0]}


def section_sweep(amplitudes, angles, periods: int):
    """ω on the Poincaré section of every member (amplitude g_i, start (θ_i, 0)): an array
    (members, periods), from one vmapped sweep of zipped samples; and the sweep's dataset."""
    start = time.perf_counter()
    members = ds.Samples({"drive_amplitude": amplitudes, "y0[0]": angles})
    result = ds.sweep(
        pendulum(),
        members,
        jnp.array(Y0),
        section_times(periods),
        solver=ds.RK4(),
        dt=DT,
        reduce=keep_section,
        progress=False,
    )
    omega = np.asarray(result["omega"].values)
    steps = len(amplitudes) * (TRANSIENT_PERIODS + periods) * STEPS_PER_PERIOD
    print(
        f"sweep of {len(amplitudes)} members x {TRANSIENT_PERIODS + periods} periods "
        f"({steps:,} RK4 steps): {time.perf_counter() - start:.1f} s"
    )
    return omega, result


def distinct_points(samples, tol: float = TOLERANCE) -> np.ndarray:
    """Number of distinct values along the last axis (sorted values more than `tol` apart)."""
    ordered = np.sort(samples, axis=-1)
    return 1 + np.sum(np.diff(ordered, axis=-1) > tol, axis=-1)


def periods_of(samples, tol: float = TOLERANCE, max_period: int = MAX_PERIOD) -> np.ndarray:
    """The smallest p ≤ max_period with |ω_{k+p} − ω_k| ≤ tol for all k, else 0 (aperiodic)."""
    found = np.zeros(samples.shape[:-1], dtype=np.int64)
    for p in range(max_period, 0, -1):  # descending: the smallest period wins
        repeats = np.all(np.abs(samples[..., p:] - samples[..., :-p]) <= tol, axis=-1)
        found = np.where(repeats, p, found)
    return found


def windows(amplitudes, periods) -> dict:
    """Runs of equal period along the grid: first and last amplitude and the period."""
    breaks = np.flatnonzero(np.diff(periods) != 0) + 1
    starts, ends = np.r_[0, breaks], np.r_[breaks, len(periods)] - 1
    return {
        "from_amplitude": amplitudes[starts],
        "to_amplitude": amplitudes[ends],
        "period": periods[starts],
        "amplitudes": ends - starts + 1,
    }


def cascade(amplitudes, periods) -> dict:
    """Where period 2, 4, 8, 16 and then chaos (period 0) first appear, each after the last."""
    onsets, position = {}, 0
    for label, period in [("2", 2), ("4", 4), ("8", 8), ("16", 16), ("chaos", 0)]:
        hits = np.flatnonzero(periods[position:] == period)
        if hits.size == 0:
            break
        position += int(hits[0])
        onsets[label] = float(amplitudes[position])
    return onsets


def section_dataset(amplitudes, omega, codes, periods, distinct, sweep_config) -> xr.Dataset:
    sample = np.arange(omega.shape[1])
    data = xr.Dataset(
        {
            "omega": (
                ("drive_amplitude", "sample"),
                omega,
                {"long_name": "angular velocity on the Poincaré section", "units": "rad/s"},
            ),
            "period": (
                "drive_amplitude",
                periods,
                {"long_name": f"period in drive periods (0: none up to {MAX_PERIOD})"},
            ),
            "distinct_points": (
                "drive_amplitude",
                distinct,
                {"long_name": f"section values more than {TOLERANCE} apart"},
            ),
            "result": ("drive_amplitude", codes, {"long_name": "ds.RESULTS code (0: success)"}),
        },
        coords={
            "drive_amplitude": (
                "drive_amplitude",
                np.asarray(amplitudes),
                {"long_name": "drive amplitude g", "units": "1/s^2"},
            ),
            "sample": ("sample", sample),
            "time": (
                "sample",
                PERIOD * (TRANSIENT_PERIODS + 1 + sample),
                {"long_name": "section time", "units": "s"},
            ),
        },
        # the sweep's own config; its git commit and package versions would change the bytes
        attrs={
            "sweep_config": sweep_config,
            "q": Q,
            "drive_frequency": DRIVE_FREQUENCY,
            "dt": DT,
            "y0": list(Y0),
        },
    )
    return data


def run(out_dir="out/pendulum_bifurcation", quick: bool = False) -> dict:
    out, plt = _output.prepare(out_dir)
    points, zoom_points, attractor_members = (61, 26, 16) if quick else (1201, 1001, 100)
    periods_kept = 64 if quick else 200
    # rounded, so that the amplitudes in the files are the decimals they look like
    amplitudes = np.round(np.linspace(*RANGE, points), 9)
    zoom_amplitudes = np.round(np.linspace(*ZOOM, zoom_points), 9)
    attractor_angles = Y0[0] + 0.01 * np.arange(attractor_members)
    # One sweep (one compilation): the diagram and the zoom from rest, and members at g = 1.5
    # from slightly different angles, whose sections together sample the strange attractor.
    parts = np.cumsum([points, zoom_points])
    omega, result = section_sweep(
        np.concatenate(
            [amplitudes, zoom_amplitudes, np.full(attractor_members, ATTRACTOR_AMPLITUDE)]
        ),
        np.concatenate([np.full(parts[-1], Y0[0]), attractor_angles]),
        periods_kept,
    )
    codes = np.asarray(result["result"].values)
    failed = int(np.sum(codes != 0))
    omega, zoom_omega, attractor_omega = np.split(omega, parts)
    codes, zoom_codes, attractor_codes = np.split(codes, parts)
    theta = np.asarray(result["theta"].values)[parts[-1] :]
    theta = np.mod(theta + np.pi, 2 * np.pi) - np.pi  # θ mod 2π in [−π, π)
    period, distinct = periods_of(omega), distinct_points(omega)
    zoom_period, zoom_distinct = periods_of(zoom_omega), distinct_points(zoom_omega)

    probes = {}
    for g in PROBES:
        i = int(np.argmin(np.abs(amplitudes - g)))
        probes[f"{g:g}"] = {
            "amplitude": float(amplitudes[i]),
            "period": int(period[i]),
            "distinct_points": int(distinct[i]),
            "spread": float(np.ptp(omega[i])),
            "mean_omega": float(np.mean(omega[i])),
        }
        print(
            f"g = {amplitudes[i]:.4f}: period {period[i]:2d}, {distinct[i]:3d} distinct "
            f"section points of {omega.shape[1]}, spread {np.ptp(omega[i]):.3g} rad/s"
        )
    first_doubling = float(amplitudes[np.argmax(period == 2)]) if np.any(period == 2) else None
    onsets = cascade(zoom_amplitudes, zoom_period)
    band = (amplitudes >= 1.15) & (amplitudes <= 1.26)
    aperiodic_in_band = float(np.mean(period[band] == 0))
    print(
        f"first period 2 at g = {first_doubling}; cascade in {ZOOM}: {onsets}; aperiodic "
        f"in [1.15, 1.26]: {aperiodic_in_band:.0%}; failed members: {failed}"
    )

    fig = plt.figure(figsize=(7.4, 7.2), layout="constrained")
    grid = fig.add_gridspec(2, 2, height_ratios=[1.15, 1.0])
    main = fig.add_subplot(grid[0, :])
    dots = dict(
        ls="none",
        marker=".",
        ms=0.9 if quick else 0.35,
        mew=0,
        color="0.1",
        alpha=1.0 if quick else 0.5,
        rasterized=True,
    )
    main.plot(np.repeat(amplitudes, omega.shape[1]), omega.ravel(), **dots)
    main.axvspan(*ZOOM, color="C0", alpha=0.08, lw=0)
    main.text(np.mean(ZOOM), 2.42, "(b)", ha="center", fontsize=8, color="C0")
    for key in ("1", "1.07", "1.2", "1.35"):
        probe = probes[key]
        label = "chaos" if probe["period"] == 0 else f"P{probe['period']}"
        main.annotate(label, (probe["amplitude"], -0.62), ha="center", fontsize=8, color="C1")
    main.set_xlim(*RANGE)
    main.set_ylim(-0.7, 2.55)
    main.set_xlabel("drive amplitude $g$")
    main.set_ylabel(r"$\omega$ at $t = kT$ (rad/s)")
    main.set_title(
        f"(a) q = {Q:g}, $\\omega_D$ = 2/3, from rest: {points} amplitudes × "
        f"{omega.shape[1]} section points after {TRANSIENT_PERIODS} drive periods",
        fontsize=9,
    )
    fig.suptitle(
        r"Driven damped pendulum $\theta'' + \theta'/q + \sin\theta = g\cos(\omega_D t)$"
        r": $\omega$ sampled once per drive period $T = 2\pi/\omega_D$",
        fontsize=10,
    )

    zoom = fig.add_subplot(grid[1, 0])
    zoom.plot(
        np.repeat(zoom_amplitudes, zoom_omega.shape[1]),
        zoom_omega.ravel(),
        **{**dots, "ms": 1.2 if quick else 0.45},
    )
    for label, g in onsets.items():
        zoom.axvline(g, color="C1", lw=0.6, ls=":")
        if label in ("2", "4"):  # the later onsets crowd within 0.002 of each other
            zoom.text(
                g, 2.35, f"P{label}", rotation=90, va="top", ha="right", fontsize=7, color="C1"
            )
    listing = "\n".join(
        f"{'chaos' if k == 'chaos' else 'P' + k}: g = {g:.4f}" for k, g in onsets.items()
    )
    zoom.text(
        0.03,
        0.03,
        "first amplitude with\n" + listing,
        transform=zoom.transAxes,
        fontsize=7,
        color="C1",
        va="bottom",
    )
    zoom.set_xlim(*ZOOM)
    zoom.set_ylim(-0.3, 2.4)
    zoom.set_xlabel("drive amplitude $g$")
    zoom.set_ylabel(r"$\omega$ at $t = kT$ (rad/s)")
    zoom.set_title(f"(b) period-doubling cascade: {zoom_points} amplitudes", fontsize=9)

    portrait = fig.add_subplot(grid[1, 1])
    portrait.plot(
        theta.ravel(),
        attractor_omega.ravel(),
        ls="none",
        marker=".",
        ms=1.5 if quick else 0.6,
        mew=0,
        color="C0",
        rasterized=True,
    )
    portrait.set_xlim(-np.pi, np.pi)
    portrait.set_xticks([-np.pi, -np.pi / 2, 0, np.pi / 2, np.pi], ["−π", "−π/2", "0", "π/2", "π"])
    portrait.set_xlabel(r"$\theta$ mod 2π at $t = kT$ (rad)")
    portrait.set_ylabel(r"$\omega$ at $t = kT$ (rad/s)")
    portrait.set_title(
        f"(c) strange attractor, g = {ATTRACTOR_AMPLITUDE:g}: {theta.size:,} section points",
        fontsize=9,
    )
    files = ds.plot.save(fig, out, "pendulum_bifurcation")
    plt.close("all")

    config_json = result.attrs["sweep_config"]
    files.append(
        _output.dataset(
            out,
            "pendulum_bifurcation",
            section_dataset(amplitudes, omega, codes, period, distinct, config_json),
        )
    )
    files.append(
        _output.dataset(
            out,
            "pendulum_bifurcation_zoom",
            section_dataset(
                zoom_amplitudes, zoom_omega, zoom_codes, zoom_period, zoom_distinct, config_json
            ),
        )
    )
    sample = np.arange(periods_kept)
    attractor = xr.Dataset(
        {
            "theta": (("member", "sample"), theta, {"long_name": "angle mod 2π", "units": "rad"}),
            "omega": (
                ("member", "sample"),
                attractor_omega,
                {"long_name": "angular velocity", "units": "rad/s"},
            ),
            "result": ("member", attractor_codes),
        },
        coords={
            "initial_angle": ("member", attractor_angles, {"units": "rad"}),
            "time": ("sample", PERIOD * (TRANSIENT_PERIODS + 1 + sample), {"units": "s"}),
        },
        attrs={"drive_amplitude": ATTRACTOR_AMPLITUDE, "q": Q, "dt": DT},
    )
    files.append(_output.dataset(out, "pendulum_attractor", attractor))
    files.append(_output.table(out, "pendulum_windows", windows(amplitudes, period)))

    config = {
        "q": Q,
        "drive_frequency": DRIVE_FREQUENCY,
        "solver": "RK4",
        "dt": DT,
        "steps_per_period": STEPS_PER_PERIOD,
        "transient_periods": TRANSIENT_PERIODS,
        "section_periods": periods_kept,
        "y0": list(Y0),
        "amplitude_range": list(RANGE),
        "amplitudes": points,
        "zoom_range": list(ZOOM),
        "zoom_amplitudes": zoom_points,
        "attractor_amplitude": ATTRACTOR_AMPLITUDE,
        "attractor_members": attractor_members,
        "tolerance": TOLERANCE,
        "max_period": MAX_PERIOD,
    }
    record = {
        "config": config,
        "probes": probes,
        "first_period_doubling": first_doubling,
        "cascade_onsets": onsets,
        "aperiodic_fraction_1.15_to_1.26": aperiodic_in_band,
        "failed_members": failed,
    }
    files.append(_output.summary(out, "pendulum_bifurcation", record))
    return {"files": files, **record}


if __name__ == "__main__":
    _output.main(__file__, __doc__)
