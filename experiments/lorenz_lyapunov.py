"""The largest Lyapunov exponent of the Lorenz system along ρ.

The Lorenz flow (σ = 10, β = 8/3) is followed from (1, 1, 20) for ρ from 0 to 200 in steps of
0.25 (quick: steps of 10, and 28) with RK4 (dt = 0.01). `ds.lyapunov_exponent` carries a
tangent vector along each trajectory by `jax.jvp` of the solve, renormalizing it every 10 steps
(Benettin et al. 1980); after a transient of 100 time units the exponent is the mean
logarithmic growth over 1000 (quick: 100 after 20). All ρ values, and 16 more initial
conditions at ρ = 28, are one `jax.vmap`.

The left panel shows λ(ρ): negative along the stable origin (ρ < 1) and the stable fixed points
C± (ρ < ρ_H ≈ 24.74), where it matches the largest real part of the eigenvalues of the
linearization (dashed, closed form) to ~4·10⁻⁴ below ρ ≈ 13.9; between 13.93 and 24.74
trajectories may wander chaotically for long before settling (transient chaos). Above ρ_H it is
positive, ≈ 0.9–2.2, on the chaotic attractor, with periodic windows where it drops to ≈ 0
(ρ ≈ 100 and 145–166, and narrow ones). At ρ = 28 the published value is 0.9056 (Sprott 2003);
the right panels show the running estimates of the 16 initial conditions converging to it and
their spread, which falls like 1/√T at long times (≈ 0.11/√T). Expect λ(28) = 0.904 ± 0.004
(std of 16), λ(10) = −0.59550 and λ(20) = −0.1548 (closed forms −0.59550, −0.15479).

Run: `python experiments/lorenz_lyapunov.py [--out DIR] [--quick]`
"""

import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import xarray as xr

sys.path.insert(0, str(Path(__file__).parent))
import _output

import diffsim as ds
import models

SIGMA, BETA = 10.0, 8.0 / 3.0
PUBLISHED = 0.9056  # λ at ρ = 28 (J. C. Sprott, Chaos and Time-Series Analysis, OUP 2003)
DT = 0.01
EVERY = 10  # steps between renormalizations of the tangent vector
Y0 = (1.0, 1.0, 20.0)
MEMBERS = 16  # initial conditions at ρ = 28 for the spread of the estimate
SEED = 0  # their offsets from Y0: jax.random.normal(jax.random.key(SEED), (MEMBERS, 3))
RHO_HOPF = SIGMA * (SIGMA + BETA + 3) / (SIGMA - BETA - 1)  # C± lose stability: 24.737
RHO_HOMOCLINIC = 13.926  # transient chaos sets in (Kaplan & Yorke 1979)
RHO_ATTRACTOR = 24.06  # the chaotic attractor appears


def fixed_point_exponent(rho: float) -> float:
    """The largest real part of the eigenvalues of the Jacobian at the stable fixed point
    (the origin for ρ < 1, C± for 1 ≤ ρ < ρ_H); NaN where no fixed point is stable."""
    if rho < 1.0:  # origin: −β and the roots of λ² + (σ+1)λ + σ(1−ρ)
        roots = np.r_[np.roots([1.0, SIGMA + 1.0, SIGMA * (1.0 - rho)]), -BETA]
    elif rho < RHO_HOPF:  # C±: λ³ + (σ+β+1)λ² + β(ρ+σ)λ + 2σβ(ρ−1)
        roots = np.roots(
            [1.0, SIGMA + BETA + 1.0, BETA * (rho + SIGMA), 2 * SIGMA * BETA * (rho - 1)]
        )
    else:
        return float("nan")
    return float(np.max(roots.real))


def _or_none(value: float):
    return None if np.isnan(value) else value


@eqx.filter_jit
def exponents(rhos, y0s, *, steps: int, transient_steps: int):
    """Running λ estimates, shape (members, steps // EVERY), for each pair (ρ, y0)."""
    model = models.Lorenz(sigma=SIGMA, beta=BETA)

    def one(rho, y0):
        member = eqx.tree_at(lambda m: m.rho, model, rho)
        _, running = ds.lyapunov_exponent(
            member,
            y0,
            solver=ds.RK4(),
            dt=DT,
            steps=steps,
            renormalize_every=EVERY,
            transient_steps=transient_steps,
            history=True,
        )
        return running

    return jax.vmap(one)(rhos, y0s)


def run(out_dir="out/lorenz_lyapunov", quick: bool = False) -> dict:
    out, plt = _output.prepare(out_dir)
    if quick:
        rhos = np.union1d(np.arange(0.0, 201.0, 10.0), [28.0])
        duration, transient = 100.0, 20.0
    else:
        rhos = np.arange(0.0, 200.0 + 0.125, 0.25)
        duration, transient = 1000.0, 100.0
    steps, transient_steps = round(duration / DT), round(transient / DT)
    offsets = np.asarray(jax.random.normal(jax.random.key(SEED), (MEMBERS, 3)))
    starts = np.concatenate([np.tile(Y0, (rhos.size, 1)), np.asarray(Y0) + offsets])
    all_rhos = np.concatenate([rhos, np.full(MEMBERS, 28.0)])

    start = time.perf_counter()
    running = np.asarray(
        exponents(
            jnp.asarray(all_rhos), jnp.asarray(starts), steps=steps, transient_steps=transient_steps
        )
    )
    print(
        f"{all_rhos.size} trajectories × {steps + transient_steps} RK4 steps with tangents: "
        f"{time.perf_counter() - start:.1f} s"
    )
    lam = running[: rhos.size, -1]
    at28 = running[rhos.size :, -1]  # the MEMBERS initial conditions at ρ = 28
    lam28 = float(lam[np.flatnonzero(rhos == 28.0)[0]])
    analytic = np.array([fixed_point_exponent(r) for r in rhos])
    mean28, spread28 = float(at28.mean()), float(at28.std(ddof=1))
    print(
        f"λ(28) = {lam28:.4f} from {Y0}; over {MEMBERS} initial conditions {mean28:.4f} ± "
        f"{spread28:.4f} (std); published {PUBLISHED}"
    )

    # regions where λ should follow the stable fixed point: away from ρ = 1 (critical slowing
    # down) and below the onset of transient chaos
    regular = ((rhos < 0.8) | (rhos > 1.5)) & (rhos < RHO_HOMOCLINIC)
    fixed_error = float(np.max(np.abs(lam[regular] - analytic[regular])))
    picks = [r for r in (0.0, 5.0, 10.0, 20.0, 28.0, 50.0, 100.0, 150.0, 160.0, 200.0) if r in rhos]
    at = {f"{r:g}": float(lam[np.flatnonzero(rhos == r)[0]]) for r in picks}
    for r in picks:
        reference = fixed_point_exponent(r)
        extra = "" if np.isnan(reference) else f" (fixed point {reference:+.5f})"
        print(f"  λ(ρ = {r:5g}) = {at[f'{r:g}']:+.4f}{extra}")
    print(
        f"largest |λ − fixed-point value| for ρ < {RHO_HOMOCLINIC} (not near 1): {fixed_error:.2e}"
    )

    # --- figure ----------------------------------------------------------------------------
    fig = plt.figure(figsize=(11.0, 4.8))
    grid = fig.add_gridspec(2, 2, width_ratios=[1.75, 1], height_ratios=[1.25, 1])
    left = fig.add_subplot(grid[:, 0])
    left.axhline(0.0, color="0.5", lw=0.8)
    left.axvspan(RHO_HOMOCLINIC, RHO_HOPF, color="0.92", lw=0)
    left.text(
        0.5 * (RHO_HOMOCLINIC + RHO_HOPF),
        -1.35,
        "transient\nchaos",
        ha="center",
        va="bottom",
        fontsize=7,
        color="0.35",
    )
    left.plot(rhos, lam, ".-", color="C0", ms=2.5, lw=0.7, label="ds.lyapunov_exponent")
    fine = np.linspace(0.0, RHO_HOPF - 1e-6, 600)
    left.plot(
        fine,
        [fixed_point_exponent(r) for r in fine],
        "--",
        color="C1",
        lw=1.1,
        label="stable fixed point: max Re(eigenvalue)",
    )
    left.plot(
        [28.0],
        [PUBLISHED],
        "*",
        color="C3",
        ms=11,
        mec="k",
        mew=0.5,
        zorder=5,
        label=f"published λ(28) = {PUBLISHED}",
    )
    left.axvline(RHO_HOPF, color="0.4", lw=0.8, ls=":")
    left.text(RHO_HOPF + 1.5, -0.8, f"$\\rho_H$ = {RHO_HOPF:.2f}", fontsize=7, color="0.3")
    left.annotate(
        "periodic windows",
        xy=(100, 0.02),
        xytext=(127, -0.45),
        fontsize=7,
        ha="center",
        arrowprops=dict(arrowstyle="->", lw=0.6, color="0.3"),
    )
    left.annotate(
        "",
        xy=(155, 0.02),
        xytext=(140, -0.38),
        arrowprops=dict(arrowstyle="->", lw=0.6, color="0.3"),
    )
    left.set_xlim(0, rhos.max())
    left.set_ylim(-1.4, 2.6)
    left.set_xlabel("Rayleigh number ratio ρ")
    left.set_ylabel("largest Lyapunov exponent λ (1 / time)")
    left.set_title(
        f"Lorenz, σ = 10, β = 8/3: RK4, dt = {DT}, averaged over T = {duration:g} "
        f"after {transient:g}",
        fontsize=10,
    )
    left.legend(loc="upper left", fontsize=7.5)

    times = DT * EVERY * np.arange(1, running.shape[1] + 1)
    # log-spaced samples from T = 1 (earlier, the estimates scatter over ±1)
    first = round(1.0 / (DT * EVERY))
    shown = np.unique(np.geomspace(first, times.size, 400).astype(int)) - 1
    paths = running[rhos.size :]
    top = fig.add_subplot(grid[0, 1])
    for i, path in enumerate(paths):
        top.plot(
            times[shown],
            path[shown],
            lw=0.7,
            color="C0",
            alpha=0.5,
            label=f"{MEMBERS} initial conditions" if i == 0 else None,
        )
    top.axhline(PUBLISHED, color="C3", lw=1.0, label=f"published {PUBLISHED}")
    top.set_xscale("log")
    top.set_ylim(0.4, 1.4)
    top.set_xlim(times[shown[0]], times[-1])
    top.set_ylabel("running estimate of λ")
    top.set_title(f"ρ = 28: λ = {mean28:.4f} ± {spread28:.4f} (std of {MEMBERS})", fontsize=10)
    top.legend(loc="upper right", fontsize=7.5)
    top.tick_params(labelbottom=False)

    bottom = fig.add_subplot(grid[1, 1], sharex=top)
    spread = paths[:, shown].std(axis=0, ddof=1)
    bias = np.abs(paths[:, shown].mean(axis=0) - PUBLISHED)
    bottom.loglog(times[shown], spread, color="C0", label="spread (std) of the estimates")
    bottom.loglog(times[shown], bias, color="C2", lw=0.8, label=f"|their mean − {PUBLISHED}|")
    scale = spread28 * np.sqrt(times[-1])  # the spread times √T, measured at the end
    bottom.loglog(
        times[shown], scale / np.sqrt(times[shown]), "k:", lw=1.0, label=f"{scale:.2f} / √T"
    )
    bottom.set_ylim(1e-5, 3.0)
    bottom.set_xlabel("averaging time T")
    bottom.set_ylabel("error of λ")
    bottom.legend(loc="lower left", fontsize=7)
    fig.tight_layout()
    files = ds.plot.save(fig, out, "lorenz_lyapunov")
    plt.close("all")

    data = xr.Dataset(
        {
            "exponent": ("rho", lam, {"long_name": "largest Lyapunov exponent", "units": "1/time"}),
            "fixed_point_exponent": (
                "rho",
                analytic,
                {"long_name": "max real eigenvalue at the stable fixed point"},
            ),
            "running_estimate_rho28": (
                ("member", "time"),
                running[rhos.size :][:, shown],
                {"long_name": "running estimate of λ at ρ = 28"},
            ),
            "initial_state_rho28": (("member", "state"), starts[rhos.size :]),
        },
        coords={
            "rho": rhos,
            "member": np.arange(MEMBERS),
            "time": times[shown],
            "state": ["x", "y", "z"],
        },
        attrs={
            "dt": DT,
            "renormalize_every": EVERY,
            "duration": duration,
            "transient": transient,
            "published_rho28": PUBLISHED,
        },
    )
    files.append(_output.dataset(out, "lorenz_lyapunov", data))
    config = {
        "sigma": SIGMA,
        "beta": BETA,
        "rho_min": float(rhos.min()),
        "rho_max": float(rhos.max()),
        "rho_count": int(rhos.size),
        "dt": DT,
        "solver": "RK4",
        "renormalize_every": EVERY,
        "duration": duration,
        "transient": transient,
        "y0": list(Y0),
        "members_rho28": MEMBERS,
        "seed": SEED,
    }
    record = {
        "config": config,
        "published_rho28": PUBLISHED,
        "lambda_rho28": lam28,
        "lambda_rho28_mean": mean28,
        "lambda_rho28_std": spread28,
        "lambda_rho28_members": at28.tolist(),
        "lambda_at": at,
        "fixed_point_at": {k: _or_none(fixed_point_exponent(float(k))) for k in at},
        "max_fixed_point_error": fixed_error,
    }
    files.append(_output.summary(out, "lorenz_lyapunov", record))
    return {"files": files, **record}


if __name__ == "__main__":
    _output.main(__file__, __doc__)
