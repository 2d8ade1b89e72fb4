"""Analysis of trajectories built from `simulate` and JAX transformations of it: the largest
Lyapunov exponent from the tangent dynamics."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Float

from .._compile import jit
from .._custom_types import State
from .._integrate.simulate import simulate
from .._model import AbstractDDE, AbstractODE, AbstractSDE, check_model
from .._solver.base import AbstractFixedStepSolver, check_solver
from .._validate import (
    as_state,
    as_state_leaf,
    check_positive_number,
    check_real,
    check_static_count,
    is_traced,
    nonfinite_leaves,
    to_device,
)


def lyapunov_exponent(
    model: AbstractODE,
    y0: State,
    *,
    solver: AbstractFixedStepSolver,
    dt: float | Float[Array, ""],
    steps: int,
    renormalize_every: int = 10,
    transient_steps: int = 0,
    tangent: State | None = None,
    t0: float | Float[Array, ""] = 0.0,
    history: bool = False,
):
    """The largest Lyapunov exponent of a trajectory, from its tangent dynamics (the method of
    Benettin, Galgani, Giorgilli & Strelcyn, *Lyapunov characteristic exponents for smooth
    dynamical systems and for Hamiltonian systems*, Meccanica 15 (1980) 9–20).

    A tangent vector v is carried along the trajectory by the linearised flow: over each
    interval of `renormalize_every` steps, `(y, v) → (φ(y), Dφ(y) v)` with φ the fixed-step
    solve of `ds.simulate` over that interval and `Dφ(y) v` its `jax.jvp`. After each interval
    v is rescaled to unit (Euclidean) length and the logarithm of its growth factor is added
    up; the exponent is that sum divided by the measured time `steps * dt`:

        λ ≈ (1 / (n k dt)) Σᵢ log ‖Dφ(yᵢ) vᵢ‖,   ‖vᵢ‖ = 1,  n = steps / k intervals of k steps.

    Any generic tangent vector aligns with the most expanding direction within a few e-folding
    times, so the estimate converges to the largest exponent. It is the exponent of the
    discrete map (the solver's steps); it approaches the flow's as dt → 0 with the solver's
    order. A finite-time estimate scatters about its limit like 1/√T (T = steps·dt) on a
    chaotic attractor; on a regular orbit or at a stable fixed point its error is a bounded
    factor spread over the whole time, O(1/T) (e.g. ln κ / T, κ the condition number of the
    linearization's eigenvectors).

    The whole measurement is one `lax.scan` over the intervals (compile time does not depend on
    `steps`); the function composes with `jax.jit`, `jax.vmap` (over model parameters, initial
    states, `dt`) and differentiation (reverse mode stores every step: memory ∝ steps).

    **Arguments:**

    - `model`: a deterministic `ds.AbstractODE` (any diffsim model, or `ds.ODE(fn, params)`).
    - `y0`: the initial state at `t0`, a pytree of arrays the model accepts; its floating dtype
      sets the precision, and the result has it.
    - `solver`: a fixed-step deterministic solver, e.g. `ds.RK4()` (or a symplectic one for a
      `ds.AbstractSecondOrder` model whose acceleration does not depend on the velocity).
    - `dt`: the step (time units of the model), > 0. May be traced.
    - `steps`: the static number of steps measured, a multiple of `renormalize_every`; the
      measured time is `steps * dt`.
    - `renormalize_every`: static number of steps k between renormalizations of the tangent
      vector (default 10). Choose k·dt well below the time over which the tangent would grow by
      ~10³⁰⁰ (overflow) or shrink to ~10⁻³⁰⁰ (underflow): for float64 k·dt·|λ| < 700, for
      float32 k·dt·|λ| < 80.
    - `transient_steps`: static number of steps (a multiple of `renormalize_every`, default 0)
      run first and not counted, during which the trajectory settles onto its attractor and
      the tangent vector aligns with the most expanding direction.
    - `tangent`: the initial tangent vector, a pytree like `y0`, not zero (default: a fixed
      pseudo-random unit vector, `jax.random.normal(jax.random.key(0), ...)`, which is generic,
      i.e. not orthogonal to the most expanding direction, with probability one).
    - `t0`: the initial time (default 0), for non-autonomous models.
    - `history`: also return the running estimate after each renormalization.

    **Returns:** the exponent λ, a scalar of `y0`'s dtype, in units of 1/time (e-foldings of an
    infinitesimal separation per unit time; positive: chaos, zero: a regular orbit, negative:
    a stable fixed point). With `history=True`, a tuple `(λ, running)` where `running`, shape
    `(steps // renormalize_every,)`, holds the estimate over the first i + 1 intervals
    (`running[-1] == λ`). A trajectory that becomes non-finite gives NaN (no error is raised,
    so that one bad member of a `vmap` does not stop the others).

    **Raises:** `TypeError` for a model or solver this cannot use (stochastic, adaptive, or not a
    diffsim one); `ValueError` for non-positive `dt`, bad counts, a non-finite `y0`, or a
    `tangent` that does not match `y0` or is zero. A traced `dt` ≤ 0 raises when the compiled
    program runs.

    **Example:**

        rhos = jnp.linspace(10.0, 200.0, 96)
        exponents = jax.vmap(lambda r: ds.lyapunov_exponent(
            models.Lorenz(rho=r), jnp.array([1.0, 1.0, 20.0]), solver=ds.RK4(), dt=0.01,
            steps=50_000, transient_steps=5_000))(rhos)
    """
    _check_model_and_solver(model, solver)
    every = check_static_count("renormalize_every", renormalize_every, minimum=1)
    steps = check_static_count("steps", steps, minimum=1)
    transient_steps = check_static_count("transient_steps", transient_steps, minimum=0)
    for name, count in (("steps", steps), ("transient_steps", transient_steps)):
        if count % every:
            raise ValueError(
                f"{name}={count} must be a multiple of renormalize_every={every} (the tangent "
                f"is renormalized every {every} steps): use e.g. {name}="
                f"{max(every, count - count % every)}"
            )
    check_positive_number("dt", dt, allow_none=False)
    if not is_traced(t0):
        check_real("t0", t0)
    if not isinstance(history, bool):
        raise TypeError(f"history must be True or False, got {history!r}")

    y0 = jax.tree.map(as_state_leaf, as_state(y0))
    leaves = jax.tree.leaves(y0)
    if not leaves:
        raise ValueError("y0 is empty: pass the initial state as an array or a pytree of arrays")
    bad = nonfinite_leaves(y0)
    if bad:
        where = "" if bad == ["(the value itself)"] else f" at {', '.join(bad)}"
        raise ValueError(f"y0 holds NaN or inf{where}; the initial state must be finite")
    dtype = jnp.finfo(jnp.result_type(*leaves)).dtype
    tangent = _checked_tangent(y0, tangent)
    exponent, running = _measure(
        model,
        solver,
        y0,
        tangent,
        to_device(dt, dtype),
        to_device(t0, dtype),
        every=every,
        skipped=transient_steps // every,
        intervals=steps // every,
        check_dt=is_traced(dt),
    )
    return (exponent, running) if history else exponent


@jit
def _measure(
    model, solver, y0, tangent, dt, t0, *, every: int, skipped: int, intervals: int, check_dt: bool
):
    """The renormalized tangent loop: (λ, running estimates). Jitted so that eager calls with
    new values (a Python loop over parameters) reuse one compilation."""
    if check_dt:  # a traced dt: only the running program can check it (a concrete one was)
        dt = eqx.error_if(dt, ~(dt > 0), "lyapunov_exponent: dt must be > 0")
    interval = every * dt
    tangent = _unit_tangent(y0, tangent)

    def flow(t, y):
        ts = jnp.stack([t, t + interval])
        # throw=False: a member that blows up gives NaN instead of stopping a whole vmap
        solution = simulate(
            model, y, ts, solver=solver, steps_per_save=every, checkpoint=None, throw=False
        )
        return jax.tree.map(lambda ys: ys[-1], solution.ys)

    def renormalized_step(carry, _):
        t, y, v = carry
        y_next, v_next = jax.jvp(lambda state: flow(t, state), (y,), (v,))
        # a member whose solve failed (NaN states; its inputs' tangents are held at zero, so
        # the growth alone would read log 0 = -inf, "strongly stable") measures NaN
        finite = jnp.all(
            jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree.leaves(y_next)])
        )
        log_growth = jnp.where(finite, _log_norm(v_next), jnp.nan)
        scale = jnp.exp(-log_growth)
        v_next = jax.tree.map(lambda leaf: leaf * scale.astype(leaf.dtype), v_next)
        return (t + interval, y_next, v_next), log_growth

    # one loop for the transient and the measurement (one loop body to compile); the
    # transient's growth factors are dropped
    _, log_growth = lax.scan(renormalized_step, (t0, y0, tangent), None, length=skipped + intervals)
    log_growth = log_growth[skipped:]
    counts = jnp.arange(1, intervals + 1, dtype=dt.dtype)
    running = jnp.cumsum(log_growth) / (interval * counts)
    return running[-1], running


def _check_model_and_solver(model, solver) -> None:
    check_model("model", model)
    if isinstance(model, AbstractSDE):
        raise TypeError(
            f"{type(model).__name__} is a stochastic model: lyapunov_exponent follows the tangent "
            "dynamics of a deterministic flow"
        )
    if isinstance(model, AbstractDDE):
        # its state space is the whole past over the longest lag: restarting from the present
        # state at every renormalisation would discard it
        raise TypeError(
            f"{type(model).__name__} is a delay equation: lyapunov_exponent follows the "
            "tangent of an ODE's state, and a delay equation's state is its whole past over "
            "the longest lag; it is not supported"
        )
    needs = (
        "a fixed-step deterministic solver such as ds.RK4() (the tangent is renormalized every "
        "renormalize_every steps of size dt)"
    )
    check_solver("solver", solver, needs=needs)
    if solver.adaptive or solver.stochastic:
        kind = "a stochastic" if solver.stochastic else "an adaptive"
        raise TypeError(
            f"lyapunov_exponent needs {needs}; {type(solver).__name__} is {kind} solver"
        )


def _squared_norm(tree):
    return sum(jnp.sum(jnp.abs(leaf) ** 2) for leaf in jax.tree.leaves(tree))


def _log_norm(tree):
    """log of the Euclidean norm, scaled by the largest component first, so that a vector
    whose squared norm would overflow (or underflow) still has a finite log norm."""
    largest = jnp.max(jnp.stack([jnp.max(jnp.abs(leaf)) for leaf in jax.tree.leaves(tree)]))
    safe = jnp.where(largest > 0, largest, jnp.ones_like(largest))
    scaled = jax.tree.map(lambda leaf: leaf / safe.astype(leaf.dtype), tree)
    return jnp.log(safe) + 0.5 * jnp.log(_squared_norm(scaled))


def _checked_tangent(y0, tangent):
    """The user's tangent vector, checked on the host (None: the default, made in `_measure`)."""
    if tangent is None:
        return None
    tangent = jax.tree.map(as_state_leaf, tangent)
    same = jax.tree.structure(tangent) == jax.tree.structure(y0) and all(
        a.shape == b.shape for a, b in zip(jax.tree.leaves(tangent), jax.tree.leaves(y0))
    )
    if not same:
        shapes = jax.tree.map(lambda x: tuple(x.shape), (tangent, y0))
        raise ValueError(
            f"tangent must be a pytree like y0 (same structure and shapes); got {shapes[0]} "
            f"for y0 {shapes[1]}"
        )
    leaves = jax.tree.leaves(tangent)
    if not any(is_traced(leaf) for leaf in leaves):
        # on the host: device arithmetic here would compile small programs of its own
        squared = sum(float(np.sum(np.abs(np.asarray(leaf)) ** 2)) for leaf in leaves)
        if not (np.isfinite(squared) and squared > 0):
            raise ValueError("tangent must be a non-zero (finite) vector")
    return tangent


def _unit_tangent(y0, tangent):
    """A unit tangent vector shaped like `y0` (traced): the user's, rescaled, or a fixed random
    one."""
    if tangent is None:
        leaves, treedef = jax.tree.flatten(y0)
        keys = jax.random.split(jax.random.key(0), len(leaves))
        tangent = jax.tree.unflatten(
            treedef,
            [jax.random.normal(k, leaf.shape, leaf.dtype) for k, leaf in zip(keys, leaves)],
        )
    tangent = jax.tree.map(lambda v, y: v.astype(y.dtype), tangent, y0)
    norm = jnp.sqrt(_squared_norm(tangent))
    return jax.tree.map(lambda leaf: leaf / norm.astype(leaf.dtype), tangent)
