"""STAT5 dimerisation (Boehm et al., J. Proteome Res. 2014) fitted from its PEtab files.

The published study as the PEtab benchmark collection ships it (experiments/data/petab/
Boehm_JProteomeRes2014/: SBML model, measurement, condition, observable and parameter tables,
unchanged): 48 measurements of three observables, 9 estimated parameters on log10 scales within
1e-5 … 1e5 (three of them noise levels). Read with `ds.petab.load`, fitted by `ds.fit` from
starts drawn uniform on each parameter's scale within its bounds (seeded: the published values
are not a start), as `diffsim fit Boehm_JProteomeRes2014.yaml` does. The best start is compared
with the published optimum (llh −138.222, AMICI). Figures: the data and the fit per observable,
the waterfall of the starts (which of them reached the best optimum, which ended elsewhere), and
the profile likelihoods of two rates (the full run: 20 starts, 17 profile points; the quick
run: 6 starts, 9 points).

Run: `python experiments/petab_boehm.py [--out DIR] [--quick]`
"""

import sys
import warnings
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import _output

import diffsim as ds

PROBLEM = Path(__file__).parent / "data" / "petab" / "Boehm_JProteomeRes2014"
PUBLISHED_LLH = -138.22199693517703  # AMICI at the collection's nominal (published) values
PROFILED = ("Epo_degradation_BaF3", "k_phos")


def run(out_dir="out/petab_boehm", quick: bool = False) -> dict:
    out, plt = _output.prepare(out_dir)
    problem = ds.petab.load(PROBLEM / "Boehm_JProteomeRes2014.yaml")
    nominal = problem.llh()
    print(f"{problem!r}; llh at the published values {nominal:.6f} (AMICI {PUBLISHED_LLH:.6f})")
    count = 6 if quick else 20
    with warnings.catch_warnings():  # its summary states them
        warnings.simplefilter("ignore", ds.FitWarning)
        result = ds.fit(problem, starts=problem.uniform_starts(count, seed=0), progress=False)
    print(result.summary())
    files = ds.plot.save(result.plot(), out, "petab_boehm_fit")
    files += ds.plot.save(result.plot_waterfall(), out, "petab_boehm_waterfall")
    points = 9 if quick else 17
    profiles = {name: ds.profile(result, name, points=points) for name in PROFILED}
    fig, axes = plt.subplots(1, len(PROFILED), figsize=(3.8 * len(PROFILED), 3.2), squeeze=False)
    for ax, (name, profile) in zip(axes[0], profiles.items()):
        profile.plot(ax=ax)
        published = problem.unknowns[name].value
        ax.axvline(published, color="k", ls=":", lw=0.8, label="published")
        ax.legend(fontsize="x-small", frameon=False)
    fig.tight_layout()
    files += ds.plot.save(fig, out, "petab_boehm_profiles")
    plt.close("all")
    predicted = result.predictions()[0]
    files.append(
        _output.table(
            out,
            "petab_boehm_predictions",
            {
                "time": np.asarray(predicted["time"], dtype=float),
                "observable": np.asarray(
                    [list(problem.observables).index(o) for o in predicted["observable"]]
                ),
                "measurement": np.asarray(predicted["value"], dtype=float),
                "prediction": np.asarray(predicted["prediction"], dtype=float),
            },
        )
    )
    record = dict(
        llh=result.llh,
        published_llh=PUBLISHED_LLH,
        llh_at_published_values=nominal,
        reached_published=bool(result.llh >= PUBLISHED_LLH - 0.1),
        starts=count,
        starts_llh=[float(v) for v in np.asarray(result.starts["llh"])],
        starts_reached=result.starts_reached,
        params=result.params,
        published_params={n: problem.unknowns[n].value for n in problem.names},
        stderr_log10=result.stderr,
        profile_intervals={n: list(p.interval) for n, p in profiles.items()},
        observables=list(problem.observables),
        config=dict(
            problem="data/petab/Boehm_JProteomeRes2014/Boehm_JProteomeRes2014.yaml",
            starts=f"{count}, uniform on each parameter's log10 scale within its bounds, seed 0",
            solver="Rodas5P, rtol 1e-8, atol 1e-10 (ds.Problem's default)",
            profile_points=points,
        ),
    )
    files.append(_output.summary(out, "petab_boehm", record))
    return dict(record, files=files)


if __name__ == "__main__":
    _output.main(__file__, __doc__)
