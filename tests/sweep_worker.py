"""A sweep run in its own process, for the tests that need a fresh JAX: another device count,
several `jax.distributed` processes, or a run killed with SIGKILL.

    python tests/sweep_worker.py STORE [--devices N] [--process-id I --num-processes N --port P]
                                 [--size small|large] [--fail-after N]
"""

import argparse
import os
import sys

# The device count must be set before JAX starts.
if __name__ == "__main__":
    _args = argparse.ArgumentParser()
    _args.add_argument("store")
    _args.add_argument("--devices", type=int, default=1)
    _args.add_argument("--process-id", type=int)
    _args.add_argument("--num-processes", type=int)
    _args.add_argument("--port", type=int)
    _args.add_argument("--size", choices=("small", "large"), default="small")
    _args.add_argument("--fail-after", type=int, help="raise OSError after writing N chunks")
    ARGS = _args.parse_args()
    os.environ["JAX_NUM_CPU_DEVICES"] = str(ARGS.devices)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
import numpy as np

import diffsim as ds
import models

jax.config.update("jax_enable_x64", True)


def driven_pendulum(length, damping, key):
    """A model function whose drive amplitude is drawn from the member's key, so the test also
    checks that member keys do not depend on chunking or devices."""
    amplitude = 0.5 * jax.random.uniform(key, dtype=jnp.float64)
    return models.DampedPendulum(
        length=length, damping=damping, drive_amplitude=amplitude, drive_frequency=2.0 / 3.0
    )


def run(store, size: str = "small", progress: bool = False):
    """The sweep every worker test runs: "small" is adaptive Tsit5 over a length × damping grid
    whose chunk size leaves a padded last chunk; "large" has 60 chunks of cheap-to-compile RK4
    work, so that a kill lands mid-sweep."""
    if size == "small":
        lengths, dampings, chunk = np.linspace(0.5, 2.0, 12), np.linspace(0, 0.5, 10), 16
        ts, solver, dt = jnp.linspace(0.0, 10.0, 11), ds.Tsit5(rtol=1e-8, atol=1e-8), None
    else:
        lengths, dampings, chunk = np.linspace(0.5, 2.0, 60), np.linspace(0, 0.5, 20), 20
        ts, solver, dt = jnp.linspace(0.0, 30.0, 11), ds.RK4(), 0.01
    return ds.sweep(
        driven_pendulum,
        {"length": lengths, "damping": dampings},
        jnp.array([1.0, 0.0]),
        ts,
        solver=solver,
        dt=dt,
        reduce="max_abs",
        chunk_size=chunk,
        store=store,
        key=jax.random.key(42),
        progress=progress,
    )


if __name__ == "__main__":
    if ARGS.num_processes:
        layout = ds.distributed.initialize(
            coordinator_address=f"localhost:{ARGS.port}",
            num_processes=ARGS.num_processes,
            process_id=ARGS.process_id,
        )
        print(layout, flush=True)
    if ARGS.fail_after is not None:
        from diffsim._sweep import store as _store

        write, written = _store.write_chunk, []

        def failing_write(*args):
            if len(written) == ARGS.fail_after:
                raise OSError("disk full (simulated)")
            written.append(1)
            write(*args)

        _store.write_chunk = failing_write
    # through the module, not __main__, so the model function has the name it has in the tests
    # (the store's config records it)
    import sweep_worker

    sweep_worker.run(ARGS.store, ARGS.size)
    print("done", flush=True)
