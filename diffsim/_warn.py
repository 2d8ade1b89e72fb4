"""Warnings that point at the caller's line, however deep in diffsim they are raised."""

import os
import sys
import warnings
from pathlib import Path

_PACKAGE = str(Path(__file__).resolve().parent) + os.sep

# Libraries through which diffsim's own code runs (jit tracing, equinox's filters, diffrax's
# loop, the standard library's wrappers): their frames lie between diffsim's frames, not above
# the user's line.
_PASSED_THROUGH = frozenset(
    {"jax", "jaxlib", "equinox", "diffrax", "optimistix", "lineax", "optax", "contextlib"}
    | {"functools", "importlib"}
)


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """`warnings.warn` at the first frame that is neither diffsim's nor a library's it runs
    through: the user's line (or, under the user's `jit`, the line of their traced function
    that called diffsim). A fixed `stacklevel` points inside diffsim whenever a call path gains
    or loses a frame."""
    # Python 3.12's `skip_file_prefixes` skips files; 3.11 needs the walk
    frame, level = sys._getframe(1), 2  # level 1 is this function
    while frame is not None and _internal(frame):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def _internal(frame) -> bool:
    filename = frame.f_code.co_filename
    if filename.startswith("<frozen "):  # the import machinery, for a warning at import
        return True
    module = str(frame.f_globals.get("__name__", "")).partition(".")[0]
    return module in _PASSED_THROUGH or str(Path(filename).resolve()).startswith(_PACKAGE)
