"""A persistent compilation cache for diffsim's programs, on by default.

A scientist's script runs once, so compilation is most of its wall time; JAX can keep compiled
programs on disk and load them in the next process instead of compiling again. diffsim turns
that on at import, in a per-user folder (`platformdirs.user_cache_dir("diffsim")/xla`), unless:

- `DIFFSIM_CACHE=off` (or `0`, `false`, `no`, `disabled`) is set, or `ds.config(cache=False)`
  is called (a value it does not understand warns and leaves the cache off);
- JAX's cache was configured already (`jax_compilation_cache_dir` or
  `JAX_COMPILATION_CACHE_DIR`): the user's own setting is kept as it is.

`DIFFSIM_CACHE_DIR` (or `ds.config(cache_dir=...)`) moves it, e.g. to a folder that every job
of a sweep on a cluster shares. Sharing is safe: the cache is bounded (2 GiB, least recently
used entries evicted) and entries are read and written under a file lock, and of several
`jax.distributed` processes only the first writes. A folder that cannot be created or written
warns once and the process runs uncached; an entry that cannot be read is compiled again (JAX
warns). Programs that carry host callbacks are never stored (JAX refuses them), which is why
diffsim's solves and fits keep checks out of their compiled programs. Only programs that took at
least 0.1 s to compile are stored.

Why not leave it to the user: JAX's cache is off by default, and a newcomer meets a 5–15 s wait
in every fresh process that the cache reduces to loading a file.
"""

import os
import uuid
from pathlib import Path

import jax

from ._warn import warn

_MAX_BYTES = 2 * 2**30
_MIN_COMPILE_SECONDS = 0.1
_OFF = ("0", "off", "false", "no", "disable", "disabled", "none")
_ON = ("", "1", "on", "true", "yes", "enable", "enabled")

# what diffsim set (None: not enabled by diffsim, e.g. off or left to the user's own setting)
_state = {"dir": None, "reason": "not set up"}


def default_dir() -> Path:
    """The per-user cache folder, or `DIFFSIM_CACHE_DIR` when set."""
    given = os.environ.get("DIFFSIM_CACHE_DIR")
    if given:
        return Path(given).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("diffsim")) / "xla"


def _writable(folder: Path) -> str | None:
    """None if `folder` can hold cache entries, else why not."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".probe-{uuid.uuid4().hex}"
        probe.write_bytes(b"ok")
        good = probe.read_bytes() == b"ok"
        probe.unlink()
    except OSError as error:
        return f"{type(error).__name__}: {error}"
    return None if good else "a file written there did not read back"


def enable(folder=None) -> bool:
    """Store compiled programs in `folder` (default `default_dir()`); returns whether the cache
    is on. A folder that cannot be written warns once and leaves the cache off."""
    folder = default_dir() if folder is None else Path(folder).expanduser()
    problem = _writable(folder)
    if problem is not None:
        warn(
            f"diffsim's compilation cache folder {folder} cannot be used ({problem}); running "
            "without the cache. Set DIFFSIM_CACHE_DIR to a writable folder, or "
            "DIFFSIM_CACHE=off to silence this",
            RuntimeWarning,
        )
        disable(reason=f"{folder} cannot be used ({problem})")
        return False
    _reset_jax_cache()
    jax.config.update("jax_compilation_cache_dir", str(folder))
    try:  # the bound (and the file lock that comes with it) needs filelock, a dependency
        import filelock  # noqa: F401

        jax.config.update("jax_compilation_cache_max_size", _MAX_BYTES)
    except ImportError:
        pass
    if jax.config.jax_persistent_cache_min_compile_time_secs == 1.0:  # JAX's default
        jax.config.update("jax_persistent_cache_min_compile_time_secs", _MIN_COMPILE_SECONDS)
    _state.update(dir=str(folder), reason="on")
    return True


def disable(reason: str = "off (ds.config(cache=False))") -> None:
    """Stop storing and loading compiled programs (only a cache diffsim itself set up)."""
    if _state["dir"] is not None:
        _reset_jax_cache()
        jax.config.update("jax_compilation_cache_dir", None)
    _state.update(dir=None, reason=reason)


def _reset_jax_cache() -> None:
    # JAX opens its cache once, at the first compilation with a folder set; a new folder
    # takes effect only after this
    from jax.experimental.compilation_cache import compilation_cache

    compilation_cache.reset_cache()


def setup_at_import() -> None:
    """The import-time default (see the module docstring)."""
    setting = os.environ.get("DIFFSIM_CACHE", "").strip().lower()
    if setting not in _OFF + _ON:
        warn(
            f"DIFFSIM_CACHE={os.environ['DIFFSIM_CACHE']!r} is not understood (use 'off' or "
            "'on'; DIFFSIM_CACHE_DIR names the folder): diffsim's compilation cache is off",
            RuntimeWarning,
        )
        _state.update(reason=f"off (DIFFSIM_CACHE={os.environ['DIFFSIM_CACHE']!r} not understood)")
        return
    if setting in _OFF:
        _state.update(reason="off (DIFFSIM_CACHE)")
        return
    if jax.config.jax_compilation_cache_dir:
        _state.update(reason=f"JAX's own setting kept: {jax.config.jax_compilation_cache_dir}")
        return
    enable()


def describe() -> str:
    """One line for `diffsim info`: where the cache is, or why it is off."""
    if _state["dir"] is None:
        return _state["reason"]
    folder = Path(_state["dir"])
    entries = list(folder.glob("*-cache"))
    size = sum(entry.stat().st_size for entry in entries) / 2**20
    return f"{folder} ({len(entries)} programs, {size:.1f} MiB of {_MAX_BYTES // 2**30} GiB)"


def config(*, cache: bool | None = None, cache_dir=None) -> dict:
    """diffsim's settings: `ds.config(cache=False)` stops the persistent compilation cache for
    this process, `ds.config(cache_dir="/shared/cache")` moves it (e.g. to a folder shared by
    every job of a sweep); `ds.config()` returns the current settings. Affects compilations
    from then on. The environment variables `DIFFSIM_CACHE=off` and `DIFFSIM_CACHE_DIR` set the
    same at import.

    **Raises:** `TypeError` when `cache` is not True, False or None (a string such as "no" is
    refused rather than read as true), or `cache_dir` is not a path; `ValueError` for
    `cache=False` with a `cache_dir` (which of the two is meant?)."""
    if cache is not None and not isinstance(cache, bool):
        raise TypeError(
            f"ds.config(cache=...) must be True, False or None, got {cache!r}; the environment "
            "variable DIFFSIM_CACHE takes text such as 'off'"
        )
    if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
        raise TypeError(f"ds.config(cache_dir=...) must be a path, got {cache_dir!r}")
    if cache_dir is not None and str(cache_dir).strip() == "":
        raise ValueError("ds.config(cache_dir=...) is empty: pass a folder")
    if cache is False and cache_dir is not None:
        raise ValueError(
            "ds.config(cache=False, cache_dir=...): a folder for a cache that is off; pass "
            "one of them"
        )
    if cache is False:
        disable()
    elif cache_dir is not None or cache:
        enable(cache_dir)
    return {"cache": _state["dir"] is not None, "cache_dir": _state["dir"], "why": _state["reason"]}
