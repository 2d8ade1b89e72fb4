"""`ds.petab.load`: a PEtab (v1 or v2) parameter-estimation problem as a `ds.Problem`.

PEtab describes a study in files: an SBML model, and tables of conditions (settings of
parameters, compartments and initial species values), measurements (observable, condition,
pre-equilibration condition, time, value, and per-measurement observable and noise
parameters), observables (formulas, transformations lin/log/log10, noise normal/laplace) and
parameters (scale, bounds, nominal value, estimated or not). They map onto `ds.Problem` as:

- the model: `ds.sbml.load` of the SBML file; in every simulation the parameter table's
  values take the place of the file's (`problem.model.params` keeps the file's);
- an experiment per (pre-equilibration, simulation) condition pair of the measurement table;
  its settings the simulation condition's row; a species' value there sets its initial value
  (after a pre-equilibration it resets that species, and NaN keeps the rested value);
  pre-equilibration runs under the pre-equilibration condition's settings (a parameter the
  simulation condition sets and the pre-equilibration condition does not takes its value from
  the parameter table or the model there, as PEtab prescribes);
- measurement-specific observable and noise parameters: per-measurement settings of the
  formulas' placeholders (`observableParameter1_<observable>` …);
- observable and noise formulas: parsed by libsbml's infix parser into SymPy, evaluated with
  the state, the model's assignment rules and every parameter (never `eval`);
- steady-state measurements (time = inf) of a condition: an experiment of their own that
  starts at the condition's steady state (`pre_equilibrate=True`, reached from its initial
  state) and measures there (at t = 0).

- objective priors (`objectivePriorType`, `objectivePriorParameters`): uniform, normal,
  laplace, logNormal, logLaplace of the natural value and parameterScaleUniform/Normal/Laplace
  of the value on its scale, as `Unknown(prior=..., prior_on_scale=...)`; `problem.llh()`
  leaves them out, `problem.log_posterior()`, `ds.fit` (the posterior's mode) and `ds.sample`
  take them in.

PEtab v2 files are read by mapping their tables onto v1's (`petab_v2.py`).

Not read yet, refused naming the table: steady-state measurements after a
pre-equilibration; several models or problems in one YAML file.
"""

import dataclasses
import math
import re
import warnings
from collections.abc import Mapping
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from .._fit.study import Experiment, Observable, Problem, Unknown
from .._validate import user_path
from .._warn import warn
from .expressions import compile_expression, ExpressionError, parse_formula
from .petab_sciml import is_sciml, read as read_sciml
from .petab_tables import PetabError, read_table, read_tables
from .petab_v2 import read as read_v2
from .sbml import load as load_sbml, SBMLModel

_SET = "set:"  # the parameter that says whether a condition sets a species' initial value
_NOISE = {
    ("lin", "normal"): "normal",
    ("log", "normal"): "log-normal",
    ("log10", "normal"): "log10-normal",
    ("lin", "laplace"): "laplace",
    ("log", "laplace"): "log-laplace",
    ("log10", "laplace"): "log10-laplace",
}


def load(path, *, solver=None) -> Problem:
    """Read the PEtab (v1) problem whose YAML file is `path` as a `ds.Problem` (see the
    module text for the mapping). `solver` as for `ds.Problem` (default `ds.Rodas5P(rtol=1e-8,
    atol=1e-10)`).

    **Raises:** `ds.petab.PetabError` naming the file, table and entry that cannot be read;
    `ds.sbml.SBMLError` for the model file."""
    import yaml

    path = user_path(path, "ds.petab.load(path)")
    if not path.is_file():
        raise FileNotFoundError(f"ds.petab.load: no file at {path}")
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise PetabError(f"{path} is not valid YAML: {error}") from None
    if not isinstance(config, Mapping):
        raise PetabError(f"{path} is not a PEtab problem file (a YAML mapping)")
    version = str(config.get("format_version", ""))
    if version.startswith("2") and is_sciml(config):
        return _load_sciml(path, config, solver)
    if version.startswith("2"):
        return _load_v2(path, config, solver)
    if not version.startswith("1"):
        raise PetabError(
            f"{path}: format_version {version!r}; diffsim reads PEtab v1 and v2 problems"
        )
    problems = config.get("problems")
    if not isinstance(problems, list) or len(problems) != 1:
        raise PetabError(f"{path}: one entry under 'problems' expected, got {problems!r}")
    entry = problems[0]
    folder = path.parent

    def files(key, required=True) -> list[Path]:
        names = entry.get(key) or []
        if isinstance(names, str):
            names = [names]
        if required and not names:
            raise PetabError(f"{path}: no {key}")
        return [folder / name for name in names]

    (sbml_file,) = _single(files("sbml_files"), path, "sbml_files")
    model = load_sbml(sbml_file)
    parameters = read_table(folder / config.get("parameter_file", ""), path, "parameter_file")
    conditions = read_tables(files("condition_files"), path, "condition_files")
    measurements = read_tables(files("measurement_files"), path, "measurement_files")
    observable_table = read_tables(files("observable_files"), path, "observable_files")
    builder = _Builder(path, model, parameters, conditions, measurements, observable_table)
    problem = builder.problem(solver)
    problem.source = dict(
        petab=str(path),
        files=[
            path,
            sbml_file,
            folder / config.get("parameter_file", ""),
            *files("condition_files"),
            *files("measurement_files"),
            *files("observable_files"),
        ],
        measurement_order=builder.order,
        measurements=measurements,
        # PEtab's priors for drawing starts, which `Problem.uniform_starts` does not follow
        # (the default, parameterScaleUniform, is what it draws)
        initialization_priors={
            str(row["parameterId"]).strip(): str(row["initializationPriorType"]).strip()
            for _, row in parameters.iterrows()
            if "initializationPriorType" in parameters.columns
            and str(row["initializationPriorType"]).strip()
            not in ("", "nan", "parameterScaleUniform")
        },
    )
    return problem


def simulations(problem: Problem, params: Mapping | None = None):
    """The PEtab simulation table of a problem `ds.petab.load` read: its measurement table with
    a `simulation` column (the model's prediction of each row at `params`, natural values of
    estimated unknowns; default the nominal values)."""
    source = problem.source or {}
    if "petab" not in source:
        raise PetabError("this problem was not read from a PEtab file (ds.petab.load)")
    predicted = np.concatenate([e["prediction"] for e in problem.predictions(params)])
    table = source["measurements"].copy()
    order = np.asarray(source["measurement_order"])
    table["simulation"] = np.where(order >= 0, predicted[np.maximum(order, 0)], np.nan)
    return table


def _states_by_index(changes, states: tuple):
    """Changes with each state they set named by its index: a species whose initial value a
    condition sets is also the parameter holding that value (`_InitialState`), and a change
    sets the state."""
    if not changes:
        return changes
    return [
        (time, {states.index(k) if k in states else k: v for k, v in assignments.items()})
        for time, assignments in changes
    ]


def _single(items, path, key):
    if len(items) != 1:
        raise PetabError(f"{path}: exactly one of {key} is read, got {len(items)}")
    return items


def _middle(low, high, scale: str) -> float:
    """The middle of [low, high] on `scale` as a natural value (NaN where a bound is not a
    number: refused with the bounds)."""
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return math.nan
    if scale in ("log", "log10") and low > 0:
        return math.sqrt(low * high)
    return 0.5 * (low + high)


def _number(text):
    """A cell as a float, or None when it is not a number (a parameter's id); NaN for an
    empty cell or 'nan'."""
    text = str(text).strip()
    if text == "" or text.lower() == "nan":
        return math.nan
    try:
        return float(text)
    except ValueError:
        return None


def _load_sciml(path: Path, config: Mapping, solver) -> Problem:
    """A PEtab-SciML problem (`petab_sciml`): its tables in v1's shape, read as v1's."""
    return _v1_shaped(path, solver, *read_sciml(path, config))


def _load_v2(path: Path, config: Mapping, solver) -> Problem:
    """A PEtab v2 problem (`petab_v2`): its tables in v1's shape, its experiments' start times
    and later periods as `t0` and changes."""
    return _v1_shaped(path, solver, *read_v2(path, config))


def _v1_shaped(
    path, solver, model, parameters, conditions, measurements, observables, files, timing=None
) -> Problem:
    """The problem of tables another format's reader put in v1's shape."""
    builder = _Builder(path, model, parameters, conditions, measurements, observables, timing)
    problem = builder.problem(solver)
    problem.source = dict(
        petab=str(path),
        files=files,
        measurement_order=builder.order,
        measurements=measurements,
        initialization_priors={},
    )
    return problem


class _Builder:
    def __init__(
        self, path, model: SBMLModel, parameters, conditions, measurements, observables, timing=None
    ):
        # timing: per simulation condition id, (t0, changes) (PEtab v2's periods)
        self.timing = timing or {}
        self.path = path
        self.model = model
        self.parameters = parameters
        self.conditions = conditions
        self.measurements = measurements
        self.observables = observables
        for table, columns in (
            (
                parameters,
                (
                    "parameterId",
                    "parameterScale",
                    "lowerBound",
                    "upperBound",
                    "nominalValue",
                    "estimate",
                ),
            ),
            (conditions, ("conditionId",)),
            (measurements, ("observableId", "simulationConditionId", "time", "measurement")),
            (observables, ("observableId", "observableFormula", "noiseFormula")),
        ):
            missing = [c for c in columns if c not in table.columns]
            if missing:
                raise PetabError(f"{path}: a table lacks the columns {missing}")
        for table, column, what in (
            (parameters, "parameterId", "parameter"),
            (conditions, "conditionId", "condition"),
            (observables, "observableId", "observable"),
        ):
            ids = table[column].astype(str).str.strip()
            twice = sorted(set(ids[ids.duplicated()]))
            if twice:
                raise PetabError(
                    f"{path}: the {what} table defines {twice} more than once (each id once)"
                )
        self.parameter_ids = set(parameters["parameterId"].astype(str).str.strip())
        # per (kind, observable id): how many placeholders its formulas have
        # (observableParameter<i>_<id>, noiseParameter<i>_<id>), which each of its
        # measurements must give
        self.placeholders = {}
        for _, row in observables.iterrows():
            oid = str(row["observableId"]).strip()
            formulas = f"{row['observableFormula']} {row['noiseFormula']}"
            for kind in ("observable", "noise"):
                found = re.findall(rf"\b{kind}Parameter(\d+)_{re.escape(oid)}\b", formulas)
                self.placeholders[kind, oid] = max((int(i) for i in found), default=0)

    # --- unknowns ---------------------------------------------------------------------------

    def unknowns(self) -> dict:
        out = {}
        for _, row in self.parameters.iterrows():
            name = row["parameterId"].strip()
            scale = row["parameterScale"].strip()
            nominal = _number(row["nominalValue"])
            low, high = _number(row["lowerBound"]), _number(row["upperBound"])
            flag = _number(row["estimate"])
            if flag not in (0.0, 1.0):
                raise PetabError(
                    f"{self.path}: parameter {name}: estimate is {row['estimate'].strip()!r}; "
                    "PEtab's estimate column holds 1 (estimated) or 0 (fixed)"
                )
            estimate = flag == 1.0
            if not scale:
                if estimate:
                    raise PetabError(
                        f"{self.path}: parameter {name} is estimated and has no "
                        "parameterScale; PEtab's parameterScale holds lin, log or log10"
                    )
                scale = "lin"  # a fixed parameter's scale changes nothing
            if estimate and nominal is not None and math.isnan(nominal):
                # PEtab asks a nominal value of fixed parameters only: an estimated one without
                # it starts in the middle of its bounds on its scale (a fit screens starts)
                nominal = _middle(low, high, scale)
            if nominal is None or (estimate and (low is None or high is None)):
                raise PetabError(
                    f"{self.path}: parameter {name}: bounds and nominal must be numbers"
                )
            if estimate and scale in ("log", "log10") and not low > 0:
                raise PetabError(
                    f"{self.path}: parameter {name}: lowerBound {low:g} on a {scale} scale "
                    "(PEtab's bounds are natural values: a log-scale bound must be > 0)"
                )
            try:
                prior, on_scale = _prior(row) if estimate else (None, False)
                # a nominal value outside the bounds is allowed (warned about, naming it)
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    out[name] = Unknown(
                        nominal,
                        bounds=(low, high) if estimate else None,
                        scale=scale,
                        estimate=estimate,
                        prior=prior,
                        prior_on_scale=on_scale,
                    )
            except (TypeError, ValueError, PetabError) as error:
                raise PetabError(f"{self.path}: parameter {name}: {error}") from None
            for caught_warning in caught:
                warn(f"{self.path}: parameter {name}: {caught_warning.message}")
        return out

    # --- conditions -------------------------------------------------------------------------

    def condition(self, condition_id: str) -> dict:
        rows = self.conditions[self.conditions["conditionId"].str.strip() == condition_id]
        if len(rows) != 1:
            raise PetabError(
                f"{self.path}: condition {condition_id!r} is not in the condition table"
            )
        row = rows.iloc[0]
        out = {}
        for column in self.conditions.columns:
            if column in ("conditionId", "conditionName"):
                continue
            value = str(row[column]).strip()
            number = _number(value)
            out[column] = value if number is None else number
        return out

    def problem(self, solver) -> Problem:
        model = self.model
        states = set(model.state_names)
        unknowns = self.unknowns()
        columns = [c for c in self.conditions.columns if c not in ("conditionId", "conditionName")]
        self.species = tuple(c for c in columns if c in states)
        for column in columns:
            if column in states:
                # its initial value, and whether the condition sets it (NaN: it does not)
                unknowns.setdefault(column, Unknown(0.0, estimate=False))
                unknowns.setdefault(_SET + column, Unknown(0.0, estimate=False))
            elif column not in model.params and column not in unknowns:
                raise PetabError(
                    f"{self.path}: the condition table sets {column!r}, which is neither a "
                    "parameter, a compartment nor a species of the model"
                )
            if column in unknowns and unknowns[column].estimate:
                cells = self.conditions[column].astype(str).str.strip()
                set_in = self.conditions["conditionId"][~cells.str.lower().isin(("", "nan"))]
                if len(set_in):
                    # the conditions' value would win: the estimate would move nothing
                    raise PetabError(
                        f"{self.path}: the condition table sets {column} (condition "
                        f"{', '.join(set_in.str.strip())}), which the parameter table "
                        "estimates: a parameter that conditions set is not estimated (PEtab); "
                        "set the condition to another parameter's id to estimate it per "
                        "condition, or fix it"
                    )
        observables = self.observable_definitions(unknowns)
        experiments = self.experiments(unknowns)
        if model.timed_events or model.time_switches:
            # the model's events and switches on time as each experiment's changes, at the
            # times its settings give
            model, experiments = model.with_events_as_changes(
                experiments, unknowns, lambda e: f"{self.path}: {e.name}"
            )
        experiments = [
            dataclasses.replace(e, changes=_states_by_index(e.changes, model.state_names))
            for e in experiments
        ]
        try:
            return Problem(model, experiments, observables, unknowns, solver=solver)
        except ValueError as error:
            message = str(error).replace("add it to unknowns", "add it to the parameter table")
            read = re.search(r"names '([^']+)', which the model does not define", message)
            if read is not None:
                name = read.group(1)
                observable_ids = set(self.observables["observableId"].str.strip())
                message = message.replace(
                    "which the model does not define",
                    "an observable's id (PEtab v1's formulas read the model's symbols and "
                    "parameters, not observables: write that observable's formula instead)"
                    if name in observable_ids
                    else "which neither the model nor the parameter table defines (add it to "
                    "the parameter table)",
                )
            prefix = f"{self.path}: "
            raise PetabError(message if message.startswith(prefix) else prefix + message) from None

    # --- observables ------------------------------------------------------------------------

    def observable_definitions(self, unknowns: dict) -> dict:
        out = {}
        for _, row in self.observables.iterrows():
            oid = row["observableId"].strip()
            where = f"{self.path}: observable {oid}"
            transformation = (row.get("observableTransformation", "") or "lin").strip() or "lin"
            distribution = (row.get("noiseDistribution", "") or "normal").strip() or "normal"
            noise = _NOISE.get((transformation, distribution))
            if noise is None:
                raise PetabError(f"{where}: {transformation} {distribution} noise is not supported")
            try:
                formula = parse_formula(row["observableFormula"], where)
                noise_formula = parse_formula(str(row["noiseFormula"]), f"{where}'s noise")
            except ExpressionError as error:
                raise PetabError(str(error)) from None
            for symbol in formula.free_symbols | noise_formula.free_symbols:
                name = symbol.name
                if name.startswith(("observableParameter", "noiseParameter")):
                    self._check_placeholder(name, oid, where)
                    unknowns.setdefault(name, Unknown(0.0, estimate=False))  # a placeholder
            try:
                out[oid] = Observable(
                    _Formula(self.model, compile_expression(formula, where)),
                    noise=noise,
                    sigma=self._sigma(noise_formula, unknowns, where),
                )
            except ValueError as error:  # e.g. a noise formula that is a number <= 0
                raise PetabError(f"{where}: {error}") from None
        return out

    def _check_placeholder(self, name: str, oid: str, where: str):
        """A placeholder (`observableParameter<i>_<id>`, `noiseParameter<i>_<id>`) belongs to
        the observable of its name, whose measurements give its values; one of another
        observable (a formula copied from it) or of none would be given by no row."""
        if name in self.parameter_ids or name in self.model.params:
            return  # the parameter table or the model defines it: an ordinary parameter
        match = re.fullmatch(r"(?:observable|noise)Parameter\d+_(.+)", name)
        if match is None or match.group(1) != oid:
            owner = match.group(1) if match else None
            whose = (
                f"a placeholder of observable {owner}"
                if owner in set(self.observables["observableId"].str.strip())
                else "a placeholder of no observable"
            )
            raise PetabError(
                f"{where}'s formulas read {name}, {whose}: no measurement of {oid} gives its "
                f"value (PEtab: {oid}'s placeholders are named observableParameter<i>_{oid} and "
                f"noiseParameter<i>_{oid}); rename it, or define {name} in the parameter table"
            )

    def _sigma(self, formula, unknowns: dict, where: str):
        """The noise formula as `Observable(sigma=)`: a number, a parameter's name where it is
        one parameter alone (so that a fit can set a noise parameter to its closed-form optimum,
        `Tables.noise`), else a function of (t, y, p)."""
        if formula.is_number:
            return float(formula)
        if formula.is_Symbol and (formula.name in unknowns or formula.name in self.model.params):
            return formula.name
        return _Formula(self.model, compile_expression(formula, where))

    # --- experiments ------------------------------------------------------------------------

    def experiments(self, unknowns: dict) -> list:
        table = self.measurements
        pre_column = (
            table["preequilibrationConditionId"].str.strip()
            if "preequilibrationConditionId" in table.columns
            else None
        )
        keys = []
        for i in range(len(table)):
            pre = "" if pre_column is None else pre_column.iloc[i]
            keys.append((pre, table["simulationConditionId"].iloc[i].strip()))
        initial = _InitialState(self.model, self.species)
        experiments = []
        self.order = np.zeros(len(keys), dtype=int)  # file row -> its index in the problem
        offset = 0
        steady = np.asarray([_number(t) == math.inf for t in table["time"]])
        for (pre, sim), at_rest in dict.fromkeys((k, r) for k, r in zip(keys, steady)):
            mine = np.asarray([k == (pre, sim) for k in keys]) & (steady == at_rest)
            # a missing measurement (NaN) is no row of the problem: -1
            kept = mine & np.asarray([_number(v) == _number(v) for v in table["measurement"]])
            self.order[mine] = -1
            self.order[kept] = offset + np.arange(kept.sum())
            offset += int(kept.sum())
            rows = table[mine]
            data = self.rows(rows, unknowns, at_rest=at_rest)
            settings = self.settings(self.condition(sim))
            if (pre or at_rest) and self.model.triggered_events:
                # a steady-state search integrates the vector field alone
                raise PetabError(
                    f"{self.path}: {'pre-equilibration' if pre else 'steady-state measurements'}"
                    f" of a model with events triggered by the state "
                    f"({', '.join(self.model.triggered_events)}) are not supported (the search "
                    "for the steady state would not apply them)"
                )
            if at_rest:
                # measured at t = inf: the steady state under the condition, reached from its
                # initial state; with a pre-equilibration before it, that start would be the
                # pre-equilibrated state, which one Experiment does not chain
                if pre:
                    raise PetabError(
                        f"{self.path}: steady-state measurements (time = inf) after a "
                        f"pre-equilibration ({pre} -> {sim}) are not supported yet"
                    )
                if self.model.timed_events or self.timing.get(sim, (0.0, None))[1]:
                    # the steady state is reached from the start without the events' jumps
                    raise PetabError(
                        f"{self.path}: steady-state measurements (time = inf) of {sim}, whose "
                        "model has events or changes at given times, are not supported yet "
                        "(the rest would ignore them)"
                    )
                pre_settings, reset, name = True, (), f"{sim} (steady state)"
            elif pre:
                rested = self.settings(self.condition(pre))
                pre_settings = {}
                for key in set(settings) | set(rested):
                    pre_settings[key] = (
                        rested[key] if key in rested else self.base_value(key, unknowns)
                    )
                # after a pre-equilibration, the species the simulation condition sets start
                # anew
                reset = tuple(s for s in self.species if settings.get(_SET + s) == 1.0)
                name = f"{pre} -> {sim}"
            else:
                pre_settings, reset, name = None, (), sim
            t0, changes = self.timing.get(sim, (0.0, None))
            experiments.append(
                Experiment(
                    data,
                    y0=initial,
                    t0=t0,
                    set=settings,
                    pre_equilibrate=pre_settings,
                    reinitialize=reset,
                    name=name,
                    changes=changes,
                )
            )
        return experiments

    def settings(self, row: dict) -> dict:
        """A condition's row as settings: parameters and compartments as given (an empty cell
        leaves them), species as their initial value and its flag (NaN: not set)."""
        out = {}
        for key, value in row.items():
            missing = isinstance(value, float) and math.isnan(value)
            if key in self.species:
                out[_SET + key] = 0.0 if missing else 1.0
                if not missing:
                    out[key] = value
            elif not missing:
                out[key] = value
        return out

    def base_value(self, key, unknowns):
        """A setting's value where no condition sets it: the parameter table's, else the
        model's (a species flag: not set)."""
        if key.startswith(_SET):
            return 0.0
        if key in unknowns and unknowns[key].estimate:
            return key
        if key in unknowns:
            return unknowns[key].value
        if key in self.model.params:
            return float(self.model.params[key])
        return math.nan

    def rows(self, rows, unknowns: dict, at_rest: bool = False) -> dict:
        """The measurements of one experiment in long form; those at t = inf (`at_rest`) at
        its start, which is then the steady state."""
        for column in ("time", "measurement"):
            for index, cell in zip(rows.index, rows[column]):
                if _number(cell) is None or (column == "time" and _number(cell) != _number(cell)):
                    raise PetabError(
                        f"{self.path}: the measurement table's row {index + 1} has {column} "
                        f"{str(cell).strip()!r}, not a number (a decimal point, not a comma"
                        + (")" if column == "time" else "; NaN or empty for a missing value)")
                    )
        times = np.asarray([_number(t) for t in rows["time"]], dtype=float)
        if at_rest:
            times = np.zeros_like(times)
        values = np.asarray([_number(v) for v in rows["measurement"]], dtype=float)
        observables = [o.strip() for o in rows["observableId"]]
        for kind, column in (("observable", "observableParameters"), ("noise", "noiseParameters")):
            cells = rows[column] if column in rows.columns else [""] * len(rows)
            for index, oid, cell in zip(rows.index, observables, cells):
                cell = str(cell).strip()
                given = 0 if not cell or cell.lower() == "nan" else len(cell.split(";"))
                wanted = self.placeholders.get((kind, oid), 0)
                # none given: the parameter table's values of the placeholders (libpetab's
                # rule), where it has every one
                tabled = all(
                    f"{kind}Parameter{i}_{oid}" in self.parameter_ids for i in range(1, wanted + 1)
                )
                if given != wanted and not (given == 0 and tabled):
                    raise PetabError(
                        f"{self.path}: the measurement table's row {index + 1} gives {given} "
                        f"{column} for {oid}, whose formula has {wanted} "
                        f"({kind}Parameter1_{oid} …): give one value or id per placeholder"
                    )
        data = {"time": times, "observable": observables, "value": values}
        for kind, column in (("observable", "observableParameters"), ("noise", "noiseParameters")):
            if column not in rows.columns:
                continue
            for r, (oid, cell) in enumerate(zip(observables, rows[column])):
                cell = str(cell).strip()
                if not cell or cell.lower() == "nan":
                    continue
                for i, part in enumerate(cell.split(";"), start=1):
                    name = f"{kind}Parameter{i}_{oid}"
                    part = part.strip()
                    number = _number(part)
                    if number is None and part not in unknowns and part not in self.model.params:
                        raise PetabError(
                            f"{self.path}: a measurement's {column} names {part!r}, which is "
                            "no parameter"
                        )
                    data.setdefault(name, np.full(len(times), np.nan, dtype=object))[r] = (
                        part if number is None else number
                    )
                    unknowns.setdefault(name, Unknown(0.0, estimate=False))
        return data


class _Formula:
    """An observable's or a noise model's formula as `fn(t, y, p)`: the model's symbols (states,
    assignment rules) and every parameter of the study by name."""

    def __init__(self, model: SBMLModel, compiled):
        self.model, self.compiled = model, compiled

    def __call__(self, t, y, p):
        return self.compiled(self.model.environment(t, y, p))


class _InitialState:
    """The initial state under a condition: the model's (its initial values and assignments
    with the condition's parameters), with each species the condition sets replaced by its
    value (the parameters `<species>` and `set:<species>`)."""

    def __init__(self, model: SBMLModel, species: tuple):
        self.model, self.species = model, species

    def __call__(self, p):
        model = self.model
        state = model.initial_state({k: v for k, v in p.items() if k in model.params})
        chosen = model.chosen(p)  # a species' value given by a formula (`with_choices`)
        for name in self.species:
            i = model.state_names.index(name)
            state = state.at[i].set(jnp.where(p[_SET + name] > 0, chosen[name], state[i]))
        return state


# PEtab v1's objective priors: (numpyro distribution of the two parameters, on the scale?). The
# plain kinds are densities of the natural value; the parameterScale* kinds of the value on the
# parameter's scale (log10 k for a log10 parameter), as libpetab and pyPESTO evaluate them.
# the prior kinds only PEtab v2 has (its rows come from petab_v2, marked truncateToBounds)
_V2_PRIORS = ("logUniform", "cauchy", "chisquare", "exponential", "gamma", "rayleigh")


def _prior(row) -> tuple:
    kind = str(row.get("objectivePriorType", "")).strip()
    if kind in ("", "nan"):
        return None, False
    import numpyro.distributions as dist

    text = str(row.get("objectivePriorParameters", "")).strip()
    values = [_number(v) for v in text.split(";")] if text not in ("", "nan") else []
    kinds = {  # kind: (distribution of its parameters, of the value on its scale, how many)
        "uniform": (dist.Uniform, False, 2),
        "normal": (dist.Normal, False, 2),
        "laplace": (dist.Laplace, False, 2),
        "logNormal": (dist.LogNormal, False, 2),
        "logLaplace": (_log_laplace, False, 2),
        "parameterScaleUniform": (dist.Uniform, True, 2),
        "parameterScaleNormal": (dist.Normal, True, 2),
        "parameterScaleLaplace": (dist.Laplace, True, 2),
        # PEtab v2's further kinds (petab_v2), in its parametrisation
        "logUniform": (dist.LogUniform, False, 2),
        "cauchy": (dist.Cauchy, False, 2),
        "chisquare": (dist.Chi2, False, 1),
        "exponential": (lambda scale: dist.Exponential(1.0 / scale), False, 1),
        "gamma": (lambda shape, scale: dist.Gamma(shape, 1.0 / scale), False, 2),
        # Rayleigh(σ) is Weibull(scale σ√2, shape 2) (numpyro has no Rayleigh)
        "rayleigh": (lambda s: dist.Weibull(s * 2.0**0.5, 2.0), False, 1),
    }
    v2 = str(row.get("truncateToBounds", "")) == "1"
    if kind not in kinds or (not v2 and kind in _V2_PRIORS):
        names = sorted(k for k in kinds if v2 or k not in _V2_PRIORS)
        raise PetabError(f"objectivePriorType {kind!r} is not one of {names}")
    distribution, on_scale, count = kinds[kind]
    if len(values) != count or any(v is None for v in values):
        raise PetabError(
            f"prior {kind} needs {count} number(s) as its parameters (';' between), got {text!r}"
        )
    prior = distribution(*values)
    if v2:  # PEtab v2's priors are truncated to the bounds
        prior = TruncatedToBounds(prior, _number(row["lowerBound"]), _number(row["upperBound"]))
    return prior, on_scale


def TruncatedToBounds(base, low: float, high: float):
    """`base` renormalised to [low, high] (PEtab v2's truncated priors): its log-density less
    log(F(high) − F(low)), the probability it gives the bounds (computed once, on the host);
    `base` itself where that is 1. Only its density is used (fits, `ds.sample`'s target)."""
    import numpy as np
    import numpyro.distributions as dist
    from numpyro.distributions import constraints

    # below the support (an exponential's, a Weibull's from 0) the cdf is 0, whatever a
    # distribution's formula gives there
    start = float(getattr(base.support, "lower_bound", -np.inf))

    def cdf(x, outside):
        if not np.isfinite(x):
            return outside
        if x <= start:
            return 0.0
        value = float(base.cdf(jnp.asarray(x)))
        return min(max(value, 0.0), 1.0) if np.isfinite(value) else outside

    mass = cdf(high, 1.0) - cdf(low, 0.0)
    if not 0.0 < mass < 1.0:
        return base

    class _Truncated(dist.Distribution):
        arg_constraints = {"low": constraints.real, "high": constraints.real}
        support = constraints.real

        def __init__(self):
            self.base_dist, self.low, self.high = base, low, high
            super().__init__(batch_shape=(), event_shape=())

        def log_prob(self, x):
            inside = (x >= self.low) & (x <= self.high)
            return jnp.where(inside, self.base_dist.log_prob(x) - np.log(mass), -jnp.inf)

        def sample(self, key, sample_shape=()):
            raise NotImplementedError("a prior truncated to bounds is a density only")

    _Truncated.__name__ = "TruncatedToBounds"
    return _Truncated()


def _log_laplace(a, b):
    """log x ~ Laplace(a, b) (numpyro has no LogLaplace)."""
    import numpyro.distributions as dist

    return dist.TransformedDistribution(dist.Laplace(a, b), dist.transforms.ExpTransform())
