"""What the experiments share: their output folder and pyplot, data files (netCDF via xarray,
CSV for small tables, a JSON summary) and the command line of each script.

Figures are saved with `ds.plot.save` (PNG and PDF without timestamps); `diffsim reproduce`
(or `python experiments/<name>.py`) runs `run(out_dir, quick)` under diffsim's plot style and
writes the manifest beside the outputs.
"""

import argparse
import csv
import json
from pathlib import Path

import numpy as np


def prepare(out_dir):
    """Create the output folder and return it with pyplot (the file-only Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return out, plt


def dataset(out: Path, name: str, data) -> str:
    """Write an `xarray.Dataset` as `name`.nc (netCDF4 through h5netcdf: no timestamps in the
    file, so reruns write the same bytes)."""
    data.to_netcdf(Path(out) / f"{name}.nc", engine="h5netcdf")
    return f"{name}.nc"


def table(out: Path, name: str, columns: dict) -> str:
    """Write equal-length columns (name → values) as `name`.csv."""
    keys = list(columns)
    rows = zip(*(np.asarray(columns[k]).tolist() for k in keys))
    with open(Path(out) / f"{name}.csv", "w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(keys)
        writer.writerows(rows)
    return f"{name}.csv"


def summary(out: Path, name: str, record: dict) -> str:
    with open(Path(out) / f"{name}.json", "w", encoding="utf-8") as file:
        json.dump(record, file, indent=1, default=float)
    return f"{name}.json"


def main(path: str, doc: str) -> None:
    """`python experiments/<name>.py [--out DIR] [--quick]`: run the experiment in `path` with
    its manifest, as `diffsim reproduce <name>` does (there in a process of its own)."""
    from diffsim._apps.experiment import run_experiment

    name = Path(path).stem
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", default=f"out/{name}", help=f"output folder (out/{name})")
    parser.add_argument("--quick", action="store_true", help="the reduced run of the tests")
    args = parser.parse_args()
    manifest = run_experiment(path, args.out, quick=args.quick)
    print(f"{name}: {len(manifest['files'])} files in {manifest['wall_time_s']:.1f} s → {args.out}")
