"""What produced a result: package versions, git commit, machine and devices, file hashes.

Shared by sweep stores (their attributes) and experiment manifests (`manifest.json`).
"""

import hashlib
import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

PACKAGES = (
    "diffsim",
    "jax",
    "jaxlib",
    "diffrax",
    "equinox",
    "optimistix",
    "optax",
    "numpy",
    "matplotlib",
    "xarray",
    "zarr",
    "h5netcdf",
)


def package_versions(packages=PACKAGES) -> dict[str, str]:
    """Installed version of each package, or "not installed"."""
    versions = {}
    for package in packages:
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def git_commit(folder: str | Path | None = None, *paths: str | Path) -> str:
    """The commit of the git checkout holding `folder` (default: the working directory), with
    `+dirty` when tracked files have uncommitted changes or any of `paths` (e.g. the running
    script) is untracked or changed; "none" outside a checkout."""
    where = None if folder is None else str(folder)

    def git(*args):
        return subprocess.run(
            ["git", *args], capture_output=True, text=True, timeout=10, check=True, cwd=where
        ).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
        if paths:  # these count even when untracked: a new script is not in the commit
            dirty += git("status", "--porcelain", "--", *(str(Path(p).resolve()) for p in paths))
    except (OSError, subprocess.SubprocessError):
        return "none"
    return commit + ("+dirty" if dirty else "")


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict:
    """The host and JAX's devices: platform, device kind and count, process count, CPU."""
    import os

    import jax

    devices = jax.devices()
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "device_platform": devices[0].platform,
        "device_kind": devices[0].device_kind,
        "device_count": len(devices),
        "process_count": jax.process_count(),
    }


def sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def module_text(module) -> str:
    """A module (a solver, a model) as stable, readable text with its values, e.g.
    `Tsit5(rtol=1e-06, atol=1e-06)`: equinox's repr prints array fields as their shapes
    (`rtol=f64[]`), which loses what provenance is for. Arrays of more than 8 entries are
    given by shape only; functions by name."""
    import dataclasses

    import numpy as np

    def value(v):
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return module_text(v)
        if hasattr(v, "shape") and hasattr(v, "dtype"):
            a = np.asarray(v)
            if a.size > 8:
                return f"{a.dtype}{list(a.shape)}"
            return f"{a.item():.6g}" if a.ndim == 0 else str(np.round(a, 6).tolist())
        if callable(v):
            return getattr(v, "__qualname__", type(v).__name__)
        return repr(v)

    fields = (
        ", ".join(f"{f.name}={value(getattr(module, f.name))}" for f in dataclasses.fields(module))
        if dataclasses.is_dataclass(module)
        else ""
    )
    return f"{type(module).__name__}({fields})"
