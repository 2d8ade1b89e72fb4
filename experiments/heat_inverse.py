"""Recovering the initial temperature of a rod from noisy later snapshots (heat-equation inverse).

A rod of length L = 1 m with diffusivity κ = 0.01 m²/s and ends held at 0 starts from two
Gaussian bumps, u0(x) = exp(−((x − 0.3)/0.08)²) + 0.6 exp(−((x − 0.65)/0.12)²). It is observed
at the 63 interior grid points at t = 0.25, 0.5, 0.75 and 1 s with Gaussian noise σ = 0.01 (1%
of the peak, seeded); the noise-free values come from the exact solution of the continuous
equation (its sine series, 400 modes), not from the model that is fitted, so the fit also
meets the model's own discretization error. The unknown is u0 on the grid (63 values). The
model is `models.Heat1D` (second-order differences, method of lines) solved with RK4 at
dt = 0.01 s, below the explicit stability limit dx²/(2κ) = 0.0122 s.

The loss is the misfit χ²/m = Σ (u(t_j, x_i) − d_ij)² / (m σ²) over the m = 252 observations
plus α ∫ u0′² dx (Tikhonov smoothness, first differences with the zero boundary values). Its
gradient is `jax.grad` through `ds.simulate`; the optimizer is optax's L-BFGS direction
(`optax.scale_by_lbfgs`, memory 10) with an exact line search: the heat equation is linear,
so the loss is quadratic in u0, and the step s = −g·d / (d·Hd) along the direction d is the
exact minimizer, with Hd = ∇J(u + d) − ∇J(u) from one solve and gradient per iteration (the
gradient and the predictions at u + s d follow by linear combination). The optimization is
one `lax.scan`, vmapped over a grid of α (and α = 0): one compiled program.

Why it is ill-posed and how it is regularized: Fourier mode k of u0 decays by
exp(−κπ²k² t). At t = 1 s mode 7 is down to 0.8% and mode 10 to 5e-5, below the noise, so a
single late snapshot fixes only the first ~6 modes, too few for bumps 0.08 m wide; at the
earliest snapshot, t = 0.25 s, modes up to k ≈ 12 are still above 3%, and the Picard panel
shows the true coefficients above the noise floor up to k ≈ 15: that is why the rod is
observed early. Without a penalty the fit pushes the noise into the modes the data cannot
see, and the error grows as the optimizer converges (semi-convergence: best after ~10
iterations, 160–250% after 150–300). α is chosen by Morozov's discrepancy principle, the
largest α on the grid whose fit has χ²/m ≤ 1 (explain the data to within the noise, no
better), which needs no knowledge of the true profile. The gradient is checked against central
differences of the loss along one random direction at the start u0 = 0.

The figure shows (a) the true, recovered and unregularized u0, (b) the data against the
recovered model, (c) the sine coefficients of u0 against the noise floor, (d) misfit and
error against α, (e) the loss and (f) the error against iteration. Numbers to expect (full
run, α on a half-decade grid): α = 3.2e-3, relative L2 error of u0 5.4% (the best α on the
grid), χ²/m = 0.993 (the noise-free truth has 1.027), unregularized error 249%; the gradient
matches the central difference to 4e-14. The quick run (decade grid, 150 iterations) picks
α = 1e-3: error 6.7%, unregularized 162%.

Run: `python experiments/heat_inverse.py [--out DIR] [--quick]`
"""

import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp
import numpy as np
import optax
import xarray as xr
from jax import lax

sys.path.insert(0, str(Path(__file__).parent))
import _output

import diffsim as ds
import models

LENGTH = 1.0  # m
DIFFUSIVITY = 0.01  # m²/s
POINTS = 63  # interior grid points: dx = L/64
DT = 0.01  # s; the explicit limit dx²/(2κ) is 0.0122 s
OBSERVATION_TIMES = (0.25, 0.5, 0.75, 1.0)  # s: equal intervals, 25 steps each
NOISE = 0.01
SEED = 0  # the observation noise and the gradient check's direction
MODES = 400  # sine-series terms of the exact solution behind the data
# Morozov's discrepancy principle: the largest α with χ²/m ≤ 1 = E[χ²/m] of the noise itself
DISCREPANCY = 1.0
MEMORY = 10  # L-BFGS history
FD_STEP = 1e-3  # central differences of a quadratic have no truncation error: round-off only


def true_profile(x):
    x = np.asarray(x)
    return np.exp(-(((x - 0.3) / 0.08) ** 2)) + 0.6 * np.exp(-(((x - 0.65) / 0.12) ** 2))


def exact_solution(x, times):
    """u(t, x) of the continuous problem from `true_profile`, by its sine series: (times, x)."""
    quadrature = np.linspace(0.0, LENGTH, 8001)
    k = np.arange(1, MODES + 1)
    basis = np.sin(np.pi * np.outer(k, quadrature) / LENGTH)
    coefficients = 2 / LENGTH * np.trapezoid(true_profile(quadrature) * basis, quadrature, axis=1)
    decay = np.exp(-DIFFUSIVITY * (np.pi * k / LENGTH) ** 2 * np.asarray(times)[:, None])
    return (coefficients * decay) @ np.sin(np.pi * np.outer(k, x) / LENGTH)


class Problem:
    """The forward model, the data and the loss J(u0; α) = χ²/m + α ∫ u0′² dx."""

    def __init__(self, data):
        self.model = models.Heat1D(diffusivity=DIFFUSIVITY, length=LENGTH, n=POINTS)
        self.ts = np.array((0.0, *OBSERVATION_TIMES))
        self.data = jnp.asarray(data)
        self.spacing = LENGTH / (POINTS + 1)

    def predict(self, u0):
        """u at the observation times: (times, points). 100 steps of 63 values: reverse mode
        stores every step (`checkpoint=None`, ~0.2 MB), and failures are checked on the host
        (`throw=False`); both save compile time."""
        solution = ds.simulate(
            self.model, u0, self.ts, solver=ds.RK4(), dt=DT, checkpoint=None, throw=False
        )
        return solution.ys[1:]

    def roughness(self, u0):
        """∫ u0′² dx by first differences, u = 0 at both ends."""
        return jnp.sum(jnp.diff(jnp.pad(u0, 1)) ** 2) / self.spacing

    def loss(self, prediction, u0, alpha):
        """(J, χ²/m) from the predictions of u0."""
        misfit = jnp.mean((prediction - self.data) ** 2) / NOISE**2
        return misfit + alpha * self.roughness(u0), misfit

    def objective(self, u0, alpha):
        """(J, (χ²/m, predictions)): for `jax.value_and_grad(..., has_aux=True)`."""
        prediction = self.predict(u0)
        loss, misfit = self.loss(prediction, u0, alpha)
        return loss, (misfit, prediction)


def fit(problem: Problem, alpha, iterations: int, check_direction, truth):
    """Minimize J(·; α) from u0 = 0: L-BFGS directions with the exact step of a quadratic.

    The model is linear, so one solve with its gradient per iteration, at u + d, gives all of
    the step: Hd = ∇J(u + d) − ∇J(u), and the gradient, predictions (hence loss and misfit) at
    u + s d follow exactly (to round-off) by linear combination. The start is solved with its
    neighbours u ± h v along `check_direction` v (unit), which give the gradient check.

    **Returns:** a dict: `u0` the minimizer; `history` the loss at the start and after every
    iteration, `error_history` the relative L2 distance to `truth` (monitoring only);
    `gradient`, `misfit`, `prediction` at `u0`; `check_grad` (∇J·v by `jax.grad`) and
    `check_fd` ((J(u + h v) − J(u − h v)) / 2h, h = FD_STEP) at the start u = 0.
    """
    value_and_grad = jax.value_and_grad(lambda u: problem.objective(u, alpha), has_aux=True)
    optimizer = optax.scale_by_lbfgs(memory_size=MEMORY)
    u = jnp.zeros(POINTS)
    points = jnp.stack([u, u + FD_STEP * check_direction, u - FD_STEP * check_direction])
    (losses, (_, predictions)), gradients = jax.vmap(value_and_grad)(points)
    gradient, prediction = gradients[0], predictions[0]

    def distance(u):
        return jnp.linalg.norm(u - truth) / jnp.linalg.norm(truth)

    def iteration(carry, _):
        u, gradient, prediction, state = carry
        # optax's L-BFGS mixes its int32 step count with int64 indices under x64: allow the
        # standard promotion there (the tests run with strict promotion)
        with jax.numpy_dtype_promotion("standard"):
            direction, state = optimizer.update(gradient, state, u)
        direction = -direction  # scale_by_lbfgs returns H⁻¹g
        (_, (_, prediction_moved)), gradient_moved = value_and_grad(u + direction)
        curvature_vector = gradient_moved - gradient  # H d, exact for a quadratic
        slope = jnp.vdot(gradient, direction)
        curvature = jnp.vdot(direction, curvature_vector)
        # the exact minimizer along d (once converged, d can vanish: then stay)
        step = jnp.where(curvature > 0, -slope / jnp.where(curvature > 0, curvature, 1.0), 0.0)
        u = u + step * direction
        gradient = gradient + step * curvature_vector
        prediction = prediction + step * (prediction_moved - prediction)
        loss, _ = problem.loss(prediction, u, alpha)
        return (u, gradient, prediction, state), (loss, distance(u))

    with jax.numpy_dtype_promotion("standard"):
        start = (u, gradient, prediction, optimizer.init(u))
    (u_final, gradient, prediction, _), (history, errors) = lax.scan(
        iteration, start, None, length=iterations
    )
    return {
        "u0": u_final,
        "history": jnp.concatenate([losses[:1], history]),
        "error_history": jnp.concatenate([distance(u)[None], errors]),
        "gradient": gradient,
        "misfit": problem.loss(prediction, u_final, alpha)[1],
        "prediction": prediction,
        "check_grad": jnp.vdot(gradients[0], check_direction),
        "check_fd": (losses[1] - losses[2]) / (2 * FD_STEP),
    }


def relative_error(u, truth):
    return np.linalg.norm(u - truth, axis=-1) / np.linalg.norm(truth)


def run(out_dir="out/heat_inverse", quick: bool = False) -> dict:
    out, plt = _output.prepare(out_dir)
    iterations = 150 if quick else 300
    alphas = np.concatenate([[0.0], np.logspace(-7, 0, 8 if quick else 15)])
    rng = np.random.default_rng(SEED)
    x = LENGTH * np.arange(1, POINTS + 1) / (POINTS + 1)  # Heat1D's interior points
    truth = true_profile(x)
    clean = exact_solution(x, OBSERVATION_TIMES)
    data = clean + NOISE * rng.standard_normal(clean.shape)
    problem = Problem(data)

    direction = rng.standard_normal(POINTS)  # of the gradient check
    direction /= np.linalg.norm(direction)

    start = time.perf_counter()
    # every α at once: one compiled program (vmap over α of the scan over iterations)
    solve = jax.jit(jax.vmap(lambda a: fit(problem, a, iterations, direction, truth)))
    result = {k: np.asarray(v) for k, v in solve(jnp.asarray(alphas)).items()}
    if not all(np.all(np.isfinite(v)) for v in result.values()):
        raise FloatingPointError("a fit produced non-finite values")
    print(
        f"{len(alphas)} L-BFGS fits x {iterations} iterations (vmapped, one scan): "
        f"{time.perf_counter() - start:.1f} s"
    )
    recovered, history = result["u0"], result["history"]
    misfit, prediction, gradient = result["misfit"], result["prediction"], result["gradient"]
    check_grad, check_fd = result["check_grad"], result["check_fd"]
    check_relative = np.abs(check_grad - check_fd) / np.abs(check_grad)

    errors = relative_error(recovered, truth)
    admissible = np.flatnonzero((alphas > 0) & (misfit <= DISCREPANCY))
    chosen = int(admissible[-1]) if admissible.size else int(np.argmin(np.abs(misfit - 1)))
    best = int(np.argmin(errors))
    unregularized = 0
    truth_misfit = float(np.mean((clean - data) ** 2) / NOISE**2)
    for a, e, m, g in zip(alphas, errors, misfit, np.linalg.norm(gradient, axis=1)):
        print(f"alpha {a:8.2e}: relative error {e:7.3f}, chi2/m {m:.4f}, |grad| {g:.1e}")
    print(
        f"discrepancy principle: alpha = {alphas[chosen]:.3g}, error {errors[chosen]:.4f} "
        f"(best on the grid: alpha = {alphas[best]:.3g}, {errors[best]:.4f}; unregularized "
        f"{errors[unregularized]:.3f}); chi2/m of the noise-free truth {truth_misfit:.3f}"
    )
    print(
        f"gradient check at alpha = {alphas[chosen]:.3g}: jax.grad "
        f"{check_grad[chosen]:.12e}, central difference "
        f"{check_fd[chosen]:.12e}, relative error {check_relative[chosen]:.1e} "
        f"(largest over all alphas {check_relative.max():.1e})"
    )

    start = time.perf_counter()
    k = np.arange(1, POINTS + 1)
    sine = np.sin(np.pi * np.outer(k, x) / LENGTH) * 2 / (POINTS + 1)  # discrete sine transform
    # white noise of std σ has sine coefficients of std σ√(2/(n+1)); mode k of u0 reaches the
    # first snapshot damped by exp(−λ_k t₁): below this floor the data cannot see it
    spacing = LENGTH / (POINTS + 1)  # the discrete modes' decay rates, Heat1D.mode_decay_rate
    rates = 4 * DIFFUSIVITY / spacing**2 * np.sin(k * np.pi * spacing / (2 * LENGTH)) ** 2
    floor = NOISE * np.sqrt(2 / (POINTS + 1)) * np.exp(rates * OBSERVATION_TIMES[0])
    regularized = f"α = {alphas[chosen]:.2g}"
    bad = dict(color="C1", lw=0.8, alpha=0.9)

    fig, axes = plt.subplots(2, 3, figsize=(11.0, 6.6))
    ax = axes[0, 0]
    ax.plot(x, truth, "k-", lw=2.4, label="true u₀")
    ax.plot(x, recovered[chosen], "C0-", label=f"{regularized} (error {errors[chosen]:.1%})")
    ax.plot(x, recovered[unregularized], **bad, label=f"α = 0 (error {errors[unregularized]:.0%})")
    ax.axhline(0.0, ls=":", color="0.5", lw=1, label="initial guess")
    ax.set_ylim(-0.6, 1.6)
    ax.set_xlabel("x (m)")
    ax.set_ylabel("u₀")
    ax.set_title("(a) initial profile: truth and recovered", fontsize=9)
    ax.legend(fontsize=7, loc="upper right")

    ax = axes[0, 1]
    for j, t in enumerate(OBSERVATION_TIMES):
        ax.plot(x, data[j], ".", ms=3, color=f"C{j}", alpha=0.7)
        ax.plot(x, prediction[chosen, j], "-", lw=1, color=f"C{j}", label=f"t = {t:g} s")
    ax.set_xlabel("x (m)")
    ax.set_ylabel("u(t, x)")
    ax.set_title(f"(b) data (dots, σ = {NOISE:g}) and model, {regularized}", fontsize=9)
    ax.legend(fontsize=7)

    ax = axes[0, 2]
    ax.semilogy(k, np.abs(sine @ truth), "k.-", lw=1, ms=4, label="true u₀")
    ax.semilogy(k, np.abs(sine @ recovered[chosen]), "C0.-", lw=1, ms=3, label=regularized)
    ax.semilogy(k, np.abs(sine @ recovered[unregularized]), ".-", ms=3, **bad, label="α = 0")
    shown = floor < 10  # (clear of the legend)
    ax.semilogy(
        k[shown],
        floor[shown],
        "--",
        color="0.4",
        lw=1,
        label=f"noise floor via t = {OBSERVATION_TIMES[0]:g} s",
    )
    ax.set_ylim(1e-7, 1e3)
    ax.set_xlabel("sine mode k")
    ax.set_ylabel("|coefficient of u₀|")
    ax.set_title("(c) what the data can see (Picard plot)", fontsize=9)
    ax.legend(fontsize=7, loc="upper right")

    ax = axes[1, 0]
    positive = alphas > 0
    ax.semilogx(alphas[positive], misfit[positive], "o-", ms=3, color="C0")
    ax.axhline(DISCREPANCY, color="C0", lw=0.8, ls="--")
    ax.axvline(alphas[chosen], color="0.4", lw=0.8, ls=":")
    ax.set_ylim(0.9, max(1.5, 1.05 * float(np.max(misfit[positive][:-1], initial=1.0))))
    ax.set_xlabel("regularization weight α")
    ax.set_ylabel("misfit χ²/m", color="C0")
    ax.set_title("(d) discrepancy principle: largest α with χ²/m ≤ 1", fontsize=9)
    twin = ax.twinx()
    twin.loglog(alphas[positive], errors[positive], "s-", ms=3, color="C1")
    twin.set_ylabel("relative error of u₀", color="C1")
    twin.grid(False)
    twin.spines["right"].set_visible(True)

    steps = np.arange(iterations + 1)
    ax = axes[1, 1]
    for index, label, style in [
        (chosen, regularized, dict(color="C0")),
        (unregularized, "α = 0", bad),
    ]:
        gap = history[index] - history[index, -1]
        ax.semilogy(steps[gap > 0], gap[gap > 0], label=label, **style)
    ax.set_xlabel("L-BFGS iteration")
    ax.set_ylabel(f"loss J(k) − J({iterations})")
    ax.set_title(f"(e) loss above its last value (J(0) = {history[chosen, 0]:.0f})", fontsize=9)
    ax.legend(fontsize=7)

    ax = axes[1, 2]
    ax.semilogy(steps, result["error_history"][chosen], color="C0", label=regularized)
    ax.semilogy(steps, result["error_history"][unregularized], label="α = 0", **bad)
    ax.set_xlabel("L-BFGS iteration")
    ax.set_ylabel("relative error of u₀")
    ax.set_title("(f) error: α = 0 fits the noise as it converges", fontsize=9)
    ax.legend(fontsize=7)
    fig.suptitle(
        f"Heat equation, κ = {DIFFUSIVITY:g} m²/s, {POINTS} unknowns: u₀ from noisy "
        f"snapshots at t = {', '.join(f'{t:g}' for t in OBSERVATION_TIMES)} s",
        fontsize=10,
    )
    # fixed margins (tight_layout would draw the figure once more: ~1 s)
    fig.subplots_adjust(left=0.06, right=0.985, bottom=0.075, top=0.9, wspace=0.5, hspace=0.36)
    files = ds.plot.save(fig, out, "heat_inverse")
    plt.close("all")
    print(f"figure: {time.perf_counter() - start:.1f} s")

    profiles = xr.Dataset(
        {
            "true_initial": ("x", truth, {"long_name": "true initial profile"}),
            "recovered_initial": (
                ("alpha", "x"),
                recovered,
                {"long_name": "recovered initial profile per α"},
            ),
            "observations": (("time", "x"), data, {"long_name": "noisy observations"}),
            "noise_free": (("time", "x"), clean, {"long_name": "exact solution at the times"}),
            "predicted": (
                ("alpha", "time", "x"),
                prediction,
                {"long_name": "model at the observation times from the recovered u0"},
            ),
            "misfit": ("alpha", misfit, {"long_name": "chi^2 / m"}),
            "relative_error": ("alpha", errors, {"long_name": "relative L2 error of u0"}),
            "loss": (("alpha", "iteration"), history, {"long_name": "loss per iteration"}),
            "error_history": (
                ("alpha", "iteration"),
                result["error_history"],
                {"long_name": "relative L2 error of u0 per iteration"},
            ),
        },
        coords={
            "x": ("x", x, {"units": "m"}),
            "alpha": alphas,
            "time": ("time", np.asarray(OBSERVATION_TIMES), {"units": "s"}),
            "iteration": np.arange(iterations + 1),
        },
        attrs={
            "diffusivity": DIFFUSIVITY,
            "length": LENGTH,
            "dt": DT,
            "noise": NOISE,
            "seed": SEED,
            "chosen_alpha": float(alphas[chosen]),
        },
    )
    files.append(_output.dataset(out, "heat_inverse", profiles))

    config = {
        "length": LENGTH,
        "diffusivity": DIFFUSIVITY,
        "points": POINTS,
        "dt": DT,
        "solver": "RK4",
        "observation_times": list(OBSERVATION_TIMES),
        "noise": NOISE,
        "seed": SEED,
        "modes": MODES,
        "alphas": alphas.tolist(),
        "iterations": iterations,
        "lbfgs_memory": MEMORY,
        "discrepancy": DISCREPANCY,
        "fd_step": FD_STEP,
    }
    record = {
        "config": config,
        "chosen_alpha": float(alphas[chosen]),
        "relative_error": float(errors[chosen]),
        "misfit": float(misfit[chosen]),
        "best_alpha": float(alphas[best]),
        "best_relative_error": float(errors[best]),
        "unregularized_relative_error": float(errors[unregularized]),
        "initial_guess_relative_error": 1.0,
        "truth_misfit": truth_misfit,
        "gradient_norm_at_chosen": float(np.linalg.norm(gradient[chosen])),
        "gradient_check": {
            "alpha": float(alphas[chosen]),
            "jax_grad": float(check_grad[chosen]),
            "central_difference": float(check_fd[chosen]),
            "relative_error": float(check_relative[chosen]),
            "largest_relative_error_over_alphas": float(check_relative.max()),
        },
    }
    files.append(_output.summary(out, "heat_inverse", record))
    return {"files": files, **record}


if __name__ == "__main__":
    _output.main(__file__, __doc__)
