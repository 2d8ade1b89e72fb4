"""One experiment: a Python module with `run(out_dir, quick)`, run once, with its manifest.

The contract of an experiment module (the files in `experiments/` follow it, and so can a
user's own paper folder):

- its docstring's first line is its title;
- `run(out_dir, quick: bool = False) -> dict` writes its figures (PNG and PDF, via
  `ds.plot.save`), the data behind each figure (netCDF or CSV) and any summary into `out_dir`,
  and returns a dict with `files` (the names it wrote, relative to `out_dir`) and `config`
  (the settings that decide its numbers, including `seed` where it draws random numbers);
- `quick=True` is a reduced run (seconds) through the same code paths, for tests and CI;
- its numbers depend only on its config: fixed seeds, no clocks in its files (timings belong
  in what it prints, which lands in the log, not in its outputs).

`run_experiment` runs one such module in this process under diffsim's plot style and writes
`manifest.json` beside the outputs: name, title, config, seed, dtype (the config's `dtype`, else
JAX's default float), package versions, git commit, machine and devices, wall time and the
SHA-256 of every output file. `python -m diffsim._apps.experiment_worker PATH OUT [--quick]` does
the same from the shell; `diffsim reproduce` runs each experiment that way, in a fresh process.
"""

import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from .. import _provenance
from .._validate import user_path

MANIFEST = "manifest.json"
LOG = "log.txt"
FIGURE_SUFFIXES = (".png", ".pdf", ".svg")


class ExperimentError(RuntimeError):
    """An experiment module broke its contract (no `run`, a bad return value, missing files)."""


def load(path: str | Path):
    """Import an experiment module from its file (experiment folders are not packages)."""
    path = user_path(path, "path")
    if not path.is_file():
        raise ExperimentError(f"no experiment file {str(path)!r}")
    spec = importlib.util.spec_from_file_location(f"experiment_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    # the folder first on the path, so that the module's own helpers (`_output`) import
    folder = str(path.parent.resolve())
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "run", None)):
        raise ExperimentError(f"{path.name} has no function run(out_dir, quick)")
    return module


def title(module) -> str:
    doc = (module.__doc__ or "").strip()
    return doc.splitlines()[0] if doc else ""


def kind(name: str) -> str:
    """ "figure" for images, "data" for everything else an experiment writes."""
    return "figure" if name.lower().endswith(FIGURE_SUFFIXES) else "data"


def run_experiment(path: str | Path, out_dir: str | Path, *, quick: bool = False) -> dict:
    """Run the experiment module at `path` into `out_dir` and write its `manifest.json`.

    `run` writes into a fresh folder inside `out_dir`, whose files move into `out_dir` only
    when it returns and has kept the contract, so that a file left by an earlier run can never
    pass for a new one; the old manifest is removed first, so that a folder whose last run
    failed holds none.

    **Arguments:** `path` the module's file; `out_dir` its output folder (created); `quick` the
    reduced run.

    **Returns:** the manifest (also written to `out_dir/manifest.json`).

    **Raises:** `ExperimentError` when the module breaks the contract (see the module's
    docstring); whatever `run` raises.
    """
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, the same renderer everywhere
    import jax
    import matplotlib.pyplot as plt

    from .._plot import style

    path = user_path(path, "path")
    out = user_path(out_dir, "out_dir")
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    clock = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix=".running-", dir=out))
    try:
        module = load(path)
        _check_signature(path.name, module.run)
        with style():
            try:
                record = module.run(work, quick=quick)
            except SystemExit as exit:
                raise ExperimentError(
                    f"{path.name}: run() called sys.exit({exit.code!r}) instead of returning its "
                    "record; return {'files': [...], 'config': {...}}"
                ) from None
        plt.close("all")
        files = _check_record(path.name, record, work)
        for name in files:
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(work / name, out / name)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    wall = time.perf_counter() - clock
    config = record.get("config", {})
    if not isinstance(config, dict):
        raise ExperimentError(f"{path.name}: run()'s 'config' must be a dict, got {config!r}")
    try:
        json.dumps(config, default=_plain)
    except (TypeError, ValueError) as error:
        raise ExperimentError(
            f"{path.name}: run()'s 'config' must hold JSON values (numbers, strings, lists, "
            f"dicts, arrays): {error}"
        ) from None
    manifest = {
        "experiment": path.stem,
        "title": title(module),
        "quick": bool(quick),
        "config": config,
        "seed": config.get("seed"),
        # what the experiment says it computes in, else JAX's default float after its run
        "dtype": config.get("dtype", "float64" if jax.config.jax_enable_x64 else "float32"),
        "git_commit": _provenance.git_commit(path.parent, path),
        "packages": _provenance.package_versions(),
        "machine": _provenance.machine(),
        "command": f"diffsim reproduce {path.stem}" + (" --quick" if quick else ""),
        "started": started,
        "wall_time_s": round(wall, 3),
        "files": {
            name: {
                "kind": kind(name),
                "bytes": (out / name).stat().st_size,
                "sha256": _provenance.sha256(out / name),
            }
            for name in files
        },
    }
    temporary = out / f".{MANIFEST}.{os.getpid()}"
    temporary.write_text(json.dumps(manifest, indent=1, default=_plain) + "\n", encoding="utf-8")
    temporary.replace(out / MANIFEST)  # never a half-written manifest
    return manifest


def _check_record(filename: str, record, work: Path) -> list[str]:
    """The sorted output names of a run that kept the contract: a dict with `files`, each
    written (into `work`), and nothing written that is not listed."""
    if not isinstance(record, dict) or "files" not in record:
        raise ExperimentError(
            f"{filename}: run() must return a dict with 'files' (the names it wrote) and "
            f"'config'; got {type(record).__name__}"
        )
    if not isinstance(record["files"], (list, tuple)):
        raise ExperimentError(
            f"{filename}: run()'s 'files' must be a list of the names it wrote, got "
            f"{type(record['files']).__name__} {record['files']!r}"
        )
    for name in record["files"]:
        if not isinstance(name, str) or Path(name).is_absolute() or ".." in Path(name).parts:
            raise ExperimentError(
                f"{filename}: output names must be relative paths inside the "
                f"output folder, got {name!r}"
            )
    # one spelling per file ("./a.csv" is "a.csv")
    files = list(dict.fromkeys(Path(name).as_posix() for name in record["files"]))
    for name in files:
        if (work / name).is_dir():
            raise ExperimentError(
                f"{filename}: run() listed {name!r}, which is a folder; list the files in it"
            )
        if not (work / name).is_file():
            raise ExperimentError(f"{filename}: run() listed {name!r} but did not write it")
    if MANIFEST in files or LOG in files:
        raise ExperimentError(f"{filename}: {MANIFEST} and {LOG} are the runner's files")
    written = {p.relative_to(work).as_posix() for p in work.rglob("*") if p.is_file()}
    unlisted = sorted(written - {Path(n).as_posix() for n in files})
    if unlisted:
        raise ExperimentError(
            f"{filename}: run() wrote {unlisted} but did not list them in "
            "'files' (every output is hashed into the manifest)"
        )
    return sorted(files)


def _check_signature(filename: str, run) -> None:
    import inspect

    try:
        parameters = inspect.signature(run).parameters
    except (TypeError, ValueError):
        return
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    if "quick" not in parameters and not takes_any:
        raise ExperimentError(
            f"{filename}: run must accept quick: def run(out_dir, quick=False) (the runner "
            "passes quick=True for the reduced runs of tests and CI)"
        )


def _plain(value):
    """JSON for numpy and JAX scalars and arrays in a config."""
    import numpy as np

    array = np.asarray(value)
    if array.dtype.kind not in "biufUS":
        raise TypeError(f"a {type(value).__name__} is not a JSON value")
    return array.item() if array.ndim == 0 else array.tolist()
