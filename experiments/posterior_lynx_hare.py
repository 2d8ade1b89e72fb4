"""The posterior of the Lotka–Volterra model given the Hudson's Bay Company lynx and hare pelts.

The Bayesian analysis of the Stan case study (B. Carpenter 2018, "Predator-Prey Population
Dynamics: the Lotka-Volterra model in Stan"), with its priors and likelihood, by `ds.sample`:
α, γ ~ Normal(1, 0.5) and β, δ ~ Normal(0.05, 0.05), truncated at 0; the initial populations ~
LogNormal(log 10, 1); one noise scale per species ~ LogNormal(−1, 1); the pelts log-normal
around the model, the first year's included. NUTS, 4 chains of 1,000 warm-up iterations and
1,000 draws (the quick run: 200 and 200), started around a `ds.fit` of the same problem.
The posterior means and 10 % / 90 % quantiles are compared with the case study's table;
figures: the posterior predictive bands over the data, and each unknown's marginal with the
published mean.

Run: `python experiments/posterior_lynx_hare.py [--out DIR] [--quick]`
"""

import sys
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import xarray as xr

sys.path.insert(0, str(Path(__file__).parent))
import _output

import diffsim as ds
import models

DATA = Path(__file__).parent / "data" / "lynx_hare.csv"
SEED = 0
# The case study's posterior (its summary table and text: means, and the 80 % intervals it
# quotes, (0.47, 0.63) for α, (0.023, 0.033) for β, (0.69, 0.91) for γ, (0.020, 0.029) for δ,
# (0.20, 0.31) for both σ; it gives no quantiles of the initial populations)
PUBLISHED = {
    "alpha": (0.545, 0.47, 0.63),
    "beta": (0.028, 0.023, 0.033),
    "gamma": (0.803, 0.69, 0.91),
    "delta": (0.024, 0.020, 0.029),
    "sigma[hare]": (0.250, 0.20, 0.31),
    "sigma[lynx]": (0.252, 0.20, 0.31),
    "y0[prey]": (33.96, None, None),
    "y0[predator]": (5.93, None, None),
}


def priors() -> dict:
    """The case study's priors, named as ds.fit names the unknowns."""
    rate = dict(low=0.0)
    return {
        "alpha": dist.TruncatedNormal(1.0, 0.5, **rate),
        "beta": dist.TruncatedNormal(0.05, 0.05, **rate),
        "gamma": dist.TruncatedNormal(1.0, 0.5, **rate),
        "delta": dist.TruncatedNormal(0.05, 0.05, **rate),
        "y0[prey]": dist.LogNormal(np.log(10.0), 1.0),
        "y0[predator]": dist.LogNormal(np.log(10.0), 1.0),
        "sigma": dist.LogNormal(-1.0, 1.0).expand([2]),
    }


def sample(chains: int, warmup: int, draws: int, seed: int = SEED) -> ds.Posterior:
    """The case study's posterior by ds.sample, from a neutral start: the case study's prior
    means for the rates, the first year's pelts for the initial populations."""
    data = ds.Data.from_csv(DATA, time="year", columns=["hare", "lynx"])
    return ds.sample(
        models.LotkaVolterra(alpha=1.0, beta=0.05, gamma=1.0, delta=0.05),
        jnp.asarray(data.values[0]),
        data,
        params=["alpha", "beta", "gamma", "delta"],
        initial_state=True,
        priors=priors(),
        likelihood="lognormal",
        chains=chains,
        warmup=warmup,
        draws=draws,
        key=jax.random.key(seed),
    )


def run(out_dir="out/posterior_lynx_hare", quick: bool = False) -> dict:
    out, plt = _output.prepare(out_dir)
    iterations = 200 if quick else 1000
    posterior = sample(chains=4, warmup=iterations, draws=iterations)
    print(posterior.summary(quantiles=(0.1, 0.5, 0.9)))
    table = posterior.table(quantiles=(0.1, 0.5, 0.9))
    comparison = {}
    print("\nagainst the Stan case study (mean within 2 MCSE + 1 %, quantiles within 10 %):")
    for name, (mean, low, high) in PUBLISHED.items():
        row = table[name]
        mean_ok = abs(row["mean"] - mean) <= 2 * row["mcse"] + 0.01 * abs(mean)
        quantiles_ok = low is None or (
            abs(row["10%"] - low) <= 0.1 * low and abs(row["90%"] - high) <= 0.1 * high
        )
        comparison[name] = dict(
            mean=row["mean"],
            mcse=row["mcse"],
            q10=row["10%"],
            q90=row["90%"],
            published_mean=mean,
            published_q10=low,
            published_q90=high,
            r_hat=row["r_hat"],
            ess=row["ess"],
            within=bool(mean_ok and quantiles_ok),
        )
        quoted = (
            "" if low is None else f"; 10–90 % {row['10%']:.4g}–{row['90%']:.4g} ({low}–{high})"
        )
        print(
            f"  {name:13s} mean {row['mean']:.4g} ± {row['mcse']:.2g} (published {mean})"
            f"{quoted}: {'within' if mean_ok and quantiles_ok else 'OUTSIDE'}"
        )

    files = ds.plot.save(posterior.plot("predictive", draws=400), out, "posterior_lynx_hare")
    fig, axes = plt.subplots(2, 4, figsize=(12, 5))
    for ax, name in zip(axes.ravel(), PUBLISHED):
        draws = _draws(posterior, name).ravel()
        ax.hist(draws, bins=40, density=True, color="C0", alpha=0.6)
        ax.axvline(PUBLISHED[name][0], color="k", ls=":", lw=1, label="Stan case study mean")
        ax.set_title(name)
        ax.set_yticks([])
    axes[0, 0].legend(frameon=False, fontsize=8)
    fig.tight_layout()
    files += ds.plot.save(fig, out, "posterior_lynx_hare_marginals")
    plt.close("all")
    draws = xr.Dataset(
        {
            name.replace("[", "_").replace("]", ""): (("chain", "draw"), _draws(posterior, name))
            for name in PUBLISHED
        },
        coords={"chain": np.arange(posterior.chains), "draw": np.arange(posterior.draws)},
        attrs=dict(seed=SEED, likelihood="lognormal", solver="Tsit5, rtol = atol = 1e-6"),
    )
    files.append(_output.dataset(out, "posterior_lynx_hare_draws", draws))
    record = dict(
        comparison=comparison,
        divergences=posterior.divergences.tolist(),
        step_size=np.asarray(posterior.sample_stats["step_size"]).tolist(),
        mean_leapfrog_steps=float(np.mean(posterior.sample_stats["n_steps"])),
        all_within=all(c["within"] for c in comparison.values()),
        config=dict(
            data="data/lynx_hare.csv",
            chains=4,
            warmup=iterations,
            draws=iterations,
            seed=SEED,
            priors=posterior.settings.priors,
            likelihood="lognormal",
        ),
    )
    files.append(_output.summary(out, "posterior_lynx_hare", record))
    return dict(record, files=files)


def _draws(posterior, name: str) -> np.ndarray:
    """(chains, draws) of one entry: a scalar unknown, or one species' σ."""
    if name.startswith("sigma["):
        column = {"sigma[hare]": 0, "sigma[lynx]": 1}[name]
        return np.asarray(posterior.samples["sigma"])[..., column]
    return np.asarray(posterior.samples[name])


if __name__ == "__main__":
    _output.main(__file__, __doc__)
