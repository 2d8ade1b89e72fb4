"""Early exit against a fixed horizon for batched simulators whose members stop at different times.

A batch of members each runs a small stochastic step (a 16-dimensional Gaussian random walk with
a few flops per component) until its own stop step; `max_steps` bounds every member. In one
process run, for two stop patterns:
  - aligned: every member stops at step S;
  - straggling: every member stops at step S/10 except one, which stops at S;
two ways to run the batch:
  (a) `jax.vmap(ds.iterate)`: one batched `while_loop`, which exits when the last member stops
      (members that have stopped keep their state but still ride along in each batched step);
  (b) a fixed-horizon `lax.scan` over `max_steps` steps with every member's update masked after
      its stop (what a hand-written batched simulator without early exit does).
Compile and run time (median of repeats, `block_until_ready`) are reported separately.

Run: `python experiments/bench/early_exit.py [--members N --stop S --max-steps M] [--quick]`
"""

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

sys.path.insert(0, os.path.dirname(__file__))
from _timing import compile_seconds, machine_line, run_seconds, table  # noqa: E402

import diffsim as ds  # noqa: E402

DIM = 16


def _step(key, state):
    x, i = state
    x = 0.99 * x + 0.1 * jnp.tanh(x) + jax.random.normal(key, x.shape, x.dtype)
    return x, i + 1


def make_iterate(max_steps):
    def one(key, stop_at):
        out = ds.iterate(
            _step, (jnp.zeros(DIM, jnp.float32), jnp.array(0, jnp.int32)), key,
            stop=lambda s: s[1] >= stop_at, max_steps=max_steps,
        )
        return out.state[0], out.steps

    return jax.jit(jax.vmap(one))


def make_fixed_horizon(max_steps):
    def one(key, stop_at):
        def body(state, i):
            running = state[1] < stop_at
            new = _step(jax.random.fold_in(key, i), state)
            return jax.tree.map(lambda a, b: jnp.where(running, a, b), new, state), None

        start = (jnp.zeros(DIM, jnp.float32), jnp.array(0, jnp.int32))
        (x, steps), _ = lax.scan(body, start, jnp.arange(max_steps, dtype=jnp.int32))
        return x, steps

    return jax.jit(jax.vmap(one))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=4096)
    parser.add_argument("--stop", type=int, default=1000)
    parser.add_argument("--max-steps", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="small sizes, for smoke tests")
    args = parser.parse_args(argv)
    if args.quick:
        args.members, args.stop, args.max_steps = 256, 100, 200
    print(machine_line())
    print(f"{args.members} members, {DIM}-dim state, stop at {args.stop}, "
          f"max_steps {args.max_steps}, float32\n")
    keys = jax.random.split(jax.random.key(0), args.members)
    early = args.stop // 10
    patterns = {
        f"aligned at {args.stop}": np.full(args.members, args.stop, np.int32),
        f"straggling: all at {early}, one at {args.stop}": np.where(
            np.arange(args.members) == 0, args.stop, early
        ),
        f"aligned at {early}": np.full(args.members, early, np.int32),
    }
    runners = {
        "vmap(ds.iterate), early exit": make_iterate(args.max_steps),
        "fixed-horizon scan, masked": make_fixed_horizon(args.max_steps),
    }
    stops0 = jnp.asarray(patterns[f"aligned at {args.stop}"])
    compiled = {}
    for name, runner in runners.items():
        seconds, compiled[name] = compile_seconds(runner, keys, stops0)
        print(f"compile {name}: {seconds:.2f} s")
    rows = []
    for pattern, stops in patterns.items():
        stops = jnp.asarray(stops, jnp.int32)
        times, results = {}, {}
        for name in runners:
            times[name] = run_seconds(compiled[name], keys, stops, repeats=1 if args.quick else 5)
            results[name] = compiled[name](keys, stops)
        a, b = results.values()
        assert bool(jnp.array_equal(a[1], b[1])), "both ways must take the same steps"
        assert bool(jnp.allclose(a[0], b[0])), "both ways must end in the same states"
        early_ms, fixed_ms = (1e3 * t for t in times.values())
        rows.append([pattern, f"{early_ms:.1f}", f"{fixed_ms:.1f}", f"{fixed_ms / early_ms:.2f}"])
    print()
    print(table(rows, ["stop pattern", "early exit ms", "fixed horizon ms", "fixed / early"]))
    print(
        "\nboth runners end every member at its own stop step (same states); the early exit "
        "runs until the slowest member stops, the fixed horizon always runs max_steps"
    )


if __name__ == "__main__":
    main()
