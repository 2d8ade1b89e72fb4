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

from typing import Any, NamedTuple

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
    scale: jax.Array  # D: 1 for the Levenberg steps, then a running maximum of the
    # Jacobian's column norms (`_scaling`)
    step: jax.Array  # iterations taken
    evaluations: jax.Array  # residual evaluations
    history: jax.Array  # (max_steps + 1,) the loss after each iteration
    done: jax.Array
    code: jax.Array
    first: jax.Array  # the first pass of the loop: it linearises at x0, takes no step
    aux: Any  # the residual function's auxiliary output at x (with `has_aux`), else None


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
    levenberg_steps=0,
    has_aux: bool = False,
    linearise=None,
) -> Optimum:
    """Minimise Σ residual_fn(x)² over lower ≤ x ≤ upper from x0 (inside the box; bounds may
    be ±inf). Traceable. Returns an `Optimum` whose `u` is the optimum x itself.

    With `has_aux`, `residual_fn(x)` returns (residuals, aux), aux any pytree of arrays, and
    the `Optimum`'s `aux` is its value at the optimum, taken from the pass that linearises
    there: what a caller needs at the optimum (`ds.fit`'s log-likelihood) without another
    copy of the residual function in its program.

    `refine(x, r, lower, upper) -> x`, where given, moves an accepted point (x, with residuals
    r) to one of no larger loss within the box before the next linearisation: `ds.Problem`
    sets its noise parameters there to their closed-form optimum (hierarchical optimisation,
    Loos et al. 2018). It is given this box, not the problem's bounds: a profile pins an
    unknown there, and what the refinement computes from it must use the pinned value.

    The first `levenberg_steps` iterations (an integer, which may be traced: one program for
    runs with and without) damp every unknown alike (D = 1, Levenberg's method), then
    MINPACK's scaling takes over, with a memory that fades (D the running maximum of the
    column norms and `_FORGETTING` × the last D, from the norms at the switch): for unknowns
    on one scale (log10 rates) isotropic damping keeps early steps to the nearest descent,
    where MINPACK's lets an insensitive unknown leap across its box (into another basin or a
    plateau); the scaled steps then converge fast, and the fading lets a rate that saturates
    reach its bound rather than creep there (`_scaling`).

    `linearise(x) -> (residuals, their Jacobian, aux)`, where given, takes the place of the
    forward-mode Jacobian of `residual_fn` (with `has_aux`): the same values, computed by a
    caller that knows a cheaper way (`study_fit._linearisation`)."""
    dtype = x0.dtype
    lower = jnp.asarray(lower, dtype)
    upper = jnp.asarray(upper, dtype)
    x0 = jnp.clip(x0, lower, upper)
    with_aux = residual_fn if has_aux else lambda x: (residual_fn(x), None)
    residuals_only = lambda x: with_aux(x)[0]  # noqa: E731
    r_shape, aux_shape = jax.eval_shape(with_aux, x0)
    m = r_shape.shape[0]

    # The residuals are evaluated at one place in the program and linearised at one other,
    # both in the loop's body: its first pass refines and linearises x0 (`first`), every
    # later one takes a step. Each copy is a pass through every simulation of the study, the
    # largest part of a compiled fit: a Jacobian for x0 before the loop (removed: the compile
    # of a fit of three pre-equilibrated experiments 7.7 → 5.6 s), then a residual evaluation
    # for the first refinement there and the caller's likelihood after the loop (now `aux`:
    # that fit's program 5.7–7.0 → 3.8–4.6 s, Boehm's 4.6–5.1 → 3.0–3.1 s to compile).
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
        aux=jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), aux_shape),
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
        r_trial = residuals_only(trial)
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
        else:
            refined = trial

        def relinearise(_):
            if linearise is not None:
                return linearise(refined)
            return _linearised(with_aux, refined)

        def keep(_):
            return r, jacobian, state.aux

        r_new, jacobian_new, aux_new = lax.cond(accept, relinearise, keep, None)
        x_new = jnp.where(accept, refined, x)
        loss_new = jnp.where(accept, jnp.sum(r_new**2), state.loss)
        after = state.step + 1  # iterations taken with this one (the first pass takes none: `step`)
        norms = jnp.sqrt(jnp.sum(jacobian_new**2, axis=0))
        scale = _scaling(norms, state.scale, after, levenberg_steps)
        scale0 = jnp.where(levenberg_steps > 0, 1.0, jnp.where(norms > 0, norms, 1.0))
        scale = jnp.where(first, scale0, scale)
        # converged: the step (accepted) below the tolerances in every unknown with a small
        # change of the loss, or a projected gradient at round-off; or a damping so large that
        # no step the iterate can resolve is left, which is judged after the loop (`_settled`)
        small_step = jnp.all(jnp.abs(moved) <= atol + rtol * jnp.abs(x))
        small_change = jnp.abs(actual) <= atol + rtol * state.loss
        stationary = jnp.max(jnp.abs(projected)) <= atol * (1.0 + state.loss)
        stuck = damping > 1e16
        newton, gain = _gauss_newton(r, jacobian, free)
        # a rejected step below the tolerances whose undamped Gauss–Newton step is below them
        # too: the optimum to the objective's round-off (the loss changes by 0 there and the
        # step fails); without this the damping was raised ~12 times until `stuck` (a decay
        # measured at 8 times: 5 iterations at dose 1, 16 at dose 8, the same landscape)
        resolved = small_step & ~accept & jnp.all(jnp.abs(newton) <= atol + rtol * jnp.abs(x))
        # an accepted step that changed the loss by at most rtol of it, where the undamped
        # Gauss–Newton step predicts a decrease of at most `_FLAT` × rtol of it (the Newton
        # decrement's test, JᵀJ for the Hessian): the unknowns the data barely fix would still
        # creep, at steps above rtol of their values, for no gain in the likelihood.
        flat = (
            accept
            & small_change
            & (gain <= _FLAT * rtol * state.loss)
            & (state.step >= levenberg_steps)
        )
        # the loss changed by at most rtol of itself a step, on average over the last
        # `_CREEP_WINDOW` iterations (all after the Levenberg steps): the unknowns creep along a
        # direction the data barely fix, and the rest of max_steps could lower the loss by at
        # most max_steps × rtol of it at that pace (`_CREEP_WINDOW`)
        earlier = state.history[jnp.maximum(after - _CREEP_WINDOW, 0)]
        creeping = (
            accept
            & (after >= levenberg_steps + _CREEP_WINDOW)
            & (earlier - loss_new <= _CREEP_WINDOW * rtol * loss_new)
        )
        converged = (
            (accept & small_step & small_change) | stationary | resolved | flat | creeping
        ) & ~first
        finite = jnp.all(jnp.isfinite(x_new)) & jnp.isfinite(loss_new)
        finite = jnp.where(first, finite & jnp.all(jnp.isfinite(jacobian_new)), finite)
        ending = jnp.where(converged | first, FIT_RESULTS.converged, FIT_RESULTS.stalled)
        step = jnp.where(first, 0, after)
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
            aux=aux_new,
        )

    final = lax.while_loop(cond, body, init)
    stalled = final.done & (final.code == FIT_RESULTS.stalled)
    settled = _settled(final, lower, upper, rtol)
    code = jnp.where(stalled & settled, FIT_RESULTS.converged, final.code)
    code = jnp.where(final.done, code, FIT_RESULTS.max_iterations_reached)
    return Optimum(
        final.x,
        final.loss,
        final.history,
        final.step,
        final.evaluations,
        code,
        final.aux,
        final.r,
        final.jacobian,
    )


# How far below rtol × the loss the Gauss–Newton step's predicted decrease must be to end a fit
# at an accepted step that changed the loss by less than rtol of it. The GN step in units of
# the standard errors (s² = loss/dof) is then at most √(_FLAT · rtol · dof): ~1e-5 of them.
# Measured on the benchmark's 20 seeded uniform starts (seed 0), every start ending at the same
# llh as without the test: iterations Boehm 1,701 → 1,370 (its two starts creeping to −171.19:
# 310 → 250, 295 → 230), Bruno 1,764 → 1,611. At 1 (the decrease below rtol × the loss): 1,080
# and 1,551, but a conjugate-normal fit's mode 2.5e-7 from the closed form (1e-7 asked) and one
# Bruno start stopped at llh −2,780 during the Levenberg steps (after them: −354.9, as without
# the test; so not during them); at 1e-8: no fewer iterations.
_FLAT = 1e-4

# The iterations over which `creeping` averages the loss's change. On the 20 seeded uniform
# starts (seed 0) of the shipped PEtab problems, against no such test: Boehm 1,393 → 1,210
# iterations (its two starts creeping to llh −171.19 end after 173 and 141 instead of 232 and
# 265, their loss within 1e-4 of its end after ~150), Crauste 5,405 → 2,548 (nine starts at
# the 512 limit → two); every start ends within 0.003 of the same llh. At 25: Bruno 1,555
# both (so at 50 too: a 50-iteration creep holds a 25-iteration one), Crauste 1,533, but a
# start that rests on a plateau (llh −310.6) for 25 iterations before it falls to −291.73
# ended there.
_CREEP_WINDOW = 50

# After the Levenberg steps (every unknown on a log scale), D forgets: a rate that saturates
# (its column shrinks as it heads for a bound of its ten-decade box) was held back by
# MINPACK's running maximum, damped as it was when it mattered, and crept: a Boehm start took
# 512 iterations, its llh changing by 1e-3 over the last 400. Measured on seeded uniform
# starts (docs/performance.md): Boehm 17/60 at the optimum in 75 s of fits against 16/60 in
# 147 s; Bruno 12/20 against 11/20 at the same time; Crauste the same best; the current norms
# alone (no memory) took Crauste's fits 2.8x as long and Elowitz's best further away.
_FORGETTING = 0.9


def _scaling(norms, previous, step, levenberg_steps):
    """D after iteration `step`. Without Levenberg steps (`levenberg_steps` 0, an int or a
    traced one), MINPACK's: the running maximum of the Jacobian's column norms (a column of
    zeros keeps 1 until it has one). With them: 1 during those steps, then the running
    maximum of the norms and `_FORGETTING` × the last D (from the norms at the switch)."""
    running = jnp.maximum(previous, norms)
    first = jnp.where(norms > 0, norms, 1.0)
    forgetting = jnp.maximum(_FORGETTING * previous, norms)
    levenberg = jnp.where(
        step < levenberg_steps, 1.0, jnp.where(step == levenberg_steps, first, forgetting)
    )
    return jnp.where(levenberg_steps > 0, levenberg, running)


def _settled(state: _State, lower, upper, rtol):
    """Whether an iterate where no step lowers the loss is an optimum to the objective's own
    round-off: the Gauss–Newton step of its free unknowns predicts a decrease of at most
    √rtol of the loss (a fraction of ‖r‖², unchanged by the units of the unknowns or the
    data). Otherwise the derivatives disagree with the objective there (`stalled`): Fujita's
    random starts stopped so at llh -8000, with gradients along which the llh rose by 15 a
    tenth of a decade, and were reported converged."""
    gradient = state.jacobian.T @ state.r
    held = ((state.x <= lower) & (gradient > 0)) | ((state.x >= upper) & (gradient < 0))
    _, explained = _gauss_newton(state.r, state.jacobian, ~held)
    return explained <= jnp.sqrt(rtol) * state.loss


def _gauss_newton(r, jacobian, free):
    """The undamped Gauss–Newton step of the free unknowns (least norm where the Jacobian is
    rank-deficient; 0 on the others) and the decrease of Σ r² its linear model predicts,
    ‖J δ‖²."""
    columns = jnp.where(free[None, :], jacobian, 0.0)
    step = jnp.linalg.lstsq(columns, -r)[0]
    return step, jnp.sum((columns @ step) ** 2)


def _linearised(with_aux, x):
    """(residuals, their Jacobian, aux) at x by one forward-mode pass; `with_aux(x)` returns
    (residuals, aux)."""

    def both(x):
        r, aux = with_aux(x)
        return r, (r, aux)

    jacobian, (r, aux) = jax.jacfwd(both, has_aux=True)(x)
    return r, jacobian, aux


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
