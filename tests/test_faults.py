"""Faults of files and folders, and bad configs on the command line: nothing is deleted outside
an output folder, every fault of a store, a fit output or a reproduce folder is diffsim's own
error (path, cause, remedy), and the command line answers with a message and an exit code, never
a traceback. The bad-input catalogue of the Python API is `test_bad_input.py`."""

import contextlib
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import named_cases, synthetic_posterior

import diffsim as ds
import models
from diffsim._sweep import store as _store
from diffsim.cli import main

ROOT = Path(__file__).parent.parent
LYNX_HARE = ROOT / "experiments" / "data" / "lynx_hare.csv"


def _cli(*argv) -> tuple[int, str, str]:
    """Run the command line in this process: (exit code, stdout, stderr). An exception escaping
    `main` fails the test: that would be a traceback for the user."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


# --- reproduce: manifests decide what a rerun deletes --------------------------------------------

TINY = '''
"""A tiny experiment."""
from pathlib import Path


def run(out_dir, quick=False):
    (Path(out_dir) / "a.json").write_text("{}")
    return {"files": ["a.json"], "config": {}}
'''


@pytest.fixture(scope="module")
def _paper_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("paper")
    experiments = folder / "experiments"
    experiments.mkdir()
    (experiments / "tiny.py").write_text(textwrap.dedent(TINY))
    # in this process: the folder and manifest `diffsim reproduce` writes, without the cost of
    # its worker process (the refusals tested here come before any worker starts)
    ds.run_experiment(experiments / "tiny.py", folder / "out" / "tiny")
    return folder


@pytest.fixture
def paper(_paper_run, tmp_path):
    """A folder with one experiment run once (a copy per test): (experiments, output folder)."""
    shutil.copytree(_paper_run, tmp_path, dirs_exist_ok=True)
    return tmp_path / "experiments", tmp_path / "out"


def _tamper(out, change):
    path = out / "tiny" / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


@pytest.mark.parametrize("where", ["relative", "absolute", "link"])
def test_a_tampered_manifest_never_deletes_outside_the_output_folder(paper, tmp_path, where):
    experiments, out = paper
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    entry = json.loads((out / "tiny" / "manifest.json").read_text())["files"]["a.json"]
    if where == "link":  # a file name inside the folder that leads out of it
        (out / "tiny" / "escape").symlink_to(tmp_path)
        name = "escape/victim.txt"
    else:
        name = "../../victim.txt" if where == "relative" else str(victim)
    _tamper(out, lambda m: m["files"].update({name: entry}))
    code, _, err = _cli("reproduce", "--experiments", experiments, "--out", out)
    assert code == 2 and victim.read_text() == "precious"
    assert "is not a manifest that diffsim reproduce wrote" in err and name[:20] in err
    assert "remove that manifest (or the folder)" in err
    assert (out / "tiny" / "a.json").exists()  # the folder is refused, not cleared


def test_a_manifest_listing_a_folder_is_refused(paper):
    experiments, out = paper
    (out / "tiny" / "data").mkdir()
    entry = json.loads((out / "tiny" / "manifest.json").read_text())["files"]["a.json"]
    _tamper(out, lambda m: m["files"].update({"data": entry}))
    with pytest.raises(ds.ReproduceError, match="it lists 'data', which is not a regular file"):
        ds.reproduce(experiments=experiments, out=out, progress=False)
    assert (out / "tiny" / "data").is_dir()


def test_a_reference_with_a_non_boolean_quick_is_no_reference(paper, tmp_path):
    experiments, out = paper
    _tamper(out, lambda m: m.update(quick="no"))  # once read as True
    (outcome,) = ds.reproduce(
        experiments=experiments, check=out, out=tmp_path / "o", progress=False
    )
    assert outcome.status == "no reference" and "its 'quick' is 'no', not true or false" in (
        outcome.error
    )


def test_output_folders_that_cannot_be_used(paper, tmp_path):
    experiments, _ = paper
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "tiny").write_text("a file where the experiment's folder goes")
    with pytest.raises(ds.ReproduceError, match="is a file, not a folder: choose another --out"):
        ds.reproduce(experiments=experiments, out=blocked, progress=False)
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = _cli("reproduce", "--experiments", empty)
    assert code == 2 and "holds no modules" in err
    code, _, err = _cli("reproduce", "--experiments", experiments / "tiny.py")
    assert code == 2 and "is a file: pass its folder" in err and "'tiny'" in err
    code, _, err = _cli("bench", "--benchmarks", empty, "--out", tmp_path / "bench")
    assert code == 2 and "holds no modules" in err


@pytest.mark.parametrize(
    "body, message",
    [
        (
            '(Path(out_dir) / "a.csv").write_text("x")\n'
            '    return {"files": ["./a.csv", "a.csv"], "config": {}}',
            None,
        ),  # one file, two names
        ('return {"files": "a.csv", "config": {}}', "'files' must be a list of the names"),
        (
            '(Path(out_dir) / "a.csv").write_text("x")\n'
            '    return {"files": {"a.csv": 1}, "config": {}}',
            "'files' must be a list",
        ),
        (
            '(Path(out_dir) / "d").mkdir()\n    return {"files": ["d"], "config": {}}',
            "listed 'd', which is a folder",
        ),
        ("import sys\n    sys.exit(0)", r"run\(\) called sys.exit\(0\) instead of returning"),
        ('return {"files": [], "config": {"solver": object()}}', "'config' must hold JSON values"),
    ],
    ids=["dot-name", "files-a-string", "files-a-dict", "a-folder", "sys-exit", "config-object"],
)
def test_experiments_that_break_the_contract_are_told_how(tmp_path, body, message):
    path = tmp_path / "broken.py"
    path.write_text(f"from pathlib import Path\n\n\ndef run(out_dir, quick=False):\n    {body}\n")
    if message is None:
        assert list(ds.run_experiment(path, tmp_path / "out")["files"]) == ["a.csv"]
        return
    with pytest.raises(ds.ExperimentError, match=message):
        ds.run_experiment(path, tmp_path / "out")


def test_an_experiment_without_quick_is_told_its_signature(tmp_path):
    path = tmp_path / "old.py"
    path.write_text("def run(out_dir):\n    return {'files': [], 'config': {}}\n")
    with pytest.raises(ds.ExperimentError, match=r"run must accept quick: def run\(out_dir, "):
        ds.run_experiment(path, tmp_path / "out")


# --- sweep stores ------------------------------------------------------------------------------

AXES = {"length": np.linspace(0.5, 2.0, 8)}
SWEEP = dict(solver=ds.RK4(), dt=0.1, reduce="max_abs", chunk_size=2, progress=False)
SWEEP_TS = np.linspace(0.0, 1.0, 6)


def _small_sweep(store):
    return ds.sweep(
        models.DampedPendulum(), AXES, jnp.array([1.0, 0.0]), SWEEP_TS, **SWEEP, store=store
    )


def _variables_and_attrs(store):
    """The variables and attributes a sweep would create its store with (a dry creation)."""
    made = []
    original = _store.create
    _store.create = lambda path, variables, attrs: made.append((variables, attrs))
    try:
        with contextlib.suppress(Exception):
            _small_sweep(store)
    finally:
        _store.create = original
    return made[0]


def test_a_store_created_by_another_run_at_the_same_moment(tmp_path):
    store = str(tmp_path / "race.zarr")
    variables, attrs = _variables_and_attrs(store)
    _small_sweep(store)  # the winner: the store now exists
    with pytest.raises(
        ds.SweepStoreError, match="another run created the sweep store .* at the same moment"
    ):
        _store.create(store, variables, attrs)  # the loser's rename finds it taken
    assert [p for p in os.listdir(tmp_path) if ".creating-" in p] == []  # no folder left


def test_only_temporary_folders_of_dead_creators_are_removed(tmp_path):
    store = str(tmp_path / "s.zarr")
    host = socket.gethostname()
    finished = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead = Path(f"{store}.creating-{host}-{finished.stdout.strip()}")
    alive = Path(f"{store}.creating-{host}-{os.getppid()}")  # pytest's parent: alive
    other = Path(f"{store}.creating-elsewhere-{finished.stdout.strip()}")  # another host's
    for folder in (dead, alive, other):
        folder.mkdir()
    _small_sweep(store)
    assert not dead.exists() and alive.exists() and other.exists()


def _fail_at_second_chunk(monkeypatch, damage):
    """Make the second chunk's write meet `damage()` first (the store changed mid-run)."""
    write, count = _store.write_chunk, [0]

    def damaged_write(path, *args):
        count[0] += 1
        if count[0] == 2:
            damage(path)
        return write(path, *args)

    monkeypatch.setattr(_store, "write_chunk", damaged_write)


@pytest.mark.parametrize("what", ["store", "variable", "progress"])
def test_a_store_removed_while_the_sweep_runs(tmp_path, monkeypatch, what):
    store = str(tmp_path / "gone.zarr")
    target = {"store": "", "variable": "max_abs", "progress": "progress"}[what]
    _fail_at_second_chunk(monkeypatch, lambda path: shutil.rmtree(os.path.join(path, target)))
    with pytest.raises(
        ds.SweepStoreError,
        match=r"failed while writing chunk 1 .*removed or "
        "replaced while in use",
    ):
        _small_sweep(store)


def test_resuming_a_damaged_store_is_refused_before_any_work(tmp_path):
    store = str(tmp_path / "damaged.zarr")
    _small_sweep(store)
    shutil.rmtree(os.path.join(store, "num_steps"))
    with pytest.raises(ds.SweepStoreError, match=r"damaged: .*num_steps.* Delete the store"):
        _small_sweep(store)
    store = str(tmp_path / "config.zarr")
    _small_sweep(store)
    metadata = Path(store) / "zarr.json"
    record = json.loads(metadata.read_text())
    record["attributes"]["sweep_config"] = "{not json"
    record["attributes"]["sweep_config_sha256"] = "0" * 64
    metadata.write_text(json.dumps(record))
    with pytest.raises(ds.SweepStoreError, match="sweep_config attribute is not valid JSON"):
        _small_sweep(store)


def test_foreign_files_among_the_markers_do_not_break_a_resume(tmp_path):
    store = str(tmp_path / "markers.zarr")
    full = _small_sweep(store)
    (Path(store) / "progress" / "notes.done").write_text("mine")
    (Path(store) / "progress" / "1.done").unlink()
    resumed = _small_sweep(store)
    np.testing.assert_array_equal(resumed["max_abs"].values, full["max_abs"].values)


def test_store_paths_as_users_write_them(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    result = _small_sweep("~/sweep.zarr")
    assert (tmp_path / "home" / "sweep.zarr").is_dir() and not (tmp_path / "~").exists()
    again = _small_sweep(str(tmp_path / "home" / "sweep.zarr") + "/")  # a trailing slash
    np.testing.assert_array_equal(again["max_abs"].values, result["max_abs"].values)
    assert ds.open_sweep("~/sweep.zarr")["max_abs"].shape == result["max_abs"].shape


@contextlib.contextmanager
def _small_disk(folder: Path, size: str):
    """A tmpfs of `size` mounted at `folder` (skip the test where mounting is not allowed)."""
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN)")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def test_a_full_disk_is_reported_and_the_sweep_resumes_after(tmp_path):
    lengths = {"length": np.linspace(0.5, 2.0, 256)}
    options = dict(solver=ds.RK4(), dt=0.005, reduce="trajectory", chunk_size=16, progress=False)
    ts = np.linspace(0.0, 1.0, 201)
    full = ds.sweep(models.DampedPendulum(), lengths, jnp.array([1.0, 0.0]), ts, **options)
    with _small_disk(tmp_path / "disk", "320k") as disk:
        store = str(disk / "full.zarr")
        with pytest.raises(
            ds.SweepStoreError,
            match=r"No space left on device.*free space .*"
            "resumes from the chunks",
        ):
            ds.sweep(
                models.DampedPendulum(), lengths, jnp.array([1.0, 0.0]), ts, **options, store=store
            )
        subprocess.run(["mount", "-o", "remount,size=8m", str(disk)], check=True)
        resumed = ds.sweep(
            models.DampedPendulum(), lengths, jnp.array([1.0, 0.0]), ts, **options, store=store
        )
        np.testing.assert_array_equal(resumed["y"].values, full["y"].values)


@contextlib.contextmanager
def _read_only_folder(tmp_path: Path):
    """A folder nobody can write into: a read-only tmpfs as root, else a folder without write
    permission (skip when the user can write there anyway)."""
    folder = tmp_path / "read-only"
    if os.geteuid() == 0:
        with _small_disk(folder, "1m"):
            subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
            yield folder
        return
    folder.mkdir()
    folder.chmod(0o555)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("this user can write into a folder without write permission")
        yield folder
    finally:
        folder.chmod(0o755)


def test_read_only_folders_are_refused_before_any_work(tmp_path, paper):
    with _read_only_folder(tmp_path) as folder:
        with pytest.raises(ds.SweepStoreError, match="Read-only file system|Permission denied"):
            _small_sweep(str(folder / "s.zarr"))
        experiments, _ = paper
        with pytest.raises(ds.ReproduceError, match="cannot write the outputs into"):
            ds.reproduce(experiments=experiments, out=folder / "out", progress=False)
        config = _fit_config(tmp_path, out=json.dumps(str(folder / "fit")))
        started = time.perf_counter()
        code, _, err = _cli("fit", config)
        assert code == 2 and "cannot write into out" in err
        assert time.perf_counter() - started < 20  # refused before the fit, not after it


# --- configs on the command line ------------------------------------------------------------------


def _sweep_config(tmp_path, text=None, **keys) -> Path:
    base = {
        "model": '"DampedPendulum"',
        "y0": "[1.0, 0.0]",
        "ts": "{ start = 0.0, stop = 1.0, num = 6 }",
        "solver": '"RK4"',
        "dt": "0.1",
        "reduce": '"max_abs"',
        "store": json.dumps(str(tmp_path / "s.zarr")),
    }
    base.update(keys)
    lines = [f"{k} = {v}" for k, v in base.items() if v is not None]
    path = tmp_path / "sweep.toml"
    if text is None:
        text = "" if "axes" in keys else "[axes]\nlength = [1.0, 2.0]\n"
    path.write_text("\n".join(lines) + "\n" + text)
    return path


SWEEP_CONFIGS = [
    ("axes a list", dict(axes="[1, 2]"), None, "axes must be a table"),
    (
        "num negative",
        {},
        "[axes]\nlength = { start = 1.0, stop = 2.0, num = -3 }\n",
        "length: num must be an integer >= 1, got -3",
    ),
    (
        "log from zero",
        {},
        "[axes]\nlength = { start = 0.0, stop = 2.0, num = 3, log = true }\n",
        "length: a log range needs start and stop > 0",
    ),
    (
        "axis of text",
        {},
        '[axes]\nlength = ["a", "b"]\n',
        "length: expected a non-empty list of numbers",
    ),
    (
        "ts start as text",
        dict(ts='{ start = "zero", stop = 1.0, num = 5 }'),
        None,
        "ts: start must be a finite number, got 'zero'",
    ),
    (
        "ts num a float",
        dict(ts="{ start = 0.0, stop = 1.0, num = 5.7 }"),
        None,
        "ts: num must be an integer >= 1, got 5.7",
    ),
    ("dt as text", dict(dt='"0.05"'), None, "dt must be a number, got '0.05'"),
    (
        "max_steps with a fixed step",
        dict(max_steps="3"),
        None,
        "max_steps bounds the steps of an adaptive solver; RK4 takes a fixed step",
    ),
    (
        "max_steps beyond int32",
        dict(solver='"Tsit5"', dt=None, max_steps=str(2**31)),
        None,
        r"max_steps must be at most 2\*\*31 - 1",
    ),
    (
        "halton skip negative",
        {},
        '[samples]\nmethod = "halton"\nn = 4\nskip = -3\nbounds = { length = [0.5, 2.0] }\n',
        "skip must be >= 0",
    ),
    (
        "halton with a seed",
        {},
        '[samples]\nmethod = "halton"\nn = 4\nseed = 3\nbounds = { length = [0.5, 2.0] }\n',
        "seed applies to latin_hypercube",
    ),
    (
        "samples log as text",
        {},
        '[samples]\nn = 4\nlog = "length"\nbounds = { length = [0.5, 2.0] }\n',
        r"\[samples\]: log must be a list of strings",
    ),
    ("samples without bounds", {}, "[samples]\nn = 4\n", r"\[samples\] needs bounds"),
    (
        "samples seed as text",
        {},
        '[samples]\nn = 4\nseed = "x"\nbounds = { length = [0.5, 2.0] }\n',
        r"\[samples\]: seed must be an integer",
    ),
    (
        "solver option as text",
        dict(solver='{ name = "Tsit5", rtol = "tight" }', dt=None),
        None,
        r"solver Tsit5: Tsit5\(rtol=...\): expected a real number",
    ),
    (
        "unknown solver option",
        dict(solver='{ name = "Tsit5", tol = 1e-6 }', dt=None),
        None,
        r"solver Tsit5 has no option\(s\) \['tol'\]; its options: "
        r"\['rtol', 'atol', 'dtmin', 'dtmax', 'step_to_outputs', 'constant_step'\]",
    ),
    (
        "unknown parameter",
        dict(parameters="{ lenght = 1.0 }"),
        None,
        r"DampedPendulum has no parameter\(s\) \['lenght'\]; its parameters: \['length'",
    ),
    (
        "parameter as text",
        dict(parameters='{ gravity = "9.81" }'),
        None,
        r"DampedPendulum\(gravity=...\): expected a real number",
    ),
    (
        "a key under [axes]",
        dict(dt=None),
        "[axes]\nlength = [1.0, 2.0]\ndt = 0.1\n",
        r"\[axes\] holds 'dt', a top-level key: .*move dt = ... above \[axes\]",
    ),
    ("store empty", dict(store='""'), None, "store: store is an empty path"),
    ("store a number", dict(store="5"), None, "store must be a string, got 5"),
]


@pytest.mark.parametrize("keys, text, message", named_cases(SWEEP_CONFIGS))
def test_bad_sweep_configs(tmp_path, keys, text, message):
    _refused("sweep", _sweep_config(tmp_path, text, **keys), message)


def _refused(command, config, message) -> None:
    """`diffsim <command> CONFIG` exits with 2 and diffsim's message, matching `message`."""
    code, _, err = _cli(command, config, *(["--quiet"] if command == "sweep" else []))
    assert code == 2 and err.startswith(f"diffsim {command}: "), err
    assert re.search(message, err), err


def test_sweep_command_line_store_options(tmp_path):
    config = _sweep_config(tmp_path)
    code, _, err = _cli("sweep", config, "--store", "", "--quiet")
    assert code == 2 and "--store: store is an empty path" in err
    bom = tmp_path / "bom.toml"
    bom.write_bytes(b"\xef\xbb\xbf" + config.read_bytes())  # saved by an editor with a BOM
    code, out, _ = _cli("sweep", bom, "--quiet")
    assert code == 0 and "successful: 2" in out


def _fit_config(tmp_path, data: str | None = None, **keys) -> Path:
    base = {
        "model": '"LotkaVolterra"',
        "y0": "[30.0, 4.0]",
        "data": json.dumps(data or LYNX_HARE.as_posix()),
        "time": '"year"',
        "fit": '["alpha"]',
        "solver": '"RK4"',
        "dt": "0.05",
        "loss": '"log"',
        "out": json.dumps(str(tmp_path / "fit")),
    }
    base.update(keys)
    path = tmp_path / "fit.toml"
    path.write_text("".join(f"{k} = {v}\n" for k, v in base.items() if v is not None))
    return path


def _csv(tmp_path, text) -> str:
    path = tmp_path / "data.csv"
    path.write_text(text)
    return path.as_posix()


FIT_CONFIGS = [
    ("bounds a list", dict(bounds="[0.0, 1.0]"), None, "bounds must be a table, got"),
    (
        "bounds of one value",
        dict(bounds="{ alpha = [0.0] }"),
        None,
        r"bounds.alpha must be \[lower, upper\]",
    ),
    ("columns as text", dict(columns='"hare"'), None, "columns must be a list of strings"),
    (
        "time among columns",
        dict(columns='["year", "hare"]'),
        None,
        "the time column 'year' is also listed among columns",
    ),
    (
        "observe beyond the state",
        dict(observe="[0, 5]"),
        None,
        r"observe lists \[5\], outside the state's 2 components",
    ),
    ("observe as text", dict(observe='"hare"'), None, "observe must be a list of numbers"),
    ("segments as text", dict(segments='"2"'), None, "segments must be an integer"),
    ("data a folder", {}, "FOLDER", "is a folder .*name the CSV file of the observations"),
    (
        "a formula cell",
        {},
        "year,hare,lynx\n1900,30,4\n1901,=1+2,6\n",
        r"line 3, column 'hare': '=1\+2' is not a number",
    ),
    (
        "a comment mark in a cell",
        {},
        "year,hare,lynx\n1900,30,4\n1901,1#2,6\n",
        r"line 3, column 'hare': '1#2' is not a number",
    ),
    (
        "a ragged row",
        {},
        "year,hare,lynx\n1900,30,4\n1901,47\n",
        "line 3: 2 cells, but the header names 3 columns",
    ),
    (
        "an empty column",
        {},
        "year,hare,lynx\n1900,30,\n1901,47,\n",
        r"column\(s\) \['lynx'\] hold no values",
    ),
    (
        "dates as times",
        {},
        "year,hare,lynx\n1900-06-01,30,4\n1901-06-01,47,6\n",
        r"line 2, column 'year': '1900-06-01'.*convert dates to numbers",
    ),
    ("out an existing file", dict(out="FILE"), None, "is a file, not a folder: choose another out"),
]


@pytest.mark.parametrize("keys, csv, message", named_cases(FIT_CONFIGS))
def test_bad_fit_configs(tmp_path, keys, csv, message):
    if csv == "FOLDER":
        (tmp_path / "folder").mkdir()
        data = (tmp_path / "folder").as_posix()
    else:
        data = None if csv is None else _csv(tmp_path, csv)
    if keys.get("out") == "FILE":
        (tmp_path / "taken").write_text("not a folder")
        keys = dict(keys, out=json.dumps(str(tmp_path / "taken")))
    _refused("fit", _fit_config(tmp_path, data, **keys), message)


def test_fit_config_observe_lists_components(tmp_path):
    import jax

    from diffsim._apps.fit_config import fit_arguments, load

    # the documented observe = [0, 1] once failed inside JAX ("non-tuple sequence")
    config = load(str(_fit_config(tmp_path, observe="[1, 0]", na_values='["n/a"]')))
    observe = fit_arguments(config)["observe"]
    assert np.asarray(observe(jnp.array([3.0, 4.0]))).tolist() == [4.0, 3.0]
    assert jax.eval_shape(observe, jnp.zeros(2)).shape == (2,)


def test_na_values_are_missing_with_a_warning(tmp_path):
    path = _csv(tmp_path, "t,x\n0,1\n1,n/a\n2,unknown\n3,4\n")
    with pytest.warns(ds.FitWarning, match=r"2 cell\(s\) read as missing .*line 3, column 'x'"):
        data = ds.Data.from_csv(path, na_values=("n/a", "unknown"))
    assert np.isnan(data.values[1:3, 0]).all() and data.values[3, 0] == 4.0
    with pytest.raises(
        ValueError,
        match=r"line 3, column 'x': 'n/a', line 4, column 'x': "
        r"'unknown' are not a number",
    ):
        ds.Data.from_csv(path)


@pytest.mark.parametrize(
    "text, expected",
    [
        ('t,x\n0,"65.8106"\n1, 4 \n', [65.8106, 4.0]),  # quoted and padded numbers
        ("\ufefft,x\r\n0,1\r\n1,2\r\n\r\n", [1.0, 2.0]),  # BOM, CRLF, trailing blank line
        ("# units: years, pelts\nt,x\n0,1\n1,2\n", [1.0, 2.0]),  # a comment line
        ("t,x,\n0,1,\n1,2,\n", [1.0, 2.0]),  # a trailing comma
        ("t,x\n0,nan\n1,2\n", [np.nan, 2.0]),  # nan: missing, as numpy writes it
    ],
    ids=["quoted", "bom-crlf", "comment", "trailing-comma", "nan"],
)
def test_csv_files_as_spreadsheets_write_them(tmp_path, text, expected):
    data = ds.Data.from_csv(_csv(tmp_path, text))
    assert data.names == ("x",)
    np.testing.assert_array_equal(data.values[:, 0], expected)


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "holds no header row and no data"),
        ("t,x\n", "has a header but no data rows"),
        ("0,1\n1,2\n", "holds numbers, not column names: add a header row"),
        ("t;x\n0;1\n", "looks separated by semicolons"),
        ("t,x,x\n0,1,2\n", r"duplicate column names \['x'\]"),
        ("t,,x\n0,1,2\n", r"column\(s\) \[2\] hold values but have no name"),
        ("t,x\n0,1\n,2\n", "the time column 't' has no time in row 2"),
    ],
    ids=["empty", "header-only", "headerless", "semicolons", "duplicate", "unnamed", "no-time"],
)
def test_csv_files_that_would_shift_or_drop_values(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        ds.Data.from_csv(_csv(tmp_path, text))


def test_a_csv_that_is_not_utf8(tmp_path):
    path = tmp_path / "latin1.csv"
    path.write_bytes("région,x\n0,1\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"not UTF-8 text \(byte 0xe9 .*save the file as UTF-8"):
        ds.Data.from_csv(path)


def test_the_command_line_shows_no_traceback(tmp_path):
    config = _fit_config(tmp_path, _csv(tmp_path, "year,hare,lynx\n1900,30,4\n1901,@SUM(A1),6\n"))
    run = subprocess.run(
        [sys.executable, "-m", "diffsim", "fit", str(config)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "line 3, column 'hare': '@SUM(A1)' is not a number" in run.stderr


# --- posterior files: nothing in them trusted without a check -----------------------------------


def _posterior(chains=2, draws=10):
    """A posterior as ds.sample builds it (without sampling: the file is what is tested)."""
    rng = np.random.default_rng(0)
    shape = (chains, draws)
    samples = {"k": rng.normal(size=shape), "sigma": rng.uniform(0.1, 0.2, shape)}
    return synthetic_posterior(samples, predictions=True, thin=2)


def _set_attribute(name, value):
    return lambda f: f.attrs.__setitem__(name, value)


def _set_values(group, name, value):
    def edit(f):
        f[group][name][...] = value

    return edit


TAMPERED = [
    ("truncated", None, r"cannot be read as a netCDF posterior file \(OSError"),
    ("not netCDF", None, r"cannot be read as a netCDF posterior file"),
    ("garbage JSON", _set_attribute("step_size", "[[1"), "its step_size attribute is not valid"),
    ("no step size", lambda f: f.attrs.__delitem__("step_size"), "step_size attribute is missing"),
    ("chains edited", _set_attribute("setting_chains", 3), r"draws of 'k' have shape \(2, 10\)"),
    ("draws edited", _set_attribute("setting_draws", 4), r"not \(2, 4\)"),
    ("chains as text", _set_attribute("setting_chains", "two"), "setting_chains .* not an integer"),
    ("unknown setting", _set_attribute("setting_foo", 1), r"unknown \['foo'\]"),
    ("priors a list", _set_attribute("setting_priors", "[1, 2]"), "setting_priors is not a table"),
    ("likelihood", _set_attribute("likelihood", "banana"), "its likelihood 'banana' is none of"),
    ("t0 as text", _set_attribute("t0", "yesterday"), "its t0 attribute is missing or not a num"),
    ("t0 after the data", _set_attribute("t0", 5.0), "t0 = 5 is after its first data time 0"),
    ("foreign", _set_attribute("created_by", "someone"), "not written by ds.Posterior.save"),
    ("NaN draws", _set_values("posterior", "k", np.nan), "draws of 'k' hold NaN or inf"),
    ("negative sigma", _set_values("posterior", "sigma", -1.0), "'sigma' are not all positive"),
    ("inf predictions", _set_values("posterior_predictive", "mu", np.inf), "'mu' hold values"),
    ("negative n_steps", _set_values("sample_stats", "n_steps", -5), "'n_steps' are not counts"),
    ("acceptance > 1", _set_values("sample_stats", "acceptance_rate", 3.0), "not probabilities"),
    ("no observed data", lambda f: f.__delitem__("observed_data"), "has no observed_data group"),
    ("no diverging", lambda f: f["sample_stats"].__delitem__("diverging"), "no 'diverging'"),
]


@pytest.mark.parametrize("edit, message", named_cases(TAMPERED))
def test_tampered_or_damaged_posterior_files_are_refused(tmp_path, request, edit, message):
    import h5py

    path = _posterior().save(tmp_path / "posterior.nc")
    case = request.node.callspec.id
    if case == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif case == "not netCDF":
        path.write_text("time,value\n0,1\n")
    else:
        with h5py.File(path, "r+") as file:
            edit(file)
    with pytest.raises(ds.PosteriorFileError, match=message) as error:
        ds.Posterior.load(path)
    assert str(path) in str(error.value)


def test_posterior_files_at_paths_users_write(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    posterior = _posterior()
    path = posterior.save("~/runs/posterior.nc")  # used to leave a folder named "~" here too
    assert path == tmp_path / "home" / "runs" / "posterior.nc" and path.is_file()
    assert not (tmp_path / "~").exists()
    loaded = ds.Posterior.load("~/runs/posterior.nc")
    np.testing.assert_array_equal(loaded.samples["k"], posterior.samples["k"])
    assert loaded.settings == posterior.settings
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ds.Posterior.load(tmp_path / "missing.nc")
    with pytest.raises(ds.PosteriorFileError, match="is a folder"):
        ds.Posterior.load(tmp_path)
    with pytest.raises(IsADirectoryError, match="is a folder; give a file name"):
        posterior.save(tmp_path)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(OSError, match="could not write .*afile/x.nc .* parents must be folders"):
        posterior.save(tmp_path / "afile" / "x.nc")


def test_every_path_argument_expands_the_home_folder(tmp_path, monkeypatch):
    """A "~/..." path means the home folder: plot.save, run_experiment and the demo wrote a
    folder named "~" in the working directory instead."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    figure = plt.figure()
    ds.plot.save(figure, "~/figures", "f", formats=("png",))
    plt.close(figure)
    assert (tmp_path / "home" / "figures" / "f.png").is_file()
    experiment = tmp_path / "tiny.py"
    experiment.write_text(textwrap.dedent(TINY))
    ds.run_experiment(experiment, "~/experiment")
    assert (tmp_path / "home" / "experiment" / "a.json").is_file()
    (tmp_path / "home" / "data.csv").write_text("t,x\n0,1\n1,2\n")
    assert ds.Data.from_csv("~/data.csv").values.shape == (2, 1)
    assert not (tmp_path / "~").exists()


def test_the_demo_and_sweep_commands_refuse_a_file_as_their_folder(tmp_path):
    (tmp_path / "afile").write_text("x")
    code, _, err = _cli("demo", "--out", tmp_path / "afile", "--quick")
    assert code == 2 and "cannot write to --out" in err
    code, _, err = _cli("sweep", _sweep_config(tmp_path), "--store", tmp_path / "afile")
    assert code == 2 and "is a file, not a sweep store" in err and "--resume" not in err


# --- interrupted runs -------------------------------------------------------------------------


def _worker(store, *extra):
    return subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "sweep_worker.py"), store, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(5))
def test_kill_at_a_random_point_then_resume(tmp_path, seed):
    """SIGKILL once a random number of chunks (1 to 50 of 60) are marked; the resumed store
    equals an uninterrupted run's."""
    import xarray as xr

    reference = str(tmp_path / "reference.zarr")
    assert _worker(reference, "--size", "large").wait(timeout=600) == 0
    kill_after = int(np.random.default_rng(seed).integers(1, 51))
    store = str(tmp_path / "killed.zarr")
    markers = os.path.join(store, "progress")
    worker = _worker(store, "--size", "large")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if os.path.isdir(markers) and len(os.listdir(markers)) >= kill_after:
            break
        time.sleep(0.01)
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    assert _worker(store, "--size", "large").wait(timeout=600) == 0
    with (
        xr.open_zarr(reference, consolidated=False) as a,
        xr.open_zarr(store, consolidated=False) as b,
    ):
        for name in ("max_abs", "result", "num_steps"):
            np.testing.assert_array_equal(a[name].values, b[name].values)


@pytest.mark.slow
def test_two_sweeps_create_one_store_at_once(tmp_path):
    """Two processes start the same sweep on a new store together: one creates it, the other
    stops with diffsim's message (or, when it came second, resumes it); the store is complete
    either way and no temporary folder is left."""
    store = str(tmp_path / "together.zarr")
    workers = [_worker(store, "--size", "large") for _ in range(2)]
    outputs = [w.communicate(timeout=600)[0] for w in workers]
    codes = [w.returncode for w in workers]
    assert 0 in codes, outputs
    for code, output in zip(codes, outputs):
        if code != 0:
            assert "another run created the sweep store" in output, output
    assert [p for p in os.listdir(tmp_path) if ".creating-" in p] == []
    assert len(os.listdir(os.path.join(store, "progress"))) >= 60
