"""`ds.steady_state`: equilibria against closed forms, derivatives by the implicit function
theorem (first and second order), the equilibrium the trajectory reaches, conserved totals,
the error when there is none, and `ds.fit(..., pre_equilibrate=...)`."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import diffsim as ds

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


def test_a_conserved_total_fixes_the_equilibrium_by_y0():
    # A <-> B with rates 1 and 2: the total a + b is conserved (the Jacobian is singular, so
    # Newton takes no step) and the equilibrium a = 2 T / 3 depends on y0 through it
    model = ds.ODE(
        lambda t, y, k: jnp.stack([-k[0] * y[0] + k[1] * y[1], k[0] * y[0] - k[1] * y[1]]),
        jnp.array([1.0, 2.0]),
    )
    y0 = jnp.array([3.0, 0.0])
    # Newton has no step on a singular J: the state is the simulation's at rest (rtol 1e-8 on
    # the vector field, the time scale 1/3), so ~1e-8 off; 1e-7 leaves a margin
    np.testing.assert_allclose(ds.steady_state(model, y0).y, [2.0, 1.0], rtol=1e-7)
    jacobian = jax.jacfwd(lambda y0: ds.steady_state(model, y0).y)(y0)
    # the rule's J is taken at that state: its ~1e-8 error, amplified by the solve with J + UUᵀ
    np.testing.assert_allclose(jacobian, [[2 / 3, 2 / 3], [1 / 3, 1 / 3]], rtol=1e-6)


def test_no_equilibrium_is_an_error_that_says_so():
    oscillator = ds.ODE(lambda t, y, p: jnp.stack([y[1], -y[0]]), None)
    with pytest.raises(ds.SimulationError, match="no_steady_state.*did not come to rest"):
        ds.steady_state(oscillator, jnp.array([1.0, 0.0]), max_time=100.0)
    state = ds.steady_state(oscillator, jnp.array([1.0, 0.0]), max_time=100.0, throw=False)
    assert int(state.result) == ds.RESULTS.no_steady_state
    assert bool(jnp.all(jnp.isnan(state.y)))
    with pytest.raises(ValueError, match="method must be one of"):
        ds.steady_state(oscillator, jnp.ones(2), method="bisection")
    with pytest.raises(TypeError, match="adaptive solver"):
        ds.steady_state(oscillator, jnp.ones(2), solver=ds.RK4())


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
