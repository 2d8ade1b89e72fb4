"""The adaptive loop of the Rosenbrock methods (`ds.Rosenbrock23`, `ds.Rodas5P`): stiff ODEs
and mass-matrix DAEs M y' = f(t, y), one Jacobian and one LU factorisation per attempted step.

The loop is diffsim's own (as the lean loop of the explicit pairs, with the same step-size
control, `step_control`): a bounded `while_loop` per member, so under `jax.vmap` every member
keeps its own step sizes, and tolerances are traced. The state is flattened into one vector for
the linear algebra and unflattened for the model. Derivatives in every mode by the forward-mode
Jacobian of the loop (`forward_jacobian`): the loop holds no custom rule inside, so forward mode
runs through the Jacobian, the LU and the stages, and the step sizes are held fixed.
"""

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax
from jax.flatten_util import ravel_pytree
from jaxtyping import Array, PyTree

from .._results import RESULTS
from .._solver.rosenbrock import AbstractRosenbrock, factorise, flat_field, linearise
from .common import mask_invalid, nonfinite_code
from .dae import consistency_error, mass_matrix_of
from .families import Solved, SolveRequest, solves
from .forward_jacobian import jvp_by_jacobian
from .step_control import (
    advance_time,
    check_adaptive_request,
    Controls,
    empty_outputs,
    end_floor,
    error_ratio,
    final_code,
    first_step,
    next_step,
    prepare,
    save_dense,
    unfinished,
)


@solves(AbstractRosenbrock)
def solve_rosenbrock_family(solver: AbstractRosenbrock, request: SolveRequest) -> Solved:
    dt = check_adaptive_request(solver, request)
    if request.adjoint != "auto":
        raise ValueError(
            f"adjoint={request.adjoint!r} selects how diffrax differentiates its solves; "
            f"{type(solver).__name__} runs diffsim's own loop, differentiated in every mode "
            "by its forward-mode Jacobian: leave adjoint='auto'"
        )
    if any(jnp.iscomplexobj(leaf) for leaf in jax.tree.leaves(request.y0)):
        raise TypeError(
            f"{type(solver).__name__} solves real states: split a complex state into its real "
            "and imaginary parts"
        )
    return _solve(solver, request.model, request.y0, request.ts, dt, max_steps=request.max_steps)


@eqx.filter_jit
def _solve(solver, model, y0, ts, dt0, *, max_steps: int):
    valid, model, y0, ts, controls = prepare(solver, solver.error_order, model, y0, ts, dt0)
    if model.mass_matrix is not None:
        # an inconsistent start is refused with its own code (simulate checks it eagerly too)
        consistent = consistency_error(model, ts[0], y0, controls.rtol, controls.atol) <= 1
    else:
        consistent = jnp.array(True)
    out = _rosenbrock_any_order(solver, model, y0, ts, controls, max_steps=max_steps)
    code = jnp.where(out.code == RESULTS.successful, nonfinite_code(out.ys), out.code)
    code = jnp.where(consistent, code, RESULTS.inconsistent_initial_state)
    result = jnp.where(valid, code, RESULTS.invalid_input).astype(jnp.int32)
    attempts = out.accepted + out.rejected
    stats = {
        "num_steps": out.accepted,
        "num_rejected_steps": out.rejected,
        # vector field evaluations of the stages (each attempt also takes one Jacobian)
        "num_function_evals": attempts * solver.stages,
    }
    return Solved(mask_invalid(valid & consistent, out.ys), stats, result)


class _Out(NamedTuple):
    ys: PyTree  # the states at ts (inf where not reached)
    code: Array  # int32 RESULTS code
    accepted: Array  # int32
    rejected: Array  # int32


@eqx.filter_custom_jvp
def _rosenbrock_any_order(solver, model, y0, ts, controls, *, max_steps):
    return _loop(solver, model, y0, ts, controls, max_steps=max_steps)


@_rosenbrock_any_order.def_jvp
def _rosenbrock_any_order_jvp(primals, tangents, *, max_steps):
    def solve(*args):
        out = _loop(*args, max_steps=max_steps)
        return out.ys, out

    out, ys_tangent = jvp_by_jacobian(solve, primals, tangents)
    return out, _Out(ys=ys_tangent, code=None, accepted=None, rejected=None)


class _State(NamedTuple):
    """The carry of the Rosenbrock loop."""

    t: Array  # the time reached (the start of the next attempt)
    t_next: Array  # where the next attempt ends
    y: Array  # the flat state at t
    ys: PyTree  # the output buffer (times,) + state shape; inf where not reached
    saved: Array  # int32: the number of output rows written
    accepted: Array  # int32
    rejected: Array  # int32
    code: Array  # int32 RESULTS code


def _loop(solver, model, y0, ts, controls: Controls, *, max_steps: int) -> _Out:
    y0_flat, unravel = ravel_pytree(y0)
    dtype = ts.dtype
    t0, t1 = ts[0], ts[-1]
    t1_floor = end_floor(t1)
    f = flat_field(model, unravel)
    mass = mass_matrix_of(model, y0_flat.shape[0], dtype)

    def step(state: _State) -> _State:
        t, t_next, y, code = state.t, state.t_next, state.y, state.code
        h = t_next - t
        system = linearise(model, f, unravel, mass, t, y)
        y1, error, dense = solver.attempt(system, t, y, h, factorise(system, h, solver.gamma))
        ratio = error_ratio(y, y1, error, controls)
        keep, dt, code = next_step(t, t_next, ratio, solver.error_order, controls, code)

        def evaluate(t_save):
            return unravel(solver.interpolate(dense, y, y1, (t_save - t) / h))

        saved, ys = save_dense(ts, keep, t_next, unravel(y1), state.saved, state.ys, evaluate)
        t_new, t_next_new = advance_time(keep, t, t_next, dt, t1, t1_floor)
        return _State(
            t=t_new,
            t_next=t_next_new,
            y=jnp.where(keep, y1, y),
            ys=ys,
            saved=saved,
            accepted=state.accepted + keep.astype(jnp.int32),
            rejected=state.rejected + (~keep).astype(jnp.int32),
            code=code,
        )

    def going(state: _State):
        steps = state.accepted + state.rejected
        return unfinished(state.t, t1, steps, max_steps, state.code)

    zero = jnp.array(0, jnp.int32)
    init = _State(
        t=t0,
        t_next=jnp.minimum(t0 + first_step(controls, dtype), t1),
        y=y0_flat,
        ys=empty_outputs(y0, ts.shape[0]),
        saved=jnp.array(1, jnp.int32),
        accepted=zero,
        rejected=zero,
        code=jnp.array(RESULTS.successful, jnp.int32),
    )
    final = lax.while_loop(going, step, init)
    return _Out(final.ys, final_code(final.t, t1, final.code), final.accepted, final.rejected)
