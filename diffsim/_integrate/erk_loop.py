"""A lean adaptive loop for explicit Runge–Kutta pairs (Tsit5, Dopri5, Dopri8, and any diffrax
ERK with a plain Butcher tableau): the solve `simulate` runs when an adaptive solve has no
events, differentiated or not (forward mode through it, see `adaptive._jvp_by_jacobian`).

It follows diffrax's `diffeqsolve` with a `PIDController` (integral control, its defaults) step
for step, given the same first step (`simulate` passes Hairer's, see `initial_step`): the error
norm (RMS of the error over
`atol + rtol·max(|y0|, |y1|)`), step factors (safety 0.9, within [0.2, 10], at most 0.9 after a
rejection), clipping of the last step to t1, and the method's own dense output at the save
times, so the two agree to round-off. What it leaves out is what `simulate` does not use
there: events, dense-output storage, progress meters, jumps, SDE terms and the checkpointed loop of
reverse mode (reverse mode is the transpose of its forward-mode Jacobian). Under `jax.vmap`
it runs several times faster than diffrax's loop (docs/performance.md, "Lorenz ensemble,
adaptive Tsit5 under vmap").
"""

from typing import NamedTuple

import diffrax
import jax
import jax.numpy as jnp
from jaxtyping import Array, PyTree

from .._results import RESULTS
from .._solver.tableau import ButcherTableau, combine
from .step_control import (
    advance_time,
    Controls,
    empty_outputs,
    end_floor,
    error_ratio,
    final_code,
    first_step,
    next_step,
    save_dense,
    scale_tree,
    step_loop,
    unfinished,
)


def supports(inner) -> bool:
    """Whether `inner` (a diffrax solver) can be stepped by this loop."""
    return isinstance(inner, diffrax.AbstractERK) and isinstance(
        getattr(inner, "tableau", None), diffrax.ButcherTableau
    )


class _State(NamedTuple):
    """The carry of the lean adaptive loop."""

    t: Array  # the time reached (the start of the next attempt)
    t_next: Array  # where the next attempt ends
    y: PyTree  # the state at t
    f_y: PyTree  # the vector field at (t, y): the first stage of the next attempt
    ys: PyTree  # the output buffer (times,) + state shape; inf where not reached
    saved: Array  # int32: the number of output rows written
    accepted: Array  # int32
    rejected: Array  # int32
    code: Array  # int32 RESULTS code (step_size_collapsed below dtmin)


def solve_erk(inner, vector_field, y0, ts, controls: Controls, *, max_steps: int):
    """Solve dy/dt = vector_field(t, y) from y0 at ts[0], saving at every time in ts, with
    the step-size `controls` (first step `controls.dt0`, see `initial_step`).

    Returns (ys, code, accepted, rejected), the fields of `adaptive._Segment`: `ys` (rows not
    reached hold inf, as diffrax's), `code` (a `RESULTS` value) and the step counts."""
    tableau = ButcherTableau.from_diffrax(inner.tableau)
    error_order = inner.order(diffrax.ODETerm(vector_field))
    dtype = ts.dtype
    t0, t1 = ts[0], ts[-1]
    t1_floor = end_floor(t1)
    f0 = vector_field(t0, y0)
    dt0 = first_step(controls, dtype)
    ys = empty_outputs(y0, ts.shape[0])

    def attempt(t, t_next, y, f_y):
        """One step of the pair: the new state, its error estimate, the stages (as increments
        h·f, the form diffrax's dense output takes) and the vector field at the new state."""
        h = t_next - t
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
        return y1, error, ks, f_y1

    def step(state: _State) -> _State:
        t, t_next, y, f_y = state.t, state.t_next, state.y, state.f_y
        ys, saved, code = state.ys, state.saved, state.code
        y1, error, ks, f_y1 = attempt(t, t_next, y, f_y)
        ratio = error_ratio(y, y1, error, controls)
        keep, dt, code = next_step(t, t_next, ratio, error_order, controls, code)
        if ts.shape[0] == 2:
            evaluate = None  # only the final state is saved
        else:
            stages = jax.tree.map(lambda *k: jnp.stack(k), *ks)
            evaluate = inner.interpolation_cls(t0=t, t1=t_next, y0=y, y1=y1, k=stages).evaluate
        saved, ys = save_dense(ts, keep, t_next, y1, saved, ys, evaluate)
        t_new, t_next_new = advance_time(keep, t, t_next, dt, t1, t1_floor)
        select = lambda a, b: jax.tree.map(lambda a, b: jnp.where(keep, a, b), a, b)  # noqa: E731
        return _State(
            t=t_new,
            t_next=t_next_new,
            y=select(y1, y),
            f_y=select(f_y1, f_y),
            ys=ys,
            saved=saved,
            accepted=state.accepted + keep.astype(jnp.int32),
            rejected=state.rejected + (~keep).astype(jnp.int32),
            code=code,
        )

    def going(state: _State):
        steps = state.accepted + state.rejected
        return unfinished(state.t, t1, steps, max_steps, state.code)

    zero = jnp.array(0, jnp.int32)
    init = _State(
        t=t0,
        t_next=jnp.minimum(t0 + dt0, t1),
        y=y0,
        f_y=f0,
        ys=ys,
        saved=jnp.array(1, jnp.int32),
        accepted=zero,
        rejected=zero,
        code=jnp.array(RESULTS.successful, jnp.int32),
    )
    final = step_loop(going, step, init, buffers=lambda state: state.ys)
    return final.ys, final_code(final.t, t1, final.code), final.accepted, final.rejected
