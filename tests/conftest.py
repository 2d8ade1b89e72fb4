import jax
import pytest

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
