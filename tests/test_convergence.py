"""Measured order of accuracy of every fixed-step solver on a problem with a known solution."""

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import FIXED_STEP_SOLVERS, solver_id

import diffsim as ds
import models


def _final_error(solver, steps: int) -> float:
    # Undamped oscillator (no velocity term, so symplectic methods apply), omega = 2: a few
    # oscillations over t in [0, 2], enough for the global error to reach its asymptotic form.
    model = models.HarmonicOscillator(omega=2.0)
    y0 = jnp.array([1.0, 0.5])
    ts = jnp.array([0.0, 2.0])
    sol = ds.simulate(model, y0, ts, solver=solver, steps_per_save=steps)
    exact = model.analytic_solution(y0, ts)
    return float(jnp.max(jnp.abs(sol.ys[-1] - exact[-1])))


@pytest.mark.parametrize("solver", FIXED_STEP_SOLVERS, ids=solver_id)
def test_convergence_order(solver):
    # Step counts in the asymptotic regime of each method, with errors far above float64
    # round-off (the smallest error measured here is ~1e-9 for the fourth-order methods).
    steps = [64, 128, 256, 512] if solver.order <= 2 else [32, 64, 128, 256]
    errors = [_final_error(solver, n) for n in steps]
    sizes = [2.0 / n for n in steps]
    slope = np.polyfit(np.log(sizes), np.log(errors), 1)[0]
    # The criterion: the least-squares log-log slope within +-0.2 of the stated order.
    assert abs(slope - solver.order) <= 0.2, (solver_id(solver), slope, errors)
