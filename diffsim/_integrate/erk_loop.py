"""The lean adaptive loop of the explicit Runge–Kutta pairs (Tsit5, Dopri5, Dopri8, and any
diffrax ERK with a plain Butcher tableau): the solve `simulate` runs for them, with and without
events, differentiated or not (forward mode through it, see `adaptive._jvp_by_jacobian` and
`adaptive_loop.run_any_order`).

Without events it follows diffrax's `diffeqsolve` with a `PIDController` (integral control, its
defaults) step for step, given the same first step (`simulate` passes Hairer's, see
`initial_step`): the error norm (RMS of the error over `atol + rtol·max(|y0|, |y1|)`), step
factors (safety 0.9, within [0.2, 10], at most 0.9 after a rejection), clipping of the last step
to t1, and the method's own dense output at the save times, so the two agree to round-off. With
events it finds the earliest crossing of any condition in an accepted step on that dense output
(diffrax takes the first condition in list order that changed sign). What it leaves out is
what `simulate` does not use there: dense-output storage, progress meters, jumps, SDE terms and
diffrax's adjoints (`loop_derivatives` gives its derivative rule). Under `jax.vmap` it runs
several times faster than diffrax's loop (docs/performance.md, "Lorenz ensemble, adaptive
Tsit5 under vmap").
"""

import diffrax
import jax
import jax.numpy as jnp

from .._solver.tableau import ButcherTableau, combine
from .adaptive_loop import Attempt, Method, run
from .step_control import Controls, scale_tree


class ExplicitPair(Method):
    """An explicit pair (a diffrax ERK with a Butcher tableau) as the adaptive loop steps it."""

    inner: diffrax.AbstractERK

    def stepper(self, model, y0):
        return _PairStepper(self.inner, model.vector_field)


# the degree + 1 of each pair's interpolant in θ (Tsit5's and Dopri5's are quartic, Dopri8's of
# degree 7); another diffrax ERK is sampled at 8 nodes, exact up to degree 7
_DENSE_NODES = {diffrax.Tsit5: 5, diffrax.Dopri5: 5, diffrax.Dopri8: 8}


class _PairStepper:
    def __init__(self, inner, vector_field):
        self.inner, self.vector_field = inner, vector_field
        self.tableau = ButcherTableau.from_diffrax(inner.tableau)
        self.error_order = inner.order(diffrax.ODETerm(vector_field))
        self.dense_nodes = _DENSE_NODES.get(type(inner), 8)

    def start(self, t, y):
        return self.vector_field(t, y)  # the first stage of the next attempt

    def attempt(self, t, h, y, f_y) -> Attempt:
        """One step of the pair: the new state, its error estimate, the dense output from the
        stages and the vector field at the new state."""
        tableau, vector_field = self.tableau, self.vector_field
        t_next = t + h
        # stages as increments combined with unit weight, y + Σ a·(h f), as diffrax combines
        # them (scaling the sum by h instead moves accept decisions that sit at round-off, in
        # float32 near its epsilon, off diffrax's)
        ks = [scale_tree(h, f_y)]
        for c, a in zip(tableau.c[1:], tableau.a):
            ks.append(scale_tree(h, vector_field(t + c * h, combine(y, 1, a, ks))))
        y1 = combine(y, 1, tableau.b, ks)
        error = combine(jax.tree.map(jnp.zeros_like, y), 1, tableau.b_error, ks)
        # the last stage of an FSAL pair is the vector field at y1
        f_y1 = scale_tree(1 / h, ks[-1]) if tableau.fsal else vector_field(t_next, y1)

        def evaluate(t_save):  # diffrax's interpolant of the method (built only when used)
            stages = jax.tree.map(lambda *k: jnp.stack(k), *ks)
            interpolation = self.inner.interpolation_cls(t0=t, t1=t_next, y0=y, y1=y1, k=stages)
            return interpolation.evaluate(t_save)

        return Attempt(y1, error, evaluate, f_y1)


def solve_erk(
    inner, vector_field, y0, ts, controls: Controls, *, max_steps: int, kind: str = "lax"
):
    """Solve dy/dt = vector_field(t, y) from y0 at ts[0] without events, saving at every time
    in ts, with the step-size `controls` (first step `controls.dt0`, see `initial_step`), the
    loop run as `kind` (`step_control.step_loop`).

    Returns (ys, code, accepted, rejected), the fields of `adaptive._Segment`: `ys` (rows not
    reached hold inf, as diffrax's), `code` (a `RESULTS` value) and the step counts."""
    stepper = _PairStepper(inner, vector_field)
    out = run(stepper, None, y0, ts, controls, None, max_steps=max_steps, kind=kind)
    return out.ys, out.code, out.accepted, out.rejected
