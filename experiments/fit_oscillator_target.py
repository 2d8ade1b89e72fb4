"""Shooting for a target: the initial state of a harmonic oscillator that hits it.

A damped oscillator (ω = 2 rad/s, γ = 0.1 1/s) starts at x = 0. (a) Which initial velocity puts
it at x = 1 m at T = 1 s? (b) Which initial position and velocity bring it to rest (v = 0) at
x = 1 m at T = 1 s? Both are `ds.fit` with the target as the only "observation" (t0 = 0, the
tolerance ±1 mm as its noise) and the initial state as the unknowns: a boundary-value problem
solved by shooting. Both answers are checked against the closed-form solution (x(T) is linear in
the initial state).

Run: `python experiments/fit_oscillator_target.py [--out DIR] [--quick]`
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

T, TARGET, TOLERANCE = 1.0, 1.0, 1e-3


def position(y):
    return y[0]


def run(out_dir="out/fit_oscillator_target", quick: bool = False) -> dict:
    out, plt = _output.prepare(out_dir)
    oscillator = models.HarmonicOscillator(omega=2.0, damping=0.1)
    options = dict(t0=0.0, solver=ds.RK4(), dt=0.001, noise=TOLERANCE)
    # (a) hit x = 1 at T: the initial velocity only
    hit = ds.fit(
        oscillator,
        jnp.array([0.0, 0.5]),
        (np.array([T]), np.array([TARGET])),
        params=[],
        initial_state=["v"],
        observe=position,
        **options,
    )
    # (b) arrive at rest at x = 1: both components, the whole final state observed
    rest = ds.fit(
        oscillator,
        jnp.array([0.0, 0.5]),
        (np.array([T]), np.array([[TARGET, 0.0]])),
        params=[],
        initial_state=True,
        **options,
    )
    print(hit.summary())
    print(rest.summary())
    # Closed form: the state at T is linear in y0, columns = responses to unit initial states.
    response = np.stack(
        [np.asarray(oscillator.analytic_solution(e, jnp.array([T])))[0] for e in np.eye(2)], 1
    )
    exact_hit = TARGET / response[0, 1]
    exact_rest = np.linalg.solve(response, np.array([TARGET, 0.0]))
    errors = dict(
        hit_v0=abs(hit.params["y0[v]"] - exact_hit),
        rest_x0=abs(rest.params["y0[x]"] - exact_rest[0]),
        rest_v0=abs(rest.params["y0[v]"] - exact_rest[1]),
    )
    print(f"against the closed form: {errors}")

    ts = np.linspace(0.0, T, 201)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for label, model_y0, style in (
        ("initial guess", jnp.array([0.0, 0.5]), ":"),
        ("(a) v0 fitted", hit.y0, "-"),
        ("(b) x0, v0 fitted: at rest", rest.y0, "--"),
    ):
        path = ds.simulate(oscillator, model_y0, ts, solver=ds.RK4(), dt=0.001)
        ax.plot(ts, path.ys[:, 0], style, label=label)
    ax.plot([T], [TARGET], "k*", ms=12, label="target")
    ax.set_xlabel("t (s)")
    ax.set_ylabel("x (m)")
    ax.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    files = ds.plot.save(fig, out, "fit_oscillator_target")
    plt.close(fig)
    record = dict(
        hit=dict(params=hit.params, exact_v0=float(exact_hit), iterations=hit.iterations),
        rest=dict(params=rest.params, exact=exact_rest.tolist(), iterations=rest.iterations),
        errors=errors,
        config=dict(
            omega=2.0,
            damping=0.1,
            T=T,
            target=TARGET,
            tolerance=TOLERANCE,
            guess_y0=[0.0, 0.5],
            solver="RK4",
            dt=0.001,
        ),
    )
    files.append(_output.summary(out, "fit_oscillator_target", record))
    return dict(record, files=files)


if __name__ == "__main__":
    _output.main(__file__, __doc__)
