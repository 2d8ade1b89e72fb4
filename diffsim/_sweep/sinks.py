"""Where a sweep's finished chunks go: host memory, or a zarr store shared by every process.

Both sinks take the same `Variable` layout and the same dataset attributes (the config
fingerprint, its digest, the seed and provenance), so a sweep's result reads the same from
memory as from its store. Invariants:

- `done` is the set of chunks already written and marked (empty in memory); a sweep computes
  only the others, which is what resuming is.
- A store is checked against the sweep's config and layout before anything is written, and
  only process 0 creates it; every process passes the same collective checkpoints
  (`distributed.shared_failure`), so a failure in one cannot leave the others waiting.
"""

import abc
import json
import os

import numpy as np

from . import distributed as _distributed, store as _store


def open_sink(store: str | None, variables, config: dict, dtype) -> "AbstractSink":
    """The sink for `store` (None: memory), with the dataset attributes of `config`."""
    attrs = {
        "sweep_config": _store.canonical_json(config),
        "sweep_config_sha256": _store.config_digest(config),
        "dtype": str(dtype),
        "seed": json.dumps(config["key"]),
        **_store.provenance(),
    }
    if store is None:
        return MemorySink(variables, attrs)
    return ZarrSink(store, variables, attrs, config)


class AbstractSink(abc.ABC):
    """Receives chunks as host arrays and returns the sweep's `xarray.Dataset` at the end."""

    done: set[int]  # chunks already written (and marked) before this sweep started

    @abc.abstractmethod
    def write(self, chunk: int, region: tuple[slice, ...], outputs: dict[str, np.ndarray]):
        """Store `chunk`'s variables, each of the shape of `region` of the member array."""

    @abc.abstractmethod
    def dataset(self):
        """The sweep's result as an `xarray.Dataset`."""


class MemorySink(AbstractSink):
    """Every variable as one NumPy array, filled chunk by chunk."""

    def __init__(self, variables, attrs: dict):
        self.variables, self.attrs, self.done = variables, attrs, set()
        self.arrays = {
            v.name: (v.values if v.values is not None else np.full(v.shape, v.fill_value, v.dtype))
            for v in variables
        }

    def write(self, chunk, region, outputs) -> None:
        for name, values in outputs.items():
            self.arrays[name][region] = values

    def dataset(self):
        import xarray as xr

        coords, data = {}, {}
        for v in self.variables:
            target = coords if v.values is not None else data
            target[v.name] = xr.Variable(v.dims, self.arrays[v.name], attrs=v.attrs)
        return xr.Dataset(data, coords=coords, attrs=self.attrs)


class ZarrSink(AbstractSink):
    """The zarr store at `path`: created if missing, else checked for this sweep and resumed."""

    def __init__(self, path: str, variables, attrs: dict, config: dict):
        exists = os.path.exists(path)
        process_id = _distributed.layout().process_id
        with _distributed.shared_failure("checking the store"):
            if exists:
                _store.check_matches(path, config)
                _store.check_layout(path, variables)
            if process_id == 0:
                _store.check_writable(path)
        # (that collective also keeps every process from reading while process 0 creates)
        with _distributed.shared_failure("creating the store"):
            if not exists and process_id == 0:
                _store.create(path, variables, attrs)
        self.path = path
        self.group = _store.open_group(path)
        self.done = _store.done_chunks(path)
        if exists and process_id == 0:
            # the creation's provenance stays; each resume adds what ran it (another machine,
            # device count or commit may finish a store another started)
            _store.record_resume(self.group, attrs, len(self.done))

    def write(self, chunk, region, outputs) -> None:
        _store.write_chunk(self.path, self.group, region, outputs, chunk)

    def dataset(self):
        return _store.open_dataset(self.path)
