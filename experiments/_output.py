"""Writing an experiment's outputs: figures (PNG and PDF, no timestamps), tables, a summary;
and the command line every experiment script shares."""

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


def figure(fig, out: Path, name: str) -> list[str]:
    """Save `fig` as `name`.png and `name`.pdf without creation dates (byte-stable reruns)."""
    out = Path(out)
    fig.savefig(out / f"{name}.png", dpi=130, metadata={"Software": None})
    fig.savefig(out / f"{name}.pdf", metadata={"CreationDate": None, "Producer": None})
    return [f"{name}.png", f"{name}.pdf"]


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


def main(run, doc: str, name: str) -> None:
    """`python experiments/<name>.py [--out DIR] [--quick]`: parse and call `run(out, quick)`."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", default=f"out/{name}", help=f"output folder (out/{name})")
    parser.add_argument("--quick", action="store_true", help="the reduced run of the tests")
    args = parser.parse_args()
    run(args.out, args.quick)
