"""Derivatives through every solver: every transformation against closed forms, finite
differences and each other (float64).

The problem is the damped oscillator x'' = -omega^2 x - 2 gamma x', whose solution is known in
closed form (`HarmonicOscillator.analytic_solution`); the derivatives of that closed form by
autodiff are the exact reference. Inputs theta = (omega, gamma, x0, v0, t1): parameters, initial
state and the final time all at once; outputs x, v at t1/2 and t1.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import ALL_SOLVERS, solver_id

import diffsim as ds
import models

THETA = jnp.array([2.0, 0.3, 1.0, -0.5, 1.5])


def _uses_damping(solver):
    return not isinstance(solver, ds.AbstractSymplectic)  # splittings need v-free forces


def _model(theta, damped):
    return models.HarmonicOscillator(omega=theta[0], damping=theta[1] if damped else None)


def _outputs(solver, **options):
    damped = _uses_damping(solver)
    # Fixed step: the step count per output interval, from the method's order, so that the
    # discretisation error of the derivatives is ~1e-4 (order 1), ~1e-6 (2), ~1e-9 (4).
    steps = {1: 2000, 2: 500}.get(solver.order, 100)

    def outputs(theta):
        ts = jnp.stack([0.0, theta[4] / 2, theta[4]])
        kwargs = {"steps_per_save": steps} if isinstance(solver, ds.AbstractFixedStepSolver) else {}
        sol = ds.simulate(_model(theta, damped), theta[2:4], ts, solver=solver, **kwargs, **options)
        return sol.ys[1:].ravel()

    def exact(theta):
        ts = jnp.stack([0.0, theta[4] / 2, theta[4]])
        return _model(theta, damped).analytic_solution(theta[2:4], ts)[1:].ravel()

    return outputs, exact


def _tolerance(solver):
    """Agreement expected with the closed form: the method's discretisation error (fixed step,
    steps chosen above) or a multiple of rtol = 1e-10 (adaptive), amplified by differentiation."""
    if isinstance(solver, ds.Kvaerno5):
        # The implicit method's Newton iterations (tolerance tied to rtol) also enter the
        # tangents: second derivatives with respect to t1 are off by 2e-5 relative (measured).
        return 1e-4
    if isinstance(solver, ds.AbstractAdaptiveSolver):
        return 1e-6
    return {1: 2e-2, 2: 1e-4}.get(solver.order, 1e-6)


SOLVERS = [
    s
    if not isinstance(s, ds.AbstractAdaptiveSolver)
    else eqx.tree_at(lambda s: (s.rtol, s.atol), s, (jnp.asarray(1e-10), jnp.asarray(1e-10)))
    for s in ALL_SOLVERS
]
TSIT5 = next(s for s in SOLVERS if isinstance(s, ds.Tsit5))
KVAERNO5 = next(s for s in SOLVERS if isinstance(s, ds.Kvaerno5))
# Dopri5 and Dopri8 take the same code path as Tsit5 (explicit diffrax solver, same adjoint) and
# each costs ~50 s of compilation here: they run with the slow extras (pytest -m slow).
# The Runge–Kutta tableaus other than RK4 (Euler, Heun, Midpoint, Ralston, RK38) run the same
# `AbstractRungeKutta.step` and SymplecticEuler the same splitting code as Leapfrog/Yoshida4:
# by default RK4, the higher-order splittings and the adaptive solvers run, the rest (~75 s of
# compilation) with the slow extras.
# The Rosenbrock methods' derivatives in every mode run by default in test_stiff.py (against a
# closed form of a stiff problem); here they are slow extras.
_SLOW_DERIVATIVES = (
    ds.AbstractRosenbrock,
    ds.Dopri5,
    ds.Dopri8,
    ds.Euler,
    ds.Heun,
    ds.Midpoint,
    ds.Ralston,
    ds.RK38,
    ds.SymplecticEuler,
)
SOLVER_PARAMS = [
    pytest.param(s, marks=pytest.mark.slow) if isinstance(s, _SLOW_DERIVATIVES) else s
    for s in SOLVERS
]
# The adaptive Hessian (forward over the DirectAdjoint reverse mode) runs by default for
# Kvaerno5; Tsit5's takes the same path (~26 s): a slow extra.
HESSIAN_PARAMS = [
    pytest.param(s, marks=pytest.mark.slow) if isinstance(s, ds.Tsit5) else s for s in SOLVER_PARAMS
]
# Kvaerno5's first derivatives (~40 s to compile) are slow extras too; its Hessian, forward over
# reverse mode, runs by default and exercises both modes of the implicit solve.
FIRST_DERIVATIVE_PARAMS = [
    pytest.param(s, marks=pytest.mark.slow) if isinstance(s, ds.Kvaerno5) else s
    for s in SOLVER_PARAMS
]


@pytest.mark.parametrize("solver", FIRST_DERIVATIVE_PARAMS, ids=solver_id)
def test_first_derivatives_every_transformation(solver):
    outputs, exact = _outputs(solver)
    tol = _tolerance(solver)
    reference = jax.jacfwd(exact)(THETA)
    forward = jax.jacfwd(outputs)(THETA)
    reverse = jax.jacrev(outputs)(THETA)
    np.testing.assert_allclose(forward, reference, atol=tol * 10, rtol=tol)
    # Forward and reverse mode differentiate the same computation: agreement to round-off.
    np.testing.assert_allclose(forward, reverse, atol=1e-9, rtol=1e-9)
    direction = jnp.array([0.3, -0.2, 0.5, 0.1, 0.7])
    value, tangent = jax.jvp(outputs, (THETA,), (direction,))
    np.testing.assert_allclose(tangent, forward @ direction, atol=1e-9, rtol=1e-9)
    cotangent = jnp.linspace(-1.0, 1.0, value.shape[0])
    (pullback,) = jax.vjp(outputs, THETA)[1](cotangent)
    np.testing.assert_allclose(pullback, cotangent @ forward, atol=1e-9, rtol=1e-9)
    loss_value, grad = jax.value_and_grad(lambda t: jnp.sum(outputs(t) ** 2))(THETA)
    np.testing.assert_allclose(grad, 2 * value @ forward, atol=1e-9, rtol=1e-9)
    np.testing.assert_allclose(loss_value, jnp.sum(value**2), rtol=1e-12)


@pytest.mark.parametrize("solver", HESSIAN_PARAMS, ids=solver_id)
def test_hessian_every_solver(solver):
    outputs, exact = _outputs(solver)

    def loss(theta):
        return jnp.sum(outputs(theta) ** 2)

    hessian = jax.jit(jax.hessian(loss))(THETA)  # one compiled program, not op-by-op dispatch
    reference = jax.hessian(lambda t: jnp.sum(exact(t) ** 2))(THETA)
    tol = _tolerance(solver)
    np.testing.assert_allclose(hessian, reference, atol=tol * 10, rtol=tol)
    np.testing.assert_allclose(hessian, hessian.T, atol=1e-8)
    if isinstance(solver, ds.AbstractFixedStepSolver):
        # Central differences of the exact gradient of the same discretisation: h = 1e-5 gives
        # truncation ~h^2 * |d^4 L| ~ 1e-9 and round-off ~eps/h ~ 1e-11.
        h = 1e-5
        grad = jax.jit(jax.grad(loss))
        columns = [(grad(THETA + h * e) - grad(THETA - h * e)) / (2 * h) for e in jnp.eye(5)]
        np.testing.assert_allclose(hessian, jnp.stack(columns, axis=1), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(
    "solver",
    [ds.RK4(), ds.Leapfrog(), pytest.param(TSIT5, marks=pytest.mark.slow)],  # Tsit5: ~30 s
    ids=solver_id,
)
def test_vmap_of_grad_equals_grad_of_vmap(solver):
    outputs, _ = _outputs(solver)

    def loss(theta):
        return jnp.sum(outputs(theta) ** 2)

    thetas = THETA[None, :] * jnp.array([[1.0], [1.1], [0.9]])
    per_member = jax.vmap(jax.grad(loss))(thetas)
    of_sum = jax.grad(lambda ts: jnp.sum(jax.vmap(loss)(ts)))(thetas)
    # Adaptive members may take slightly different steps batched or not (see test_conformance).
    tol = 1e-6 if isinstance(solver, ds.AbstractAdaptiveSolver) else 1e-10
    np.testing.assert_allclose(per_member, of_sum, rtol=tol, atol=tol)


# an explicit block size runs the same blocked loop as "auto" with another length: a slow extra
@pytest.mark.parametrize("checkpoint", ["auto", None, pytest.param(7, marks=pytest.mark.slow)])
def test_checkpointing_does_not_change_derivatives(checkpoint):
    model = models.DampedPendulum(length=1.0, gravity=9.81, damping=0.1)
    ts = jnp.array([0.0, 0.3, 2.0])  # uneven intervals: 30 and 170 steps of 0.01

    def loss(length, checkpoint):
        m = eqx.tree_at(lambda m: m.length, model, length)
        ys = ds.simulate(
            m, jnp.array([1.0, 0.0]), ts, solver=ds.RK4(), dt=0.01, checkpoint=checkpoint
        ).ys
        return jnp.sum(ys**2)

    length = jnp.asarray(1.3)
    loss = jax.jit(loss, static_argnums=1)
    np.testing.assert_allclose(
        jax.grad(loss)(length, checkpoint), jax.grad(loss)(length, None), rtol=1e-12
    )
    np.testing.assert_allclose(
        jax.hessian(loss)(length, checkpoint), jax.hessian(loss)(length, None), rtol=1e-10
    )


def test_reverse_only_adjoint_says_which_option_makes_forward_mode_work():
    solver = TSIT5

    def f(theta):
        ts = jnp.stack([0.0, theta[4]])
        return ds.simulate(
            _model(theta, True), theta[2:4], ts, solver=solver, adjoint="checkpoint"
        ).ys

    with pytest.raises(TypeError, match="adjoint='auto'"):
        jax.jacfwd(f)(THETA)


def test_option_errors():
    model = models.HarmonicOscillator()
    ts = jnp.linspace(0.0, 1.0, 3)
    with pytest.raises(ValueError, match="checkpoint must be"):
        ds.simulate(model, jnp.ones(2), ts, solver=ds.RK4(), dt=0.01, checkpoint=0)
    with pytest.raises(ValueError, match="adjoint applies to adaptive solvers"):
        ds.simulate(model, jnp.ones(2), ts, solver=ds.RK4(), dt=0.01, adjoint="checkpoint")
    with pytest.raises(ValueError, match="adjoint must be"):
        ds.simulate(model, jnp.ones(2), ts, solver=ds.Tsit5(), adjoint="magic")
    with pytest.raises(ValueError, match="apply to fixed-step solvers"):
        ds.simulate(model, jnp.ones(2), ts, solver=ds.Tsit5(), checkpoint=10)


def _kepler_loss(mu):
    model = models.Kepler(mu=mu)
    ts = np.array([0.0, 2.0])  # concrete inside jit: the fixed steps are planned from it
    ys = ds.simulate(model, model.initial_state(0.3), ts, solver=ds.Yoshida4(), dt=0.01).ys
    return jnp.sum(ys[-1] ** 2)


def _pendulum_loss(length2):
    model = models.DoublePendulum(length2=length2)
    y0 = jnp.array([[0.5, 0.2], [0.0, 0.0]])
    ts = np.array([0.0, 1.0])
    return jnp.sum(ds.simulate(model, y0, ts, solver=ds.RK4(), dt=0.01).ys[-1] ** 2)


# Equations of motion from jax.grad (Kepler) and jax.hessian (double pendulum) are themselves
# differentiated twice with respect to the parameters; checked against finite differences. The
# Lagrangian case (~20 s to compile the Hessian of nested Hessians) is a slow extra.
@pytest.mark.parametrize(
    "loss, x",
    [(_kepler_loss, 1.2), pytest.param(_pendulum_loss, 0.8, marks=pytest.mark.slow)],
    ids=["hamiltonian", "lagrangian"],
)
def test_second_derivatives_of_hamiltonian_and_lagrangian_parameters(loss, x):
    _check_second_derivative(loss, jnp.asarray(x))


def _check_second_derivative(loss, x):
    value, grad = jax.jit(loss), jax.jit(jax.grad(loss))
    h = 1e-4  # central difference of the exact gradient; truncation ~h^2 ~ 1e-8 relative
    fd = (grad(x + h) - grad(x - h)) / (2 * h)
    np.testing.assert_allclose(jax.jit(jax.hessian(loss))(x), fd, rtol=1e-6)
    fd1 = (value(x + h) - value(x - h)) / (2 * h)
    np.testing.assert_allclose(grad(x), fd1, rtol=1e-6)


def test_nbody_gradient_finite_at_close_approach():
    # Two bodies passing within 1e-3 of each other (no softening): a finite, correct gradient.
    model = models.NBody(masses=jnp.array([1.0, 1e-3]))

    def loss(offset):
        q = jnp.array([[0.0, 0.0], [-0.1, offset]])
        p = jnp.array([[0.0, 0.0], [1e-3 * 1.0, 0.0]])  # the light body moves at speed 1
        ys = ds.simulate(model, (q, p), jnp.array([0.0, 0.2]), solver=ds.Leapfrog(), dt=1e-4).ys
        return jnp.sum(ys[0][-1, 1])

    g = jax.grad(loss)(jnp.asarray(1e-3))
    assert jnp.isfinite(g)


def test_no_recompilation_when_differentiated_values_change():
    model = models.DampedPendulum(length=1.0, gravity=9.81, damping=0.1)
    ts = jnp.linspace(0.0, 1.0, 5)

    @eqx.filter_jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def grad(length):
        def loss(length):
            member = eqx.tree_at(lambda m: m.length, model, length)
            return jnp.sum(
                ds.simulate(member, jnp.array([1.0, 0.0]), ts, solver=ds.Tsit5()).ys ** 2
            )

        return jax.grad(loss)(length)

    for value in [1.0, 1.5, 2.0]:
        assert jnp.isfinite(grad(jnp.asarray(value)))


@pytest.mark.parametrize("mode", ["auto", "forward", "reverse"])
def test_sensitivity_against_closed_form(mode):
    model = models.HarmonicOscillator(omega=2.0, damping=0.3)
    y0 = jnp.array([1.0, -0.5])
    ts = jnp.linspace(0.0, 2.0, 5)
    sens = ds.sensitivity(model, y0, ts, solver=ds.RK4(), dt=1e-3, mode=mode)
    assert set(sens) == {"omega", "damping"}

    def exact(omega, damping, y0):
        return models.HarmonicOscillator(omega=omega, damping=damping).analytic_solution(y0, ts)

    # RK4 at h = 1e-3: the derivatives of the discrete solution match the exact ones to ~1e-11.
    np.testing.assert_allclose(sens["omega"], jax.jacfwd(exact, 0)(2.0, 0.3, y0), atol=1e-9)
    np.testing.assert_allclose(sens["damping"], jax.jacfwd(exact, 1)(2.0, 0.3, y0), atol=1e-9)
    by_y0 = ds.sensitivity(model, y0, ts, solver=ds.RK4(), dt=1e-3, wrt="y0", mode=mode)["y0"]
    np.testing.assert_allclose(by_y0, jax.jacfwd(exact, 2)(2.0, 0.3, y0), atol=1e-9)


def test_sensitivity_errors_and_mode_choice():
    model = models.HarmonicOscillator(omega=2.0, damping=0.3)
    with pytest.raises(ValueError, match="no parameter 'omgea'; it has: omega, damping"):
        ds.sensitivity(
            model, jnp.ones(2), jnp.linspace(0.0, 1.0, 3), solver=ds.RK4(), dt=0.1, wrt=("omgea",)
        )
    with pytest.raises(ValueError, match="mode must be"):
        ds.jacobian(jnp.sin, jnp.ones(3), mode="sideways")
    # Many inputs, one output: reverse mode; both modes give the same Jacobian.
    fn = lambda x: jnp.sum(jnp.sin(x) ** 2)  # noqa: E731
    x = jnp.linspace(0.0, 1.0, 7)
    np.testing.assert_allclose(ds.jacobian(fn, x), ds.jacobian(fn, x, mode="forward"), rtol=1e-14)


def test_sensitivity_of_a_model_with_named_parameters():
    """A `ds.ODE` with a dict of named parameters (the README's form): every floating entry by
    default, or named as `ds.fit` and `ds.sweep` name them ("k", "params.k"); dy/dk = −t e^{−kt}
    (it was refused: only dataclass fields were looked at)."""
    model = ds.ODE(lambda t, y, p: -p["k"] * y, {"k": 0.5})
    ts = jnp.linspace(0.0, 2.0, 5)
    exact = (-ts * jnp.exp(-0.5 * ts))[:, None]
    solver = ds.Tsit5(rtol=1e-10, atol=1e-12)
    every = ds.sensitivity(model, jnp.array([1.0]), ts, solver=solver)
    assert set(every) == {"k"}
    # Tsit5 at rtol 1e-10: the sensitivity carries the solve's error, well below 1e-8
    np.testing.assert_allclose(every["k"], exact, atol=1e-8)
    named = ds.sensitivity(model, jnp.array([1.0]), ts, solver=solver, wrt=("params.k",))
    np.testing.assert_allclose(named["params.k"], exact, atol=1e-8)
    with pytest.raises(ValueError, match=r"no parameter 'kk'; it has: k"):
        ds.sensitivity(model, jnp.array([1.0]), ts, solver=solver, wrt=("kk",))


def test_reverse_pass_rule_agrees_with_the_jacobian_rule_in_every_order(monkeypatch):
    """Adaptive solves with few inputs are differentiated by their forward-mode Jacobian (the
    lean loop for Tsit5), with many by a checkpointed reverse pass (its primal and transpose)
    and, for second order, a bounded loop (forward over reverse). Both hold the step sizes
    fixed, so the gradient and the Hessian agree to round-off."""
    from diffsim._integrate import loop_derivatives

    y0, ts = jnp.array([1.0, 0.0]), jnp.linspace(0.0, 10.0, 11)

    def loss(p, max_steps):
        model = models.DampedPendulum(length=p[0], gravity=p[1], damping=p[2])
        solver = ds.Tsit5(rtol=1e-8, atol=1e-8)
        ys = ds.simulate(model, y0 * p[0], ts, solver=solver, max_steps=max_steps).ys
        return jnp.sum(ys**2)

    def grad_and_hessian(p, max_steps):  # forward over reverse, the gradient as aux: one program
        def grad(q):
            g = jax.grad(loss)(q, max_steps)
            return g, g

        hessian, grad = jax.jacfwd(grad, has_aux=True)(p)
        return grad, hessian

    p = jnp.array([1.0, 9.81, 0.1])
    grad, hessian = grad_and_hessian(p, 100_000)
    # another max_steps: a new trace, which takes the reverse pass (no program is reused)
    monkeypatch.setattr(loop_derivatives, "JACOBIAN_INPUTS", 0)
    grad_direct, hessian_direct = grad_and_hessian(p, 99_999)
    np.testing.assert_allclose(grad, grad_direct, rtol=1e-10)
    np.testing.assert_allclose(
        hessian, hessian_direct, rtol=1e-10, atol=1e-10 * jnp.abs(hessian).max()
    )


def _neural_loss(solver, **options):
    """A loss of a model with 41 parameters (a damped oscillator whose damping passes through
    40 weights), above the count where the default rule switches to a reverse pass."""
    y0, ts = jnp.array([1.0, 0.5]), jnp.linspace(0.0, 5.0, 11)

    def field(t, y, w):
        return jnp.stack([y[1], -w[0] * y[0] - jnp.tanh(w[1:] @ jnp.linspace(0.0, 1.0, 40)) * y[1]])

    def loss(w):
        ys = ds.simulate(ds.ODE(field, w), y0, ts, solver=solver, **options).ys
        return jnp.sum(ys**2)

    return loss


WEIGHTS = jnp.concatenate([jnp.array([2.0]), 0.01 * jnp.arange(40.0)])

MANY_INPUT_CASES = {
    "Tsit5": dict(solver=ds.Tsit5(rtol=1e-9, atol=1e-9)),  # the lean loop
    "Rodas5P": dict(solver=ds.Rodas5P(rtol=1e-9, atol=1e-9)),  # the Rosenbrock loop
    # events in the explicit pairs' loop: a reset when x crosses 0.5 downwards
    "Dopri5 + event": dict(
        solver=ds.Dopri5(rtol=1e-9, atol=1e-9),
        events=ds.Event(lambda t, y: y[0] - 0.5, direction=-1, reset=lambda t, y: y * 0.9),
    ),
    "Kvaerno5 (diffrax's loop)": dict(solver=ds.Kvaerno5(rtol=1e-8, atol=1e-8)),
}


@pytest.mark.parametrize("case", MANY_INPUT_CASES, ids=str)
def test_many_inputs_reverse_pass_against_the_jacobian_rule_and_finite_differences(
    case, monkeypatch
):
    """41 inputs: the gradient by the checkpointed reverse pass equals the forward-mode
    Jacobian's (the same steps, round-off apart) and central differences (whose steps move
    with the inputs: agreement to the tolerance's order); under vmap, members that finish at
    different steps keep their own gradients (a finished member's discarded step must not
    leak NaN into the reverse pass)."""
    from diffsim._integrate import loop_derivatives

    loss = _neural_loss(**MANY_INPUT_CASES[case])
    gradient = jax.jit(jax.grad(loss))  # one program for every member alone
    grad = gradient(WEIGHTS)
    monkeypatch.setattr(loop_derivatives, "JACOBIAN_INPUTS", 1_000)
    # another max_steps: a new trace of the solve, which takes the Jacobian rule (the same
    # max_steps would reuse the traced solve of the reverse pass)
    options = {**MANY_INPUT_CASES[case], "max_steps": 99_999}
    jacobian_rule = jax.jit(jax.grad(_neural_loss(**options)))(WEIGHTS)
    np.testing.assert_allclose(grad, jacobian_rule, rtol=1e-9, atol=1e-12)
    # a batch of two members (w and 1.1 w, which take different steps) sharing the weights, as
    # a ds.Problem's experiments share them: the gradient of the batch's sum is the sum of the
    # members' gradients alone (a member that mixed in the other's, or NaN from a finished
    # member's discarded step, would break it)
    scales = jnp.array([1.0, 1.1])
    shared = jax.jit(jax.grad(lambda w: jnp.sum(jax.vmap(lambda c: loss(w * c))(scales))))
    np.testing.assert_allclose(
        shared(WEIGHTS), grad + 1.1 * gradient(1.1 * WEIGHTS), rtol=1e-9, atol=1e-12
    )
    direction = jnp.cos(jnp.arange(41.0))
    h = 1e-5
    difference = (loss(WEIGHTS + h * direction) - loss(WEIGHTS - h * direction)) / (2 * h)
    np.testing.assert_allclose(grad @ direction, difference, rtol=1e-5)


def test_reverse_pass_memory_does_not_grow_with_the_steps():
    """The reverse pass keeps O(√max_steps) checkpoints, not every step: ten times the steps
    (ten times the interval) needs at most 3× the compiled program's temporary memory."""

    def temp_bytes(t1):
        y0, ts = jnp.ones(2), jnp.linspace(0.0, t1, 11)

        def loss(w):
            field = lambda t, y, w: jnp.stack([y[1], -w[0] * y[0] - w[1:].sum() * 1e-3 * y[1]])  # noqa: E731
            return ds.simulate(ds.ODE(field, w), y0, ts, solver=ds.Tsit5()).ys.sum()

        compiled = jax.jit(jax.grad(loss)).lower(WEIGHTS).compile()
        steps = ds.simulate(
            ds.ODE(lambda t, y, w: jnp.stack([y[1], -w[0] * y[0]]), WEIGHTS),
            y0,
            ts,
            solver=ds.Tsit5(),
        ).stats["num_steps"]
        return compiled.memory_analysis().temp_size_in_bytes, int(steps)

    (short, steps_short), (long, steps_long) = temp_bytes(10.0), temp_bytes(100.0)
    assert steps_long >= 8 * steps_short  # the premise: about ten times the steps
    assert long <= 3 * short
