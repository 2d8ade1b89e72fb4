"""Published studies of the PEtab benchmark collection written as `ds.Problem`s by hand: the
kinetic models from `models.signalling` (written from the SBML files), the measurements, noise
and parameter tables read from experiments/data/petab/ (the importer of PEtab files, which the
SBML/PEtab issue builds, is checked against these).

Each `<study>()` returns the problem with every unknown at the table's nominal value;
`REFERENCE_LLH` holds AMICI's log-likelihood there (experiments/data/README.md).
"""

import csv
import math
from pathlib import Path

import jax.numpy as jnp
import numpy as np

import diffsim as ds
import models.signalling as signalling

DATA = Path(__file__).resolve().parents[1] / "data" / "petab"

REFERENCE_LLH = {
    "Boehm": -138.22199693517703,
    "Fujita": 53.08377736998929,
    "Bruno": 46.688176988431806,
}
# the best log-likelihood known for each (the benchmark collection's nominal values are its
# published optima)
BEST_LLH = dict(REFERENCE_LLH)


def _table(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as file:
        return list(csv.DictReader(file, delimiter="\t"))


def _one(folder: str, prefix: str) -> Path:
    (path,) = sorted((DATA / folder).glob(f"{prefix}*.tsv"))
    return path


def unknowns(folder: str) -> dict:
    """The parameter table's estimated parameters as `ds.Unknown`s (scale, bounds, nominal)."""
    out = {}
    for row in _table(_one(folder, "parameters")):
        if row["estimate"].strip() != "1":
            continue
        scale = row["parameterScale"].strip()
        out[row["parameterId"]] = ds.Unknown(
            float(row["nominalValue"]),
            bounds=(float(row["lowerBound"]), float(row["upperBound"])),
            scale=scale,
        )
    return out


def measurements(folder: str, prefix: str = "measurementData") -> dict[str, dict]:
    """Condition id → long table (time, observable, value, and the row's noise parameter as
    `noise` where the table gives a number)."""
    by_condition = {}
    for row in _table(_one(folder, prefix)):
        table = by_condition.setdefault(
            row["simulationConditionId"], {"time": [], "observable": [], "value": [], "noise": []}
        )
        table["time"].append(float(row["time"]))
        table["observable"].append(row["observableId"])
        table["value"].append(float(row["measurement"]))
        try:
            table["noise"].append(float(row.get("noiseParameters", "")))
        except ValueError:
            table["noise"].append(math.nan)
    return {
        condition: {
            k: np.asarray(v, dtype=object if k == "observable" else float) for k, v in t.items()
        }
        for condition, t in by_condition.items()
    }


def boehm() -> ds.Problem:
    """STAT5 dimerisation (Boehm et al. 2014): one condition, three relative observables with
    their own estimated noise (9 unknowns)."""
    folder = "Boehm_JProteomeRes2014"
    (data,) = measurements(folder).values()
    data = {k: v for k, v in data.items() if k != "noise"}

    def p_a(t, y, p):
        a, papb, papa = y[0], y[2], y[3]
        c = p["specC17"]
        return (100 * papb + 200 * papa * c) / (papb + a * c + 2 * papa * c)

    def p_b(t, y, p):
        b, papb, pbpb = y[1], y[2], y[4]
        c = p["specC17"]
        return -(100 * papb - 200 * pbpb * (c - 1)) / ((b * (c - 1) - papb) + 2 * pbpb * (c - 1))

    def r_a(t, y, p):
        a, b, papb, papa, pbpb = y[0], y[1], y[2], y[3], y[4]
        c = p["specC17"]
        top = 100 * papb + 100 * a * c + 200 * papa * c
        return top / (2 * papb + a * c + 2 * papa * c - b * (c - 1) - 2 * pbpb * (c - 1))

    def y0(p):
        total = 207.6
        zero = jnp.zeros_like(p["ratio"])
        return jnp.stack([total * p["ratio"], total - total * p["ratio"]] + [zero] * 6)

    return ds.Problem(
        signalling.BoehmSTAT5(),
        [ds.Experiment(data, y0=y0, name="model1_data1")],
        {
            "pSTAT5A_rel": ds.Observable(p_a, sigma="sd_pSTAT5A_rel"),
            "pSTAT5B_rel": ds.Observable(p_b, sigma="sd_pSTAT5B_rel"),
            "rSTAT5A_rel": ds.Observable(r_a, sigma="sd_rSTAT5A_rel"),
        },
        unknowns(folder),
    )


def fujita() -> ds.Problem:
    """EGFR–Akt–S6 signalling (Fujita et al. 2010): six EGF step doses, three scaled
    observables with a known noise per measurement from the table (19 unknowns)."""
    folder = "Fujita_SciSignal2010"
    data = measurements(folder, "measurementData_step")
    doses = {row["conditionId"]: row for row in _table(_one(folder, "experimentalCondition"))}

    def egfr(t, y, p):
        return p["scaling_pEGFR_tot"] * (y[1] + y[2])

    def akt(t, y, p):
        return p["scaling_pAkt_tot"] * (y[4] + y[6])

    def s6(t, y, p):
        return p["scaling_pS6_tot"] * y[7]

    def y0(p):
        zero = jnp.zeros_like(p["init_EGFR"])
        return jnp.stack(
            [p["init_EGFR"], zero, zero, p["init_AKT"], zero, p["init_S6"], zero, zero, zero]
        )

    experiments = []
    for condition, table in data.items():
        dose = doses[condition]
        settings = {k: float(dose[k]) for k in ("EGF_0", "EGF_rate", "EGF_end")}
        experiments.append(ds.Experiment(table, y0=y0, set=settings, name=condition))
    unknown = unknowns(folder)
    unknown["noise"] = ds.Unknown(1.0, estimate=False)  # each row sets its own (the table's)
    return ds.Problem(
        signalling.FujitaAkt(),
        experiments,
        {
            "pEGFR_tot": ds.Observable(egfr, sigma="noise"),
            "pAkt_tot": ds.Observable(akt, sigma="noise"),
            "pS6_tot": ds.Observable(s6, sigma="noise"),
        },
        unknown,
    )


def bruno() -> ds.Problem:
    """Carotenoid cleavage (Bruno et al. 2016): six conditions that each start from another
    substrate and switch reactions on or off, condition-specific initial amounts and a shared
    scaling `szea`; noise per measurement from the table (13 unknowns)."""
    folder = "Bruno_JExpBot2016"
    data = measurements(folder)
    conditions = {row["conditionId"]: row for row in _table(_one(folder, "experimentalCondition"))}
    names = ("bcar", "bcry", "b10", "bio", "ohb10", "ohbio", "zea")
    observables = {
        f"o{name}": ds.Observable(lambda t, y, p, i=i: y[i], sigma="noise")
        for i, name in enumerate(names)
        if name != "ohbio"
    }

    def y0(p):
        zero = jnp.zeros_like(p["init_bcar"])
        return jnp.stack(
            [
                p["init_bcar"],
                p["init_bcry"],
                p["init_b10"],
                zero,
                p["init_ohb10"],
                zero,
                p["init_zea"],
            ]
        )

    experiments = []
    for condition, table in data.items():
        row = conditions[condition]
        settings = {}
        for key, value in row.items():
            if key in ("conditionId", "conditionName"):
                continue
            try:
                settings[key] = float(value)
            except ValueError:
                settings[key] = value.strip()  # an estimated parameter's name
        experiments.append(ds.Experiment(table, y0=y0, set=settings, name=condition))
    unknown = unknowns(folder)
    unknown["noise"] = ds.Unknown(1.0, estimate=False)  # each row sets its own (the table's)
    return ds.Problem(signalling.BrunoCarotenoids(), experiments, observables, unknown)


STUDIES = {"Boehm": boehm, "Fujita": fujita, "Bruno": bruno}
