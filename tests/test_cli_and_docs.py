"""The command line, the demo, and the numbers of the fitting and events pages' examples (every
page's blocks run in test_docs.py; the benchmarks: test_bench.py)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import diffsim as ds

ROOT = Path(__file__).resolve().parent.parent


def test_fitting_page_example_runs():
    text = (ROOT / "docs" / "fitting.md").read_text()
    block = text.split("## A first fit")[1].split("```python")[1].split("```")[0]
    namespace = {}
    exec(compile(block, "docs/fitting.md", "exec"), namespace)  # noqa: S102
    assert namespace["low"] < 0.25 < namespace["high"]


def test_demo_writes_figure_and_gradient_matches_finite_difference(tmp_path):
    from diffsim._apps.demo import run

    summary = run(tmp_path, quick=True)
    assert (tmp_path / "demo.png").stat().st_size > 10_000
    assert json.loads((tmp_path / "demo.json").read_text())["sweep_members"] == 256
    # Central difference with h = 1e-3 has truncation error ~h^2 * f''' ~ 1e-6 relative here.
    assert summary["gradient"] == pytest.approx(summary["finite_difference"], rel=1e-4)
    assert summary["rk4_vs_tsit5_max_difference"] < 1e-5  # RK4 at dt = 0.01: error ~1e-6


def test_python_dash_m_info():
    out = subprocess.run(
        [sys.executable, "-m", "diffsim", "info"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    assert out.stdout.startswith("diffsim ") and "jax " in out.stdout


def test_cli_rejects_unknown_command():
    out = subprocess.run(
        [sys.executable, "-m", "diffsim", "frobnicate"], capture_output=True, text=True, cwd=ROOT
    )
    assert out.returncode == 2 and "invalid choice" in out.stderr


def test_an_interrupted_command_says_so_without_a_traceback(monkeypatch, capsys):
    from diffsim._apps import cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_info", interrupted)
    assert cli.main(["info"]) == 130
    err = capsys.readouterr().err
    assert "diffsim info: interrupted" in err and "Traceback" not in err


def test_sweep_command_runs_the_example_config_and_resumes(tmp_path, capsys):
    from diffsim.cli import main

    config = str(ROOT / "experiments" / "sweeps" / "driven_pendulum.toml")
    store = str(tmp_path / "pendulum.zarr")
    assert main(["sweep", config, "--store", store, "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "768 members" in out and "successful: 768" in out
    result = ds.open_sweep(store)
    # Without drive the pendulum only loses energy, so its largest angle is the initial 0.2 rad.
    undriven = result["max_abs"].sel(drive_amplitude=0.0, state="angle").values
    assert (undriven == 0.2).all()
    assert main(["sweep", config, "--store", store]) == 2
    assert "pass --resume" in capsys.readouterr().err
    assert main(["sweep", config, "--store", store, "--resume", "--quiet"]) == 0


def test_sweep_command_rejects_a_bad_config(tmp_path, capsys):
    from diffsim.cli import main

    config = tmp_path / "bad.toml"
    config.write_text('model = "Pendulum"\nsolvr = "RK4"\n')
    assert main(["sweep", str(config)]) == 2
    assert "unknown keys ['solvr']" in capsys.readouterr().err
    config.write_text(
        'model = "Pendulum"\ny0 = [1.0, 0.0]\nts = [0.0, 1.0]\nsolver = "RK4"\nstore = "x"\n'
        "[axes]\nlength = [1.0]\n"
    )
    assert main(["sweep", str(config), "--store", str(tmp_path / "s.zarr")]) == 2
    assert "model 'Pendulum' is not in models; available: [" in capsys.readouterr().err


def test_config_models_resolve_by_name_or_path_in_the_models_package():
    # the library never imports models: a config's model is looked up at run time, by a class
    # name of the models package or a path inside it; no other module is ever imported
    import models
    from diffsim._apps.config import ConfigError, model_class

    assert model_class("Lorenz") is models.Lorenz
    assert model_class("models.chaos.Lorenz") is models.Lorenz
    with pytest.raises(ConfigError, match="names a model of models .*not of 'os'"):
        model_class("os.system")
    with pytest.raises(ConfigError, match="cannot import 'models.nowhere'"):
        model_class("models.nowhere.Model")
    with pytest.raises(ConfigError, match=r"'models.chaos.lorenz' is not in models.chaos"):
        model_class("models.chaos.lorenz")


def test_events_page_example_runs():
    text = (ROOT / "docs" / "events.md").read_text()
    block = text.split("## Events")[1].split("```python")[1].split("```")[0]
    namespace = {}
    exec(compile(block, "docs/events.md", "exec"), namespace)  # noqa: S102
    sol, ball = namespace["sol"], namespace["ball"]
    assert int(sol.event_count) == 5
    closed_form = np.asarray(ball.bounce_times(2.0, 5))
    np.testing.assert_allclose(np.asarray(sol.event_time[:5]), closed_form, rtol=1e-5)
