"""Timing helpers shared by the benchmarks: compile and run measured separately, and the
results `diffsim bench` collects (`record`, `targets_table`)."""

import statistics
import time

import jax

from diffsim._apps.bench import markdown_table as table  # noqa: F401  (the benchmarks' tables)


def compile_seconds(jitted, *args) -> tuple[float, object]:
    """Trace + lower + compile time of a `jax.jit` function; returns (seconds, compiled)."""
    start = time.perf_counter()
    compiled = jitted.lower(*args).compile()
    return time.perf_counter() - start, compiled


def fresh_compile_seconds(jitted, *arrays) -> tuple[float, object]:
    """Median compile time over three fresh compilations (inputs of N-2, N-1 and N members force
    a new trace each time), so that one-time start-up costs of the process are not charged to
    whichever method is measured first; returns (seconds, the compilation for all N members)."""
    times = []
    for drop in (2, 1, 0):
        seconds, compiled = compile_seconds(jitted, *(a[drop:] for a in arrays))
        times.append(seconds)
    return statistics.median(times), compiled


def machine_line() -> str:
    """CPU, core count, device kind and count, jax and diffrax versions, for benchmark headers."""
    import os

    import diffrax

    from diffsim._provenance import cpu_model

    return (
        f"machine: {cpu_model()}, {os.cpu_count()} cores, "
        f"jax {jax.__version__} on {jax.devices()[0].device_kind} x {jax.device_count()}, "
        f"diffrax {diffrax.__version__}"
    )


def run_seconds(fn, *args, repeats: int = 5) -> float:
    """Median wall time of `fn(*args)` after one warm-up call, waiting for the result."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


_RECORDS: list[dict] = []
_TARGETS: list[dict] = []


def record(workload: str, method: str, **fields) -> dict:
    """Keep one measurement for `diffsim bench`'s raw timings (benchmarks.json) and its plot of
    time against ensemble size: e.g. `members`, `compile_s`, `run_s`, `error`, `steps`."""
    entry = {"workload": workload, "method": method, **fields}
    _RECORDS.append(entry)
    return entry


def collected() -> dict:
    """Everything `record` and `targets_table` were given in this process."""
    return {"records": list(_RECORDS), "targets": list(_TARGETS)}


def targets_table(checks) -> str:
    """A Markdown table of (target, measured ratio, met?) rows; the targets are also kept for
    `diffsim bench`'s summary."""
    _TARGETS.extend({"target": c, "measured": float(v), "met": bool(ok)} for c, v, ok in checks)
    rows = [[c, f"{v:.2f}", "met" if ok else "NOT MET"] for c, v, ok in checks]
    return table(rows, ["target", "measured", "status"])


class CompileClock:
    """Sums JAX's own trace, lowering and backend-compile durations while active, for timing
    the compilation inside a call that compiles internally (such as `ds.sweep`)."""

    _EVENTS = (
        "/jax/core/compile/jaxpr_trace_duration",
        "/jax/core/compile/jaxpr_to_mlir_module_duration",
        "/jax/core/compile/backend_compile_duration",
    )
    _active: list["CompileClock"] = []
    _registered = False

    def __init__(self):
        self.seconds = 0.0

    def __enter__(self):
        if not CompileClock._registered:
            jax.monitoring.register_event_duration_secs_listener(CompileClock._record)
            CompileClock._registered = True
        CompileClock._active.append(self)
        return self

    def __exit__(self, *exc):
        CompileClock._active.remove(self)

    @staticmethod
    def _record(name, seconds, **kwargs):
        if name in CompileClock._EVENTS:
            for clock in CompileClock._active:
                clock.seconds += seconds
