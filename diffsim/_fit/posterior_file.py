"""Reading a posterior back from the netCDF file `ds.Posterior.save` wrote, trusting nothing in
it: every group, attribute and array is checked against what the others say (chains, draws,
data times and observables) before a `ds.Posterior` is built, and anything wrong is one
`ds.PosteriorFileError` that names the file and what is wrong with it.

Why so strict: a posterior file travels (shared with a paper, copied between machines, cut
short by a full disk), and a damaged one read without checks gives summaries of arrays that
mean nothing, or h5py's and json's errors that do not say which file or what to do.
"""

import dataclasses
import json
from pathlib import Path

import numpy as np

from .._validate import user_path
from .likelihood import FAMILIES

# the per-draw statistics `ds.sample` records, each (chains, draws)
_STATS = ("diverging", "lp", "acceptance_rate", "n_steps")
_GROUPS = ("posterior", "sample_stats")  # and observed_data, but for a study's posterior


class PosteriorFileError(ValueError):
    """A file given to `ds.Posterior.load` that is not a posterior `ds.Posterior.save` wrote,
    or one that is damaged (truncated, edited, or inconsistent with itself)."""


def read(path, settings_type) -> dict:
    """The keyword arguments of a `ds.Posterior` from the file at `path` (checked; see the
    module text); `settings_type` is `PosteriorSettings`."""
    path = user_path(path, "ds.Posterior.load(path)")
    if not path.exists():
        raise FileNotFoundError(f"ds.Posterior.load: {path} does not exist")
    if path.is_dir():
        raise PosteriorFileError(
            f"{path} is a folder; ds.Posterior.load reads the netCDF file Posterior.save wrote"
        )
    idata = _open(path)
    problem = _Problems(path)
    missing = [g for g in _GROUPS if not hasattr(idata, g)]
    if missing:
        problem(f"it has no {', '.join(missing)} group (a posterior file has {_GROUPS})")
    attrs = dict(idata.attrs)
    if attrs.get("created_by") != "diffsim.sample":
        problem("it was not written by ds.Posterior.save (no created_by = 'diffsim.sample')")
    settings = _settings(attrs, settings_type, problem)
    chains, draws = settings.chains, settings.draws

    names = tuple(str(n) for n in idata.posterior.data_vars)
    if not names:
        problem("its posterior group holds no draws")
    if json.dumps(sorted(names)) != json.dumps(sorted(settings.priors)):
        problem(f"its draws {list(names)} are not the unknowns its priors name {settings.priors}")
    samples = {}
    for name in names:
        x = np.asarray(idata.posterior[name].values)
        _check_array(problem, f"draws of {name!r}", x, (chains, draws), floating=True)
        if name in ("sigma", "phi") and np.any(x <= 0):
            problem(f"its draws of {name!r} are not all positive (a scale or dispersion is)")
        samples[name] = x

    stats = {}
    for name in _STATS:
        if name not in idata.sample_stats.data_vars:
            problem(f"its sample_stats group has no {name!r}")
        x = np.asarray(idata.sample_stats[name].values)
        _check_array(problem, f"sample_stats {name!r}", x, (chains, draws), exact=True)
        stats[name] = x
    if not np.all(np.isin(stats["diverging"], (0, 1))):
        problem("its sample_stats 'diverging' are not true/false")
    if np.any(stats["n_steps"] < 1) or np.any(stats["n_steps"] != np.round(stats["n_steps"])):
        problem("its sample_stats 'n_steps' are not counts of leapfrog steps (>= 1)")
    # a mean of min(1, ·) terms: 1 + a few ulps of its precision at most (float32: 1e-7)
    rate = stats["acceptance_rate"]
    ulps = 16 * float(np.finfo(rate.dtype).eps) if np.issubdtype(rate.dtype, np.floating) else 0
    if np.any(rate < 0) or np.any(rate > 1 + max(1e-9, ulps)):
        problem("its sample_stats 'acceptance_rate' are not probabilities")
    stats["step_size"] = _json_array(attrs, "step_size", problem, (chains,), positive=True)
    warmup_divergences = _json_array(attrs, "warmup_divergences", problem, (chains,))
    if np.any(warmup_divergences < 0) or np.any(warmup_divergences != np.round(warmup_divergences)):
        problem("its warmup_divergences are not counts")

    likelihood = _text(attrs, "likelihood", problem)
    if likelihood not in FAMILIES and likelihood != "study":
        problem(f"its likelihood {likelihood!r} is none of {tuple(FAMILIES) + ('study',)}")
    study = likelihood == "study"
    if study == hasattr(idata, "observed_data"):
        problem(
            "a study's posterior has no observed_data group and any other has one"
            if study
            else "it has no observed_data group"
        )
    data = None if study else _data(idata, problem)
    predictions = replicated = None
    if hasattr(idata, "posterior_predictive") and not study:
        times, observables = data.values.reshape(len(data.ts), -1).shape
        kept = -(-draws // settings.thin)
        group = idata.posterior_predictive
        arrays = []
        for name in ("mu", "y"):
            if name not in group.data_vars:
                problem(f"its posterior_predictive group has no {name!r}")
            x = np.asarray(group[name].values)
            shape = (chains, kept, times, observables)
            _check_array(problem, f"posterior_predictive {name!r}", x, shape, finite=False)
            # the model's predictions at accepted draws are finite; replicated data may be
            # NaN (a family's draw outside its domain) but never infinite
            if np.any(np.isinf(x)) or (name == "mu" and not np.all(np.isfinite(x))):
                problem(f"its posterior_predictive {name!r} hold values that are not finite")
            arrays.append(x)
        predictions, replicated = arrays

    t0 = _number(attrs, "t0", problem)
    if data is not None and t0 > float(np.min(data.ts)):
        problem(f"its t0 = {t0:g} is after its first data time {float(np.min(data.ts)):g}")
    seconds = _number(attrs, "seconds", problem)
    timings = _json(attrs, "timings", problem, default="{}")
    if not isinstance(timings, dict) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in timings.values()
    ):
        problem("its timings attribute is not a table of seconds")
    return dict(
        samples=samples,
        names=names,
        sample_stats=stats,
        warmup_divergences=warmup_divergences.astype(int),
        predictions=predictions,
        replicated=replicated,
        data=data,
        likelihood=likelihood,
        t0=t0,
        seconds=seconds,
        timings={str(k): float(v) for k, v in timings.items()},
        settings=settings,
    )


class _Problems:
    """Raise `PosteriorFileError` naming the file."""

    def __init__(self, path: Path):
        self.path = path

    def __call__(self, what: str):
        raise PosteriorFileError(
            f"{self.path} is not a usable posterior file: {what}. Save it again with "
            "Posterior.save (or sample again)"
        )


def _open(path: Path):
    """The file as an `arviz.InferenceData`, loaded into memory (the file is closed after)."""
    from .libraries import arviz

    try:
        idata = arviz().from_netcdf(str(path))
        for group in idata.groups():
            idata[group].load()
        return idata
    except Exception as error:  # h5py, netCDF and xarray raise many kinds for a bad file
        raise PosteriorFileError(
            f"{path} cannot be read as a netCDF posterior file ({type(error).__name__}: "
            f"{error}); it may be truncated, damaged, or another kind of file"
        ) from None


def _check_array(problem, what, x, leading, *, floating=False, exact=False, finite=True):
    if x.ndim < len(leading) or x.shape[: len(leading)] != tuple(leading):
        problem(f"its {what} have shape {x.shape}, not {tuple(leading)} + the entry's shape")
    if exact and x.ndim != len(leading):
        problem(f"its {what} have shape {x.shape}, not {tuple(leading)}")
    if x.dtype.kind not in ("f", "i", "u", "b") or (floating and x.dtype.kind != "f"):
        problem(f"its {what} are {x.dtype}, not numbers")
    if finite and x.dtype.kind == "f" and not np.all(np.isfinite(x)):
        problem(f"its {what} hold NaN or inf")


def _settings(attrs, settings_type, problem):
    fields = {f.name: f.type for f in dataclasses.fields(settings_type)}
    given = {k[len("setting_") :]: v for k, v in attrs.items() if k.startswith("setting_")}
    missing = sorted(set(fields) - set(given))
    unknown = sorted(set(given) - set(fields))
    if missing or unknown:
        problem(f"its settings attributes are wrong (missing {missing}, unknown {unknown})")
    settings = {}
    for key in ("chains", "draws", "warmup", "thin"):
        value = _integer(given[key], f"setting_{key}", problem)
        if value < (0 if key == "warmup" else 1):
            problem(f"its setting_{key} = {value} is out of range")
        settings[key] = value
    settings["target_accept"] = _number(given, "target_accept", problem)
    if not 0 < settings["target_accept"] < 1:
        problem(f"its setting_target_accept = {settings['target_accept']} is not in (0, 1)")
    dense = _integer(given["dense_mass"], "setting_dense_mass", problem)
    if dense not in (0, 1):
        problem(f"its setting_dense_mass = {dense} is not 0 or 1")
    settings["dense_mass"] = bool(dense)
    priors = _json(given, "priors", problem)
    if not isinstance(priors, dict) or not all(isinstance(v, str) for v in priors.values()):
        problem("its setting_priors is not a table of prior descriptions")
    settings["priors"] = priors
    for key in ("solver", "model"):
        settings[key] = _text(given, key, problem)
    return settings_type(**settings)


def _data(idata, problem):
    from .data import Data

    if "y" not in idata.observed_data.data_vars:
        problem("its observed_data group has no 'y'")
    observed = idata.observed_data["y"]
    if tuple(observed.dims) != ("time", "observable"):
        problem(f"its observed data are over {tuple(observed.dims)}, not (time, observable)")
    times = np.asarray(observed["time"].values)
    values = np.asarray(observed.values)
    if times.dtype.kind != "f" or not np.all(np.isfinite(times)) or np.any(np.diff(times) <= 0):
        problem("its data times are not increasing finite numbers")
    if values.dtype.kind != "f":
        problem(f"its observed values are {values.dtype}, not numbers")
    names = tuple(str(v) for v in observed["observable"].values)
    try:
        return Data(times, values, names=names)
    except (TypeError, ValueError) as error:
        problem(f"its observed data are not valid ({error})")


def _text(attrs, key, problem) -> str:
    value = attrs.get(key)
    if not isinstance(value, str):
        problem(f"its {key} attribute is missing or not text")
    return value


def _number(attrs, key, problem) -> float:
    value = attrs.get(key)
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        problem(f"its {key} attribute is missing or not a number")
    if not np.isfinite(float(value)):
        problem(f"its {key} attribute is {value}")
    return float(value)


def _integer(value, key, problem) -> int:
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        problem(f"its {key} attribute is not an integer")
    return int(value)


def _json(attrs, key, problem, default=None):
    text = attrs.get(key, default)
    if not isinstance(text, str):
        problem(f"its {key} attribute is missing or not text")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        problem(f"its {key} attribute is not valid JSON")


def _json_array(attrs, key, problem, shape, *, positive=False) -> np.ndarray:
    value = _json(attrs, key, problem)
    try:
        x = np.asarray(value, float)
    except (TypeError, ValueError):
        problem(f"its {key} attribute is not a list of numbers")
    if x.shape != shape or not np.all(np.isfinite(x)) or (positive and np.any(x <= 0)):
        kind = "positive numbers" if positive else "numbers"
        problem(f"its {key} attribute is not {shape[0]} finite {kind} (one per chain)")
    return x
