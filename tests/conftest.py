import atexit
import gc
import os
import shutil
import tempfile

import jax
import pytest

# A test run keeps its compiled programs in a fresh folder of its own, made by the first pytest
# process before diffsim is imported (which turns the cache on) and inherited by the xdist
# workers: a test that compiles a program another test compiled loads it instead, and nothing
# is read from or left in the user's own cache. The folder is removed at exit. A
# DIFFSIM_CACHE_DIR or DIFFSIM_CACHE set by the caller is kept.
if "DIFFSIM_CACHE_DIR" not in os.environ and "DIFFSIM_CACHE" not in os.environ:
    _folder = tempfile.mkdtemp(prefix="diffsim-xla-tests-")
    os.environ["DIFFSIM_CACHE_DIR"] = _folder
    atexit.register(shutil.rmtree, _folder, ignore_errors=True)

# Compilation is most of this suite's time. XLA:CPU's older (non-fusion) emitters compile about a
# third faster at run times within ±10% (docs/howto/avoid-recompilation.md, "XLA options on
# CPU"); measured on the full suite with 2 workers: 13 min 33 s -> 10 min 20 s. The
# numbers a test checks do not depend on the emitter: every tolerance is a solver's or a
# statistic's, far above rounding. Set before any computation starts the backend; the
# caller's XLA_FLAGS are kept, and reproduce / bench in CI run with XLA's defaults. Measured
# and not kept (single full runs, 2 workers; 15 min 25 s with this flag alone):
# --xla_backend_optimization_level=0 compiles the derivative and training tests a third faster
# but runs the sampling and fitting pages slower (15 min 14 s in all) and changes round-off
# between a vmapped and an unbatched program (two bit-for-bit tests fail);
# --xla_llvm_disable_expensive_passes=true, 6 % faster on those two files, 17 min 33 s in all.
if "xla_cpu_use_fusion_emitters" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_cpu_use_fusion_emitters=false"
    ).strip()

# Reference comparisons need float64; strict promotion turns any silent float64/float32 mixing in
# the library into an error instead of a quiet upcast, and raised rank promotion any implicit
# broadcast of a (n,) against a (1, n) or (m, 1) array (a shape bug that would otherwise pass).
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")


# Every program XLA:CPU loads stays mapped until JAX drops it: a Rosenbrock solve adds ~200
# memory mappings, and one worker running half the suite reached Linux's per-process limit
# (vm.max_map_count, 65,530), where the next compile, cache write or load died with a
# segfault (measured: 64,971 mappings just before the crash; CI and 4 of 9 local full runs
# crashed this way). So at the end of each test file, past 30,000 mappings, the compiled
# programs are dropped (a later test that needs one loads it from the cache folder above). Not
# between the tests of one file: its fixtures may hold programs its tests expect to find
# compiled (test_compile.py counts compilations after a warm-up), and one file adds far fewer
# than the 35,000 left (peak measured: 35,757).
_MAPPINGS = "/proc/self/maps"
_MAX_MAPPINGS = 30_000


def _mappings() -> int:
    with open(_MAPPINGS, "rb") as maps:
        return maps.read().count(b"\n")


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    if nextitem is not None and nextitem.path == item.path:
        return
    if os.path.exists(_MAPPINGS) and _mappings() > _MAX_MAPPINGS:
        jax.clear_caches()
        gc.collect()


@pytest.fixture
def getkey():
    """Fresh PRNG keys on demand, seeded so that every run is reproducible."""
    counter = iter(range(1_000_000))
    base = jax.random.key(0)
    return lambda: jax.random.fold_in(base, next(counter))
