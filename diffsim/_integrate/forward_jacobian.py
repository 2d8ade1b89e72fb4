"""Derivatives of a solve whose loop is a `while_loop` of run-time length (the adaptive loops):
the tangent J·t, with J the Jacobian of the solve's outputs taken by forward mode.

Why: JAX differentiates a `while_loop` forward natively but cannot transpose it, and a loop
whose length is only known at run time has no cheap transposable form (diffrax's DirectAdjoint
runs nested scans over `max_steps`, slow to compile and to run; its RecursiveCheckpointAdjoint
is a custom_vjp, which forward mode cannot enter). J·t is linear in t with J computed from the
primals alone, so JAX transposes it for reverse mode (`jax.grad` is Jᵀ·ct) and differentiates
the loop again forward for second order (`jax.hessian` is forward over reverse). It costs one
forward pass with as many tangents as inputs, which for the few inputs of a fit or a parameter
study is less than one reverse pass through a checkpointed loop; the step sizes are held fixed
under differentiation (`lax.stop_gradient` in the controllers), as diffrax's PID controller
holds them."""

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree


def is_none(x) -> bool:
    return x is None


def count_inputs(tangents) -> int:
    """The number of differentiated scalars among `tangents` (None: not differentiated)."""
    return sum(t.size for t in jax.tree.leaves(tangents, is_leaf=is_none) if t is not None)


def differentiated(primals, tangents):
    """`primals` split by `tangents` (None where an input is not differentiated): (the
    structure, every primal leaf, the indices of the differentiated ones, their tangents)."""
    t_leaves, treedef = jax.tree.flatten(tangents, is_leaf=is_none)
    p_leaves = treedef.flatten_up_to(primals)
    which = tuple(i for i, t in enumerate(t_leaves) if t is not None)
    return treedef, p_leaves, which, [t_leaves[i] for i in which]


def with_leaves(treedef, p_leaves, which, new):
    """The primals with the leaves at `which` replaced by `new`."""
    leaves = list(p_leaves)
    for i, leaf in zip(which, new):
        leaves[i] = leaf
    return treedef.unflatten(leaves)


def jvp_by_jacobian(solve, primals, tangents):
    """(`solve(*primals)`'s full output, the tangent of its differentiable part) where
    `solve(*args)` returns (the inexact outputs to differentiate, the full output) and
    `tangents` mirrors `primals` with None where an input is not differentiated."""
    treedef, p_leaves, which, t_list = differentiated(primals, tangents)
    x, unravel = ravel_pytree([p_leaves[i] for i in which])
    t_flat, _ = ravel_pytree(t_list)

    def outputs(x):
        return solve(*with_leaves(treedef, p_leaves, which, unravel(x)))

    def column(direction):  # (outputs, their tangent along `direction`, the full output)
        return jax.jvp(outputs, (x,), (direction,), has_aux=True)

    basis = jnp.eye(x.size, dtype=x.dtype)
    _, jacobian, full = jax.vmap(column, out_axes=(None, -1, None))(basis)
    tangent = jax.tree.map(lambda j: j @ t_flat.astype(j.dtype), jacobian)
    return full, tangent
