"""The optional hooks a model gives the stiff solvers, `jacobian(t, y)` and
`jacobian_bandwidth` (the mass matrix is checked in `dae.py`): their checks before a solve, and
what a failed solve says about them and about a delay equation's lags and history.

Why: a hook is trusted by the Rosenbrock steps (the Jacobian enters their order conditions),
so a hook of the wrong shape ended in a reshape error inside a step, and a hook that returns
NaN, or a band that does not hold the Jacobian, made every step fail as "max_steps_reached:
loosen rtol/atol": advice that cannot help. The failure text now names the hook.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from .._model import AbstractDDE
from .._validate import describe, is_count, is_traced, once


def check_jacobian_hooks(model, t0, y0) -> None:
    """Trace-time checks of `jacobian_bandwidth` (two ints in 0 … n − 1) and of the shape and
    dtype of `jacobian(t, y)` ((n, n) real, or None) against the flattened state of n
    components."""
    name = type(model).__name__
    n = sum(int(np.size(leaf)) for leaf in jax.tree.leaves(y0))
    band = model.jacobian_bandwidth
    if band is not None:
        if (
            not isinstance(band, (tuple, list))
            or len(band) != 2
            or not all(is_count(b) and b >= 0 for b in band)
        ):
            raise ValueError(
                f"{name}.jacobian_bandwidth must be None or (lower, upper), two ints >= 0 (the "
                f"diagonals of ∂f/∂y below and above the main one that may be non-zero), got "
                f"{band!r}"
            )
        if max(band) > max(n - 1, 0):
            raise ValueError(
                f"{name}.jacobian_bandwidth = {tuple(band)}, but ∂f/∂y of a state of {n} "
                f"components has at most {max(n - 1, 0)} diagonals on either side: give the "
                "band the Jacobian has, or None"
            )
    once(_check_jacobian_shape, model, t0, y0)
    if not any(is_traced(x) for x in jax.tree.leaves((model, t0, y0))):
        # one evaluation, eagerly: a NaN Jacobian would otherwise fail every step of the solve
        # (a model without the hook returns None here, and nothing runs)
        own = model.jacobian(t0, y0)
        if own is not None and not np.all(np.isfinite(np.asarray(own))):
            raise ValueError(
                f"{name}.jacobian(t, y) returns NaN or inf at t0 = {float(t0):.6g} and y0: the "
                "stiff steps solve with it; fix the hook, or remove it to have ∂f/∂y taken "
                "by jax.jacfwd"
            )


def _check_jacobian_shape(model, t0, y0) -> None:
    name = type(model).__name__
    n = sum(int(np.size(leaf)) for leaf in jax.tree.leaves(y0))
    try:
        out = jax.eval_shape(model.jacobian, t0, y0)
    except Exception as error:
        raise type(error)(f"{name}.jacobian(t, y) failed: {error}") from error
    if out is None:
        return
    if not hasattr(out, "shape") or not hasattr(out, "dtype"):
        raise TypeError(
            f"{name}.jacobian(t, y) must return an ({n}, {n}) array (or None), got "
            f"{describe(out, True)}"
        )
    if tuple(out.shape) != (n, n):
        raise ValueError(
            f"{name}.jacobian(t, y) returns shape {tuple(out.shape)}, but the state "
            f"({describe(y0)}) has {n} components: it must return ∂f/∂y as an ({n}, {n}) "
            "array over the flattened state (row i: component i of f), or None to have it "
            "taken by jax.jacfwd"
        )
    if not jnp.issubdtype(out.dtype, jnp.floating):
        raise TypeError(f"{name}.jacobian(t, y) must return real floats, got {out.dtype}")


def failure_notes(model, solver, t0, y0, ts, ys, max_steps: int) -> str:
    """What a failed solve may owe to the model's hooks or to a delay equation (concrete
    values only; "" when nothing is found): a `jacobian` that is not finite or disagrees with
    `jax.jacfwd` of the vector field at t0 or the last finite output, and a delay equation's
    smallest lag (which bounds its steps) and a history that is not finite."""
    if any(is_traced(x) for x in jax.tree.leaves((model, y0, ts, ys))):
        return ""
    notes = []
    if solver.supports_mass_matrix:  # the Rosenbrock steps use the hooks
        notes += _jacobian_notes(model, t0, y0, ts, ys)
    if isinstance(model, AbstractDDE):
        notes += _delay_notes(model, solver, t0, ts, max_steps)
    return " ".join(notes)


def _jacobian_notes(model, t0, y0, ts, ys) -> list[str]:
    if jax.eval_shape(model.jacobian, t0, y0) is None:
        return []
    name = type(model).__name__
    points = [(t0, y0)]
    rows = [leaf.reshape(leaf.shape[0], -1) for leaf in jax.tree.leaves(ys)]
    finite = np.all([np.all(np.isfinite(np.asarray(r)), axis=1) for r in rows], axis=0)
    last = int(np.nonzero(finite)[0][-1]) if finite.any() else 0
    if last > 0:
        points.append((ts[last], jax.tree.map(lambda leaf: leaf[last], ys)))
    for t, y in points:
        flat, unravel = ravel_pytree(y)
        own = np.asarray(model.jacobian(t, y), float)
        exact = np.asarray(
            jax.jacfwd(lambda z: ravel_pytree(model.vector_field(t, unravel(z)))[0])(flat)
        )
        if not np.all(np.isfinite(own)):
            return [
                f"{name}.jacobian(t, y) returns NaN or inf at t = {float(t):.6g} (the Rosenbrock "
                "steps solve with it): fix the hook, or remove it to have ∂f/∂y taken by "
                "jax.jacfwd."
            ]
        gap = float(np.max(np.abs(own - exact))) if own.size else 0.0
        if gap > 1e-6 * (1.0 + float(np.max(np.abs(exact)))):
            return [
                f"{name}.jacobian(t, y) differs from jax.jacfwd of its vector field by "
                f"{gap:.3g} at t = {float(t):.6g} (the Rosenbrock steps need the exact ∂f/∂y): "
                "fix the hook, or remove it."
            ]
    return []


def check_history_values(model: AbstractDDE, t0) -> None:
    """A delay equation's history, where concrete, finite on [t0 − largest lag, t0] (at 17
    points, the lags' own included): a NaN there made every step fail as max_steps_reached."""
    lags = model.delays()
    if any(is_traced(x) for x in jax.tree.leaves((model, t0))):
        return
    times = np.concatenate(
        [np.linspace(float(t0) - max(float(lag) for lag in lags), float(t0), 17)]
        + [[float(t0) - float(lag)] for lag in lags]
    )
    values = jax.vmap(model.history)(jnp.asarray(times, jnp.result_type(t0)))
    if any(is_traced(v) for v in jax.tree.leaves(values)):  # it closes over traced values
        return
    finite = np.ones(times.shape, bool)
    for leaf in jax.tree.leaves(values):
        finite &= np.isfinite(np.asarray(leaf)).reshape(times.size, -1).all(axis=1)
    if not finite.all():
        raise ValueError(
            f"{type(model).__name__}'s history returns NaN or inf at t = "
            f"{times[~finite][0]:.6g}: the delayed states before t0 are read from it, so it "
            "must be finite on [t0 − largest lag, t0]"
        )


def _delay_notes(model, solver, t0, ts, max_steps: int) -> list[str]:
    name = type(model).__name__
    notes = []
    lags = [float(lag) for lag in model.delays()]
    shortest = min(lags)
    span = abs(float(ts[-1]) - float(t0))
    if solver.adaptive and span / shortest > max_steps / 2:
        notes.append(
            f"A delay equation's steps are no longer than its smallest lag ({shortest:.3g}), "
            f"so {name} needs at least {int(np.ceil(span / shortest)):,} steps for this span: "
            "raise max_steps above that, or shorten the span."
        )
    before = np.linspace(float(t0) - max(lags), float(t0), 17)
    for s in before:
        value = model.history(jnp.asarray(s, jnp.result_type(float)))
        if not all(np.all(np.isfinite(np.asarray(v))) for v in jax.tree.leaves(value)):
            notes.append(
                f"{name}'s history returns NaN or inf at t = {s:.6g} (delayed states before t0 "
                "are read from it): give a finite history on [t0 − largest lag, t0]."
            )
            break
    return notes
