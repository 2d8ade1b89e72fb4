"""Restitution and air drag of a bouncing ball, fitted through its impacts.

A ball (restitution e = 0.78, linear drag k = 0.08 1/s, g = 9.81 m/s²) is dropped from 1.2 m
and filmed at 60 frames/s for 2.5 s; the tracked heights carry 3 mm of Gaussian noise (seeded).
Each impact is a `ds.Event` whose reset v → −e v depends on the fitted e, so the residuals'
Jacobian flows through the located impact times (implicit function theorem): `ds.fit` recovers
e, k and the drop height from a poor guess (e = 0.6, k = 0.02, 1.0 m). The figure shows the
frames, the fitted trajectory and its residuals; the summary checks the derivative of an impact
time with respect to e against central differences and the estimates against the truth.

Run: `python experiments/bouncing_ball.py [--out DIR] [--quick]`
"""

import sys
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import _output

import diffsim as ds
import models

TRUTH = dict(restitution=0.78, drag=0.08)
REST_SPEED = 0.1  # m/s: slower rebounds end at rest (known, not fitted)
DROP = 1.2  # m
NOISE = 0.003  # m
FPS = 60
STEPS_PER_FRAME = 4
MAX_EVENTS = 24
SEED = 0


def impacts(ball):
    return ball.impacts(MAX_EVENTS)


def height(y):
    return y[0]


def run(out_dir="out/bouncing_ball", quick: bool = False) -> dict:
    out, plt = _output.prepare(out_dir)
    duration = 1.5 if quick else 2.5
    ts = np.arange(round(duration * FPS) + 1) / FPS
    dt = 1 / (FPS * STEPS_PER_FRAME)
    truth = models.BouncingBall(**TRUTH, rest_speed=REST_SPEED)
    y0 = jnp.array([DROP, 0.0])
    clean = ds.simulate(truth, y0, ts, solver=ds.RK4(), dt=dt, events=impacts(truth))
    noise = NOISE * np.random.default_rng(SEED).standard_normal(ts.size)
    values = np.asarray(clean.ys[:, 0]) + noise

    guess = models.BouncingBall(restitution=0.6, drag=0.02, rest_speed=REST_SPEED)
    result = ds.fit(
        guess,
        jnp.array([1.0, 0.0]),
        ds.Data(ts, values, names=("height (m)",)),
        params={"restitution": (0.05, 0.99), "drag": (0.0, 1.0)},
        initial_state=["x"],
        observe=height,
        solver=ds.RK4(),
        dt=dt,
        events=impacts,
    )
    print(result.summary())

    # d(second impact time)/de by the event's implicit derivative and by central differences
    def second_impact(e):
        ball = models.BouncingBall(restitution=e, drag=TRUTH["drag"], rest_speed=REST_SPEED)
        sol = ds.simulate(ball, y0, ts, solver=ds.RK4(), dt=dt, events=impacts(ball))
        return sol.event_time[1]

    derivative = central = None
    if not quick:  # the quick run's tests check this derivative against the closed form
        e = TRUTH["restitution"]
        derivative = float(jax.grad(second_impact)(e))
        step = 1e-6
        central = float((second_impact(e + step) - second_impact(e - step)) / (2 * step))
        print(f"d t2 / d e: {derivative:.9f} (implicit), {central:.9f} (central differences)")

    estimates = {
        "restitution": float(result.params["restitution"]),
        "drag": float(result.params["drag"]),
        "drop height": float(result.params["y0[x]"]),
    }
    errors = {
        "restitution": float(result.stderr["restitution"]),
        "drag": float(result.stderr["drag"]),
        "drop height": float(result.stderr["y0[x]"]),
    }
    truths = {"restitution": TRUTH["restitution"], "drag": TRUTH["drag"], "drop height": DROP}
    fitted = result.model
    fitted_run = ds.simulate(fitted, result.y0, ts, solver=ds.RK4(), dt=dt, events=impacts(fitted))
    count = int(clean.event_count)

    fig = result.plot()
    axis = fig.axes[0]
    fig.set_size_inches(6.4, 5.2)
    axis.set_title(
        f"bouncing ball, 60 frames/s: e = {estimates['restitution']:.4f} ± "
        f"{errors['restitution']:.4f} (truth {TRUTH['restitution']}),\n"
        f"k = {estimates['drag']:.3f} ± {errors['drag']:.3f} 1/s (truth {TRUTH['drag']}); "
        "grey lines: fitted impacts",
        fontsize=9,
    )
    axis.set_ylabel("height (m)")
    for t in np.asarray(fitted_run.event_time[:count]):
        axis.axvline(t, color="0.8", lw=0.6, zorder=0)
    files = ds.plot.save(fig, out, "bouncing_ball")
    plt.close("all")
    files.append(
        _output.table(
            out,
            "bouncing_ball_data",
            {"t": ts, "height": values, "fitted": np.asarray(result.predictions).ravel()},
        )
    )
    record = {
        "truth": truths,
        "estimates": estimates,
        "stderr": errors,
        "within_3_se": {k: abs(estimates[k] - truths[k]) <= 3 * errors[k] for k in truths},
        "impact_times_true": np.asarray(clean.event_time[:count]).tolist(),
        "impact_times_fitted": np.asarray(fitted_run.event_time[:count]).tolist(),
        "d_t2_d_e_implicit": derivative,
        "d_t2_d_e_central": central,
        "converged": bool(result.converged),
        "iterations": int(result.iterations),
        "noise_sd_estimated": float(np.sqrt(result.noise_variance)),
        "config": dict(
            truth=TRUTH,
            rest_speed=REST_SPEED,
            drop=DROP,
            noise=NOISE,
            seed=SEED,
            fps=FPS,
            duration=duration,
            steps_per_frame=STEPS_PER_FRAME,
            max_events=MAX_EVENTS,
            guess=dict(restitution=0.6, drag=0.02, drop=1.0),
            solver="RK4",
        ),
    }
    files.append(_output.summary(out, "bouncing_ball", record))
    return {"files": files, **record}


if __name__ == "__main__":
    _output.main(__file__, __doc__)
