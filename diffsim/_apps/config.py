"""Pieces shared by the TOML configs of `diffsim sweep` and `diffsim fit`."""

import tomllib

from .._validate import user_path


class ConfigError(ValueError):
    """A TOML config does not describe a valid run."""


def load_toml(path: str, what: str, known: set, error=ConfigError) -> dict:
    """Read a TOML file and refuse keys outside `known`."""
    path = str(user_path(path, f"the {what} config"))
    try:
        with open(path, "rb") as file:
            text = file.read().decode("utf-8")
        config = tomllib.loads(text.removeprefix("\ufeff"))  # a byte order mark is no content
    except FileNotFoundError:
        raise error(f"no {what} config at {path!r}") from None
    except tomllib.TOMLDecodeError as problem:
        raise error(f"{path}: not valid TOML: {problem}") from None
    except IsADirectoryError:
        raise error(f"{path!r} is a folder, not a {what} config file") from None
    except (OSError, UnicodeDecodeError) as problem:
        raise error(f"{path}: cannot be read ({problem})") from None
    unknown = sorted(set(config) - known)
    if unknown:
        raise error(f"{path}: unknown keys {unknown}; known keys: {sorted(known)}")
    return config


# The kinds of values a config key may hold (TOML types as Python reads them).
NUMBER = "a number"
INTEGER = "an integer"
TEXT = "a string"
TABLE = "a table"
NUMBERS = "a list of numbers"
TEXTS = "a list of strings"


def is_kind(value, kind) -> bool:
    """Whether a TOML value is of `kind` (a bool is no number)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == NUMBER:
        return number
    if kind == INTEGER:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == TEXT:
        return isinstance(value, str)
    if kind == TABLE:
        return isinstance(value, dict)
    if kind == NUMBERS:
        return isinstance(value, list) and all(
            is_kind(v, NUMBER) or is_kind(v, NUMBERS) for v in value
        )
    if kind == TEXTS:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if kind is bool:
        return isinstance(value, bool)
    raise AssertionError(kind)


def check_types(path: str, config: dict, kinds: dict, error=ConfigError) -> None:
    """Refuse a key whose value is none of the kinds `kinds[key]` (a kind or a tuple of
    them) allows, naming the key, what it holds and what it may hold."""
    for key, allowed in kinds.items():
        if key not in config:
            continue
        allowed = allowed if isinstance(allowed, tuple) else (allowed,)
        if not any(is_kind(config[key], kind) for kind in allowed):
            names = " or ".join("true/false" if k is bool else k for k in allowed)
            raise error(f"{path}: {key} must be {names}, got {config[key]!r}")


def writable_folder(path: str, what: str, error=ConfigError) -> None:
    """Create the folder `path` (if needed) and check that a file can be written in it, before
    any expensive work; `error` names `what` (the config key or option), the path and why."""
    import os

    if os.path.exists(path) and not os.path.isdir(path):
        raise error(f"{what} = {path!r} is a file, not a folder: choose another {what}")
    from .._validate import check_can_write

    try:
        os.makedirs(path, exist_ok=True)
        check_can_write(path)
    except OSError as problem:
        raise error(
            f"cannot write into {what} = {path!r} ({problem.strerror or problem}): choose a "
            f"writable {what}"
        ) from None


def write_atomically(path: str, text: str) -> None:
    """Write a text file whole or not at all (a full disk leaves the old file, not half)."""
    import os

    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        with open(temporary, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def unwritten_results(command: str, folder: str, error: OSError) -> int:
    """Say on stderr that a finished fit's results could not be written (its summary was
    printed), and what to do; the exit status 2."""
    import sys

    print(
        f"diffsim {command}: the fit finished (its summary is above), but its results could not "
        f"be written to {folder!r} ({error.strerror or error}: {error.filename or folder}); "
        "free space or choose a writable --out and run again",
        file=sys.stderr,
    )
    return 2


# The packages a config may take a model from, imported at run time (the library itself never
# imports them): a bare name is a class of the first, a dotted name a path inside one of them.
# A config is data: it names known models and never makes diffsim import an arbitrary module.
MODEL_PACKAGES = ("models",)


def model_class(name) -> type:
    """The model class a config names: `"Lorenz"` (a class of the `models` package) or a path
    inside it, `"models.chaos.Lorenz"`; raises `ConfigError` naming what is available."""
    import importlib

    import diffsim as ds

    name = str(name)
    if "." in name:
        module_name, _, attribute = name.rpartition(".")
        if module_name.split(".")[0] not in MODEL_PACKAGES:
            raise ConfigError(
                f"model {name!r}: a config names a model of {' or '.join(MODEL_PACKAGES)} "
                f"(e.g. 'Lorenz' or 'models.chaos.Lorenz'), not of {module_name.split('.')[0]!r}"
            )
    else:
        module_name, attribute = MODEL_PACKAGES[0], name
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigError(f"model {name!r}: cannot import {module_name!r} ({error})") from None
    cls = getattr(module, attribute, None)
    if not (isinstance(cls, type) and issubclass(cls, ds.AbstractODE)):
        classes = {n: getattr(module, n) for n in dir(module)}
        available = sorted(
            n for n, c in classes.items() if isinstance(c, type) and issubclass(c, ds.AbstractODE)
        )
        raise ConfigError(f"model {name!r} is not in {module_name}; available: {available}")
    return cls


def model_from(name, parameters):
    """An instance of the model class `name` (see `model_class`), built from `parameters`."""
    cls = model_class(name)
    if not isinstance(parameters, dict):
        raise ConfigError(f"parameters must be a table, got {parameters!r}")
    import dataclasses

    known = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = sorted(set(parameters) - set(known))
    if unknown:
        raise ConfigError(f"{name} has no parameter(s) {unknown}; its parameters: {known}")
    try:
        return cls(**parameters)
    except (TypeError, ValueError) as error:
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
    import dataclasses

    known = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ConfigError(
            f"solver {spec['name']} has no option(s) {unknown}; its options: {known or 'none'}"
        )
    try:
        return cls(**options)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"solver {spec['name']}: {error}") from None
