"""Bad input gets a clear error that names the argument and says what to do."""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import diffsim as ds
import models

PENDULUM = models.DampedPendulum(length=1.0, gravity=9.81, damping=0.1)
Y0 = jnp.array([1.0, 0.0])
TS = jnp.linspace(0.0, 1.0, 11)


def _blow_up_model():
    # y' = y^2 from y(0) = 1: y = 1 / (1 - t), infinite at t = 1.
    return ds.ODE(_square, None)


def _square(t, y, params):
    return y**2


# --- output times -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ts, match",
    [
        (jnp.array([0.0, 1.0, 0.5]), "strictly increasing"),
        (jnp.array([1.0, 0.0, 0.5]), "strictly increasing"),
        (jnp.array([0.0, 0.0, 1.0]), "strictly increasing"),
        (jnp.array([0.0]), "at least one later output time"),
        (jnp.zeros((0,)), "at least one later output time"),
        (jnp.zeros((2, 2)), "1-D"),
        (jnp.array([0.0, jnp.nan]), "finite"),
    ],
)
def test_bad_ts(ts, match):
    with pytest.raises(ValueError, match=match):
        ds.simulate(PENDULUM, Y0, ts, solver=ds.RK4(), dt=0.01)


def test_traced_bad_ts_is_flagged_in_the_result():
    run = jax.jit(
        lambda ts: ds.simulate(PENDULUM, Y0, ts, solver=ds.RK4(), steps_per_save=4, throw=False)
    )
    sol = run(jnp.array([0.0, 1.0, 0.5]))
    assert int(sol.result) == ds.RESULTS.invalid_input
    assert bool(jnp.all(jnp.isnan(sol.ys)))  # nothing silently wrong


# --- step size ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", [0.0, -0.01, float("nan"), float("inf")])
def test_bad_dt(dt):
    with pytest.raises(ValueError, match="dt must be a finite number > 0"):
        ds.simulate(PENDULUM, Y0, TS, solver=ds.RK4(), dt=dt)


def test_dt_that_does_not_divide_the_grid_is_the_longest_step():
    # intervals of 0.1 with dt = 0.03: 4 equal steps of 0.025 each, landing on every output time
    sol = ds.simulate(PENDULUM, Y0, TS, solver=ds.RK4(), dt=0.03)
    four = ds.simulate(PENDULUM, Y0, TS, solver=ds.RK4(), steps_per_save=4)
    np.testing.assert_array_equal(sol.ys, four.ys)
    assert int(sol.stats["num_steps"]) == 40
    # a dt longer than an interval: one step of the interval
    once = ds.simulate(PENDULUM, Y0, TS, solver=ds.RK4(), dt=2.0)
    np.testing.assert_array_equal(
        once.ys, ds.simulate(PENDULUM, Y0, TS, solver=ds.RK4(), steps_per_save=1).ys
    )


def test_dt_on_an_uneven_grid_takes_whole_steps_where_it_divides():
    # [0, 0.1, 0.35] with dt = 0.1: one step, then ceil(2.5) = 3 steps of 1/12
    decay = ds.ODE(lambda t, y, p: -p["k"] * y, {"k": 2.0})
    ts = np.array([0.0, 0.1, 0.35])
    sol = ds.simulate(decay, jnp.array([1.0]), ts, solver=ds.RK4(), dt=0.1)
    assert int(sol.stats["num_steps"]) == 4
    step = lambda h: 1 - 2 * h + (2 * h) ** 2 / 2 - (2 * h) ** 3 / 6 + (2 * h) ** 4 / 24  # noqa: E731
    # RK4 on y' = -2y multiplies by step(h) exactly: the default rtol 1e-7 is rounding's margin
    np.testing.assert_allclose(sol.ys[:, 0], [1.0, step(0.1), step(0.1) * step(0.25 / 3) ** 3])


def test_fixed_step_solver_needs_dt():
    with pytest.raises(ValueError, match="fixed-step solver: pass dt="):
        ds.simulate(PENDULUM, Y0, TS, solver=ds.RK4())


def test_dt_with_traced_ts_asks_for_steps_per_save():
    run = jax.jit(lambda ts: ds.simulate(PENDULUM, Y0, ts, solver=ds.RK4(), dt=0.01).ys)
    with pytest.raises(ValueError, match="steps_per_save=N"):
        run(TS)


def test_numpy_times_made_inside_jit_stay_concrete_as_the_error_suggests():
    def final(length):
        model = ds.ODE(lambda t, y, p: -p * y, length)
        return ds.simulate(
            model, jnp.array([1.0]), np.linspace(0.0, 1.0, 5), solver=ds.RK4(), dt=0.05
        ).ys[-1, 0]

    # RK4 on y' = -k y multiplies y by its stability polynomial R(z), z = -k dt, every step:
    # after 20 steps y = R(-0.1)^20 up to rounding.
    z = -0.1
    amplification = 1 + z + z**2 / 2 + z**3 / 6 + z**4 / 24
    assert float(jax.jit(final)(2.0)) == pytest.approx(amplification**20, rel=1e-13)


def test_bad_steps_per_save():
    with pytest.raises(ValueError, match="steps_per_save must be >= 1"):
        ds.simulate(PENDULUM, Y0, TS, solver=ds.RK4(), steps_per_save=0)
    with pytest.raises(TypeError, match="steps_per_save must be a Python int"):
        ds.simulate(PENDULUM, Y0, TS, solver=ds.RK4(), steps_per_save=2.5)


# --- state and parameters -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "model, y0, match",
    [
        (models.Lorenz(), jnp.array([1.0, 1.0]), r"y0 must have shape \(3,\) \(x, y, z\)"),
        (models.Lorenz(), jnp.ones(4), r"y0 must have shape \(3,\)"),
        (PENDULUM, jnp.ones(3), r"y0 must have shape \(2,\)"),
        (models.Kepler(), jnp.ones(3), "y0 does not fit Kepler"),
        (models.NBody(masses=jnp.ones(3)), jnp.ones((2, 4, 2)), "y0 does not fit NBody"),
        (ds.ODE(lambda t, y, p: y[:2], None), jnp.ones(3), "y0 does not fit ODE"),
    ],
    ids=["lorenz-short", "lorenz-long", "pendulum", "kepler", "nbody", "ode"],
)
def test_y0_that_does_not_fit_the_model(model, y0, match):
    with pytest.raises(ValueError, match=match):
        ds.simulate(model, y0, TS, solver=ds.Tsit5())


def test_a_fit_names_a_y0_that_does_not_fit_the_model_before_blaming_observe():
    data = (jnp.array([1.0, 2.0]), jnp.array([0.5, 0.2]))
    with pytest.raises(ValueError, match=r"y0 must have shape \(2,\) .*got \(\)"):
        ds.fit(PENDULUM, 1.0, data, params=["length"], observe=lambda y: y[0])


def test_an_error_raised_by_the_vector_field_keeps_its_type():
    # a user's own TypeError comes back as a TypeError, with the model named
    def broken(t, y, p):
        raise TypeError("my model needs a dict of parameters")

    with pytest.raises(TypeError, match="ODE.*my model needs a dict of parameters"):
        ds.simulate(ds.ODE(broken, None), jnp.ones(2), TS, solver=ds.Tsit5())


@pytest.mark.parametrize(
    "solver", [ds.Tsit5(), ds.RK4(), ds.Rodas5P(), ds.Kvaerno5()], ids=lambda s: type(s).__name__
)
def test_a_vector_field_returning_a_python_number(solver):
    # dy/dt = 1.0 (a Python float, as scipy users write a constant rate): y(2) = 2
    options = {} if solver.adaptive else {"dt": 0.1}
    sol = ds.simulate(
        ds.ODE(lambda t, y, p: 1.0, None),
        jnp.array(0.0),
        jnp.array([0.0, 2.0]),
        solver=solver,
        **options,
    )
    assert float(sol.ys[-1]) == pytest.approx(2.0, rel=1e-12)


def test_nonfinite_y0():
    with pytest.raises(ValueError, match="y0 holds NaN or inf"):
        ds.simulate(PENDULUM, jnp.array([jnp.nan, 0.0]), TS, solver=ds.RK4(), dt=0.01)
    with pytest.raises(ValueError, match=r"y0 holds NaN or inf at \['b'\]"):
        model = ds.ODE(lambda t, y, p: {"a": y["a"], "b": y["b"]}, None)
        ds.simulate(model, {"a": jnp.ones(()), "b": jnp.array(jnp.inf)}, TS, solver=ds.Tsit5())


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: models.DampedPendulum(length=-1.0), r"DampedPendulum\(length=...\): must be > 0"),
        (
            lambda: models.DampedPendulum(length=jnp.nan),
            r"DampedPendulum\(length=...\): must be finite",
        ),
        (lambda: models.DampedPendulum(damping=-0.1), r"damping=...\): must be >= 0"),
        (
            lambda: models.DampedPendulum(drive_amplitude=1.0),
            "both drive_amplitude and drive_frequency",
        ),
        (lambda: models.Lorenz(rho=jnp.ones(2)), r"Lorenz\(rho=...\): expected a scalar"),
        (lambda: models.NBody(masses=jnp.array([1.0, -1.0])), r"NBody\(masses=...\): must be > 0"),
        (lambda: models.Heat1D(n=0), "number of interior points"),
        (lambda: ds.ODE("not a function"), "fn must be callable"),
        (lambda: ds.ODE(lambda t, y, p: y, {"k": float("nan")}), r"params\['k'\]"),
    ],
)
def test_bad_parameters_at_construction(build, match):
    with pytest.raises((ValueError, TypeError), match=match):
        build()


def test_nonfinite_parameter_set_after_construction():
    broken = eqx.tree_at(lambda m: m.gravity, PENDULUM, jnp.asarray(jnp.inf))  # skips __init__
    with pytest.raises(ValueError, match=r"non-finite parameter\(s\) \.gravity"):
        ds.simulate(broken, Y0, TS, solver=ds.RK4(), dt=0.01)
    # throw=False: nothing raises, eagerly as under jit; the result says why
    for model, y0 in ((broken, Y0), (PENDULUM, Y0.at[0].set(jnp.nan))):
        solution = ds.simulate(model, y0, TS, solver=ds.Tsit5(), throw=False)
        assert int(solution.result) == ds.RESULTS.invalid_input
        assert not np.isfinite(np.asarray(solution.ys)).any()


def test_vector_field_that_changes_dtype():
    model = ds.ODE(lambda t, y, p: y * np.float64(2.0), None)  # a float64 constant
    # (Under the suite's strict promotion the product itself fails; users run standard promotion.)
    with jax.numpy_dtype_promotion("standard"):
        with pytest.raises(TypeError, match="returns float64 for a float32 state"):
            ds.simulate(model, jnp.ones(2, jnp.float32), TS, solver=ds.Tsit5())


# --- solvers ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "solver, match",
    [
        (diffrax.Tsit5(), r"wrap it: ds\.Diffrax\(diffrax\.Tsit5\(\)\)"),
        (ds.RK4, r"Pass an instance: solver=ds\.RK4\(\)"),
        ("rk4", "solver must be a diffsim solver"),
    ],
)
def test_not_a_solver(solver, match):
    with pytest.raises(TypeError, match=match):
        ds.simulate(PENDULUM, Y0, TS, solver=solver)


def test_not_a_model():
    with pytest.raises(TypeError, match="model must be a diffsim model"):
        ds.simulate(lambda t, y: -y, Y0, TS, solver=ds.Tsit5())


def test_diffrax_solver_without_error_estimate():
    with pytest.raises(TypeError, match="no error estimate"):
        ds.Diffrax(diffrax.Euler())


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: ds.Tsit5(rtol=-1e-6), r"Tsit5\(rtol=...\): must be >= 0"),
        (lambda: ds.Kvaerno5(atol=-1.0), r"Kvaerno5\(atol=...\): must be >= 0"),
        (lambda: ds.Tsit5(rtol=0.0, atol=0.0), "cannot both be 0"),
        (lambda: ds.Dopri5(dtmin=0.0), r"dtmin=...\): must be > 0"),
    ],
)
def test_bad_tolerances(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_traced_negative_tolerance_is_flagged():
    run = jax.jit(
        lambda rtol: ds.simulate(PENDULUM, Y0, TS, solver=ds.Tsit5(rtol=rtol), throw=False)
    )
    assert int(run(jnp.asarray(-1.0)).result) == ds.RESULTS.invalid_input


@pytest.mark.parametrize(
    "model, solver, match",
    [
        (PENDULUM, ds.Leapfrog(), "does not depend on the velocity"),
        (models.HarmonicOscillator(damping=0.0), ds.Yoshida4(), "does not depend on the velocity"),
        (models.DoublePendulum(), ds.Leapfrog(), "does not depend on the velocity"),
        (
            models.Lorenz(),
            ds.SymplecticEuler(),
            "second-order or separable Hamiltonian models only",
        ),
    ],
)
def test_symplectic_solver_on_unsuitable_model(model, solver, match):
    y0 = jnp.zeros(model.state_shape()) + 0.5
    with pytest.raises(TypeError, match=match):
        ds.simulate(model, y0, TS, solver=solver, dt=0.01)


def test_symplectic_solver_on_non_separable_hamiltonian():
    class Coupled(ds.AbstractHamiltonian):
        def hamiltonian(self, q, p):
            return 0.5 * p**2 * (1 + q**2) + 0.5 * q**2

    with pytest.raises(TypeError, match="needs a separable Hamiltonian"):
        ds.simulate(Coupled(), Y0, TS, solver=ds.Leapfrog(), dt=0.01)


# --- failures during the solve --------------------------------------------------------------------


def test_max_steps_reached():
    with pytest.raises(ds.SimulationError, match="max_steps_reached.*raise max_steps.*max_steps=5"):
        ds.simulate(PENDULUM, Y0, TS, solver=ds.Tsit5(), max_steps=5)


def test_step_size_collapse_at_a_singularity():
    ts = jnp.array([0.0, 2.0])
    with pytest.raises(ds.SimulationError, match="step_size_collapsed.*dtmin"):
        ds.simulate(_blow_up_model(), jnp.ones(()), ts, solver=ds.Tsit5(dtmin=1e-6))


def test_fixed_step_blow_up_says_when():
    ts = jnp.linspace(0.0, 2.0, 21)
    with pytest.raises(ds.SimulationError, match=r"nonfinite_state.*finite up to t=1\b.*t=1\.1"):
        ds.simulate(_blow_up_model(), jnp.ones(()), ts, solver=ds.RK4(), dt=0.01)


def test_failure_inside_jit_raises_with_the_message():
    ts = jnp.linspace(0.0, 2.0, 21)  # closed over, so concrete at trace time
    run = jax.jit(lambda y0: ds.simulate(_blow_up_model(), y0, ts, solver=ds.RK4(), dt=0.01).ys)
    with pytest.raises(Exception, match="the state became non-finite"):
        jax.block_until_ready(run(jnp.ones(())))


def test_throw_false_under_vmap_isolates_failing_members():
    ts = jnp.linspace(0.0, 2.0, 21)
    lengths = jnp.array([1.0, jnp.nan, 2.0])

    def run(length):
        model = eqx.tree_at(lambda m: m.length, PENDULUM, length)
        return ds.simulate(model, Y0, ts, solver=ds.Tsit5(), throw=False)

    batched = jax.vmap(run)(lengths)
    assert batched.result.tolist() == [
        ds.RESULTS.successful,
        ds.RESULTS.invalid_input,
        ds.RESULTS.successful,
    ]
    for i in [0, 2]:
        # Batched and unbatched adaptive steps may differ within rtol 1e-6 (see test_conformance).
        np.testing.assert_allclose(batched.ys[i], run(lengths[i]).ys, rtol=1e-6)
    assert bool(jnp.all(jnp.isnan(batched.ys[1])))


def test_throw_false_blow_up_member_is_flagged():
    def run(y0):
        return ds.simulate(
            _blow_up_model(), y0, jnp.linspace(0.0, 2.0, 21), solver=ds.RK4(), dt=0.01, throw=False
        )

    batched = jax.vmap(run)(jnp.array([1.0, 0.1]))  # blows up at t = 1 and at t = 10
    assert batched.result.tolist() == [ds.RESULTS.nonfinite_state, ds.RESULTS.successful]
    np.testing.assert_allclose(
        batched.ys[1], 0.1 / (1 - 0.1 * jnp.linspace(0.0, 2.0, 21)), rtol=1e-8
    )


def test_throw_true_under_vmap_raises():
    run = jax.vmap(
        lambda y0: (
            ds.simulate(
                _blow_up_model(), y0, jnp.linspace(0.0, 2.0, 21), solver=ds.RK4(), dt=0.01
            ).ys
        )
    )
    with pytest.raises(Exception, match="non-finite"):
        jax.block_until_ready(run(jnp.array([1.0, 0.1])))


def test_a_fit_in_float32_warns_of_a_tolerance_its_type_cannot_meet():
    t = np.linspace(0.1, 2.0, 10)
    data = (t, np.cos(3 * t).astype(np.float32))
    with pytest.warns(ds.PrecisionWarning, match="rtol=1e-08 is below float32's epsilon"):
        ds.fit(
            PENDULUM,
            jnp.array([1.0, 0.0], jnp.float32),
            data,
            params=["length"],
            observe=lambda y: y[0],
            solver=ds.Tsit5(rtol=1e-8, atol=1e-8),
            t0=0.0,
        )


def test_every_result_code_is_in_the_documented_table():
    """docs/api/results.md lists each `ds.RESULTS` code with its name (9 and 10 were missing)."""
    import pathlib

    page = (pathlib.Path(__file__).parents[1] / "docs" / "api" / "results.md").read_text()
    for code in ds.RESULTS:
        assert f"| {int(code)} | `{code.name}` |" in page, code
