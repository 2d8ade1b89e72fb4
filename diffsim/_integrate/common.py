"""Pieces shared by the fixed-step, adaptive and event loops of `simulate`: the traced input
guard, masking of failed members, and the blocked (checkpointed) step loop."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax

from .._parameter import constraints_hold, replace_unconstrained_parameters
from .._results import RESULTS
from .._validate import all_finite
from .families import Solved


def guard_inputs(model, y0, ts, extra=True):
    """Traced check of what could not be checked in Python because it was traced, and the inputs
    a failing member runs with instead: harmless values, so that it cannot stall a batch (its
    outputs are set to NaN afterwards and its result code says why).

    Each input is replaced on its own, only where it is itself bad (a non-finite entry, a
    parameter that breaks its constraint, times that do not increase): a check that spanned
    all inputs would turn parameters shared by a whole `vmap` batch into per-member arrays, and
    every step would pay for that. Entry by entry, not leaf by leaf: XLA copied a leaf's
    all-finite test into every fused computation that read the leaf (an SBML model of 94
    scalar parameters: 16% of its compiled log-likelihood, Zheng's, which now compiles in
    7.9-9.0 s, was 9.0-10.9)."""
    # an open end (ts[-1] = inf) is allowed: simulate checked that a terminal event ends it
    finite = jnp.all(jnp.isfinite(ts[:-1])) & ~jnp.isnan(ts[-1]) & (ts[-1] > -jnp.inf)
    increasing = jnp.all(jnp.diff(ts) > 0) & finite
    valid = all_finite(model) & constraints_hold(model) & all_finite(y0) & increasing & extra
    ts = jnp.where(increasing, ts, jnp.arange(ts.shape[0], dtype=ts.dtype))
    return valid, _sanitize_model(model), _sanitize(y0, 0.0), ts


def _sanitize_model(model):
    model = replace_unconstrained_parameters(model, 1.0)
    return _sanitize(model, 1.0)


def _sanitize(tree, fill):
    def leaf(x):
        if eqx.is_array(x) and jnp.issubdtype(x.dtype, jnp.inexact):
            return jnp.where(jnp.isfinite(x), x, jnp.asarray(fill, x.dtype))
        return x

    return jax.tree.map(leaf, tree)


def mask_invalid(valid, ys):
    return jax.tree.map(lambda y: jnp.where(valid, y, jnp.nan), ys)


def advance(one_step, y, steps: int, block: int | None, unroll: int = 1):
    """Apply `one_step(j, y)` for j = 0 .. steps-1. With `block`, long runs are cut into blocks of
    `block` steps under `jax.checkpoint`: reverse mode then stores one state per block and
    recomputes each block's steps once, so memory grows like steps/block + block (O(sqrt(steps))
    for block ~ sqrt(steps)) instead of like steps. `unroll` steps are one loop iteration."""
    if block is None or steps <= block:
        return lax.fori_loop(0, steps, one_step, y, unroll=min(unroll, max(steps, 1)))
    n_blocks, rest = divmod(steps, block)

    @jax.checkpoint
    def run_block(y, first):
        step = lambda i, y: one_step(first + i, y)  # noqa: E731
        return lax.fori_loop(0, block, step, y, unroll=min(unroll, block)), None

    y, _ = lax.scan(run_block, y, jnp.arange(n_blocks, dtype=jnp.int32) * block)
    if rest:
        tail = jax.checkpoint(
            lambda y: lax.fori_loop(n_blocks * block, steps, one_step, y, unroll=min(unroll, rest))
        )
        y = tail(y)
    return y


# Steps per iteration of a fixed-step loop on a GPU. There each loop iteration costs kernel
# launches (~8-14 us per step of a small ensemble, whatever its size up to ~2^17 members), so
# several steps per iteration pay: in `experiments/bench/gpu.sh` on an H200 the hand-written RK4
# ensemble of 4,096 Lorenz members ran 1,000 steps in 13.9 ms at unroll 1, 4.0 ms at 2, 3.5 ms at
# 4, 3.7 ms at 8 (Tsit5's tableau: 8.3, 6.1, 5.9, 5.7 ms), compiling in 0.17-0.25 s; diffsim's own
# loop at 4 then ran 3.3 / 4.8 / 16.5 ms at 2^12 / 2^15 / 2^19 members (21.4 / 7.8 / 20.5 ms at 1;
# compile 0.47 s against 0.24 s). On a CPU the same unrolling made it slower (XLA's CPU backend
# already runs the loop body as one function), so there it stays 1.
_GPU_UNROLL = 4


def loop_unroll() -> int:
    """How many fixed steps one loop iteration takes on the default backend."""
    return _GPU_UNROLL if jax.default_backend() == "gpu" else 1


def nonfinite_code(ys):
    finite = all_finite(ys)
    return jnp.where(finite, RESULTS.successful, RESULTS.nonfinite_state).astype(jnp.int32)


def leading_mask(mask, y):
    """A mask over the leading (time) axis of `y`, shaped to broadcast against it."""
    return mask.reshape(mask.shape + (1,) * (y.ndim - 1))


def events_result(valid, ys, reached, code):
    """The result code of a solve with events: states count as non-finite only at output times
    that were reached (later ones are NaN by design), and a failure already coded stands."""
    finite = jnp.all(
        jnp.stack(
            [
                jnp.all(jnp.where(leading_mask(reached, y), jnp.isfinite(y), True))
                for y in jax.tree.leaves(ys)
            ]
        )
    )
    code = jnp.where((code == RESULTS.successful) & ~finite, RESULTS.nonfinite_state, code)
    return jnp.where(valid, code, RESULTS.invalid_input).astype(jnp.int32)


def scale_of_times(ts):
    """The magnitude of the times of a solve, which sets the round-off an event's condition
    carries (`_events.restart_value`): the largest of |t1| and the span; with an open end
    (ts[-1] = inf) the last finite time's, and at least 1."""
    t0, t1 = ts[0], ts[-1]
    if ts.shape[0] > 2:
        last = jnp.where(jnp.isfinite(t1), t1, ts[-2])
    else:
        last = jnp.where(jnp.isfinite(t1), t1, t0)
    scale = jnp.maximum(jnp.abs(last), last - t0)
    return jnp.where(jnp.isfinite(t1), scale, jnp.maximum(scale, 1.0))


def plain_solved(valid, ys, code, stats) -> Solved:
    """A solve without events as `simulate` takes it: a non-finite output turns success into
    `nonfinite_state`, and a member whose inputs failed the traced guard (`valid` False) gets
    NaN outputs and `invalid_input`."""
    code = jnp.where(code == RESULTS.successful, nonfinite_code(ys), code)
    result = jnp.where(valid, code, RESULTS.invalid_input).astype(jnp.int32)
    return Solved(mask_invalid(valid, ys), stats, result)


def events_solved(valid, ys, reached, code, stats, records) -> Solved:
    """A solve with events as `simulate` takes it (`events_result`, `mask_invalid`), its
    occurrences counted in `stats["num_events"]`."""
    return Solved(
        ys=mask_invalid(valid, ys),
        stats=dict(stats, num_events=jnp.sum(records.counts, dtype=jnp.int32)),
        result=events_result(valid, ys, reached, code),
        reached=reached & valid,
        records=records,
    )


def cast_floats(tree, dtype):
    """Every floating array of `tree` in `dtype` (a model's parameters in its state's precision:
    the solve computes in the dtype of `y0`)."""

    def cast(x):
        if eqx.is_array(x) and jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype:
            return x.astype(dtype)
        return x

    return jax.tree.map(cast, tree)
