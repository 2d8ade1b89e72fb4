"""The zarr store behind a sweep: layout, provenance, chunk-aligned writes and resume markers.

One sweep chunk (a block of members) is exactly one zarr chunk of every per-member variable, so
each chunk file has a single writer even when many processes share the store. A chunk counts as
done only once its marker file exists; the marker is written after the data, by an atomic
rename, so a run killed at any moment leaves either a complete, marked chunk or one that the
next run recomputes. Markers live in the `progress` group of the store.

zarr and xarray are imported here, lazily, so that the rest of diffsim runs without them.
"""

import dataclasses
import glob
import hashlib
import json
import os
import shutil

import numpy as np

from . import _provenance

_PROGRESS = "progress"
_PACKAGES = ("diffsim", "jax", "jaxlib", "diffrax", "equinox", "numpy", "xarray", "zarr")


class SweepStoreError(ValueError):
    """A sweep store cannot be used for this sweep (written by a different config, or damaged)."""


@dataclasses.dataclass(frozen=True)
class Variable:
    """One array of the store: dims, full shape, zarr chunk shape, dtype and fill value; `values`
    are written at creation (coordinates), the others chunk by chunk."""

    name: str
    dims: tuple[str, ...]
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dtype: np.dtype
    fill_value: object
    attrs: dict = dataclasses.field(default_factory=dict)
    values: np.ndarray | None = None


def fill_value(dtype):
    """What a variable holds where nothing was computed (and, for outputs, where a member
    failed): NaN for floats, -1 for signed integers, the largest value for unsigned ones, False
    for booleans."""
    dtype = np.dtype(dtype)
    if np.issubdtype(dtype, np.inexact):
        return np.nan
    if dtype == np.bool_:
        return False
    if np.issubdtype(dtype, np.unsignedinteger):
        return np.iinfo(dtype).max
    if np.issubdtype(dtype, np.integer):
        return -1
    return ""


def config_digest(config: dict) -> str:
    return hashlib.sha256(canonical_json(config).encode()).hexdigest()


def canonical_json(config: dict) -> str:
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def provenance() -> dict:
    """Attributes that say what produced a store: package versions, git commit, machine."""
    versions = _provenance.package_versions(_PACKAGES)
    host = _provenance.machine()
    return {
        "package_versions": json.dumps(versions, sort_keys=True),
        "git_commit": _provenance.git_commit(),
        "python": host["python"],
        "device_kind": host["device_kind"],
        "device_count": host["device_count"],
        "process_count": host["process_count"],
    }


def create(path: str, variables: list[Variable], attrs: dict) -> None:
    """Create the store at `path` with every variable allocated (unwritten chunks read as their
    fill value) and the coordinates written. Built in a temporary folder and renamed into place,
    so an interrupted creation never leaves a half-made store at `path`."""
    import zarr

    for stale in glob.glob(glob.escape(path) + ".creating-*"):  # from a killed creation
        shutil.rmtree(stale, ignore_errors=True)
    temporary = f"{path}.creating-{os.getpid()}"
    group = zarr.open_group(temporary, mode="w-", zarr_format=3)
    # xarray reads the CF "coordinates" attribute to restore coordinates that are not indexes
    # (sampled parameters along `sample`, grid axes with vector values)
    extra = " ".join(v.name for v in variables if v.values is not None and v.dims != (v.name,))
    for v in variables:
        array_attrs = dict(v.attrs)
        if v.values is None and extra:
            array_attrs["coordinates"] = extra
        array = group.create_array(
            v.name,
            shape=v.shape,
            chunks=v.chunks,
            dtype=v.dtype,
            fill_value=v.fill_value,
            dimension_names=v.dims,
            attributes=array_attrs,
        )
        if v.values is not None:
            array[...] = v.values
    group.create_group(_PROGRESS)
    group.attrs.update(attrs)
    os.rename(temporary, path)


def read_attrs(path: str) -> dict:
    import zarr

    try:
        return dict(zarr.open_group(path, mode="r").attrs)
    except Exception as error:  # zarr raises several types for a folder that is not a group
        raise SweepStoreError(
            f"{path!r} exists but is not a sweep store ({type(error).__name__}: {error}); "
            "choose another path or delete it"
        ) from None


def check_is_sweep(path: str) -> dict:
    """The attributes of the sweep store at `path`, or an error saying it is not one."""
    attrs = read_attrs(path)
    if "sweep_config" not in attrs:
        raise SweepStoreError(
            f"{path!r} exists but holds no sweep config, so it was not written by ds.sweep; "
            "choose another path or delete it"
        )
    return attrs


def check_matches(path: str, config: dict) -> None:
    """Refuse to resume a store written by a different sweep, naming what differs."""
    attrs = check_is_sweep(path)
    if attrs.get("sweep_config_sha256") == config_digest(config):
        return
    stored = json.loads(attrs["sweep_config"])
    differing = sorted(k for k in set(stored) | set(config) if stored.get(k) != config.get(k))
    details = "; ".join(
        f"{k}: stored {_clip(stored.get(k))}, now {_clip(config.get(k))}" for k in differing
    )
    raise SweepStoreError(
        f"the store {path!r} was written by a different sweep, so resuming would mix results. "
        f"Differences: {details}. Use a new store path, or delete the old store to start over."
    )


def _clip(value, limit: int = 160) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[:limit] + "…"


def open_group(path: str):
    import zarr

    return zarr.open_group(path, mode="r+")


def write_chunk(group, region: tuple[slice, ...], outputs: dict[str, np.ndarray]) -> None:
    """Write one sweep chunk: `region` selects its members (aligned to the zarr chunks)."""
    for name, values in outputs.items():
        group[name][region] = values


def mark_done(path: str, chunk: int) -> None:
    marker = os.path.join(path, _PROGRESS, f"{chunk}.done")
    temporary = f"{marker}.{os.getpid()}.tmp"
    with open(temporary, "w"):
        pass
    os.replace(temporary, marker)


def done_chunks(path: str) -> set[int]:
    folder = os.path.join(path, _PROGRESS)
    if not os.path.isdir(folder):
        return set()
    return {int(name[: -len(".done")]) for name in os.listdir(folder) if name.endswith(".done")}


def open_dataset(path: str):
    """The store as an `xarray.Dataset` whose variables are read lazily from disk."""
    import xarray as xr

    return xr.open_dataset(path, engine="zarr", chunks=None, consolidated=False)
