"""Levenberg–Marquardt within bounds: the projected, active-set variant (Kanzow, Yamashita and
Fukushima, *J. Comput. Appl. Math.* 172 (2004)) with MINPACK's scaling of the unknowns and
Nielsen's damping update, for the unknowns of a `ds.Problem` on their own scales.

Why by hand: optimistix and optax have no bounded least-squares method, and the alternative,
a logistic map from unbounded coordinates onto each box, flattens the objective near the
bounds: an unknown whose optimum lies at or near a bound (Boehm's k_exp_hetero at 1e-5) is
then reached only through vanishing gradients, and from random starts in the PEtab benchmark
problems the fits ended in plateaus (measured in experiments/bench/studies.py). Here a step
is the damped Gauss–Newton step of the unknowns that are not held at a bound by the gradient,
projected onto the box; scipy's `least_squares(method="trf")` and Fides (pyPESTO) are
trust-region relatives of it.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import lineax as lx
from jax import lax

from .optimize import FIT_RESULTS, Optimum


class _State(NamedTuple):
    x: jax.Array  # the current point, inside the box
    r: jax.Array  # residuals there
    jacobian: jax.Array  # (residuals, unknowns) there
    loss: jax.Array  # Σ r²
    damping: jax.Array  # λ, relative to the scaling D²
    growth: jax.Array  # ν of Nielsen's update: how fast λ grows after a rejected step
    scale: jax.Array  # D: 1 for the Levenberg steps, then the running maximum of the
    # Jacobian's column norms
    step: jax.Array  # iterations taken
    evaluations: jax.Array  # residual evaluations
    history: jax.Array  # (max_steps + 1,) the loss after each iteration
    done: jax.Array
    code: jax.Array
    first: jax.Array  # the first pass of the loop: it linearises at x0, takes no step


def minimize(
    residual_fn,
    x0,
    lower,
    upper,
    *,
    max_steps: int,
    rtol: float,
    atol: float,
    refine=None,
    levenberg_steps: int = 0,
) -> Optimum:
    """Minimise Σ residual_fn(x)² over lower ≤ x ≤ upper from x0 (inside the box; bounds may
    be ±inf). Traceable. Returns an `Optimum` whose `u` is the optimum x itself.

    `refine(x, r, lower, upper) -> x`, where given, moves an accepted point (x, with residuals
    r) to one of no larger loss within the box before the next linearisation: `ds.Problem`
    sets its noise parameters there to their closed-form optimum (hierarchical optimisation,
    Loos et al. 2018). It is given this box, not the problem's bounds: a profile pins an
    unknown there, and what the refinement computes from it must use the pinned value.

    The first `levenberg_steps` iterations damp every unknown alike (D = 1, Levenberg's
    method), then MINPACK's scaling takes over (D the running maximum of the column norms,
    from the norms at the switch): for unknowns on one scale (log10 rates) isotropic damping
    keeps early steps to the nearest descent, where MINPACK's lets an insensitive unknown
    leap across its box (into another basin or a plateau); MINPACK's then converges fast."""
    dtype = x0.dtype
    lower = jnp.asarray(lower, dtype)
    upper = jnp.asarray(upper, dtype)
    x0 = jnp.clip(x0, lower, upper)
    if refine is not None:
        r0 = residual_fn(x0)
        x0 = jnp.clip(refine(x0, r0, lower, upper), lower, upper)
        m = r0.shape[0]
    else:
        m = jax.eval_shape(residual_fn, x0).shape[0]

    # The residuals and their Jacobian are computed at one place in the program, the end of
    # the loop's body: its first pass only linearises at x0 (`first`), every later one takes
    # a step. A Jacobian is a forward-mode pass through every simulation of the study, the
    # largest part of the compiled fit; a second copy for x0 before the loop doubled it
    # (measured: the compile of a fit of three pre-equilibrated experiments 7.7 → 5.6 s).
    n = x0.shape[0]
    zero = jnp.zeros((), dtype)
    init = _State(
        x=x0,
        r=jnp.zeros(m, dtype),
        jacobian=jnp.zeros((m, n), dtype),
        loss=zero,
        damping=jnp.asarray(1e-3, dtype),
        growth=jnp.asarray(2.0, dtype),
        scale=jnp.ones(n, dtype),
        step=jnp.array(0),
        evaluations=jnp.array(0),
        history=jnp.full(max_steps + 1, jnp.nan, dtype),
        done=jnp.array(False),
        code=jnp.array(FIT_RESULTS.converged),
        first=jnp.array(True),
    )

    def cond(state: _State):
        return state.first | (~state.done & (state.step < max_steps))

    def body(state: _State) -> _State:
        first = state.first
        x, r, jacobian = state.x, state.r, state.jacobian
        gradient = jacobian.T @ r
        at_lower = (x <= lower) & (gradient > 0)
        at_upper = (x >= upper) & (gradient < 0)
        free = ~(at_lower | at_upper)
        projected = jnp.where(free, gradient, 0.0)
        delta = _damped_step(jacobian, r, free, state.damping, state.scale)
        trial = jnp.where(first, x, jnp.clip(x + delta, lower, upper))
        moved = trial - x
        r_trial = residual_fn(trial)
        loss_trial = jnp.sum(r_trial**2)
        predicted = state.loss - jnp.sum((r + jacobian @ moved) ** 2)
        actual = state.loss - loss_trial
        ratio = jnp.where(predicted > 0, actual / jnp.where(predicted > 0, predicted, 1.0), -1.0)
        accept = first | (jnp.isfinite(loss_trial) & (ratio > 1e-4))
        # Nielsen (1999): shrink λ by up to 3 on a good step, double it (and its growth) on a
        # rejected one
        shrink = jnp.maximum(1.0 / 3.0, 1.0 - (2.0 * ratio - 1.0) ** 3)
        damping = jnp.where(accept, state.damping * shrink, state.damping * state.growth)
        damping = jnp.where(first, state.damping, damping)
        growth = jnp.where(accept, 2.0, state.growth * 2.0)

        if refine is not None:
            refined = jnp.clip(refine(trial, r_trial, lower, upper), lower, upper)
            # the refinement must not cost a rejected step its nonfinite test
            refined = jnp.where(jnp.all(jnp.isfinite(refined)), refined, trial)
            refined = jnp.where(first, trial, refined)  # x0 was refined before the loop
        else:
            refined = trial

        def relinearise(_):
            return _linearised(residual_fn, refined)

        r_new, jacobian_new = lax.cond(accept, relinearise, lambda _: (r, jacobian), None)
        x_new = jnp.where(accept, refined, x)
        loss_new = jnp.where(accept, jnp.sum(r_new**2), state.loss)
        norms = jnp.sqrt(jnp.sum(jacobian_new**2, axis=0))
        scale = _scaling(norms, state.scale, state.step + 1, levenberg_steps)
        scale0 = jnp.ones_like(norms) if levenberg_steps else jnp.where(norms > 0, norms, 1.0)
        scale = jnp.where(first, scale0, scale)
        # converged: the step (accepted) below the tolerances in every unknown with a small
        # change of the loss, or a projected gradient at round-off; or a damping so large that
        # no step the iterate can resolve is left, which is judged after the loop (`_settled`)
        small_step = jnp.all(jnp.abs(moved) <= atol + rtol * jnp.abs(x))
        small_change = jnp.abs(actual) <= atol + rtol * state.loss
        stationary = jnp.max(jnp.abs(projected)) <= atol * (1.0 + state.loss)
        stuck = damping > 1e16
        # a rejected step below the tolerances whose undamped Gauss–Newton step is below them
        # too: the optimum to the objective's round-off (the loss changes by 0 there and the
        # step fails); without this the damping was raised ~12 times until `stuck` (a decay
        # measured at 8 times: 5 iterations at dose 1, 16 at dose 8, the same landscape)
        resolved = small_step & ~accept & _gauss_newton_step_small(x, r, jacobian, free, rtol, atol)
        converged = ((accept & small_step & small_change) | stationary | resolved) & ~first
        finite = jnp.all(jnp.isfinite(x_new)) & jnp.isfinite(loss_new)
        finite = jnp.where(first, finite & jnp.all(jnp.isfinite(jacobian_new)), finite)
        ending = jnp.where(converged | first, FIT_RESULTS.converged, FIT_RESULTS.stalled)
        step = jnp.where(first, 0, state.step + 1)
        return _State(
            x=x_new,
            r=r_new,
            jacobian=jacobian_new,
            loss=loss_new,
            damping=damping,
            growth=growth,
            scale=scale,
            step=step,
            evaluations=state.evaluations + 1,
            history=state.history.at[step].set(loss_new),
            done=converged | (stuck & ~first) | ~finite,
            code=jnp.where(finite, ending, FIT_RESULTS.nonfinite_iterate),
            first=jnp.array(False),
        )

    final = lax.while_loop(cond, body, init)
    stalled = final.done & (final.code == FIT_RESULTS.stalled)
    settled = _settled(final, lower, upper, rtol)
    code = jnp.where(stalled & settled, FIT_RESULTS.converged, final.code)
    code = jnp.where(final.done, code, FIT_RESULTS.max_iterations_reached)
    return Optimum(final.x, final.loss, final.history, final.step, final.evaluations, code)


def _scaling(norms, previous, step, levenberg_steps: int):
    """D after iteration `step`: 1 during the Levenberg steps, then the running maximum of
    the Jacobian's column norms (a column of zeros keeps 1 until it has one)."""
    running = jnp.maximum(previous, norms)
    if not levenberg_steps:
        return running
    first = jnp.where(norms > 0, norms, 1.0)
    return jnp.where(
        step < levenberg_steps, 1.0, jnp.where(step == levenberg_steps, first, running)
    )


def _settled(state: _State, lower, upper, rtol):
    """Whether an iterate where no step lowers the loss is an optimum to the objective's own
    round-off: the Gauss–Newton step of its free unknowns predicts a decrease of at most
    √rtol of the loss (a fraction of ‖r‖², unchanged by the units of the unknowns or the
    data). Otherwise the derivatives disagree with the objective there (`stalled`): Fujita's
    random starts stopped so at llh -8000, with gradients along which the llh rose by 15 a
    tenth of a decade, and were reported converged."""
    gradient = state.jacobian.T @ state.r
    held = ((state.x <= lower) & (gradient > 0)) | ((state.x >= upper) & (gradient < 0))
    columns = jnp.where(held[None, :], 0.0, state.jacobian)
    step = jnp.linalg.lstsq(columns, -state.r)[0]
    explained = jnp.sum((columns @ step) ** 2)
    return explained <= jnp.sqrt(rtol) * state.loss


def _gauss_newton_step_small(x, r, jacobian, free, rtol, atol):
    """Whether the undamped Gauss–Newton step of the free unknowns (least norm where the
    Jacobian is rank-deficient) is within atol + rtol·|x| in every unknown."""
    columns = jnp.where(free[None, :], jacobian, 0.0)
    step = jnp.linalg.lstsq(columns, -r)[0]
    return jnp.all(jnp.abs(step) <= atol + rtol * jnp.abs(x))


def _linearised(residual_fn, x):
    """(residuals, their Jacobian) at x by one forward-mode pass."""

    def both(x):
        r = residual_fn(x)
        return r, r

    jacobian, r = jax.jacfwd(both, has_aux=True)(x)
    return r, jacobian


# MINPACK's scaling D (each unknown's largest Jacobian column norm so far) leaves an unknown
# the data barely see (a column 1e-15 of the largest: a rate whose reaction has not started)
# undamped at any λ: its step, g/(λ D²), crossed the whole box (14 decades) and every trial
# failed (Fujita's random starts). D is floored at this fraction of the largest free column's,
# a column below it being zero to working precision. Measured on Fujita from 4 uniform
# starts: without the floor none moved past llh -8000; with it one reached 53.23 (the
# best known 53.08); Boehm's success from 50 starts unchanged within its spread.
_SCALE_FLOOR = 1e-8


def _damped_step(jacobian, r, free, damping, scale):
    """argmin ‖J δ + r‖² + λ ‖D δ‖² over δ with δ = 0 on the unknowns held at a bound: QR of
    [J; √λ D] with the held columns zeroed (their δ is then 0 by the damping row); D floored
    at `_SCALE_FLOOR` of its largest free entry."""
    held = jnp.where(free[None, :], jacobian, 0.0)
    scale = jnp.maximum(scale, _SCALE_FLOOR * jnp.max(jnp.where(free, scale, 0.0)))
    stacked = jnp.concatenate([held, jnp.diag(jnp.sqrt(damping) * scale)])
    target = jnp.concatenate([r, jnp.zeros_like(scale)])
    solution = lx.linear_solve(lx.MatrixLinearOperator(stacked), target, lx.QR(), throw=False)
    return jnp.where(free, -solution.value, 0.0)
