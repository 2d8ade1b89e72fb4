"""Timing helpers shared by the benchmarks: compile and run measured separately."""

import statistics
import time

import jax


def compile_seconds(jitted, *args) -> tuple[float, object]:
    """Trace + lower + compile time of a `jax.jit` function; returns (seconds, compiled)."""
    start = time.perf_counter()
    compiled = jitted.lower(*args).compile()
    return time.perf_counter() - start, compiled


def run_seconds(fn, *args, repeats: int = 5) -> float:
    """Median wall time of `fn(*args)` after one warm-up call, waiting for the result."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def table(rows, headers) -> str:
    """A Markdown table."""
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])
