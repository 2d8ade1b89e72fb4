"""`python -P -m diffsim._apps.experiment_worker PATH OUT [--quick]`: one experiment in a process of
its own, as `diffsim reproduce` starts it (a module of its own, which `import diffsim` does not
load, so that `-m` runs it once)."""

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m diffsim._apps.experiment_worker",
        description="Run one experiment and write its manifest.",
    )
    parser.add_argument("path")
    parser.add_argument("out")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    from diffsim._apps.experiment import run_experiment

    manifest = run_experiment(args.path, args.out, quick=args.quick)
    print(
        f"{manifest['experiment']}: {len(manifest['files'])} files in "
        f"{manifest['wall_time_s']:.1f} s → {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
