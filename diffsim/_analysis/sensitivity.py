"""Sensitivities dy(t)/dθ of a simulation, and Jacobians in the cheaper autodiff mode."""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp

from .._integrate.simulate import simulate
from .._validate import as_state, as_state_leaf


def jacobian(fn, x, *, mode: str = "auto"):
    """The Jacobian of `fn` at `x` (pytrees in and out), in forward mode when `x` has no more
    elements than `fn(x)` (one pass per input) and in reverse mode otherwise (one pass per
    output); `mode="forward"` or `"reverse"` forces one.

    **Returns:** a pytree shaped like `fn(x)` whose leaves have shape `out.shape + in.shape` per
    input leaf (JAX's `jacfwd`/`jacrev` layout).
    """
    if mode not in ("auto", "forward", "reverse"):
        raise ValueError(f"mode must be 'auto', 'forward' or 'reverse', got {mode!r}")
    if mode == "auto":
        n_in = sum(jnp.size(leaf) for leaf in jax.tree.leaves(x))
        n_out = sum(leaf.size for leaf in jax.tree.leaves(jax.eval_shape(fn, x)))
        mode = "forward" if n_in <= n_out else "reverse"
    return (jax.jacfwd if mode == "forward" else jax.jacrev)(fn)(x)


def sensitivity(model, y0, ts, *, solver, wrt="parameters", mode: str = "auto", **options):
    """Sensitivities of the whole solution: d ys / d θ.

    **Arguments:**

    - `model`, `y0`, `ts`, `solver` and `options`: as for `ds.simulate`.
    - `wrt`: `"parameters"` (every floating parameter field of the model), `"y0"`, or a tuple of
      parameter field names, e.g. `("length", "damping")`.
    - `mode`: `"auto"` chooses forward or reverse mode by the numbers of inputs and outputs.

    **Returns:** a dict name → Jacobian; each has shape `ys.shape + parameter.shape`
    (`(times, *state, *y0_shape)` for `"y0"`, keyed `"y0"`), for an array state.
    """
    if isinstance(wrt, str) and wrt == "y0":

        def run_y0(initial):
            return simulate(model, initial, ts, solver=solver, **options).ys

        # an integer state is read as floats by simulate; so it is differentiated
        y0 = jax.tree.map(as_state_leaf, as_state(y0))
        return {"y0": jacobian(run_y0, y0, mode=mode)}
    if isinstance(wrt, str) and wrt != "parameters":
        wrt = (wrt,)  # one name, not its letters
    names = _parameter_names(model) if wrt == "parameters" else tuple(wrt)
    known = ", ".join(_parameter_names(model))
    for name in names:
        if not any(f.name == name for f in dataclasses.fields(model)):
            raise ValueError(
                f"{type(model).__name__} has no parameter {name!r}; it has: {known} (or "
                "wrt='y0' for the initial state)"
            )
        if not eqx.is_inexact_array(getattr(model, name)):
            raise ValueError(
                f"{type(model).__name__}.{name} is {getattr(model, name)!r}, not a floating "
                f"array, so nothing can be differentiated with respect to it; its floating "
                f"parameters: {known}"
            )
    values = {name: getattr(model, name) for name in names}

    def run(values):
        member = eqx.tree_at(
            lambda m: [getattr(m, n) for n in names], model, [values[n] for n in names]
        )
        return simulate(member, y0, ts, solver=solver, **options).ys

    return jacobian(run, values, mode=mode)


def _parameter_names(model) -> tuple[str, ...]:
    return tuple(
        f.name for f in dataclasses.fields(model) if eqx.is_inexact_array(getattr(model, f.name))
    )
