"""The adaptive loop of the Rosenbrock methods (`ds.Rosenbrock23`, `ds.Rodas5P`): stiff ODEs
and mass-matrix DAEs M y' = f(t, y), one Jacobian and one LU factorisation per attempted step.

The loop is diffsim's own adaptive loop (`adaptive_loop`, shared with the explicit pairs): a
bounded `while_loop` per member, so under `jax.vmap` every member keeps its own step sizes, and
tolerances are traced. The state is flattened into one vector for the linear algebra and
unflattened for the model. Derivatives in every mode by the forward-mode Jacobian of the loop:
forward mode runs through the Jacobian, the LU and the stages, and the step sizes are held
fixed. With `adjoint=diffrax.ForwardMode()` the loop is differentiated forward only, one
tangent per direction asked (a fit's Jacobian), without the rule that lets reverse mode
transpose it.
"""

import diffrax
import jax
import jax.numpy as jnp
from jax import lax
from jax.flatten_util import ravel_pytree

from .._compile import jit
from .._results import RESULTS
from .._solver.rosenbrock import (
    AbstractRosenbrock,
    apply_mass,
    factorise,
    flat_field,
    linearise,
)
from .adaptive_loop import Attempt, Method, run, run_any_order, solved
from .dae import consistency_error, mass_matrix_of, null_directions
from .families import Solved, SolveRequest, solves
from .step_control import check_adaptive_request, prepare


@solves(AbstractRosenbrock)
def solve_rosenbrock_family(solver: AbstractRosenbrock, request: SolveRequest) -> Solved:
    dt = check_adaptive_request(solver, request)
    forward = isinstance(request.adjoint, diffrax.ForwardMode)
    if request.adjoint != "auto" and not forward:
        raise ValueError(
            f"adjoint={request.adjoint!r} selects how diffrax differentiates its solves; "
            f"{type(solver).__name__} runs diffsim's own loop, differentiated in every mode "
            "by its forward-mode Jacobian: leave adjoint='auto' (or pass "
            "diffrax.ForwardMode() where only forward mode is asked for)"
        )
    if any(jnp.iscomplexobj(leaf) for leaf in jax.tree.leaves(request.y0)):
        raise TypeError(
            f"{type(solver).__name__} solves real states: split a complex state into its real "
            "and imaginary parts"
        )
    return _solve(
        solver,
        request.model,
        request.y0,
        request.ts,
        dt,
        request.events,
        max_steps=request.max_steps,
        dense=request.dense,
        forward=forward,
    )


@jit
def _solve(solver, model, y0, ts, dt0, events, *, max_steps: int, dense: bool, forward: bool):
    valid, model, y0, ts, controls = prepare(solver, solver.error_order, model, y0, ts, dt0)
    if model.mass_matrix is not None:
        # an inconsistent start is refused with its own code (simulate checks it eagerly too)
        consistent = consistency_error(model, ts[0], y0, controls.rtol, controls.atol) <= 1
    else:
        consistent = jnp.array(True)
    method = RosenbrockMethod(solver)
    if forward:
        # forward mode only (adjoint=diffrax.ForwardMode()): JAX's forward mode through the
        # loop, one tangent per direction asked; `run_any_order`'s rule takes the Jacobian
        # over every differentiated input so that reverse mode can transpose it, which costs
        # more where the solve has more inputs than the caller directions (a study's
        # unknowns set its parameters and initial states: Bruno's 13 unknowns are 25 inputs)
        stepper = method.stepper(model, y0)
        out = run(stepper, model, y0, ts, controls, events, max_steps=max_steps, dense=dense)
    else:
        out = run_any_order(
            method, model, y0, ts, controls, events, max_steps=max_steps, dense=dense
        )
    valid = valid & consistent
    code = jnp.where(consistent, RESULTS.successful, RESULTS.inconsistent_initial_state)
    attempts = out.accepted + out.rejected
    stats = {
        "num_steps": out.accepted,
        "num_rejected_steps": out.rejected,
        # vector field evaluations of the stages (each attempt also takes one Jacobian)
        "num_function_evals": attempts * solver.stages,
    }
    return solved(valid, out, stats, events, code_override=code)


class RosenbrockMethod(Method):
    """A Rosenbrock method as the adaptive loop steps it: the state flattened into one vector
    for the linear algebra, unflattened for the model and the outputs."""

    solver: AbstractRosenbrock

    def stepper(self, model, y0):
        return _RosenbrockStepper(self.solver, model, y0)


class _RosenbrockStepper:
    def __init__(self, solver, model, y0):
        y0_flat, self.unravel = ravel_pytree(y0)
        self.solver, self.model = solver, model
        self.error_order = solver.error_order
        self.dense_nodes = solver.interpolant_degree + 1
        self.f = flat_field(model, self.unravel)
        self.mass = mass_matrix_of(model, y0_flat.shape[0], y0_flat.dtype)
        self.algebraic = (
            None
            if self.mass is None
            else _algebraic_part(self.mass, banded=model.jacobian_bandwidth is not None)
        )

    def start(self, t, y):
        return None  # every step linearises anew at its start

    def attempt(self, t, h, y, carry) -> Attempt:
        solver, unravel = self.solver, self.unravel
        y_flat = ravel_pytree(y)[0]
        system = linearise(self.model, self.f, unravel, self.mass, t, y_flat)
        solve = factorise(system, h, solver.gamma)
        y1, error, dense = solver.attempt(system, t, y_flat, h, solve)
        error = _with_interpolant_defect(
            self.algebraic, solver, self.f, self.mass, solve, dense, t, h, y_flat, y1, error
        )

        def evaluate(t_save):
            return unravel(solver.interpolate(dense, y_flat, y1, (t_save - t) / h))

        return Attempt(unravel(y1), unravel(error), evaluate, None)


# where in a step the interpolant is checked: its error vanishes at both ends and changes sign
# inside (Rodas4's near θ = 1/2, Rodas5P's near 0.2 and 0.65), so one point in the middle
# would miss it
_DEFECT_POINTS = (0.25, 0.75)


def _algebraic_part(mass, *, banded: bool):
    """The projection of a residual onto the algebraic equations of M y' = f(t, y) (the left
    null space of M): by the singular value decomposition (once per solve), or, for a banded
    model (whose n may be large), its zero rows. Held constant: it only steers step sizes."""
    mass = lax.stop_gradient(mass)
    if banded:
        zero_rows = jnp.all(mass == 0, axis=1)
        return lambda r: jnp.where(zero_rows, r, 0)
    u, _, mask = null_directions(mass)
    return lambda r: u @ jnp.where(mask, u.T @ r, 0)


def _with_interpolant_defect(algebraic, solver, f, mass, solve, dense, t, h, y, y1, error):
    """The step's error estimate, raised component-wise to the error of its interpolant inside
    the step, measured by the interpolant's defect.

    Why: a Rosenbrock method's error estimate measures the step's end, which on a stiff
    problem can be far better than the inside of the step. (a) A DAE whose algebraic
    components move (0 = z − cos t): a stiffly accurate method satisfies the algebraic
    equations exactly at the step's end, the steps grow, and the interpolant is off by 1e-4
    inside (its order for algebraic components is one below the ODE's). (b) A stiff ODE on its
    slow manifold (y' = −λ(y − cos t) − sin t, λ = 1e6): the step ends are exact to 1e-12, the
    steps grew to 2.3, and Rodas5P's interpolant was off by 5e-2 at rtol 1e-4 (Rodas4's by
    0.6), reported successful. The defect of the interpolant y_θ, g = f(t_θ, y_θ) − M y_θ'
    (for a DAE its algebraic part P f, as P M = 0), mapped back to the state by one solve
    with the step's W = M/(hγ) − J (for stiff components W⁻¹g is the interpolant's error
    itself, for non-stiff ones hγ·g; Steinebach's dense-output error control), measures that
    error in the state's units. The two points batched: one more copy of the model a step."""
    thetas = jnp.asarray(_DEFECT_POINTS, h.dtype)

    def defect(theta):
        y_theta, slope = jax.jvp(
            lambda s: solver.interpolate(dense, y, y1, s), (theta,), (jnp.ones_like(theta),)
        )
        rate = f(t + theta * h, y_theta)
        if algebraic is not None:
            return solve(algebraic(rate))
        return solve(rate - apply_mass(mass, slope / h))

    worst = jnp.maximum(jnp.abs(error), jnp.max(jnp.abs(jax.vmap(defect)(thetas)), axis=0))
    # step sizes are held fixed in derivatives: the estimate carries none
    return lax.stop_gradient(worst)
