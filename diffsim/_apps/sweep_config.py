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

from .config import (
    check_types,
    ConfigError,
    INTEGER,
    is_kind,
    load_toml,
    model_from,
    NUMBER,
    NUMBERS,
    solver_from,
    TABLE,
    TEXT,
    TEXTS,
)

_KEYS = {
    "description",
    "model",
    "parameters",
    "axes",
    "samples",
    "y0",
    "ts",
    "solver",
    "dt",
    "max_steps",
    "reduce",
    "chunk_size",
    "store",
    "dtype",
}
_REQUIRED = ("model", "y0", "ts", "solver", "store")
_KINDS = {
    "description": TEXT,
    "model": TEXT,
    "parameters": TABLE,
    "axes": TABLE,
    "samples": TABLE,
    "y0": NUMBERS,
    "ts": (NUMBERS, TABLE),
    "solver": (TEXT, TABLE),
    "dt": NUMBER,
    "max_steps": INTEGER,
    "reduce": TEXT,
    "chunk_size": INTEGER,
    "store": TEXT,
    "dtype": TEXT,
}


class SweepConfigError(ConfigError):
    """The TOML file does not describe a valid sweep."""


def load(path: str) -> dict:
    config = load_toml(path, "sweep", _KEYS, SweepConfigError)
    missing = [k for k in _REQUIRED if k not in config]
    if ("axes" in config) == ("samples" in config):
        missing.append("exactly one of [axes] or [samples]")
    if missing:
        raise SweepConfigError(f"{path}: missing {', '.join(missing)}")
    check_types(path, config, _KINDS, SweepConfigError)
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
        for name in config["axes"]:
            if name in _KEYS:
                raise SweepConfigError(
                    f"[axes] holds {name!r}, a top-level key: in TOML every key after a [table] "
                    f"header belongs to that table, so move {name} = ... above [axes]"
                )
        axes = {name: _values(name, spec) for name, spec in config["axes"].items()}
    else:
        axes = _samples(config["samples"], jax, ds)
    solver = solver_from(config["solver"])
    if "max_steps" in config and solver.needs_dt:
        raise SweepConfigError(
            f"max_steps bounds the steps of an adaptive solver; {type(solver).__name__} takes "
            "a fixed step (dt): remove max_steps"
        )
    return dict(
        model=model,
        axes=axes,
        y0=jnp.asarray(config["y0"], dtype=dtype),
        ts=jnp.asarray(_values("ts", config["ts"]), dtype=dtype),
        solver=solver,
        dt=config.get("dt"),
        max_steps=config.get("max_steps", 100_000),
        reduce=config.get("reduce"),
        chunk_size=config.get("chunk_size"),
        store=config["store"],
    )


def _values(name, spec) -> np.ndarray:
    if isinstance(spec, list):
        if not spec or not all(is_kind(v, NUMBER) for v in spec):
            raise SweepConfigError(f"{name}: expected a non-empty list of numbers, got {spec!r}")
        return np.asarray(spec, dtype=float)
    if isinstance(spec, dict):
        extra = sorted(set(spec) - {"start", "stop", "num", "log"})
        if extra or not {"start", "stop", "num"} <= set(spec):
            raise SweepConfigError(
                f"{name}: a range is {{ start, stop, num[, log] }}, got {sorted(spec)}"
            )
        for key in ("start", "stop"):
            value = spec[key]
            if not is_kind(value, NUMBER) or not np.isfinite(value):
                raise SweepConfigError(f"{name}: {key} must be a finite number, got {value!r}")
        num, log = spec["num"], spec.get("log", False)
        if not is_kind(num, INTEGER) or num < 1:
            raise SweepConfigError(f"{name}: num must be an integer >= 1, got {num!r}")
        if not isinstance(log, bool):
            raise SweepConfigError(f"{name}: log must be true or false, got {log!r}")
        if log and not (spec["start"] > 0 and spec["stop"] > 0):
            raise SweepConfigError(
                f"{name}: a log range needs start and stop > 0, got {spec['start']} and "
                f"{spec['stop']}"
            )
        space = np.geomspace if log else np.linspace
        return space(float(spec["start"]), float(spec["stop"]), num)
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
    check_types(
        "[samples]",
        spec,
        {
            "method": TEXT,
            "n": INTEGER,
            "seed": INTEGER,
            "skip": INTEGER,
            "bounds": TABLE,
            "log": TEXTS,
        },
        SweepConfigError,
    )
    if "bounds" not in spec:
        raise SweepConfigError("[samples] needs bounds = { name = [low, high], ... }")
    if "n" not in spec:
        raise SweepConfigError("[samples] needs n, the number of samples")
    bounds = spec["bounds"]
    n, log = spec["n"], tuple(spec.get("log", ()))
    if method == "latin_hypercube":
        if "skip" in spec:
            raise SweepConfigError("[samples] skip applies to halton; latin_hypercube takes seed")
        key = jax.random.key(spec.get("seed", 0))
        return ds.Samples.latin_hypercube(bounds, n, key=key, log=log)
    if method == "halton":
        if "seed" in spec:
            raise SweepConfigError(
                "[samples] seed applies to latin_hypercube; the Halton sequence is "
                "deterministic (use skip to start further along it)"
            )
        return ds.Samples.halton(bounds, n, log=log, skip=spec.get("skip", 0))
    raise SweepConfigError(f"samples method {method!r}: choose latin_hypercube or halton")
