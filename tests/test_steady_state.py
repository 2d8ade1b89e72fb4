"""`ds.steady_state`: equilibria against closed forms, derivatives by the implicit function
theorem (first and second order), the equilibrium the trajectory reaches, conserved totals,
the error when there is none, and `ds.fit(..., pre_equilibrate=...)`."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import diffsim as ds
import models

A = jnp.array([[-2.0, 1.0], [0.5, -3.0]])
B = jnp.array([1.0, 2.0])


def _linear(scale, b):
    """y' = scale·A y + b: the equilibrium is -(scale·A)⁻¹ b."""
    return ds.ODE(lambda t, y, p: p["scale"] * (A @ y) + p["b"], {"scale": scale, "b": b})


@pytest.mark.parametrize("method", ["simulate", "newton"])
def test_a_linear_system_and_its_derivatives(method):
    def equilibrium(scale, b):
        return ds.steady_state(_linear(scale, b), jnp.zeros(2), method=method).y

    exact = -np.linalg.solve(np.asarray(A), np.asarray(B))
    state = ds.steady_state(_linear(1.0, B), jnp.zeros(2), method=method)
    np.testing.assert_allclose(state.y, exact, rtol=1e-12)
    assert int(state.result) == 0 and float(state.residual) <= 1
    # implicit function theorem: dy*/db = -A⁻¹ in both modes; y*(s) = -(1/s) A⁻¹ b, so
    # d²y*/ds² = -(2/s³) A⁻¹ b (second order through the implicit adjoint)
    inverse = np.linalg.inv(np.asarray(A))
    np.testing.assert_allclose(jax.jacfwd(equilibrium, 1)(1.0, B), -inverse, rtol=1e-10)
    np.testing.assert_allclose(jax.jacrev(equilibrium, 1)(1.0, B), -inverse, rtol=1e-10)
    if method == "newton":  # the same rule: the search is not differentiated
        second = jax.jacfwd(jax.jacrev(equilibrium))(2.0, B)
        np.testing.assert_allclose(second, -(2 / 8) * inverse @ np.asarray(B), rtol=1e-8)


def test_the_equilibrium_the_trajectory_reaches():
    # logistic growth from 0.1 comes to rest at K = 10; Newton from 0.1 finds the unstable 0
    logistic = ds.ODE(lambda t, y, p: p * y * (1 - y / 10.0), 0.5)
    state = ds.steady_state(logistic, jnp.array([0.1]))
    np.testing.assert_allclose(state.y, [10.0], rtol=1e-12)
    assert 20 < float(state.time) < 200  # ~ln(1e10)/0.5 ≈ 46 to rest at rtol 1e-8
    np.testing.assert_allclose(
        ds.steady_state(logistic, jnp.array([0.1]), method="newton").y, [0.0], atol=1e-12
    )
    rates = jnp.array([0.5, 1.0, 2.0])
    batch = jax.vmap(lambda r: ds.steady_state(ds.ODE(logistic.fn, r), jnp.array([0.1])).y)
    np.testing.assert_allclose(batch(rates), 10.0, rtol=1e-12)


def test_the_stability_test_exponential_is_scipys():
    """The matrix exponential of the stability test (scaling and squaring of a Taylor series)
    against scipy's Padé `expm`, to 1e-13 of its largest entry, from norms of 1e-3 to 1e3, a
    non-normal matrix among them; a matrix of T = 1e9 times a Jacobian with a slow growth
    (1e-8) overflows the test's 1e3 where a slower one (1e-12) or a decay does not; NaN in,
    NaN out."""
    from scipy.linalg import expm

    from diffsim._integrate.steady_state import _exponential

    rng = np.random.default_rng(0)
    for scale in (1e-3, 1.0, 30.0, 1e3):
        a = rng.normal(size=(6, 6)) * scale / 6 - scale * np.eye(6)
        expected = expm(a)
        ours = np.asarray(_exponential(jnp.asarray(a)))
        # 1e-13: double round-off (2e-16) grown through up to 12 squarings and both methods'
        # own rounding; a series cut short is off by 1e-6 (5 terms)
        np.testing.assert_allclose(ours, expected, atol=1e-13 * np.max(np.abs(expected)))
    shear = np.array([[-1.0, 50.0], [0.0, -2.0]])  # non-normal: a transient growth
    # 1e-12 relative: the transient's entry (11.6) and the decayed ones (0.37, 0.14) alike
    np.testing.assert_allclose(_exponential(jnp.asarray(shear)), expm(shear), rtol=1e-12)
    for rate, stable in ((-1.0, True), (0.0, True), (1e-12, True), (1e-8, False)):
        a = jnp.array([[rate, 1.0], [0.0, -1.0]]) * 1e9
        assert bool(jnp.all(jnp.abs(_exponential(a)) <= 1e3)) == stable
    assert bool(jnp.all(jnp.isnan(_exponential(jnp.full((2, 2), jnp.nan)))))


def test_a_start_within_the_tolerance_of_an_unstable_equilibrium_goes_where_the_flow_goes():
    """An epidemic from I0 = 1e-11 (R0 = 2.5): the field at the start is below atol, so the
    start was "at rest" and S* = 1 (the disease-free state, unstable) was returned as found.
    The trajectory leaves it and rests at the final size S = exp(−R0 (1 − S)) (here from S0 =
    1 − I0: ln(S0/S) = R0 (1 − S)). A start exactly on the unstable state stays there (y* =
    y0), with an explicit solver too (whose run to max_time ends at max_steps: the
    linearised flow decides); y' = y from 1e-20, which leaves and never rests, finds none."""
    from scipy.optimize import brentq

    beta, gamma = 0.5, 0.2

    def sir(t, y, p):
        infection = p["beta"] * y[0] * y[1]
        return jnp.stack([-infection, infection - p["gamma"] * y[1], p["gamma"] * y[1]])

    model = ds.ODE(sir, {"beta": beta, "gamma": gamma})
    i0 = 1e-11
    final = brentq(lambda s: np.log((1 - i0) / s) - beta / gamma * (1 - s), 1e-6, 1 - 1e-9)
    state = ds.steady_state(model, jnp.array([1 - i0, i0, 0.0]))
    # the solve's global error through 25 e-folds of the epidemic's growth at rtol 1e-8 (5e-7
    # measured); S* = 1 returned before is 9x off
    np.testing.assert_allclose(state.y[0], final, rtol=2e-6)
    assert float(state.time) > 50  # the epidemic's course, not 0
    for solver in (ds.Rodas5P(), ds.Tsit5()):
        on = ds.steady_state(model, jnp.array([1.0, 0.0, 0.0]), solver=solver)
        np.testing.assert_array_equal(on.y, [1.0, 0.0, 0.0])
    # (with Tsit5: Rodas5P's long steps damp a growing state below atol, R(hλ) → 0, and
    # follow it to 4e-53 at max_time, where it is at rest: zero to the tolerance)
    growth = ds.ODE(lambda t, y, p: y, None)
    leaves = ds.steady_state(growth, jnp.array([1e-20]), solver=ds.Tsit5(), throw=False)
    assert int(leaves.result) != ds.RESULTS.successful
    assert bool(jnp.all(jnp.isnan(leaves.y)))
    assert bool(jnp.isnan(leaves.time))  # it never came to rest


def test_a_conserved_total_fixes_the_equilibrium_by_y0():
    # A <-> B with rates 1 and 2: the total a + b is conserved (the Jacobian is singular, so
    # Newton takes no step) and the equilibrium a = 2 T / 3 depends on y0 through it
    model = ds.ODE(
        lambda t, y, k: jnp.stack([-k[0] * y[0] + k[1] * y[1], k[0] * y[0] - k[1] * y[1]]),
        jnp.array([1.0, 2.0]),
    )
    y0 = jnp.array([3.0, 0.0])
    # Newton polishes with the totals held (f(y) + UUᵀ(y − y_rest) = 0, regular where J is
    # not): exact but for round-off, by either method (Newton from y0 keeps y0's totals)
    for method in ("simulate", "newton"):
        state = ds.steady_state(model, y0, method=method)
        np.testing.assert_allclose(state.y, [2.0, 1.0], rtol=1e-12)
    jacobian = jax.jacfwd(lambda y0: ds.steady_state(model, y0).y)(y0)
    np.testing.assert_allclose(jacobian, [[2 / 3, 2 / 3], [1 / 3, 1 / 3]], rtol=1e-12)


def test_a_delay_equation_rests_where_its_field_with_the_present_state_vanishes():
    """y' = −2y + y(t − 1) + c with the history 0.5: at rest y(t − 1) = y, so y* = c whatever
    the lag and the history, and dy*/dc = 1. Newton used to solve the field with the history
    frozen (y = (0.5 + c)/2, reported as success), and the trajectory never came to rest by
    that field (max_steps_reached)."""

    def rest(c, method):
        model = ds.DDE(
            lambda t, y, yd, p: -2 * y + yd[0] + p, c, delays=(1.0,), history=jnp.array([0.5])
        )
        return ds.steady_state(model, jnp.array([0.5]), method=method)

    for method in ("newton", "simulate"):
        state = rest(1.0, method)
        np.testing.assert_allclose(state.y, [1.0], rtol=1e-12)
        np.testing.assert_allclose(jax.grad(lambda c: rest(c, method).y[0])(1.0), 1.0, rtol=1e-9)
    # y' = −y(t − 1) from 1 decays to 0 through oscillations: its rate vanishes at t = 2 (a
    # turning point) and f(y, y) = −y at t = 1 (a zero crossing); rest needs both at once
    decaying = ds.DDE(lambda t, y, yd, p: -yd[0], None, delays=(1.0,), history=jnp.array([1.0]))
    state = ds.steady_state(decaying, jnp.array([1.0]))
    np.testing.assert_allclose(state.y, [0.0], atol=1e-10)
    assert float(state.time) > 20
    # Mackey–Glass on its chaotic attractor passes through its equilibrium but never rests
    chaotic = ds.steady_state(models.MackeyGlass(), jnp.array([0.5]), max_time=300.0, throw=False)
    assert int(chaotic.result) == ds.RESULTS.no_steady_state


def test_an_explicit_solver_brings_the_state_near_rest_and_newton_finishes():
    """Tsit5's steps sit at its stability limit as y' = 1 − y settles, with an error of its
    own tolerance (rtol 1e-6) that never fell to steady_state's 1e-8: it ran to max_steps and
    returned NaN with the advice to use a stiff solver. Rest is now judged at the solver's
    tolerance, and Newton polishes to steady_state's."""
    model = ds.ODE(lambda t, y, p: 1.0 - y, None)
    state = ds.steady_state(model, jnp.array([0.0]), solver=ds.Tsit5())
    np.testing.assert_allclose(state.y, [1.0], rtol=1e-12)
    assert 5 < float(state.time) < 30  # e^-t below 1e-6 after t ≈ 14


def test_no_equilibrium_is_an_error_that_says_so():
    oscillator = ds.ODE(lambda t, y, p: jnp.stack([y[1], -y[0]]), None)
    with pytest.raises(ds.SimulationError, match="no_steady_state.*did not come to rest"):
        ds.steady_state(oscillator, jnp.array([1.0, 0.0]), max_time=100.0)
    state = ds.steady_state(oscillator, jnp.array([1.0, 0.0]), max_time=100.0, throw=False)
    assert int(state.result) == ds.RESULTS.no_steady_state
    assert bool(jnp.all(jnp.isnan(state.y)))
    # y' = 1 is "at rest" to rtol 1e-8 once y = 1e8: growth is told from settling by its rate
    # (a stiff solver's run to steady_state's own tolerance once returned y = 1e8 as found)
    for solver in (ds.Rodas5P(), ds.Tsit5()):
        state = ds.steady_state(
            ds.ODE(lambda t, y, p: jnp.ones_like(y), None), jnp.ones(1), solver=solver, throw=False
        )
        assert int(state.result) == ds.RESULTS.no_steady_state, solver
    with pytest.raises(ValueError, match="method must be one of"):
        ds.steady_state(oscillator, jnp.ones(2), method="bisection")
    with pytest.raises(TypeError, match="adaptive solver"):
        ds.steady_state(oscillator, jnp.ones(2), solver=ds.RK4())
    with pytest.raises(ValueError, match="y0 holds NaN or inf; start from a finite state"):
        ds.steady_state(oscillator, jnp.array([jnp.nan, 0.0]))
    with pytest.raises(ValueError, match=r"rtol must be a number .* got shape \(2,\)"):
        ds.steady_state(oscillator, jnp.ones(2), rtol=jnp.array([1e-8, 1e-8]))
    with pytest.raises(ValueError, match="rtol and atol are both 0"):
        ds.steady_state(oscillator, jnp.ones(2), rtol=0.0, atol=0.0)


def test_a_nan_start_under_jit_is_invalid_not_a_steady_state():
    # the simulation replaces an invalid member's inputs by finite stand-ins, which came to
    # rest: y' = 2 − y from NaN reported success with y = 2
    model = ds.ODE(lambda t, y, p: 2.0 - y, None)
    find = jax.jit(lambda y0: ds.steady_state(model, y0, throw=False))
    state = find(jnp.array([jnp.nan]))
    assert int(state.result) == ds.RESULTS.invalid_input and bool(jnp.isnan(state.y[0]))
    np.testing.assert_allclose(find(jnp.array([0.0])).y, [2.0], rtol=1e-12)


class _Turnover(ds.AbstractODE):
    """y' = k_in + stimulus - k_out y: at rest k_in / k_out before the stimulus."""

    k_in: jax.Array
    k_out: jax.Array
    stimulus: jax.Array

    def vector_field(self, t, y, args=None):
        return self.k_in + self.stimulus - self.k_out * y


def test_a_fit_starts_from_the_pre_stimulus_steady_state():
    # a system at rest (k_in / k_out = 4) when a stimulus of 1 starts at t = 0; the data
    # after it determine both rates only through the equilibrium the fit starts from
    k_in, k_out, stimulus = 2.0, 0.5, 1.0
    ts = np.linspace(0.5, 10.0, 20)
    rest, after = k_in / k_out, (k_in + stimulus) / k_out
    values = after + (rest - after) * np.exp(-k_out * ts)
    guess = _Turnover(jnp.array(1.0), jnp.array(1.0), jnp.array(stimulus))

    def unstimulated(model):
        return eqx.tree_at(lambda m: m.stimulus, model, jnp.zeros(()))

    result = ds.fit(
        guess,
        jnp.array([1.0]),  # where the pre-equilibration starts
        (ts, values),
        params=["k_in", "k_out"],
        t0=0.0,
        screen=1,
        pre_equilibrate=unstimulated,
    )
    assert result.converged
    assert result.params["k_in"] == pytest.approx(k_in, rel=1e-6)
    assert result.params["k_out"] == pytest.approx(k_out, rel=1e-6)
    with pytest.raises(TypeError, match="pre_equilibrate must be True"):
        ds.fit(guess, jnp.array([1.0]), (ts, values), params=["k_in"], pre_equilibrate=1)
    # a model without a steady state (k_out = 0: y grows for ever): the failure said "cannot
    # be simulated at the guess" and never named the pre-equilibration
    growing = _Turnover(jnp.array(1.0), jnp.array(0.0), jnp.array(stimulus))
    with pytest.raises(ValueError, match="with pre_equilibrate, the simulation starts from"):
        ds.fit(
            growing,
            jnp.array([1.0]),
            (ts, values),
            params=["k_in"],
            t0=0.0,
            screen=1,
            pre_equilibrate=True,
        )
