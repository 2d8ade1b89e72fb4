"""`ds.steady_state`: the equilibrium a model comes to rest at, f(y*) = 0.

By default the trajectory from y0 is integrated until the vector field vanishes (a terminal
event on its size), and the state there is polished by Newton's method on f(y) = 0; with
`method="newton"` Newton starts from y0 itself (fast, but it may find an equilibrium the
trajectory from y0 never reaches, an unstable one). Systems-biology fitters start from the
steady state of the model's pre-stimulus condition this way (AMICI, PEtab's pre-equilibration).

Derivatives by the implicit function theorem (dy*/dθ = −J⁻¹ ∂f/∂θ, in every mode, second
order included), never through the search; where the model conserves totals (J singular) the
equilibrium also depends on y0 through them, and the rule accounts for it.
"""

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
import optimistix as optx
from jax import lax
from jax.flatten_util import ravel_pytree
from jaxtyping import Array, PyTree

from .._compile import jit
from .._events import Event, RateCondition
from .._model import AbstractDDE, check_model
from .._results import RESULTS, SimulationError
from .._solver.adaptive import AbstractAdaptiveSolver, working_tolerances
from .._solver.base import check_solver
from .._solver.rosenbrock import Rodas5P
from .._validate import (
    as_state,
    as_state_leaf,
    check_positive_number,
    is_traced,
    nonfinite_leaves,
)
from .simulate import real_dtype, simulate
from .step_control import rms

_METHODS = ("simulate", "newton")
# Newton iterations of the polish and of method="newton" (quadratic convergence: a start at
# rest to the tolerance needs two or three)
_NEWTON_STEPS = 32


class SteadyState(eqx.Module):
    """What `ds.steady_state` returns.

    - `y`: the equilibrium, a pytree like `y0`.
    - `result`: int32 `ds.RESULTS` code: `successful`; `no_steady_state` where the trajectory
      ran to `max_time` without coming to rest (or Newton's method did not converge); or the
      code of the simulation towards it where that failed first (`max_steps_reached` for a
      trajectory that grows or oscillates through its step budget, `invalid_input`, ...).
    - `residual`: the size of the vector field there, the RMS of f / (atol + rtol·|y|): at most
      1 at an equilibrium.
    - `time`: how long the trajectory ran before it came to rest (0 for `method="newton"`;
      NaN where it did not).

    A start within the tolerance of an unstable equilibrium (its field below atol) goes where
    its trajectory goes: y* is the start only where the solve stays there. A stiff solver's
    long steps damp a growth that stays below atol (y' = y from 1e-20 with `Rodas5P` rests
    at 0, which to the tolerance it is): start farther than atol from an unstable state, or
    lower atol, to follow the flow away from it.
    """

    y: PyTree
    result: Array
    residual: Array
    time: Array

    @property
    def succeeded(self) -> Array:
        return self.result == RESULTS.successful


class _DelayAtRest(RateCondition):
    """`_AtRest` for a delay equation: both its rate dy/dt (which depends on the past; the loop
    passes it) and the field of the present state held at rest, f(t, y, (y, …, y)), are
    small. Either alone is not rest: the rate vanishes at every turning point of an
    oscillation, and f(y*, y*) = 0 where the trajectory passes through y* with its delayed
    states elsewhere."""

    model: object
    rtol: Array
    atol: Array

    def __call__(self, t, y, dydt):
        size = jnp.maximum(
            _scaled_size(dydt, y, self.rtol, self.atol),
            _size(self.model, t, y, self.rtol, self.atol),
        )
        return jnp.log(jnp.maximum(size, jnp.finfo(size.dtype).tiny))


class _AtRest(eqx.Module):
    """The event condition log(size of the vector field) − log(1): it falls through zero where
    the trajectory comes to rest (logarithmic, so the crossing is well located when the size
    falls by decades in one step)."""

    model: object
    rtol: Array
    atol: Array

    def __call__(self, t, y):
        size = _size(self.model, t, y, self.rtol, self.atol)
        # an exact rest (size 0) stays finite: -inf would read as a condition lost
        return jnp.log(jnp.maximum(size, jnp.finfo(size.dtype).tiny))


def _size(model, t, y, rtol, atol):
    """The RMS over components of f(t, y) / (atol + rtol·|y|) (0 for a state without any), f
    the field of a state at rest (`_rest_field`)."""
    return _scaled_size(_rest_field(model)(t, y), y, rtol, atol)


def _scaled_size(dydt, y, rtol, atol):
    return rms(jax.tree.map(lambda f, y: jnp.asarray(f) / (atol + rtol * jnp.abs(y)), dydt, y))


def _rest_field(model):
    """The vector field of a state held at rest: the model's own, or, for a delay equation,
    f(t, y, (y, …, y)) (at rest the delayed states equal the present one; the history does not
    enter)."""
    if isinstance(model, AbstractDDE):
        return lambda t, y: model.delayed_field(t, y, tuple(y for _ in model.delays()))
    return model.vector_field


def steady_state(
    model,
    y0,
    *,
    t0=0.0,
    method: str = "simulate",
    solver: AbstractAdaptiveSolver | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    max_time: float = 1e9,
    max_steps: int = 100_000,
    throw: bool = True,
) -> SteadyState:
    """The equilibrium y* of `model` (f(t0, y*) = 0) that the trajectory from `y0` comes to.

    **Arguments:**

    - `model`, `y0`: as for `ds.simulate`; `y0` is where the trajectory starts (or, with
      `method="newton"`, Newton's first guess).
    - `t0`: the time the vector field is evaluated at (a steady state of a model that depends
      on t exists only where that dependence stops).
    - `method`: `"simulate"` (default): integrate from y0 with `solver` until the vector field
      is at rest (the RMS of f / (atol + rtol·|y|) at most 1, a terminal event; for an
      explicit solver with the larger of these tolerances and its own, as its state keeps an
      error of its tolerance), then polish with Newton to `rtol`/`atol`; `"newton"`: Newton's
      method from y0 only. Newton holds the totals the model conserves (the left null
      vectors of its Jacobian) at their values where it starts.
    - `solver`: an adaptive solver for the simulation (default `ds.Rodas5P(rtol=1e-6,
      atol=1e-9)`: stiff-safe, and its steps grow fast as the state settles).
    - `rtol`, `atol`: at rest means |f| ≲ atol + rtol·|y| per unit time, component by
      component (in the RMS sense). Default 1e-8 and 1e-10 (float64), 1e-5 and 1e-7 in
      float32, whose rounding of f alone exceeds the float64 ones.
    - `max_time`: how long the trajectory may run before the solve gives up
      (`ds.RESULTS.no_steady_state`: it oscillates, grows, or settles too slowly).
    - `throw`: raise `ds.SimulationError` when no equilibrium is found (as `ds.simulate`);
      `throw=False` returns the code in `result` (the way under `jax.vmap`).

    A delay equation (`ds.AbstractDDE`) is at rest where its delayed states equal the present
    one: y* solves f(t0, y*, (y*, …, y*)) = 0 (independent of the lags and the history), and
    its trajectory is at rest where both that field and its actual rate (which reads the
    past) are small.

    Differentiable in every mode by the implicit function theorem (dy*/dθ = −J⁻¹ ∂f/∂θ; with
    conserved totals, whose left null vectors U of J fix uᵀy* = uᵀy0, by (J + UUᵀ) ẏ* =
    −∂f/∂θ·θ̇ + UUᵀ ẏ0). Jittable and vmappable.

    **Example:** `ds.steady_state(model, y0).y`
    """
    check_model("model", model)
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
    if solver is None:
        solver = Rodas5P(rtol=1e-6, atol=1e-9)
    check_solver("solver", solver, needs="an adaptive solver (e.g. ds.Rodas5P())")
    if not solver.adaptive:
        raise TypeError(
            f"steady_state integrates to rest with an adaptive solver (its steps grow as the "
            f"state settles); {type(solver).__name__} takes fixed steps: pass e.g. ds.Rodas5P()"
        )
    y0 = jax.tree.map(as_state_leaf, as_state(y0))
    dtype = real_dtype(y0)
    if rtol is None or atol is None:
        default_rtol, default_atol = working_tolerances(1e-8, 1e-10, dtype)
        rtol = default_rtol if rtol is None else rtol
        atol = default_atol if atol is None else atol
    for name, value in (("rtol", rtol), ("atol", atol)):
        if jnp.ndim(value) != 0:
            raise ValueError(
                f"{name} must be a number (steady_state's rest test is one RMS over the state), "
                f"got shape {jnp.shape(value)}"
            )
        if not is_traced(value) and not float(value) >= 0:
            raise ValueError(f"{name} must be >= 0, got {value!r}")
    if not is_traced(rtol) and not is_traced(atol) and float(rtol) == float(atol) == 0:
        raise ValueError(
            "rtol and atol are both 0: no state is ever at rest to within zero; give a "
            "tolerance (the defaults are rtol=1e-8, atol=1e-10)"
        )
    check_positive_number("max_time", max_time)
    bad = nonfinite_leaves(y0)
    if bad:
        where = "" if bad == ["(the value itself)"] else f" (at {', '.join(bad)})"
        raise ValueError(f"steady_state: y0 holds NaN or inf{where}; start from a finite state")
    times = jnp.asarray(t0, dtype), jnp.asarray(max_time, dtype)
    tolerances = jnp.asarray(rtol, dtype), jnp.asarray(atol, dtype)
    state = _steady_state(
        model, y0, times, tolerances, solver, method=method, max_steps=int(max_steps)
    )
    if throw:
        return _raise_if_failed(state)
    return state


@jit
def _steady_state(model, y0, times, tolerances, solver, *, method, max_steps):
    t0, _ = times
    rtol, atol = tolerances
    unravel = ravel_pytree(y0)[1]
    y_flat, code, time = _equilibrium(
        model, y0, times, tolerances, solver, method=method, max_steps=max_steps
    )
    return _finish(model, t0, unravel(y_flat), code, time, rtol, atol)


@eqx.filter_custom_jvp
def _equilibrium(model, y0, times, tolerances, solver, *, method, max_steps):
    """(the flat equilibrium, the result code, the time to rest); its derivatives by the
    implicit function theorem (`_equilibrium_jvp`), none through the search itself."""
    t0, max_time = times
    rtol, atol = tolerances
    y0_flat, unravel = ravel_pytree(y0)

    def field(y, model):
        return _flat_field(model, t0, unravel, y)

    def newton(start):
        """Newton's method on f = 0 from `start`, with the totals the model conserves held at
        start's (f(y) + U Uᵀ (y − start) = 0, U the left null vectors of J there, as in the
        derivative rule: without them J is singular and Newton has no step): (the root,
        whether it converged to a point at rest to the tolerance)."""
        u_null = _conserved_directions(jax.jacfwd(field)(lax.stop_gradient(start), model))
        solution = optx.root_find(
            lambda y, model: field(y, model) + u_null @ (u_null.T @ (y - start)),
            optx.Newton(rtol=rtol, atol=atol),
            start,
            args=model,
            max_steps=_NEWTON_STEPS,
            throw=False,
        )
        root = solution.value
        ok = (solution.result == optx.RESULTS.successful) & jnp.all(jnp.isfinite(root))
        return root, ok & (_size(model, t0, unravel(root), rtol, atol) <= 1)

    zero = jnp.zeros((), y0_flat.dtype)
    if method == "newton":
        root, ok = newton(y0_flat)
        return root, jnp.where(ok, RESULTS.successful, RESULTS.no_steady_state), zero

    # With an explicit solver the trajectory only has to come to rest to within the solver's
    # own tolerance (its state keeps an error of that size as its steps sit at the stability
    # limit; at steady_state's tighter one it would never stop): Newton polishes from there.
    # A stiff solver's steps damp that error, and Newton may not converge from a state that is
    # only roughly at rest (an ill-conditioned Jacobian: PEtab's Weber problem): it integrates
    # to steady_state's own tolerance.
    rest_rtol, rest_atol = rtol, atol
    if not solver.stiff:
        rest_rtol = jnp.maximum(rtol, jnp.max(jnp.asarray(solver.rtol, rtol.dtype)))
        rest_atol = jnp.maximum(atol, jnp.max(jnp.asarray(solver.atol, atol.dtype)))
    if isinstance(model, AbstractDDE):
        at_rest = _DelayAtRest(model, rest_rtol, rest_atol)
        # at t0 the delayed states are the history's (the model's own field reads it)
        resting = at_rest(t0, y0, model.vector_field(t0, y0)) <= 0
    else:
        at_rest = _AtRest(model, rest_rtol, rest_atol)
        resting = at_rest(t0, y0) <= 0
    sol = simulate(
        model,
        y0,
        jnp.stack([t0, t0 + max_time]),
        solver=solver,
        events=Event(at_rest, direction=-1, terminal=True),
        max_steps=max_steps,
        throw=False,
    )
    came_to_rest = sol.event_count == 1
    # A start at rest whose trajectory leaves it (an unstable equilibrium within the tolerance
    # of y0: an epidemic from I0 = 1e-11, whose field is below atol) is not where it comes to
    # rest: where the trajectory comes back to rest is (the terminal event fires only after
    # the condition has risen above zero), and one that leaves and never rests again (the
    # state at max_time not at rest) found nothing. Only a start that stays at rest is y*.
    # Where the solve to max_time did not finish (an explicit solver at a stable rest keeps
    # its steps at the stability limit and runs out of max_steps; a blow-up), the linearised
    # flow over max_time decides whether a start at rest stays there.
    ended = sol.result == RESULTS.successful
    still = _size(model, t0, _last(sol.ys), rest_rtol, rest_atol) <= 1 + 1e-3
    unsure = resting & ~came_to_rest & ~ended
    if y0_flat.shape[0] <= _STABILITY_SIZE:
        stable = lax.cond(
            eqxi.unvmap_any(unsure),
            lambda: _stable(lambda y: field(y, model), y0_flat, max_time),
            lambda: jnp.array(True),
        )
    else:  # a matrix exponential of a large state costs more than the solve: trusted
        stable = jnp.array(True)
    stays = resting & ~came_to_rest & jnp.where(ended, still, stable)
    resting = resting & ~came_to_rest
    rested = jax.tree.map(lambda a, b: jnp.where(resting, a, b), y0, sol.event_state)
    rested_flat = ravel_pytree(rested)[0]
    root, polished = newton(rested_flat)
    y_flat = jnp.where(polished, root, rested_flat)
    # at rest to steady_state's own tolerance: polished, or already there (the terminal event
    # stops where the size crosses 1, located to round-off on either side: a slack of 1e-3)
    # and not drifting. The relative test alone has no time scale: y' = 1 from y0 = 1 is "at
    # rest" to rtol once y = 1/rtol. A decay to rest at rate λ from a distance δ ends where
    # |f|·Δt / |y − y0| = ln(x)/x ≤ 1/e (x = λδ/tol); a state still moving as fast as it ever
    # went (a ratio of 1) has grown, not settled.
    rested_state = unravel(rested_flat)
    scale = atol + rtol * jnp.abs(rested_flat)
    drift = rms(
        ravel_pytree(_rest_field(model)(t0, rested_state))[0] * (sol.event_time - t0) / scale
    )
    moved = rms((rested_flat - y0_flat) / scale)
    drifting = came_to_rest & ~resting & (drift >= 0.5 * moved)
    settled = polished | ((_size(model, t0, rested_state, rtol, atol) <= 1 + 1e-3) & ~drifting)
    # a simulation that failed (an invalid y0 or parameter under jit is replaced by a finite
    # stand-in there) found nothing, even if its stand-in came to rest
    valid = jnp.all(jnp.isfinite(y0_flat)) & (sol.result != RESULTS.invalid_input)
    found = (stays | came_to_rest) & settled & valid
    failure = jnp.where(sol.result == RESULTS.successful, RESULTS.no_steady_state, sol.result)
    failure = jnp.where(valid, failure, RESULTS.invalid_input)
    code = jnp.where(found, RESULTS.successful, failure)
    time = jnp.where(resting, zero, jnp.where(came_to_rest, sol.event_time - t0, max_time))
    return y_flat, code, time


@_equilibrium.def_jvp
def _equilibrium_jvp(primals, tangents, *, method, max_steps):
    """The implicit function theorem at y*: J ẏ* = −∂f/∂θ·θ̇, with J = ∂f/∂y. Where the model
    conserves totals (left null vectors u of J: uᵀf = 0 for every state) the equilibrium is
    fixed by them too, uᵀy* = uᵀy0, so the system solved is (J + U Uᵀ) ẏ* = −∂f/∂θ·θ̇ +
    U Uᵀ ẏ0, square and regular (U the null vectors, from an SVD of J, held constant).
    Differentiable again: y* is this function's own output, so second derivatives take the
    same rule."""
    model, y0, times, tolerances, solver = primals
    model_dot, y0_dot = tangents[0], tangents[1]
    out = _equilibrium(model, y0, times, tolerances, solver, method=method, max_steps=max_steps)
    y_star = out[0]
    t0 = times[0]
    unravel = ravel_pytree(y0)[1]

    def field(y, model):
        return _flat_field(model, t0, unravel, y)

    jacobian = jax.jacfwd(field)(y_star, model)
    forcing = None
    if model_dot is not None:
        _, forcing = eqx.filter_jvp(lambda m: field(y_star, m), (model,), (model_dot,))
    if forcing is None:  # no differentiated parameter
        forcing = jnp.zeros_like(y_star)
    u_null = _conserved_directions(jacobian)
    system = jacobian + u_null @ u_null.T
    rhs = -forcing
    if y0_dot is not None:
        rhs = rhs + u_null @ (u_null.T @ ravel_pytree(y0_dot)[0])
    y_dot = jnp.linalg.solve(system, rhs)
    return out, (y_dot, None, None)


# states up to this size get the stability check of a start at rest (`_stable`)
_STABILITY_SIZE = 256


def _stable(field, y, horizon):
    """Whether small deviations from y (a point at rest) stay small over `horizon` under the
    linearised flow: every entry of exp(J·horizon) at most 1e3 (a decaying, conserved or
    oscillating direction keeps it near 1; a growing one at rate λ multiplies it by e^(λ·T)).
    A matrix exponential (`_exponential`: scaling and squaring, on every backend) rather than
    eigenvalues: JAX computes non-symmetric eigenvalues on the CPU only."""
    jacobian = jax.jacfwd(field)(lax.stop_gradient(y))
    growth = _exponential(jacobian * horizon)
    return jnp.all(jnp.abs(growth) <= 1e3)  # NaN (an overflow) is unstable too


# Terms of the Taylor series of exp(A / 2^s) with ‖A / 2^s‖∞ ≤ 1/2: the remainder is below
# 0.5^19 / 19! ≈ 2e-23, under double precision's round-off.
_TAYLOR_TERMS = 18


def _exponential(a):
    """exp(a) of a square matrix by scaling and squaring of its Taylor series, both as loops.
    Why not `jax.scipy.linalg.expm`: its Padé approximants of every order and their branches
    are compiled into every steady state's program, for a test that only asks whether an
    entry exceeds 1e3 (measured in fresh processes: PEtab's Weber steady state 3.8 → 3.2 s
    of XLA, medians of 5; a two-state one 2.5 → 2.1 s to trace and compile, of 3). Three or
    four squarings more than there (its norm bound is 5.4); overflow gives inf or NaN, as
    there."""
    n = a.shape[0]
    identity = jnp.eye(n, dtype=a.dtype)
    norm = jnp.max(jnp.sum(jnp.abs(a), axis=1))
    # squarings: enough to bring the norm to 1/2; none for a NaN or infinite matrix (NaN out)
    squarings = jnp.where(
        jnp.isfinite(norm) & (norm > 0.5), jnp.ceil(jnp.log2(norm / 0.5)), 0.0
    ).astype(jnp.int32)
    scaled = a / jnp.exp2(squarings.astype(a.dtype))

    def term(k, carry):
        power, total = carry
        power = power @ scaled / k.astype(a.dtype)
        return power, total + power

    _, series = lax.fori_loop(1, _TAYLOR_TERMS + 1, term, (identity, identity))
    return lax.fori_loop(0, squarings, lambda _, m: m @ m, series)


def _last(ys):
    """The state at the last output time of a solve's `ys`."""
    return jax.tree.map(lambda y: y[-1], ys)


def _conserved_directions(jacobian):
    """The left null vectors U of J (one column each, zero columns elsewhere; from an SVD,
    held constant): the totals Uᵀy that the model conserves."""
    u, singular, _ = jnp.linalg.svd(lax.stop_gradient(jacobian))
    n = jacobian.shape[0]
    eps = jnp.finfo(jacobian.dtype).eps
    null = singular <= 1e3 * max(n, 1) * eps * singular[0]
    return jnp.where(null[None, :], u, 0.0)


def _flat_field(model, t, unravel, y_flat):
    return ravel_pytree(_rest_field(model)(t, unravel(y_flat)))[0]


def _finish(model, t0, y, code, time, rtol, atol) -> SteadyState:
    residual = _size(model, t0, y, rtol, atol)
    # NaN where none was found, as a failed simulation's states
    y = jax.tree.map(lambda x: jnp.where(code == RESULTS.successful, x, jnp.nan), y)
    time = jnp.where(code == RESULTS.successful, time, jnp.nan)  # it never came to rest
    return SteadyState(y=y, result=code.astype(jnp.int32), residual=residual, time=time)


def _raise_if_failed(state: SteadyState) -> SteadyState:
    if is_traced(state.result):
        checked = eqx.error_if(
            state.y, state.result != RESULTS.successful, RESULTS.no_steady_state.message
        )
        return eqx.tree_at(lambda s: s.y, state, checked)
    code = RESULTS(int(state.result))
    if code != RESULTS.successful:
        raise SimulationError(code, f"size of the vector field at the end: {state.residual:.3g}")
    return state
