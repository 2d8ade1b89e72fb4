"""A fit described in a TOML file, for `diffsim fit CONFIG.toml`.

model = "LotkaVolterra"                  # a class of the `models` package
parameters = { alpha = 0.55 }            # initial guesses and fixed values (optional)
y0 = [30.0, 4.0]                         # initial state (guess where fitted)
data = "../data/lynx_hare.csv"           # CSV with a header row, relative to this file
time = "year"                            # its time column (default: the first)
columns = ["hare", "lynx"]               # value columns (default: all others)
fit = ["alpha", "beta", "gamma", "delta"]   # fitted parameters
initial_state = true                     # or false, or a list of indices / state names
observe = [0, 1]                         # optional: the observed state components
solver = "Tsit5"                         # or { name = "RK4" } with dt
dt = 0.05                                # fixed-step solvers
max_steps = 100000                       # optional: step budget of an adaptive solver's solve
method = "lm"                            # lm | gauss-newton | bfgs
loss = "log"                             # squared | log
segments = 1                             # multiple shooting windows
screen = 64                              # points screened for the start (0: the guess alone)
starts = 1                               # optimisations run to the end, from the lowest points
horizon = 2                              # growing-horizon stages (1: the whole record at once)
seed = 0                                 # optional: shifts the screened points at random
noise = 0.1                              # optional: known noise standard deviation
t0 = 1900.0                              # optional: time of y0 (default: first data time)
bounds = { "y0[prey]" = [0.0, inf] }     # optional (lower, upper)
na_values = ["n/a"]                      # optional: texts in the CSV that mark missing values
dtype = "float64"                        # or "float32"
out = "out/fit_lynx_hare"                # summary.txt, fit.json, fit.png go here
"""

import os

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
    "y0",
    "data",
    "time",
    "columns",
    "fit",
    "initial_state",
    "observe",
    "solver",
    "dt",
    "method",
    "loss",
    "segments",
    "starts",
    "screen",
    "horizon",
    "seed",
    "noise",
    "t0",
    "bounds",
    "dtype",
    "out",
    "max_iterations",
    "max_steps",
    "na_values",
}
_KINDS = {
    "description": TEXT,
    "model": TEXT,
    "parameters": TABLE,
    "y0": NUMBERS,
    "data": TEXT,
    "time": TEXT,
    "columns": TEXTS,
    "fit": (TEXT, TEXTS),
    "initial_state": (bool, TEXTS, NUMBERS),
    "observe": NUMBERS,
    "solver": (TEXT, TABLE),
    "dt": NUMBER,
    "method": TEXT,
    "loss": TEXT,
    "segments": INTEGER,
    "starts": INTEGER,
    "screen": INTEGER,
    "horizon": INTEGER,
    "seed": INTEGER,
    "noise": (NUMBER, NUMBERS),
    "t0": NUMBER,
    "bounds": TABLE,
    "dtype": TEXT,
    "out": TEXT,
    "max_iterations": INTEGER,
    "max_steps": INTEGER,
    "na_values": TEXTS,
}
_REQUIRED = ("model", "y0", "data", "fit", "out")


class FitConfigError(ConfigError):
    """The TOML file does not describe a valid fit."""


def load(path: str) -> dict:
    config = load_toml(path, "fit", _KEYS, FitConfigError)
    missing = [k for k in _REQUIRED if k not in config]
    if missing:
        raise FitConfigError(f"{path}: missing {', '.join(missing)}")
    check_types(path, config, _KINDS, FitConfigError)
    if config.get("dtype", "float64") not in ("float32", "float64"):
        raise FitConfigError(f"{path}: dtype must be float32 or float64, got {config['dtype']!r}")
    for name, spec in config.get("bounds", {}).items():
        if not (
            isinstance(spec, list) and len(spec) == 2 and all(is_kind(v, NUMBER) for v in spec)
        ):
            raise FitConfigError(
                f"{path}: bounds.{name} must be [lower, upper] (numbers; -inf / inf for an "
                f"open side), got {spec!r}"
            )
    # the data file is named relative to the config file
    data = os.path.join(
        os.path.dirname(os.path.abspath(path)), os.path.expanduser(str(config["data"]))
    )
    if not os.path.isfile(data):
        what = "is a folder" if os.path.isdir(data) else "does not exist"
        raise FitConfigError(
            f"{path}: data = {config['data']!r} {what} ({data}); name the CSV file of the "
            "observations, relative to the config file"
        )
    config["data"] = data
    return config


def fit_arguments(config: dict) -> dict:
    """The arguments of `ds.fit` for a loaded config (JAX's precision must already be set)."""
    import jax
    import jax.numpy as jnp

    import diffsim as ds

    dtype = jnp.dtype(config.get("dtype", "float64"))
    data = ds.Data.from_csv(
        config["data"],
        time=config.get("time"),
        columns=config.get("columns"),
        na_values=tuple(config.get("na_values", ())),
    )
    observe = None
    if "observe" in config:
        indices = config["observe"]
        size = len(config["y0"])
        if not (
            isinstance(indices, list) and indices and all(is_kind(i, INTEGER) for i in indices)
        ):
            raise FitConfigError(f"observe must be a list of state indices, got {indices!r}")
        outside = [i for i in indices if not -size <= i < size]
        if outside:
            raise FitConfigError(
                f"observe lists {outside}, outside the state's {size} components (indices "
                f"0 to {size - 1}, or negative from the end)"
            )
        observe = _ObserveComponents(tuple(indices))
    if "observe" not in config and data.values.shape[1] != len(config["y0"]):
        raise FitConfigError(
            f"the data have {data.values.shape[1]} value column(s) but the state (y0) has "
            f"{len(config['y0'])} components: list the components the columns measure, in "
            "order, e.g. observe = [0]"
        )
    if config["fit"] == []:
        raise FitConfigError('fit = [] names no parameter: list those to fit, e.g. fit = ["k"]')
    solver = solver_from(config["solver"]) if "solver" in config else None
    if solver is not None and solver.stochastic:
        raise FitConfigError(
            f"solver = {type(solver).__name__!r} is a stochastic solver; a fit's config "
            'simulates a deterministic model: use an ODE solver such as "Tsit5" or "RK4"'
        )
    bounds = {k: tuple(v) for k, v in config.get("bounds", {}).items()}
    arguments = dict(
        model=model_from(config["model"], config.get("parameters", {})),
        y0=jnp.asarray(config["y0"], dtype=dtype),
        data=data,
        params=config["fit"],
        initial_state=config.get("initial_state", False),
        observe=observe,
        solver=solver,
        dt=config.get("dt"),
        method=config.get("method", "lm"),
        loss=config.get("loss", "squared"),
        segments=config.get("segments", 1),
        starts=config.get("starts", 1),
        screen=config.get("screen", 64),
        horizon=config.get("horizon", 2),
        key=jax.random.key(config["seed"]) if "seed" in config else None,
        noise=config.get("noise"),
        t0=config.get("t0"),
        bounds=bounds,
    )
    if "max_iterations" in config:
        arguments["max_iterations"] = config["max_iterations"]
    if "max_steps" in config:
        if config["max_steps"] < 1:
            raise FitConfigError(f"max_steps must be at least 1, got {config['max_steps']}")
        arguments["max_steps"] = config["max_steps"]
    return arguments


class _ObserveComponents:
    """observe = [i, j, ...]: the listed components of the state (a named, hashable callable,
    so that refits with the same config reuse the compiled program)."""

    def __init__(self, indices: tuple[int, ...]):
        self.indices = indices

    def __call__(self, y):
        import jax.numpy as jnp

        return y[jnp.asarray(self.indices)]

    def __hash__(self):
        return hash(self.indices)

    def __eq__(self, other):
        return isinstance(other, _ObserveComponents) and other.indices == self.indices
