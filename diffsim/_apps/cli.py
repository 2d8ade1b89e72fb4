"""The `diffsim` command (also `python -m diffsim`)."""

import argparse
import platform
import sys
import time
import warnings


def _demo(args) -> int:
    from .demo import run

    try:
        run(args.out, quick=args.quick)
    except OSError as error:  # --out is a file, or a folder that cannot be written
        print(
            f"diffsim demo: cannot write to --out {args.out!r} ({error.strerror or error}): "
            "choose a folder you can write to",
            file=sys.stderr,
        )
        return 2
    return 0


def _info(args) -> int:
    if args.problem is not None:
        from .petab_fit import info

        return info(args.problem)
    import diffrax
    import equinox
    import jax

    from .. import __version__, _cache

    print(f"diffsim {__version__}")
    print(f"python {platform.python_version()} on {platform.platform()}")
    print(f"jax {jax.__version__}, diffrax {diffrax.__version__}, equinox {equinox.__version__}")
    print(f"devices: {', '.join(f'{d.platform}:{d.device_kind}' for d in jax.devices())}")
    print(f"compilation cache: {_cache.describe()}")
    print(
        "  (compiled programs kept between processes; DIFFSIM_CACHE=off turns it off, "
        "DIFFSIM_CACHE_DIR moves it, e.g. to a folder shared by a cluster's jobs)"
    )
    return 0


def _sweep(args) -> int:
    import os
    import time

    from .sweep_config import load, sweep_arguments, SweepConfigError

    try:
        config = load(args.config)
    except SweepConfigError as error:
        print(f"diffsim sweep: {error}", file=sys.stderr)
        return 2
    import jax

    # the precision must be chosen before JAX creates any array
    jax.config.update("jax_enable_x64", config.get("dtype", "float64") == "float64")
    import diffsim as ds

    if args.distributed:
        print(ds.distributed.initialize(), flush=True)
    from .._sweep.store import normalize_path

    if args.store is not None:
        config["store"] = args.store
    try:
        store = config["store"] = normalize_path(config["store"])
    except (TypeError, ValueError) as error:
        print(
            f"diffsim sweep: {'--store' if args.store is not None else 'store'}: {error}",
            file=sys.stderr,
        )
        return 2
    if os.path.exists(store) and not os.path.isdir(store):
        print(
            f"diffsim sweep: the store {store!r} is a file, not a sweep store (a zarr folder): "
            "choose another --store",
            file=sys.stderr,
        )
        return 2
    if os.path.exists(store) and not args.resume:
        print(
            f"diffsim sweep: the store {store!r} exists; pass --resume to compute its missing "
            "chunks, or remove it (or choose --store) to start over",
            file=sys.stderr,
        )
        return 2
    try:
        arguments = sweep_arguments(config)
        start = time.perf_counter()
        result = ds.sweep(**arguments, progress=not args.quiet)
    except (SweepConfigError, ValueError, TypeError) as error:
        print(f"diffsim sweep: {type(error).__name__}: {error}", file=sys.stderr)
        return 2
    seconds = time.perf_counter() - start
    summary = ds.sweep_summary(result)
    members = sum(summary.values())
    print(f"{members} members {dict(result.sizes)} in {seconds:.1f} s → {store}")
    print("outcomes: " + ", ".join(f"{k}: {v}" for k, v in summary.items()))
    return 0


def _fit(args) -> int:
    import json
    import os

    from .petab_fit import is_problem_file

    if is_problem_file(args.config):
        from .petab_fit import fit

        return fit(
            args.config,
            starts=20 if args.starts is None else args.starts,
            out=args.out,
            seed=args.seed,
            quiet=args.quiet,
        )
    if args.starts is not None or args.seed != 0:
        print(
            "diffsim fit: --starts and --seed are for PEtab problems (problem.yaml); a TOML "
            "fit sets starts and seed in its file",
            file=sys.stderr,
        )
        return 2
    from .fit_config import fit_arguments, FitConfigError, load

    try:
        config = load(args.config)
    except FitConfigError as error:
        print(f"diffsim fit: {error}", file=sys.stderr)
        return 2
    import jax

    jax.config.update("jax_enable_x64", config.get("dtype", "float64") == "float64")
    import matplotlib

    matplotlib.use("Agg")
    import diffsim as ds

    from .config import unwritten_results, writable_folder, write_atomically

    out = os.path.expanduser(args.out or config["out"])
    try:
        # checked before the fit, which can take long, so that its result is not lost
        writable_folder(out, "--out" if args.out else "out", FitConfigError)
        with warnings.catch_warnings():  # the summary below states them (once)
            warnings.simplefilter("ignore", ds.FitWarning)
            result = ds.fit(**fit_arguments(config))
    except (FitConfigError, ValueError, TypeError, FileNotFoundError, ds.SimulationError) as error:
        print(f"diffsim fit: {type(error).__name__}: {error}", file=sys.stderr)
        return 2
    summary = result.summary()
    print(summary)
    try:
        write_atomically(os.path.join(out, "summary.txt"), summary + "\n")
        record = {"config": os.path.abspath(args.config), **result.to_dict()}
        write_atomically(os.path.join(out, "fit.json"), json.dumps(record, indent=1))
        result.plot().savefig(os.path.join(out, "fit.png"), dpi=120)
    except OSError as error:
        return unwritten_results("fit", out, error)
    print(f"wrote {out}/summary.txt, fit.json, fit.png")
    return 0 if result.converged else 1


def _reproduce(args) -> int:
    from .reproduce import reproduce, succeeded, summary_table

    start = time.perf_counter()
    try:
        outcomes = reproduce(
            args.names,
            experiments=args.experiments,
            out=args.out,
            quick=args.quick,
            check=args.check,
            jobs=args.jobs,
        )
    except (ValueError, FileNotFoundError) as error:
        print(f"diffsim reproduce: {error}", file=sys.stderr)
        return 2
    print(summary_table(outcomes))
    where = outcomes[0].out_dir.parent if outcomes else args.out
    verdict = "no change" if args.check and succeeded(outcomes) else ""
    print(
        f"outputs in {where}/<experiment>/ (figures, data, manifest.json, log.txt); "
        f"{time.perf_counter() - start:.0f} s in all" + (f"; {verdict}" if verdict else "")
    )
    return 0 if succeeded(outcomes) else 1


def _bench(args) -> int:
    from .bench import bench, REPORT, summary_table

    start = time.perf_counter()
    try:
        outcomes = bench(args.names, benchmarks=args.benchmarks, out=args.out, quick=args.quick)
    except (ValueError, FileNotFoundError) as error:
        print(f"diffsim bench: {error}", file=sys.stderr)
        return 2
    print(summary_table(outcomes))
    import os

    # the plot is drawn only where a benchmark measured several sizes
    plot = ", plot scaling.png" if os.path.exists(os.path.join(args.out, "scaling.png")) else ""
    print(
        f"report in {args.out}/{REPORT} (raw timings benchmarks.json{plot}, logs "
        f"<name>.log); {time.perf_counter() - start:.0f} s in all"
    )
    return 0 if all(o.status == "ok" for o in outcomes) else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="diffsim", description="Differentiable physics and ODE simulation on JAX."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="simulate, take a gradient, sweep; write a figure")
    demo.add_argument("--out", default="out", help="output folder (default: ./out)")
    demo.add_argument("--quick", action="store_true", help="a smaller sweep")
    demo.set_defaults(handler=_demo)
    sweep = commands.add_parser(
        "sweep", help="run (or resume) a parameter sweep described in a TOML file"
    )
    sweep.add_argument("config", help="the sweep's TOML file (see experiments/sweeps/)")
    sweep.add_argument("--resume", action="store_true", help="continue an existing store")
    sweep.add_argument("--store", help="write to this store instead of the config's")
    sweep.add_argument(
        "--distributed",
        action="store_true",
        help="join a multi-process run (SLURM / Open MPI detected) via ds.distributed.initialize",
    )
    sweep.add_argument("--quiet", action="store_true", help="no progress bar")
    sweep.set_defaults(handler=_sweep)
    fit = commands.add_parser(
        "fit",
        help="fit a PEtab problem (problem.yaml) from many starts, or a model to data as a TOML "
        "file describes; print the summary and write the results",
    )
    fit.add_argument(
        "config",
        help="a PEtab problem's YAML file, or a fit's TOML file (see experiments/fits/)",
    )
    fit.add_argument(
        "--out",
        help="write the results here (default for a PEtab problem: out/fit_<name>; for a TOML "
        "file its out)",
    )
    fit.add_argument(
        "--starts",
        type=int,
        help="PEtab problems: optimisations from starts uniform on each parameter's scale "
        "within its bounds (default 20)",
    )
    fit.add_argument("--seed", type=int, default=0, help="PEtab problems: the starts' seed")
    fit.add_argument("--quiet", action="store_true", help="no progress bar")
    fit.set_defaults(handler=_fit)
    reproduce = commands.add_parser(
        "reproduce", help="run the experiments (figures, data, manifests); --check a rerun"
    )
    reproduce.add_argument("names", nargs="*", help="experiments to run (default: all)")
    reproduce.add_argument(
        "--quick", action="store_true", default=None, help="the reduced runs of the tests and CI"
    )
    reproduce.add_argument("--out", help="output folder (default ./out; with --check a new one)")
    reproduce.add_argument(
        "--check",
        metavar="DIR",
        help="rerun what DIR holds (quick or full, as it was run) and report every figure or "
        "data file that changed",
    )
    reproduce.add_argument(
        "--experiments", default="experiments", help="folder of experiment modules (./experiments)"
    )
    reproduce.add_argument(
        "--jobs", type=int, help="experiments run at once (default: CPU cores, at most 4)"
    )
    reproduce.set_defaults(handler=_reproduce)
    bench = commands.add_parser(
        "bench", help="run the benchmarks against their peers; write BENCHMARKS.md and timings"
    )
    bench.add_argument("names", nargs="*", help="benchmarks to run (default: all)")
    bench.add_argument("--quick", action="store_true", help="smoke sizes (CI): timings mean little")
    bench.add_argument("--out", default="out/bench", help="output folder (default ./out/bench)")
    bench.add_argument(
        "--benchmarks",
        default="experiments/bench",
        help="folder of benchmark scripts (./experiments/bench)",
    )
    bench.set_defaults(handler=_bench)
    info = commands.add_parser(
        "info", help="versions and devices; or, given a PEtab problem.yaml, what it holds"
    )
    info.add_argument("problem", nargs="?", help="a PEtab problem's YAML file")
    info.set_defaults(handler=_info)
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        # an interrupt is the user's choice, not a failure to report with a traceback; what a
        # command keeps (a sweep store's finished chunks, a fit's finished starts) it has kept
        print(f"\ndiffsim {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
