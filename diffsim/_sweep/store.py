"""The zarr store behind a sweep: layout, provenance, chunk-aligned writes and resume markers.

One sweep chunk (a block of members) is exactly one zarr chunk of every per-member variable, so
each chunk file has a single writer even when many processes share the store. A chunk counts as
done only once its marker file exists; the marker is written after the data, by an atomic
rename, so a run killed at any moment leaves either a complete, marked chunk or one that the
next run recomputes. Markers live in the `progress` group of the store.

zarr and xarray are imported here, lazily, so that the rest of diffsim runs without them.
"""

import dataclasses
import errno
import glob
import hashlib
import json
import os
import shutil
import socket

import numpy as np

from .. import _provenance
from .._validate import check_can_write, user_path

_PROGRESS = "progress"
_PACKAGES = ("diffsim", "jax", "jaxlib", "diffrax", "equinox", "numpy", "xarray", "zarr")


class SweepStoreError(ValueError):
    """A sweep store cannot be used for this sweep (written by a different config, damaged,
    not writable, out of space, or changed by someone else while the sweep ran). The message
    names the path, the cause and what to do."""


def fault(path: str, error: BaseException, doing: str) -> SweepStoreError:
    """A file-system fault of the store at `path` while `doing` something, as the error a
    user can act on: path, cause, remedy."""
    cause = f"{type(error).__name__}: {getattr(error, 'strerror', None) or error}"
    number = getattr(error, "errno", None)
    if number == errno.ENOSPC or number == errno.EDQUOT:
        remedy = (
            "free space (or choose a store on another disk) and run the sweep again: it "
            "resumes from the chunks already finished (diffsim sweep --resume)"
        )
    elif number in (errno.EROFS, errno.EACCES, errno.EPERM):
        remedy = "choose a store path where you can write (--store), or fix the permissions"
    elif doing == "checking that it can be written":  # nothing of it is in use yet
        remedy = (
            "the store cannot be created there (a missing or special folder, or a file in "
            "its way): choose a store path in a folder you can write to (--store)"
        )
    elif isinstance(error, (FileNotFoundError, KeyError, NotADirectoryError)):
        remedy = (
            "the store (or part of it) was removed or replaced while in use: delete what is "
            "left of it and start over, since its finished chunks can no longer be trusted"
        )
    else:
        remedy = "check the disk and the path, then run the sweep again"
    return SweepStoreError(f"the sweep store {path!r} failed while {doing} ({cause}): {remedy}")


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


def normalize_path(store) -> str:
    """A store path as given by a user: `~` expanded, a trailing separator dropped; an empty
    path, or one with a NUL character, refused."""
    if not isinstance(store, (str, os.PathLike)):
        raise TypeError(f"store must be a path (str or os.PathLike), got {store!r}")
    if not os.fsdecode(os.fspath(store)).strip():
        raise ValueError("store is an empty path: name the zarr store, e.g. 'out/sweep.zarr'")
    return os.path.normpath(user_path(store, "store"))


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


_PROVENANCE_KEYS = (
    "git_commit",
    "package_versions",
    "device_kind",
    "device_count",
    "process_count",
)


def record_resume(group, attrs: dict, chunks_done: int) -> None:
    """Append this run's provenance (`_PROVENANCE_KEYS` of `attrs`), the time and the count of
    chunks already finished to the store's `resumes` attribute (a JSON list, oldest first)."""
    import datetime

    try:
        runs = json.loads(group.attrs.get("resumes", "[]"))
    except (TypeError, ValueError):  # edited by hand into something else: start the list anew
        runs = []
    if not isinstance(runs, list):
        runs = []
    run = {key: attrs[key] for key in _PROVENANCE_KEYS}
    run["started"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    run["chunks_done_before"] = chunks_done
    group.attrs["resumes"] = json.dumps(runs + [run], sort_keys=True)


def create(path: str, variables: list[Variable], attrs: dict) -> None:
    """Create the store at `path` with every variable allocated (unwritten chunks read as their
    fill value) and the coordinates written. Built in a temporary folder and renamed into place,
    so an interrupted creation never leaves a half-made store at `path`; when another run
    creates the same store at the same moment, this one stops with `SweepStoreError` and
    leaves no temporary folder."""
    import zarr

    _remove_stale_creations(path)
    temporary = f"{path}.creating-{_creator()}"
    try:
        group = zarr.open_group(temporary, mode="w-", zarr_format=3)
        # xarray reads the CF "coordinates" attribute to restore coordinates that are not
        # indexes (sampled parameters along `sample`, grid axes with vector values)
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
    except OSError as error:
        shutil.rmtree(temporary, ignore_errors=True)
        if os.path.exists(path):  # another run made it first (rename onto a full folder)
            raise SweepStoreError(
                f"another run created the sweep store {path!r} at the same moment as this one; "
                "this run stops rather than compute the same chunks twice. Run the sweep again "
                "(diffsim sweep --resume): it computes what the other run has not finished"
            ) from None
        raise fault(path, error, "being created") from None


def _creator() -> str:
    """Who creates a store: host and process, so that a stale temporary folder of a killed
    creation can be told from one that another live process is still filling."""
    return f"{socket.gethostname()}-{os.getpid()}"


def _remove_stale_creations(path: str) -> None:
    """Remove temporary folders of creations killed on this host (their process is gone)."""
    host = socket.gethostname()
    for stale in glob.glob(glob.escape(path) + ".creating-*"):
        owner = stale.rsplit(".creating-", 1)[1]
        name, _, pid = owner.rpartition("-")
        if name == host and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def check_writable(path: str) -> None:
    """Before any member is computed: the store (or, for a new one, its parent folder) can be
    written. Raises `SweepStoreError` naming the path and the cause."""
    folder = (
        os.path.join(path, _PROGRESS)
        if os.path.exists(path)
        else (os.path.dirname(os.path.abspath(path)))
    )
    if not os.path.exists(path):
        if os.path.exists(folder) and not os.path.isdir(folder):
            raise SweepStoreError(
                f"cannot create the sweep store {path!r}: {folder!r} is a file, not a folder"
            )
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as error:
            raise fault(path, error, "creating the folder that will hold it") from None
    try:
        check_can_write(folder)
    except OSError as error:
        raise fault(path, error, "checking that it can be written") from None


def check_layout(path: str, variables: list[Variable]) -> None:
    """A store about to be resumed holds every variable of the sweep with its shape and dtype
    (a folder deleted by hand, or a store cut short, is refused before anything runs)."""
    import zarr

    try:
        group = zarr.open_group(path, mode="r")
        for v in variables:
            array = group[v.name]
            if tuple(array.shape) != tuple(v.shape) or np.dtype(array.dtype) != np.dtype(v.dtype):
                raise SweepStoreError(
                    f"the sweep store {path!r} is damaged: its variable {v.name!r} has shape "
                    f"{tuple(array.shape)} and dtype {array.dtype}, this sweep writes "
                    f"{tuple(v.shape)} {np.dtype(v.dtype)}. Delete the store and start over"
                )
    except SweepStoreError:
        raise
    except (KeyError, FileNotFoundError) as error:
        raise SweepStoreError(
            f"the sweep store {path!r} is damaged: {error} is missing (deleted by hand?). "
            "Delete the store and start over"
        ) from None
    except Exception as error:  # zarr raises several types for unreadable metadata
        raise fault(path, error, "being checked before resuming") from None


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
    try:
        stored = json.loads(attrs["sweep_config"])
    except (TypeError, ValueError):
        raise SweepStoreError(
            f"the sweep store {path!r} is damaged: its sweep_config attribute is not valid "
            "JSON, so it cannot be checked against this sweep. Delete the store and start over"
        ) from None
    if not isinstance(stored, dict):
        stored = {}
    details = "; ".join(
        f"{where}: stored {_clip(old)}, now {_clip(new)}"
        for where, old, new in _differences(stored, config)
    )
    raise SweepStoreError(
        f"the store {path!r} was written by a different sweep, so resuming would mix results. "
        f"Differences: {details}. Use a new store path, or delete the old store to start over."
    )


def _differences(stored, now, where: str = "", limit: int = 8) -> list:
    """(path, stored value, new value) of what differs, at the deepest level where it does (a
    changed axis is named by its path, e.g. `axes.omega.sha256`, not by two configs clipped
    at the same prefix)."""
    if isinstance(stored, dict) and isinstance(now, dict):
        found = []
        for key in sorted(set(stored) | set(now)):
            path = f"{where}.{key}" if where else str(key)
            if key not in stored or key not in now:
                found.append((path, stored.get(key, "(none)"), now.get(key, "(none)")))
            elif stored[key] != now[key]:
                found += _differences(stored[key], now[key], path, limit)
        return found[:limit]
    return [(where or "config", stored, now)]


def _clip(value, limit: int = 160) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[:limit] + "…"


def open_group(path: str):
    import zarr

    try:
        return zarr.open_group(path, mode="r+")
    except Exception as error:  # zarr raises several types for a store it cannot open
        raise fault(path, error, "being opened for writing") from None


def write_chunk(path: str, group, region: tuple[slice, ...], outputs: dict, chunk: int) -> None:
    """Write one sweep chunk (`region` selects its members, aligned to the zarr chunks), then
    its marker. A file-system fault becomes `SweepStoreError` (path, cause, remedy)."""
    try:
        if not os.path.isdir(os.path.join(path, _PROGRESS)):
            raise FileNotFoundError(errno.ENOENT, "the store's progress folder is gone", path)
        for name, values in outputs.items():
            group[name][region] = values
        _mark_done(path, chunk)
    except (OSError, KeyError) as error:
        raise fault(path, error, f"writing chunk {chunk}") from None


def _mark_done(path: str, chunk: int) -> None:
    marker = os.path.join(path, _PROGRESS, f"{chunk}.done")
    temporary = f"{marker}.{os.getpid()}.tmp"
    try:
        with open(temporary, "w"):
            pass
        os.replace(temporary, marker)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def done_chunks(path: str) -> set[int]:
    folder = os.path.join(path, _PROGRESS)
    if not os.path.isdir(folder):
        return set()
    # only the markers this module writes (<chunk>.done); any other file there is no marker
    names = (name[: -len(".done")] for name in os.listdir(folder) if name.endswith(".done"))
    return {int(name) for name in names if name.isdigit()}


def open_dataset(path: str):
    """The store as an `xarray.Dataset` whose variables are read lazily from disk."""
    import xarray as xr

    return xr.open_dataset(path, engine="zarr", chunks=None, consolidated=False)
