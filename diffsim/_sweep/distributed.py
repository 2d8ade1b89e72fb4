"""Many processes (hosts) on one sweep, through JAX's own distributed runtime.

`initialize` wraps `jax.distributed.initialize`. After it, `jax.process_index()` and
`jax.process_count()` say which share of a sweep's chunks this process computes; every process
writes its own chunks to the shared store. The only collective a sweep needs is
`any_process_failed`, after each step that processes do on their own (`shared_failure`; it also
serves as the barrier between them).
"""

import contextlib
import dataclasses
import os

import jax

# Environment variables by which jax.distributed recognises a cluster launch without arguments.
_CLUSTER_MARKERS = {
    "SLURM": ("SLURM_JOB_ID", "SLURM_NTASKS"),
    "Open MPI": ("OMPI_COMM_WORLD_SIZE",),
}


@dataclasses.dataclass(frozen=True)
class ProcessLayout:
    """Where this process sits: `process_id` of `num_processes`, its local devices and the total
    device count; `cluster` says how the layout was found."""

    process_id: int
    num_processes: int
    local_devices: tuple
    global_device_count: int
    cluster: str

    def __str__(self) -> str:
        kinds = sorted({d.device_kind for d in self.local_devices})
        return (
            f"process {self.process_id} of {self.num_processes} ({self.cluster}): "
            f"{len(self.local_devices)} local device(s) [{', '.join(kinds)}], "
            f"{self.global_device_count} in all"
        )


def initialize(**kwargs) -> ProcessLayout:
    """Join a multi-process run and return this process's `ProcessLayout`.

    **Arguments:** the keyword arguments of `jax.distributed.initialize`
    (`coordinator_address="host:port"`, `num_processes`, `process_id`, `local_device_ids`, …).
    With none, a SLURM or Open MPI launch is detected from its environment (JAX reads the rest);
    outside any cluster, nothing is initialised and the layout is a single process.

    Call it once, first thing, before any other JAX work (as `jax.distributed.initialize` needs).
    On CPU it selects the gloo collectives that cross-process barriers need. Then call `ds.sweep`
    in every process with the same arguments: each computes and writes its own share of chunks.
    """
    cluster = "arguments" if kwargs else _detect_cluster()
    if cluster is None:
        return layout(cluster="single process")
    # CPU devices of different processes meet in a collective only through gloo (this setting
    # leaves GPU collectives alone).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(**kwargs)
    return layout(cluster=cluster)


def layout(cluster: str = "current") -> ProcessLayout:
    """The current process layout (one process unless `initialize` joined a larger run)."""
    return ProcessLayout(
        process_id=jax.process_index(),
        num_processes=jax.process_count(),
        local_devices=tuple(jax.local_devices()),
        global_device_count=jax.device_count(),
        cluster=cluster,
    )


def _detect_cluster() -> str | None:
    for name, variables in _CLUSTER_MARKERS.items():
        if all(v in os.environ for v in variables):
            return name
    return None


def barrier(name: str) -> None:
    """Wait until every process reaches the barrier called `name` (no-op for one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def any_process_failed(failed: bool) -> bool:
    """Whether `failed` is true in any process: a collective every process must reach, so that
    an error in one process is raised in all of them instead of leaving the others waiting at
    the next barrier."""
    if jax.process_count() == 1:
        return failed
    import numpy as np
    from jax.experimental import multihost_utils

    return bool(np.any(multihost_utils.process_allgather(np.array([int(failed)]))))


@contextlib.contextmanager
def shared_failure(what: str):
    """Run a step of a sweep that each process does on its own; then every process learns
    whether any failed, and raises if so (the one that failed re-raises its own error), so that
    no process is left waiting for the others."""
    try:
        yield
    except Exception:
        any_process_failed(True)
        raise
    if any_process_failed(False):
        raise RuntimeError(
            f"another process of this sweep failed while {what} (its own log has the error); "
            "the chunks finished so far are kept in the store: fix the cause and run again to "
            "resume"
        )
