"""SBML's semantic test suite run through `ds.sbml.load`: every time-course case, its result.

Not shipped with the project (1,800 cases): give the `cases/semantic` folder of a checkout of
github.com/sbmlteam/sbml-test-suite. Each case is loaded (its highest-level file), simulated
from `model.initial_state()` over the case's times with `ds.Rodas5P(rtol=1e-10, atol=1e-12)`,
and every listed variable compared with the case's criterion |expected − value| ≤ absolute +
relative·|expected| (species reported as the amounts or concentrations the case asks for). A
model runs through `ds.simulate`, which runs its events itself (with `--by-problem`, one with
time-triggered events runs as a `ds.Problem` with `model.changes()`, as `ds.petab.load` runs
one). Outcomes: pass, fail (the variables out of tolerance), refused (diffsim's message:
what it does not read), error (anything else: a defect).

Run: `python experiments/conformance/sbml_test_suite.py CASES_DIR [case ...] [--out FILE.json]`
(`--events`: only the cases with events without delays; `--by-problem`: above).
"""

import argparse
import collections
import json
import re
import sys
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import libsbml
import numpy as np

import diffsim as ds


def _settings(folder: Path, case: str) -> dict:
    lines = (folder / f"{case}-settings.txt").read_text().splitlines()
    return {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in lines if ":" in line)}


def _listed(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def _reported(document, model, name: str, amounts: set):
    """`(t, y, params) -> the value the case reports for `name``: a species in the units the case
    asks for (an amount is the concentration times its compartment's size)."""
    species = document.getModel().getSpecies(name)
    scaled = None
    if species is not None and name in amounts and not species.getHasOnlySubstanceUnits():
        compartment = document.getModel().getCompartment(species.getCompartment())
        if compartment.getSpatialDimensionsAsDouble() != 0:  # dimension 0: amounts already
            scaled = compartment.getId()

    def value(t, y, params):
        env = model.environment(t, y, params)
        return env[name] * env[scaled] if scaled else env[name]

    return value


def run_case(folder: Path, by_problem: bool = False) -> tuple[str, str]:
    case = folder.name
    xml = sorted(folder.glob(f"{case}-sbml-l*.xml"))[-1]
    try:
        model = ds.sbml.load(xml)
    except ds.sbml.SBMLError as error:
        return "refused", str(error).split(": ", 1)[-1]
    settings = _settings(folder, case)
    names, amounts = _listed(settings["variables"]), set(_listed(settings["amount"]))
    start, duration = float(settings["start"]), float(settings["duration"])
    ts = np.linspace(start, start + duration, int(settings["steps"]) + 1)
    document = libsbml.readSBMLFromFile(str(xml))
    expected = np.genfromtxt(folder / f"{case}-results.csv", delimiter=",", names=True)
    try:
        if model.timed_events and by_problem:
            values = _by_problem(model, document, names, amounts, ts, start)
        else:
            y0 = model.initial_state()
            if model.moved_by_time_events:  # the parameters events set, reported as states
                moved = model.moved_by_time_events
                y0 = np.concatenate([y0, [model.params[n] for n in moved]])
                model = model.with_states(moved)
            solution = ds.simulate(
                model,
                y0,
                ts,
                solver=ds.Rodas5P(rtol=1e-10, atol=1e-12),
                throw=False,
                max_steps=100_000,
            )
            values = {
                n: np.asarray(
                    [
                        _reported(document, model, n, amounts)(t, y, model.params)
                        for t, y in zip(ts, solution.ys)
                    ]
                )
                for n in names
            }
    except ds.sbml.SBMLError as error:
        return "refused", str(error).split(": ", 1)[-1]
    except Exception as error:  # a defect to report, not to hide: the loop goes on
        return "error", f"{type(error).__name__}: {error}"
    allowed = lambda e: float(settings["absolute"]) + float(settings["relative"]) * np.abs(e)  # noqa: E731
    bad = [
        n
        for n in names
        if not np.all(np.abs(values[n] - expected[n]) <= allowed(expected[n]))  # NaN fails
    ]
    return ("fail", f"out of tolerance: {', '.join(bad)}") if bad else ("pass", "")


def _by_problem(model, document, names, amounts, ts, start) -> dict:
    """The reported values of a model with time-triggered events, run as a `ds.Problem` whose
    one experiment has the events as changes at given times."""
    plain = model.without_events()
    data = {
        "time": np.repeat(ts, len(names)),
        "observable": names * len(ts),
        "value": np.zeros(len(ts) * len(names)),
    }

    def observable(name):
        reported = _reported(document, plain, name, amounts)
        return ds.Observable(lambda t, y, p: reported(t, y, {**plain.params, **p}), sigma=1.0)

    problem = ds.Problem(
        plain,
        experiments=[
            ds.Experiment(data, y0=model.initial_state(), t0=start, changes=model.changes(t0=start))
        ],
        observables={n: observable(n) for n in names},
        unknowns={},
    )
    [predicted] = problem.predictions()
    observed = np.asarray(predicted["observable"])
    return {n: np.asarray(predicted["prediction"])[observed == n] for n in names}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases_dir", type=Path)
    parser.add_argument("cases", nargs="*")
    parser.add_argument("--events", action="store_true")
    parser.add_argument("--by-problem", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    results = {}
    for folder in sorted(p for p in args.cases_dir.iterdir() if p.name.isdigit()):
        if args.cases and folder.name not in args.cases:
            continue
        described = (folder / f"{folder.name}-model.m").read_text()
        tags = " ".join(re.findall(r"(?:componentTags|testTags):\s*(.*)", described))
        if "testType:" in described and "TimeCourse" not in described:
            continue
        if args.events and "EventNoDelay" not in tags:
            continue
        results[folder.name] = run_case(folder, args.by_problem)
        print(folder.name, *results[folder.name], flush=True)
    print(dict(collections.Counter(outcome for outcome, _ in results.values())))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
