"""PEtab v2 problems, read by turning their tables into v1's shape for `petab._Builder`.

What v2 changes, and how it is read:

- the parameter table has no scales (every parameter is on the linear scale), `estimate` is
  true/false, and priors are `priorDistribution` / `priorParameters` of the natural value:
  normal, laplace, log-normal, log-laplace, uniform as v1's, and log-uniform (a, b), cauchy
  (location, scale), chisquare (degrees of freedom), exponential (scale), gamma (shape,
  scale), rayleigh (scale), each truncated to the parameter's bounds (renormalised to them,
  as v2 prescribes); an estimated parameter without one has v2's implicit prior, uniform
  within its bounds;
- the observable table names its placeholders (`observablePlaceholders`, `noisePlaceholders`)
  and gives the noise as `noiseDistribution` normal, laplace, log-normal, log-laplace: the
  placeholders become v1's `observableParameter<i>_<observable>` and the distribution v1's
  transformation × distribution;
- conditions are a long table (`conditionId`, `targetId`, `targetValue`) and an experiment
  table orders them in periods (`experimentId`, `time`, `conditionId`): a period at −inf is
  the pre-equilibration, the first finite one starts the simulation at its time (t0), and
  each later one is a change at its time (`ds.Experiment(changes=...)`: species set to a
  number, a parameter or an expression of the state and parameters just before it;
  parameters and compartments to a number or another parameter: a compartment's new size
  leaves the state as it is, the concentrations of the species in it included, as v2
  prescribes; a compartment the SBML model's events resize is a state, set as species
  are). Conditions of one period are merged, and the model's events at a period's start act
  after them (`SBMLModel.with_events_as_changes`);
- a condition's value that is a formula of the parameters (a parameter, a compartment, or a
  species at the start): the model numbers the formulas each id is set to
  (`SBMLModel.with_choices`) and the condition sets the parameter `choose:<id>` to the
  formula's number, so that experiments with different formulas still batch.

Not read, refused naming the entry: mapping tables that rename, several models, prior
distributions other than the eleven above.
"""

import math
import re
from collections.abc import Mapping
from pathlib import Path

from .expressions import compile_expression, ExpressionError, parse_formula
from .petab_tables import PetabError, read_tables, v2_files, v2_model_file
from .sbml import StateAssignment

# v2 noise distributions as v1's (transformation, distribution)
_NOISE = {
    "normal": ("lin", "normal"),
    "laplace": ("lin", "laplace"),
    "log-normal": ("log", "normal"),
    "log-laplace": ("log", "laplace"),
    "log10-normal": ("log10", "normal"),
    "log10-laplace": ("log10", "laplace"),
}
# v2 prior distributions as the kinds `petab._prior` reads (v1's names where v1 has them)
_PRIORS = {
    "normal": "normal",
    "laplace": "laplace",
    "log-normal": "logNormal",
    "log-laplace": "logLaplace",
    "uniform": "uniform",
    "log-uniform": "logUniform",
    "cauchy": "cauchy",
    "chisquare": "chisquare",
    "exponential": "exponential",
    "gamma": "gamma",
    "rayleigh": "rayleigh",
}
_NAME = re.compile(r"[A-Za-z_]\w*\Z")


def read(path: Path, config: Mapping):
    """(the SBML model, the v1-shaped tables: parameters, conditions, measurements,
    observables, the files read, and per simulation condition id its (t0, changes))."""
    import pandas as pd

    from .sbml import load as load_sbml

    sbml_file = v2_model_file(path, config)
    model = load_sbml(sbml_file)

    def files(key):
        return v2_files(path, config, key)

    for table in [read_tables([f], path, "mapping_files") for f in files("mapping_files")]:
        # rows that only name an entity (no model entity, or the same id) change nothing
        for _, row in table.iterrows():
            petab_id = str(row.get("petabEntityId", "")).strip()
            model_id = str(row.get("modelEntityId", "")).strip()
            if model_id not in ("", petab_id):
                raise PetabError(
                    f"{path}: the mapping table maps {petab_id} to {model_id}; mappings to "
                    "other ids are not supported yet"
                )
    parameters = read_tables(files("parameter_files"), path, "parameter_files")
    measurements = read_tables(files("measurement_files"), path, "measurement_files")
    observables = read_tables(files("observable_files"), path, "observable_files")
    empty_conditions = pd.DataFrame(columns=["conditionId", "targetId", "targetValue"])
    conditions = (
        read_tables(files("condition_files"), path, "condition_files")
        if files("condition_files")
        else empty_conditions
    )
    experiments = (
        read_tables(files("experiment_files"), path, "experiment_files")
        if files("experiment_files")
        else pd.DataFrame(columns=["experimentId", "time", "conditionId"])
    )
    used = (
        [path, sbml_file]
        + files("parameter_files")
        + files("condition_files")
        + files("experiment_files")
        + files("measurement_files")
        + files("observable_files")
    )
    parameters = _parameters(parameters, path)
    observables = _observables(observables, path)
    model, wide, measurements, timing = _periods(
        model, conditions, experiments, measurements, path, set(parameters["parameterId"])
    )
    return model, parameters, wide, measurements, observables, used, timing


def _parameters(table, path):
    rows = table.copy()
    rows["parameterScale"] = "lin"
    flags = {"true": "1", "false": "0", "1": "1", "0": "0"}
    estimate = rows["estimate"].str.strip().str.lower()
    bad = [f for f in estimate if f not in flags]
    if bad:
        raise PetabError(f"{path}: 'estimate' must be true or false, got {bad[0]!r}")
    rows["estimate"] = [flags[f] for f in estimate]
    kinds = []
    for name, kind in zip(rows["parameterId"], rows.get("priorDistribution", [""] * len(rows))):
        kind = str(kind).strip()
        if kind in ("", "nan"):
            kinds.append("")
        elif kind in _PRIORS:
            kinds.append(_PRIORS[kind])
        else:
            raise PetabError(
                f"{path}: parameter {name.strip()}: prior {kind!r} is not supported (one of "
                f"{sorted(_PRIORS)})"
            )
    parameters_of = list(rows.get("priorParameters", [""] * len(rows)))
    for i, (kind, flag) in enumerate(zip(kinds, rows["estimate"])):
        low, high = (str(rows[c].iloc[i]).strip() for c in ("lowerBound", "upperBound"))
        if not kind and flag == "1" and _finite(low) and _finite(high):
            # v2's implicit prior: uniform within the bounds (a constant there)
            kinds[i], parameters_of[i] = "uniform", f"{low};{high}"
    rows["objectivePriorType"] = kinds
    rows["objectivePriorParameters"] = parameters_of
    rows["truncateToBounds"] = "1"
    return rows


def _observables(table, path):
    rows = table.copy()
    transformations, distributions, formulas, noises = [], [], [], []
    for _, row in rows.iterrows():
        oid = row["observableId"].strip()
        kind = str(row.get("noiseDistribution", "") or "normal").strip() or "normal"
        if kind not in _NOISE:
            raise PetabError(f"{path}: observable {oid}: noise {kind!r} is not supported")
        transformation, distribution = _NOISE[kind]
        transformations.append(transformation)
        distributions.append(distribution)
        formula, noise = str(row["observableFormula"]), str(row["noiseFormula"])
        for column, prefix in (
            ("observablePlaceholders", "observableParameter"),
            ("noisePlaceholders", "noiseParameter"),
        ):
            names = [n.strip() for n in str(row.get(column, "") or "").split(";") if n.strip()]
            for i, name in enumerate(names, start=1):
                pattern = rf"(?<![\w.]){re.escape(name)}(?![\w(])"
                formula = re.sub(pattern, f"{prefix}{i}_{oid}", formula)
                noise = re.sub(pattern, f"{prefix}{i}_{oid}", noise)
        # a noise formula may read the observable itself (its simulated value)
        noise = re.sub(rf"(?<![\w.]){re.escape(oid)}(?![\w(])", f"({formula})", noise)
        formulas.append(formula)
        noises.append(noise)
    rows["observableTransformation"] = transformations
    rows["noiseDistribution"] = distributions
    rows["observableFormula"] = formulas
    rows["noiseFormula"] = noises
    return rows


def _periods(model, conditions, experiments, measurements, path, parameter_ids):
    """The condition table in v1's wide shape with one simulation condition (and one
    pre-equilibration condition) per experiment, the measurement table pointing at them, and
    per simulation condition (t0, changes); the model, with the formulas that conditions
    set numbered (`SBMLModel.with_choices`), comes first."""
    import pandas as pd

    targets: dict[str, dict] = {}
    for _, row in conditions.iterrows():
        cid, target = row["conditionId"].strip(), row["targetId"].strip()
        targets.setdefault(cid, {})[target] = str(row["targetValue"]).strip()
    periods: dict[str, dict] = {}
    for _, row in experiments.iterrows():
        eid, cid = row["experimentId"].strip(), str(row["conditionId"]).strip()
        time = float(row["time"])
        if cid and cid not in targets:
            raise PetabError(
                f"{path}: experiment {eid} names condition {cid!r}, which is undefined"
            )
        merged = periods.setdefault(eid, {}).setdefault(time, {})
        for target, value in targets.get(cid, {}).items():
            if target in merged and merged[target] != value:
                raise PetabError(
                    f"{path}: experiment {eid} sets {target} twice at t = {time:g} "
                    f"({merged[target]!r}, {value!r})"
                )
            merged[target] = value
    species = set(model.state_names)
    known = _Known(set(parameter_ids) | set(model.params), set(model.params) | species)
    rows, timing = [], {}
    eids = (
        measurements["experimentId"].str.strip()
        if "experimentId" in measurements.columns
        else pd.Series([""] * len(measurements))
    )
    pre_ids, sim_ids = [], []
    for eid in eids:
        if eid and eid not in periods:
            raise PetabError(f"{path}: a measurement names experiment {eid!r}, which is undefined")
        sim = f"{eid} (simulation)" if eid else ""
        pre = f"{eid} (pre-equilibration)" if -math.inf in periods.get(eid, {}) else ""
        pre_ids.append(pre)
        sim_ids.append(sim)
        if sim in timing or (not eid and "" in timing):
            continue
        times = sorted(t for t in periods.get(eid, {}) if t > -math.inf)
        t0 = times[0] if times else 0.0
        start = dict(periods.get(eid, {}).get(t0, {})) if times else {}
        if pre:
            # what the pre-equilibration period set stays set (v2) unless the start
            # period sets it again; species it set are where the rest left them
            for target, value in periods[eid][-math.inf].items():
                if target not in species:
                    start.setdefault(target, value)
        rows.append({"conditionId": sim, **_as_choices(start, species, known, path, eid)})
        if pre:
            rested = _as_choices(periods[eid][-math.inf], species, known, path, eid)
            rows.append({"conditionId": pre, **rested})
        changes = [
            (t, _changes(model, periods[eid][t], t, path, eid, species, known)) for t in times[1:]
        ]
        timing[sim] = (t0, changes or None)
    wide = pd.DataFrame(rows).fillna("")
    if "conditionId" not in wide.columns:
        wide = pd.DataFrame({"conditionId": [""]})
    table = measurements.copy()
    table["preequilibrationConditionId"] = pre_ids
    table["simulationConditionId"] = sim_ids
    chosen = known.model_with_choices(model)
    if chosen is not model:  # species set by formulas read the formulas' numbered values
        timing = {
            sim: (t0, changes and [(t, _on_model(chosen, c)) for t, c in changes])
            for sim, (t0, changes) in timing.items()
        }
    return chosen, wide, table, timing


def _as_choices(settings: dict, species: set, known, path, eid) -> dict:
    """A period's settings with each formula a number that selects it
    (`SBMLModel.with_choices`): `choose:<id>`; a species is set, to a placeholder the chosen
    formula replaces."""
    out = dict(settings)
    for target, value in settings.items():
        if not _is_number(value) and not _NAME.match(value):
            out[f"choose:{target}"] = str(known.choice(target, value, path, eid))
            if target in species:
                out[target] = "0"
            else:
                del out[target]
    return out


def _on_model(model, assignments: dict) -> dict:
    return {
        k: StateAssignment(model, v.compiled, v.time) if isinstance(v, StateAssignment) else v
        for k, v in assignments.items()
    }


class _Known:
    """The parameters' ids, and each expression compiled once (so that equal assignments at
    equal times are equal `StateAssignment`s, and their experiments batch together)."""

    def __init__(self, parameters: set, settable: set):
        self.parameters = parameters
        self.settable = settable  # what a formula may set: parameters, compartments, species
        self.compiled: dict = {}
        self.parsed: dict = {}  # text -> its SymPy expression
        self.choices: dict = {}  # id -> the formulas that set it, in order (text)
        self.read: set = set()  # the ids those formulas read

    def choice(self, target: str, text: str, path, eid) -> int:
        """The number (1, 2, …) that selects the formula `text` for `target`."""
        where = f"{path}: experiment {eid}, {target}"
        if target not in self.settable:
            raise PetabError(
                f"{where}: {target} is set to the formula {text!r}, but it is no parameter, "
                "compartment or species of the model"
            )
        self.compile(text, where)
        reads = {x.name for x in self.parsed[text].free_symbols}
        unknown = sorted(reads - self.parameters)
        if unknown:
            raise PetabError(
                f"{where}: the formula {text!r} reads {', '.join(unknown)}, which the "
                "parameter table and the model's parameters do not define"
            )
        self.read |= reads
        options = self.choices.setdefault(target, [])
        if text not in options:
            options.append(text)
        return options.index(text) + 1

    def model_with_choices(self, model):
        """`model` with the formulas `choice` numbered (`SBMLModel.with_choices`)."""
        if not self.choices:
            return model
        return model.with_choices(
            {t: [self.compiled[text] for text in texts] for t, texts in self.choices.items()},
            reads=self.read,
        )

    def compile(self, text: str, where: str):
        if text not in self.compiled:
            try:
                self.parsed[text] = parse_formula(text, where)
                self.compiled[text] = compile_expression(self.parsed[text], text)
            except ExpressionError as error:
                raise PetabError(str(error)) from None
        return self.compiled[text]


def _changes(model, assignments: dict, time: float, path, eid, species, known):
    out = {}
    for target, value in assignments.items():
        # a compartment's size is a parameter: a change leaves the state as it is (the
        # concentrations of the species in it that the change does not set, and the
        # amounts), as v2 prescribes, and the rates of change divide by the new size
        if _is_number(value):
            out[target] = float(value)
        elif _NAME.match(value) and value in known.parameters:
            out[target] = value
        elif target in species:  # an expression (another species' id included)
            compiled = known.compile(value, f"{path}: experiment {eid}, {target}")
            out[target] = StateAssignment(model, compiled, time)
        else:  # a formula of the parameters: a number that selects it
            out[f"choose:{target}"] = float(known.choice(target, value, path, eid))
    return out


def _finite(text: str) -> bool:
    return _is_number(text) and math.isfinite(float(text))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
