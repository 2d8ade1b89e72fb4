"""The priors of `ds.sample`: which unknowns each covers, whether its support fits them, and the
log density of the priors in the sampler's unconstrained coordinates.

The distributions are numpyro's (`numpyro.distributions`), and so are the maps to unconstrained
coordinates (`biject_to(support)`) with their log-Jacobians: nothing here re-implements a
distribution or a transform. numpyro is imported only when a posterior is sampled.
"""

import math
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np


class Block(NamedTuple):
    """One prior and the entries of the flat unknown vector it covers (static)."""

    name: str  # the key in `priors`
    start: int  # the first entry in the flat vector (the block's entries are contiguous)
    shape: tuple[int, ...]  # the shape of one draw of the block (the prior's batch + event)

    @property
    def size(self) -> int:
        return math.prod(self.shape)


def blocks_for(priors, entries: tuple[str, ...], groups: dict[str, tuple[int, ...]]):
    """Match `priors` (name → distribution) to the flat unknowns.

    `entries` names each entry of the flat vector (as `ds.fit` names them, then the
    likelihood's parameters); `groups` maps a name that covers several contiguous entries (a
    vector parameter field, "sigma" with one entry per observable) to their indices. A prior is
    keyed by an entry's own name or by a group's name; every entry needs exactly one prior.
    Returns the blocks in the order of the flat vector and the distributions, each broadcast to
    its block's shape."""
    import numpyro.distributions as dist

    if not isinstance(priors, dict):
        raise TypeError(
            "priors must be a dict name -> numpyro distribution (e.g. {'alpha': "
            f"numpyro.distributions.LogNormal(0.0, 1.0)}}), got {type(priors).__name__}"
        )
    owner = {}
    blocks = []
    for name, prior in priors.items():
        if name in groups:
            indices = groups[name]
        elif name in entries:
            indices = (entries.index(name),)
        else:
            raise ValueError(
                f"priors names {name!r}, which is not an unknown of this problem; the unknowns "
                f"are {list(entries)}" + (f" (or the groups {list(groups)})" if groups else "")
            )
        if not isinstance(prior, dist.Distribution):
            raise TypeError(
                f"priors[{name!r}] must be a numpyro distribution (numpyro.distributions), got "
                f"{type(prior).__name__}"
            )
        for i in indices:
            if i in owner:
                raise ValueError(
                    f"{entries[i]} has two priors: {owner[i]!r} and {name!r}; give one of them"
                )
            owner[i] = name
        shape = _shape(name, prior, len(indices), name in groups, groups.get(name))
        blocks.append((indices[0], Block(name, indices[0], shape), _broadcast(prior, shape)))
    missing = [entries[i] for i in range(len(entries)) if i not in owner]
    if missing:
        raise ValueError(
            f"no prior for {missing}: ds.sample needs a prior for every unknown (e.g. "
            "priors={'" + missing[0] + "': numpyro.distributions.LogNormal(0.0, 1.0)})"
        )
    blocks.sort(key=lambda b: b[0])
    return tuple(b for _, b, _ in blocks), tuple(d for _, _, d in blocks)


def _shape(name, prior, count: int, grouped: bool, indices) -> tuple[int, ...]:
    full = tuple(prior.batch_shape) + tuple(prior.event_shape)
    if grouped and indices is not None and count > 1:
        if full == () or (full == (1,) and not prior.event_shape):
            return (count,)  # one scalar prior for every entry of the group, independently
        if math.prod(full) == count:
            return full
        raise ValueError(
            f"priors[{name!r}] has shape {full} (batch {tuple(prior.batch_shape)}, event "
            f"{tuple(prior.event_shape)}) but {name} has {count} entries: give a scalar prior "
            f"(the same for each) or one of {count} entries"
        )
    if math.prod(full) != 1:
        raise ValueError(
            f"priors[{name!r}] has shape {full}, but {name} is a single value: give a scalar "
            "distribution"
        )
    return full


def _broadcast(prior, shape):
    """A scalar prior expanded to a group's shape (independent entries)."""
    full = tuple(prior.batch_shape) + tuple(prior.event_shape)
    return prior if full == shape else prior.expand(shape)


def check_supports(blocks, distributions, lower: np.ndarray, upper: np.ndarray) -> None:
    """Each prior must be continuous, keep its draws inside the unknown's own domain (a
    positive rate cannot take a prior that puts mass on negative values), and map to
    unconstrained coordinates of the same size."""
    import numpyro.distributions as dist
    from numpyro.distributions.transforms import biject_to

    for block, prior in zip(blocks, distributions):
        if isinstance(prior, dist.ImproperUniform):
            raise ValueError(
                f"priors[{block.name!r}] is improper ({type(prior).__name__}): the chains start "
                "from draws of the priors, and an improper one has none; give a proper "
                "distribution (a wide one if you mean 'uninformative', e.g. LogNormal(0, 3) for "
                "a positive unknown)"
            )
        support = prior.support
        if support.is_discrete:
            raise ValueError(
                f"priors[{block.name!r}] is discrete ({type(prior).__name__}); the unknowns "
                "are continuous: give a continuous distribution"
            )
        base = support
        while hasattr(base, "base_constraint"):
            base = base.base_constraint
        low = np.broadcast_to(
            np.asarray(getattr(base, "lower_bound", -np.inf), float), block.shape
        ).ravel()
        high = np.broadcast_to(
            np.asarray(getattr(base, "upper_bound", np.inf), float), block.shape
        ).ravel()
        span = slice(block.start, block.start + block.size)
        domain_low, domain_high = lower[span], upper[span]
        outside = (low < domain_low) | (high > domain_high)
        if np.any(outside):
            k = int(np.argmax(outside))
            raise ValueError(
                f"priors[{block.name!r}] ({type(prior).__name__}) has support "
                f"[{low[k]:g}, {high[k]:g}], but {block.name} must lie in "
                f"({domain_low[k]:g}, {domain_high[k]:g}): give a prior on that range (for a "
                "positive unknown e.g. LogNormal, HalfNormal, or TruncatedNormal(..., low=0))"
            )
        transform = biject_to(support)
        if tuple(transform.inverse_shape(block.shape)) != block.shape:
            raise ValueError(
                f"priors[{block.name!r}] has a support ({support}) whose unconstrained "
                "coordinates have another size than its draws; ds.sample takes priors on "
                "independent real values"
            )


def transforms(distributions):
    """numpyro's bijections from unconstrained coordinates onto each prior's support."""
    from numpyro.distributions.transforms import biject_to

    return tuple(biject_to(d.support) for d in distributions)


def log_prior(u, blocks, distributions, maps):
    """Natural values θ (flat) and the log density of the priors at unconstrained `u` (flat),
    the log-Jacobian of the map u → θ included."""
    values, total = [], jnp.zeros((), u.dtype)
    for block, prior, transform in zip(blocks, distributions, maps):
        x_u = u[block.start : block.start + block.size].reshape(block.shape)
        x = transform(x_u)
        total = total + jnp.sum(prior.log_prob(x))
        total = total + jnp.sum(transform.log_abs_det_jacobian(x_u, x))
        values.append(jnp.ravel(x))
    return jnp.concatenate(values), total


def to_unconstrained(theta, blocks, maps):
    """Natural θ (flat) → unconstrained u (flat); NaN where θ is outside a prior's support."""
    pieces = []
    for block, transform in zip(blocks, maps):
        x = theta[block.start : block.start + block.size].reshape(block.shape)
        pieces.append(jnp.ravel(transform.inv(x)))
    return jnp.concatenate(pieces)


def describe(prior) -> str:
    """A prior as stable text (its class and parameters, e.g. `LeftTruncatedDistribution(
    Normal(loc=1, scale=0.5), low=0)`) for provenance: numpyro's `repr` holds an object
    address, which changes from run to run."""
    args = []
    base = getattr(prior, "base_dist", None)
    own = set(getattr(prior, "arg_constraints", {})) - {"low", "high"}
    if base is not None and not own:  # a wrapper (truncated, expanded): what it wraps
        args.append(describe(base))
    for key in getattr(prior, "arg_constraints", {}):
        value = getattr(prior, key, None)
        if value is not None:
            values = np.asarray(value, dtype=float)
            text = f"{float(values):.6g}" if values.ndim == 0 else str(values.round(6).tolist())
            args.append(f"{key}={text}")
    if base is not None and tuple(prior.batch_shape) != tuple(base.batch_shape):
        args.append(f"shape={tuple(prior.batch_shape)}")
    return f"{type(prior).__name__}({', '.join(args)})"
