"""Solutions against closed forms, and conserved quantities of the models."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import diffsim as ds
import models


@pytest.mark.parametrize(
    "damping", [None, 0.3, 2.0, 5.0], ids=["undamped", "under", "critical", "over"]
)
@pytest.mark.parametrize(
    "solver, kwargs, tol",
    [
        # RK4 with h = 1e-3 has a global error ~ h^4 * O(1) = 1e-12; 1e-9 leaves room for the
        # faster modes of the overdamped case.
        (ds.RK4(), dict(dt=1e-3), 1e-9),
        # Tolerance-driven solvers bound the local error per step; the global error accumulates it
        # over the steps taken (a few hundred here): 1e-8 for Tsit5 at rtol = atol = 1e-10; the
        # implicit Kvaerno5 adds its Newton tolerance on top (measured 4e-8), so 1e-7.
        (ds.Tsit5(rtol=1e-10, atol=1e-10), {}, 1e-8),
        (ds.Kvaerno5(rtol=1e-10, atol=1e-10), {}, 1e-7),
    ],
    ids=["RK4", "Tsit5", "Kvaerno5"],
)
def test_harmonic_oscillator_matches_analytic_solution(damping, solver, kwargs, tol):
    model = models.HarmonicOscillator(omega=2.0, damping=damping)
    y0 = jnp.array([1.0, -0.5])
    ts = jnp.linspace(0.0, 5.0, 51)
    sol = ds.simulate(model, y0, ts, solver=solver, **kwargs)
    np.testing.assert_allclose(sol.ys, model.analytic_solution(y0, ts), atol=tol, rtol=0)


def test_analytic_solution_satisfies_the_equation():
    # Independent check of the closed form itself: x'' + 2 gamma x' + omega^2 x = 0, with the
    # derivatives from autodiff; exact up to round-off.
    for damping in [0.3, 2.0, 5.0]:
        model = models.HarmonicOscillator(omega=2.0, damping=damping)
        y0 = jnp.array([1.0, -0.5])

        def x(t, model=model, y0=y0):
            return model.analytic_solution(y0, t)[0]

        for t in [0.0, 0.7, 3.1]:
            t = jnp.asarray(t)
            v, a = jax.grad(x)(t), jax.grad(jax.grad(x))(t)
            assert abs(a + 2 * damping * v + 4.0 * x(t)) < 1e-12
            assert abs(v - model.analytic_solution(y0, t)[1]) < 1e-12


def _energy_drift_ratio(solver):
    # Kepler orbit with e = 0.5 for 1,000 periods at 200 steps per period, sampled 20 times per
    # orbit. Ratio of the largest energy error over the last 100 orbits to that over the first 100:
    # ~1 when the error is bounded, ~10 when it grows linearly in time.
    model = models.Kepler()
    y0 = model.initial_state(0.5)
    period = float(model.period())
    ts = jnp.arange(1000 * 20 + 1, dtype=float) * (period / 20)
    sol = ds.simulate(model, y0, ts, solver=solver, steps_per_save=10)
    error = jnp.abs(jax.vmap(model.energy)(sol.ys) - model.energy(y0))
    return float(jnp.max(error[-2000:]) / jnp.max(error[1:2000])), float(jnp.max(error))


@pytest.mark.parametrize("solver", [ds.Leapfrog(), ds.Yoshida4()], ids=["Leapfrog", "Yoshida4"])
def test_symplectic_energy_error_stays_bounded(solver):
    ratio, worst = _energy_drift_ratio(solver)
    assert ratio < 1.5  # no secular growth (linear growth would give ~10)
    assert worst < 2e-3  # and small: O(h^order) with h = period/200


@pytest.mark.parametrize("solver_cls", [ds.Yoshida4, ds.Yoshida6, ds.Yoshida8])
def test_yoshida_compositions_reach_their_order(solver_cls):
    # one Kepler orbit (e = 0.5) against Dopri8 at 1e-14: halving the step divides the error
    # by 2^order (measured slopes 3.99, 6.00, 7.97 between 200 and 400 steps an orbit); the
    # splitting stays symplectic: the energy error after 20 orbits is no larger than after 1
    model = models.Kepler()
    y0 = model.initial_state(0.5)
    period = 2 * np.pi
    ts = jnp.array([0.0, period])
    reference = ds.simulate(model, y0, ts, solver=ds.Dopri8(rtol=1e-14, atol=1e-14)).ys[-1]
    errors = []
    for steps in (200, 400):
        y = ds.simulate(model, y0, ts, solver=solver_cls(), dt=period / steps).ys[-1]
        errors.append(float(jnp.max(jnp.abs(y - reference))))
    order = np.log2(errors[0] / errors[1])
    assert abs(order - solver_cls.order) < 0.15, order
    many = jnp.linspace(0.0, 20 * period, 20 * 10 + 1)  # 10 outputs an orbit
    sol = ds.simulate(model, y0, many, solver=solver_cls(), steps_per_save=20)
    drift = jnp.abs(jax.vmap(model.energy)(sol.ys) - model.energy(y0))
    assert float(jnp.max(drift[-10:])) < 1.5 * float(jnp.max(drift[:11])) + 1e-13


def test_rk4_energy_error_grows():
    ratio, _ = _energy_drift_ratio(ds.RK4())
    assert ratio > 5  # RK4 is not symplectic: the energy error grows ~linearly (measured ~9.9)


def test_nbody_conserves_momentum_and_energy():
    model = models.NBody(masses=jnp.array([1.0, 2.0, 0.5]), softening=0.05)
    q = jnp.array([[1.0, 0.0], [-0.5, 0.8], [-0.5, -0.8]])
    p = jnp.array([[0.0, 0.5], [-0.4, -0.25], [0.1, -0.35]])
    y0 = (q, p)
    ts = jnp.linspace(0.0, 5.0, 51)
    energy_errors = []
    for dt in [1e-3, 5e-4]:
        sol = ds.simulate(model, y0, ts, solver=ds.Yoshida4(), dt=dt)
        momentum = jnp.sum(sol.ys[1], axis=1)
        # Each kick adds equal and opposite pair forces: momentum is conserved to round-off.
        np.testing.assert_allclose(
            momentum, jnp.broadcast_to(jnp.sum(p, 0), momentum.shape), atol=1e-12
        )
        energy = jax.vmap(lambda q, p: model.hamiltonian(q, p))(*sol.ys)
        energy_errors.append(float(jnp.max(jnp.abs(energy - energy[0]))))
    # Fourth order: halving the step divides the (bounded) energy error by ~16; a close encounter
    # (softening 0.05) makes the constant large, so the absolute bound is loose.
    assert energy_errors[0] < 1e-5
    assert energy_errors[0] / energy_errors[1] > 10


def test_nbody_gradient_finite_at_coincident_bodies():
    model = models.NBody(masses=jnp.ones(2))  # no softening
    q = jnp.zeros((2, 2))  # the two bodies on top of each other
    grad = jax.grad(model.potential)(q)
    assert jnp.all(jnp.isfinite(grad))


def test_double_pendulum_conserves_energy_and_matches_textbook_equations():
    model = models.DoublePendulum(mass1=1.0, mass2=2.0, length1=1.0, length2=0.5)
    y0 = jnp.array([[1.2, -0.4], [0.3, 0.0]])
    # The accelerations from autodiff of L against the classic closed-form equations of motion.
    m1, m2, l1, l2, g = 1.0, 2.0, 1.0, 0.5, 9.81
    (t1, t2), (w1, w2) = y0
    d = t1 - t2
    den = 2 * m1 + m2 - m2 * jnp.cos(2 * d)
    a1 = (
        -g * (2 * m1 + m2) * jnp.sin(t1)
        - m2 * g * jnp.sin(t1 - 2 * t2)
        - 2 * jnp.sin(d) * m2 * (w2**2 * l2 + w1**2 * l1 * jnp.cos(d))
    ) / (l1 * den)
    a2 = (
        2
        * jnp.sin(d)
        * (w1**2 * l1 * (m1 + m2) + g * (m1 + m2) * jnp.cos(t1) + w2**2 * l2 * m2 * jnp.cos(d))
    ) / (l2 * den)
    np.testing.assert_allclose(
        model.acceleration(0.0, y0[0], y0[1]), jnp.stack([a1, a2]), rtol=1e-12
    )
    sol = ds.simulate(
        model, y0, jnp.linspace(0.0, 5.0, 51), solver=ds.Dopri8(rtol=1e-11, atol=1e-11)
    )
    energy = jax.vmap(model.energy)(sol.ys)
    np.testing.assert_allclose(energy, energy[0], rtol=1e-8)  # ~ a few hundred steps x 1e-11


def test_hamiltonian_equations_from_autodiff():
    # A non-separable H; its vector field must be (dH/dp, -dH/dq) computed by hand.
    class Coupled(ds.AbstractHamiltonian):
        k: jax.Array = ds.parameter(0.7)

        def hamiltonian(self, q, p):
            return 0.5 * p**2 * (1 + self.k * q**2) + 0.5 * q**2

    model = Coupled()
    q, p = jnp.asarray(0.3), jnp.asarray(-1.1)
    dq, dp = model.vector_field(0.0, (q, p))
    np.testing.assert_allclose(dq, p * (1 + 0.7 * q**2), rtol=1e-14)
    np.testing.assert_allclose(dp, -(p**2 * 0.7 * q + q), rtol=1e-14)


def test_lotka_volterra_conserved_quantity():
    model = models.LotkaVolterra()
    sol = ds.simulate(
        model,
        jnp.array([30.0, 4.0]),
        jnp.linspace(0, 20, 41),
        solver=ds.Tsit5(rtol=1e-10, atol=1e-10),
    )
    invariant = model.conserved_quantity(sol.ys)
    # Tsit5 at rtol 1e-10 over 20 time units (~3 periods): global error ~1e-9 relative.
    np.testing.assert_allclose(invariant, invariant[0], rtol=1e-8)


@pytest.mark.parametrize(
    "model, y0, total",
    [
        (models.SIR(population=1000.0), jnp.array([990.0, 10.0, 0.0]), 1000.0),
        (models.SEIR(population=1000.0), jnp.array([990.0, 0.0, 10.0, 0.0]), 1000.0),
        (models.Robertson(), jnp.array([1.0, 0.0, 0.0]), 1.0),
    ],
    ids=["SIR", "SEIR", "Robertson"],
)
def test_compartment_totals_are_conserved(model, y0, total):
    solver = ds.Kvaerno5(rtol=1e-8, atol=1e-10)
    sol = ds.simulate(model, y0, jnp.array([0.0, 1.0, 10.0, 100.0]), solver=solver)
    # The rates sum to zero identically, so any Runge-Kutta method conserves the linear total
    # up to round-off (and Newton's residual for the implicit one).
    np.testing.assert_allclose(jnp.sum(sol.ys, axis=1), total, rtol=1e-10)


def test_heat_equation_mode_decays_at_its_eigenvalue():
    model = models.Heat1D(diffusivity=0.1, n=32)
    x = model.grid()
    y0 = jnp.sin(2 * jnp.pi * x)  # discrete Fourier mode k = 2, an exact eigenvector
    ts = jnp.linspace(0.0, 0.5, 6)
    sol = ds.simulate(model, y0, ts, solver=ds.Kvaerno5(rtol=1e-10, atol=1e-12))
    expected = jnp.exp(-model.mode_decay_rate(2) * ts)[:, None] * y0[None, :]
    np.testing.assert_allclose(sol.ys, expected, atol=1e-8)
    # And the discrete rate differs from the continuum kappa (k pi / L)^2 by its leading
    # truncation term, a relative -(k pi dx)^2 / 12 (+ O(dx^4)).
    relative = model.mode_decay_rate(2) / (0.1 * (2 * jnp.pi) ** 2) - 1
    leading = -((2 * jnp.pi * model.spacing) ** 2) / 12
    assert abs(relative - leading) < 0.01 * abs(leading)


def test_kepler_orbit_closes_after_one_period():
    model = models.Kepler(mu=2.0)
    y0 = model.initial_state(0.3, semi_major_axis=1.5)
    period = float(model.period(1.5))
    sol = ds.simulate(model, y0, jnp.array([0.0, period]), solver=ds.Dopri8(rtol=1e-12, atol=1e-12))
    np.testing.assert_allclose(sol.ys[-1], y0, atol=1e-8)
    np.testing.assert_allclose(model.energy(y0), -2.0 / (2 * 1.5), rtol=1e-12)
    np.testing.assert_allclose(
        model.angular_momentum(sol.ys[-1]), model.angular_momentum(y0), rtol=1e-9
    )
