"""The bad-input catalogue: what careless or hurried users pass to the API, and what they get.

Every case names the exact error type and the words that name the culprit (the argument, the
cell, the field) and say what to do. Cases that used to give a silently wrong answer assert the
right one. The cheap cases fail before anything compiles and run as one table; the few that need
a solve (events, precision, the meaning of a list `y0`) are tests of their own. Stores, files,
manifests and the command line are in `test_faults.py`.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
import xarray as xr
from helpers import named_cases

import diffsim as ds
import models

PENDULUM = models.DampedPendulum()
Y0 = jnp.array([0.5, 0.0])
TS = jnp.linspace(0.0, 1.0, 11)
OSCILLATOR = models.HarmonicOscillator(omega=1.0)
FIT_TS = np.linspace(0.0, 3.0, 16)
FIT_X = np.cos(1.3 * FIT_TS)
FIT = dict(params="omega", observe=lambda y: y[0], solver=ds.RK4(), dt=0.05)


def _simulate(**change):
    arguments = dict(model=PENDULUM, y0=Y0, ts=TS, solver=ds.RK4(), dt=0.1)
    arguments.update(change)
    return ds.simulate(
        arguments.pop("model"), arguments.pop("y0"), arguments.pop("ts"), **arguments
    )


def _fit(data=None, **change):
    arguments = {**FIT, **change}
    return ds.fit(OSCILLATOR, jnp.array([1.0, 0.0]), data or (FIT_TS, FIT_X), **arguments)


def _sweep(axes=None, **change):
    arguments = dict(y0=Y0, ts=np.linspace(0.0, 1.0, 6), solver=ds.RK4(), dt=0.1, progress=False)
    arguments.update(change)
    return ds.sweep(
        arguments.pop("model", PENDULUM),
        axes or {"length": [1.0, 2.0]},
        arguments.pop("y0"),
        arguments.pop("ts"),
        **arguments,
    )


def _solution():
    return ds.Solution(ts=TS, ys=jnp.zeros((11, 2)), stats={}, result=jnp.array(0))


def _iterate(step=lambda key, s: s + 1.0, stop=lambda s: s > 3.0, key=None):
    key = jax.random.key(0) if key is None else key
    return ds.iterate(step, jnp.array(0.0), key, stop=stop, max_steps=10)


def _condition_y5(t, y):
    return y[5]


CASES = [
    # --- simulate: counts, steps, times -------------------------------------------------------
    (
        "max_steps=2**31",
        lambda: _simulate(solver=ds.Tsit5(), dt=None, max_steps=2**31),
        ValueError,
        r"max_steps must be at most 2\*\*31 - 1, what the int32 step counter holds",
    ),
    (
        "fixed steps beyond int32",
        lambda: _simulate(ts=jnp.array([0.0, 1e4]), dt=1e-6),
        ValueError,
        r"10,000,000,000 steps, more than its int32 step counter holds",
    ),
    ("dt=True", lambda: _simulate(dt=True), TypeError, "dt must be a positive number, got True"),
    ("complex dt", lambda: _simulate(dt=0.1 + 0j), TypeError, r"dt must be a positive number"),
    (
        "complex ts",
        lambda: _simulate(ts=jnp.array([0.0, 1.0 + 1j])),
        ValueError,
        "ts must be real output times",
    ),
    (
        "times equal in float32",
        lambda: _simulate(
            y0=Y0.astype(jnp.float32), ts=np.array([1e8, 1e8 + 1.0]), dt=None, solver=ds.Tsit5()
        ),
        ValueError,
        r"ts\[0\] = 100000000.0 and ts\[1\] = 100000001.0 are the same number in "
        "float32",
    ),
    (
        "ragged list y0",
        lambda: _simulate(y0=[[1.0, 2.0], [3.0]]),
        TypeError,
        "y0 is a list of items of different shapes",
    ),
    ("text y0", lambda: _simulate(y0=["a", "b"]), TypeError, "the state must hold numbers"),
    # --- models and solvers ---------------------------------------------------------------------
    (
        "parameter as text",
        lambda: models.DampedPendulum(length="1.0"),
        TypeError,
        r"DampedPendulum\(length=...\): expected a real number .*got '1.0'",
    ),
    (
        "required parameter None",
        lambda: models.DampedPendulum(length=None),
        ValueError,
        r"DampedPendulum\(length=None\): length is required",
    ),
    (
        "complex parameter",
        lambda: models.DampedPendulum(length=1 + 2j),
        TypeError,
        r"DampedPendulum\(length=...\): expected a real number",
    ),
    (
        "object parameter",
        lambda: models.Lorenz(rho=object()),
        TypeError,
        r"Lorenz\(rho=...\): expected a real number",
    ),
    (
        "rtol as text",
        lambda: ds.Tsit5(rtol="1e-6"),
        TypeError,
        r"Tsit5\(rtol=...\): expected a real number",
    ),
    ("complex rtol", lambda: ds.Tsit5(rtol=1e-6j), TypeError, r"Tsit5\(rtol=...\)"),
    ("rtol None", lambda: ds.Tsit5(rtol=None), ValueError, r"Tsit5\(rtol=None\): rtol is required"),
    (
        "atol of the wrong shape",
        lambda: _simulate(solver=ds.Tsit5(atol=jnp.full(3, 1e-6)), dt=None),
        ValueError,
        r"Tsit5\(atol=...\) has shape \(3,\), which does not fit the state \(\(2,\)\)",
    ),
    (
        "empty NBody",
        lambda: models.NBody(masses=jnp.zeros((0,))),
        ValueError,
        "give at least one mass",
    ),
    (
        "NBody masses and bodies differ",
        lambda: _simulate(
            model=models.NBody(masses=jnp.ones(3)), y0=jnp.ones((2, 2, 2)), solver=ds.Leapfrog()
        ),
        ValueError,
        r"NBody has 3 masses, but the state's positions or momenta have shape \(2, 2\)",
    ),
    (
        "bounce_times count 0",
        lambda: models.BouncingBall().bounce_times(1.0, 0),
        ValueError,
        "count must be an int >= 1",
    ),
    (
        "bounce_times below the floor",
        lambda: models.BouncingBall().bounce_times(-1.0, 3),
        ValueError,
        "height must be > 0",
    ),
    # --- events ---------------------------------------------------------------------------------
    (
        "condition beyond the state",
        lambda: _simulate(events=ds.Event(_condition_y5, terminal=True)),
        ValueError,
        r"the event's condition indexes the state beyond its shape \(index 5 is out of bounds",
    ),
    (
        "reset beyond the state",
        lambda: _simulate(
            events=ds.Event(lambda t, y: y[0], reset=lambda t, y: jnp.stack([y[0], -y[3]]))
        ),
        ValueError,
        "the event's reset indexes the state beyond its shape",
    ),
    (
        "events as a bare function",
        lambda: _simulate(events=lambda t, y: y[0]),
        TypeError,
        r"events must be a ds.Event or a tuple of them, got function \(wrap a condition",
    ),
    (
        "reset of another dtype",
        lambda: _simulate(
            events=ds.Event(lambda t, y: y[0], reset=lambda t, y: (-y).astype(jnp.float32))
        ),
        ValueError,
        r"reset\(t, y\) must return a state like y \(\(2,\) float64\), got \(2,\) "
        "float32",
    ),
    (
        "max_events a float",
        lambda: ds.Event(lambda t, y: y[0], reset=lambda t, y: y, max_events=2.0),
        ValueError,
        "max_events must be an int >= 1",
    ),
    # --- fit ------------------------------------------------------------------------------------
    (
        "all weights zero",
        lambda: _fit(weights=np.zeros(16)),
        ValueError,
        "every observed value has weight 0: there is nothing to fit",
    ),
    ("level as text", lambda: _fit(level="0.95"), TypeError, "level must be a real number"),
    (
        "continuity_weight inf",
        lambda: _fit(segments=2, continuity_weight=float("inf")),
        ValueError,
        "continuity_weight must be finite",
    ),
    ("t0 as text", lambda: _fit(t0="0"), TypeError, "t0 must be a real number"),
    (
        "max_steps a float",
        lambda: _fit(solver=ds.Tsit5(), dt=None, max_steps=2.7),
        TypeError,
        "max_steps must be a Python int",
    ),
    (
        "rtol and atol 0",
        lambda: _fit(rtol=0.0, atol=0.0),
        ValueError,
        "rtol and atol cannot both be 0",
    ),
    ("rtol NaN", lambda: _fit(rtol=float("nan")), ValueError, "rtol must be finite"),
    ("negative atol", lambda: _fit(atol=-1.0), ValueError, "atol must be >= 0"),
    (
        "initial_state as a mask",
        lambda: _fit(initial_state=[True, False]),
        TypeError,
        r"initial_state lists True: give the fitted components by index or name .*not as a mask",
    ),
    (
        "initial_state a number",
        lambda: _fit(initial_state=1.5),
        TypeError,
        "initial_state must be True, False or a list",
    ),
    ("params an int", lambda: _fit(params=3), TypeError, "params must be a parameter name"),
    (
        "bounds of one value",
        lambda: _fit(bounds={"omega": (0,)}),
        ValueError,
        r"bounds\['omega'\] must be \(lower, upper\)",
    ),
    (
        "bounds a number",
        lambda: _fit(bounds={"omega": 5}),
        ValueError,
        r"bounds\['omega'\] must be \(lower, upper\)",
    ),
    (
        "bounds a list",
        lambda: _fit(bounds=[0.0, 1.0]),
        TypeError,
        r"bounds must be a dict name -> \(lower, upper\)",
    ),
    (
        "key an int",
        lambda: _fit(starts=3, key=0),
        TypeError,
        r"key must be a JAX random key such as jax.random.key\(0\), got 0 \(an int seed\?",
    ),
    (
        "observe beyond the state",
        lambda: _fit(observe=lambda y: y[5]),
        ValueError,
        "observe indexes the state beyond its shape",
    ),
    (
        "observe returns integers",
        lambda: _fit(observe=lambda y: jnp.argmax(y)),
        TypeError,
        "observe must return floats",
    ),
    (
        "events a condition",
        lambda: _fit(events=lambda t, y: y[0]),
        TypeError,
        "events as a function must map the model to its events",
    ),
    (
        "events function returns None",
        lambda: _fit(events=lambda m: None),
        TypeError,
        "the events function returned None",
    ),
    (
        "float16 y0",
        lambda: ds.fit(OSCILLATOR, jnp.array([1.0, 0.0], jnp.float16), (FIT_TS, FIT_X), **FIT),
        TypeError,
        "y0 is float16: ds.fit computes covariances",
    ),
    (
        "complex y0",
        lambda: ds.fit(OSCILLATOR, jnp.array([1.0 + 0j, 0.0]), (FIT_TS, FIT_X), **FIT),
        TypeError,
        "y0 is complex",
    ),
    (
        "tuple y0",
        lambda: ds.fit(OSCILLATOR, (jnp.ones(()), jnp.zeros(())), (FIT_TS, FIT_X), **FIT),
        TypeError,
        "ds.fit takes the initial state as one array",
    ),
    (
        "data of 1e308",
        lambda: _fit(data=(FIT_TS, np.where(FIT_TS > 2, 1e308, FIT_X))),
        ValueError,
        r"the data reach 1e\+308 .*overflow float64. Rescale the data",
    ),
    # --- data: arrays, tables ---------------------------------------------------------------------
    (
        "complex data",
        lambda: ds.Data([0.0, 1.0, 2.0], np.array([1 + 1j, 2, 3])),
        ValueError,
        "data values are complex numbers",
    ),
    (
        "ragged data",
        lambda: ds.Data([0.0, 1.0], [[1.0, 2.0], [3.0]]),
        ValueError,
        "data values must be a rectangular array",
    ),
    (
        "text data",
        lambda: ds.Data([0.0, 1.0], ["1", "2"]),
        ValueError,
        "data values must be numbers, got an array of dtype <U1",
    ),
    (
        "frame with a text cell",
        lambda: ds.Data.from_frame(pd.DataFrame({"x": [1.0, "n/a", 3.0]}, index=[0.0, 1.0, 2.0])),
        ValueError,
        r"DataFrame column 'x': row '1.0' holds 'n/a', which is not a number",
    ),
    (
        "frame with dates as times",
        lambda: ds.Data.from_frame(
            pd.DataFrame({"x": [1.0, 2.0]}, index=pd.to_datetime(["1900-01-01", "1901-01-01"]))
        ),
        ValueError,
        r"DataFrame index \(the times\) holds dates",
    ),
    (
        "frame with durations as times",
        lambda: ds.Data.from_frame(
            pd.DataFrame({"x": [1.0, 2.0]}, index=pd.to_timedelta([0, 1], unit="s"))
        ),
        ValueError,
        "holds durations",
    ),
    (
        "frame with the default index",
        lambda: ds.Data.from_frame(pd.DataFrame({"t": [0.0, 1.0], "x": [1.0, 2.0]})),
        ValueError,
        r"the default 0, 1, 2, …: pass time='<column>'",
    ),
    (
        "frame with text times",
        lambda: ds.Data.from_frame(pd.DataFrame({"x": [1.0, 2.0]}, index=["t0", "t1"])),
        ValueError,
        r"row 't0' holds 't0', which is not a number",
    ),
    (
        "frame with duplicate columns",
        lambda: ds.Data.from_frame(
            pd.DataFrame(np.ones((2, 2)), columns=["a", "a"], index=[0.0, 1.0])
        ),
        ValueError,
        r"duplicate column names \['a'\]",
    ),
    (
        "frame naming the time twice",
        lambda: ds.Data.from_frame(
            pd.DataFrame({"t": [0.0, 1.0], "x": [1.0, 2.0]}), time="t", columns=["t", "x"]
        ),
        ValueError,
        "the time column 't' is also listed among columns",
    ),
    (
        "xarray without that dimension",
        lambda: ds.Data.from_xarray(
            xr.DataArray([1.0, 2.0], dims=["time"], coords={"time": [0.0, 1.0]}), time="t"
        ),
        ValueError,
        r"no dimension 't' for the times; its dimensions are \['time'\]",
    ),
    (
        "xarray with labels as times",
        lambda: ds.Data.from_xarray(
            xr.DataArray(
                np.zeros((2, 3)),
                dims=["obs", "time"],
                coords={"time": [0.0, 1.0, 2.0], "obs": ["a", "b"]},
            )
        ),
        ValueError,
        r"the coordinate 'obs' \(the times\): row 'a' holds 'a'",
    ),
    # --- sweeps and samples -----------------------------------------------------------------------
    (
        "axis of text",
        lambda: _sweep({"length": ["1.0", "2.0"]}),
        TypeError,
        "sweep axis 'length' must hold real numbers, got dtype <U3",
    ),
    (
        "axis of complex numbers",
        lambda: _sweep({"length": [1 + 1j, 2.0]}),
        TypeError,
        r"must hold real numbers, got dtype complex128 \(complex\)",
    ),
    (
        "axis of booleans",
        lambda: _sweep({"length": [True, False]}),
        TypeError,
        "must hold real numbers, got dtype bool",
    ),
    (
        "axis a set",
        lambda: _sweep({"length": {1.0, 2.0}}),
        TypeError,
        "a set or a generator has no order",
    ),
    (
        "ragged axis",
        lambda: _sweep({"y0": [[1.0, 0.0], [1.0]]}, y0=None),
        ValueError,
        "its values have different shapes",
    ),
    (
        "axis replacing a pytree field",
        lambda: _sweep(
            {"params": [1.0, 2.0]}, model=ds.ODE(lambda t, y, p: -p["k"] * y, {"k": 1.0})
        ),
        TypeError,
        r"ODE.params is a dict, not an array",
    ),
    (
        "reduce returning text",
        lambda: _sweep(reduce=lambda s: "done"),
        TypeError,
        "the reduce output 'output' must be numbers",
    ),
    ("store a number", lambda: _sweep(store=5), TypeError, "store must be a path"),
    ("store empty", lambda: _sweep(store=""), ValueError, "store is an empty path"),
    ("store with NUL", lambda: _sweep(store="a\x00b.zarr"), ValueError, "NUL character"),
    (
        "NaN y0",
        lambda: _sweep(y0=jnp.array([jnp.nan, 0.0])),
        ValueError,
        "y0 holds NaN or inf; the initial state shared by the members must be finite",
    ),
    (
        "sweep key an int",
        lambda: _sweep(model=lambda length, key: models.DampedPendulum(length=length), key=0),
        TypeError,
        "key must be a JAX random key",
    ),
    (
        "summary of a dict",
        lambda: ds.sweep_summary({"a": 1}),
        TypeError,
        "sweep_summary takes the xarray.Dataset of a sweep",
    ),
    (
        "samples without bounds",
        lambda: ds.Samples.latin_hypercube({}, 4, key=jax.random.key(0)),
        TypeError,
        "bounds must be a non-empty dict",
    ),
    (
        "samples bound as text",
        lambda: ds.Samples.latin_hypercube({"a": "01"}, 4, key=jax.random.key(0)),
        TypeError,
        r"bound of 'a' must be \(low, high\), got '01'",
    ),
    (
        "samples log as text",
        lambda: ds.Samples.halton({"ab": (1.0, 2.0)}, 4, log="ab"),
        TypeError,
        r"log must be a list of names, e.g. log=\['ab'\]",
    ),
    (
        "halton skip negative",
        lambda: ds.Samples.halton({"a": (0.0, 1.0)}, 4, skip=-1),
        ValueError,
        "skip must be >= 0",
    ),
    (
        "halton skip a float",
        lambda: ds.Samples.halton({"a": (0.0, 1.0)}, 4, skip=1.5),
        TypeError,
        "skip must be a Python int",
    ),
    (
        "samples n as text",
        lambda: ds.Samples.halton({"a": (0.0, 1.0)}, "4"),
        TypeError,
        "the number of samples n must be an int",
    ),
    (
        "latin hypercube key an int",
        lambda: ds.Samples.latin_hypercube({"a": (0, 1)}, 4, key=0),
        TypeError,
        "key must be a JAX random key",
    ),
    # --- iterate, analysis -----------------------------------------------------------------------
    (
        "iterate stop a number",
        lambda: _iterate(stop=lambda s: s - 3.0),
        TypeError,
        "stop\\(state\\) must return one boolean .*a number is not a stop condition",
    ),
    (
        "iterate step changes the shape",
        lambda: _iterate(step=lambda k, s: jnp.stack([s, s])),
        TypeError,
        "step\\(key, state\\) must return a state like the one it takes",
    ),
    (
        "iterate arguments swapped",
        lambda: _iterate(step=lambda s, k: s + jax.random.normal(k)),
        TypeError,
        "step takes the key first, then the state",
    ),
    ("iterate key an int", lambda: _iterate(key=0), TypeError, "key must be a JAX random key"),
    (
        "SDE key an int",
        lambda: ds.simulate(
            models.OrnsteinUhlenbeck(),
            jnp.array(1.0),
            jnp.linspace(0.0, 1.0, 3),
            solver=ds.EulerMaruyama(),
            dt=0.1,
            key=0,
        ),
        TypeError,
        "key must be a JAX random key",
    ),
    (
        "lyapunov t0 NaN",
        lambda: ds.lyapunov_exponent(
            models.Lorenz(),
            jnp.array([1.0, 1.0, 20.0]),
            solver=ds.RK4(),
            dt=0.01,
            steps=100,
            t0=float("nan"),
        ),
        ValueError,
        "t0 must be finite",
    ),
    (
        "sensitivity to a misspelt name",
        lambda: ds.sensitivity(
            PENDULUM, Y0, np.linspace(0.0, 1.0, 6), solver=ds.RK4(), dt=0.1, wrt="lenght"
        ),
        ValueError,
        r"DampedPendulum has no parameter 'lenght'; it has: length, gravity, damping",
    ),
    (
        "sensitivity to a switched-off term",
        lambda: ds.sensitivity(
            PENDULUM,
            Y0,
            np.linspace(0.0, 1.0, 6),
            solver=ds.RK4(),
            dt=0.1,
            wrt=("drive_amplitude",),
        ),
        ValueError,
        r"DampedPendulum.drive_amplitude is None, not a floating array",
    ),
    # --- plots ----------------------------------------------------------------------------------
    (
        "plot.fit of a solution",
        lambda: ds.plot.fit(_solution()),
        TypeError,
        "ds.plot.fit takes a ds.FitResult",
    ),
    (
        "plot.trajectory of an array",
        lambda: ds.plot.trajectory(np.zeros((3, 2))),
        TypeError,
        "ds.plot.trajectory takes a ds.Solution",
    ),
    (
        "trajectory names as text",
        lambda: ds.plot.trajectory(_solution(), names="ab"),
        TypeError,
        "names must be a list of labels",
    ),
    (
        "trajectory component beyond the state",
        lambda: ds.plot.trajectory(_solution(), components=[0, 4]),
        ValueError,
        "component 4 is not an index of the 2 state components",
    ),
    (
        "phase portrait axis beyond the state",
        lambda: ds.plot.phase_portrait(np.zeros((3, 2)), 0, 5),
        ValueError,
        "axis component 5 is not an index of the 2 state components",
    ),
    # --- the stiff solvers' model hooks (a step used to fail inside a reshape, or every step
    # to fail as "max_steps_reached: loosen rtol/atol") ----------------------------------------
    (
        "jacobian of the wrong shape",
        lambda: _with_hooks(jacobian=lambda t, y: jnp.zeros(3)),
        ValueError,
        r"_Hooked.jacobian\(t, y\) returns shape \(3,\), but the state \(\(2,\)\) has 2 "
        r"components: it must return .* an \(2, 2\) array",
    ),
    (
        "jacobian returning NaN",
        lambda: _with_hooks(jacobian=lambda t, y: jnp.full((2, 2), jnp.nan)),
        ValueError,
        r"_Hooked.jacobian\(t, y\) returns NaN or inf at t0 = 0 and y0",
    ),
    (
        "jacobian of integers",
        lambda: _with_hooks(jacobian=lambda t, y: jnp.zeros((2, 2), jnp.int32)),
        TypeError,
        r"jacobian\(t, y\) must return real floats, got int32",
    ),
    (
        "negative jacobian_bandwidth",
        lambda: _with_hooks(band=(-1, 0)),
        ValueError,
        r"_Hooked.jacobian_bandwidth must be None or \(lower, upper\), two ints >= 0 .* "
        r"got \(-1, 0\)",
    ),
    (
        "jacobian_bandwidth of floats",
        lambda: _with_hooks(band=(1.0, 1.0)),
        ValueError,
        r"jacobian_bandwidth must be None or \(lower, upper\), two ints",
    ),
    (
        "jacobian_bandwidth wider than the state",
        lambda: _with_hooks(band=(3, 0)),
        ValueError,
        r"jacobian_bandwidth = \(3, 0\), but ∂f/∂y of a state of 2 components has at most 1",
    ),
    # --- settings ----------------------------------------------------------------------------
    (
        "cache='no' (a truthy string)",
        lambda: ds.config(cache="no"),
        TypeError,
        r"ds.config\(cache=...\) must be True, False or None, got 'no'",
    ),
    (
        "cache=0",
        lambda: ds.config(cache=0),
        TypeError,
        r"must be True, False or None, got 0",
    ),
    (
        "cache_dir not a path",
        lambda: ds.config(cache_dir=3),
        TypeError,
        r"cache_dir=...\) must be a path, got 3",
    ),
    (
        "cache off with a folder",
        lambda: ds.config(cache=False, cache_dir="somewhere"),
        ValueError,
        "a folder for a cache that is off",
    ),
]


class _Hooked(ds.AbstractODE):
    """y' = −y with the stiff solvers' optional hooks set from outside."""

    own_jacobian: object = None
    band: object = None

    def vector_field(self, t, y, args=None):
        return -y

    def jacobian(self, t, y):
        return None if self.own_jacobian is None else self.own_jacobian(t, y)

    @property
    def jacobian_bandwidth(self):
        return self.band


def _with_hooks(jacobian=None, band=None):
    model = _Hooked(own_jacobian=jacobian, band=band)
    return ds.simulate(model, jnp.ones(2), jnp.array([0.0, 1.0]), solver=ds.Rodas5P())


@pytest.mark.parametrize("call, error, message", named_cases(CASES))
def test_bad_input_names_the_culprit(call, error, message):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # only the error counts here
        with pytest.raises(error, match=message):
            call()


# --- cases that used to answer silently wrong ----------------------------------------------------


def test_a_list_y0_is_the_array_state_not_a_pytree():
    # [angle, velocity] as a list once read as the (q, v) pytree of a second-order model, so
    # ys[:, 0] was the velocity history and the sweep's outputs were final_state_0 and _1
    as_list = _simulate(y0=[0.5, 0.0])
    as_array = _simulate()
    np.testing.assert_array_equal(as_list.ys, as_array.ys)
    swept = _sweep(y0=[0.5, 0.0], reduce="final_state")
    assert "final_state" in swept and swept["final_state"].shape == (2, 2)


def test_a_step_below_the_resolution_of_the_times_warns_before_running():
    # float32 over [0, 1]: numbers near 1 are 1.2e-7 apart; a 1e-9 step would take 1e9 steps
    # (63 s) and leave the state at its initial value. The warning comes before any work, so
    # turning it into an error stops the solve at once.
    with warnings.catch_warnings():
        warnings.simplefilter("error", ds.PrecisionWarning)
        for dt in (1e-7, 1e-9):
            with pytest.raises(ds.PrecisionWarning, match=r"below what float32 resolves .*float64"):
                _simulate(y0=Y0.astype(jnp.float32), ts=np.array([0.0, 1.0]), dt=dt)
        # a step the type resolves says nothing (and runs)
        sol = _simulate(y0=Y0.astype(jnp.float32), ts=np.array([0.0, 1.0]), dt=1e-3)
        assert sol.ys.dtype == jnp.float32


def test_a_float32_dt_divides_the_grid_it_was_rounded_from():
    sol = _simulate(dt=np.float32(0.1))
    np.testing.assert_array_equal(sol.ys, _simulate(dt=0.1).ys)


def test_tolerances_below_the_precision_say_so():
    y0 = Y0.astype(jnp.float16)
    with pytest.warns(ds.PrecisionWarning, match=r"rtol=1e-06 is below float16's epsilon"):
        with pytest.raises(ds.SimulationError, match=r"max_steps_reached.*below float16's epsilon"):
            _simulate(y0=y0, ts=TS.astype(jnp.float16), solver=ds.Tsit5(), dt=None, max_steps=64)


def test_warnings_point_at_the_callers_line_also_under_its_jit():
    # raised deep in the solve (and, under jit, below JAX's tracing frames): the line reported
    # is the one in this file that called diffsim
    solver = ds.Tsit5(rtol=1e-8, atol=1e-8)
    y0, ts = Y0.astype(jnp.float32), np.array([0.0, 1.0])
    with pytest.warns(ds.PrecisionWarning, match="cannot be that accurate") as caught:
        ds.simulate(PENDULUM, y0, ts, solver=solver)
    assert caught[0].filename == __file__

    @jax.jit
    def final(y0):
        return ds.simulate(PENDULUM, y0, ts, solver=solver).ys[-1]

    with pytest.warns(ds.PrecisionWarning) as caught:
        final(y0)
    body = final.__wrapped__.__code__.co_firstlineno + 2  # @jax.jit, def final, its body
    assert caught[0].filename == __file__ and caught[0].lineno == body
    with pytest.warns(ds.FitWarning) as caught:
        ds.fit(
            models.DampedPendulum(damping=0.1),
            Y0,
            (TS[:3], np.zeros(3)),
            params=["damping"],
            observe=lambda y: y[0],
            max_iterations=1,
        )
    assert {w.filename for w in caught} == {__file__}


def test_a_stiff_solver_out_of_steps_is_not_told_to_use_a_stiff_solver():
    with pytest.raises(ds.SimulationError, match="max_steps_reached") as error:
        ds.simulate(
            models.Robertson(),
            jnp.array([1.0, 0.0, 0.0]),
            jnp.array([0.0, 1e3]),
            solver=ds.Kvaerno5(),
            max_steps=4,
        )
    assert "raise max_steps or loosen rtol/atol" in str(error.value)
    assert "stiff solver" not in str(error.value)


# Events: one rule for every solver. A condition that starts on zero counts as coming from the
# side opposite to where the flow carries it, so it fires at t0 when it leaves zero in the
# event's direction; conditions that cannot be tracked are flagged.
EVENT_SOLVERS = [
    pytest.param(dict(solver=ds.RK4(), dt=0.01), id="RK4"),
    pytest.param(dict(solver=ds.Tsit5(rtol=1e-8, atol=1e-8)), id="Tsit5"),
]


def test_a_condition_zero_at_t0_fires_there_as_with_an_adaptive_solver():
    # y[0] - 1 is zero at t0 and rising (velocity 1): the event fires at t0, as Tsit5 always
    # did, where RK4 once fired on the way back at t = 0.236 (the ball below covers both)
    event = ds.Event(lambda t, y: y[0] - 1.0, terminal=True)
    sol = _simulate(y0=jnp.array([1.0, 1.0]), dt=0.01, events=event)
    # the root of the first step's interpolant, at theta = 0 up to the root finder's round-off
    # (a later firing would be at 0.236)
    assert abs(float(sol.event_time)) < 1e-12


@pytest.mark.parametrize("options", EVENT_SOLVERS)
def test_a_ball_released_at_the_floor_bounces_at_once(options):
    # x = 0, v = -1 at t0: the first impact is at t0 (v -> +1 with e = 1), then flights of
    # 2 v / g; the ball never goes below the floor (it once fell to -82 m)
    ball = models.BouncingBall(restitution=1.0)
    ts = jnp.linspace(0.0, 0.5, 51)
    sol = ds.simulate(
        ball, jnp.array([0.0, -1.0]), ts, events=ball.impacts(max_events=4), **options
    )
    times = np.asarray(sol.event_time)
    # free fall is a cubic (quadratic) trajectory: RK4's Hermite interpolant and Tsit5's dense
    # output locate its roots to the root finder's tolerance (~1e-10 in time); 1e-9 and a
    # relative 1e-6 leave room for the 1e-8 step tolerance of Tsit5's flights
    assert abs(times[0]) < 1e-9
    np.testing.assert_allclose(times[1], 2 * 1.0 / 9.81, rtol=1e-6)
    # no output below the floor beyond the same round-off (it once fell to -82 m)
    assert float(jnp.min(sol.ys[:, 0])) > -1e-9


@pytest.mark.parametrize("options", EVENT_SOLVERS)
def test_a_condition_that_is_never_finite_is_flagged(options):
    event = ds.Event(lambda t, y: jnp.sqrt(-1.0 - y[0] ** 2), terminal=True)  # NaN everywhere
    sol = ds.simulate(PENDULUM, Y0, TS, events=event, throw=False, **options)
    assert int(sol.result) == ds.RESULTS.event_failed
    with pytest.raises(ds.SimulationError, match="event_failed.*NaN or inf"):
        ds.simulate(PENDULUM, Y0, TS, events=event, **options)


def test_a_condition_that_jumps_is_not_blamed_on_an_implicit_solver():
    # diffrax's Newton root finder (the solve diffrax runs, adjoint="checkpoint") cannot locate
    # a jump; the message names the condition, not an implicit solver's Newton iteration
    step = ds.Event(lambda t, y: jnp.where(y[0] > 0.25, 1.0, -1.0), terminal=True)
    with pytest.raises(ds.SimulationError, match="event_failed.*step function") as error:
        _simulate(
            y0=jnp.array([0.5, 0.0]),
            solver=ds.Tsit5(),
            dt=None,
            events=step,
            adjoint="checkpoint",
        )
    assert "implicit" not in str(error.value)
    # diffsim's own loop brackets the jump: the pendulum from 0.5 rad at rest passes 0.25 rad
    # where the same solve without the event does
    sol = _simulate(y0=jnp.array([0.5, 0.0]), solver=ds.Tsit5(), dt=None, events=step)
    fine = ds.simulate(
        PENDULUM, jnp.array([0.5, 0.0]), TS, solver=ds.Tsit5(), events=ds.Event(_above_quarter)
    )
    np.testing.assert_allclose(sol.event_time, fine.event_time, rtol=1e-6)


def _above_quarter(t, y):
    return y[0] - 0.25


def test_an_event_holding_float64_runs_on_a_float32_state():
    # impacts() holds the restitution as float64 under x64; it is cast to the state's dtype
    ball = models.BouncingBall()
    ts = jnp.linspace(0.0, 1.0, 11, dtype=jnp.float32)
    sol = ds.simulate(
        ball,
        jnp.array([1.0, 0.0], jnp.float32),
        ts,
        solver=ds.RK4(),
        dt=0.01,
        events=ball.impacts(),
    )
    assert int(sol.event_count) == 1 and sol.ys.dtype == jnp.float32
    # t = sqrt(2h/g), located in float32: a relative 1e-5 is ~100 float32 epsilons
    np.testing.assert_allclose(float(sol.event_time[0]), np.sqrt(2 / 9.81), rtol=1e-5)


def test_a_reset_that_returns_nan_is_a_nonfinite_state():
    event = ds.Event(lambda t, y: y[0], reset=lambda t, y: y * jnp.nan)
    sol = ds.simulate(
        PENDULUM, Y0, jnp.linspace(0.0, 2.0, 11), solver=ds.Tsit5(), events=event, throw=False
    )
    assert int(sol.result) == ds.RESULTS.nonfinite_state


def test_numpy_integer_counts_are_counts():
    event = ds.Event(lambda t, y: y[0], reset=lambda t, y: y, max_events=np.int64(3))
    assert event.max_events == 3 and isinstance(event.max_events, int)
    assert len(ds.Samples.halton({"a": (0.0, 1.0)}, np.int64(4))) == 4


def test_data_names_and_series():
    assert ds.Data([0.0, 1.0], [1.0, 2.0], names="prey").names == ("prey",)
    series = pd.Series([1.0, 2.0, 4.0], index=[0.0, 1.0, 2.0], name="hare")
    data = ds.Data.from_frame(series)
    assert data.names == ("hare",) and data.values.tolist() == [[1.0], [2.0], [4.0]]
    frame = pd.DataFrame({0: [1.0, 2.0]}, index=[0.0, 1.0])  # a column named by an integer
    assert ds.Data.from_frame(frame, columns=[0]).names == ("0",)


# --- failures that name their cause (they used to end in generic advice) ------------------------


def test_an_open_end_whose_event_never_happens_says_so():
    # the advice was a stiff solver, which cannot take an open end either
    never = ds.Event(lambda t, y: y[0] + 10.0, terminal=True)  # a decay never reaches -10
    with pytest.raises(ds.SimulationError, match="terminal event that closes the open end") as e:
        ds.simulate(
            ds.ODE(lambda t, y, p: -y, None),
            jnp.ones(1),
            jnp.array([0.0, jnp.inf]),
            solver=ds.Tsit5(),
            events=never,
            max_steps=64,
        )
    assert "Kvaerno5" not in str(e.value) and "stiff" not in str(e.value)


def test_traced_step_bounds_that_exclude_every_step_are_invalid_input():
    # dtmin > dtmax under jit failed the first step as "below dtmin: the problem is stiff"
    run = jax.jit(
        lambda dtmin: (
            ds.simulate(
                ds.ODE(lambda t, y, p: -y, None),
                jnp.ones(1),
                jnp.array([0.0, 1.0]),
                solver=ds.Tsit5(dtmin=dtmin, dtmax=0.1),
                throw=False,
            ).result
        )
    )
    assert int(run(0.5)) == ds.RESULTS.invalid_input
    assert int(run(0.01)) == ds.RESULTS.successful
    assert "dtmin exceeds dtmax" in ds.RESULTS.invalid_input.message


def test_a_reset_that_breaks_a_dae_is_named_in_the_failure():
    # x' = −x + z, 0 = z − x/2 (z = x/2 at every consistent state); the reset sets z = 1
    dae = ds.ODE(
        lambda t, y, p: jnp.stack([-y[0] + y[1], y[1] - 0.5 * y[0]]),
        None,
        mass_matrix=jnp.diag(jnp.array([1.0, 0.0])),
    )
    kick = ds.Event(lambda t, y: y[0] - 0.5, reset=lambda t, y: y.at[1].set(1.0), direction=-1)
    # the detail and the note join with one ". " (they printed "max_steps=200; .  An event's")
    with pytest.raises(
        ds.SimulationError, match="reset of a model with a mass matrix must"
    ) as raised:
        ds.simulate(
            dae,
            jnp.array([1.0, 0.5]),
            jnp.array([0.0, 5.0]),
            solver=ds.Rodas5P(),
            events=kick,
            max_steps=200,
        )
    assert "max_steps=200. An event's reset" in str(raised.value)


def test_a_model_function_with_its_arguments_swapped_is_named_in_plain_text():
    # fn(p, t, y) where ds.ODE calls fn(t, y, params): y[1] of the dict raises KeyError, whose
    # text printed in quotes ('y0 does not fit ODE ... KeyError: 1'); still a KeyError
    swapped = ds.ODE(lambda p, t, y: jnp.stack([y[1], -p * y[0]]), {"k": 1.0})
    with pytest.raises(KeyError) as raised:
        ds.simulate(swapped, jnp.ones(2), jnp.linspace(0.0, 1.0, 3), solver=ds.RK4(), dt=0.1)
    assert str(raised.value).startswith("y0 does not fit ODE, or its vector_field is broken")
    assert str(raised.value).endswith("(ds.ODE calls fn(t, y, params) in this order)")
