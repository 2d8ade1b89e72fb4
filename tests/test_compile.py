"""Time to the first answer: how many programs each entry point compiles, and the persistent
compilation cache that lets a second process skip compiling them."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import counted, EVENTS as _EVENTS, HITS as _HITS, MISSES as _MISSES

import diffsim as ds
import models

WORKER = os.path.join(os.path.dirname(__file__), "cache_worker.py")


def _compiles(fn):
    """(the value of fn(), the number of XLA compilations it ran)."""
    out, compiles, _ = counted(fn)
    return out, compiles


@pytest.fixture(scope="module")
def warmed():
    """One fit and one event solve of other problems first: equinox, diffrax, optimistix and
    lineax build a few constants with small eager programs once per process, which are not the
    entry points' own."""
    ts = np.linspace(0.0, 5.0, 12)
    ds.fit(
        models.HarmonicOscillator(omega=1.2),
        jnp.array([1.0, 0.0]),
        (ts, np.cos(1.3 * ts)),
        params=["omega"],
        observe=lambda y: y[0],
        solver=ds.RK4(),
        dt=ts[1] / 10,
    )
    ball = models.BouncingBall()
    ds.simulate(
        ball,
        jnp.array([2.0, 0.0]),
        np.linspace(0.0, 1.0, 5),
        solver=ds.Tsit5(),
        events=ball.impacts(max_events=3),
    )


def _lotka_volterra_data():
    ts = np.linspace(0.0, 10.0, 15)
    truth = models.LotkaVolterra(alpha=0.6, beta=0.03, gamma=0.8, delta=0.025)
    ys = ds.simulate(truth, jnp.array([30.0, 4.0]), ts, solver=ds.Tsit5(rtol=1e-8, atol=1e-8)).ys
    noise = np.random.default_rng(0).normal(0.0, 0.05, ys.shape)
    return ts, np.asarray(ys) * np.exp(noise)  # 5% multiplicative noise: finite intervals


def test_a_fit_compiles_one_program_and_a_new_start_none(warmed):
    data = _lotka_volterra_data()
    options = dict(
        params=["alpha", "beta", "gamma", "delta"],
        initial_state=True,
        loss="log",
        solver=ds.Tsit5(rtol=1e-8, atol=1e-8),
    )
    guess = models.LotkaVolterra(alpha=0.5, beta=0.025, gamma=0.7, delta=0.02)
    result, count = _compiles(lambda: ds.fit(guess, jnp.array([25.0, 5.0]), data, **options))
    # the optimisation loop, the Jacobian and the predictions at the optimum: one program
    assert count <= 3, count
    assert result.converged
    # 5% noise: the estimate lies within 3 standard errors of the truth (p ≈ 0.997)
    assert abs(result.params["alpha"] - 0.6) < 3 * result.stderr["alpha"]
    other = models.LotkaVolterra(alpha=0.7, beta=0.02, gamma=0.9, delta=0.03)
    _, again, traced = counted(lambda: ds.fit(other, jnp.array([35.0, 3.0]), data, **options))
    assert (again, traced) == (0, 0)  # new values of the same shapes: nothing traced anew
    profile, count = _compiles(lambda: ds.profile(result, "gamma", points=5))
    assert count <= 2, count
    assert profile.interval[0] < result.params["gamma"] < profile.interval[1]
    replicates = np.asarray(data[1])[None] * np.exp(
        np.random.default_rng(1).normal(0.0, 0.05, (3, *np.shape(data[1])))
    )
    batch, count = _compiles(lambda: ds.refit(result, replicates, start="fit"))
    assert count <= 1, count
    # near these optima the Tsit5 solves' own error keeps the residuals from settling to the
    # optimiser's rtol; without the stop where no resolvable step lowers the loss (MINPACK's
    # test) replicates ran their whole iteration budget and reported no convergence
    assert batch.converged.all()


def test_a_simulation_compiles_one_program(warmed):
    ts = jnp.linspace(0.0, 2.0, 21)
    model = models.Duffing()
    _, count = _compiles(
        lambda: ds.simulate(model, jnp.array([1.0, 0.0]), ts, solver=ds.Dopri5()).ys
    )
    assert count <= 1, count
    _, count, traced = counted(
        lambda: ds.simulate(model, jnp.array([0.5, 0.1]), ts, solver=ds.Dopri5()).ys
    )
    assert (count, traced) == (0, 0)


def test_an_event_solve_compiles_two_programs_and_new_values_none(warmed):
    ball = models.BouncingBall()
    ts = np.linspace(0.0, 3.0, 31)

    def solve(height, restitution):
        model = models.BouncingBall(restitution=restitution)
        events = ball.impacts(max_events=10)
        return ds.simulate(model, jnp.array([height, 0.0]), ts, solver=ds.Tsit5(), events=events)

    solution, count = _compiles(lambda: solve(1.0, 0.8))
    assert count <= 2, count  # the segments' solve and the split of the records per event
    assert int(solution.event_count) > 1
    _, count, traced = counted(lambda: solve(1.5, 0.85))
    assert (count, traced) == (0, 0)


def test_a_sweep_compiles_one_program_and_a_new_sweep_of_the_same_shapes_none(warmed):
    y0, ts = jnp.array([1.0, 0.0, 0.0]), np.linspace(0.0, 1.0, 6)

    def run(low):
        axes = {"rho": np.linspace(low, 30.0, 6)}
        return ds.sweep(models.Lorenz(), axes, y0, ts, solver=ds.Tsit5(), progress=False)

    first, count = _compiles(lambda: run(10.0))
    assert count <= 1, count
    second, count, traced = counted(lambda: run(12.0))
    assert (count, traced) == (0, 0)
    assert not np.array_equal(first["y"].values, second["y"].values)  # new values were used
    direct = ds.simulate(models.Lorenz(rho=12.0), y0, ts, solver=ds.Tsit5()).ys
    # the same steps batched and alone; only round-off of the fused arithmetic differs
    np.testing.assert_allclose(second["y"].values[0], direct, rtol=1e-12)


def test_a_second_training_at_another_rate_compiles_nothing(warmed):
    """`ds.train`'s step size and clipping norm are inputs of its compiled chunk, not
    constants in it: the same problem trained again at another rate and norm runs the
    program the first training compiled (loaded from the persistent cache: the chunk is
    traced again, its optimiser being a new object) and compiles nothing new."""
    from test_train import _problems

    train, _ = _problems()
    options = dict(steps=4, every=4, progress=False)
    misses = _EVENTS[_MISSES]
    first = ds.train(train, "net", learning_rate=1e-2, **options)
    assert _EVENTS[_MISSES] > misses  # the chunk, compiled and stored
    misses, hits = _EVENTS[_MISSES], _EVENTS[_HITS]
    second = ds.train(train, "net", learning_rate=3e-3, clip=2.0, **options)
    assert _EVENTS[_MISSES] == misses and _EVENTS[_HITS] > hits
    assert second.llh != first.llh  # the other rate was taken


def test_analyses_compile_one_program_each(warmed):
    model, y0 = models.Lorenz(rho=20.0), jnp.array([1.0, 1.0, 1.0])
    ts = jnp.linspace(0.0, 1.0, 11)
    _, count = _compiles(lambda: ds.sensitivity(model, y0, ts, solver=ds.Dopri5()))
    assert count <= 1, count
    _, count = _compiles(
        lambda: ds.lyapunov_exponent(model, y0, solver=ds.RK4(), dt=0.01, steps=200)
    )
    assert count <= 1, count
    key = jax.random.key(1)

    def walk(k, s):
        return s + jax.random.normal(k)

    def far(s):
        return jnp.abs(s) > 2.0

    start, other = jnp.array(0.0), jnp.array(0.5)
    _, count = _compiles(lambda: ds.iterate(walk, start, key, stop=far, max_steps=500))
    assert count <= 1, count
    _, count, traced = counted(lambda: ds.iterate(walk, other, key, stop=far, max_steps=500))
    assert (count, traced) == (0, 0)


def test_diffsim_s_own_programs_compile_with_its_options_at_top_level_only(monkeypatch):
    """A diffsim program called at top level compiles with `compiler_options()` (XLA:CPU's
    faster-compiling emitters, diffsim/_compile.py); under the user's `jax.jit`, `jax.grad`
    and `jax.vmap` it is the plain program (JAX refuses options on a nested program) and gives
    the same values; `XLA_FLAGS` naming the option leaves it to the user."""
    from diffsim import _compile

    monkeypatch.setenv("XLA_FLAGS", "")
    assert _compile.compiler_options() == {"xla_cpu_use_fusion_emitters": False}
    program = _compile.jit(lambda x: jnp.sin(x) * x)
    x = jnp.array(0.7)
    # the options travel with the top-level lowering (JAX keeps them on it, privately)
    kvs = program.lower(x).lowered._lowering._compiler_options_kvs
    assert ("xla_cpu_use_fusion_emitters", False) in kvs
    # other programs, so equal to round-off (fused otherwise), not bit for bit
    value = float(np.sin(0.7) * 0.7)
    assert float(program(x)) == pytest.approx(value, rel=1e-15)
    assert float(jax.jit(lambda x: program(x) + 1.0)(x)) == pytest.approx(value + 1.0, rel=1e-15)
    slope = float(np.cos(0.7) * 0.7 + np.sin(0.7))
    assert float(jax.grad(program)(x)) == pytest.approx(slope, rel=1e-15)
    assert float(jax.jit(jax.grad(program))(x)) == pytest.approx(slope, rel=1e-15)
    np.testing.assert_allclose(jax.vmap(program)(jnp.stack([x, x])), [value, value], rtol=1e-15)
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_fusion_emitters=true")
    assert _compile.compiler_options() is None
    left = _compile.jit(lambda x: x + 1.0)
    assert left._own is left._plain


def _worker(folder, *args, env_extra=None):
    env = dict(os.environ, DIFFSIM_CACHE_DIR=str(folder))
    env.pop("DIFFSIM_CACHE", None)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    env.update(env_extra or {})
    out = subprocess.run(
        [sys.executable, WORKER, *args], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_the_fit_instead_of_compiling_it(tmp_path):
    folder = tmp_path / "cache"
    cold = _worker(folder)
    assert cold["config"]["cache"] and cold["config"]["cache_dir"] == str(folder)
    assert cold["events"].get("/jax/compilation_cache/cache_misses", 0) >= 1
    # exact cos(1.3 t) data fitted with RK4 at dt = 0.025: the discretisation moves ω by ~1e-7
    np.testing.assert_allclose(cold["value"], 1.3, rtol=1e-6)
    warm = _worker(folder)
    # every program worth storing came from the cache: no XLA compilation of it
    assert warm["events"].get("/jax/compilation_cache/cache_misses", 0) == 0
    assert warm["events"].get("/jax/compilation_cache/cache_hits", 0) >= 1
    assert warm["value"] == cold["value"]  # the same program, bit for bit
    changed = _worker(folder, "--model", "van-der-pol")
    assert changed["events"].get("/jax/compilation_cache/cache_misses", 0) >= 1
    # data from the same RK4 solve: recovered to the optimiser's tolerance
    np.testing.assert_allclose(changed["value"], 1.3, rtol=1e-5)
    # corrupt entries: JAX warns, compiles again and the answer is the same
    entries = list(folder.glob("*-cache"))
    assert entries
    for entry in entries:
        entry.write_bytes(b"not a program")
    corrupt = _worker(folder)
    assert corrupt["value"] == cold["value"]
    assert any("cache" in w for w in corrupt["warnings"]), corrupt["warnings"]


def test_an_unusable_cache_folder_warns_once_and_runs_uncached(tmp_path):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("a file where the cache folder should be")
    out = _worker(not_a_folder)
    notes = [w for w in out["warnings"] if "compilation cache folder" in w]
    assert len(notes) == 1, out["warnings"]
    assert "DIFFSIM_CACHE_DIR" in notes[0]
    assert not out["config"]["cache"]
    np.testing.assert_allclose(out["value"], 1.3, rtol=1e-6)  # as in the cached run above


@pytest.mark.parametrize("setting", ["off", "disabled", "nope"])
def test_the_cache_is_off_with_the_environment_variable(tmp_path, setting):
    # "disabled" was not understood and left the cache on without a word; a value it does not
    # know now warns and leaves it off
    out = _worker(tmp_path / "cache", "--model", "none", env_extra={"DIFFSIM_CACHE": setting})
    assert not out["config"]["cache"]
    assert "DIFFSIM_CACHE" in out["config"]["why"]
    assert not (tmp_path / "cache").exists()
    understood = not any("is not understood" in w for w in out["warnings"])
    assert understood == (setting != "nope"), out["warnings"]


def test_config_turns_the_cache_off_and_on(tmp_path):
    before = ds.config()
    try:
        assert not ds.config(cache=False)["cache"]
        assert jax.config.jax_compilation_cache_dir is None
        on = ds.config(cache_dir=tmp_path / "here")
        assert on["cache"] and on["cache_dir"] == str(tmp_path / "here")
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "here")
    finally:
        if before["cache"]:
            ds.config(cache_dir=before["cache_dir"])
        else:
            ds.config(cache=False)


def test_inside_the_users_jit_throw_false_keeps_host_callbacks_out_of_the_program():
    # JAX's persistent cache refuses programs with host callbacks. Under the user's own jit,
    # throw=True checks the result with equinox.error_if (a callback), so the program is
    # compiled in every process; throw=False with sol.result is cacheable (the
    # avoid-recompilation page says so).
    y0, ts = jnp.array([1.0, 0.0]), np.linspace(0.0, 1.0, 11)

    def program(throw):
        def final(model):
            sol = ds.simulate(model, y0, ts, solver=ds.RK4(), dt=0.01, throw=throw)
            return sol.ys[-1, 0], sol.result

        return jax.jit(final).lower(models.DampedPendulum()).as_text()

    assert "callback" in program(True)
    assert "callback" not in program(False)
