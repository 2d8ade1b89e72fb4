"""The fitting experiments (quick runs) and the `diffsim fit` command (the fit benchmark runs
in `diffsim bench`)."""

import json
from pathlib import Path

import pytest
from helpers import check_outputs, load_experiment

ROOT = Path(__file__).parent.parent


# test_fit.py checks the same fit and profile; the full run of the script is the extra here
@pytest.mark.slow
def test_fit_pendulum_experiment(tmp_path):
    record = load_experiment("fit_pendulum").run(tmp_path, quick=True)
    check_outputs(record, tmp_path, ())
    for name, value in record["truth"].items():
        assert abs(record["params"][name] - value) < 3 * record["stderr"][name]
    low, high = record["profile_interval_damping"]
    assert low < record["params"]["damping"] < high


def test_fit_oscillator_target_experiment(tmp_path):
    record = load_experiment("fit_oscillator_target").run(tmp_path, quick=True)
    check_outputs(record, tmp_path, ())
    # RK4 with dt = 1e-3 over 1 s: global error ~ (ωdt)^4 ~ 1e-11 against the closed form
    assert max(record["errors"].values()) < 1e-8


# test_fit.py and the fit-command test below check the same lynx–hare fit against the
# published values; the script adds the profiles and figures
@pytest.mark.slow
def test_fit_lynx_hare_experiment(tmp_path):
    record = load_experiment("fit_lynx_hare").run(tmp_path, quick=True)
    check_outputs(record, tmp_path, ())
    for name, value in record["published"].items():
        assert abs(record["params"][name] - value) < record["stderr"][name]


# test_fit.py checks single against multiple shooting on the same data; the script adds the figure
@pytest.mark.slow
def test_fit_lorenz_experiment(tmp_path):
    record = load_experiment("fit_lorenz").run(tmp_path, quick=True)
    check_outputs(record, tmp_path, ())
    assert record["single_shooting"]["loss"] > 50 * record["multiple_shooting"]["loss"]
    for name, value in record["truth"].items():
        fitted = record["multiple_shooting"]
        assert abs(fitted["params"][name] - value) < 3 * fitted["stderr"][name]


def test_fit_command_writes_summary_json_and_figure(tmp_path, capsys):
    from diffsim.cli import main

    text = (ROOT / "experiments" / "fits" / "lynx_hare.toml").read_text()
    data = ROOT / "experiments" / "data" / "lynx_hare.csv"
    text = text.replace('"../data/lynx_hare.csv"', f'"{data.as_posix()}"')
    # observe = [0, 1] (both populations, as the config format documents) once failed inside
    # JAX ("non-tuple sequence for multidimensional indexing")
    text = text.replace(
        'solver = { name = "Tsit5", rtol = 1e-8, atol = 1e-8 }',
        'solver = "RK4"\ndt = 0.02\nobserve = [0, 1]',
    )
    config = tmp_path / "lynx.toml"
    config.write_text(text)
    assert main(["fit", str(config), "--out", str(tmp_path / "out")]) == 0
    assert "y0[predator]" in capsys.readouterr().out
    record = json.loads((tmp_path / "out" / "fit.json").read_text())
    assert record["converged"] and abs(record["params"]["gamma"] - 0.80) < record["stderr"]["gamma"]
    assert (tmp_path / "out" / "fit.png").stat().st_size > 0
    assert (tmp_path / "out" / "summary.txt").read_text().startswith("fit of LotkaVolterra")


def test_fit_command_rejects_a_bad_config(tmp_path, capsys):
    from diffsim.cli import main

    config = tmp_path / "bad.toml"
    config.write_text('model = "LotkaVolterra"\nfitt = ["alpha"]\n')
    assert main(["fit", str(config)]) == 2
    assert "unknown keys ['fitt']" in capsys.readouterr().err
    config.write_text(
        'model = "LotkaVolterra"\ny0 = [30.0, 4.0]\ndata = "missing.csv"\nfit = ["alpha"]\n'
        'out = "x"\n'
    )
    assert main(["fit", str(config)]) == 2
    assert "data = 'missing.csv' does not exist" in capsys.readouterr().err
    # max_steps reaches ds.fit (a solve that needs more steps failed with no way to say so)
    from diffsim._apps import fit_config

    text = (ROOT / "experiments" / "fits" / "lynx_hare.toml").read_text()
    data = ROOT / "experiments" / "data" / "lynx_hare.csv"
    config.write_text(text.replace('"../data/lynx_hare.csv"', f'"{data.as_posix()}"') + "\n")
    with_steps = config.read_text().replace("\nfit = ", "\nmax_steps = 123\nfit = ", 1)
    config.write_text(with_steps)
    assert fit_config.fit_arguments(fit_config.load(str(config)))["max_steps"] == 123
    # what ds.fit would say in Python terms (observe=lambda ..., params=, key=) is said in the
    # file's own keys
    lynx = text.replace('"../data/lynx_hare.csv"', f'"{data.as_posix()}"')
    cases = {
        'columns = ["hare"]\n': "the data have 1 value column.s. but the state .y0. has 2 "
        "components: list the components the columns measure, in order, e.g. observe = .0.",
        "fit = []\n": "fit = .. names no parameter",
        'solver = "EulerMaruyama"\ndt = 0.1\n': "'EulerMaruyama' is a stochastic solver",
    }
    for change, message in cases.items():
        key = change.split(" =")[0]
        kept = "\n".join(line for line in lynx.splitlines() if not line.startswith(key + " "))
        config.write_text(kept.replace("\nout = ", "\n" + change + "out = ", 1))
        with pytest.raises(fit_config.FitConfigError, match=message):
            fit_config.fit_arguments(fit_config.load(str(config)))
