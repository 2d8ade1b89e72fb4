"""The derivative rule of the adaptive loops (`adaptive_loop.run_any_order`, the lean explicit
loop and the diffrax solves of `adaptive`): which way a solve's tangent is computed, by the
number of differentiated inputs.

- Few inputs (≤ `JACOBIAN_INPUTS`): the tangent is J·t with the Jacobian J carried forward
  through the loop (`forward_jacobian`). JAX transposes it for reverse mode and differentiates
  it again forward for second order; one forward pass with a tangent per input.
- Many inputs (a neural vector field): the tangent is a primitive, linear in t, whose rules are
  written here rather than derived by JAX:
    - evaluated (`jax.jvp`, `jax.jacfwd`): forward mode through the loop as it runs ("lax");
    - transposed (`jax.grad`, `jax.vjp`, `jax.jacrev`): the backward sweep of the loop run as
      equinox's checkpointed while loop, whose forward sweep computed the primal and kept
      O(√max_steps) checkpoints (`_checkpointed_primal`): reverse mode costs about two forward
      passes whatever the number of inputs, and its memory does not grow with the steps taken;
    - differentiated again (`jax.hessian`, forward over reverse, reverse over reverse):
      through the loop run as a bounded loop of nested scans, which both modes enter (slow
      to compile, as diffrax's DirectAdjoint; only second derivatives for many inputs pay
      it), the primal by the solve's own rule one order up;
    - batched (`jax.vmap`): the same primitive over inputs broadcast to the batch (below).

Why a primitive: JAX's reverse mode of a `custom_jvp` rule transposes the tangent computation,
and a `while_loop` of run-time length cannot be transposed; a `custom_vjp` (diffrax's
RecursiveCheckpointAdjoint) can be, but then forward mode and Hessians cannot enter. Giving the
tangent its own transpose keeps one rule for every mode. `jax.custom_derivatives.linear_call`
does the same with neither batching nor second-order rules. (Checked against the Jacobian rule
and finite differences in `tests/test_derivatives.py`; measured in experiments/bench/hybrid.py.)

`solve(kind, *args)` is the solve whose derivatives are taken: it returns (the inexact outputs
to differentiate, the full output), running its loop as `kind` ("lax", "checkpointed" or
"bounded"); the step sizes are held fixed under differentiation in all three, so they take the
same steps.
"""

import dataclasses
import functools as ft

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.extend
import jax.numpy as jnp
from jax.interpreters import ad, batching as batching_module, mlir

from .forward_jacobian import (
    count_inputs,
    differentiated,
    is_none,
    jvp_by_jacobian,
    with_leaves,
)

# Up to this many differentiated scalars the tangent is the forward-mode Jacobian: for the few
# unknowns of a fit or a parameter study one forward pass with a tangent each is cheaper than a
# checkpointed reverse pass (see docs/performance.md, "Hybrid models").
JACOBIAN_INPUTS = 32


def loop_jvp(solve, any_order, primals, tangents):
    """(`solve("lax", *primals)`'s full output, the tangent of its differentiable part), the
    tangent by the rule above; `tangents` mirrors `primals` with None where an input is not
    differentiated; `any_order(*primals)` is the full output, differentiable in every mode
    (the custom-JVP function whose rule calls this)."""
    if count_inputs(tangents) <= JACOBIAN_INPUTS:
        return jvp_by_jacobian(ft.partial(solve, "lax"), primals, tangents)
    treedef, p_leaves, which, t = differentiated(primals, tangents)
    rest = [None if i in which else leaf for i, leaf in enumerate(p_leaves)]
    diff = [p_leaves[i] for i in which]
    inputs = _Inputs(solve, any_order, treedef, which, None, _Box(), None, rest, diff)
    outputs, full, residuals = _checkpointed_primal(inputs)
    pullback_def = inputs.pullback_def.value
    shapes = jax.tree.map(lambda y: jax.ShapeDtypeStruct(y.shape, y.dtype), outputs)
    inputs = _Inputs(solve, any_order, treedef, which, shapes, pullback_def, residuals, rest, diff)
    tangent = eqxi.filter_primitive_bind(_tangent_p, inputs, t)
    return full, tangent


class _Box:
    """A value set while tracing (static, compared by identity)."""

    value: object = None


class _Inputs(eqx.Module):
    """The solve and its inputs, split into the differentiated leaves `diff` and the rest."""

    solve: object = eqx.field(static=True)
    any_order: object = eqx.field(static=True)
    treedef: object = eqx.field(static=True)
    which: tuple = eqx.field(static=True)
    shapes: object = eqx.field(static=True)  # of the differentiable outputs (without tracing)
    pullback_def: object = eqx.field(static=True)
    residuals: list | None  # the checkpointed primal's pullback (None until it has run)
    rest: list
    diff: list
    batch: tuple = eqx.field(static=True, default=())  # the batch axes every input leads with

    def primals(self, diff):
        return with_leaves(self.treedef, self.rest, self.which, diff)

    def outputs(self, kind, diff):
        return self.solve(kind, *self.primals(diff))[0]


@eqx.filter_custom_jvp
def _checkpointed_primal(inputs: _Inputs):
    """The primal by the checkpointed loop, keeping its checkpoints (the pullback's residuals)
    for the transpose: a reverse pass is then one forward and one backward sweep, as
    diffrax's. Returns (the differentiable outputs, the full output, the pullback's
    residuals); the pullback's structure goes to `inputs.pullback_def`."""
    outputs, pullback, full = jax.vjp(
        lambda d: inputs.solve("checkpointed", *inputs.primals(d)), inputs.diff, has_aux=True
    )
    residuals, pullback_def = jax.tree.flatten(pullback)
    # as arrays of rank ≥ 1: JAX may hand a constant scalar residual to the transpose as a
    # Python-number literal, which equinox's primitive rules take for a static input
    residuals = [jnp.reshape(r, (1,) + jnp.shape(r)) for r in residuals]
    inputs.pullback_def.value = pullback_def
    return outputs, full, residuals


@_checkpointed_primal.def_jvp
def _checkpointed_primal_jvp(primals, tangents):
    """Differentiated again (forward over reverse, reverse over reverse), which the
    checkpointed loop does not support: the outputs by the solve's own rule, one order up;
    the residuals' tangents are not needed (the rules differentiated again recompute from the
    inputs), so they are zero."""
    (inputs,), (inputs_dot,) = primals, tangents
    out = _checkpointed_primal(inputs)
    p = inputs.primals(inputs.diff)
    p_dot = _Inputs.primals(inputs_dot, inputs_dot.diff)
    _, full_dot = eqx.filter_jvp(inputs.any_order, p, p_dot)  # the same values as out[1]
    # the outputs only give `loop_jvp` their shapes: no tangent read
    outputs_dot = jax.tree.map(lambda _: None, out[0])
    return out, (outputs_dot, full_dot, jax.tree.map(lambda _: None, out[2]))


def _tangent(inputs: _Inputs, t):  # J·t, forward through the loop
    return jax.jvp(ft.partial(inputs.outputs, "lax"), (inputs.diff,), (t,))[1]


def _cotangent(inputs: _Inputs, ct, kind="checkpointed"):  # Jᵀ·ct, reverse through the loop
    if kind == "checkpointed":  # the pullback the primal kept
        residuals = [r[0] for r in inputs.residuals]
        (out,) = jax.tree.unflatten(inputs.pullback_def, residuals)(ct)
        return out
    _, pullback = jax.vjp(ft.partial(inputs.outputs, kind), inputs.diff)
    (out,) = pullback(ct)
    return out


# --- the primitives ------------------------------------------------------------------------------
#
# Batching: a batched primitive is the same primitive over inputs that all carry the batch axes
# in front (`_Inputs.batch`), its rules vmapped that many times. Every input is broadcast to the
# batch, the linear one too: its transpose is then JAX's of the broadcast (a sum over the batch),
# as a weight shared by every member of a `vmap` needs.


def _batched(rule, batch: tuple):
    for _ in batch:
        rule = eqx.filter_vmap(rule)  # arrays along their first axis, the rest as they are
    return rule


def _unbatched(inputs: _Inputs) -> _Inputs:
    return dataclasses.replace(inputs, batch=())


def _tangent_impl(inputs: _Inputs, t):
    return _batched(_tangent, inputs.batch)(_unbatched(inputs), t)


def _cotangent_impl(inputs: _Inputs, ct, kind="checkpointed"):
    rule = ft.partial(_cotangent, kind=kind)
    return _batched(rule, inputs.batch)(_unbatched(inputs), ct)


# The shapes of the rules' outputs, known without tracing the loop (which the lowering traces
# once more): a tangent has the outputs' shapes, a cotangent the differentiated inputs'.
def _tangent_shapes(inputs: _Inputs, t):
    return jax.tree.map(
        lambda x: jax.core.ShapedArray(inputs.batch + x.shape, x.dtype), inputs.shapes
    )


def _cotangent_shapes(inputs: _Inputs, ct):
    return jax.tree.map(lambda x: jax.core.ShapedArray(x.shape, x.dtype), inputs.diff)


def _zeros_like_tangents(primal, tangent):
    return jax.tree.map(
        lambda p, t: eqxi.materialise_zeros(p, t, allow_struct=True),
        primal,
        tangent,
        is_leaf=is_none,
    )


def _has_tangent(tree) -> bool:
    return any(t is not None for t in jax.tree.leaves(tree, is_leaf=is_none))


@eqxi.filter_primitive_jvp
def _tangent_jvp(primals, tangents):
    inputs, t = primals
    inputs_dot, t_dot = tangents
    out = eqxi.filter_primitive_bind(_tangent_p, inputs, t)
    if not _has_tangent(inputs_dot):  # linear in t: the same map
        t_dot = _zeros_like_tangents(t, t_dot)
        return out, eqxi.filter_primitive_bind(_tangent_p, inputs, t_dot)
    # second order: forward over forward through the loop
    inputs_dot = _zeros_like_tangents(inputs, inputs_dot)
    t_dot = _zeros_like_tangents(t, t_dot)
    _, out_dot = eqx.filter_jvp(_tangent_impl, (inputs, t), (inputs_dot, t_dot))
    return out, out_dot


@eqxi.filter_primitive_jvp
def _cotangent_jvp(primals, tangents):
    inputs, ct = primals
    inputs_dot, ct_dot = tangents
    out = eqxi.filter_primitive_bind(_cotangent_p, inputs, ct)
    if not _has_tangent(inputs_dot):
        ct_dot = _zeros_like_tangents(ct, ct_dot)
        return out, eqxi.filter_primitive_bind(_cotangent_p, inputs, ct_dot)
    # forward over reverse (a Hessian): the bounded loop, which forward mode can enter
    inputs_dot = _zeros_like_tangents(inputs, inputs_dot)
    ct_dot = _zeros_like_tangents(ct, ct_dot)
    bounded = ft.partial(_cotangent_impl, kind="bounded")
    _, out_dot = eqx.filter_jvp(bounded, (inputs, ct), (inputs_dot, ct_dot))
    return out, out_dot


def _transpose_to(primitive):
    @eqxi.filter_primitive_transpose(materialise_zeros=True)
    def transpose(inputs, cts_out):
        inputs, _ = inputs
        cts_in = eqxi.filter_primitive_bind(primitive(), inputs, cts_out)
        return jax.tree.map(lambda _: None, inputs), cts_in

    return transpose


def _batching_of(primitive):
    @eqxi.filter_primitive_batching
    def batching(args, axes):
        leaves, treedef = jax.tree.flatten(args)
        leaf_axes = treedef.flatten_up_to(axes)
        size = next(x.shape[a] for x, a in zip(leaves, leaf_axes) if a is not None)
        moved = [
            x
            if not eqx.is_array(x)
            else jnp.moveaxis(x, a, 0)
            if a is not None
            else jnp.broadcast_to(x, (size,) + jnp.shape(x))
            for x, a in zip(leaves, leaf_axes)
        ]
        inputs, linear = jax.tree.unflatten(treedef, moved)
        inputs = dataclasses.replace(inputs, batch=(size,) + inputs.batch)
        out = eqxi.filter_primitive_bind(primitive(), inputs, linear)
        return out, jax.tree.map(lambda _: 0, out)

    return batching


def _primitive(name, impl, shapes, jvp, transpose, batching):
    primitive = jax.extend.core.Primitive(name)
    primitive.multiple_results = True
    primitive.def_impl(eqxi.filter_primitive_def(impl))
    primitive.def_abstract_eval(eqxi.filter_primitive_def(shapes))
    ad.primitive_jvps[primitive] = jvp
    ad.primitive_transposes[primitive] = transpose
    batching_module.primitive_batchers[primitive] = batching
    mlir.register_lowering(
        primitive, mlir.lower_fun(eqxi.filter_primitive_def(impl), multiple_results=True)
    )
    return primitive


_tangent_p = _primitive(
    "diffsim_loop_tangent",
    _tangent_impl,
    _tangent_shapes,
    _tangent_jvp,
    _transpose_to(lambda: _cotangent_p),
    _batching_of(lambda: _tangent_p),
)
_cotangent_p = _primitive(
    "diffsim_loop_cotangent",
    _cotangent_impl,
    _cotangent_shapes,
    _cotangent_jvp,
    _transpose_to(lambda: _tangent_p),
    _batching_of(lambda: _cotangent_p),
)
