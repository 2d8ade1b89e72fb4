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
from jax import lax
from jaxtyping import Array, PyTree

from .._results import RESULTS
from .._solver.tableau import ButcherTableau, combine


def supports(inner) -> bool:
    """Whether `inner` (a diffrax solver) can be stepped by this loop."""
    return isinstance(inner, diffrax.AbstractERK) and isinstance(
        getattr(inner, "tableau", None), diffrax.ButcherTableau
    )


def _rms(tree):
    leaves = [jnp.abs(x) ** 2 for x in jax.tree.leaves(tree)]
    total = sum(jnp.sum(x) for x in leaves)
    return jnp.sqrt(total / sum(x.size for x in leaves))


def _scale(f, tree):
    return jax.tree.map(lambda x: f * x, tree)


def initial_step(inner, vector_field, t0, y0, rtol, atol):
    """The first step of an adaptive solve when none is given: Hairer's rule (Hairer, Nørsett &
    Wanner, Solving ODEs I, II.4), as diffrax's `_select_initial_step` writes it. (diffrax 0.7
    never applies that rule itself: it receives its terms wrapped, and starts every solve with
    0.01 whatever the time scale. `simulate` passes this step to diffrax as well, so that
    solves that run in diffrax take the same steps as the lean loop.)"""
    error_order = inner.order(diffrax.ODETerm(vector_field))
    f0 = vector_field(t0, y0)
    scale = jax.tree.map(lambda y: atol + jnp.abs(y) * rtol, y0)
    ratio = lambda a: jax.tree.map(lambda x, s: x / s, a, scale)  # noqa: E731
    d0, d1 = _rms(ratio(y0)), _rms(ratio(f0))
    small = (d0 < 1e-5) | (d1 < 1e-5)
    h0 = jnp.where(small, 1e-6, 0.01 * (d0 / jnp.where(small, 1, d1)))
    f1 = vector_field(t0 + h0, jax.tree.map(lambda y, k: y + h0 * k, y0, f0))
    d2 = _rms(ratio(jax.tree.map(lambda a, b: a - b, f1, f0))) / h0
    max_d = jnp.maximum(d1, d2)
    h1 = jnp.where(
        max_d <= 1e-15, jnp.maximum(1e-6, h0 * 1e-3), (0.01 / max_d) ** (1 / error_order)
    )
    return lax.stop_gradient(jnp.minimum(100 * h0, h1).astype(jnp.result_type(t0)))


class Controls(NamedTuple):
    """The step-size controller's settings, traced (new ones do not recompile)."""

    rtol: Array
    atol: Array  # a scalar, or one tolerance per component of an array state
    dtmin: Array | None  # the solve stops with step_size_collapsed below it
    dt0: Array  # the first step


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
    n = ts.shape[0]
    # diffrax rounds a step ending within 100 ULPs of t1 to end at t1 (it counts them down one
    # by one; here from the spacing above t1: the same but at a power of two, twice as wide)
    t1_fixed = lax.stop_gradient(t1)  # the spacing is a constant (nextafter has no derivative)
    t1_floor = t1 - 100 * (jnp.nextafter(t1_fixed, jnp.array(jnp.inf, dtype)) - t1_fixed)

    rtol, atol, dtmin = controls.rtol, controls.atol, controls.dtmin
    f0 = vector_field(t0, y0)
    dt0 = jnp.asarray(controls.dt0, dtype)
    if dtmin is not None:
        dt0 = jnp.maximum(dt0, dtmin)
    ys = jax.tree.map(lambda y: jnp.full((n,) + y.shape, jnp.inf, y.dtype).at[0].set(y), y0)

    def attempt(t, t_next, y, f_y):
        """One step of the pair: the new state, its error estimate, the stages (as increments
        h·f, the form diffrax's dense output takes) and the vector field at the new state."""
        h = t_next - t
        # stages as increments combined with unit weight, y + Σ a·(h f), as diffrax combines
        # them (scaling the sum by h instead moves accept decisions that sit at round-off, in
        # float32 near its epsilon, off diffrax's)
        ks = [_scale(h, f_y)]
        for c, a in zip(tableau.c[1:], tableau.a):
            ks.append(_scale(h, vector_field(t + c * h, combine(y, 1, a, ks))))
        y1 = combine(y, 1, tableau.b, ks)
        error = combine(jax.tree.map(jnp.zeros_like, y), 1, tableau.b_error, ks)
        # the last stage of an FSAL pair is the vector field at y1
        f_y1 = _scale(1 / h, ks[-1]) if tableau.fsal else vector_field(t_next, y1)
        return y1, error, ks, f_y1

    def step(state: _State) -> _State:
        t, t_next, y, f_y = state.t, state.t_next, state.y, state.f_y
        ys, saved, code = state.ys, state.saved, state.code
        y1, error, ks, f_y1 = attempt(t, t_next, y, f_y)
        error = jax.tree.map(lambda e: jnp.where(jnp.isnan(e), jnp.inf, e), error)

        def scaled(y, y1, e):
            y1 = jnp.where(jnp.isnan(y1).any(), y, y1)
            return e / (atol + jnp.maximum(jnp.abs(y), jnp.abs(y1)) * rtol)

        scaled_error = _rms(jax.tree.map(scaled, y, y1, error))
        keep = scaled_error < 1
        factor = jnp.clip(
            0.9 * (1 / scaled_error) ** (1 / error_order),
            jnp.where(keep, 1.0, 0.2),
            jnp.where(keep, 10.0, 0.9),
        )
        dt = lax.stop_gradient((t_next - t) * factor.astype(dtype))
        if dtmin is not None:
            code = jnp.where(dt < dtmin, RESULTS.step_size_collapsed, code)
            dt = jnp.maximum(dt, dtmin)

        if n == 2:  # only the final state is wanted: no save loop to run or compile
            done = keep & (t_next >= t1)
            ys = jax.tree.map(lambda buf, y: buf.at[1].set(jnp.where(done, y, buf[1])), ys, y1)
        else:
            stages = jax.tree.map(lambda *k: jnp.stack(k), *ks)
            dense = inner.interpolation_cls(t0=t, t1=t_next, y0=y, y1=y1, k=stages)

            def save_more(carry):
                index, _ = carry
                return keep & (index < n) & (ts[jnp.minimum(index, n - 1)] <= t_next)

            def save(carry):
                index, ys = carry
                t_save = ts[index]
                value = dense.evaluate(t_save)
                value = jax.tree.map(lambda a, b: jnp.where(t_save == t_next, a, b), y1, value)
                return index + 1, jax.tree.map(lambda buf, v: buf.at[index].set(v), ys, value)

            saved, ys = lax.while_loop(save_more, save, (saved, ys))

        t_new = jnp.where(keep, t_next, t)
        t_next_new = t_new + dt
        t_next_new = jnp.where(
            t_next_new > t1_floor, jnp.where(keep, t1, t_new + 0.5 * (t1 - t_new)), t_next_new
        )
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

    def unfinished(state: _State):
        return (
            (state.t < t1)
            & (state.accepted + state.rejected < max_steps)
            & (state.code == RESULTS.successful)
        )

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
    final = lax.while_loop(unfinished, step, init)
    unfinished_run = (final.code == RESULTS.successful) & (final.t < t1)
    code = jnp.where(unfinished_run, RESULTS.max_steps_reached, final.code).astype(jnp.int32)
    return final.ys, code, final.accepted, final.rejected
