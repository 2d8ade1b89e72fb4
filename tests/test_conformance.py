"""Every model with a suitable solver, and every solver on a common model, under `jit` and
`vmap`: dtype kept, vmapped results equal to one-by-one results, no recompilation when parameter
values change."""

import equinox as eqx
import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import ALL_SOLVERS, first_parameter, MODEL_CASES, solver_id

import diffsim as ds
import models


def _tolerance(dtype, solver=None):
    """How far a vmapped result may be from the one-by-one result (relative to the scale)."""
    if isinstance(solver, ds.AbstractAdaptiveSolver):
        # Rounding differences between the batched and unbatched programs can flip an accept/reject
        # decision of the step-size controller: a different, equally valid step sequence whose
        # results differ within the solver's tolerance.
        return max(10 * float(solver.rtol), 300 * float(jnp.finfo(dtype).eps))
    # Fixed-step: the same arithmetic, possibly fused differently: a few hundred ulps.
    return 300 * float(jnp.finfo(dtype).eps)


# Robertson in float32 (Kvaerno5, ~25 s to compile) is a slow extra; float64 runs by default
_MODEL_DTYPES = [
    pytest.param(
        name,
        dtype,
        id=f"{name}-{label}",
        marks=[pytest.mark.slow] if (name, label) == ("Robertson", "f32") else [],
    )
    for name in MODEL_CASES
    for dtype, label in ((jnp.float32, "f32"), (jnp.float64, "f64"))
]


@pytest.mark.parametrize("name, dtype", _MODEL_DTYPES)
def test_every_model_under_jit_and_vmap(name, dtype):
    model, y0, solver, dt = MODEL_CASES[name]
    y0 = jax.tree.map(lambda x: x.astype(dtype), y0)
    ts = jnp.linspace(0.0, 1.0, 11, dtype=dtype)  # closed over: a constant of the trace
    param = first_parameter(model)
    kwargs = {} if dt is None else {"dt": dt}

    @eqx.filter_jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def run(value):
        member = eqx.tree_at(lambda m: getattr(m, param), model, value)
        return ds.simulate(member, y0, ts, solver=solver, throw=False, **kwargs)

    base = getattr(model, param)
    values = jnp.stack([base, base * 1.01, base * 0.99])
    one_by_one = [run(v) for v in values]  # three values, one trace
    for sol in one_by_one:
        assert bool(sol.succeeded), (name, ds.RESULTS(int(sol.result)))
        assert sol.ys.dtype == dtype
    batched = jax.jit(jax.vmap(run))(values)
    assert batched.ys.dtype == dtype and batched.ys.shape == (3, *one_by_one[0].ys.shape)
    scale = max(float(jnp.max(jnp.abs(s.ys))) for s in one_by_one)
    for i, sol in enumerate(one_by_one):
        np.testing.assert_allclose(
            batched.ys[i], sol.ys, atol=_tolerance(dtype, solver) * scale, rtol=0
        )
    assert not np.allclose(one_by_one[0].ys, one_by_one[1].ys)  # the parameter did take effect


# Dopri5 and Dopri8 take Tsit5's code path (explicit diffrax solver): slow extras
@pytest.mark.parametrize(
    "solver",
    [
        pytest.param(s, marks=pytest.mark.slow) if isinstance(s, (ds.Dopri5, ds.Dopri8)) else s
        for s in ALL_SOLVERS
    ],
    ids=solver_id,
)
def test_every_solver_under_jit_vmap_and_new_values(solver):
    model = models.HarmonicOscillator(omega=2.0)
    ts = jnp.linspace(0.0, 1.0, 6)
    kwargs = {"dt": 0.01} if isinstance(solver, ds.AbstractFixedStepSolver) else {}

    @eqx.filter_jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def run(omega, y0):
        return ds.simulate(
            eqx.tree_at(lambda m: m.omega, model, omega),
            y0,
            ts,
            solver=solver,
            throw=False,
            **kwargs,
        ).ys

    y0s = jnp.array([[1.0, 0.0], [0.5, 0.3], [0.0, 1.0]])
    omegas = jnp.array([2.0, 2.5, 3.0])
    singles = jnp.stack([run(w, y) for w, y in zip(omegas, y0s)])
    batched = jax.vmap(run)(omegas, y0s)
    np.testing.assert_allclose(batched, singles, atol=_tolerance(jnp.float64, solver), rtol=0)
    for w, y, ys in zip(omegas, y0s, singles):
        exact = models.HarmonicOscillator(omega=w).analytic_solution(y, ts)
        # dt = 0.01 for fixed-step (Euler's error ~ h * t * omega^2 ~ 0.1), rtol 1e-8 adaptive
        np.testing.assert_allclose(ys, exact, atol=0.2 if solver.order == 1 else 1e-3)


def test_simulate_inside_user_jit_with_closed_over_ts():
    # The documented pattern: ts is a constant of the user's jit, so dt is checked against it.
    model = models.DampedPendulum(length=1.0, gravity=9.81, damping=0.1)
    ts = jnp.linspace(0.0, 2.0, 21)

    @jax.jit
    def final_angle(length, y0):
        m = models.DampedPendulum(length=length, gravity=9.81, damping=0.1)
        return ds.simulate(m, y0, ts, solver=ds.RK4(), dt=0.01).ys[-1, 0]

    y0 = jnp.array([1.0, 0.0])
    eager = ds.simulate(model, y0, ts, solver=ds.RK4(), dt=0.01).ys[-1, 0]
    np.testing.assert_allclose(final_angle(jnp.asarray(1.0), y0), eager, rtol=1e-12)


def test_traced_ts_with_steps_per_save():
    model = models.HarmonicOscillator(omega=1.0)
    y0 = jnp.array([1.0, 0.0])

    @jax.jit
    def run(ts):
        return ds.simulate(model, y0, ts, solver=ds.RK4(), steps_per_save=50).ys

    ts = jnp.linspace(0.0, 3.0, 4)
    np.testing.assert_allclose(run(ts), model.analytic_solution(y0, ts), atol=1e-8)
    # The output times are a traced input: a new grid reuses the compiled program.
    np.testing.assert_allclose(run(ts * 2), model.analytic_solution(y0, ts * 2), atol=1e-7)


def test_pytree_state_and_plain_function_model():
    def decay(t, y, params):
        return {"a": -params["k"] * y["a"], "b": params["k"] * y["a"]}

    model = ds.ODE(decay, {"k": 0.5})
    y0 = {"a": jnp.asarray(1.0), "b": jnp.asarray(0.0)}
    ts = jnp.linspace(0.0, 2.0, 5)
    for solver, kwargs in [(ds.RK4(), {"dt": 0.01}), (ds.Tsit5(rtol=1e-10, atol=1e-10), {})]:
        sol = ds.simulate(model, y0, ts, solver=solver, **kwargs)
        np.testing.assert_allclose(sol.ys["a"], jnp.exp(-0.5 * ts), atol=1e-8)
        np.testing.assert_allclose(sol.ys["a"] + sol.ys["b"], 1.0, atol=1e-12)


def test_vector_field_is_a_diffrax_term():
    import diffrax

    model = models.Lorenz()
    y0 = jnp.array([1.0, 1.0, 1.0])
    ts = jnp.linspace(0.0, 1.0, 5)
    direct = diffrax.diffeqsolve(
        diffrax.ODETerm(model.vector_field),
        diffrax.Tsit5(),
        0.0,
        1.0,
        0.01,
        y0,
        saveat=diffrax.SaveAt(ts=ts),
        stepsize_controller=diffrax.PIDController(rtol=1e-10, atol=1e-10),
    )
    # the same first step: simulate's own default is Hairer's rule, which diffrax 0.7 skips
    ours = ds.simulate(model, y0, ts, solver=ds.Tsit5(rtol=1e-10, atol=1e-10), dt=0.01)
    np.testing.assert_allclose(ours.ys, direct.ys, rtol=1e-12)
    assert int(ours.stats["num_steps"]) == int(direct.stats["num_accepted_steps"])
    assert int(ours.stats["num_rejected_steps"]) == int(direct.stats["num_rejected_steps"])


def test_non_uniform_grid_with_dt():
    model = models.HarmonicOscillator(omega=1.0)
    y0 = jnp.array([1.0, 0.0])
    ts = jnp.array([0.0, 0.1, 0.5, 2.0])  # 10, 40 and 150 steps of 0.01
    sol = ds.simulate(model, y0, ts, solver=ds.RK4(), dt=0.01)
    assert int(sol.stats["num_steps"]) == 200
    np.testing.assert_allclose(sol.ys, model.analytic_solution(y0, ts), atol=1e-9)


def test_second_order_state_as_tuple_or_stacked():
    model = models.DampedPendulum(length=1.0, gravity=9.81, damping=0.2)
    ts = jnp.linspace(0.0, 1.0, 3)
    stacked = ds.simulate(model, jnp.array([1.0, 0.0]), ts, solver=ds.RK4(), dt=0.01)
    pair = ds.simulate(model, (jnp.asarray(1.0), jnp.asarray(0.0)), ts, solver=ds.RK4(), dt=0.01)
    np.testing.assert_allclose(stacked.ys[:, 0], pair.ys[0], rtol=1e-14)
    np.testing.assert_allclose(stacked.ys[:, 1], pair.ys[1], rtol=1e-14)


def test_program_size_does_not_grow_with_the_number_of_steps():
    # The time loop is a scan: the traced program is the same for 10 and 100,000 steps, which is
    # why compile time does not depend on the step count (measured in experiments/bench).
    model = models.DampedPendulum(length=1.0, gravity=9.81, damping=0.1)
    y0 = jnp.array([1.0, 0.0])

    def size(jaxpr):  # equations, counting those inside loops and branches
        return len(jaxpr.eqns) + sum(size(sub) for sub in jax.extend.core.subjaxprs(jaxpr))

    def program(steps):
        ts = jnp.array([0.0, 10.0])
        run = lambda y: ds.simulate(model, y, ts, solver=ds.RK4(), dt=10.0 / steps).ys  # noqa: E731
        return size(jax.make_jaxpr(run)(y0).jaxpr)

    assert program(10) == program(100_000)


@pytest.mark.parametrize("name", list(MODEL_CASES))
def test_vector_field_of_every_model_is_a_diffrax_term(name):
    import diffrax

    model, y0, _, _ = MODEL_CASES[name]
    term = diffrax.ODETerm(model.vector_field)
    expected = model.vector_field(jnp.asarray(0.3), y0)
    got = term.vf(jnp.asarray(0.3), y0, None)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), got, expected))


def test_hessian_through_a_fixed_step_solve():
    # DESIGN's example: jax.hessian of a loss through RK4, against central differences of grad.
    model = models.DampedPendulum(length=1.0, gravity=9.81, damping=0.1)
    y0 = jnp.array([1.0, 0.0])
    ts = jnp.linspace(0.0, 2.0, 21)
    data = ds.simulate(model, y0, ts, solver=ds.RK4(), dt=0.01).ys[:, 0] + 0.05

    def loss(length):
        m = eqx.tree_at(lambda m: m.length, model, length)
        return jnp.mean((ds.simulate(m, y0, ts, solver=ds.RK4(), dt=0.01).ys[:, 0] - data) ** 2)

    length = jnp.asarray(1.1)
    hessian = jax.hessian(loss)(length)
    h = 1e-4  # central difference of an exact gradient: error ~h^2 * f'''' ~ 1e-8 relative
    fd = (jax.grad(loss)(length + h) - jax.grad(loss)(length - h)) / (2 * h)
    np.testing.assert_allclose(hessian, fd, rtol=1e-6)


def test_simulate_runs_under_disable_jit():
    # debugging with jax.disable_jit() hands the step loop Python ints, not arrays
    model = models.HarmonicOscillator(omega=2.0)
    y0, ts = jnp.array([1.0, 0.0]), jnp.array([0.0, 0.5])
    compiled = ds.simulate(model, y0, ts, solver=ds.RK4(), dt=0.1)
    with jax.disable_jit():
        eager = ds.simulate(model, y0, ts, solver=ds.RK4(), dt=0.1)
    np.testing.assert_allclose(eager.ys, compiled.ys, rtol=1e-12)  # same arithmetic, unfused


def test_fsal_splittings_carry_the_closing_force_into_the_next_step():
    # Leapfrog and Yoshida4 end with a kick at the step's end, whose force opens the next
    # step: the loop evaluates it once (1 and 3 forces per step, plus one per output interval)
    # and the states are those of the step taken on its own, repeated
    import jax
    from jax import lax

    model = models.Kepler()
    y0 = model.initial_state(0.5)
    ts = jnp.linspace(0.0, 2 * jnp.pi, 5)
    steps, dt = 400, float(2 * jnp.pi / 400)
    for solver, forces_per_step in [(ds.Leapfrog(), 1), (ds.Yoshida4(), 3)]:
        assert solver.fsal
        sol = ds.simulate(model, y0, ts, solver=solver, steps_per_save=steps // 4)
        assert int(sol.stats["num_function_evals"]) == steps * forces_per_step + 4

        def reference_step(y, j, solver=solver):
            return solver.step(model, j.astype(y.dtype) * dt, y, dt), None

        alone, _ = jax.jit(lambda y: lax.scan(reference_step, y, jnp.arange(steps)))(y0)
        # the same forces in the same order (Kepler's force has no time argument): equal up to
        # how XLA fuses the two loops, round-off of ~1e-16 a step over 400 steps
        np.testing.assert_allclose(sol.ys[-1], alone, rtol=1e-12, atol=1e-12)
    assert not ds.SymplecticEuler().fsal  # its last kick is empty
