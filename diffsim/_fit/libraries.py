"""How `ds.sample` and `ds.Posterior` call the probabilistic libraries they build on
(numpyro, blackjax, ArviZ): imported when first needed, under the settings they are written
for. A leaf module: the sampler, the posterior and the figures all use it."""

import contextlib
import warnings

import jax


@contextlib.contextmanager
def third_party_promotion():
    """numpyro's distributions and blackjax's adaptation are written for JAX's standard dtype
    and rank promotion; a user who turned on strict promotion (a good check of their own
    code) would otherwise see their internals fail. Everything they trace runs inside this."""
    with jax.numpy_dtype_promotion("standard"), jax.numpy_rank_promotion("allow"):
        yield


def arviz():
    """ArviZ, imported when first needed (it takes seconds), without the notice of its coming
    1.0 refactor that its 0.x releases print at import (this project pins 0.x)."""
    with warnings.catch_warnings():
        # the notice begins with a newline, which a filter's ".*" does not cross
        warnings.filterwarnings("ignore", message=r"\s*ArviZ is undergoing a major refactor")
        import arviz as az
    return az
