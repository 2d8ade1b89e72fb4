"""Sensitivities dy(t)/dθ of a simulation, and Jacobians in the cheaper autodiff mode."""

import equinox as eqx
import jax
import jax.numpy as jnp

from .._compile import jit
from .._integrate.simulate import raise_if_failed, real_dtype, simulate
from .._paths import floating_names, get, path_of
from .._validate import as_state, as_state_leaf, HostArray, is_traced


def jacobian(fn, x, *, mode: str = "auto", has_aux: bool = False):
    """The Jacobian of `fn` at `x` (pytrees in and out), in forward mode when `x` has no more
    elements than `fn(x)` (one pass per input) and in reverse mode otherwise (one pass per
    output); `mode="forward"` or `"reverse"` forces one.

    **Returns:** a pytree shaped like `fn(x)` whose leaves have shape `out.shape + in.shape` per
    input leaf (JAX's `jacfwd`/`jacrev` layout); with `has_aux=True`, `fn` returns `(out, aux)`
    and the result is `(jacobian, aux)`.
    """
    if mode not in ("auto", "forward", "reverse"):
        raise ValueError(f"mode must be 'auto', 'forward' or 'reverse', got {mode!r}")
    if mode == "auto":
        n_in = sum(jnp.size(leaf) for leaf in jax.tree.leaves(x))
        out = jax.eval_shape(fn, x)
        n_out = sum(leaf.size for leaf in jax.tree.leaves(out[0] if has_aux else out))
        mode = "forward" if n_in <= n_out else "reverse"
    return (jax.jacfwd if mode == "forward" else jax.jacrev)(fn, has_aux=has_aux)(x)


def sensitivity(model, y0, ts, *, solver, wrt="parameters", mode: str = "auto", **options):
    """Sensitivities of the whole solution: d ys / d θ.

    **Arguments:**

    - `model`, `y0`, `ts`, `solver` and `options`: as for `ds.simulate`.
    - `wrt`: `"parameters"` (every floating parameter field of the model, and every floating
      entry of its dict of named parameters, a `ds.ODE`'s), `"y0"`, or a tuple of parameter
      names as `ds.fit(..., params=)` takes them, e.g. `("length", "damping")` or `("k",)`.
    - `mode`: `"auto"` chooses forward or reverse mode by the numbers of inputs and outputs.

    **Returns:** a dict name → Jacobian; each has shape `ys.shape + parameter.shape`
    (`(times, *state, *y0_shape)` for `"y0"`, keyed `"y0"`), for an array state.
    """
    throw = options.pop("throw", True)
    if isinstance(wrt, str) and wrt == "y0":
        # an integer state is read as floats by simulate; so it is differentiated
        y0 = jax.tree.map(as_state_leaf, as_state(y0))
        names = "y0"
    else:
        if isinstance(wrt, str) and wrt != "parameters":
            wrt = (wrt,)  # one name, not its letters
        names = tuple(floating_names(model)) if wrt == "parameters" else tuple(wrt)
        known = ", ".join(floating_names(model))
        for name in names:
            path = path_of(model, name)
            if path is None:
                raise ValueError(
                    f"{type(model).__name__} has no parameter {name!r}; it has: {known} (or "
                    "wrt='y0' for the initial state)"
                )
            value = get(model, path)
            if not (eqx.is_inexact_array(value) or isinstance(value, float)):
                raise ValueError(
                    f"{type(model).__name__}.{name} is {value!r}, not a floating array, so "
                    f"nothing can be differentiated with respect to it; its floating "
                    f"parameters: {known}"
                )
        if not names:
            raise ValueError(
                f"{type(model).__name__} has no floating parameters to differentiate: pass "
                "wrt='y0', or give the model array parameters"
            )
    if mode not in ("auto", "forward", "reverse"):
        raise ValueError(f"mode must be 'auto', 'forward' or 'reverse', got {mode!r}")
    # a fixed-step solve plans its steps from concrete times: they go in as a static value
    static_ts = not is_traced(ts) and getattr(solver, "needs_dt", False)
    times = HostArray(ts) if static_ts else ts
    result, solution = _sensitivities(model, y0, times, solver, names, mode, options)
    if throw:  # checked after the program, so that it carries no host callback
        raise_if_failed(solution, options.get("max_steps", 100_000), solver, real_dtype(y0))
    return result


@jit
def _sensitivities(model, y0, ts, solver, names, mode: str, options: dict):
    """The Jacobians and the undifferentiated solution (for its result code), in one program:
    run eagerly, the Jacobian's own operations would each compile a small program."""
    ts = ts.value if isinstance(ts, HostArray) else ts

    def solve(member, initial):
        solution = simulate(member, initial, ts, solver=solver, throw=False, **options)
        return solution.ys, solution

    if names == "y0":
        jac, solution = jacobian(lambda initial: solve(model, initial), y0, mode=mode, has_aux=True)
        return {"y0": jac}, solution

    paths = [path_of(model, name) for name in names]

    def run(values):
        member = eqx.tree_at(
            lambda m: [get(m, p) for p in paths], model, [values[n] for n in names]
        )
        return solve(member, y0)

    # an array keeps its dtype; a Python float entry becomes one of the default float type
    values = {name: _as_array(get(model, p)) for name, p in zip(names, paths)}
    return jacobian(run, values, mode=mode, has_aux=True)


def _as_array(value):
    return value if eqx.is_inexact_array(value) else jnp.asarray(value, float)
