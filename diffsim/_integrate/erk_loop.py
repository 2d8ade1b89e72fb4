"""A lean adaptive loop for explicit Runge–Kutta pairs (Tsit5, Dopri5, Dopri8, and any diffrax
ERK with a plain Butcher tableau): the solve `simulate` runs when an adaptive solve is not
differentiated and has no events.

It follows diffrax's `diffeqsolve` with a `PIDController` (integral control, its defaults) step
for step, given the same first step (`simulate` passes Hairer's, see `initial_step`): the error
norm (RMS of the error over
`atol + rtol·max(|y0|, |y1|)`), step factors (safety 0.9, within [0.2, 10], at most 0.9 after a
rejection), clipping of the last step to t1, and the method's own dense output at the save
times, so the two agree to round-off. What it leaves out is what `simulate` does not use
there: events, dense-output storage, progress meters, jumps, SDE terms and the machinery of
differentiation (differentiated solves go through diffrax, see `_adaptive_solve`). Under
`jax.vmap` this runs ~4x faster than diffrax (experiments/bench/lorenz.py, Lorenz, 2 CPU
cores).
"""

import diffrax
import jax
import jax.numpy as jnp
from jax import lax

from .._results import RESULTS


def supports(inner) -> bool:
    """Whether `inner` (a diffrax solver) can be stepped by this loop."""
    return isinstance(inner, diffrax.AbstractERK) and isinstance(
        getattr(inner, "tableau", None), diffrax.ButcherTableau
    )


def _rms(tree):
    leaves = [jnp.abs(x) ** 2 for x in jax.tree.leaves(tree)]
    total = sum(jnp.sum(x) for x in leaves)
    return jnp.sqrt(total / sum(x.size for x in leaves))


def _axpy(y, terms):
    """y + sum(coefficient * k) over (coefficient, k) pairs with non-zero coefficients."""
    terms = [(float(c), k) for c, k in terms if c != 0]
    if not terms:
        return y
    return jax.tree.map(
        lambda y, *ks: y + sum(c * k for (c, _), k in zip(terms, ks)), y, *(k for _, k in terms)
    )


def _scale(f, tree):
    return jax.tree.map(lambda x: f * x, tree)


def initial_step(inner, vector_field, t0, y0, rtol, atol):
    """The first step of an adaptive solve when none is given: Hairer's rule (Hairer, Nørsett &
    Wanner, Solving ODEs I, II.4), as diffrax's `_select_initial_step` writes it. (diffrax 0.7
    never applies that rule itself: it receives its terms wrapped, and starts every solve with
    0.01 whatever the time scale. `simulate` passes this step to diffrax as well, so that
    differentiated solves, which run in diffrax, take the same steps as the lean loop.)"""
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


def solve_erk(inner, vector_field, y0, ts, rtol, atol, dtmin, dt0, *, max_steps: int):
    """Solve dy/dt = vector_field(t, y) from y0 at ts[0], saving at every time in ts, with
    first step `dt0` (see `initial_step`).

    Returns a dict like `_adaptive_solve._diffeqsolve`: `ys` (rows not reached hold inf, as
    diffrax's), `code` (a `RESULTS` value), `accepted`, `rejected`."""
    tableau = inner.tableau
    error_order = inner.order(diffrax.ODETerm(vector_field))
    dtype = ts.dtype
    t0, t1 = ts[0], ts[-1]
    n = ts.shape[0]
    # diffrax rounds a step ending within 100 ULPs of t1 to end at t1 (it counts them down one
    # by one; here from the spacing above t1: the same but at a power of two, twice as wide)
    t1_floor = t1 - 100 * (jnp.nextafter(t1, jnp.array(jnp.inf, dtype)) - t1)

    f0 = vector_field(t0, y0)
    dt0 = jnp.asarray(dt0, dtype)
    if dtmin is not None:
        dt0 = jnp.maximum(dt0, dtmin)
    ys = jax.tree.map(lambda y: jnp.full((n,) + y.shape, jnp.inf, y.dtype).at[0].set(y), y0)

    def attempt(t, t_next, y, f_y):
        """One step of the pair: the new state, its error estimate, the stages (as increments
        h·f, for the dense output) and the vector field at the new state."""
        h = t_next - t
        ks = [_scale(h, f_y)]
        for c, a in zip(tableau.c, tableau.a_lower):
            y_stage = _axpy(y, zip(a, ks))
            ks.append(_scale(h, vector_field(t + float(c) * h, y_stage)))
        y1 = _axpy(y, zip(tableau.b_sol, ks))
        error = _axpy(jax.tree.map(jnp.zeros_like, y), zip(tableau.b_error, ks))
        # the last stage of an FSAL pair is the vector field at y1
        f_y1 = _scale(1 / h, ks[-1]) if tableau.fsal else vector_field(t_next, y1)
        return y1, error, ks, f_y1

    def step(state):
        t, t_next, y, f_y, ys, saved, accepted, rejected, code = state
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
        return (
            t_new,
            t_next_new,
            select(y1, y),
            select(f_y1, f_y),
            ys,
            saved,
            accepted + keep.astype(jnp.int32),
            rejected + (~keep).astype(jnp.int32),
            code,
        )

    def unfinished(state):
        t, *_, accepted, rejected, code = state
        return (t < t1) & (accepted + rejected < max_steps) & (code == RESULTS.successful)

    zero = jnp.array(0, jnp.int32)
    init = (
        t0,
        jnp.minimum(t0 + dt0, t1),
        y0,
        f0,
        ys,
        jnp.array(1, jnp.int32),
        zero,
        zero,
        jnp.array(RESULTS.successful, jnp.int32),
    )
    t, _, _, _, ys, _, accepted, rejected, code = lax.while_loop(unfinished, step, init)
    code = jnp.where((code == RESULTS.successful) & (t < t1), RESULTS.max_steps_reached, code)
    return dict(ys=ys, code=code.astype(jnp.int32), accepted=accepted, rejected=rejected)
