import atexit
import os
import shutil
import tempfile

import jax
import pytest

# Each pytest process (each xdist worker) keeps its compiled programs in a fresh folder of its
# own (set before diffsim is imported, which turns the cache on): later tests that compile the
# same program load it instead of compiling again, and no process loads an executable another
# process is writing or wrote. A CI worker once died with a segfault inside jaxlib while the
# workers shared the user's cache folder (the same test passes on its own, compiled or
# loaded). The folder is removed at exit. A DIFFSIM_CACHE_DIR or DIFFSIM_CACHE set by the
# caller is kept.
if "DIFFSIM_CACHE_DIR" not in os.environ and "DIFFSIM_CACHE" not in os.environ:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    _folder = tempfile.mkdtemp(prefix=f"diffsim-xla-{worker}-")
    os.environ["DIFFSIM_CACHE_DIR"] = _folder
    atexit.register(shutil.rmtree, _folder, ignore_errors=True)

# Reference comparisons need float64; strict promotion turns any silent float64/float32 mixing in
# the library into an error instead of a quiet upcast, and raised rank promotion any implicit
# broadcast of a (n,) against a (1, n) or (m, 1) array (a shape bug that would otherwise pass).
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")


@pytest.fixture
def getkey():
    """Fresh PRNG keys on demand, seeded so that every run is reproducible."""
    counter = iter(range(1_000_000))
    base = jax.random.key(0)
    return lambda: jax.random.fold_in(base, next(counter))
