"""The lean adaptive loop of the explicit Runge–Kutta pairs (Tsit5, Dopri5, Dopri8, and any
diffrax ERK with a plain Butcher tableau): the solve `simulate` runs for them, with and without
events, differentiated or not (forward mode through it, see `adaptive._jvp_by_jacobian` and
`adaptive_loop.run_any_order`).

Without events it follows diffrax's `diffeqsolve` with a `PIDController` (integral control, its
defaults) step for step, given the same first step (`simulate` passes Hairer's, see
`initial_step`): the error norm (RMS of the error over `atol + rtol·max(|y0|, |y1|)`), step
factors (safety 0.9, within [0.2, 10], at most 0.9 after a rejection), clipping of the last step
to t1, and the method's own dense output at the save times, so the two agree to round-off. With
events it finds the earliest crossing of any condition in an accepted step on that dense output
(diffrax takes the first condition in list order that changed sign). What it leaves out is
what `simulate` does not use there: dense-output storage, progress meters, jumps, SDE terms and
diffrax's adjoints (`loop_derivatives` gives its derivative rule). Under `jax.vmap` it runs
several times faster than diffrax's loop (docs/performance.md, "Lorenz ensemble, adaptive
Tsit5 under vmap").
"""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jax_core

from .._solver.tableau import ButcherTableau, combine
from .adaptive_loop import Attempt, Method, run
from .step_control import Controls, scale_tree


class ExplicitPair(Method):
    """An explicit pair (a diffrax ERK with a Butcher tableau) as the adaptive loop steps it."""

    inner: diffrax.AbstractERK

    def stepper(self, model, y0):
        stepper = _PairStepper(self.inner, model.vector_field)
        stepper.loop_stages = is_costly(model.vector_field, y0)
        return stepper


# A vector field costly to compile has its stages taken by a loop (`_looped_stages`): one copy of
# it in the compiled step instead of one a stage, at a run-time price. Measured (one process
# each, this project's 2-core CPU, Tsit5):
#   - experiments/bench/hybrid.py's UDE gradient (an MLP inside Lotka–Volterra): compile
#     6.0 → 3.6 s at 1e3 weights, 4.4 → 3.4 s at 1e4; run (interleaved medians) 1.01 → 1.07 ms
#     and 1.21 → 1.64 ms, and 3.6 → 4.8 ms at 1e5 weights. The loop costs ~1.3× the run time
#     whatever the width (the weights' cotangent is summed stage by stage), so the compile time
#     it saves (1.5–2.5 s) pays for it up to ~30,000 gradients at 1e3 weights, ~4,000 at 1e4,
#     ~1,500 at 1e5: matrices up to COSTLY_MATRIX[1] entries (a 128-wide layer) take the loop.
#   - Zheng's SBML model (15 states, 536 operations): compile of a 46-parameter gradient
#     37.3 → 9.5 s (run 850 → 741 ms), of the solve 3.1 → 1.6 s (run 56 → 121 ms).
#   - a 3-state Lorenz system: compiles no faster, runs 1.8× slower (under vmap and
#     differentiated): small fields keep their stages written out.
COSTLY_MATRIX = (256, 16384)  # [lower, upper) entries of a matrix in a product
COSTLY_OPERATIONS = 400


def is_costly(vector_field, y0) -> bool:
    """Whether `vector_field(t, y)` at states like y0 is costly to compile (see above): a
    matrix product with a matrix in `COSTLY_MATRIX` (a neural network's layer), or at least
    `COSTLY_OPERATIONS` operations. One extra trace of the field, no compilation."""
    t = jax.ShapeDtypeStruct((), jnp.result_type(float))
    y = jax.tree.map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)), y0)
    jaxpr = jax.make_jaxpr(vector_field)(t, y).jaxpr
    operations, largest = 0, 0
    for eqn in _equations(jaxpr):
        operations += 1
        if eqn.primitive.name in ("dot_general", "conv_general_dilated"):
            sizes = sorted(int(np.prod(v.aval.shape)) for v in eqn.invars)
            if sizes[0] > 1:  # not a scaling by a scalar
                largest = max(largest, sizes[-1])
    if largest >= COSTLY_MATRIX[1]:
        return False
    return largest >= COSTLY_MATRIX[0] or operations >= COSTLY_OPERATIONS


def _equations(jaxpr):
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for inner in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(inner, jax_core.ClosedJaxpr):
                    yield from _equations(inner.jaxpr)
                elif isinstance(inner, jax_core.Jaxpr):
                    yield from _equations(inner)


# the degree + 1 of each pair's interpolant in θ (Tsit5's and Dopri5's are quartic, Dopri8's of
# degree 7); another diffrax ERK is sampled at 8 nodes, exact up to degree 7
_DENSE_NODES = {diffrax.Tsit5: 5, diffrax.Dopri5: 5, diffrax.Dopri8: 8}


class _PairStepper:
    loop_stages = False  # whether the stages are taken by a loop (`is_costly`)

    def __init__(self, inner, vector_field):
        self.inner, self.vector_field = inner, vector_field
        self.tableau = ButcherTableau.from_diffrax(inner.tableau)
        self.error_order = inner.order(diffrax.ODETerm(vector_field))
        self.dense_nodes = _DENSE_NODES.get(type(inner), 8)

    def start(self, t, y):
        return self.vector_field(t, y)  # the first stage of the next attempt

    def attempt(self, t, h, y, f_y) -> Attempt:
        """One step of the pair: the new state, its error estimate, the dense output from the
        stages and the vector field at the new state."""
        tableau, vector_field = self.tableau, self.vector_field
        t_next = t + h
        # stages as increments combined with unit weight, y + Σ a·(h f), as diffrax combines
        # them (scaling the sum by h instead moves accept decisions that sit at round-off, in
        # float32 near its epsilon, off diffrax's)
        if self.loop_stages:
            ks = _looped_stages(tableau, vector_field, t, h, y, f_y)
        else:
            ks = [scale_tree(h, f_y)]
            for c, a in zip(tableau.c[1:], tableau.a):
                ks.append(scale_tree(h, vector_field(t + c * h, combine(y, 1, a, ks))))
        y1 = combine(y, 1, tableau.b, ks)
        error = combine(jax.tree.map(jnp.zeros_like, y), 1, tableau.b_error, ks)
        # the last stage of an FSAL pair is the vector field at y1
        f_y1 = scale_tree(1 / h, ks[-1]) if tableau.fsal else vector_field(t_next, y1)

        def evaluate(t_save):  # diffrax's interpolant of the method (built only when used)
            stages = jax.tree.map(lambda *k: jnp.stack(k), *ks)
            interpolation = self.inner.interpolation_cls(t0=t, t1=t_next, y0=y, y1=y1, k=stages)
            return interpolation.evaluate(t_save)

        return Attempt(y1, error, evaluate, f_y1)


def _looped_stages(tableau, vector_field, t, h, y, f_y) -> list:
    """The stages h·f of one step as `attempt` writes them out, taken by a `lax.scan` over
    the stages instead (one copy of the vector field in the compiled step; a loop that JAX
    differentiates in every mode), each stage's state from the lower triangle of the tableau
    as a row over every stage (the stages not reached yet are zeros there)."""
    stages = len(tableau.c)
    rows = np.zeros((stages - 1, stages))
    for i, row in enumerate(tableau.a):
        rows[i, : len(row)] = row
    k0 = scale_tree(h, f_y)
    buffer = jax.tree.map(lambda k: jnp.zeros((stages,) + k.shape, k.dtype).at[0].set(k), k0)

    def stage(buffer, inputs):
        i, c, row = inputs
        y_i = jax.tree.map(
            lambda y_leaf, ks: y_leaf + jnp.tensordot(row.astype(ks.dtype), ks, axes=1), y, buffer
        )
        k = scale_tree(h, vector_field(t + c * h, y_i))
        return jax.tree.map(lambda ks, k_leaf: ks.at[i].set(k_leaf), buffer, k), None

    # the nodes in the time's dtype, as the written-out stages' Python floats keep it
    nodes = jnp.asarray(tableau.c[1:], jnp.result_type(t))
    inputs = (jnp.arange(1, stages), nodes, jnp.asarray(rows))
    buffer, _ = jax.lax.scan(stage, buffer, inputs)
    return [jax.tree.map(lambda ks: ks[j], buffer) for j in range(stages)]


def solve_erk(
    inner, vector_field, y0, ts, controls: Controls, *, max_steps: int, kind: str = "lax"
):
    """Solve dy/dt = vector_field(t, y) from y0 at ts[0] without events, saving at every time
    in ts, with the step-size `controls` (first step `controls.dt0`, see `initial_step`), the
    loop run as `kind` (`step_control.step_loop`).

    Returns (ys, code, accepted, rejected), the fields of `adaptive._Segment`: `ys` (rows not
    reached hold inf, as diffrax's), `code` (a `RESULTS` value) and the step counts."""
    stepper = _PairStepper(inner, vector_field)
    stepper.loop_stages = is_costly(vector_field, y0)
    out = run(stepper, None, y0, ts, controls, None, max_steps=max_steps, kind=kind)
    return out.ys, out.code, out.accepted, out.rejected
