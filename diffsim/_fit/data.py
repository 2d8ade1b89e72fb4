"""`ds.Data`: observation times and values for `ds.fit`, from arrays, tables or CSV files."""

import csv
import dataclasses
import os
import re

import numpy as np

from .._validate import user_path
from .._warn import warn


class FitWarning(UserWarning):
    """A fit finished, but something about it needs attention (convergence, identifiability),
    or its data were read with cells taken as missing."""


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
        ts = _real_array("data times", self.ts)
        values = _real_array("data values", self.values)
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
            if not np.any((weights > 0) & ~np.isnan(values)):
                raise ValueError(
                    "every observed value has weight 0: there is nothing to fit (a weight of 0 "
                    "leaves a value out, like a missing one)"
                )
            object.__setattr__(self, "weights", weights)
        if self.names is not None:
            names = (self.names,) if isinstance(self.names, str) else self.names
            names = tuple(str(n) for n in names)
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
    def from_csv(
        cls, path, *, time: str | None = None, columns=None, na_values=(), **options
    ) -> "Data":
        """Read a comma-separated file with a header row: the `time` column (default: the
        first) holds the times, `columns` (default: all others) the values.

        Cells are numbers (quoted or not, spaces around them allowed). Empty cells and `nan`
        are missing values; so are the texts listed in `na_values` (e.g. `("n/a",
        "unknown")`), with a `ds.FitWarning` that counts them. Any other cell (a formula such
        as `=1+2`, a unit, a date) is an error naming its line and column: nothing is read as
        missing by accident. Lines starting with `#` are comments; a UTF-8 byte order mark is
        ignored. `options` (`noise`, `weights`) are passed to `ds.Data`.
        """
        path = str(user_path(path, "Data.from_csv(path)"))
        header, rows = _read_csv(path)
        table = _parse_cells(path, header, rows, set(na_values))
        return cls._from_columns(table, path, time, columns, options)

    @classmethod
    def from_frame(cls, frame, *, time: str | None = None, columns=None, **options) -> "Data":
        """A pandas DataFrame (or Series): the `time` column, or the index when `time` is
        None; `columns` (default: all others) hold the values. Every cell must be a number
        (NaN: missing); dates and text are refused with their row and column named."""
        if type(frame).__name__ == "Series":
            frame = frame.to_frame(name=frame.name if frame.name is not None else "value")
        names = [str(c) for c in frame.columns]
        if len(set(names)) != len(names):
            raise ValueError(f"DataFrame: duplicate column names {_duplicates(names)}")
        labels = [str(i) for i in frame.index]
        table = {}
        if time is None:
            if type(frame.index).__name__ == "RangeIndex":
                raise ValueError(
                    "DataFrame: the times are taken from the index, but it is the default "
                    "0, 1, 2, …: pass time='<column>' naming the time column, or set the index "
                    "to the times (frame.set_index('t'))"
                )
            table[_INDEX] = _numeric_column("DataFrame index (the times)", frame.index, labels)
            time = _INDEX
        for column, name in zip(frame.columns, names):
            table[name] = _numeric_column(f"DataFrame column {name!r}", frame[column], labels)
        columns = None if columns is None else [str(c) for c in columns]
        return cls._from_columns(table, "DataFrame", time, columns, options)

    @classmethod
    def from_xarray(cls, data, *, time: str | None = None, columns=None, **options) -> "Data":
        """An xarray DataArray (dimensions `(time,)` or `(time, observable)`) or Dataset (each
        variable one observable); `time` names the time dimension (default: the first)."""
        import xarray as xr

        if time is not None and time not in data.dims:
            raise ValueError(
                f"xarray data: no dimension {time!r} for the times; its dimensions are "
                f"{list(data.dims)}"
            )
        if isinstance(data, xr.Dataset):
            dim = time or list(data.dims)[0]
            names = list(columns) if columns is not None else list(data.data_vars)
            for name in names:
                if name not in data.data_vars:
                    raise ValueError(
                        f"xarray Dataset: no variable {name!r}; variables: {list(data.data_vars)}"
                    )
                if data[name].dims != (dim,):
                    raise ValueError(
                        f"xarray Dataset: variable {name!r} has dimensions {data[name].dims}; "
                        f"each variable must be one observable along {dim!r} alone"
                    )
            frame = data[names].to_dataframe()
            return cls.from_frame(frame, columns=names, **options)
        dim = time or data.dims[0]
        if data.ndim not in (1, 2):
            raise ValueError(
                f"xarray DataArray: expected dimensions (time,) or (time, observable), got "
                f"{data.dims}"
            )
        if dim not in data.coords:
            raise ValueError(
                f"xarray DataArray: the time dimension {dim!r} has no coordinate with the times"
            )
        labels = [str(v) for v in np.asarray(data[dim].values)]
        ts = _numeric_column(f"the coordinate {dim!r} (the times)", data[dim].values, labels)
        values = data.transpose(dim, ...).values
        if not np.issubdtype(np.asarray(values).dtype, np.number) or np.iscomplexobj(values):
            raise ValueError(
                f"xarray DataArray: values of dtype {np.asarray(values).dtype}; they must be "
                "real numbers"
            )
        values = np.asarray(values, dtype=np.float64)
        names = None
        if values.ndim == 2:
            other = [d for d in data.dims if d != dim][0]
            names = (
                tuple(str(v) for v in np.asarray(data[other].values))
                if other in data.coords
                else None
            )
        elif data.name is not None:
            names = (str(data.name),)
        return cls(ts, values, names=names, **options)

    @classmethod
    def _from_columns(cls, table, where, time, columns, options) -> "Data":
        names = list(table)
        shown = [n for n in names if n != _INDEX]
        time = time if time is not None else names[0]
        if time not in table:
            raise ValueError(f"{where}: no time column {time!r}; columns: {shown}")
        columns = [c for c in names if c != time] if columns is None else list(columns)
        missing = [c for c in columns if c not in table]
        if missing:
            raise ValueError(f"{where}: no column(s) {missing}; columns: {shown}")
        if not columns:
            raise ValueError(f"{where}: no value columns besides the time column {time!r}")
        if time in columns:
            raise ValueError(f"{where}: the time column {time!r} is also listed among columns")
        ts = table[time]
        if np.any(np.isnan(ts)):
            row = int(np.argmax(np.isnan(ts)))
            raise ValueError(f"{where}: the time column {time!r} has no time in row {row + 1}")
        empty = [c for c in columns if np.all(np.isnan(table[c]))]
        if empty:
            raise ValueError(
                f"{where}: column(s) {empty} hold no values (every cell missing); leave them "
                "out with columns=[...]"
            )
        values = np.stack([table[c] for c in columns], axis=1)
        return cls(ts, values, names=tuple(columns), **options)


# the name an index takes in a table of columns (never shown in messages)
_INDEX = "\x00index"
_NUMBER = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?$")
_MISSING = ("", "nan", "NaN", "NAN")
_INFINITE = {
    "inf": np.inf,
    "+inf": np.inf,
    "-inf": -np.inf,
    "Inf": np.inf,
    "-Inf": -np.inf,
    "infinity": np.inf,
    "-infinity": -np.inf,
}


def _read_csv(path: str) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """The header and the (line number, cells) of each data row of a CSV file, checked for
    the faults that would shift or drop values silently."""
    if os.path.isdir(path):
        raise ValueError(f"{path!r} is a folder, not a CSV file")
    if not os.path.exists(path):
        raise FileNotFoundError(f"no data file at {path!r}")
    try:
        with open(path, encoding="utf-8-sig", newline="") as file:
            lines = list(csv.reader(file))
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{path}: not UTF-8 text (byte {error.object[error.start]:#04x} at position "
            f"{error.start}): save the file as UTF-8"
        ) from None
    except csv.Error as error:
        raise ValueError(f"{path}: not a readable CSV file ({error})") from None
    except OSError as error:
        raise ValueError(f"{path}: cannot be read ({error.strerror or error})") from None
    numbered = [
        (n, [cell.strip() for cell in cells])
        for n, cells in enumerate(lines, start=1)
        if cells and not cells[0].lstrip().startswith("#") and any(c.strip() for c in cells)
    ]
    if not numbered:
        raise ValueError(f"{path}: the file holds no header row and no data")
    (_, header), rows = numbered[0], numbered[1:]
    if len(header) == 1 and ";" in header[0]:
        raise ValueError(
            f"{path}: the header {header[0]!r} looks separated by semicolons; diffsim reads "
            "comma-separated files"
        )
    if all(_NUMBER.match(name) for name in header):
        raise ValueError(
            f"{path}: the first line {','.join(header)!r} holds numbers, not column names: add "
            "a header row naming the columns"
        )
    if not rows:
        raise ValueError(f"{path}: the file has a header but no data rows")
    for n, cells in rows:
        if len(cells) != len(header):
            raise ValueError(
                f"{path}, line {n}: {len(cells)} cells, but the header names {len(header)} columns"
            )
    # an unnamed column with no values is a trailing comma, not an observable
    keep = [j for j, name in enumerate(header) if name or any(cells[j] for _, cells in rows)]
    header = [header[j] for j in keep]
    rows = [(n, [cells[j] for j in keep]) for n, cells in rows]
    unnamed = [j + 1 for j, name in enumerate(header) if not name]
    if unnamed:
        raise ValueError(f"{path}: column(s) {unnamed} hold values but have no name in the header")
    if len(set(header)) != len(header):
        raise ValueError(f"{path}: duplicate column names {_duplicates(header)} in the header")
    return header, rows


def _parse_cells(path, header, rows, na_values: set) -> dict[str, np.ndarray]:
    """Columns of numbers; every cell that is neither a number nor missing is named."""
    table = {name: np.empty(len(rows)) for name in header}
    bad, allowed = [], []
    for i, (n, cells) in enumerate(rows):
        for name, cell in zip(header, cells):
            value = _number(cell)
            if value is None:
                if cell in na_values:
                    allowed.append((n, name, cell))
                    value = np.nan
                else:
                    bad.append((n, name, cell))
                    continue
            table[name][i] = value
    if bad:
        raise ValueError(
            f"{path}: {_cells(bad)} {'is' if len(bad) == 1 else 'are'} not a number. {_CELL_HINT}"
        )
    if allowed:
        warn(
            f"{path}: {len(allowed)} cell(s) read as missing values because na_values lists "
            f"them: {_cells(allowed)}",
            FitWarning,
        )
    return table


_CELL_HINT = (
    "Every cell must be a number or empty (a missing value); export spreadsheet formulas as "
    "their values, convert dates to numbers (e.g. decimal years), and list the texts that mark "
    "missing values in na_values=(...)"
)


def _number(cell: str) -> float | None:
    """The value of a cell: a float, NaN for a missing value, None for anything else."""
    if cell in _MISSING:
        return np.nan
    if cell in _INFINITE or cell.lower() in _INFINITE:
        return _INFINITE[cell.lower()]
    if _NUMBER.match(cell):
        return float(cell)
    return None


def _cells(found: list[tuple[int, str, str]], limit: int = 5) -> str:
    shown = ", ".join(f"line {n}, column {name!r}: {cell!r}" for n, name, cell in found[:limit])
    more = f" (and {len(found) - limit} more)" if len(found) > limit else ""
    return shown + more


def _duplicates(names) -> list[str]:
    return sorted({n for n in names if list(names).count(n) > 1})


def _numeric_column(where: str, column, labels) -> np.ndarray:
    """A table column (pandas, numpy) as float64, refusing dates, text and complex numbers
    with the first offending row named."""
    array = np.asarray(column)
    kind = array.dtype.kind
    if kind in "Mm":
        raise ValueError(
            f"{where} holds {'dates' if kind == 'M' else 'durations'} ({array.dtype}); give "
            "the times as numbers, e.g. decimal years or seconds since the start "
            "((index - index[0]) / pandas.Timedelta(seconds=1))"
        )
    if kind == "c":
        raise ValueError(f"{where} holds complex numbers; the data must be real")
    if kind in "biuf":
        return array.astype(np.float64)
    values = np.empty(array.shape[0])
    for i, cell in enumerate(array):
        if isinstance(cell, (int, float, np.integer, np.floating)) and not isinstance(cell, bool):
            values[i] = float(cell)
            continue
        value = _number(str(cell).strip()) if isinstance(cell, str) else None
        if cell is None:
            value = np.nan
        if value is None:
            shown = repr(str(cell)) if isinstance(cell, str) else repr(cell)
            raise ValueError(
                f"{where}: row {labels[i]!r} holds {shown}, which is not a number. {_CELL_HINT}"
            )
        values[i] = value
    return values


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


def _real_array(where: str, x) -> np.ndarray:
    """`x` as a float64 array, with a message naming `where` for ragged, complex or
    non-numeric input."""
    try:
        array = np.asarray(x)
    except ValueError:
        raise ValueError(
            f"{where} must be a rectangular array of numbers (rows of equal length)"
        ) from None
    if array.dtype.kind == "c":
        raise ValueError(f"{where} are complex numbers; they must be real")
    if array.dtype.kind not in "biuf":
        raise ValueError(
            f"{where} must be numbers, got an array of dtype {array.dtype} (read files with "
            "ds.Data.from_csv, which names the cells that are not numbers)"
        )
    return array.astype(np.float64)


def _per_value(name, x, shape) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    try:
        return np.broadcast_to(x, shape).copy()
    except ValueError:
        raise ValueError(
            f"{name} of shape {x.shape} does not fit the data values of shape {shape}: give a "
            "scalar, one per observable, or one per value"
        ) from None
