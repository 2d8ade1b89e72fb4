"""`ds.sweep`: many simulations over named parameter axes → an `xarray.Dataset`; reading it back.

Members (one simulation each) are the points of a grid (the Cartesian product of the axes) or of
zipped `ds.Samples`. They run in chunks of a fixed size (the last one padded), so one compilation
serves the whole sweep and memory is bounded by a chunk. A chunk is a rectangular block of the
grid, sharded over every local device along a "batch" mesh axis; with several processes
(`ds.distributed.initialize`) each computes and writes its own share of the chunks. With a store,
chunks land in a zarr store as they finish and a new call resumes the missing ones.

Every member's numbers depend only on its own inputs and its index in the sweep (keys come from
`jax.random.fold_in(key, member_index)`), never on the chunk size, device count or process count.

This module checks the arguments and wires the pieces together: `axes` (the members on the
host), `members` (what one member computes), `chunks` (cutting and computing), `layout` (the
dataset's variables), `fingerprint` (the config a store is resumed against) and `sinks` (memory
or the store). Every argument error is raised before the first chunk is compiled.
"""

import os
from collections.abc import Callable

import jax
import numpy as np

from .._model import AbstractODE
from .._progress import progress_bar
from .._results import RESULTS
from .._solver import AbstractSolver
from .._warn import warn
from . import distributed as _distributed, store as _store
from .axes import Axes
from .chunks import bytes_per_member, ChunkPlan, ChunkRunner, run_chunks
from .fingerprint import sweep_config
from .layout import dataset_variables
from .members import MemberSpec
from .samples import Samples
from .sinks import open_sink


def sweep(
    model: AbstractODE | Callable[..., AbstractODE],
    axes: dict | Samples,
    y0,
    ts,
    *,
    solver: AbstractSolver,
    dt: float | None = None,
    reduce: str | Callable | None = None,
    chunk_size: int | None = None,
    store: str | os.PathLike | None = None,
    key=None,
    progress: bool = True,
    max_steps: int = 100_000,
):
    """Simulate every member of a parameter sweep and return the results as an `xarray.Dataset`.

    **Arguments:**

    - `model`: a model instance whose fields named in `axes` are replaced per member, or a
      function `**params -> model` (it also receives `key=` the member's key when `key` is given).
    - `axes`: a dict name → 1-D array for a full grid (the Cartesian product, one dimension per
      name, in the dict's order), or `ds.Samples({...})` for zipped samples (one dimension,
      `sample`). Names are model parameters, `"y0[i]"` (component `i` of the flattened initial
      state) or `"y0"` (whole initial states, shape `(n, *y0.shape)`).
    - `y0`: the initial state shared by all members (components named in `axes` replaced); may
      be None when `axes` has `"y0"`. Its float dtype sets the precision, as in `simulate`.
    - `ts`: output times, shape `(times,)`, concrete (the same for every member).
    - `solver`, `dt`, `max_steps`: as in `ds.simulate`.
    - `reduce`: what to keep of each member's `ds.Solution`: None or `"trajectory"` (states at
      every time, variable `y`), `"final_state"`, `"max_abs"` (max |y| over time), `"mean"`, or a
      function `solution -> pytree` (a dict names the variables; extra dimensions are named
      `<variable>_dim<k>`). Keep it small: memory and storage scale with it.
    - `chunk_size`: the most members per chunk (default: about 64 MiB of outputs, at most
      65,536). A chunk is a rectangular block of the grid (whole trailing rows, then an even split
      of the next dimension), so it can hold noticeably fewer members than `chunk_size`.
    - `store`: a path for a zarr store. Results are written chunk by chunk; if the store exists
      (an interrupted run), only the missing chunks are computed. A store written by a
      different sweep is refused with `SweepStoreError`.
    - `key`: a `jax.random` key; member `i` gets `jax.random.fold_in(key, i)`. Required with a
      stochastic solver (`ds.EulerMaruyama`, `ds.Milstein`): member `i`'s Brownian path is
      `fold_in(fold_in(key, i), 1)`, so it does not depend on chunks, devices or processes.
    - `progress`: show a progress bar (members/s, ETA) when stderr is a terminal.

    **Returns:** an `xarray.Dataset` with one dimension per grid axis (or `sample`), the axis
    values as coordinates, the outputs as variables (`time` and `state` dimensions labelled where
    they apply), and per member `result` (a `ds.RESULTS` code; failed members have NaN outputs)
    and `num_steps`. Output names must differ from those and from the coordinates. Attributes
    record the sweep's config (`sweep_config`, JSON), package versions, git commit, device kind,
    dtype and seed. With `store`, the variables are read lazily from it. If members failed, a
    warning counts them by code (`ds.sweep_summary`).

    Several processes (after `ds.distributed.initialize`) each compute chunks `p, p + P, …` and
    write them to the shared `store`; if one fails, all raise once they finish their share.
    """
    if store is not None:
        store = _store.normalize_path(store)
    members = Axes.build(axes)
    spec = MemberSpec.build(
        model,
        members,
        y0=y0,
        ts=ts,
        solver=solver,
        dt=dt,
        reduce=reduce,
        key=key,
        max_steps=max_steps,
    )
    devices = jax.local_devices()
    outputs = spec.output_shapes()
    plan = ChunkPlan.build(members.shape, chunk_size, bytes_per_member(outputs), len(devices))
    variables = dataset_variables(members, spec, outputs, plan)
    config = sweep_config(members, spec, plan)
    processes = _distributed.layout()
    if store is None and processes.num_processes > 1:
        raise ValueError(
            "a sweep across several processes needs store=...: each process writes its own "
            "chunks there, and none holds the whole result in memory"
        )
    sink = open_sink(store, variables, config, spec.dtype)
    pending = plan.pending(processes.process_id, processes.num_processes, sink.done)
    bar = progress_bar(
        sum(plan.members_in(c) for c in pending),
        enabled=progress,
        description=_description(processes, len(sink.done), plan.num_chunks),
        unit="member",
    )
    with _distributed.shared_failure("computing its chunks"):
        try:
            run_chunks(pending, ChunkRunner(spec, members, plan, devices), sink, bar)
        finally:
            bar.close()
    dataset = sink.dataset()
    _warn_failures(dataset)
    return dataset


def _description(processes: _distributed.ProcessLayout, done: int, num_chunks: int) -> str:
    """The progress bar's label: which process, and how much a resumed store already held."""
    description = "sweep"
    if processes.num_processes > 1:
        description += f" [process {processes.process_id}]"
    if done:
        description += f" (resumed: {done} of {num_chunks} chunks were done)"
    return description


def sweep_summary(dataset) -> dict[str, int]:
    """Count the members of a sweep result by outcome: `{"successful": n, "max_steps_reached":
    m, …}` (only codes that occur). Reads the `result` variable in slabs, so it also works on a
    large store."""
    if type(dataset).__name__ != "Dataset" or "result" not in getattr(dataset, "data_vars", {}):
        raise TypeError(
            "sweep_summary takes the xarray.Dataset of a sweep (from ds.sweep or ds.open_sweep), "
            f"which holds a 'result' variable; got {type(dataset).__name__}"
        )
    result = dataset["result"]
    counts = np.zeros(len(RESULTS) + 1, dtype=np.int64)  # the last bin: never computed
    first = result.dims[0]
    step = max(1, 2**24 // max(1, result.size // max(1, result.sizes[first])))
    for start in range(0, result.sizes[first], step):
        codes = np.asarray(result.isel({first: slice(start, start + step)}).values).ravel()
        codes = np.where((codes >= 0) & (codes < len(RESULTS)), codes, len(RESULTS))
        counts += np.bincount(codes, minlength=len(RESULTS) + 1)
    names = [r.name for r in RESULTS] + ["not_computed"]
    return {name: int(n) for name, n in zip(names, counts) if n}


def open_sweep(store: str | os.PathLike):
    """Open a sweep's zarr store as an `xarray.Dataset` whose variables are read lazily (no dask
    needed); e.g. `ds.open_sweep("out/sweep.zarr")["final_state"].sel(length=1.0)`. The store
    may be incomplete: members not yet computed hold NaN outputs and `result == -1`."""
    path = _store.normalize_path(store)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no sweep store at {path!r}")
    _store.check_is_sweep(path)
    return _store.open_dataset(path)


def _warn_failures(dataset) -> None:
    counts = sweep_summary(dataset)
    failed = {k: v for k, v in counts.items() if k != "successful"}
    if failed:
        total = sum(counts.values())
        detail = ", ".join(f"{k}: {v}" for k, v in failed.items())
        warn(
            f"ds.sweep: {sum(failed.values())} of {total} members did not succeed ({detail}); "
            "their outputs are NaN and `result` holds their codes (ds.RESULTS)"
        )
