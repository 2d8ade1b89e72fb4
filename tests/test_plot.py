"""The plot helpers draw what they are given, say what is wrong with bad input, and save
byte-stable files."""

import jax.numpy as jnp
import matplotlib
import numpy as np
import pytest

import diffsim as ds
import models

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _pendulum_solution():
    model = models.DampedPendulum(length=1.0, damping=0.2)
    ts = jnp.linspace(0.0, 2.0, 21)
    return model, ds.simulate(model, jnp.array([1.0, 0.0]), ts, solver=ds.RK4(), dt=0.01)


def test_trajectory_and_phase_portrait_draw_the_states():
    model, sol = _pendulum_solution()
    fig = ds.plot.trajectory(sol, names=model.state_names)
    (ax,) = fig.axes
    assert [line.get_label() for line in ax.lines] == ["angle", "angular_velocity"]
    np.testing.assert_array_equal(ax.lines[1].get_ydata(), np.asarray(sol.ys[:, 1]))

    fig = ds.plot.phase_portrait(sol, names=model.state_names)
    line = fig.axes[0].lines[0]
    np.testing.assert_array_equal(line.get_xdata(), np.asarray(sol.ys[:, 0]))
    assert fig.axes[0].get_ylabel() == "angular_velocity"
    # several trajectories at once (members, times, components), into given axes
    fig, ax = plt.subplots()
    batch = np.stack([np.asarray(sol.ys), 2 * np.asarray(sol.ys)])
    assert ds.plot.phase_portrait(batch, ax=ax) is fig and len(ax.lines) == 2
    with pytest.raises(ValueError, match=r"got shape \(21,\)"):
        ds.plot.phase_portrait(np.zeros(21))
    with pytest.raises(ValueError, match="got 1 names for 2 state components"):
        ds.plot.trajectory(sol, names=["angle"])


def test_sweep_heatmap_and_sweep_line_show_a_variable_over_two_axes_and_one():
    result = ds.sweep(
        models.DampedPendulum(),
        {"length": np.linspace(0.5, 2.0, 4), "damping": [0.0, 0.5, 1.0]},
        jnp.array([1.0, 0.0]),
        jnp.linspace(0.0, 1.0, 11),
        solver=ds.RK4(),
        dt=0.01,
        reduce="final_state",
        progress=False,
    )
    fig = ds.plot.sweep_heatmap(result, "final_state", select={"state": "angle"})
    ax = fig.axes[0]
    assert ax.get_xlabel() == "length" and ax.get_ylabel() == "damping"
    mesh = ax.collections[0]
    expected = result["final_state"].sel(state="angle").transpose("damping", "length").values
    np.testing.assert_array_equal(np.asarray(mesh.get_array()).reshape(3, 4), expected)
    with pytest.raises(ValueError, match=r"left over: \['state'\]"):
        ds.plot.sweep_heatmap(result, "final_state")
    with pytest.raises(ValueError, match="choose x and y among them"):  # one dimension left
        ds.plot.sweep_heatmap(result, "final_state", select={"state": "angle", "damping": 0.5})
    with pytest.raises(ValueError, match="no variable 'energy'"):
        ds.plot.sweep_heatmap(result, "energy")
    with pytest.raises(ValueError, match=r"has no dimensions \['angle'\]"):
        ds.plot.sweep_heatmap(result, "final_state", select={"angle": 0})
    # one axis: a line, or one line per value of the dimension left (hue)
    fig = ds.plot.sweep_line(result, "final_state", select={"state": "angle", "damping": 0.5})
    (line,) = fig.axes[0].get_lines()
    np.testing.assert_array_equal(line.get_xdata(), result["length"].values)
    np.testing.assert_array_equal(
        line.get_ydata(), result["final_state"].sel(state="angle", damping=0.5).values
    )
    fig = ds.plot.sweep_line(result, "final_state", x="length", select={"state": "angle"})
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == [
        "damping=0",
        "damping=0.5",
        "damping=1",
    ]
    with pytest.raises(ValueError, match=r"sweep_line: .* \(left over: \['state'\]\)"):
        ds.plot.sweep_line(result, "final_state")


def test_convergence_plot_labels_measured_and_nominal_orders():
    steps = np.array([0.1, 0.05, 0.025, 0.0125])
    # errors C dt^p exactly: the measured slope is p to round-off
    errors = {"second": 3.0 * steps**2, "fourth": 0.5 * steps**4}
    assert ds.plot.measured_order(steps, errors["fourth"]) == pytest.approx(4.0, abs=1e-12)
    fig = ds.plot.convergence(steps, errors, orders={"second": 2, "fourth": 4})
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["second: 2.00 (order 2)", "fourth: 4.00 (order 4)"]
    with pytest.raises(ValueError, match="positive and finite"):
        ds.plot.measured_order(steps, np.array([1.0, 0.0, 1.0, 1.0]))


def test_fit_figure_is_the_fit_results_plot():
    model, sol = _pendulum_solution()
    values = np.asarray(sol.ys[:, 0]) + 0.01 * np.random.default_rng(0).standard_normal(21)
    result = ds.fit(
        models.DampedPendulum(length=1.2, damping=0.2),
        jnp.array([1.0, 0.0]),
        (sol.ts, values),
        params=["length"],
        observe=lambda y: y[0],
        solver=ds.RK4(),
        dt=0.01,
    )
    fig = ds.plot.fit(result)
    top, bottom = fig.axes
    np.testing.assert_allclose(bottom.lines[1].get_ydata(), result.residuals.ravel())
    assert [line.get_label() for line in top.lines] == ["data", "fit"]


def test_save_writes_the_same_bytes_twice_without_dates(tmp_path):
    def draw():
        with ds.plot.style():
            _, sol = _pendulum_solution()
            return ds.plot.trajectory(sol)

    names = ds.plot.save(draw(), tmp_path / "a", "trajectory", formats=("png", "pdf", "svg"))
    ds.plot.save(draw(), tmp_path / "b", "trajectory", formats=("png", "pdf", "svg"))
    assert names == ["trajectory.png", "trajectory.pdf", "trajectory.svg"]
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert b"CreationDate" not in (tmp_path / "a" / "trajectory.pdf").read_bytes()
    with pytest.raises(ValueError, match=r"unknown formats \[.jpg.\]"):
        ds.plot.save(draw(), tmp_path, "x", formats=("jpg",))
