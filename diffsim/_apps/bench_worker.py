"""`python -P -m diffsim._apps.bench_worker PATH RESULTS [--quick]`: one benchmark in a process
of its own, as `diffsim bench` starts it. The script's printed tables go to stdout; what it recorded
through its folder's `_timing` module (raw timings, targets) is written to RESULTS as JSON."""

import argparse
import importlib.util
import json
import sys
from pathlib import Path

from diffsim._apps.bench import _plain


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m diffsim._apps.bench_worker",
        description="Run one benchmark and save what it measured.",
    )
    parser.add_argument("path")
    parser.add_argument("results")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    path = Path(args.path).resolve()
    sys.path.insert(0, str(path.parent))  # the benchmarks import their folder's helpers
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    if not hasattr(module, "main"):
        raise SystemExit(f"{path}: a benchmark needs main(argv) (see experiments/bench/)")
    module.main(["--quick"] if args.quick else [])
    sys.stdout.flush()
    timing = sys.modules.get("_timing")
    collected = timing.collected() if timing is not None else {"records": [], "targets": []}
    Path(args.results).write_text(json.dumps(collected, default=_plain), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
