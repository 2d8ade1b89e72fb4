"""`diffsim bench`: the runner (on a folder of small stand-in benchmarks), and the benchmark
scripts' GPU path on the CPU without the optional packages. Smoke only: no speed assertions;
CI runs the real suite as `diffsim bench --quick`."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from diffsim._apps.bench import bench, PLOT, RAW, REPORT

ROOT = Path(__file__).parent.parent
BENCH = ROOT / "experiments" / "bench"

_GOOD = '''"""A stand-in benchmark: two methods at two sizes."""
import os, sys
sys.path.insert(0, os.path.dirname(__file__))
from _timing import record, table, targets_table


def main(argv=None):
    print("# Stand-in")
    for n in (4, 16):
        record("toy", "ours", members=n, run_s=1e-3 * n, compile_s=0.1)
        record("toy", "theirs", members=n, run_s=3e-3 * n, compile_s=0.5)
    print(table([["ours", "1.0"], ["theirs", "3.0"]], ["method", "ratio"]))
    print(targets_table([("ours >= 2x faster", 3.0, True), ("compile <= 0.1x", 0.2, False)]))
'''

_BROKEN = '''"""A benchmark that fails."""
def main(argv=None):
    print("# Broken")
    raise RuntimeError("the peer is missing")
'''


@pytest.fixture
def stand_ins(tmp_path):
    folder = tmp_path / "bench"
    folder.mkdir()
    shutil.copy(BENCH / "_timing.py", folder / "_timing.py")  # their helpers, as the real ones
    (folder / "good.py").write_text(_GOOD)
    (folder / "broken.py").write_text(_BROKEN)
    return folder


def test_bench_writes_tables_raw_timings_and_plot(stand_ins, tmp_path):
    out = tmp_path / "out"
    outcomes = bench(benchmarks=stand_ins, out=out, quick=True, progress=False)
    by_name = {o.name: o for o in outcomes}
    assert [o.name for o in outcomes] == ["broken", "good"]
    assert by_name["good"].status == "ok" and by_name["broken"].status == "failed"
    assert "the peer is missing" in by_name["broken"].error
    assert len(by_name["good"].records) == 4
    assert [t["met"] for t in by_name["good"].targets] == [True, False]

    report = (out / REPORT).read_text()
    assert re.search(r"\| good +\| ours >= 2x faster +\| 3\.00 +\| met +\|", report)
    assert "compile <= 0.1x" in report and "NOT MET" in report
    assert "(benchmark failed)" in report
    assert "### Stand-in" in report  # the benchmark's heading, one level down
    assert "the peer is missing" in report
    assert "cores" in report and "jax " in report  # machine and versions
    raw = json.loads((out / RAW).read_text())
    assert raw["quick"] is True and raw["versions"]["jax"] != "not installed"
    toy = [r for r in raw["benchmarks"]["good"]["records"] if r["method"] == "ours"]
    assert [r["members"] for r in toy] == [4, 16] and toy[1]["run_s"] == pytest.approx(0.016)
    assert (out / PLOT).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "broken.log").exists()


def test_bench_command_line(stand_ins, tmp_path, capsys):
    from diffsim.cli import main

    out = tmp_path / "out"
    assert main(["bench", "good", "--benchmarks", str(stand_ins), "--out", str(out)]) == 0
    assert "| good " in capsys.readouterr().out
    assert main(["bench", "--benchmarks", str(stand_ins), "--out", str(out)]) == 1  # broken
    assert main(["bench", "nonesuch", "--benchmarks", str(stand_ins), "--out", str(out)]) == 2
    assert "unknown benchmarks ['nonesuch']" in capsys.readouterr().err
    assert main(["bench", "--benchmarks", str(tmp_path / "none"), "--out", str(out)]) == 2
    assert "no benchmarks folder" in capsys.readouterr().err


def test_gpu_script_path_runs_without_optional_packages():
    # gpu.sh runs lorenz.py from a checkout on a machine without zarr, xarray, tqdm, scipy or
    # torch: the core and the benchmark must import and run without them (here on the CPU, at
    # a toy size)
    # (scipy stays: jax itself needs it)
    blocked = ["zarr", "xarray", "tqdm", "torch", "torchdiffeq", "h5netcdf", "h5py"]
    code = (
        "import sys\n"
        "class Missing:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {blocked!r}:\n"
        "            raise ImportError(f'no {name} here')\n"
        "sys.meta_path.insert(0, Missing())\n"
        f"sys.path.insert(0, {str(BENCH)!r})\n"
        "import lorenz\n"
        "lorenz.main(['--sizes', '4', '--peers', 'diffsim,diffrax', '--repeats', '1', "
        "'--no-work-precision'])\n"
        f"assert not set({blocked!r}) & set(sys.modules), 'an optional package was imported'\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "fixed step: >= 2x faster than diffrax" in out.stdout
    assert "Adaptive Tsit5" in out.stdout


@pytest.mark.slow  # CI runs this command itself (README); ~2 minutes
def test_bench_quick_suite(tmp_path):
    out = tmp_path / "out"
    command = [sys.executable, "-m", "diffsim", "bench", "--quick", "--out", str(out)]
    run = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    raw = json.loads((out / RAW).read_text())
    expected = {p.stem for p in BENCH.glob("[a-z]*.py")}
    assert set(raw["benchmarks"]) == expected
    assert all(
        b["status"] == "ok" and b["targets"]
        for b in raw["benchmarks"].values()
        if b["name"] != "early_exit"
    )
