"""`diffsim bench`: run the benchmarks of `experiments/bench/`, each in a fresh process, and
write `BENCHMARKS.md` (tables), `benchmarks.json` (raw timings) and `scaling.png` (time against
ensemble size).

A benchmark is a script (`python experiments/bench/NAME.py [--quick]`) that prints Markdown
tables and hands its measurements to `_timing.record` and its targets to
`_timing.targets_table` (experiments/bench/_timing.py). Each runs in a process of its own, one
after the other: a benchmark measures compile times, which a warm process would flatter, and
run times, which a benchmark running beside it would spoil. Peers are compared within one
benchmark's process, never across processes.
"""

import dataclasses
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .. import _provenance
from .._validate import user_path
from .reproduce import discover

REPORT = "BENCHMARKS.md"
RAW = "benchmarks.json"
PLOT = "scaling.png"
# the peers' packages, reported with the timings (absent ones as "not installed")
PACKAGES = (
    "diffsim",
    "jax",
    "jaxlib",
    "diffrax",
    "equinox",
    "numpy",
    "scipy",
    "torch",
    "torchdiffeq",
)


@dataclasses.dataclass
class BenchOutcome:
    """How one benchmark went: `status` "ok" or "failed", `seconds` (its process's wall time),
    `markdown` (what it printed: its tables), `records` (its raw timings, one dict each: at
    least `workload` and `method`, usually `members`, `compile_s`, `run_s`), `targets` (dicts of
    `target`, `measured`, `met`) and `error` (the tail of its log when it failed)."""

    name: str
    status: str
    seconds: float
    markdown: str = ""
    records: list = dataclasses.field(default_factory=list)
    targets: list = dataclasses.field(default_factory=list)
    error: str = ""


def bench(
    names=None,
    *,
    benchmarks: str | Path = "experiments/bench",
    out: str | Path = "out/bench",
    quick: bool = False,
    progress: bool = True,
    stream=None,
) -> list[BenchOutcome]:
    """Run benchmarks and write their report to `out`.

    **Arguments:**

    - `names`: benchmarks to run (default: every `*.py` in `benchmarks` not starting with `_`);
    - `benchmarks`: the folder of benchmark scripts;
    - `out`: where `BENCHMARKS.md`, `benchmarks.json`, `scaling.png` and each benchmark's
      `<name>.log` go;
    - `quick`: the reduced sizes (a smoke run: its timings mean little);
    - `progress`: a line as each benchmark starts and ends (to `stream`, default stderr).

    **Returns:** one `BenchOutcome` per benchmark, in the order run. Targets that are not met
    do not fail a benchmark; a benchmark that raises does (the others still run).
    """
    stream = sys.stderr if stream is None else stream
    available = discover(benchmarks, "benchmarks")
    if names:
        unknown = [n for n in names if n not in available]
        if unknown:
            raise ValueError(
                f"unknown benchmarks {unknown}; {str(benchmarks)!r} has {sorted(available)}"
            )
        chosen = list(dict.fromkeys(names))
    else:
        chosen = list(available)
    out = user_path(out, "out")
    out.mkdir(parents=True, exist_ok=True)
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    outcomes = []
    for index, name in enumerate(chosen, 1):
        if progress:
            print(f"  running  {name}{' (quick)' if quick else ''}", file=stream, flush=True)
        outcome = _run_one(name, available[name], out, quick)
        outcomes.append(outcome)
        if progress:
            met = sum(bool(t["met"]) for t in outcome.targets)
            targets = f", targets met {met}/{len(outcome.targets)}" if outcome.targets else ""
            print(
                f"[{index:>2}/{len(chosen)}] {outcome.status:<6} {name}  "
                f"{outcome.seconds:.1f} s{targets}",
                file=stream,
                flush=True,
            )
    context = {
        "started": started,
        "quick": quick,
        "command": "diffsim bench " + " ".join([*(names or []), *(["--quick"] if quick else [])]),
        "git_commit": _provenance.git_commit(Path(benchmarks)),
        "machine": _machine(),
        "versions": _provenance.package_versions(PACKAGES),
    }
    raw = {**context, "benchmarks": {o.name: dataclasses.asdict(o) for o in outcomes}}
    _write_atomic(out / RAW, json.dumps(raw, indent=1, default=_plain) + "\n")
    plotted = scaling_plot(outcomes, out / PLOT)
    _write_atomic(out / REPORT, report(outcomes, context, plot=PLOT if plotted else None))
    return outcomes


def _run_one(name: str, path: Path, out: Path, quick: bool) -> BenchOutcome:
    results = out / f"{name}.json"
    log = out / f"{name}.log"
    results.unlink(missing_ok=True)
    # -P: the installed diffsim (and models), not a checkout that happens to be the cwd
    command = [sys.executable, "-P", "-m", "diffsim._apps.bench_worker", str(path), str(results)]
    if quick:
        command.append("--quick")
    environment = {**os.environ, "PYTHONHASHSEED": "0", "MPLBACKEND": "Agg"}
    start = time.perf_counter()
    with open(log, "w", encoding="utf-8") as stderr:
        process = subprocess.run(
            command,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=environment,
            stdin=subprocess.DEVNULL,
        )
    seconds = time.perf_counter() - start
    markdown = process.stdout.strip()
    try:
        collected = json.loads(results.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        collected = None
    finally:
        results.unlink(missing_ok=True)
    if process.returncode != 0 or collected is None:
        text = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        error = "\n".join(text[-15:]) or f"exit status {process.returncode}"
        return BenchOutcome(name, "failed", seconds, markdown, error=error)
    return BenchOutcome(name, "ok", seconds, markdown, collected["records"], collected["targets"])


def _machine() -> dict:
    try:
        return _provenance.machine()
    except Exception as error:  # no usable JAX backend: the report still says what it knows
        return {"cpu": _provenance.cpu_model(), "cpu_count": os.cpu_count(), "error": str(error)}


def report(outcomes: list[BenchOutcome], context: dict, plot: str | None = None) -> str:
    """The Markdown report: the run (when, what, machine, versions), every target with its
    status, then each benchmark's own tables."""
    machine = context["machine"]
    versions = ", ".join(f"{k} {v}" for k, v in context["versions"].items())
    lines = [
        "# diffsim benchmarks",
        "",
        f"- run: `{context['command']}` at {context['started']}, git {context['git_commit']}"
        + (" (quick: smoke sizes, the timings mean little)" if context["quick"] else ""),
        f"- machine: {machine.get('cpu')}, {machine.get('cpu_count')} cores, "
        f"{machine.get('device_kind', '?')} x {machine.get('device_count', '?')} "
        f"({machine.get('device_platform', '?')})",
        f"- versions: {versions}",
        "- compile time: trace + lower + XLA compile of the jitted call; run time: median of "
        "repeats after a warm-up call, `block_until_ready`; ratios are against peers measured "
        "in the same process",
        "",
        "## Targets",
        "",
    ]
    rows = [
        [o.name, t["target"], f"{t['measured']:.2f}", "met" if t["met"] else "NOT MET"]
        for o in outcomes
        for t in o.targets
    ]
    rows += [[o.name, "(benchmark failed)", "-", "FAILED"] for o in outcomes if o.status != "ok"]
    lines.append(
        markdown_table(rows, ["benchmark", "target", "measured", "status"])
        if rows
        else "(no targets)"
    )
    if plot:
        lines += ["", f"![time against ensemble size]({plot})"]
    for outcome in outcomes:
        lines += ["", f"## {outcome.name} ({outcome.seconds:.0f} s)", ""]
        body = outcome.markdown
        # the benchmark's own headings sit one level below its section
        body = "\n".join(
            "##" + line if line.startswith("# ") else line for line in body.splitlines()
        )
        lines.append(body or "(no output)")
        if outcome.status != "ok":
            lines += ["", "FAILED:", "", "```", outcome.error, "```"]
    return "\n".join(lines) + "\n"


def scaling_plot(outcomes: list[BenchOutcome], path: Path) -> bool:
    """Log-log run time against ensemble size, one panel per workload that was measured at two
    sizes or more; False (and no file) when there is none."""
    series: dict[str, dict[str, list]] = {}
    for outcome in outcomes:
        for r in outcome.records:
            if r.get("members") and r.get("run_s"):
                series.setdefault(r["workload"], {}).setdefault(r["method"], []).append(
                    (r["members"], r["run_s"])
                )
    panels = {
        w: m
        for w, m in series.items()
        if any(len({n for n, _ in points}) > 1 for points in m.values())
    }
    path.unlink(missing_ok=True)
    if not panels:
        return False
    import matplotlib

    matplotlib.use("Agg")
    from .. import plot as ds_plot

    with ds_plot.style():
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
        for ax, (workload, methods) in zip(axes[0], panels.items()):
            for method, points in methods.items():
                points = sorted(points)
                ax.plot([n for n, _ in points], [t for _, t in points], "o-", ms=3, label=method)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("ensemble size N")
            ax.set_ylabel("run time (s)")
            ax.set_title(workload, fontsize=9)
            ax.legend(fontsize=6)
        fig.tight_layout()
        ds_plot.save(fig, path.parent, path.stem, formats=("png",))
        plt.close(fig)
    return True


def markdown_table(rows, headers) -> str:
    """A Markdown table, columns padded to their widest cell (the benchmarks' tables too)."""
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def _plain(value):
    """JSON for NumPy scalars and arrays in records."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _write_atomic(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def summary_table(outcomes: list[BenchOutcome]) -> str:
    """One line per benchmark: status, wall time, targets met."""
    rows = []
    for o in outcomes:
        met = sum(bool(t["met"]) for t in o.targets)
        rows.append(
            [o.name, o.status, f"{o.seconds:.1f}", f"{met}/{len(o.targets)}" if o.targets else "-"]
        )
    return markdown_table(rows, ["benchmark", "status", "seconds", "targets met"])
