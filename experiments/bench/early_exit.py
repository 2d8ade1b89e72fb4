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

The second table does the same for ODE solves stopped by a terminal event: a batch of balls
dropped from heights chosen so that they land at given times (`models.BouncingBall`, RK4,
dt = 1 ms, horizon 2 s), `jax.vmap(ds.simulate(..., events=landing))` against the same solve
without the event, which always runs to the horizon.

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
from _timing import compile_seconds, machine_line, record, run_seconds, table

import diffsim as ds

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import models

DIM = 16


def _step(key, state):
    x, i = state
    x = 0.99 * x + 0.1 * jnp.tanh(x) + jax.random.normal(key, x.shape, x.dtype)
    return x, i + 1


def make_iterate(max_steps):
    def one(key, stop_at):
        out = ds.iterate(
            _step,
            (jnp.zeros(DIM, jnp.float32), jnp.array(0, jnp.int32)),
            key,
            stop=lambda s: s[1] >= stop_at,
            max_steps=max_steps,
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
    print(
        f"{args.members} members, {DIM}-dim state, stop at {args.stop}, "
        f"max_steps {args.max_steps}, float32\n"
    )
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
        for name, seconds in times.items():
            record(f"early exit: {pattern}", name, members=args.members, run_s=seconds)
        rows.append([pattern, f"{early_ms:.1f}", f"{fixed_ms:.1f}", f"{fixed_ms / early_ms:.2f}"])
    print()
    print(table(rows, ["stop pattern", "early exit ms", "fixed horizon ms", "fixed / early"]))
    print(
        "\nboth runners end every member at its own stop step (same states); the early exit "
        "runs until the slowest member stops, the fixed horizon always runs max_steps"
    )
    events_section(args.members, args.quick)


def make_landing(with_event: bool, horizon: float, dt: float):
    ball = models.BouncingBall()
    ts = np.array([0.0, horizon], np.float32)
    landing = ds.Event(lambda t, y: y[0], direction=-1)

    def one(height):
        y0 = jnp.stack([height, jnp.zeros_like(height)])
        sol = ds.simulate(
            ball,
            y0,
            ts,
            solver=ds.RK4(),
            dt=dt,
            throw=False,
            events=landing if with_event else None,
        )
        return sol.event_time if with_event else sol.ys[-1, 0]

    return jax.jit(jax.vmap(one))


def events_section(members: int, quick: bool):
    horizon, dt = (0.2, 1e-3) if quick else (2.0, 1e-3)
    g = 9.81
    late, early = 0.95 * horizon, 0.095 * horizon
    patterns = {
        f"aligned, landing at {late:g} s": np.full(members, late),
        f"straggling: all at {early:g} s, one at {late:g} s": np.where(
            np.arange(members) == 0, late, early
        ),
        f"aligned, landing at {early:g} s": np.full(members, early),
    }
    runners = {
        "terminal event (early exit)": make_landing(True, horizon, dt),
        "no event, to the horizon": make_landing(False, horizon, dt),
    }
    heights0 = jnp.asarray(0.5 * g * patterns[next(iter(patterns))] ** 2, jnp.float32)
    print(
        f"\nterminal events: {members} falling balls, RK4 dt = {dt:g} s, horizon {horizon:g} s "
        f"({round(horizon / dt)} steps), float32"
    )
    compiled = {}
    for name, runner in runners.items():
        seconds, compiled[name] = compile_seconds(runner, heights0)
        print(f"compile {name}: {seconds:.2f} s")
    rows = []
    for pattern, landing in patterns.items():
        heights = jnp.asarray(0.5 * g * landing**2, jnp.float32)
        times = {
            name: run_seconds(compiled[name], heights, repeats=1 if quick else 5)
            for name in runners
        }
        located = np.asarray(compiled["terminal event (early exit)"](heights))
        assert np.allclose(located, landing, rtol=1e-4), "event times must be the landing times"
        event_ms, full_ms = (1e3 * t for t in times.values())
        for name, seconds in times.items():
            record(f"terminal events: {pattern}", name, members=members, run_s=seconds)
        rows.append([pattern, f"{event_ms:.1f}", f"{full_ms:.1f}", f"{full_ms / event_ms:.2f}"])
    print()
    print(table(rows, ["landing pattern", "terminal event ms", "to horizon ms", "horizon / event"]))


if __name__ == "__main__":
    main()
