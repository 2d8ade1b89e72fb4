"""`diffsim fit problem.yaml` and `diffsim info problem.yaml`: a PEtab problem's multi-start fit,
written with its provenance, and a problem's summary.

The starts are drawn as the benchmark collection and pyPESTO draw them: every estimated
parameter uniform on its scale (lin, log, log10) within its bounds, from a seeded generator,
so that a run is repeatable and the nominal values (often the published optimum) are not a
start. What `--out` receives:

- `summary.txt`: the fit's summary (`ds.ProblemFit.summary`);
- `parameters.tsv`: each estimated parameter on its scale and as a value, standard error on
  the scale, the confidence interval;
- `fit.json`: the result (`ds.ProblemFit.to_dict`: every start's llh and parameters on their
  scales) and its provenance (command, files and their SHA-256, versions, machine, seed);
- `waterfall.png`: the starts' log-likelihoods, best first;
- `fits.png`: measurements and predictions per experiment (the first 12).
"""

import contextlib
import json
import os
import sys
import time
from pathlib import Path

SUFFIXES = (".yaml", ".yml")


def is_problem_file(path: str) -> bool:
    return Path(path).suffix.lower() in SUFFIXES


def _load(path: str, command: str):
    import diffsim as ds

    try:
        return ds.petab.load(path)
    except (ds.petab.PetabError, ds.sbml.SBMLError, FileNotFoundError, ValueError) as error:
        print(f"diffsim {command}: {type(error).__name__}: {error}", file=sys.stderr)
        return None


def _first_missing(folder: str) -> str | None:
    """The outermost folder of `folder`'s path that does not exist yet (None: it exists)."""
    missing, path = None, os.path.abspath(folder)
    while not os.path.exists(path):
        missing, path = path, os.path.dirname(path)
    return missing


def _remove_up_to(folder: str, outermost: str) -> None:
    """Remove the empty `folder` and its parents up to `outermost` (a non-empty one stops)."""
    with contextlib.suppress(OSError):
        while True:
            os.rmdir(folder)
            if folder == outermost:
                return
            folder = os.path.dirname(folder)


def fit(path: str, *, starts: int, out: str | None, seed: int, quiet: bool) -> int:
    """The body of `diffsim fit problem.yaml`; returns the exit status (0 the best start
    converged, 1 it did not, 2 bad input or unwritable output)."""
    import jax

    jax.config.update("jax_enable_x64", True)
    import matplotlib

    matplotlib.use("Agg")
    from .config import ConfigError, unwritten_results, writable_folder, write_atomically

    if starts < 1:
        print(f"diffsim fit: --starts must be at least 1, got {starts}", file=sys.stderr)
        return 2
    if seed < 0:
        print(f"diffsim fit: --seed must be 0 or more, got {seed}", file=sys.stderr)
        return 2
    folder = os.path.expanduser(out or os.path.join("out", f"fit_{Path(path).stem}"))
    made = _first_missing(folder)  # what the check below creates, removed if nothing is written
    try:
        # checked before the fit, which can take long, so that its result is not lost
        writable_folder(folder, "--out", ConfigError)
    except ConfigError as error:
        print(f"diffsim fit: {error}", file=sys.stderr)
        return 2
    clock = time.perf_counter()
    problem = _load(path, "fit")
    if problem is None:
        if made is not None:  # the folders made by the check above, left empty
            _remove_up_to(os.path.abspath(folder), made)
        return 2
    load_seconds = time.perf_counter() - clock
    print(f"{Path(path).name}: {problem!r}; read in {load_seconds:.1f} s", flush=True)
    print(
        f"{starts} starts uniform on each parameter's scale within its bounds (seed {seed}); "
        "the first compiles the model's programs",
        flush=True,
    )
    priors = problem.source.get("initialization_priors")
    if priors:
        print(
            f"note: the parameter table's initializationPriorType ({priors}) is not followed: "
            "every start is uniform on its parameter's scale within the bounds",
            flush=True,
        )
    import warnings

    import diffsim as ds

    try:
        with warnings.catch_warnings():  # the summary below states them
            warnings.simplefilter("ignore", ds.FitWarning)
            result = ds.fit(
                problem, starts=problem.uniform_starts(starts, seed=seed), progress=not quiet
            )
    except (ValueError, TypeError, ds.SimulationError) as error:
        print(f"diffsim fit: {type(error).__name__}: {error}", file=sys.stderr)
        return 2
    summary = result.summary()
    print(summary)
    record = dict(
        result.to_dict(),
        problem=repr(problem),
        seed=seed,
        load_seconds=load_seconds,
        provenance=_provenance(problem),
    )
    try:
        write_atomically(os.path.join(folder, "summary.txt"), summary + "\n")
        write_atomically(os.path.join(folder, "parameters.tsv"), _parameters_table(result))
        write_atomically(os.path.join(folder, "fit.json"), json.dumps(record, indent=1) + "\n")
        from .. import plot

        with plot.style():
            plot.save(result.plot_waterfall(), folder, "waterfall", formats=("png",))
            plot.save(result.plot(), folder, "fits", formats=("png",))
    except OSError as error:
        return unwritten_results("fit", folder, error)
    print(f"wrote {folder}/: summary.txt, parameters.tsv, fit.json, waterfall.png, fits.png")
    return 0 if result.converged else 1


def info(path: str) -> int:
    """The body of `diffsim info problem.yaml`: what the problem holds and its nominal llh."""
    import jax

    jax.config.update("jax_enable_x64", True)
    clock = time.perf_counter()
    problem = _load(path, "info")
    if problem is None:
        return 2
    print(f"{Path(path).name}: {problem!r}; read in {time.perf_counter() - clock:.1f} s")
    model = problem.model
    print(
        f"model: {len(model.state_names)} states, {len(problem.model_parameters)} parameters "
        f"({type(model).__name__})"
    )
    print("experiments (measurements):")
    names = [e.name or f"experiment {i}" for i, e in enumerate(problem.experiments)]
    counts = [len(rows.time) for rows in problem.rows]
    pre = [e.pre_equilibrate not in (None, False) for e in problem.experiments]
    for name, count, settled in zip(names, counts, pre):
        print(f"  {name} ({count})" + (", pre-equilibrated" if settled else ""))
    print("observables:")
    for name, observable in problem.observables.items():
        print(f"  {name}: {observable.noise} noise")
    print(f"estimated parameters ({len(problem.names)}):")
    rows = [("name", "scale", "lower", "upper", "nominal")]
    for name in problem.names:
        unknown = problem.unknowns[name]
        low, high = unknown.bounds if unknown.bounds is not None else (None, None)
        rows.append((name, unknown.scale, _text(low), _text(high), _text(unknown.value)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    clock = time.perf_counter()
    llh = problem.llh()
    print(f"llh at the nominal values: {llh:.10g} ({time.perf_counter() - clock:.1f} s)")
    return 0


def _text(value) -> str:
    return "-" if value is None else f"{value:g}"


def _parameters_table(result) -> str:
    lines = [
        "\t".join(
            (
                "parameterId",
                "parameterScale",
                "estimateOnScale",
                "estimate",
                "stderrOnScale",
                f"lower{100 * result.level:g}",
                f"upper{100 * result.level:g}",
            )
        )
    ]
    for name in result.names:
        low, high = result.confidence_intervals[name]
        lines.append(
            "\t".join(
                (
                    name,
                    result.problem.unknowns[name].scale,
                    repr(result.params_on_scale[name]),
                    repr(result.params[name]),
                    repr(result.stderr[name]),
                    repr(low),
                    repr(high),
                )
            )
        )
    return "\n".join(lines) + "\n"


def _provenance(problem) -> dict:
    import platform

    from .. import _provenance

    files = problem.source.get("files", [])
    return dict(
        command=" ".join(["diffsim", *sys.argv[1:]]),
        date=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        files={str(Path(f).resolve()): _provenance.sha256(f) for f in files},
        versions=_provenance.package_versions((*_provenance.PACKAGES, "python-libsbml", "sympy")),
        python=platform.python_version(),
        machine=_provenance.machine(),
    )
