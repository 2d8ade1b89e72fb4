"""`ds.Posterior`: what `ds.sample` returns: the draws, their diagnostics (numpyro's), the
posterior predictive, an ArviZ view, figures and a netCDF file with provenance."""

import dataclasses
import datetime
import json
from pathlib import Path
from typing import Any

import numpy as np

from .._compile import jit
from .._provenance import package_versions
from .._validate import user_path
from . import posterior_file
from .data import Data
from .libraries import arviz, third_party_promotion

# split R-hat above this says the chains have not mixed (Vehtari et al. 2021)
RHAT_LIMIT = 1.01
# effective draws below this per chain make the reported means and quantiles unreliable
ESS_PER_CHAIN = 100


@dataclasses.dataclass(frozen=True)
class PosteriorSettings:
    """How a posterior was sampled (kept in its file as provenance)."""

    chains: int
    draws: int
    warmup: int
    thin: int  # every thin-th draw has replicated data
    target_accept: float
    dense_mass: bool
    priors: dict  # name -> the prior's repr
    solver: str
    model: str


@dataclasses.dataclass(frozen=True, eq=False)
class Posterior:
    """Draws from the posterior of `ds.sample`. Every value is in natural units.

    - `samples`: dict name → array `(chains, draws, *shape)` per prior (the unknowns as
      `ds.fit` names them, a vector parameter under its field name, and the likelihood's
      `sigma` or `phi`).
    - `sample_stats`: dict of `(chains, draws)` arrays: `diverging`, `lp` (log density),
      `acceptance_rate`, `n_steps` (leapfrog steps), and `step_size` `(chains,)`.
    - `divergences`: `(chains,)` divergent transitions after warm-up (a proposal whose
      simulation failed is one); `warmup_divergences` the same during warm-up.
    - `data`: the data of `ds.sample(model, y0, data)`; None for a study (`ds.sample(problem)`,
      whose measurements, experiments and noise models are its problem's; `likelihood` is then
      `"study"` and there are no predictions).
    - `predictions`: the model's observables at the data times for (every `thin`-th) draw,
      `(chains, kept, times, observables)`; `replicated`: data drawn around them from the
      likelihood (the posterior predictive; by numpy's generator, seeded by `ds.sample`'s
      key).
    - `summary()`: a table of means, standard deviations, quantiles, effective sample sizes
      and R-hat; `table()` the same as a dict; `to_arviz()` an `arviz.InferenceData`;
      `predict(ts)` bands of the model and of new data; `plot()`; `save(path)` /
      `ds.Posterior.load(path)` as netCDF.
    - `warnings`: divergences, R-hat above 1.01, too few effective draws (also issued as
      `ds.FitWarning`).
    - `seconds`: the wall time of `ds.sample`; `timings`: its parts, `fit` (the start),
      `compile` and `sample` (warm-up, draws and the posterior predictive).
    """

    samples: dict
    names: tuple[str, ...]
    sample_stats: dict
    warmup_divergences: np.ndarray
    predictions: np.ndarray | None
    replicated: np.ndarray | None
    data: Data | None
    likelihood: str
    t0: float
    seconds: float
    settings: PosteriorSettings
    timings: dict = dataclasses.field(default_factory=dict)
    _density: Any = dataclasses.field(default=None, repr=False)

    def __repr__(self) -> str:
        # the draws themselves are thousands of numbers: `summary()` tabulates them
        return (
            f"Posterior({', '.join(self.names)}: {self.chains} chains × {self.draws} draws, "
            f"{int(self.divergences.sum())} divergences; summary() for the table)"
        )

    @property
    def chains(self) -> int:
        return self.settings.chains

    @property
    def draws(self) -> int:
        return self.settings.draws

    @property
    def divergences(self) -> np.ndarray:
        return np.asarray(self.sample_stats["diverging"]).sum(axis=1)

    def table(self, quantiles=(0.05, 0.5, 0.95)) -> dict:
        """name (one per scalar entry, e.g. `"sigma[hare]"`) → dict of `mean`, `sd`, the
        `quantiles` (keys like `"5%"`), `mcse` (Monte Carlo standard error of the mean), `ess`
        (effective sample size) and `r_hat` (split R-hat), by numpyro's diagnostics (those of
        its `print_summary`)."""
        from numpyro.diagnostics import effective_sample_size, split_gelman_rubin

        quantiles = _checked_quantiles(quantiles)
        rows = {}
        for _, label, x in self._entries():
            ess = float(effective_sample_size(x)) if self.draws > 1 else float("nan")
            row = dict(mean=float(np.mean(x)), sd=float(np.std(x, ddof=1)))
            for q in quantiles:
                row[f"{100 * q:g}%"] = float(np.quantile(x, q))
            row.update(
                mcse=float(np.std(x, ddof=1) / np.sqrt(max(ess, 1.0))),
                ess=ess,
                r_hat=float(split_gelman_rubin(x)) if self.draws > 3 else float("nan"),
            )
            rows[label] = row
        return rows

    def _entries(self):
        """(prior name, entry label, draws (chains, draws)) for every scalar entry."""
        for name in self.names:
            x = np.asarray(self.samples[name])
            shape = x.shape[2:]
            if not shape:
                yield name, name, x
                continue
            labels = None
            named = self.data is not None and self.data.names
            if name in ("sigma", "phi") and named and shape == (len(self.data.names),):
                labels = self.data.names
            for index in np.ndindex(shape):
                label = labels[index[0]] if labels else ",".join(map(str, index))
                yield name, f"{name}[{label}]", x[(slice(None), slice(None), *index)]

    @property
    def warnings(self) -> tuple[str, ...]:
        """Divergences, R-hat above 1.01, too few effective draws: what needs attention."""
        return self._notes(self.table())

    def _notes(self, table: dict) -> tuple[str, ...]:
        notes = []
        stuck = self._stuck_chains()
        if stuck:
            steps = np.asarray(self.sample_stats["step_size"])
            small = [float(f"{steps[i]:.3g}") for i in stuck]
            notes.append(
                f"chains {stuck} did not move (step size {small} against "
                f"{float(f'{np.max(steps):.3g}')} at most; their draws barely change): "
                f"the warm-up ({self.settings.warmup} iterations) did not adapt them. Raise "
                "warmup (Stan's default is 1000; below ~150 the adaptation windows are too "
                "short), and check that the model can be simulated over the priors' range"
            )
        divergences = self.divergences
        if divergences.sum() > 0:
            notes.append(
                f"{int(divergences.sum())} divergent transitions after warm-up (per chain: "
                f"{divergences.tolist()}): the draws may miss part of the posterior. Raise "
                "target_accept (e.g. 0.95), reparametrise, or check that the model can be "
                "simulated over the prior's range"
            )
        high = [n for n, row in table.items() if row["r_hat"] > RHAT_LIMIT]
        unknown = [n for n, row in table.items() if not np.isfinite(row["r_hat"])]
        if high:
            notes.append(
                f"R-hat above {RHAT_LIMIT} for {high}: the chains disagree (not mixed, or a "
                "multimodal posterior); sample longer (warmup, draws) or look at plot('trace')"
            )
        if unknown:
            # split R-hat of one chain whose draws do not vary (a stuck chain) is NaN: say
            # that mixing was not measured rather than that chains disagree
            notes.append(
                f"R-hat could not be computed for {unknown} (draws that do not vary, or too "
                "few): mixing is unchecked; sample more draws, with chains >= 2"
            )
        low = [n for n, row in table.items() if not row["ess"] >= ESS_PER_CHAIN * self.chains]
        if low:
            notes.append(
                f"fewer than {ESS_PER_CHAIN} effective draws per chain for {low}: means and "
                "quantiles are uncertain; sample more draws"
            )
        return tuple(notes)

    def _stuck_chains(self) -> list[int]:
        """Chains whose adapted step size collapsed (below 1e-3 of the largest chain's, or
        below 1e-8 on its own) or whose draws never change."""
        steps = np.asarray(self.sample_stats["step_size"], float)
        stuck = set(np.nonzero((steps < 1e-3 * np.max(steps)) | (steps < 1e-8))[0].tolist())
        for _, _, x in self._entries():
            stuck |= (
                set(np.nonzero(np.ptp(x, axis=1) == 0)[0].tolist()) if self.draws > 1 else set()
            )
        return sorted(stuck)

    def summary(self, quantiles=(0.05, 0.5, 0.95)) -> str:
        """A text table of `table()` with the sampler's settings and warnings."""
        quantiles = _checked_quantiles(quantiles)
        s = self.settings
        lines = [
            f"posterior of {s.model}: NUTS, {self.chains} chains × {self.draws} draws "
            f"(warm-up {s.warmup}), {self.likelihood} likelihood, {self.seconds:.1f} s"
            + "".join(f"; {k} {v:.1f} s" for k, v in self.timings.items()),
            f"divergences {self.divergences.tolist()}; step size "
            f"{[float(f'{h:.3g}') for h in np.asarray(self.sample_stats['step_size'])]}; mean "
            "leapfrog "
            f"steps {float(np.mean(self.sample_stats['n_steps'])):.1f}",
        ]
        table = self.table(quantiles)
        header = ["parameter", "mean", "sd", *[f"{100 * q:g}%" for q in quantiles]]
        header += ["mcse", "ess", "r_hat"]
        rows = [header]
        for name, row in table.items():
            rows.append(
                [name]
                + [f"{row[k]:.5g}" for k in header[1:-3]]
                + [f"{row['mcse']:.2g}", f"{row['ess']:.0f}", f"{row['r_hat']:.3f}"]
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        for row in rows:
            lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        lines += [f"warning: {w}" for w in self._notes(table)]
        return "\n".join(lines)

    # --- ArviZ and files ------------------------------------------------------------------------

    def to_arviz(self):
        """An `arviz.InferenceData` with the groups posterior, sample_stats, observed_data and
        posterior_predictive (the replicated data, as `y`, over the kept draws), labelled by
        time and observable."""
        az = arviz()
        if self.data is None:  # a study's posterior: its measurements live in its problem
            coords, dims, observed = None, None, None
        else:
            times = np.asarray(self.data.ts)
            values = self.data.values.reshape(len(times), -1)
            observables = list(self.data.names or [str(j) for j in range(values.shape[1])])
            coords = {"time": times, "observable": observables}
            dims = {"y": ["time", "observable"], "mu": ["time", "observable"]}
            observed = {"y": values}
        posterior_predictive = None
        if self.replicated is not None:
            posterior_predictive = {"y": self.replicated, "mu": self.predictions}
        stats = {k: v for k, v in self.sample_stats.items() if np.ndim(v) == 2}
        idata = az.from_dict(
            posterior={k: np.asarray(v) for k, v in self.samples.items()},
            sample_stats=stats,
            observed_data=observed,
            posterior_predictive=posterior_predictive,
            coords=coords,
            dims=dims,
            attrs=self._provenance(),
        )
        if posterior_predictive is not None and self.settings.thin > 1:
            idata.posterior_predictive.attrs["thin"] = self.settings.thin
        return idata

    def _provenance(self) -> dict:
        """Attributes of the saved file: how and with what it was made (strings and numbers,
        as netCDF attributes must be)."""
        settings = dataclasses.asdict(self.settings)
        settings["priors"] = json.dumps(settings["priors"])
        settings["dense_mass"] = int(settings["dense_mass"])  # netCDF has no booleans
        return dict(
            created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            created_by="diffsim.sample",
            likelihood=self.likelihood,
            t0=float(self.t0),
            seconds=float(self.seconds),
            timings=json.dumps(self.timings),
            step_size=json.dumps(np.asarray(self.sample_stats["step_size"]).tolist()),
            warmup_divergences=json.dumps(np.asarray(self.warmup_divergences).tolist()),
            package_versions=json.dumps(package_versions()),
            **{f"setting_{k}": v for k, v in settings.items()},
        )

    def save(self, path) -> Path:
        """Write the posterior (with its provenance) to a netCDF file; returns the path.
        `ds.Posterior.load(path)` reads it back (without the model: `predict` then needs the
        original posterior)."""
        path = user_path(path, "Posterior.save(path)")
        if path.is_dir():
            raise IsADirectoryError(
                f"Posterior.save: {path} is a folder; give a file name, e.g. "
                f"{path / 'posterior.nc'}"
            )
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.to_arviz().to_netcdf(str(path))
        except OSError as error:
            cause = getattr(error, "strerror", None) or error
            raise OSError(
                f"Posterior.save could not write {path} ({type(error).__name__}: {cause}): "
                "choose a folder you can write to (its parents must be folders, not files)"
            ) from None
        return path

    @classmethod
    def load(cls, path) -> "Posterior":
        """A posterior saved by `save`: the draws, statistics, data and settings.

        **Raises:** `FileNotFoundError` when there is no file at `path`;
        `ds.PosteriorFileError` when the file is not one `save` wrote, or is damaged (truncated,
        edited, or inconsistent with itself): every part of it is checked against the others
        before it is used."""
        return cls(**posterior_file.read(path, PosteriorSettings))

    # --- predictions and figures ----------------------------------------------------------------

    def predict(self, ts=None, *, draws: int = 400, level: float = 0.9, key=None):
        """Posterior predictive bands at times `ts` (default: 200 times from t0 to the last data
        time): for `draws` posterior draws spread over the chains, the model's observables and
        data drawn around them from the likelihood (by numpy's generator, seeded by `key`,
        a JAX PRNG key; default `jax.random.key(0)`).

        **Returns:** an `xarray.Dataset` over `time` and `observable` with `median`, `low` and
        `high` (the central `level` band) of the model (`model_*`) and of new data (`data_*`).
        """
        import jax
        import jax.numpy as jnp
        import xarray as xr

        from .._validate import check_key, check_real, check_static_count
        from .evaluate import fine_times

        if self.data is None:
            raise ValueError(
                "the posterior of a study predicts through its problem: "
                "problem.predictions(params) at any draw (posterior.samples)"
            )
        if self._density is None:
            raise ValueError(
                "this posterior was loaded from a file, without its model: predict with the "
                "posterior ds.sample returned"
            )
        check_static_count("draws", draws)
        if not 0 < check_real("level", level) < 1:
            raise ValueError(f"level must be in (0, 1), got {level}")
        if key is not None:
            check_key("key", key)
        density = self._density
        problem = density.problem
        if ts is None:
            ts = fine_times(problem, 200)
        ts = np.asarray(ts, float)
        if ts.ndim != 1 or ts.size < 1 or np.any(np.diff(ts) <= 0) or ts[0] < self.t0:
            raise ValueError(
                f"ts must be increasing times from t0 = {self.t0:g} on, got shape {ts.shape}"
            )
        times = (self.t0, *ts.tolist()) if ts[0] > self.t0 else tuple(ts.tolist())
        fine = dataclasses.replace(
            problem,
            ts=tuple(float(t) for t in times),
            first_observed=len(times) - len(ts),
            windows=((0, len(times) - 1),),
            batched=False,
            steps_per_save=None,
        )
        fine_density = dataclasses.replace(density, problem=fine)
        theta = np.concatenate(
            [np.asarray(self.samples[n]).reshape(self.chains, self.draws, -1) for n in self.names],
            axis=-1,
        ).reshape(self.chains * self.draws, -1)
        pick = np.linspace(0, theta.shape[0] - 1, min(draws, theta.shape[0])).astype(int)
        key = jax.random.key(0) if key is None else key
        with third_party_promotion():
            model, data = _predictive(fine_density, jnp.asarray(theta[pick], problem.y0.dtype), key)
        model, data = np.asarray(model), np.asarray(data)
        names = list(self.data.names or [str(j) for j in range(model.shape[-1])])
        low, high = (1 - level) / 2, 1 - (1 - level) / 2
        variables = {}
        for prefix, x in (("model", model), ("data", data)):
            for label, q in (("low", low), ("median", 0.5), ("high", high)):
                variables[f"{prefix}_{label}"] = (
                    ("time", "observable"),
                    np.nanquantile(x, q, axis=0),
                )
        return xr.Dataset(
            variables,
            coords={"time": ts, "observable": names},
            attrs=dict(level=level, draws=len(pick), likelihood=self.likelihood),
        )

    def plot(self, kind: str = "predictive", **kwargs):
        """A figure: `"predictive"` (the data over the posterior predictive bands of
        `predict()`), `"trace"` (each unknown's draws per chain and their density, by ArviZ) or
        `"pair"` (pairwise scatter of the unknowns, by ArviZ, divergences marked)."""
        from .plot import posterior_figure

        return posterior_figure(self, kind, **kwargs)


def _checked_quantiles(quantiles) -> tuple[float, ...]:
    """`quantiles` as a tuple of probabilities in (0, 1) (a single number is one quantile)."""
    if isinstance(quantiles, (int, float, np.number)) and not isinstance(quantiles, bool):
        quantiles = (quantiles,)
    try:
        values = tuple(float(q) for q in quantiles)
    except (TypeError, ValueError):
        raise TypeError(
            f"quantiles must be probabilities, e.g. (0.05, 0.5, 0.95), got {quantiles!r}"
        ) from None
    bad = [q for q in values if not 0 < q < 1]
    if bad:
        raise ValueError(f"quantiles must lie in (0, 1), got {bad}")
    return values


def _predictive(density, theta, key):
    """The model's observables at `theta` (draws, unknowns) and data drawn around them (on
    the host, `likelihood.draw`, from a generator seeded by `key`)."""
    import jax

    from . import likelihood as lik

    predictions, extra = jax.device_get(_predictions_at(density, theta))
    rng = lik.generator(jax.random.key_data(key))
    return predictions, lik.draw(density.likelihood, rng, predictions, extra)


# At module level (not defined inside `_predictive`) so that a second `predict` at the same
# times (another level or key) finds this program traced and compiled already.
@jit
def _predictions_at(density, theta):
    """The observables at every draw of `theta` (draws, unknowns) and the likelihood's extra
    parameters (estimated noise) there, or None."""
    import jax

    extra = jax.vmap(density.extra)(theta) if density.extra_count else None
    return jax.vmap(density.predictions)(theta), extra
