"""diffrax's SDE solvers (stochastic Runge–Kutta: ShARK, SRA1, SPaRK, SlowRK, …) stepped by
diffsim's fixed-step stochastic loop.

Each step hands the diffrax solver a one-step Brownian path holding the step's increment and,
for solvers that need them, its space-time (H ~ N(0, dt/12)) and space-time-time
(K ~ N(0, dt/720)) Lévy areas, all drawn from `fold_in(key, step)`. So the path depends on the
key and the step index only, as for `ds.EulerMaruyama`, and W is the very increment those
solvers get: `ds.DiffraxSDE(diffrax.Euler())` reproduces `ds.EulerMaruyama()`.
"""

from typing import ClassVar

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx

from .stochastic import AbstractStochasticSolver, brownian_increment, concrete_inputs


class DiffraxSDE(AbstractStochasticSolver):
    """A diffrax SDE solver as a fixed-step diffsim solver, e.g. `ds.DiffraxSDE(diffrax.ShARK())`
    (additive noise, strong order 1.5 on additive-noise problems in diffrax's terms).

    Diagonal noise needs a 1-D state (the diffusion becomes a diagonal operator); general noise
    (diffusion `y.shape + (m,)`) is a matrix times the m increments. The solver's own
    requirements on the noise (additive, commutative) are the user's to meet, as in diffrax.

    diffsim's SDEs are Itô equations; a solver that converges to the Stratonovich solution
    (diffrax's `AbstractStratonovichSolver`s: Heun, EulerHeun, ShARK, SRA1, SEA, SPaRK,
    GeneralShARK, SlowRK, ...) is given the drift of the Stratonovich equation with the same
    solution, f − ½ Σ_j Σ_k g_kj ∂g_ij/∂y_k (equal to f for additive noise), so every solver
    solves the same Itô equation.
    """

    solver: diffrax.AbstractSolver
    order: ClassVar[int] = 1

    def __init__(self, solver: diffrax.AbstractSolver):
        if not isinstance(solver, diffrax.AbstractSolver):
            raise TypeError(f"ds.DiffraxSDE(solver): expected a diffrax solver, got {solver!r}")
        self.solver = solver

    @property
    def strong_order(self) -> float:  # type: ignore[override]
        return float(self.solver.strong_order(None) or 0.5)

    @property
    def evals_per_step(self) -> int | None:  # type: ignore[override]
        """Drift evaluations of the wrapped method per step: its stages, 1 for the one-stage
        methods, None (left out of the stats) for a method this wrapper does not know."""
        tableau = getattr(self.solver, "tableau", None)
        if isinstance(tableau, diffrax.StochasticButcherTableau):
            return len(tableau.b_sol)
        if isinstance(tableau, diffrax.ButcherTableau):
            return tableau.num_stages
        if isinstance(self.solver, _ONE_STAGE):
            return 1
        return None

    def check_model(self, model, t0, y0) -> None:
        super().check_model(model, t0, y0)
        if model.noise == "diagonal" and jnp.ndim(y0) != 1:
            raise ValueError(
                f"DiffraxSDE with diagonal noise needs a 1-D state, got shape {jnp.shape(y0)}; "
                "flatten the state in the model, or use ds.EulerMaruyama / ds.Milstein"
            )
        if _additive_only(self.solver) and _diffusion_reads_state(model, t0, y0):
            # diffrax's own error ("Vector field of the diffusion term should be constant,
            # independent of y") names neither the solver nor the model
            name = type(self.solver).__name__
            raise ValueError(
                f"diffrax.{name}() solves SDEs with additive noise only (a diffusion "
                f"independent of y), and {type(model).__name__}'s diffusion depends on y at "
                "y0: use ds.DiffraxSDE(diffrax.SPaRK()) or ds.DiffraxSDE("
                "diffrax.GeneralShARK()), or ds.Milstein() / ds.EulerMaruyama()"
            )

    def noise(self, key, index, shape, dt):
        w = brownian_increment(key, index, shape, dt)
        levy = getattr(self.solver, "minimal_levy_area", diffrax.BrownianIncrement)
        if not issubclass(levy, diffrax.AbstractSpaceTimeLevyArea):
            return diffrax.BrownianIncrement(dt=dt, W=w)
        step_key = jax.random.fold_in(key, index)
        h = jnp.sqrt(dt / 12) * jax.random.normal(jax.random.fold_in(step_key, 1), shape, w.dtype)
        if not issubclass(levy, diffrax.AbstractSpaceTimeTimeLevyArea):
            return diffrax.SpaceTimeLevyArea(dt=dt, W=w, H=h)
        k = jnp.sqrt(dt / 720) * jax.random.normal(jax.random.fold_in(step_key, 2), shape, w.dtype)
        return diffrax.SpaceTimeTimeLevyArea(dt=dt, W=w, H=h, K=k)

    def advance(self, model, t, y, dt, state, dw):
        path = _OneStep(t, t + dt, dw)
        if model.noise == "diagonal":

            def diffusion(t, y, args):
                return lx.DiagonalLinearOperator(model.diffusion(t, y))
        else:

            def diffusion(t, y, args):
                return model.diffusion(t, y)

        drift = model.drift
        if isinstance(self.solver, diffrax.AbstractStratonovichSolver):
            drift = _stratonovich_drift(model)
        terms = diffrax.MultiTerm(
            diffrax.ODETerm(lambda t, y, args: drift(t, y)),
            diffrax.ControlTerm(diffusion, path),
        )
        solver_state = self.solver.init(terms, t, t + dt, y, None)
        y1, *_ = self.solver.step(terms, t, t + dt, y, None, solver_state, made_jump=False)
        return y1, None


def _additive_only(solver) -> bool:
    """Whether a diffrax stochastic Runge–Kutta method takes additive noise only (its
    tableau's noise coefficients are diffrax's `AdditiveCoeffs`: ShARK, SRA1, SEA)."""
    tableau = getattr(solver, "tableau", None)
    return type(getattr(tableau, "coeffs_w", None)).__name__ == "AdditiveCoeffs"


def _diffusion_reads_state(model, t0, y0) -> bool:
    """Whether the diffusion's derivative in y at (t0, y0) is nonzero (checked where the
    inputs are concrete; a traced solve is left to diffrax's own check)."""
    if not concrete_inputs(model, t0, y0):
        return False
    _, slope = jax.jvp(lambda x: model.diffusion(t0, x), (y0,), (jnp.ones_like(y0),))
    return bool(jnp.any(slope != 0))


def _stratonovich_drift(model):
    """The drift f − ½ c of the Stratonovich equation with the Itô model's solution, where
    c_i = Σ_j Σ_k g_kj ∂g_ij/∂y_k (Kloeden & Platen, eq. 4.9.7): diffsim's models are Itô
    equations, and most of diffrax's SDE solvers (Heun, ShARK, SPaRK, SlowRK, ...) converge to
    the Stratonovich solution of the equation they are given. c is 0 for additive noise."""

    def drift(t, y):
        g = lambda y: model.diffusion(t, y)  # noqa: E731
        if model.noise == "diagonal":
            # g_i dW_i: only the diagonal of ∂g/∂y enters (c_i = g_i ∂g_i/∂y_i)
            jacobian = jax.jacfwd(g)(y)
            size = jnp.size(y)
            diagonal = jnp.diagonal(jnp.reshape(jacobian, (size, size))).reshape(jnp.shape(y))
            correction = g(y) * diagonal
        else:
            columns = jnp.moveaxis(g(y), -1, 0)  # (m,) + y.shape: column j of g

            def along(column, j):  # Σ_k g_kj ∂g_ij/∂y_k, the derivative of column j along it
                return jnp.take(jax.jvp(g, (y,), (column,))[1], j, axis=-1)

            correction = jnp.sum(jax.vmap(along)(columns, jnp.arange(columns.shape[0])), axis=0)
        return model.drift(t, y) - 0.5 * correction

    return drift


# diffrax's SDE methods of one drift evaluation per step (and no tableau to count stages in)
_ONE_STAGE = (
    diffrax.Euler,
    diffrax.EulerHeun,
    diffrax.ItoMilstein,
    diffrax.StratonovichMilstein,
)


class _OneStep(diffrax.AbstractBrownianPath):
    """The Brownian path over one step, known only through its increment (and Lévy areas)."""

    t0: jax.Array
    t1: jax.Array
    increment: diffrax.AbstractBrownianIncrement
    levy_area: type = eqx.field(static=True, default=diffrax.BrownianIncrement)

    def evaluate(self, t0, t1=None, left=True, use_levy=False):
        return self.increment if use_levy else self.increment.W
