"""`diffsim reproduce`: run a folder of experiments, each in a fresh process, and check a rerun
against an earlier output folder file by file.

Each experiment (see `_experiment` for the contract) runs as `python -m diffsim._apps.experiment`
with its output and log in `out/<name>/`, so that one failure, crash or leak of global state
(JAX's precision, matplotlib's settings) cannot touch the others, and its wall time is its own.
"""

import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath, PureWindowsPath

from .. import _provenance
from .._validate import check_can_write, user_path
from .experiment import kind, LOG, MANIFEST


class ReproduceError(ValueError):
    """An output or reference folder that `ds.reproduce` cannot use: a manifest it did not
    write (a rerun deletes the files a manifest lists, so such a folder is refused), or a
    folder that cannot be created or written. The message names the path and what to do."""


@dataclasses.dataclass
class Outcome:
    """How one experiment went: `status` is "ok" or "failed" (and, when checking, "same",
    "changed", "missing" when the experiments folder lacks an experiment the reference ran, or
    "no reference" when the reference holds no usable run of it); `differences` lists what
    changed against the reference.

    Also: `name` (the module's name), `seconds` (the wall time of its process), `out_dir` (its
    output folder), `files` (how many files its manifest lists) and `error` (the tail of its log
    when it failed)."""

    name: str
    status: str
    seconds: float
    out_dir: Path
    files: int = 0
    error: str = ""
    differences: list[str] = dataclasses.field(default_factory=list)


def discover(folder: str | Path, what: str = "experiments") -> dict[str, Path]:
    """Module name → file: every `*.py` in `folder` not starting with `_` (the experiments of
    `diffsim reproduce`, or with `what="benchmarks"` those of `diffsim bench`)."""
    folder = user_path(folder, f"--{what}")
    if folder.is_file():
        raise ValueError(
            f"--{what} takes a folder of modules, but {str(folder)!r} is a file: pass its "
            f"folder ({str(folder.parent)!r}) and name the module ({folder.stem!r})"
        )
    if not folder.is_dir():
        raise FileNotFoundError(
            f"no {what} folder {str(folder)!r}: run from the repository root or pass --{what} DIR"
        )
    found = {p.stem: p for p in sorted(folder.glob("*.py")) if not p.name.startswith("_")}
    if not found:
        raise ValueError(
            f"the {what} folder {str(folder)!r} holds no modules (*.py files not starting with _)"
        )
    return found


def reproduce(
    names=None,
    *,
    experiments: str | Path = "experiments",
    out: str | Path | None = None,
    quick: bool | None = None,
    check: str | Path | None = None,
    jobs: int | None = None,
    progress: bool = True,
    stream=None,
) -> list[Outcome]:
    """Run experiments and, with `check`, compare every output with an earlier run.

    **Arguments:**

    - `names`: experiments to run (default: all in `experiments`, or with `check` all that the
      reference folder holds);
    - `experiments`: the folder of experiment modules;
    - `out`: where `out/<name>/` goes (default `out`; with `check`, a new temporary folder);
    - `quick`: the reduced runs (default False; with `check`, what the reference ran);
    - `check`: an earlier output folder to compare with, file by file (SHA-256; for changed
      data, the largest numeric difference);
    - `jobs`: experiments run at once, each in its own process (default: the number of CPU
      cores, at most 4: quick runs are mostly compilation, which runs on one core each);
    - `progress`: print a line as each starts and ends (to `stream`, default stderr).

    **Returns:** one `Outcome` per experiment, in the order run.
    """
    stream = sys.stderr if stream is None else stream
    available = discover(experiments)
    references, unusable = _references(check) if check is not None else ({}, {})
    if names:
        unknown = [n for n in names if n not in available]
        if unknown:
            raise ValueError(
                f"unknown experiments {unknown}; {str(experiments)!r} has {sorted(available)}"
            )
        chosen = list(dict.fromkeys(names))
    elif check is not None:
        chosen = sorted(set(references) | set(unusable))  # every experiment the reference ran
        if not chosen:
            raise ValueError(f"{str(check)!r} holds no experiment outputs (no <name>/{MANIFEST})")
    else:
        chosen = list(available)
    if jobs is None:
        jobs = min(4, os.cpu_count() or 1)
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    # what cannot be compared is reported, and fails the check, but does not stop the others
    skipped = {}
    for name in chosen:
        if check is not None and name not in available:
            skipped[name] = (
                "missing",
                f"the reference ran {name}, which {str(experiments)!r} no longer has",
            )
        elif name in unusable:
            skipped[name] = ("no reference", unusable[name])
        elif check is not None and name not in references:
            skipped[name] = ("no reference", f"{str(check)!r} has no run of {name}")
    modes = {}
    for name in chosen:
        reference = references.get(name)
        mode = bool(quick) if reference is None else bool(reference["quick"])
        if reference is not None and quick is not None and bool(quick) != mode:
            raise ValueError(
                f"the reference run of {name} in {str(check)!r} was "
                f"{'quick' if mode else 'full'}; drop --quick or check against a matching run"
            )
        modes[name] = mode
    if out is None:
        out = tempfile.mkdtemp(prefix="diffsim-check-") if check is not None else "out"
    out = user_path(out, "out")
    if check is not None:
        check = user_path(check, "check")
    if check is not None and out.resolve() == check.resolve():
        raise ValueError("--out must differ from the folder checked against")
    _prepare_out(out, [name for name in chosen if name not in skipped])

    lock = threading.Lock()
    done = [0]

    def say(text):
        if progress:
            with lock:
                print(text, file=stream, flush=True)

    def one(name):
        if name in skipped:
            status, reason = skipped[name]
            outcome = Outcome(name, status, 0.0, out / name, error=reason)
        else:
            say(f"  running  {name}{' (quick)' if modes[name] else ''}")
            outcome = _run_one(name, available[name], out / name, modes[name])
            if check is not None:
                _compare_outcome(outcome, references[name], Path(check) / name)
        with lock:
            done[0] += 1
            count = done[0]
        say(
            f"[{count:>2}/{len(chosen)}] {outcome.status:<7} {name}  {outcome.seconds:.1f} s"
            + (f"  ({outcome.error.splitlines()[-1]})" if outcome.error else "")
        )
        return outcome

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, chosen))


def _prepare_out(out: Path, names: list[str]) -> None:
    """Before anything runs: every experiment's output folder is one diffsim may clear (no
    foreign manifest) and write; else `ReproduceError` naming each folder."""
    problems = []
    for name in names:
        folder = out / name
        if folder.exists() and not folder.is_dir():
            problems.append(f"{str(folder)!r} is a file, not a folder: choose another --out")
            continue
        _, problem = _load_manifest(folder)
        if problem is not None:
            problems.append(_foreign(folder, problem))
    if problems:
        raise ReproduceError("; ".join(problems))
    try:
        for name in names:
            (out / name).mkdir(parents=True, exist_ok=True)
            check_can_write(out / name)
    except OSError as error:
        raise ReproduceError(
            f"cannot write the outputs into {str(out)!r} ({error.strerror or error}: "
            f"{error.filename or out}): choose a writable --out"
        ) from None


def _run_one(name: str, path: Path, out_dir: Path, quick: bool) -> Outcome:
    _clear(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # -P: the installed diffsim (and models), not a checkout that happens to be the cwd
    command = [
        sys.executable,
        "-P",
        "-m",
        "diffsim._apps.experiment_worker",
        str(path),
        str(out_dir),
    ]
    if quick:
        command.append("--quick")
    # a fixed hash seed: nothing in an experiment's output may depend on set or dict order;
    # on a GPU, processes that run at once must not each take most of its memory up front
    environment = {
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        **os.environ,
        "PYTHONHASHSEED": "0",
        "MPLBACKEND": "Agg",
    }
    start = time.perf_counter()
    with open(out_dir / LOG, "w", encoding="utf-8") as log:
        code = subprocess.run(
            command, stdout=log, stderr=subprocess.STDOUT, env=environment, stdin=subprocess.DEVNULL
        ).returncode
    seconds = time.perf_counter() - start
    manifest = _read_manifest(out_dir)
    if code != 0 or manifest is None:
        tail = (out_dir / LOG).read_text(encoding="utf-8", errors="replace").strip()
        lines = tail.splitlines()[-15:] or [f"exit status {code}"]
        return Outcome(name, "failed", seconds, out_dir, error="\n".join(lines))
    return Outcome(name, "ok", seconds, out_dir, files=len(manifest["files"]))


def _clear(out_dir: Path) -> None:
    """Remove what an earlier run of this experiment wrote here (the files its manifest lists,
    the manifest and the log), so that a stale file can never pass for a new one. Only a
    manifest that `_manifest_problem` accepts is followed: every file it lists lies inside
    `out_dir` (`reproduce` refuses the folder before anything runs otherwise)."""
    manifest, problem = _load_manifest(out_dir)
    if problem is not None:  # checked up front; kept here so that no caller can skip it
        raise ReproduceError(_foreign(out_dir, problem))
    for name in [] if manifest is None else manifest["files"]:
        (out_dir / name).unlink(missing_ok=True)
    for name in (MANIFEST, LOG):
        (out_dir / name).unlink(missing_ok=True)


def _read_manifest(folder: Path) -> dict | None:
    """The manifest in `folder`, or None when there is none or it is not one of ours."""
    manifest, problem = _load_manifest(folder)
    return None if problem is not None else manifest


def _load_manifest(folder: Path) -> tuple[dict | None, str | None]:
    """(manifest, None) for a manifest that `diffsim reproduce` could have written, (None,
    None) when there is none, (None, why) when `folder/manifest.json` is not such a manifest."""
    path = Path(folder) / MANIFEST
    if not path.exists() and not path.is_symlink():
        return None, None
    if path.is_symlink() or not path.is_file():
        return None, "it is not a regular file"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        return None, f"it cannot be read ({error.__class__.__name__}: {error})"
    except ValueError as error:
        return None, f"it is not valid JSON ({error})"
    problem = _manifest_problem(Path(folder), manifest)
    return (None, problem) if problem is not None else (manifest, None)


_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _manifest_problem(folder: Path, manifest) -> str | None:
    """Why `manifest` (parsed JSON) cannot be a manifest of `folder` written by
    `run_experiment`, or None. A manifest decides which files a rerun deletes and which a
    check reads, so every path it lists must be a plain relative name of a regular file inside
    `folder`: no absolute path, no `..`, no link that leads out."""
    if not isinstance(manifest, dict):
        return f"it holds a JSON {type(manifest).__name__}, not an object"
    files = manifest.get("files")
    if not isinstance(files, dict):
        return "its 'files' is not an object name -> {kind, bytes, sha256}"
    if "quick" in manifest and not isinstance(manifest["quick"], bool):
        return f"its 'quick' is {manifest['quick']!r}, not true or false"
    root = os.path.realpath(folder)
    for name, entry in files.items():
        shown = name if len(name) <= 80 else name[:80] + "…"
        if not name or "\x00" in name or "\\" in name:
            return f"it lists the file name {shown!r}"
        parts = PurePosixPath(name).parts
        if PurePosixPath(name).is_absolute() or PureWindowsPath(name).drive or ".." in parts:
            return f"it lists {shown!r}, a path outside {str(folder)!r}"
        if name in (MANIFEST, LOG):
            return f"it lists {name}, which is the runner's own file"
        target = Path(folder) / name
        resolved = os.path.realpath(target)
        if os.path.commonpath([root, resolved]) != root:
            return f"it lists {shown!r}, which leads outside {str(folder)!r} (through a link)"
        if target.is_symlink() or (target.exists() and not target.is_file()):
            return f"it lists {shown!r}, which is not a regular file"
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("sha256"), str)
            and _SHA256.match(entry["sha256"])
        ):
            return f"its entry for {shown!r} has no SHA-256 (64 hex digits)"
    return None


def _foreign(folder: Path, problem: str) -> str:
    return (
        f"{str(Path(folder) / MANIFEST)!r} is not a manifest that diffsim reproduce wrote: "
        f"{problem}. A rerun deletes the files a manifest lists, so this folder is refused; "
        "remove that manifest (or the folder) if its files are yours to lose, or choose "
        "another --out"
    )


def _references(folder) -> tuple[dict[str, dict], dict[str, str]]:
    """The experiments an output folder holds: name → manifest, and name → why a folder of
    one (with a log or a manifest) cannot serve as a reference."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no output folder {str(folder)!r} to check against")
    manifests, unusable = {}, {}
    for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
        if not ((sub / MANIFEST).exists() or (sub / LOG).exists()):
            continue
        manifest, problem = _load_manifest(sub)
        if manifest is not None:
            manifests[sub.name] = manifest
        elif problem is not None:
            unusable[sub.name] = (
                f"{sub / MANIFEST} is not a manifest of diffsim reproduce: {problem}"
            )
        else:
            unusable[sub.name] = f"its reference run failed (no manifest; see {sub / LOG})"
    return manifests, unusable


def _compare_outcome(outcome: Outcome, reference: dict, reference_dir: Path) -> None:
    if outcome.status == "failed":
        return
    new = _read_manifest(outcome.out_dir)
    outcome.differences = compare_files(
        reference_dir, reference["files"], outcome.out_dir, new["files"]
    )
    outcome.status = "changed" if outcome.differences else "same"


def compare_outputs(reference: str | Path, new: str | Path) -> dict[str, list[str]]:
    """Compare two output folders of the same experiments, manifest by manifest.

    **Returns:** experiment name → what differs (changed, missing or new files, with the
    largest numeric difference of changed data); empty lists where the outputs are the same
    bytes. Experiments in only one of the folders are reported as such.
    """
    (old, _), (fresh, _) = _references(reference), _references(new)
    report = {}
    for name in sorted(set(old) | set(fresh)):
        if name not in fresh:
            report[name] = [f"not in {str(new)!r}"]
        elif name not in old:
            report[name] = [f"not in {str(reference)!r}"]
        else:
            report[name] = compare_files(
                Path(reference) / name, old[name]["files"], Path(new) / name, fresh[name]["files"]
            )
    return report


def compare_files(old_dir: Path, old: dict, new_dir: Path, new: dict) -> list[str]:
    """What differs between two runs' files, one line each: `old` and `new` are their
    manifests' `files` (name → sha256 …). A reference file still on disk is hashed afresh (a
    file edited after its run counts as what it is now); one that is gone is represented by
    its manifest's hash, so a folder of manifests alone can serve as the reference."""
    lines = []
    for name in sorted(set(old) | set(new)):
        if name not in new:
            lines.append(f"{name}: missing from the rerun")
        elif name not in old:
            lines.append(f"{name}: new in the rerun")
        elif _current_hash(Path(old_dir) / name, old[name]) != new[name]["sha256"]:
            detail = _describe_change(Path(old_dir) / name, Path(new_dir) / name)
            lines.append(f"{name}: {kind(name)} changed" + (f" ({detail})" if detail else ""))
    return lines


def _current_hash(path: Path, entry: dict) -> str:
    return _provenance.sha256(path) if path.is_file() else entry["sha256"]


def _describe_change(old: Path, new: Path) -> str:
    """How much a changed file moved: the largest absolute difference of its numbers (data),
    the fraction of pixels that differ (PNG); "" when it cannot tell."""
    if not old.is_file():
        return "reference file not on disk; its manifest's hash differs"
    try:
        suffix = old.suffix.lower()
        if suffix == ".png":
            import matplotlib.image
            import numpy as np

            a, b = matplotlib.image.imread(old), matplotlib.image.imread(new)
            if a.shape != b.shape:
                return f"size {a.shape[1]}x{a.shape[0]} → {b.shape[1]}x{b.shape[0]}"
            return f"{np.mean(np.any(a != b, axis=-1)):.2%} of pixels differ"
        numbers = {".csv": _csv_numbers, ".json": _json_numbers, ".nc": _netcdf_numbers}
        if suffix not in numbers:
            return ""
        a, b = numbers[suffix](old), numbers[suffix](new)
    except Exception as error:  # a description is a courtesy; the change is reported anyway
        return f"cannot compare: {type(error).__name__}"
    return _numeric_difference(a, b)


def _numeric_difference(a: dict, b: dict) -> str:
    """What moved between two files' fields (name → numbers, or text): the text fields that
    changed, and the largest absolute difference among the numeric ones (equal infinities and
    NaNs in the same places count as equal)."""
    import numpy as np

    if a.keys() != b.keys():
        return f"fields {sorted(set(a) ^ set(b))} differ"
    text, worst, where = [], 0.0, None
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, str) or isinstance(y, str):
            if x != y:
                text.append(key)
            continue
        x, y = np.asarray(x, float), np.asarray(y, float)
        if x.shape != y.shape:
            return f"{key}: shape {x.shape} → {y.shape}"
        equal = (x == y) | (np.isnan(x) & np.isnan(y))
        if not equal.all():
            gap = float(np.max(np.where(equal, 0.0, np.abs(x - y))))
            if where is None or not gap <= worst:  # NaN against a number ranks first
                worst, where = gap, key
    parts = (
        [f"text changed in {', '.join(text[:5])}{' …' if len(text) > 5 else ''}"] if text else []
    )
    if where is not None:
        parts.append(f"largest difference {worst:.3g} in {where}")
    return "; ".join(parts) or "same numbers, other bytes"


def _csv_numbers(path: Path) -> dict:
    import csv

    with open(path, newline="", encoding="utf-8") as file:
        rows = list(csv.reader(file))
    header, body = rows[0], rows[1:]
    columns = {}
    for j, name in enumerate(header):
        cells = [row[j] for row in body]
        try:
            columns[name] = [float(cell) for cell in cells]
        except ValueError:
            columns[name] = "\n".join(cells)  # text: compared for equality
    return columns


def _json_numbers(path: Path) -> dict:
    flat = {}

    def walk(value, key):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{key}[{i}]")
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            flat[key] = json.dumps(value)  # text, booleans, null: compared for equality
        else:
            flat[key] = float(value)

    walk(json.loads(path.read_text(encoding="utf-8")), "")
    return flat


def _netcdf_numbers(path: Path) -> dict:
    import numpy as np
    import xarray as xr

    with xr.open_dataset(path, engine="h5netcdf") as data:
        return {
            name: (
                np.asarray(data[name].values, float)
                if np.issubdtype(data[name].dtype, np.number)
                else "\n".join(map(str, np.asarray(data[name].values).ravel()))
            )
            for name in list(data.data_vars) + list(data.coords)
        }


def summary_table(outcomes: list[Outcome]) -> str:
    """The table `diffsim reproduce` prints: one row per experiment, then the totals."""
    width = max([len("experiment")] + [len(o.name) for o in outcomes])
    lines = [f"{'experiment':<{width}}  {'status':<12} {'seconds':>8} {'files':>6}"]
    lines.append("-" * len(lines[0]))
    for o in outcomes:
        lines.append(f"{o.name:<{width}}  {o.status:<12} {o.seconds:>8.1f} {o.files:>6}")
    counts = {}
    for o in outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    total = sum(o.seconds for o in outcomes)
    lines.append("-" * len(lines[0]))
    tally = ", ".join(f"{v} {k}" for k, v in counts.items())
    lines.append(f"{len(outcomes)} experiments: {tally}; {total:.1f} s of runs")
    for o in outcomes:
        if o.error and o.status == "failed":
            lines.append(f"\n{o.name} failed (log: {o.out_dir / LOG}):")
            lines.extend("    " + line for line in o.error.splitlines())
        elif o.error:
            lines.append(f"\n{o.name}: {o.status}: {o.error}")
        if o.differences:
            lines.append(f"\n{o.name} changed:")
            lines.extend("    " + line for line in o.differences)
    return "\n".join(lines)


def succeeded(outcomes: list[Outcome]) -> bool:
    """True when nothing failed and, when checking, nothing changed."""
    return all(o.status in ("ok", "same") for o in outcomes)
