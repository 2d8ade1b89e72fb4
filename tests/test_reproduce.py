"""`diffsim reproduce`: experiments run in their own processes with manifests; `--check` finds
changed figures and data (and only those); failures are reported while the others still run."""

import json
import textwrap

import pytest

import diffsim as ds
from diffsim import _provenance
from diffsim.cli import main

# A stable experiment writes every kind of output (PNG/PDF figure, netCDF, CSV, JSON) from
# seeded numbers; the drifting one stamps the clock into its data; the broken one raises.
STABLE = '''
"""A stable experiment: seeded noise, every kind of output."""
import sys
from pathlib import Path

import numpy as np
import xarray as xr

sys.path.insert(0, str(Path(__file__).parent))
import _shared

import diffsim as ds

SEED = 3


def run(out_dir, quick=False):
    import matplotlib.pyplot as plt

    n = 20 if quick else 40
    x = np.linspace(0.0, 1.0, n)
    y = np.sin(6 * x) + 0.1 * np.random.default_rng(SEED).standard_normal(n)
    fig, ax = plt.subplots()
    ax.plot(x, y, "o-", label=_shared.LABEL)
    ax.legend()
    files = ds.plot.save(fig, out_dir, "curve")
    data = xr.Dataset({"y": ("x", y)}, coords={"x": x})
    data.to_netcdf(Path(out_dir) / "curve.nc", engine="h5netcdf")
    np.savetxt(Path(out_dir) / "curve.csv", np.stack([x, y], 1), delimiter=",",
               header="x,y", comments="")
    (Path(out_dir) / "summary.json").write_text('{"mean": %r}' % float(y.mean()))
    return {"files": files + ["curve.nc", "curve.csv", "summary.json"],
            "config": {"n": n, "seed": SEED}}
'''
DRIFTING = '''
"""An experiment whose data depend on the clock."""
import time
from pathlib import Path


def run(out_dir, quick=False):
    (Path(out_dir) / "stamp.json").write_text('{"t": %r}' % time.time())
    return {"files": ["stamp.json"], "config": {}}
'''
BROKEN = '''
"""An experiment that fails."""


def run(out_dir, quick=False):
    raise RuntimeError("the integrator diverged at t = 3.5")
'''


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    experiments = tmp_path_factory.mktemp("paper") / "experiments"
    experiments.mkdir()
    (experiments / "_shared.py").write_text('LABEL = "noisy sine"\n')  # a helper, not run
    for name, text in (("stable", STABLE), ("drifting", DRIFTING), ("broken", BROKEN)):
        (experiments / f"{name}.py").write_text(textwrap.dedent(text))
    return experiments


@pytest.fixture(scope="module")
def first_run(folder):
    """The three experiments' quick runs through the command line: (exit code, stdout, out)."""
    import contextlib
    import io

    out = folder.parent / "first"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO()):
        code = main(["reproduce", "--quick", "--experiments", str(folder), "--out", str(out)])
    return code, printed.getvalue(), out


def test_runs_each_experiment_with_a_manifest_and_reports_failures(first_run):
    code, text, out = first_run
    assert code == 1  # one experiment failed ...
    assert "broken" in text and "failed" in text and "the integrator diverged" in text
    manifest = json.loads((out / "stable" / "manifest.json").read_text())  # ... the others ran
    assert (out / "drifting" / "manifest.json").exists()
    assert not (out / "broken" / "manifest.json").exists()
    assert "RuntimeError" in (out / "broken" / "log.txt").read_text()

    assert manifest["experiment"] == "stable" and manifest["quick"] is True
    assert manifest["title"] == "A stable experiment: seeded noise, every kind of output."
    assert manifest["config"] == {"n": 20, "seed": 3} and manifest["seed"] == 3
    assert manifest["packages"]["jax"] == __import__("jax").__version__
    assert manifest["machine"]["device_platform"] == "cpu"
    assert manifest["git_commit"] == "none"  # the temporary folder is no git checkout
    assert manifest["dtype"] == "float32"  # this experiment does not enable float64
    assert manifest["wall_time_s"] > 0
    assert set(manifest["files"]) == {
        "curve.png",
        "curve.pdf",
        "curve.nc",
        "curve.csv",
        "summary.json",
    }
    for name, entry in manifest["files"].items():
        assert entry["sha256"] == _provenance.sha256(out / "stable" / name)
        assert entry["kind"] == ("figure" if name.endswith((".png", ".pdf")) else "data")


def test_check_finds_no_change_in_a_stable_rerun_and_names_what_changed(
    folder, first_run, tmp_path, capsys
):
    import shutil

    _, _, first = first_run
    # the rerun takes the mode (quick here) and the experiments from the reference folder
    code = main(
        [
            "reproduce",
            "--experiments",
            str(folder),
            "--check",
            str(first),
            "--out",
            str(tmp_path / "second"),
        ]
    )
    text = capsys.readouterr().out
    assert code == 1
    assert "stable" in text and "same" in text
    assert "drifting" in text and "stamp.json: data changed (largest difference" in text
    report = ds.compare_outputs(first, tmp_path / "second")
    assert report["stable"] == []  # figures, netCDF, CSV and JSON: the same bytes
    assert report["drifting"][0].startswith("stamp.json: data changed")
    with pytest.raises(ValueError, match="was quick; drop --quick"):
        ds.reproduce(experiments=folder, check=first, quick=False, progress=False)

    # an edited reference value is found, with the size of the change; an experiment the
    # folder no longer has and one whose reference run failed are reported, not skipped
    edited = tmp_path / "edited"
    shutil.copytree(first, edited)
    csv = edited / "stable" / "curve.csv"
    lines = csv.read_text().splitlines()
    x, y = lines[5].split(",")
    lines[5] = f"{x},{float(y) + 0.25!r}"
    csv.write_text("\n".join(lines) + "\n")
    fewer = tmp_path / "fewer"
    shutil.copytree(folder, fewer)
    (fewer / "drifting.py").unlink()
    outcomes = ds.reproduce(experiments=fewer, check=edited, out=tmp_path / "third", progress=False)
    status = {o.name: o.status for o in outcomes}
    assert status == {"broken": "no reference", "drifting": "missing", "stable": "changed"}
    (line,) = next(o for o in outcomes if o.name == "stable").differences
    assert line.startswith("curve.csv: data changed (largest difference 0.25")
    assert "reference run failed" in next(o for o in outcomes if o.name == "broken").error


def test_bad_requests_say_what_to_do(folder, tmp_path, capsys):
    with pytest.raises(ValueError, match=r"unknown experiments \['lorenz'\]"):
        ds.reproduce(["lorenz"], experiments=folder, out=tmp_path / "o", progress=False)
    with pytest.raises(FileNotFoundError, match="pass --experiments DIR"):
        ds.reproduce(experiments=tmp_path / "nowhere", progress=False)
    with pytest.raises(FileNotFoundError, match="no output folder"):
        ds.reproduce(experiments=folder, check=tmp_path / "nothing", progress=False)
    assert main(["reproduce", "--experiments", str(folder), "--jobs", "0"]) == 2
    assert "jobs must be at least 1" in capsys.readouterr().err


def test_run_experiment_enforces_the_contract(tmp_path):
    path = tmp_path / "liar.py"
    path.write_text('def run(out_dir, quick=False):\n    return {"files": ["gone.png"]}\n')
    with pytest.raises(ds.ExperimentError, match="listed 'gone.png' but did not write it"):
        ds.run_experiment(path, tmp_path / "out")
    path.write_text("def run(out_dir, quick=False):\n    return None\n")
    with pytest.raises(ds.ExperimentError, match="must return a dict with 'files'"):
        ds.run_experiment(path, tmp_path / "out")
    path.write_text("x = 1\n")
    with pytest.raises(ds.ExperimentError, match="has no function run"):
        ds.run_experiment(path, tmp_path / "out")


def test_a_run_keeps_no_stale_files_and_lists_all_it_writes(tmp_path):
    path = tmp_path / "partial.py"
    path.write_text(
        textwrap.dedent("""
        from pathlib import Path

        def run(out_dir, quick=False):
            if not quick:  # the full run writes it, the quick one only claims to
                (Path(out_dir) / "once.json").write_text("{}")
            return {"files": ["once.json"], "config": {}}
    """)
    )
    out = tmp_path / "out"
    ds.run_experiment(path, out)
    assert (out / "once.json").exists() and (out / "manifest.json").exists()
    with pytest.raises(ds.ExperimentError, match="listed 'once.json' but did not write it"):
        ds.run_experiment(path, out, quick=True)  # the earlier run's file does not count
    assert not (out / "manifest.json").exists()  # the folder no longer claims a valid run
    path.write_text(
        textwrap.dedent("""
        from pathlib import Path

        def run(out_dir, quick=False):
            (Path(out_dir) / "listed.csv").write_text("a\\n1\\n")
            (Path(out_dir) / "forgotten.png").write_bytes(b"")
            return {"files": ["listed.csv"], "config": {}}
    """)
    )
    with pytest.raises(ds.ExperimentError, match=r"wrote \['forgotten.png'\] but did not list"):
        ds.run_experiment(path, out)


def test_changed_text_and_numbers_are_told_apart(tmp_path):
    from diffsim._apps.reproduce import compare_files

    entries = {}
    for name, text in (
        ("old", '{"solver": "RK4", "error": 1.0, "bound": Infinity}'),
        ("new", '{"solver": "RK38", "error": 1.25, "bound": Infinity}'),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(text)
        entries[name] = {
            "summary.json": {"sha256": _provenance.sha256(tmp_path / name / "summary.json")}
        }
    (line,) = compare_files(tmp_path / "old", entries["old"], tmp_path / "new", entries["new"])
    # the equal infinities are no difference; the text is named, the number measured
    assert line == (
        "summary.json: data changed (text changed in solver; largest difference 0.25 in error)"
    )
