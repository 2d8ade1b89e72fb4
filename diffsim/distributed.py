"""Multi-process runs: `ds.distributed.initialize(...)` wraps `jax.distributed.initialize`."""

from ._sweep.distributed import (
    barrier as barrier,
    initialize as initialize,
    layout as layout,
    ProcessLayout as ProcessLayout,
)
