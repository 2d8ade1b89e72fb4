"""`ds.Data`: observation times and values for `ds.fit`, from arrays, tables or CSV files."""

import dataclasses
import os

import numpy as np


@dataclasses.dataclass(frozen=True)
class Data:
    """Observations of a system: what `ds.fit` fits a model to.

    - `ts`: observation times, shape `(times,)`, strictly increasing.
    - `values`: the measurements, shape `(times,)` (one observable) or `(times, observables)`.
      NaN marks a missing value; it is ignored by the fit.
    - `noise`: optional standard deviation of the measurement noise, in the units of `values`
      (of their logarithms when fitted with `loss="log"`), a scalar, one per observable, or one
      per value. With it the residuals are divided by
      it and the covariance is absolute (scipy's `absolute_sigma=True`).
    - `weights`: optional relative weights (≥ 0; residuals are multiplied by `sqrt(weights)`);
      the noise level is then estimated from the residuals. Not together with `noise`.
    - `names`: optional names of the observables (e.g. the CSV columns), used in tables and plots.

    Build from arrays (`ds.Data(ts, values)`), a CSV file (`ds.Data.from_csv(path)`), a pandas
    DataFrame (`ds.Data.from_frame(df)`) or an xarray object (`ds.Data.from_xarray(da)`).
    """

    ts: np.ndarray
    values: np.ndarray
    noise: np.ndarray | None = None
    weights: np.ndarray | None = None
    names: tuple[str, ...] | None = None

    def __post_init__(self):
        ts = np.asarray(self.ts, dtype=np.float64)
        values = np.asarray(self.values, dtype=np.float64)
        if ts.ndim != 1 or ts.size < 1:
            raise ValueError(f"data times must be a 1-D array of at least one time, got {ts.shape}")
        if not np.all(np.isfinite(ts)):
            raise ValueError("data times hold NaN or inf; every observation needs a finite time")
        if np.any(np.diff(ts) <= 0):
            bad = int(np.argmax(np.diff(ts) <= 0))
            raise ValueError(
                f"data times must be strictly increasing; t[{bad}]={ts[bad]:g} is followed by "
                f"t[{bad + 1}]={ts[bad + 1]:g} (sort the data, and average repeated times)"
            )
        if values.ndim not in (1, 2) or values.shape[0] != ts.shape[0]:
            raise ValueError(
                f"data values must have shape (times,) or (times, observables) with "
                f"times={ts.shape[0]} (one row per observation time), got {values.shape}"
            )
        if np.any(np.isinf(values)):
            raise ValueError("data values hold inf; mark missing values with NaN instead")
        if np.all(np.isnan(values)):
            raise ValueError("every data value is NaN: there is nothing to fit")
        if self.noise is not None and self.weights is not None:
            raise ValueError(
                "give noise (absolute standard deviations) or weights (relative), not both"
            )
        object.__setattr__(self, "ts", ts)
        object.__setattr__(self, "values", values)
        if self.noise is not None:
            noise = _per_value("noise", self.noise, values.shape)
            if np.any(~np.isfinite(noise) | (noise <= 0)):
                raise ValueError(
                    "noise must be positive and finite (it is the standard deviation of each "
                    f"measurement), got min {np.nanmin(noise):g}"
                )
            object.__setattr__(self, "noise", noise)
        if self.weights is not None:
            weights = _per_value("weights", self.weights, values.shape)
            if np.any(~np.isfinite(weights) | (weights < 0)):
                raise ValueError("weights must be finite and >= 0")
            object.__setattr__(self, "weights", weights)
        if self.names is not None:
            names = tuple(str(n) for n in self.names)
            if len(names) != self.num_observables:
                raise ValueError(
                    f"{len(names)} names for {self.num_observables} observables: {names}"
                )
            object.__setattr__(self, "names", names)

    @property
    def num_observables(self) -> int:
        return 1 if self.values.ndim == 1 else self.values.shape[1]

    @property
    def num_observed(self) -> int:
        """How many values are not missing (a fit also leaves out values of weight 0)."""
        return int(np.sum(~np.isnan(self.values)))

    @classmethod
    def from_csv(cls, path, *, time: str | None = None, columns=None, **options) -> "Data":
        """Read a CSV file with a header row: the `time` column (default: the first) holds the
        times, `columns` (default: all others) the values. Empty cells are missing values.
        `options` (`noise`, `weights`) are passed to `ds.Data`."""
        path = os.fspath(path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"no data file at {path!r}")
        with open(path, encoding="utf-8") as file:
            header = [h.strip() for h in file.readline().strip().split(",")]
        table = np.genfromtxt(path, delimiter=",", skip_header=1, dtype=np.float64, ndmin=2)
        if table.shape[1] != len(header):
            raise ValueError(f"{path}: {len(header)} header names but {table.shape[1]} columns")
        return cls._from_columns(
            {name: table[:, i] for i, name in enumerate(header)}, path, time, columns, options
        )

    @classmethod
    def from_frame(cls, frame, *, time: str | None = None, columns=None, **options) -> "Data":
        """A pandas DataFrame: the `time` column, or the index when `time` is None; `columns`
        (default: all others) hold the values."""
        if time is None:
            table = {"__index__": np.asarray(frame.index, dtype=np.float64)}
            time = "__index__"
        else:
            table = {}
        table.update({str(c): np.asarray(frame[c], dtype=np.float64) for c in frame.columns})
        return cls._from_columns(table, "DataFrame", time, columns, options)

    @classmethod
    def from_xarray(cls, data, *, time: str | None = None, columns=None, **options) -> "Data":
        """An xarray DataArray (dimensions `(time,)` or `(time, observable)`) or Dataset (each
        variable one observable); `time` names the time dimension (default: the first)."""
        import xarray as xr

        if isinstance(data, xr.Dataset):
            frame = data.to_dataframe() if time is None else data.to_dataframe().reset_index()
            names = list(columns) if columns is not None else list(data.data_vars)
            return cls.from_frame(frame, time=time, columns=names, **options)
        dim = time or data.dims[0]
        values = np.asarray(data.transpose(dim, ...).values, dtype=np.float64)
        names = None
        if values.ndim == 2:
            other = [d for d in data.dims if d != dim][0]
            names = tuple(str(v) for v in np.asarray(data[other].values))
        elif data.name is not None:
            names = (str(data.name),)
        return cls(np.asarray(data[dim].values, dtype=np.float64), values, names=names, **options)

    @classmethod
    def _from_columns(cls, table, where, time, columns, options) -> "Data":
        names = list(table)
        time = time if time is not None else names[0]
        if time not in table:
            raise ValueError(f"{where}: no time column {time!r}; columns: {names}")
        columns = [c for c in names if c != time] if columns is None else list(columns)
        missing = [c for c in columns if c not in table]
        if missing:
            raise ValueError(f"{where}: no column(s) {missing}; columns: {names}")
        if not columns:
            raise ValueError(f"{where}: no value columns besides the time column {time!r}")
        values = np.stack([table[c] for c in columns], axis=1)
        return cls(table[time], values, names=tuple(columns), **options)


def as_data(data, noise=None, weights=None) -> Data:
    """What `ds.fit` accepts as data, as a `Data`: a `Data`, a `(ts, values)` tuple, a CSV path,
    a pandas DataFrame or an xarray object; `noise`/`weights` given to `fit` override the data's."""
    if isinstance(data, Data):
        if noise is None and weights is None:
            return data
        return dataclasses.replace(data, noise=noise, weights=weights)
    options = dict(noise=noise, weights=weights)
    if isinstance(data, (str, os.PathLike)):
        return Data.from_csv(data, **options)
    if isinstance(data, tuple):
        if len(data) != 2:
            raise ValueError(
                f"data as a tuple must be (ts, values), got a tuple of {len(data)} items"
            )
        return Data(data[0], data[1], **options)
    module = type(data).__module__.split(".")[0]
    if module == "pandas":
        return Data.from_frame(data, **options)
    if module == "xarray":
        return Data.from_xarray(data, **options)
    raise TypeError(
        "data must be a ds.Data, a (ts, values) tuple, a CSV path, a pandas DataFrame or an "
        f"xarray object, got {type(data).__name__}"
    )


def _per_value(name, x, shape) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    try:
        return np.broadcast_to(x, shape).copy()
    except ValueError:
        raise ValueError(
            f"{name} of shape {x.shape} does not fit the data values of shape {shape}: give a "
            "scalar, one per observable, or one per value"
        ) from None
