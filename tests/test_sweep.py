"""ds.sweep: results equal plain `jax.vmap`, whatever the chunking, device count or process count;
stores resume after a kill; failures stay with their member; bad input is refused clearly.

Equality here is exact (`np.array_equal`): a member's computation is the same program whatever
batch it runs in, so any difference would be a bug in how members are assembled or stored.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sweep_worker

import diffsim as ds
import models

WORKER = os.path.join(os.path.dirname(__file__), "sweep_worker.py")
TS = jnp.linspace(0.0, 5.0, 6)
Y0 = jnp.array([1.0, 0.0])


def _pendulum_ys(length, damping, y0=Y0, solver=ds.RK4(), dt=0.01):
    model = models.DampedPendulum(length=length, damping=damping)
    return ds.simulate(model, y0, TS, solver=solver, dt=dt).ys


def test_grid_equals_vmap_with_padded_chunks():
    lengths, dampings = np.linspace(0.5, 2.0, 7), np.array([0.0, 0.1, 0.3])
    # 7 x 3 members in blocks of 2 x 3 (chunk_size 6): four chunks, the last one padded.
    result = ds.sweep(
        models.DampedPendulum(),
        {"length": lengths, "damping": dampings},
        Y0,
        TS,
        solver=ds.RK4(),
        dt=0.01,
        chunk_size=6,
        progress=False,
    )
    grid_l, grid_d = np.meshgrid(lengths, dampings, indexing="ij")
    expected = jax.vmap(_pendulum_ys)(grid_l.ravel(), grid_d.ravel()).reshape(7, 3, 6, 2)
    assert result["y"].dims == ("length", "damping", "time", "state")
    np.testing.assert_array_equal(result["y"].values, expected)
    np.testing.assert_array_equal(result["length"].values, lengths)
    np.testing.assert_array_equal(result["time"].values, TS)
    assert list(result["state"].values) == ["angle", "angular_velocity"]
    assert (result["result"].values == 0).all() and (result["num_steps"].values == 500).all()
    assert result.attrs["dtype"] == "float64"


def test_samples_with_initial_state_component_equal_vmap():
    samples = ds.Samples.halton({"length": (0.5, 2.0), "y0[0]": (0.1, 1.5)}, 13)
    # (the adaptive path is covered by the worker's Tsit5 sweep below)
    result = ds.sweep(
        models.DampedPendulum(damping=0.1),
        samples,
        Y0,
        TS,
        solver=ds.RK4(),
        dt=0.01,
        reduce="final_state",
        chunk_size=5,
        progress=False,
    )

    def final(length, angle):
        model = models.DampedPendulum(length=length, damping=0.1)
        return ds.simulate(model, jnp.array([angle, 0.0]), TS, solver=ds.RK4(), dt=0.01).ys[-1]

    expected = jax.vmap(final)(samples.values["length"], samples.values["y0[0]"])
    assert result["final_state"].dims == ("sample", "state")
    np.testing.assert_array_equal(result["final_state"].values, expected)
    np.testing.assert_array_equal(result["y0[0]"].values, samples.values["y0[0]"])


def test_whole_initial_states_axis_and_custom_reduce():
    states = np.array([[0.1, 0.0], [0.5, 0.2], [1.0, -1.0]])

    def amplitude(solution):
        return {"peak": jnp.max(jnp.abs(solution.ys[:, 0])), "last": solution.ys[-1]}

    result = ds.sweep(
        models.HarmonicOscillator(omega=2.0),
        {"y0": states},
        None,
        TS,
        solver=ds.RK4(),
        dt=0.005,
        reduce=amplitude,
        progress=False,
    )
    oscillator = models.HarmonicOscillator(omega=2.0)
    expected = jax.vmap(lambda y0: ds.simulate(oscillator, y0, TS, solver=ds.RK4(), dt=0.005).ys)(
        jnp.asarray(states)
    )
    np.testing.assert_array_equal(result["peak"].values, np.abs(expected[:, :, 0]).max(axis=1))
    assert result["last"].dims == ("y0", "last_dim0")
    np.testing.assert_array_equal(result["y0_values"].values, states)


def test_one_compilation_serves_every_chunk():
    traces = []

    def oscillator(omega):
        traces.append(1)  # runs once per trace of the member function
        return models.HarmonicOscillator(omega=omega)

    ds.sweep(
        oscillator,
        {"omega": np.linspace(1.0, 2.0, 10)},
        Y0,
        TS,
        solver=ds.RK4(),
        dt=0.01,
        chunk_size=3,
        progress=False,
    )
    # one trace for the output shapes (eval_shape) and one for the jitted chunk function: the
    # four chunks, the last one padded, add none.
    assert len(traces) == 2


def test_member_keys_come_from_fold_in():
    def random_frequency(omega, key):
        return models.HarmonicOscillator(omega=omega + jax.random.uniform(key, dtype=jnp.float64))

    key = jax.random.key(7)
    result = ds.sweep(
        random_frequency,
        {"omega": np.array([1.0, 2.0, 3.0, 4.0, 5.0])},
        Y0,
        TS,
        solver=ds.RK4(),
        dt=0.01,
        reduce="final_state",
        chunk_size=2,
        key=key,
        progress=False,
    )
    for i, omega in enumerate([1.0, 2.0, 3.0, 4.0, 5.0]):
        model = random_frequency(jnp.float64(omega), jax.random.fold_in(key, i))
        expected = ds.simulate(model, Y0, TS, solver=ds.RK4(), dt=0.01).ys[-1]
        np.testing.assert_array_equal(result["final_state"].values[i], expected)


def _blowing_up(rate):
    # y' = rate y² from y(0) = 1 reaches infinity at t = 1/rate: members with rate > 1/5 fail
    # inside TS = [0, 5].
    return ds.ODE(lambda t, y, p: p["rate"] * y**2, {"rate": rate})


def test_failing_member_does_not_poison_the_others():
    rates = np.array([0.05, 0.1, 0.5, 0.15, 2.0])
    with pytest.warns(UserWarning, match=r"2 of 5 members did not succeed \(nonfinite_state: 2\)"):
        result = ds.sweep(
            _blowing_up,
            {"rate": rates},
            jnp.array([1.0]),
            TS,
            solver=ds.RK4(),
            dt=0.001,
            reduce="final_state",
            chunk_size=2,
            progress=False,
        )
    failed = rates > 0.2
    assert (result["result"].values[failed] == ds.RESULTS.nonfinite_state).all()
    assert np.isnan(result["final_state"].values[failed]).all()
    # The exact solution is 1 / (1 - rate t). RK4's global error at dt = 1e-3 is ~dt^4 times
    # derivatives of order y^5 r^4 <= 4^5 0.15^4 ~ 1 here: ~1e-12, far inside rel=1e-9.
    for rate in rates[~failed]:
        i = int(np.flatnonzero(rates == rate)[0])
        assert result["final_state"].values[i, 0] == pytest.approx(1 / (1 - 5 * rate), rel=1e-9)
    assert ds.sweep_summary(result) == {"successful": 3, "nonfinite_state": 2}


def test_store_resumes_only_missing_chunks(tmp_path):
    store = str(tmp_path / "sweep.zarr")
    axes = {"length": np.linspace(0.5, 2.0, 9), "damping": np.array([0.0, 0.2])}
    args = (models.DampedPendulum(), axes, Y0, TS)
    options = dict(solver=ds.RK4(), dt=0.01, reduce="max_abs", chunk_size=4, progress=False)
    full = ds.sweep(*args, **options)
    ds.sweep(*args, **options, store=store)
    # Damage the store as an interrupted run would: chunk 1 unmarked with garbage data, chunk 3
    # never written.
    for chunk in (1, 3):
        os.remove(os.path.join(store, "progress", f"{chunk}.done"))
    import zarr

    group = zarr.open_group(store, mode="r+")
    group["max_abs"][2:4] = -1.0
    group["max_abs"][6:8] = np.nan
    resumed = ds.sweep(*args, **options, store=store)
    for name in ("max_abs", "result", "num_steps", "length", "damping"):
        np.testing.assert_array_equal(resumed[name].values, full[name].values)
    assert resumed.attrs["sweep_config"] == full.attrs["sweep_config"]
    # the resume's provenance is recorded beside the creation's: 5 chunks, 3 finished before
    (run,) = json.loads(resumed.attrs["resumes"])
    assert run["chunks_done_before"] == 3
    assert run["device_count"] == resumed.attrs["device_count"]


def test_store_written_by_another_sweep_refuses_to_resume(tmp_path):
    store = str(tmp_path / "sweep.zarr")
    axes = {"length": np.linspace(0.5, 2.0, 4)}
    ds.sweep(
        models.DampedPendulum(), axes, Y0, TS, solver=ds.RK4(), dt=0.01, store=store, progress=False
    )
    with pytest.raises(ds.SweepStoreError, match=r"different sweep.*dt: stored 0.01, now 0.005"):
        ds.sweep(
            models.DampedPendulum(),
            axes,
            Y0,
            TS,
            solver=ds.RK4(),
            dt=0.005,
            store=store,
            progress=False,
        )
    with pytest.raises(ds.SweepStoreError, match="axes"):
        ds.sweep(
            models.DampedPendulum(),
            {"length": np.linspace(0.5, 2.0, 5)},
            Y0,
            TS,
            solver=ds.RK4(),
            dt=0.01,
            store=store,
            progress=False,
        )
    # the same axes in another order (a square grid: the same shapes) lay the members out
    # transposed: resuming a store half written in the first order mixed the two (a
    # harmonic oscillator's final states 2.7 off)
    square = {"length": np.linspace(0.5, 2.0, 3), "damping": np.linspace(0.0, 0.3, 3)}
    swapped = {"damping": square["damping"], "length": square["length"]}
    other = str(tmp_path / "square.zarr")
    common = dict(solver=ds.RK4(), dt=0.01, store=other, progress=False)
    ds.sweep(models.DampedPendulum(), square, Y0, TS, **common)
    with pytest.raises(ds.SweepStoreError, match=r'axis_order: stored \["length", "damping"\]'):
        ds.sweep(models.DampedPendulum(), swapped, Y0, TS, **common)
    # a constant read by the model function is part of the config, not only its source code
    scale = 1.0

    def scaled(length):
        return models.DampedPendulum(length=scale * length)

    ds.sweep(scaled, axes, Y0, TS, solver=ds.RK4(), dt=0.01, store=store + "2", progress=False)
    scale = 2.0
    with pytest.raises(ds.SweepStoreError, match=r"model.reads.scale: stored 1.0, now 2.0"):
        ds.sweep(scaled, axes, Y0, TS, solver=ds.RK4(), dt=0.01, store=store + "2", progress=False)
    not_a_store = tmp_path / "other"
    not_a_store.mkdir()
    with pytest.raises(ds.SweepStoreError, match="not a sweep store"):
        ds.sweep(
            models.DampedPendulum(),
            axes,
            Y0,
            TS,
            solver=ds.RK4(),
            dt=0.01,
            store=str(not_a_store),
            progress=False,
        )


@pytest.mark.parametrize(
    "axes, message",
    [
        ({"lenght": [1.0]}, r"'lenght' is not a parameter of DampedPendulum; its parameters"),
        ({"length": [1.0, -1.0]}, r"sweep axis 'length' of DampedPendulum: must be > 0"),
        ({"length": [1.0, np.nan]}, r"'length' has non-finite values at positions \[1\]"),
        ({"y0[0]": [1.0, np.nan]}, r"'y0\[0\]' has non-finite values at positions \[1\]"),
        ({"y0": [[1.0, 0.0], [np.inf, 0.0]]}, r"'y0' has non-finite values at positions \[1\]"),
        ({"length": []}, r"non-empty array"),
        ({"length": [[1.0, 2.0]]}, r"expected a 1-D array"),
        ({"y0": [[1.0, 0.0]], "y0[0]": [1.0]}, r"both 'y0' and components"),
        ({"y0[2]": [1.0]}, r"only 2 components"),
        ({"y0": [[1.0, 0.0, 0.0]]}, r"states of shape \(3,\), but y0 has 2 components"),
    ],
)
def test_bad_axes_are_refused(axes, message):
    with pytest.raises(ValueError, match=message):
        ds.sweep(models.DampedPendulum(), axes, Y0, TS, solver=ds.RK4(), dt=0.01)


def test_other_bad_arguments_are_refused():
    pendulum = models.DampedPendulum()
    with pytest.raises(ValueError, match="same number of samples"):
        ds.Samples({"length": [1.0, 2.0], "damping": [0.1]})
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        ds.sweep(pendulum, {"length": [1.0]}, Y0, TS, solver=ds.RK4(), dt=0.01, chunk_size=0)
    with pytest.raises(TypeError, match="model must be a function"):
        ds.sweep(
            pendulum, {"length": [1.0]}, Y0, TS, solver=ds.RK4(), dt=0.01, key=jax.random.key(0)
        )
    with pytest.raises(ValueError, match="unknown reduce 'final'"):
        ds.sweep(pendulum, {"length": [1.0]}, Y0, TS, solver=ds.RK4(), dt=0.01, reduce="final")
    with pytest.raises(ValueError, match=r"\['mass'\] are not arguments of the model function"):
        ds.sweep(lambda length: pendulum, {"mass": [1.0]}, Y0, TS, solver=ds.RK4(), dt=0.01)
    with pytest.raises(ValueError, match=r"\['key'\] are not arguments of the model function"):
        ds.sweep(
            lambda length: pendulum,
            {"length": [1.0]},
            Y0,
            TS,
            solver=ds.RK4(),
            dt=0.01,
            key=jax.random.key(0),
        )
    with pytest.raises(ValueError, match="'result' has the name of a per-member variable"):
        ds.sweep(
            pendulum,
            {"length": [1.0]},
            Y0,
            TS,
            solver=ds.RK4(),
            dt=0.01,
            reduce=lambda sol: {"result": sol.ys[-1]},
        )
    with pytest.raises(ValueError, match="'length' has the name of a coordinate"):
        ds.sweep(
            pendulum,
            {"length": [1.0]},
            Y0,
            TS,
            solver=ds.RK4(),
            dt=0.01,
            reduce=lambda sol: {"length": sol.ys[-1]},
        )
    with pytest.raises(ValueError, match="at least one sample"):
        ds.Samples({"length": []})
    with pytest.raises(ValueError, match="y0 is None"):
        ds.sweep(pendulum, {"length": [1.0]}, None, TS, solver=ds.RK4(), dt=0.01)


def test_latin_hypercube_puts_one_sample_in_every_stratum(getkey):
    n = 50
    samples = ds.Samples.latin_hypercube(
        {"length": (0.5, 2.0), "gravity": (1.0, 100.0)}, n, key=getkey(), log=("gravity",)
    )
    strata = np.floor((samples.values["length"] - 0.5) / 1.5 * n)
    log_strata = np.floor(np.log(samples.values["gravity"]) / np.log(100.0) * n)
    np.testing.assert_array_equal(np.sort(strata), np.arange(n))
    np.testing.assert_array_equal(np.sort(log_strata), np.arange(n))


def test_halton_matches_the_radical_inverse():
    samples = ds.Samples.halton({"a": (0.0, 1.0), "b": (0.0, 1.0)}, 4)
    np.testing.assert_allclose(samples.values["a"], [1 / 2, 1 / 4, 3 / 4, 1 / 8])
    np.testing.assert_allclose(samples.values["b"], [1 / 3, 2 / 3, 1 / 9, 4 / 9])


# --- other processes: device counts, jax.distributed, SIGKILL ---------------------------------


def test_constraints_of_a_model_function_are_checked_per_member():
    # Built inside the compiled sweep, the model's values are traced and its constructor cannot
    # check them; the solve does, and flags the member instead of simulating a negative length.
    with pytest.warns(UserWarning, match="invalid_input: 1"):
        result = ds.sweep(
            lambda length: models.DampedPendulum(length=length),
            {"length": [1.0, -1.0, 2.0]},
            Y0,
            TS,
            solver=ds.RK4(),
            dt=0.01,
            reduce="final_state",
            progress=False,
        )
    np.testing.assert_array_equal(result["result"].values, [0, ds.RESULTS.invalid_input, 0])
    assert np.isnan(result["final_state"].values[1]).all()
    assert np.isfinite(result["final_state"].values[[0, 2]]).all()


def test_integer_outputs_and_numpy_scalar_arguments(tmp_path):
    def count_positive(solution):
        return {
            "positive": jnp.sum(solution.ys[:, 0] > 0).astype(jnp.uint32),
            "ever_negative": jnp.any(solution.ys[:, 0] < 0),
        }

    lengths = np.array([0.5, 1.0, 2.0])
    result = ds.sweep(
        models.DampedPendulum(),
        {"length": lengths},
        Y0,
        TS,
        solver=ds.RK4(),
        dt=np.float64(0.01),
        chunk_size=np.int64(2),
        reduce=count_positive,
        store=str(tmp_path / "ints.zarr"),
        progress=False,
    )
    lengths[:] = 99.0  # the result keeps the values it was given
    ys = jax.vmap(_pendulum_ys, in_axes=(0, None))(jnp.array([0.5, 1.0, 2.0]), 0.0)
    np.testing.assert_array_equal(result["positive"].values, (ys[:, :, 0] > 0).sum(axis=1))
    np.testing.assert_array_equal(result["ever_negative"].values, (ys[:, :, 0] < 0).any(axis=1))
    assert result["positive"].dtype == np.uint32
    np.testing.assert_array_equal(result["length"].values, [0.5, 1.0, 2.0])


def _worker(store, *extra, **kwargs):
    return subprocess.Popen(
        [sys.executable, WORKER, store, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kwargs,
    )


def _finish(process, timeout=240):
    output, _ = process.communicate(timeout=timeout)
    assert process.returncode == 0, output
    return output


def _assert_same_results(store, reference):
    stored = ds.open_sweep(store)
    assert set(stored.coords) == set(reference.coords)
    assert set(stored.data_vars) == set(reference.data_vars)
    for name in reference.variables:
        np.testing.assert_array_equal(stored[name].values, reference[name].values, err_msg=name)


@pytest.fixture(scope="module")
def small_reference():
    return sweep_worker.run(None)


@pytest.fixture(scope="module")
def large_reference():
    return sweep_worker.run(None, "large")


def test_four_devices_give_the_same_store_as_one(tmp_path, small_reference):
    store = str(tmp_path / "four.zarr")
    _finish(_worker(store, "--devices", "4"))
    assert ds._sweep.store.read_attrs(store)["device_count"] == 4
    _assert_same_results(store, small_reference)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _two_processes(store, extra_for_process_1=(), devices: int = 1):
    port = str(_free_port())
    return [
        _worker(
            store,
            "--size",
            "large",
            "--process-id",
            str(i),
            "--num-processes",
            "2",
            "--port",
            port,
            "--devices",
            str(devices),
            *(extra_for_process_1 if i == 1 else ()),
        )
        for i in range(2)
    ]


def test_two_processes_give_the_same_store_as_one(tmp_path, large_reference):
    store = str(tmp_path / "two.zarr")
    # First a run in which process 1 fails after two chunks: both processes must stop with an
    # error (neither waits forever for the other), keeping what was finished.
    failing = _two_processes(store, extra_for_process_1=("--fail-after", "2"))
    outputs = [w.communicate(timeout=240)[0] for w in failing]
    assert [w.returncode for w in failing] != [0, 0]
    assert "disk full (simulated)" in outputs[1], outputs[1]
    assert "another process of this sweep failed" in outputs[0], outputs[0]
    assert 2 <= len(os.listdir(os.path.join(store, "progress"))) - 1 < 60
    # Then the same sweep again, now with two devices in each process (each chunk sharded over
    # a process's own devices): it resumes and completes (each process writes its own chunks,
    # 0, 2, 4, … and 1, 3, 5, … of the 60).
    outputs = [_finish(w) for w in _two_processes(store, devices=2)]
    assert "process 1 of 2" in outputs[1]
    _assert_same_results(store, large_reference)
    assert len(os.listdir(os.path.join(store, "progress"))) == 60 + 1


def test_kill_minus_nine_then_resume_gives_identical_results(tmp_path, large_reference):
    store = str(tmp_path / "killed.zarr")
    markers = os.path.join(store, "progress")
    worker = _worker(store, "--size", "large")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if os.path.isdir(markers) and len(os.listdir(markers)) >= 4:  # zarr.json + 3 chunks
            break
        time.sleep(0.01)
    worker.send_signal(signal.SIGKILL)
    worker.communicate()
    done = len(os.listdir(markers)) - 1
    assert 3 <= done < 60, f"the kill should land mid-sweep, {done} of 60 chunks were done"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no member failed
        resumed = sweep_worker.run(store, "large")
    assert len(os.listdir(markers)) - 1 == 60
    for name in large_reference.variables:
        np.testing.assert_array_equal(
            resumed[name].values, large_reference[name].values, err_msg=name
        )


def test_distributed_initialize_outside_a_cluster_is_a_single_process(monkeypatch):
    for variable in ("SLURM_JOB_ID", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(variable, raising=False)
    layout = ds.distributed.initialize()
    assert (layout.process_id, layout.num_processes) == (0, 1)
    assert "process 0 of 1 (single process)" in str(layout)
    monkeypatch.setenv("SLURM_JOB_ID", "123")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    assert ds._sweep.distributed._detect_cluster() == "SLURM"


def _decay_finals(model, axes):
    """Final states at t = 2 from 1 of a sweep of `model` over `axes` (RK4, h = 0.01)."""
    result = ds.sweep(
        model,
        axes,
        jnp.array([1.0]),
        np.linspace(0.0, 2.0, 3),
        solver=ds.RK4(),
        dt=0.01,
        reduce="final_state",
        progress=False,
    )
    return result["final_state"].values[:, 0]


def test_axes_name_ode_dict_entries_and_nested_fields():
    # the names ds.fit's params= takes: a ds.ODE's dict entry ("k", "params.k"); the final
    # state of y' = -k y from 1 at t = 2 is exp(-2k), to RK4's error at h = 0.01 (~1e-10)
    decay = ds.ODE(lambda t, y, p: -p["k"] * y, {"k": 0.5})
    rates = np.array([0.1, 0.5, 2.0])
    for name in ("k", "params.k"):
        np.testing.assert_allclose(
            _decay_finals(decay, {name: rates}), np.exp(-2 * rates), rtol=1e-8
        )
    with pytest.raises(ValueError, match=r"sweep axis 'q' is not a parameter of ODE; .*'k'"):
        _decay_finals(decay, {"q": rates})


def test_a_parameter_named_like_a_field_of_ds_ode_is_the_parameter():
    """A spring's parameter "mass" in a ds.ODE's dict: ds.ODE has a field `mass` (its mass
    matrix, None here), and the sweep raised "ODE.__init__() got an unexpected keyword
    argument 'mass'" while ds.fit said "ODE.mass is None (that term is switched off)". The
    dict entry is what the name means: y' = −y/m from 1 at t = 2 is exp(−2/m), to RK4's
    error at h = 0.01 (~1e-10); the fit recovers m from exact data."""
    decay = ds.ODE(lambda t, y, p: -y / p["mass"], {"mass": 1.0})
    masses = np.array([0.5, 1.0, 2.0])
    np.testing.assert_allclose(
        _decay_finals(decay, {"mass": masses}), np.exp(-2 / masses), rtol=1e-8
    )
    ts = np.linspace(0.0, 2.0, 9)
    fit = ds.fit(
        decay, jnp.array([1.0]), (ts, np.exp(-ts / 2.0)), params=["mass"], solver=ds.RK4(), dt=0.01
    )
    assert fit.params["mass"] == pytest.approx(2.0, rel=1e-6)  # RK4's error at h = 0.01
    with pytest.raises(
        ValueError, match=r"is not a parameter of ODE; its parameters are \['mass'\]"
    ):
        _decay_finals(decay, {"q": masses})
