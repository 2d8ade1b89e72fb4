"""A sweep described in a TOML file, for `diffsim sweep CONFIG.toml`.

    model = "DampedPendulum"              # a class of the `models` package
    parameters = { gravity = 9.81 }       # fixed model parameters (optional)
    y0 = [1.0, 0.0]
    ts = { start = 0.0, stop = 20.0, num = 201 }   # or a list of times
    solver = "RK4"                        # or { name = "Tsit5", rtol = 1e-8, atol = 1e-8 }
    dt = 0.01                             # fixed-step solvers
    reduce = "max_abs"                    # trajectory | final_state | max_abs | mean
    chunk_size = 1024                     # optional
    store = "out/pendulum.zarr"           # relative to the working directory
    dtype = "float64"                     # or "float32"

    [axes]                                # a grid: the Cartesian product
    length = { start = 0.5, stop = 2.0, num = 64 }          # linspace; log = true for geomspace
    damping = [0.0, 0.1, 0.2]

or, instead of `[axes]`, zipped samples:

    [samples]
    method = "latin_hypercube"            # or "halton"
    n = 10000
    seed = 0                              # latin_hypercube
    bounds = { length = [0.5, 2.0], damping = [0.0, 0.5] }
    log = ["length"]                      # optional
"""

import numpy as np

from ._config import ConfigError, load_toml, model_from, solver_from

_KEYS = {
    "description", "model", "parameters", "axes", "samples", "y0", "ts", "solver", "dt",
    "max_steps", "reduce", "chunk_size", "store", "dtype",
}
_REQUIRED = ("model", "y0", "ts", "solver", "store")


class SweepConfigError(ConfigError):
    """The TOML file does not describe a valid sweep."""


def load(path: str) -> dict:
    config = load_toml(path, "sweep", _KEYS, SweepConfigError)
    missing = [k for k in _REQUIRED if k not in config]
    if ("axes" in config) == ("samples" in config):
        missing.append("exactly one of [axes] or [samples]")
    if missing:
        raise SweepConfigError(f"{path}: missing {', '.join(missing)}")
    if config.get("dtype", "float64") not in ("float32", "float64"):
        raise SweepConfigError(f"{path}: dtype must be float32 or float64, got {config['dtype']!r}")
    return config


def sweep_arguments(config: dict) -> dict:
    """The keyword arguments of `ds.sweep` for a loaded config (JAX's precision must already be
    set from `config["dtype"]`)."""
    import jax
    import jax.numpy as jnp

    import diffsim as ds

    dtype = jnp.dtype(config.get("dtype", "float64"))
    model = model_from(config["model"], config.get("parameters", {}))
    if "axes" in config:
        axes = {name: _values(name, spec) for name, spec in config["axes"].items()}
    else:
        axes = _samples(config["samples"], jax, ds)
    return dict(
        model=model,
        axes=axes,
        y0=jnp.asarray(config["y0"], dtype=dtype),
        ts=jnp.asarray(_values("ts", config["ts"]), dtype=dtype),
        solver=solver_from(config["solver"]),
        dt=config.get("dt"),
        max_steps=config.get("max_steps", 100_000),
        reduce=config.get("reduce"),
        chunk_size=config.get("chunk_size"),
        store=config["store"],
    )


def _values(name, spec) -> np.ndarray:
    if isinstance(spec, list):
        return np.asarray(spec, dtype=float)
    if isinstance(spec, dict):
        extra = sorted(set(spec) - {"start", "stop", "num", "log"})
        if extra or not {"start", "stop", "num"} <= set(spec):
            raise SweepConfigError(
                f"{name}: a range is {{ start, stop, num[, log] }}, got {sorted(spec)}"
            )
        space = np.geomspace if spec.get("log", False) else np.linspace
        return space(float(spec["start"]), float(spec["stop"]), int(spec["num"]))
    raise SweepConfigError(f"{name}: expected a list of values or a range table, got {spec!r}")


def _samples(spec, jax, ds):
    if not isinstance(spec, dict):
        raise SweepConfigError(f"[samples] must be a table, got {spec!r}")
    unknown = sorted(set(spec) - {"method", "n", "seed", "skip", "bounds", "log"})
    if unknown:
        raise SweepConfigError(
            f"[samples]: unknown keys {unknown}; known: bounds, log, method, n, seed, skip"
        )
    method = spec.get("method", "latin_hypercube")
    bounds = spec.get("bounds", {})
    n, log = spec.get("n"), tuple(spec.get("log", ()))
    if method == "latin_hypercube":
        key = jax.random.key(spec.get("seed", 0))
        return ds.Samples.latin_hypercube(bounds, n, key=key, log=log)
    if method == "halton":
        return ds.Samples.halton(bounds, n, log=log, skip=spec.get("skip", 0))
    raise SweepConfigError(f"samples method {method!r}: choose latin_hypercube or halton")
