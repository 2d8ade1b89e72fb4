"""Adaptive and stiff solvers against scipy's solve_ivp (DOP853 at rtol 1e-12)."""

import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import diffsim as ds
import models


# Independent NumPy right-hand sides (written from the equations, not from the models' code), so
# that the reference is fast and shares no code with what it checks.
def _lorenz(t, y, sigma=10.0, rho=28.0, beta=8.0 / 3.0):
    return [sigma * (y[1] - y[0]), y[0] * (rho - y[2]) - y[1], y[0] * y[1] - beta * y[2]]


def _robertson(t, y, k1=0.04, k2=3e7, k3=1e4):
    return [
        -k1 * y[0] + k3 * y[1] * y[2],
        k1 * y[0] - k2 * y[1] ** 2 - k3 * y[1] * y[2],
        k2 * y[1] ** 2,
    ]


def _reference(rhs, y0, ts):
    ref = solve_ivp(
        rhs,
        (ts[0], ts[-1]),
        np.asarray(y0),
        method="DOP853",
        t_eval=np.asarray(ts),
        rtol=1e-12,
        atol=1e-14,
    )
    assert ref.success
    return ref.y.T


@pytest.mark.parametrize(
    "solver, tol",
    [
        # Lorenz over t in [0, 2]: local errors at rtol 1e-10 accumulate over ~1e3 steps and are
        # amplified by exp(0.9 t) ~ 6 (largest Lyapunov exponent ~0.9): a few 1e-7 relative.
        (ds.Tsit5(rtol=1e-10, atol=1e-10), 1e-6),
        (ds.Dopri5(rtol=1e-10, atol=1e-10), 1e-6),
        (ds.Dopri8(rtol=1e-10, atol=1e-10), 1e-6),
        (ds.Diffrax(__import__("diffrax").Bosh3(), rtol=1e-10, atol=1e-10), 1e-6),
    ],
    ids=["Tsit5", "Dopri5", "Dopri8", "Diffrax(Bosh3)"],
)
def test_nonstiff_lorenz_against_scipy(solver, tol):
    model = models.Lorenz()
    y0 = jnp.array([1.0, 1.0, 1.0])
    ts = jnp.linspace(0.0, 2.0, 21)
    sol = ds.simulate(model, y0, ts, solver=solver, max_steps=200_000)
    ref = _reference(_lorenz, y0, ts)
    scale = np.max(np.abs(ref), axis=0)  # component magnitudes (z ~ 30, x ~ 15)
    np.testing.assert_allclose(np.asarray(sol.ys) / scale, ref / scale, atol=tol, rtol=0)


@pytest.mark.parametrize(
    "solver, rtol",
    [
        # Stiff Robertson over t in [0, 10] (scipy's DOP853 needs ~7e4 evaluations). The
        # fast species y2 ~ 3e-5 is compared relative to itself; 1e-6 allows Newton tolerance
        # and error accumulation over the stiff transient at rtol 1e-10.
        (ds.Kvaerno5(rtol=1e-10, atol=1e-14), 1e-6),
        (ds.Diffrax(__import__("diffrax").Kvaerno3(), rtol=1e-10, atol=1e-14), 1e-6),
    ],
    ids=["Kvaerno5", "Diffrax(Kvaerno3)"],
)
def test_stiff_robertson_against_scipy(solver, rtol):
    model = models.Robertson()
    y0 = jnp.array([1.0, 0.0, 0.0])
    ts = jnp.array([0.0, 0.1, 1.0, 10.0])
    sol = ds.simulate(model, y0, ts, solver=solver, max_steps=100_000)
    ref = _reference(_robertson, y0, ts)
    np.testing.assert_allclose(sol.ys[1:], ref[1:], rtol=rtol)


def test_tolerance_change_does_not_recompile():
    import equinox as eqx

    model = models.Lorenz()
    y0 = jnp.array([1.0, 1.0, 1.0])
    ts = jnp.linspace(0.0, 1.0, 11)

    @eqx.debug.assert_max_traces(max_traces=1)
    def run(solver):
        return ds.simulate(model, y0, ts, solver=solver)

    run_jit = eqx.filter_jit(run)
    coarse = run_jit(ds.Tsit5(rtol=1e-4, atol=1e-4))
    fine = run_jit(ds.Tsit5(rtol=1e-9, atol=1e-9))
    assert int(fine.stats["num_steps"]) > int(coarse.stats["num_steps"])


def test_new_initial_step_does_not_recompile(caplog):
    import logging

    import jax

    model = models.Lorenz()
    y0 = jnp.array([1.0, 1.0, 1.0])
    ts = jnp.linspace(0.0, 0.5, 6)
    solver = ds.Tsit5(rtol=1e-6, atol=1e-6)
    ds.simulate(model, y0, ts, solver=solver, dt=0.1)  # compiles
    with caplog.at_level(logging.WARNING, logger="jax"), jax.log_compiles(True):
        for dt in (0.05, 0.02):
            ds.simulate(model, y0, ts, solver=solver, dt=dt)
    compiles = [r.getMessage()[:80] for r in caplog.records if "Compiling" in r.getMessage()]
    assert not [c for c in compiles if "solve_adaptive" in c], compiles


# --- the lean loop of undifferentiated explicit solves (diffsim/_integrate/erk_loop.py) ----------


# the end time alone (Tsit5), and 41 output times inside steps (every pair)
@pytest.mark.parametrize(
    "solver_cls, n_times", [(ds.Tsit5, 2), (ds.Tsit5, 41), (ds.Dopri5, 41), (ds.Dopri8, 41)]
)
def test_lean_loop_takes_diffraxs_steps(solver_cls, n_times):
    # adjoint="checkpoint" runs diffrax's own loop: the lean loop must take the same accepted
    # and rejected steps and agree to round-off (float64 Lorenz over [0, 4]: local round-off
    # ~1e-16 amplified by exp(0.9 t) ~ 40 and ~500 steps: well below 1e-11)
    model = models.Lorenz()
    y0 = jnp.array([1.0, 0.0, 0.0])
    ts = jnp.linspace(0.0, 4.0, n_times)
    solver = solver_cls(rtol=1e-7, atol=1e-7, step_to_outputs=False)
    lean = ds.simulate(model, y0, ts, solver=solver)
    reference = ds.simulate(model, y0, ts, solver=solver, adjoint="checkpoint")
    for stat in ("num_steps", "num_rejected_steps", "num_function_evals"):
        assert int(lean.stats[stat]) == int(reference.stats[stat]), stat
    assert int(lean.stats["num_rejected_steps"]) > 0  # the rejection path was exercised
    np.testing.assert_allclose(lean.ys, reference.ys, rtol=1e-11, atol=1e-11)
    # stepping to the outputs takes the steps of diffrax's PIDController(step_ts=ts); diffrax
    # then evaluates its interpolant at the step end, the lean loop keeps the step's own state
    # (for Dopri8 they differ by ~1e-10, the error of diffrax's interpolant for it)
    solver = solver_cls(rtol=1e-7, atol=1e-7, step_to_outputs=True)
    lean = ds.simulate(model, y0, ts, solver=solver)
    reference = ds.simulate(model, y0, ts, solver=solver, adjoint="checkpoint")
    for stat in ("num_steps", "num_rejected_steps"):
        assert int(lean.stats[stat]) == int(reference.stats[stat]), stat
    np.testing.assert_allclose(lean.ys, reference.ys, rtol=1e-8, atol=1e-8)


def test_a_field_costly_to_compile_takes_its_stages_in_a_loop(monkeypatch):
    """A neural vector field (an MLP of 1,218 weights) is stepped with its stages in a loop
    (one copy of the network in the compiled step, `erk_loop.is_costly`): the same accepted
    and rejected steps as diffrax's own loop and the written-out stages, the same values to
    round-off, and the same gradient for every weight."""
    import equinox as eqx
    import jax

    from diffsim._integrate import erk_loop

    class Hybrid(ds.AbstractODE):
        net: eqx.nn.MLP

        def vector_field(self, t, y, args=None):
            return jnp.stack([y[1], -y[0]]) + 0.1 * self.net(y)

    net = eqx.nn.MLP(2, 2, 32, 2, activation=jnp.tanh, key=jax.random.PRNGKey(0))
    model = Hybrid(net)  # float64, as every test here
    y0, ts = jnp.array([1.0, 0.0]), jnp.linspace(0.0, 3.0, 7)
    assert erk_loop.is_costly(model.vector_field, y0)
    assert not erk_loop.is_costly(models.Lorenz().vector_field, jnp.ones(3))
    # a wide network runs its stages written out (its run time outweighs the compile time)
    wide = Hybrid(eqx.nn.MLP(2, 2, 200, 2, key=jax.random.PRNGKey(1)))
    assert not erk_loop.is_costly(wide.vector_field, y0)
    solver = ds.Tsit5(rtol=1e-8, atol=1e-8)

    def loss(net):
        ys = ds.simulate(eqx.tree_at(lambda m: m.net, model, net), y0, ts, solver=solver).ys
        return jnp.sum(ys**2)

    params, static = eqx.partition(model.net, eqx.is_array)
    gradient = jax.grad(lambda p: loss(eqx.combine(p, static)))
    looped = ds.simulate(model, y0, ts, solver=solver)
    looped_gradient = gradient(params)
    reference = ds.simulate(model, y0, ts, solver=solver, adjoint="checkpoint")
    monkeypatch.setattr(erk_loop, "COSTLY_MATRIX", (10**8, 10**9))  # the stages written out
    assert not erk_loop.is_costly(model.vector_field, y0)
    written = ds.simulate(model, y0, ts, solver=solver)
    written_gradient = gradient(params)
    for stat in ("num_steps", "num_rejected_steps"):
        assert int(looped.stats[stat]) == int(reference.stats[stat]) == int(written.stats[stat])
    # ~40 steps of 6 stages: the stages' sums taken in another order move the last bits
    np.testing.assert_allclose(looped.ys, reference.ys, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(looped.ys, written.ys, rtol=1e-12, atol=1e-12)
    # the same steps, so the gradients differ by round-off only, carried through the reverse
    # pass's ~40 steps and summed over 1,218 weights: well below 1e-9 relative
    for a, b in zip(jax.tree.leaves(looped_gradient), jax.tree.leaves(written_gradient)):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


def test_lean_loop_under_vmap_matches_each_member_alone():
    import jax

    y0 = jnp.array([1.0, 0.0, 0.0], jnp.float64)
    ts = jnp.linspace(0.0, 1.0, 3, dtype=jnp.float64)
    rhos = jnp.array([0.0, 10.0, 21.0, 28.0], jnp.float64)

    def solve(rho):
        sol = ds.simulate(models.Lorenz(rho=rho), y0, ts, solver=ds.Tsit5(), throw=False)
        return sol.ys, sol.stats["num_steps"]

    ys, steps = jax.vmap(solve)(rhos)
    assert len(set(np.asarray(steps).tolist())) > 1  # members take different numbers of steps
    for i, rho in enumerate(rhos):
        alone_ys, alone_steps = solve(rho)
        assert int(alone_steps) == int(steps[i])
        # batched and single solves fuse their arithmetic differently, so round-off differs
        # (~1e-16 an operation; over ~50 steps of 7 stages of Lorenz it stays < 1e-12). In
        # float32 that round-off (~1e-7) can move an accept decision that sits at the
        # threshold (rho = 28 takes 58 steps batched and 57 alone on some CPUs), so the step
        # counts are compared in float64.
        np.testing.assert_allclose(ys[i], alone_ys, rtol=1e-12)


def test_lean_loop_pytree_state_and_failures():
    # a dict state: the error norm spans every leaf, like diffrax's
    model = ds.ODE(lambda t, y, p: {"a": -p["k"] * y["a"], "b": p["k"] * y["a"]}, {"k": 0.5})
    y0 = {"a": jnp.asarray(1.0), "b": jnp.asarray(0.0)}
    ts = jnp.linspace(0.0, 2.0, 5)
    solver = ds.Tsit5(rtol=1e-9, atol=1e-9)
    lean = ds.simulate(model, y0, ts, solver=solver)
    np.testing.assert_allclose(lean.ys["a"], jnp.exp(-0.5 * ts), rtol=1e-8)
    reference = ds.simulate(model, y0, ts, solver=solver, adjoint="checkpoint")
    assert int(lean.stats["num_steps"]) == int(reference.stats["num_steps"])
    # max_steps: the times not reached are not finite, and the code says why
    capped = ds.simulate(models.Lorenz(), jnp.ones(3), ts, solver=solver, max_steps=10, throw=False)
    assert int(capped.result) == ds.RESULTS.max_steps_reached
    assert not np.isfinite(np.asarray(capped.ys[-1])).any()


@pytest.mark.parametrize("solver_cls", [ds.Tsit5, ds.Kvaerno5])
def test_constant_step_of_an_adaptive_method(solver_cls):
    # constant_step=True: steps of dt whatever the error estimate (diffrax's ConstantStepSize
    # for the solves it runs); Tsit5 at dt = 0.1 on y' = -y over [0, 1] is fifth order: its
    # error falls ~32x when dt halves
    model = ds.ODE(lambda t, y, p: -y, None)
    errors = []
    for dt in (0.1, 0.05):
        sol = ds.simulate(
            model,
            jnp.array([1.0]),
            jnp.array([0.0, 1.0]),
            solver=solver_cls(constant_step=True),
            dt=dt,
        )
        assert int(sol.stats["num_steps"]) == round(1 / dt)
        errors.append(abs(float(sol.ys[-1, 0]) - np.exp(-1.0)))
    assert 20 < errors[0] / errors[1] < 45
    with pytest.raises(ValueError, match="constant_step=True\\) steps by dt"):
        ds.simulate(
            model, jnp.array([1.0]), jnp.array([0.0, 1.0]), solver=solver_cls(constant_step=True)
        )
