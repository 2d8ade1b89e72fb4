"""Measured order of accuracy of every fixed-step solver against closed-form solutions.

Every fixed-step solver of diffsim (Euler, Midpoint, Heun, Ralston, RK4, RK38, symplectic
Euler, leapfrog and Yoshida's fourth-order composition) integrates two problems with known
solutions: the undamped harmonic oscillator x'' = −ω²x (ω = 2, x(0) = 1, v(0) = 0.5) with
n = 32 … 256 equal steps (quick run: 32 … 128), and (full run only: it doubles the compile
time) the eccentric Kepler orbit (e = 0.5, a = μ = 1, from periapsis, exact by Newton's method
on Kepler's equation) with n = 128 … 1024, both to t = 2. That is 0.64 oscillator periods and
0.32 orbits, not a whole number of periods: there symplectic Euler, conjugate to leapfrog by a
half kick, would show order 2. The global error is max |Δy| over the state at the final time;
the measured order is the least-squares slope of log(error) against log(step size). The step
count of a fixed-step solve is static, so each n would compile a program of its own: instead
every n of a solver runs on the grid [0, T, T + N h] (h = T/n, N = max n + 1), which
`ds.simulate` steps N times per interval with the surplus steps masked, so that only traced
values change with n and each solver compiles once per problem.

The figure shows the errors on log-log axes, one panel per problem, each line labelled with its
measured slope and drawn beside a dotted line of its nominal order. Expect slopes within 0.05
of the nominal orders 1, 2, 2, 2, 4, 4, 1, 2, 4. On the linear oscillator the three two-stage
methods coincide, and so do RK4 and RK38 (on y' = λy every explicit s-stage method of order
s ≤ 4 multiplies by the Taylor polynomial of e^{hλ}); on the Kepler orbit they separate. The
errors span 0.3 down to 7e-11, far above float64 round-off.

Run: `python experiments/convergence.py [--out DIR] [--quick]`
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

SOLVERS = (
    ds.Euler(),
    ds.Midpoint(),
    ds.Heun(),
    ds.Ralston(),
    ds.RK4(),
    ds.RK38(),
    ds.SymplecticEuler(),
    ds.Leapfrog(),
    ds.Yoshida4(),
)
T_END = 2.0
OMEGA = 2.0
OSCILLATOR_Y0 = (1.0, 0.5)  # x(0), v(0)
ECCENTRICITY = 0.5
# Step counts in every method's asymptotic regime (local slopes within 0.06 of the order from
# the first doubling on), with the smallest error (RK4 on the orbit, 6.5e-11) still ~300 times
# the worst case of accumulated round-off, n eps.
STEPS = {"oscillator": (32, 64, 128, 256), "kepler": (128, 256, 512, 1024)}
QUICK_STEPS = {"oscillator": (32, 64, 128)}
TITLES = {
    "oscillator": f"harmonic oscillator, ω = {OMEGA:g}, t = 0 … {T_END:g}",
    "kepler": f"Kepler orbit, e = {ECCENTRICITY:g}, t = 0 … {T_END:g}",
}


def kepler_state(model, eccentricity: float, t: float) -> np.ndarray:
    """The exact state `[q, p]` at time `t` of the orbit (a = 1) that starts at periapsis at
    t = 0: the eccentric anomaly E from Kepler's equation E − e sin E = M by Newton's method
    (quadratic convergence from E = M + e sin M; 30 iterations reach round-off for e < 0.9)."""
    e = float(eccentricity)
    mean_motion = 2 * np.pi / float(model.period())
    mean_anomaly = mean_motion * t
    anomaly = mean_anomaly + e * np.sin(mean_anomaly)
    for _ in range(30):
        anomaly -= (anomaly - e * np.sin(anomaly) - mean_anomaly) / (1 - e * np.cos(anomaly))
    rate = mean_motion / (1 - e * np.cos(anomaly))  # dE/dt
    minor = np.sqrt(1 - e**2)  # b / a
    q = [np.cos(anomaly) - e, minor * np.sin(anomaly)]
    p = [-np.sin(anomaly) * rate, minor * np.cos(anomaly) * rate]
    return np.array([q, p])


def problem(name: str):
    """(model, y0, exact state at T_END) of a problem."""
    if name == "oscillator":
        model = models.HarmonicOscillator(omega=OMEGA)
        y0 = jnp.array(OSCILLATOR_Y0)
        exact = np.asarray(model.analytic_solution(y0, jnp.array([0.0, T_END])))[-1]
        return model, y0, exact
    model = models.Kepler()
    return model, model.initial_state(ECCENTRICITY), kepler_state(model, ECCENTRICITY, T_END)


def final_errors(solver, model, y0, exact, steps) -> np.ndarray:
    """max |y_n − y(T_END)| after n equal steps, for each n in `steps`.

    Every n runs on the grid [0, T, T + N h] with h = T/n and N = max(steps) + 1: the intervals
    take n and N steps, `ds.simulate` runs each for the larger count N (the same for every n)
    with the surplus steps masked, so all n share one compiled program; the state at ts[1] is
    exactly that of n steps (the extra interval only keeps the shapes static). `throw=False`:
    far into that extra interval a coarse unstable method may overflow, which does not touch
    the state at ts[1], checked finite instead."""
    padding = max(steps) + 1
    errors = []
    for n in steps:
        h = T_END / n
        ts = np.array([0.0, T_END, T_END + padding * h])
        # no gradients here, so no checkpoint blocks (they would only add loops to compile)
        sol = ds.simulate(model, y0, ts, solver=solver, dt=h, checkpoint=None, throw=False)
        state = np.asarray(sol.ys[1])
        if not np.all(np.isfinite(state)):
            raise RuntimeError(f"{type(solver).__name__} with {n} steps: non-finite state")
        errors.append(float(np.max(np.abs(state - exact))))
    return np.array(errors)


def _finish(axis, sizes):
    """Tick the step sizes as fractions and put the legend below the axes."""
    from matplotlib.ticker import NullLocator

    axis.set_xticks(sizes, [f"1/{round(1 / h)}" for h in sizes])
    axis.xaxis.set_minor_locator(NullLocator())
    axis.legend(
        title="measured slope (nominal order)",
        fontsize=7,
        title_fontsize=7,
        ncol=3,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.13),
    )


def run(out_dir="out/convergence", quick: bool = False) -> dict:
    out, plt = _output.prepare(out_dir)
    steps = QUICK_STEPS if quick else STEPS
    names = [type(s).__name__ for s in SOLVERS]
    nominal = {name: s.order for name, s in zip(names, SOLVERS)}
    symplectic = {name: isinstance(s, ds.AbstractSymplectic) for name, s in zip(names, SOLVERS)}
    errors, measured = {}, {}
    for key, counts in steps.items():
        model, y0, exact = problem(key)
        errors[key], measured[key] = {}, {}
        for name, solver in zip(names, SOLVERS):
            start = time.perf_counter()
            values = final_errors(solver, model, y0, exact, counts)
            sizes = T_END / np.array(counts)
            errors[key][name] = values
            measured[key][name] = ds.plot.measured_order(sizes, values)
            print(
                f"{key:10s} {name:16s} order {measured[key][name]:.3f} (nominal "
                f"{nominal[name]}), errors {values[0]:.2e} … {values[-1]:.2e}, "
                f"{time.perf_counter() - start:.2f} s"
            )

    keys = list(steps)
    # symplectic methods dashed with square markers, to tell them from the Runge–Kutta ones
    styles = {name: {"ls": "--", "marker": "s"} for name in names if symplectic[name]}
    fig, axes = plt.subplots(1, len(keys), figsize=(5.6 * len(keys), 4.8), squeeze=False)
    for axis, key in zip(axes[0], keys):
        sizes = T_END / np.array(steps[key])
        ds.plot.convergence(
            sizes,
            errors[key],
            orders=nominal,
            ax=axis,
            styles=styles,
            xlabel="step size h (time units)",
            ylabel=f"global error max |Δy| at t = {T_END:g}",
        )
        _finish(axis, sizes)
        axis.set_title(TITLES[key])
        if key == "oscillator":  # coinciding lines: say so
            axis.text(
                0.97,
                0.04,
                "linear problem:\nMidpoint = Heun = Ralston,\nRK4 = RK38",
                transform=axis.transAxes,
                ha="right",
                va="bottom",
                fontsize=7,
            )
    fig.tight_layout()
    files = ds.plot.save(fig, out, "convergence")
    plt.close("all")

    refinements = len(next(iter(steps.values())))
    data = xr.Dataset(
        {
            "error": (
                ("problem", "solver", "refinement"),
                np.array([[errors[k][n] for n in names] for k in keys]),
            ),
            "measured_order": (
                ("problem", "solver"),
                np.array([[measured[k][n] for n in names] for k in keys]),
            ),
            "nominal_order": ("solver", np.array([nominal[n] for n in names])),
            "symplectic": ("solver", np.array([symplectic[n] for n in names])),
            "evals_per_step": ("solver", np.array([s.evals_per_step for s in SOLVERS])),
        },
        coords={
            "problem": keys,
            "solver": names,
            "refinement": np.arange(refinements),
            "steps": (("problem", "refinement"), np.array([steps[k] for k in keys])),
            "step_size": (("problem", "refinement"), T_END / np.array([steps[k] for k in keys])),
        },
        attrs={
            "description": "global error max|y_n - y(T)| at T after n equal steps",
            "final_time": T_END,
            "oscillator": f"HarmonicOscillator(omega={OMEGA}), y0 = {list(OSCILLATOR_Y0)}",
            "kepler": f"Kepler(mu=1), eccentricity {ECCENTRICITY}, a = 1, from periapsis",
        },
    )
    files.append(_output.dataset(out, "convergence", data))
    config = {
        "final_time": T_END,
        "omega": OMEGA,
        "oscillator_y0": list(OSCILLATOR_Y0),
        "eccentricity": ECCENTRICITY,
        "steps": {k: list(v) for k, v in steps.items()},
        "solvers": names,
    }
    record = {
        "config": config,
        "nominal_orders": nominal,
        "measured_orders": measured,
        "errors": {k: {n: v.tolist() for n, v in errors[k].items()} for k in keys},
        "smallest_error": min(float(v.min()) for k in keys for v in errors[k].values()),
    }
    files.append(_output.summary(out, "convergence", record))
    return {"files": files, **record}


if __name__ == "__main__":
    _output.main(__file__, __doc__)
