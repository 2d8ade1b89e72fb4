"""Energy drift over a thousand orbits: symplectic against Runge–Kutta solvers.

An eccentric Kepler orbit (`models.Kepler`, μ = 1, a = 1, e = 0.5, from periapsis; period
P = 2π) is integrated for 1000 orbits with the same step h = P/400 by three symplectic methods
(symplectic Euler, leapfrog, Yoshida's fourth-order composition) and two explicit Runge–Kutta
methods (Midpoint, RK4), with Tsit5 (adaptive, rtol = atol = 1e-9) as a peer; the quick run
covers 100 orbits without Tsit5 (compiling diffrax's loop alone takes ~2 s). Each is one
`ds.simulate` that saves a thinned grid of whole steps: every step at first, then each save 1%
of the elapsed time after the last, up to one save per 137 steps (a count prime to the 400
steps of an orbit, so that the saves sweep all orbital phases): 3,415 saved times for 400,000
steps.

The figure shows the relative energy error |H(t) − H₀|/|H₀| (left) and the relative error of
the angular momentum L = q × p (right) against time in orbits on log axes; faint lines are the
saved values, bold ones their maxima over logarithmic time bins. The symplectic methods' energy
errors oscillate within bounds that do not grow (each conserves a modified Hamiltonian): about
2.4e-2, 6.7e-4 and 1.3e-6 for symplectic Euler, leapfrog and Yoshida4; and they conserve L to
round-off (every kick and drift preserves q × p). The errors of the Runge–Kutta methods grow
linearly in time (fitted exponents 1.0): RK4's energy error is ~3e-6 after 100 orbits and ~3e-5
after 1000, overtaking Yoshida4's bound after ~40 orbits; Midpoint's reaches 0.1; Tsit5
(~113 steps per orbit) drifts from ~5e-7 to ~5e-6. The summary lists, per solver, the maximum
energy error over the first and the last tenth of the run, their ratio (10 for linear growth)
and the growth exponent fitted over the last decade of time.

Run: `python experiments/kepler_energy.py [--out DIR] [--quick]`
"""

import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np
import xarray as xr

sys.path.insert(0, str(Path(__file__).parent))
import _output

import diffsim as ds
import models

ECCENTRICITY = 0.5
STEPS_PER_ORBIT = 400
SAVE_EVERY = 137  # steps between saves once the saves are sparse; prime to STEPS_PER_ORBIT
SAVE_GROWTH = 0.01  # before that, each save 1% of the elapsed time after the previous one
TOLERANCE = 1e-9  # Tsit5's rtol and atol
BINS = 10  # logarithmic time bins over the last decade of the run, for the growth exponent
SOLVERS = {
    "SymplecticEuler": ds.SymplecticEuler(),
    "Leapfrog": ds.Leapfrog(),
    "Yoshida4": ds.Yoshida4(),
    "Midpoint": ds.Midpoint(),
    "RK4": ds.RK4(),
    "Tsit5": ds.Tsit5(rtol=TOLERANCE, atol=TOLERANCE),
}
KINDS = {"Midpoint": "Runge–Kutta", "RK4": "Runge–Kutta", "Tsit5": f"adaptive, tol {TOLERANCE:g}"}
COLOURS = {
    "SymplecticEuler": "#777777",
    "Leapfrog": "#000000",
    "Yoshida4": "#882255",
    "Midpoint": "#D55E00",
    "RK4": "#0072B2",
    "Tsit5": "#009E73",
}


def save_steps(total: int) -> np.ndarray:
    """Step indices 0 … total to save at: geometric (each SAVE_GROWTH of the elapsed steps after
    the last, at least one step) until that spacing reaches SAVE_EVERY, then every SAVE_EVERY
    steps, and the last step."""
    switch = int(SAVE_EVERY / SAVE_GROWTH)
    count = int(np.log(switch) / np.log1p(SAVE_GROWTH)) + 1
    early = np.unique(np.rint(np.geomspace(1, switch, count)).astype(np.int64))
    late = np.arange(early[-1] + SAVE_EVERY, total, SAVE_EVERY)
    steps = np.unique(np.concatenate([[0], early, late, [total]]))
    return steps[steps <= total]


def window_max(values, orbits, start, stop) -> float:
    """The maximum of `values` over saved times in (start, stop] orbits."""
    inside = (orbits > start) & (orbits <= stop)
    return float(np.max(values[inside]))


def binned_max(values, orbits, edges):
    """Maxima of `values` over the saved times in each bin (edges[i], edges[i+1]], NaN for a
    bin without saved times."""
    maxima = []
    for a, b in zip(edges[:-1], edges[1:]):
        inside = (orbits > a) & (orbits <= b)
        maxima.append(np.max(values[inside]) if inside.any() else np.nan)
    return np.array(maxima)


def growth_exponent(values, orbits, total_orbits) -> float:
    """The log-log slope of the maximum error over BINS logarithmic bins spanning the last
    decade of the run (from a tenth of it to the end) against the bins' ends: ~0 for a bounded
    error, 1 for linear growth. (Earlier, a bounded oscillating part of a Runge–Kutta method's
    error still competes with its drift.)"""
    edges = np.geomspace(0.1 * total_orbits, total_orbits, BINS + 1)
    maxima = binned_max(values, orbits, edges)
    return float(np.polyfit(np.log(edges[1:]), np.log(maxima), 1)[0])


def run(out_dir="out/kepler_energy", quick: bool = False) -> dict:
    out, plt = _output.prepare(out_dir)
    total_orbits = 100 if quick else 1000
    # the quick run leaves out the adaptive peer: compiling diffrax's loop alone takes ~2 s
    solvers = {k: v for k, v in SOLVERS.items() if not (quick and k == "Tsit5")}
    model = models.Kepler()
    y0 = model.initial_state(ECCENTRICITY)
    period = float(model.period())
    h = period / STEPS_PER_ORBIT
    total = total_orbits * STEPS_PER_ORBIT
    steps = save_steps(total)
    ts = steps * h  # whole multiples of the step: each interval is a whole number of steps
    orbits = steps / STEPS_PER_ORBIT
    energy0 = float(model.energy(y0))
    momentum0 = float(model.angular_momentum(y0))
    # H and L at every saved state, as one compiled program
    invariants = jax.jit(jax.vmap(lambda y: (model.energy(y), model.angular_momentum(y))))
    print(f"{total} steps of h = P/{STEPS_PER_ORBIT}, {ts.size} saved times")

    energy, momentum, stats = {}, {}, {}
    for name, solver in solvers.items():
        start = time.perf_counter()
        if solver.adaptive:
            # the static bound: as many steps as the fixed-step solvers take (Tsit5 needs ~30%)
            sol = ds.simulate(model, y0, ts, solver=solver, max_steps=total)
        else:
            # the intervals hold different whole numbers of steps (≤ SAVE_EVERY): simulate runs
            # each for the largest count with the surplus masked. No gradients, no checkpoints.
            sol = ds.simulate(model, y0, ts, solver=solver, dt=h, checkpoint=None)
        h_t, l_t = (np.asarray(v) for v in invariants(sol.ys))
        energy[name] = np.abs(h_t - energy0) / abs(energy0)
        momentum[name] = np.abs(l_t - momentum0) / abs(momentum0)
        stats[name] = {k: int(v) for k, v in sol.stats.items()}
        print(
            f"{name:16s} energy error {energy[name][-1]:.2e} at the end, "
            f"{stats[name]['num_steps']} steps, {time.perf_counter() - start:.2f} s"
        )

    tenth = 0.1 * total_orbits
    rows = {}
    for name in solvers:
        first = window_max(energy[name], orbits, 0.0, tenth)
        last = window_max(energy[name], orbits, total_orbits - tenth, total_orbits)
        rows[name] = {
            "symplectic": isinstance(solvers[name], ds.AbstractSymplectic),
            "energy_error_first_tenth": first,
            "energy_error_last_tenth": last,
            "energy_growth_ratio": last / first,
            "energy_growth_exponent": growth_exponent(energy[name], orbits, total_orbits),
            "momentum_error_last_tenth": window_max(
                momentum[name], orbits, total_orbits - tenth, total_orbits
            ),
            "momentum_growth_exponent": growth_exponent(momentum[name], orbits, total_orbits),
            **stats[name],
        }
        exponent = rows[name]["energy_growth_exponent"]
        print(
            f"{name:16s} max energy error {first:.2e} (first tenth) → {last:.2e} (last "
            f"tenth), ×{last / first:.2f}, exponent {exponent:.2f}"
        )

    fig, axes = plt.subplots(1, 2, figsize=(11.0, 4.6), sharex=True)
    edges = np.geomspace(0.01, total_orbits, 61)
    centres = np.sqrt(edges[:-1] * edges[1:])
    shown = orbits >= edges[0]
    for axis, values, what in (
        (axes[0], energy, "energy"),
        (axes[1], momentum, "angular momentum"),
    ):
        for name in solvers:
            colour = COLOURS[name]
            raw = np.where(values[name] > 0, values[name], np.nan)  # log axes: zeros as gaps
            axis.loglog(orbits[shown], raw[shown], "-", color=colour, lw=0.5, alpha=0.3)
            label = f"{name} ({KINDS.get(name, 'symplectic')})"
            axis.loglog(
                centres,
                binned_max(values[name], orbits, edges),
                "-",
                color=colour,
                lw=1.6,
                label=label,
            )
        guide = energy["RK4"] if what == "energy" else momentum["RK4"]
        anchor = window_max(guide, orbits, 0.5 * total_orbits, total_orbits)
        axis.loglog(
            centres, 3 * anchor * centres / total_orbits, ":", color="0.4", lw=1.0, label="∝ t"
        )
        axis.set_xlabel("time (orbits)")
        axis.set_xlim(edges[0], total_orbits)
    axes[0].set_ylabel("relative energy error |H(t) − H₀| / |H₀|")
    axes[1].set_ylabel("relative angular momentum error |L(t) − L₀| / |L₀|")
    axes[0].set_title(f"energy, e = {ECCENTRICITY:g}, same step h = P/{STEPS_PER_ORBIT}")
    axes[1].set_title("angular momentum (symplectic: round-off)")
    # the legend in the empty band between the Runge–Kutta and the round-off curves
    axes[1].legend(fontsize=7, ncol=2, loc="center", bbox_to_anchor=(0.5, 0.33))
    fig.tight_layout()
    files = ds.plot.save(fig, out, "kepler_energy")
    plt.close("all")

    data = xr.Dataset(
        {
            "energy_error": (("solver", "time"), np.array([energy[n] for n in solvers])),
            "angular_momentum_error": (
                ("solver", "time"),
                np.array([momentum[n] for n in solvers]),
            ),
            "symplectic": ("solver", np.array([rows[n]["symplectic"] for n in solvers])),
            "num_steps": ("solver", np.array([stats[n]["num_steps"] for n in solvers])),
            "num_function_evals": (
                "solver",
                np.array([stats[n]["num_function_evals"] for n in solvers]),
            ),
        },
        coords={
            "solver": list(solvers),
            "time": ts,
            "orbits": ("time", orbits),
            "step": ("time", steps),
        },
        attrs={
            "description": "relative errors |H(t) - H0|/|H0| and |L(t) - L0|/|L0| of an "
            f"eccentric Kepler orbit (e = {ECCENTRICITY}, mu = a = 1)",
            "step": f"P/{STEPS_PER_ORBIT} for the fixed-step solvers",
            "tsit5_tolerance": TOLERANCE,
        },
    )
    files.append(_output.dataset(out, "kepler_energy", data))
    config = {
        "eccentricity": ECCENTRICITY,
        "semi_major_axis": 1.0,
        "mu": 1.0,
        "orbits": total_orbits,
        "steps_per_orbit": STEPS_PER_ORBIT,
        "dt": h,
        "save_every": SAVE_EVERY,
        "save_growth": SAVE_GROWTH,
        "saved_times": int(ts.size),
        "tsit5_rtol_atol": TOLERANCE,
        "growth_bins": BINS,
        "solvers": list(solvers),
    }
    record = {"config": config, "solvers": rows}
    files.append(_output.summary(out, "kepler_energy", record))
    return {"files": files, **record}


if __name__ == "__main__":
    _output.main(__file__, __doc__)
