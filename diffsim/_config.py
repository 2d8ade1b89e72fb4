"""Pieces shared by the TOML configs of `diffsim sweep` and `diffsim fit`."""

import tomllib


class ConfigError(ValueError):
    """A TOML config does not describe a valid run."""


def load_toml(path: str, what: str, known: set, error=ConfigError) -> dict:
    """Read a TOML file and refuse keys outside `known`."""
    try:
        with open(path, "rb") as file:
            config = tomllib.load(file)
    except FileNotFoundError:
        raise error(f"no {what} config at {path!r}") from None
    except tomllib.TOMLDecodeError as problem:
        raise error(f"{path}: not valid TOML: {problem}") from None
    unknown = sorted(set(config) - known)
    if unknown:
        raise error(f"{path}: unknown keys {unknown}; known keys: {sorted(known)}")
    return config


def model_from(name, parameters):
    """An instance of the class `name` of the `models` package, built from `parameters`."""
    import diffsim as ds
    import models

    cls = getattr(models, str(name), None)
    if not (isinstance(cls, type) and issubclass(cls, ds.AbstractODE)):
        classes = {n: getattr(models, n) for n in dir(models)}
        available = sorted(
            n for n, c in classes.items() if isinstance(c, type) and issubclass(c, ds.AbstractODE)
        )
        raise ConfigError(f"model {name!r} is not in models; available: {available}")
    if not isinstance(parameters, dict):
        raise ConfigError(f"parameters must be a table, got {parameters!r}")
    try:
        return cls(**parameters)
    except TypeError as error:
        raise ConfigError(f"parameters of {name}: {error}") from None


def solver_from(spec):
    """A diffsim solver from a name or a table `{ name = ..., options... }`."""
    import diffsim as ds

    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, dict) or "name" not in spec:
        raise ConfigError(f"solver must be a name or {{ name = ..., ... }}, got {spec!r}")
    options = {k: v for k, v in spec.items() if k != "name"}
    cls = getattr(ds, str(spec["name"]), None)
    if not (isinstance(cls, type) and issubclass(cls, ds.AbstractSolver)) or cls is ds.Diffrax:
        raise ConfigError(f"solver {spec['name']!r} is not a diffsim solver (e.g. RK4, Tsit5)")
    try:
        return cls(**options)
    except TypeError as error:
        raise ConfigError(f"solver {spec['name']}: {error}") from None
