"""Rosenbrock methods and mass-matrix DAEs: measured orders, stiff references (Robertson to
t = 1e11), two DAE models against scipy's Radau on the ODE left after eliminating their
algebraic variables, derivatives against closed forms and finite differences, vmap with members
of very different step counts, consistent initial states and the errors for bad input."""

import functools

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import diffsim as ds
import models
from diffsim._solver.rosenbrock import factorise, flat_field, linearise

ROSENBROCK = [ds.Rosenbrock23(), ds.Rodas4(), ds.Rodas5P()]


def _id(solver):
    return type(solver).__name__


def _forced(t, y, p):
    """A smooth non-autonomous test system: both the Jacobian and the ∂f/∂t terms of the
    methods enter its solution."""
    return jnp.stack([-y[0] + jnp.sin(3 * t) * y[1], -0.5 * y[1] + jnp.cos(t) - 0.3 * y[0] ** 2])


FORCED = ds.ODE(_forced, {})
FORCED_Y0 = jnp.array([1.0, 0.5])


@pytest.mark.parametrize("solver", ROSENBROCK, ids=_id)
def test_convergence_orders_of_solution_and_error_estimate(solver):
    # N equal steps over [0, 1] by the method's own step (as a hand-written loop would take
    # them), against Dopri8 at rtol 1e-14. Step counts in the asymptotic regime: the smallest
    # error measured (Rodas5P, 64 steps) is ~4e-12, far above round-off.
    reference = ds.simulate(
        FORCED, FORCED_Y0, jnp.array([0.0, 1.0]), solver=ds.Dopri8(rtol=1e-14, atol=1e-14)
    ).ys[-1]
    counts = {2: [16, 32, 64, 128], 4: [8, 16, 32, 64], 5: [8, 16, 32, 64]}[solver.order]
    errors, estimates = [], []
    for n in counts:
        h = 1.0 / n

        def body(y, i, h=h):
            y1, error = solver.step(FORCED, i * h, y, h)
            return y1, jnp.max(jnp.abs(error))

        y_end, step_errors = jax.lax.scan(body, FORCED_Y0, jnp.arange(n, dtype=jnp.float64))
        errors.append(float(jnp.max(jnp.abs(y_end - reference))))
        estimates.append(float(step_errors[0]))
    sizes = 1.0 / np.array(counts)
    order = np.polyfit(np.log(sizes), np.log(errors), 1)[0]
    # the criterion: the least-squares log-log slope within ±0.2 of the nominal order
    assert abs(order - solver.order) <= 0.2, (order, errors)
    # the error estimate is the local error of the lower-order solution: O(h^error_order)
    estimate_order = np.polyfit(np.log(sizes), np.log(estimates), 1)[0]
    assert abs(estimate_order - solver.error_order) <= 0.25, (estimate_order, estimates)


@pytest.mark.parametrize(
    "solver, dense_order", [(ds.Rosenbrock23(), 2), (ds.Rodas4(), 3), (ds.Rodas5P(), 4)], ids=_id
)
def test_dense_output_order(solver, dense_order):
    # One step of size h from t = 0, the interpolant at its middle against Dopri8: a dense
    # output of order q has local error O(h^(q+1)).
    errors, sizes = [], [0.2, 0.1, 0.05, 0.025]
    f = flat_field(FORCED, lambda y: y)
    system = linearise(FORCED, f, lambda y: y, None, jnp.asarray(0.0), FORCED_Y0)
    for h in sizes:
        exact = ds.simulate(
            FORCED, FORCED_Y0, jnp.array([0.0, h / 2]), solver=ds.Dopri8(rtol=1e-15, atol=1e-15)
        ).ys[-1]
        y1, _, dense = solver.attempt(system, 0.0, FORCED_Y0, h, factorise(system, h, solver.gamma))
        errors.append(
            float(jnp.max(jnp.abs(solver.interpolate(dense, FORCED_Y0, y1, 0.5) - exact)))
        )
    slope = np.polyfit(np.log(sizes), np.log(errors), 1)[0]
    assert abs(slope - (dense_order + 1)) <= 0.2, (slope, errors)


def test_adaptive_solves_meet_their_tolerance_at_every_output_time():
    ts = jnp.linspace(0.0, 3.0, 61)
    reference = ds.simulate(FORCED, FORCED_Y0, ts, solver=ds.Dopri8(rtol=1e-14, atol=1e-14)).ys
    # Rosenbrock23 at the loose tolerances it is made for: its interpolant is of second order,
    # so at tighter ones the output between steps falls behind (measured: 4x the tolerance at
    # 1e-3, 9x at 1e-4, 20x at 1e-5, while the step ends stay within 2.1x)
    cases = [
        (ds.Rosenbrock23, 1e-3),
        (ds.Rosenbrock23, 1e-4),
        (ds.Rodas4, 1e-5),
        (ds.Rodas5P, 1e-5),
    ]
    for solver, tol in cases + [(ds.Rodas5P, 1e-8)]:
        sol = ds.simulate(FORCED, FORCED_Y0, ts, solver=solver(rtol=tol, atol=tol))
        # global error within 10x the requested tolerance (the criterion), also at the
        # output times between steps (dense output)
        np.testing.assert_allclose(sol.ys, reference, atol=10 * tol, rtol=0)


@functools.cache
def _robertson_reference(ts: tuple):
    from scipy.integrate import solve_ivp

    k1, k2, k3 = 0.04, 3e7, 1e4

    def rhs(t, y):
        return [
            -k1 * y[0] + k3 * y[1] * y[2],
            k1 * y[0] - k2 * y[1] ** 2 - k3 * y[1] * y[2],
            k2 * y[1] ** 2,
        ]

    def jac(t, y):
        return [
            [-k1, k3 * y[2], k3 * y[1]],
            [k1, -2 * k2 * y[1] - k3 * y[2], -k3 * y[1]],
            [0.0, 2 * k2 * y[1], 0.0],
        ]

    sol = solve_ivp(
        rhs,
        (0.0, ts[-1]),
        [1.0, 0.0, 0.0],
        method="Radau",
        rtol=1e-11,
        atol=1e-20,
        jac=jac,
        t_eval=np.asarray(ts),
    )
    return sol.y.T


ROBERTSON_TS = jnp.array([0.0, 0.4, 40.0, 4e3, 4e5, 4e7, 4e9, 1e11])


# Rosenbrock23 (~14 s, its reference in HIRES below) runs with the slow extras
@pytest.mark.parametrize(
    "solver",
    [pytest.param(ds.Rosenbrock23(rtol=1e-4), marks=pytest.mark.slow), ds.Rodas5P(rtol=1e-7)],
    ids=_id,
)
def test_robertson_to_1e11(solver):
    # Hairer & Wanner's long run: y2 falls to ~1e-16, y1 to ~1e-10 by t = 1e11. Error per
    # component relative to its size, against Radau at rtol 1e-12: within 10x the requested
    # rtol (atol 1e-20 resolves y2 down to its smallest values).
    solver = eqx.tree_at(lambda s: s.atol, solver, jnp.asarray(1e-20))
    sol = ds.simulate(models.Robertson(), jnp.array([1.0, 0.0, 0.0]), ROBERTSON_TS, solver=solver)
    reference = _robertson_reference(tuple(np.asarray(ROBERTSON_TS).tolist()))
    relative = np.abs(np.asarray(sol.ys) - reference) / np.abs(reference).clip(1e-300)
    assert np.all(relative[1:] <= 10 * float(solver.rtol)), relative
    # mass is conserved: a linear invariant, which every Rosenbrock stage keeps to round-off
    # (1e-12: ~1e3 steps of a few ulps each)
    np.testing.assert_allclose(jnp.sum(sol.ys, axis=1), 1.0, atol=1e-12)


@pytest.mark.parametrize(
    "solver",
    [ds.Rosenbrock23(rtol=1e-4, atol=1e-8), ds.Rodas4(rtol=1e-6), ds.Rodas5P(rtol=1e-9)],
    ids=_id,
)
def test_hires_against_its_published_reference(solver):
    # the end state of the IVP test set (RADAU5 near round-off; scipy's Radau at rtol 1e-12
    # agrees with it to 8e-13), every component within 10x the requested rtol
    model = models.HIRES()
    solver = eqx.tree_at(lambda s: s.atol, solver, 1e-4 * solver.rtol)
    ts = jnp.array([0.0, model.end_time])
    end = ds.simulate(model, model.initial_state(), ts, solver=solver).ys[-1]
    reference = model.reference_state()
    assert np.all(np.abs(end - reference) <= 10 * float(solver.rtol) * np.abs(reference))


def test_robertson_as_a_dae_matches_the_ode():
    # Hairer & Wanner's DAE form: y3 from the conservation law 0 = y1 + y2 + y3 − 1.
    def dae(t, y, k):
        ode = models.Robertson(k1=k["k1"]).vector_field(t, y)
        return ode.at[2].set(y[0] + y[1] + y[2] - 1)

    model = ds.ODE(dae, {"k1": 0.04}, mass_matrix=jnp.diag(jnp.array([1.0, 1.0, 0.0])))
    ts = jnp.array([0.0, 1.0, 100.0, 1e4])
    solver = ds.Rodas5P(rtol=1e-8, atol=1e-14)
    as_dae = ds.simulate(model, jnp.array([1.0, 0.0, 0.0]), ts, solver=solver).ys
    as_ode = ds.simulate(models.Robertson(), jnp.array([1.0, 0.0, 0.0]), ts, solver=solver).ys
    # two solves at rtol 1e-8, each within ~10 rtol of the truth: 1e-6 leaves room for both;
    # atol 1e-13 for y2 ~ 1e-5 after its peak, resolved by atol 1e-14
    np.testing.assert_allclose(as_dae, as_ode, rtol=1e-6, atol=1e-13)
    np.testing.assert_allclose(jnp.sum(as_dae, axis=1), 1.0, atol=1e-14)  # the constraint holds


def _rectifier_reference(model, ts):
    """scipy Radau (rtol 1e-12) on the ODE for v_b alone, v_a eliminated by solving node a's
    equation with brentq at every evaluation."""
    from scipy.integrate import solve_ivp
    from scipy.optimize import brentq

    names = (
        "amplitude",
        "frequency",
        "source_resistance",
        "load_resistance",
        "capacitance",
        "saturation_current",
        "thermal_voltage",
    )
    p = {name: float(getattr(model, name)) for name in names}

    def diode(v):
        x = v / p["thermal_voltage"]
        grown = np.exp(x) if x < 40 else np.exp(40.0) * (1 + x - 40)
        return p["saturation_current"] * (grown - 1)

    def v_a(t, v_b):
        v_s = p["amplitude"] * np.sin(2 * np.pi * p["frequency"] * t)
        node = lambda v: (v_s - v) / p["source_resistance"] - diode(v - v_b)  # noqa: E731
        return brentq(node, min(v_s, v_b) - 1, max(v_s, v_b) + 1, xtol=1e-15, rtol=1e-15)

    def rhs(t, y):
        current = diode(v_a(t, y[0]) - y[0])
        return [(current - y[0] / p["load_resistance"]) / p["capacitance"]]

    sol = solve_ivp(
        rhs,
        (0.0, float(ts[-1])),
        [0.0],
        "Radau",
        rtol=1e-12,
        atol=1e-14,
        t_eval=np.asarray(ts),
        max_step=2e-4,
    )
    return np.array([v_a(t, v) for t, v in zip(sol.t, sol.y[0])]), sol.y[0]


def test_rectifier_against_the_eliminated_ode():
    model = models.Rectifier()
    ts = jnp.linspace(0.0, 0.04, 81)  # two periods of the 50 Hz source
    v_a, v_b = _rectifier_reference(model, ts)
    y0 = ds.consistent_initial_state(model, jnp.array([0.3, 0.0]))  # v_a = V_s(0) = 0
    # Newton stops at eps^(3/4) ~ 2e-12 on the change, after which the iterate is at round-off
    np.testing.assert_allclose(y0, [0.0, 0.0], atol=1e-12)
    # node a (algebraic, it follows the 5 V source while the diode is off) at output times
    # inside steps, from the interpolant, whose defect in the algebraic equation is part of
    # the error estimate: measured 1.0e-7 V (Rodas5P; 1.5e-5 V before that control) and
    # 1.7e-4 V (Rosenbrock23, the error of its capacitor voltage at rtol 1e-5 carried over)
    cases = [
        (ds.Rodas5P(rtol=1e-8, atol=1e-10, dtmax=1e-3), 1e-6),
        (ds.Rosenbrock23(rtol=1e-5), 5e-4),
    ]
    for solver, node_tolerance in cases:
        sol = ds.simulate(model, y0, ts, solver=solver)
        # the capacitor voltage within 10x the tolerance of its ~4 V
        np.testing.assert_allclose(sol.ys[:, 1], v_b, atol=40 * float(solver.rtol), rtol=0)
        np.testing.assert_allclose(sol.ys[:, 0], v_a, atol=node_tolerance, rtol=0)


@pytest.mark.parametrize("solver", [ds.Rodas5P, ds.Rodas4], ids=lambda s: s.__name__)
def test_outputs_between_steps_of_a_stiff_ode_are_within_the_tolerance(solver):
    """Prothero–Robinson, y' = −λ(y − cos t) − sin t with λ = 1e6 (y = cos t + e^(−λt)): on
    the slow manifold the step ends are exact to 1e-11, so the end-point error estimate let
    the steps grow to 2.3, and the interpolated outputs were off by 8.9e-3 (Rodas5P) and
    2.2e-2 (Rodas4) at rtol 1e-6, reported successful. The interpolant's defect is now part
    of the error estimate (measured 1.6e-6 and 8.5e-7): within 10 rtol, the criterion of the
    tolerance test above."""
    rtol = 1e-6
    stiff = ds.ODE(lambda t, y, p: -1e6 * (y - jnp.cos(t)) - jnp.sin(t), None)
    ts = jnp.linspace(0.0, 5.0, 51)
    sol = ds.simulate(stiff, jnp.array([2.0]), ts, solver=solver(rtol=rtol, atol=1e-8))
    exact = jnp.cos(ts) + jnp.exp(-1e6 * ts)
    np.testing.assert_allclose(sol.ys[:, 0], exact, atol=10 * rtol, rtol=0)


@pytest.mark.parametrize("solver", [ds.Rodas5P, ds.Rodas4], ids=lambda s: s.__name__)
def test_algebraic_components_between_steps_are_within_the_tolerance(solver):
    """The algebraic components at output times inside steps and on the dense output.

    A stiffly accurate method meets the algebraic equation exactly at a step's end, so its
    error estimate there says nothing of the interpolant between: 0 = z − cos(5t)·x was off
    by 1.5e-5 (Rodas5P) and 1.2e-5 (Rodas4) at rtol 1e-8, and 0 = y − cos t, whose steps grew
    to 0.9, by 3e-4 and 9e-3. The interpolant's defect in the algebraic equations at θ = 1/4
    and 3/4 is now part of the error estimate: measured 7e-9 / 6e-9 and 9e-9 / 1e-8, within
    10 rtol."""
    rtol = 1e-8
    tolerance = 10 * rtol
    ts = jnp.linspace(0.0, 2.0, 41)
    coupled = ds.ODE(
        lambda t, y, p: jnp.stack([-y[0], y[1] - jnp.cos(5 * t) * y[0]]),
        None,
        mass_matrix=jnp.diag(jnp.array([1.0, 0.0])),
    )
    sol = ds.simulate(coupled, jnp.ones(2), ts, solver=solver(rtol=rtol, atol=1e-10))
    exact = jnp.exp(-ts)[:, None] * jnp.stack([jnp.ones_like(ts), jnp.cos(5 * ts)], axis=1)
    np.testing.assert_allclose(sol.ys, exact, atol=tolerance, rtol=0)
    algebraic = ds.ODE(lambda t, y, p: y - jnp.cos(t), None, mass_matrix=jnp.zeros((1, 1)))
    sol = ds.simulate(algebraic, jnp.ones(1), ts, solver=solver(rtol=rtol, atol=1e-10), dense=True)
    np.testing.assert_allclose(sol.ys[:, 0], jnp.cos(ts), atol=tolerance, rtol=0)
    between = jnp.linspace(0.013, 1.987, 97)
    np.testing.assert_allclose(sol.evaluate(between)[:, 0], jnp.cos(between), atol=tolerance)


def _reactor_reference(model, y0, ts):
    """scipy Radau (rtol 1e-12) on the totals a = c_A + c_C, b = c_B + c_C and c_D, with c_C
    from the mass-action law c = K (a − c)(b − c) in closed form (its smaller root)."""
    from scipy.integrate import solve_ivp

    K, k = float(model.equilibrium_constant), float(model.rate)

    def c_of(a, b):
        # K c^2 − (K (a + b) + 1) c + K a b = 0
        p = K * (a + b) + 1
        return (p - np.sqrt(p * p - 4 * K * K * a * b)) / (2 * K)

    def rhs(t, z):
        c = c_of(z[0], z[1])
        return [-k * c, -k * c, k * c]

    z0 = [y0[0] + y0[2], y0[1] + y0[2], y0[3]]
    sol = solve_ivp(
        rhs, (0.0, float(ts[-1])), z0, "Radau", rtol=1e-12, atol=1e-14, t_eval=np.asarray(ts)
    )
    a, b, d = sol.y
    c = c_of(a, b)
    return np.stack([a - c, b - c, c, d], axis=1)


def test_equilibrium_reactor_against_the_eliminated_ode():
    model = models.EquilibriumReactor(equilibrium_constant=10.0, rate=0.1)
    guess = jnp.array([1.0, 0.8, 0.0, 0.0])
    y0 = ds.consistent_initial_state(model, guess)
    # the algebraic equation holds, and only the equilibrium moved: the totals A + C, B + C
    # and D of the guess are kept (the mass matrix's null direction is (−1, −1, 1, 0))
    # Newton converged (to eps^(3/4) in the change, quadratically: the residual at round-off)
    np.testing.assert_allclose(10.0 * y0[0] * y0[1], y0[2], rtol=1e-12)
    np.testing.assert_allclose([y0[0] + y0[2], y0[1] + y0[2], y0[3]], [1.0, 0.8, 0.0], atol=1e-14)
    ts = jnp.linspace(0.0, 50.0, 26)
    reference = _reactor_reference(model, np.asarray(y0), ts)
    for solver in [ds.Rodas5P(rtol=1e-8, atol=1e-10), ds.Rosenbrock23(rtol=1e-5, atol=1e-8)]:
        sol = ds.simulate(model, y0, ts, solver=solver)
        np.testing.assert_allclose(sol.ys, reference, atol=10 * float(solver.rtol), rtol=0)
        # conserved to round-off: the mass matrix's rows carry the totals exactly
        # conserved to round-off: the mass matrix's rows carry the totals exactly (1e-13: a few
        # ulps over the ~100 steps)
        np.testing.assert_allclose(sol.ys[:, 0] + sol.ys[:, 2] + sol.ys[:, 3], 1.0, atol=1e-13)


# --- derivatives --------------------------------------------------------------------------------


def _relaxation(t, y, p):
    """y' = −k (y − sin t): stiff for large k, with a closed-form solution."""
    return -p["k"] * (y - jnp.sin(t))


def _relaxation_exact(k, y0, t):
    decay = jnp.exp(-k * t)
    return y0 * decay + k / (k**2 + 1) * (k * jnp.sin(t) - jnp.cos(t) + decay)


# Rosenbrock23 differs from Rodas5P only in its step (the loop and the derivative rule are
# shared): ~20 s, a slow extra
@pytest.mark.parametrize(
    "solver",
    [
        pytest.param(ds.Rosenbrock23(rtol=1e-9, atol=1e-12), marks=pytest.mark.slow),
        ds.Rodas5P(rtol=1e-10, atol=1e-12),
    ],
    ids=_id,
)
def test_derivatives_every_mode_against_the_closed_form(solver):
    # θ = (k, y0, t1): the closed form differentiated by JAX is the reference. Tolerance 1e-6
    # relative: the solve's own error is ~10 rtol, and the derivative of the discrete solution
    # with the steps held fixed converges at the method's order as well.
    theta = jnp.array([50.0, 2.0, 1.5])

    def outputs(theta):
        model = ds.ODE(_relaxation, {"k": theta[0]})
        ts = jnp.stack([0.0, theta[2] / 3, theta[2]])
        return ds.simulate(model, theta[1:2], ts, solver=solver).ys[1:, 0]

    def exact(theta):
        ts = jnp.stack([theta[2] / 3, theta[2]])
        return _relaxation_exact(theta[0], theta[1], ts)

    # the solve itself at rtol 1e-10 (Rosenbrock23 at 1e-9): global error well inside 1e-7
    np.testing.assert_allclose(outputs(theta), exact(theta), rtol=1e-7)
    reference = jax.jacfwd(exact)(theta)
    forward = jax.jacfwd(outputs)(theta)
    np.testing.assert_allclose(forward[:, :2], reference[:, :2], rtol=1e-6, atol=1e-9)
    # d/dt1 moves the end of the last step, differentiated with the step held fixed: the
    # derivative of the method's step with respect to its length, which equals f(t1, y1) only
    # to the method's accuracy (Rosenbrock23: 1.4e-5 relative measured at k h ~ 1)
    np.testing.assert_allclose(forward[:, 2], reference[:, 2], rtol=1e-4)
    # forward and reverse mode transpose the same Jacobian: agreement to round-off (a single
    # jvp is one column of jacfwd, the same program unbatched)
    np.testing.assert_allclose(jax.jacrev(outputs)(theta), forward, rtol=1e-10, atol=1e-12)

    def loss(theta):
        return jnp.sum(outputs(theta) ** 2)

    hessian = jax.jit(jax.hessian(loss))(theta)
    expected = jax.hessian(lambda t: jnp.sum(exact(t) ** 2))(theta)
    np.testing.assert_allclose(hessian[:2, :2], expected[:2, :2], rtol=1e-5, atol=1e-12)
    # the row of t1 as above, twice over (Rosenbrock23: 1.6e-3 relative measured)
    np.testing.assert_allclose(hessian[2], expected[2], rtol=5e-3, atol=1e-12)
    # forward over reverse of one computation: symmetric to round-off
    np.testing.assert_allclose(hessian, hessian.T, rtol=1e-9, atol=1e-12)


def test_dae_gradient_against_finite_differences():
    # The reactor's D at t = 20 with respect to (K, k): central differences with steps 1e-4
    # relative (truncation ~1e-8, the solve's error at rtol 1e-12 over the step ~1e-8).
    ts = jnp.array([0.0, 20.0])
    solver = ds.Rodas5P(rtol=1e-12, atol=1e-14)

    def final_d(p):
        model = models.EquilibriumReactor(equilibrium_constant=p[0], rate=p[1])
        y0 = ds.consistent_initial_state(model, jnp.array([1.0, 0.8, 0.0, 0.0]))
        return ds.simulate(model, y0, ts, solver=solver).ys[-1, 3]

    p = jnp.array([10.0, 0.1])
    gradient = jax.grad(final_d)(p)
    steps = 1e-4 * p
    central = [
        (final_d(p + e) - final_d(p - e)) / (2 * e[i]) for i, e in enumerate(jnp.diag(steps))
    ]
    np.testing.assert_allclose(gradient, central, rtol=1e-6)


def test_a_stiff_fit_works_unchanged():
    # ds.fit calls simulate as for any solver: Robertson's k1 and k3 fitted
    # from a neutral start to data simulated at the published values.
    ts = jnp.array([0.0, 0.4, 4.0, 40.0, 400.0])
    y0 = jnp.array([1.0, 0.0, 0.0])
    solver = ds.Rodas5P(rtol=1e-8, atol=1e-12)
    truth = models.Robertson()
    observed = ds.simulate(truth, y0, ts, solver=solver).ys
    data = ds.Data(np.asarray(ts[1:]), np.asarray(observed[1:][:, jnp.array([0, 2])]))
    result = ds.fit(
        models.Robertson(k1=0.1, k3=3e3),
        y0,
        data,
        params=["k1", "k3"],
        observe=lambda y: y[jnp.array([0, 2])],
        solver=solver,
        t0=0.0,  # y0 is the state at t = 0, before the first observation
    )
    # noise-free data simulated at rtol 1e-8: the optimum is the truth to ~the solve's accuracy
    # amplified by the conditioning of (k1, k3); 1e-4 is the fit's usefulness, not round-off
    np.testing.assert_allclose([result.params["k1"], result.params["k3"]], [0.04, 1e4], rtol=1e-4)


def test_vmap_members_with_very_different_step_counts():
    # k1 over four decades: the members take different numbers of steps in one batched loop
    # (each its own step sizes); each equals its one-by-one solve.
    ts = jnp.array([0.0, 1.0, 100.0])
    y0 = jnp.array([1.0, 0.0, 0.0])
    solver = ds.Rodas5P(rtol=1e-7, atol=1e-12)

    def run(k1):
        sol = ds.simulate(models.Robertson(k1=k1), y0, ts, solver=solver, throw=False)
        return sol.ys, sol.stats["num_steps"]

    k1s = jnp.array([4e-4, 4e-2, 4.0, 400.0])
    batched, steps = jax.jit(jax.vmap(run))(k1s)
    assert len(set(np.asarray(steps).tolist())) == 4, steps
    assert int(steps.max()) > 1.5 * int(steps.min()), steps
    for i, k1 in enumerate(k1s):
        single, _ = run(k1)
        # batched and single programs may round differently and flip an accept decision: a
        # different valid step sequence, within 10 rtol (test_conformance's rule)
        np.testing.assert_allclose(batched[i], single, rtol=1e-6, atol=1e-12)


def test_model_jacobian_is_used_and_agrees():
    # A model's own jacobian(t, y) replaces jax.jacfwd: the same solution (to round-off of
    # the linear algebra), and a wrong one changes the answer (so it is really used).
    class OwnJacobian(models.Robertson):
        scale: float = eqx.field(static=True, default=1.0)

        def jacobian(self, t, y):
            k1, k2, k3 = self.k1, self.k2, self.k3
            exact = jnp.array(
                [
                    [-k1, k3 * y[2], k3 * y[1]],
                    [k1, -2 * k2 * y[1] - k3 * y[2], -k3 * y[1]],
                    [0.0, 2 * k2 * y[1], 0.0],
                ]
            )
            return self.scale * exact

    ts = jnp.array([0.0, 10.0])
    y0 = jnp.array([1.0, 0.0, 0.0])
    solver = ds.Rodas5P(rtol=1e-8, atol=1e-12)
    auto = ds.simulate(models.Robertson(), y0, ts, solver=solver)
    own = ds.simulate(OwnJacobian(), y0, ts, solver=solver)
    # the same Jacobian up to the rounding of jacfwd against the closed form: same steps
    np.testing.assert_allclose(own.ys, auto.ys, rtol=1e-12, atol=1e-16)
    assert int(own.stats["num_steps"]) == int(auto.stats["num_steps"])
    wrong = ds.simulate(OwnJacobian(scale=0.5), y0, ts, solver=solver, throw=False)
    assert not np.allclose(wrong.ys, auto.ys, rtol=1e-12, atol=1e-16)


# --- bad input ----------------------------------------------------------------------------------


def test_a_dae_given_to_an_explicit_or_diffrax_solver_is_refused():
    model = models.EquilibriumReactor()
    y0 = ds.consistent_initial_state(model, jnp.array([1.0, 0.8, 0.0, 0.0]))
    for solver in [ds.Tsit5(), ds.Kvaerno5(), ds.RK4()]:
        with pytest.raises(TypeError, match="mass matrix.*ds.Rodas5P"):
            ds.simulate(model, y0, jnp.array([0.0, 1.0]), solver=solver, dt=0.1)


def test_wrong_shaped_or_nonfinite_mass_matrix():
    fn = lambda t, y, p: -y  # noqa: E731
    y0 = jnp.ones(3)
    for mass in [jnp.eye(2), jnp.ones((3, 3, 1)), jnp.ones(3)]:
        with pytest.raises(ValueError, match=r"mass_matrix has shape .* M must be \(3, 3\)"):
            ds.simulate(
                ds.ODE(fn, {}, mass_matrix=mass), y0, jnp.array([0.0, 1.0]), solver=ds.Rodas5P()
            )
    with pytest.raises(ValueError, match="non-finite parameter"):
        ds.simulate(
            ds.ODE(fn, {}, mass_matrix=jnp.eye(3).at[0, 0].set(jnp.nan)),
            y0,
            jnp.array([0.0, 1.0]),
            solver=ds.Rodas5P(),
        )


def test_singular_algebraic_block_is_named_as_index_above_one():
    # 0 = −y0 does not involve y1, the component M leaves undetermined: index 2
    model = ds.ODE(
        lambda t, y, p: jnp.stack([y[1], -y[0] + 0.1]),
        {},
        mass_matrix=jnp.diag(jnp.array([1.0, 0.0])),
    )
    with pytest.raises(ValueError, match="index above 1"):
        ds.simulate(model, jnp.array([1.0, 0.0]), jnp.array([0.0, 1.0]), solver=ds.Rodas5P())


def test_inconsistent_initial_state_eagerly_and_under_jit():
    model = models.EquilibriumReactor()
    bad = jnp.array([1.0, 0.8, 0.0, 0.0])  # C is not at equilibrium with A and B
    ts = jnp.array([0.0, 1.0])
    with pytest.raises(
        ValueError, match="not a consistent initial state.*consistent_initial_state"
    ):
        ds.simulate(model, bad, ts, solver=ds.Rodas5P())

    @jax.jit
    def run(y0):
        return ds.simulate(model, y0, ts, solver=ds.Rodas5P(), throw=False)

    sol = run(bad)
    assert int(sol.result) == ds.RESULTS.inconsistent_initial_state
    assert bool(jnp.all(jnp.isnan(sol.ys)))
    good = ds.consistent_initial_state(model, bad)
    assert bool(run(good).succeeded)


def test_a_float32_consistent_state_passes_the_check_at_tolerances_below_float32():
    # the consistent state moves by rounding (~1e-7 relative) under one more Newton step; at
    # rtol = 1e-8, which float32 cannot resolve, that is no inconsistency: the solve runs (and
    # the precision warning tells what float32 cannot do), while a truly inconsistent float32
    # state is still refused
    model = models.EquilibriumReactor()
    guess = jnp.array([1.0, 0.8, 0.0, 0.0], jnp.float32)
    good = ds.consistent_initial_state(model, guess)
    solver = ds.Rodas5P(rtol=1e-8, atol=1e-8)
    ts = jnp.array([0.0, 1.0], jnp.float32)
    with pytest.warns(ds.PrecisionWarning, match="below float32's epsilon"):
        sol = ds.simulate(model, good, ts, solver=solver, max_steps=64, throw=False)
    assert int(sol.result) != ds.RESULTS.inconsistent_initial_state
    with pytest.raises(ValueError, match="not a consistent"):
        ds.simulate(model, guess, ts, solver=ds.Rodas5P(rtol=1e-5, atol=1e-5), max_steps=64)


def test_options_rosenbrock_solvers_do_not_take():
    model = models.Robertson()
    y0, ts = jnp.array([1.0, 0.0, 0.0]), jnp.array([0.0, 1.0])
    with pytest.raises(ValueError, match="adjoint='auto'"):
        ds.simulate(model, y0, ts, solver=ds.Rodas5P(), adjoint="checkpoint")
    with pytest.raises(ValueError, match="dtmin=.* is above dtmax"):
        ds.Rodas5P(dtmin=1.0, dtmax=0.1)


@pytest.mark.parametrize(
    "solver, model, y0",
    [
        (ds.Rodas5P(rtol=1e-8, atol=1e-10), models.Robertson(), [1.0, 0.0, 0.0]),
        (ds.Tsit5(rtol=1e-8, atol=1e-10), models.LotkaVolterra(), [10.0, 5.0]),  # lean loop
    ],
)
def test_forward_only_adjoint_gives_the_default_jacobian_with_a_tangent_per_direction(
    solver, model, y0
):
    # adjoint=diffrax.ForwardMode(): JAX's forward mode through the solve's own loop, one
    # tangent per direction asked, where the default's rule carries one per input of the solve
    # (here 2 directions set 5 or 6 inputs: three fields and y0); the same derivative of the
    # same discrete solution, so equal up to the order in which the two programs sum the
    # tangents' terms (rtol 1e-9 leaves the stiff solve room to amplify that round-off; a
    # derivative that dropped a term, e.g. ∂J/∂θ of the Rosenbrock step, was 1e-4 off on
    # Bruno's study), and reverse mode refused
    names = [name for name in ("k1", "k2", "k3", "alpha", "beta", "gamma") if hasattr(model, name)]
    y0, ts = jnp.array(y0), jnp.array([0.0, 0.5, 4.0])

    def states(theta, **options):
        fields = [getattr(model, name) * jnp.exp(theta[i % 2]) for i, name in enumerate(names)]
        m = eqx.tree_at(lambda m: [getattr(m, name) for name in names], model, fields)
        start = y0 * (1.0 + 0.1 * theta[1]) + 0.01 * theta[0]
        return ds.simulate(m, start, ts, solver=solver, **options).ys

    theta = jnp.array([0.1, -0.2])
    forward = jax.jit(jax.jacfwd(lambda th: states(th, adjoint=diffrax.ForwardMode())))(theta)
    default = jax.jit(jax.jacfwd(states))(theta)
    assert np.all(np.isfinite(forward)) and np.max(np.abs(forward)) > 0
    np.testing.assert_allclose(forward, default, rtol=1e-9, atol=1e-12 * np.abs(default).max())
    with pytest.raises(ValueError, match="[Rr]everse-mode differentiation does not work"):
        jax.grad(lambda th: jnp.sum(states(th, adjoint=diffrax.ForwardMode())))(theta)


def test_consistent_initial_state_of_an_ode_is_the_state_itself():
    y0 = jnp.array([1.0, 0.0, 0.0])
    np.testing.assert_array_equal(ds.consistent_initial_state(models.Robertson(), y0), y0)


# --- large method-of-lines systems: the banded Jacobian -----------------------------------------


class _DenseHeat(models.Heat1D):
    """Heat1D without its bandwidth: the dense Jacobian and LU."""

    @property
    def jacobian_bandwidth(self):
        return None


def test_banded_jacobian_equals_the_dense_one():
    from diffsim._solver.banded import banded_jacobian

    model = models.Nagumo1D(n=40)
    y = model.front(model.grid(), 0.0, 2.0) + 0.01 * jnp.sin(jnp.arange(40.0))
    f = flat_field(model, lambda y: y)
    # jitted: eagerly, each small operation of the colouring would dispatch on its own
    f0, band, dfdt = jax.jit(lambda y: banded_jacobian(f, jnp.asarray(0.3), y, 1, 1))(y)
    dense = jax.jit(jax.jacfwd(lambda y: f(0.3, y)))(y)
    # the same jvps summed differently: equal to a few ulps
    np.testing.assert_allclose(band.dense(), dense, rtol=1e-14)
    np.testing.assert_allclose(f0, f(0.3, y), rtol=1e-15)
    np.testing.assert_array_equal(dfdt, 0.0)  # autonomous


def test_heat_with_the_band_equals_the_dense_solve_and_the_exact_decay():
    # two Fourier modes, each decaying at its exact discrete rate
    n = 64
    model = models.Heat1D(diffusivity=0.1, n=n)
    x = model.grid()
    y0 = jnp.sin(jnp.pi * x) + 0.3 * jnp.sin(3 * jnp.pi * x)
    ts = jnp.array([0.0, 0.5, 1.0])
    solver = ds.Rodas5P(rtol=1e-8, atol=1e-10)
    banded = ds.simulate(model, y0, ts, solver=solver)
    dense = ds.simulate(_DenseHeat(diffusivity=0.1, n=n), y0, ts, solver=solver)
    np.testing.assert_allclose(banded.ys, dense.ys, rtol=0, atol=1e-12)  # the same steps
    decay = lambda k: jnp.exp(-model.mode_decay_rate(k) * ts[:, None])  # noqa: E731
    exact = decay(1) * jnp.sin(jnp.pi * x)[None] + 0.3 * decay(3) * jnp.sin(3 * jnp.pi * x)[None]
    # rtol 1e-8 on amplitudes <= 1.3, a handful of steps: 1e-8 is 10x the requested tolerance
    np.testing.assert_allclose(banded.ys, exact, atol=1e-8)

    def loss(kappa):
        m = models.Heat1D(diffusivity=kappa, n=n)
        return jnp.sum(ds.simulate(m, jnp.sin(jnp.pi * x), ts, solver=solver).ys[-1])

    def exact_loss(kappa):
        rate = models.Heat1D(diffusivity=kappa, n=n).mode_decay_rate(1)
        return jnp.sum(jnp.sin(jnp.pi * x)) * jnp.exp(-rate * ts[-1])

    # derivatives through the tridiagonal solves (jvp and transpose of gtsv)
    # the derivative of the discrete solve at rtol 1e-8 against the exact decay's: 10 rtol
    np.testing.assert_allclose(jax.grad(loss)(0.1), jax.grad(exact_loss)(0.1), rtol=1e-7)


def test_nagumo_front_travels_at_its_exact_speed():
    # 1,000 cells, stiff diffusion (4D/dx^2 = 1.6e5) and reaction (k = 1e3): the front's
    # speed between t = 0.1 and 0.2 against sqrt(Dk/2)(1 - 2a); the discretisation error of
    # the front (width w = 0.045, 9 cells) is O((dx/w)^2) ~ 1e-2, measured 2.6e-4
    model = models.Nagumo1D()
    x = model.grid()
    ts = jnp.array([0.0, 0.1, 0.2])
    sol = ds.simulate(model, model.front(x, 0.0, 1.0), ts, solver=ds.Rodas5P(rtol=1e-6))

    def position(u):
        i = int(np.argmax(np.asarray(u) < 0.5))
        xa, xb, ua, ub = float(x[i - 1]), float(x[i]), float(u[i - 1]), float(u[i])
        return xa + (ua - 0.5) * (xb - xa) / (ua - ub)

    speed = (position(sol.ys[2]) - position(sol.ys[1])) / 0.1
    np.testing.assert_allclose(speed, float(model.front_speed()), rtol=2e-3)
    assert np.all((np.asarray(sol.ys) > -1e-6) & (np.asarray(sol.ys) < 1 + 1e-6))


def test_mass_matrix_outside_the_band_is_refused():
    mass = jnp.eye(16).at[0, 5].set(1.0)
    model = models.Heat1D(n=16)

    class WithMass(models.Heat1D):
        @property
        def mass_matrix(self):
            return mass

    y0 = jnp.sin(jnp.pi * model.grid())
    with pytest.raises(ValueError, match=r"outside its jacobian_bandwidth \(1, 1\)"):
        ds.simulate(WithMass(n=16), y0, jnp.array([0.0, 0.1]), solver=ds.Rodas5P())


def test_sweep_with_a_rosenbrock_solver_reports_inconsistent_members():
    # ds.sweep runs the Rosenbrock loop unchanged; y0 is shared by the members, so over the
    # equilibrium constant only the member whose K it was made consistent for succeeds (and
    # equals its own simulation) and the others say why, per member.
    model = models.EquilibriumReactor(equilibrium_constant=10.0)
    y0 = ds.consistent_initial_state(model, jnp.array([1.0, 0.8, 0.0, 0.0]))
    ts = jnp.array([0.0, 5.0, 20.0])
    solver = ds.Rodas5P(rtol=1e-8, atol=1e-10)
    constants = jnp.array([5.0, 10.0, 20.0])
    with pytest.warns(UserWarning, match="2 of 3 members did not succeed"):
        by_constant = ds.sweep(
            model, {"equilibrium_constant": constants}, y0, ts, solver=solver, progress=False
        )
    assert ds.sweep_summary(by_constant) == {"successful": 1, "inconsistent_initial_state": 2}
    one = ds.simulate(model, y0, ts, solver=solver)
    # the sweep's batched program against a single solve: rounding only (no accept decision
    # near the threshold on this smooth decay)
    np.testing.assert_allclose(by_constant["y"].values[1], one.ys, rtol=1e-10, atol=1e-14)
