"""Studies of many experiments: `ds.fit(problem)` on published problems of the PEtab benchmark
collection, against scipy over `solve_ivp`.

The studies (experiments/bench/_studies.py, written by hand from experiments/data/petab/):
  Boehm    STAT5 dimerisation, 1 experiment, 48 measurements, 9 unknowns (3 noise levels);
  Fujita   EGFR–Akt–S6 signalling, 6 EGF doses, 144 measurements, 19 unknowns (3 scalings);
  Bruno    carotenoid cleavage, 6 conditions, 77 measurements, 13 unknowns.
For each: the log-likelihood at the published parameters against AMICI's; then the same
seeded starts (NumPy `default_rng(0)`, every unknown uniform on its scale within its bounds,
as the collection's benchmarks draw them) for every method:
  diffsim   one `ds.fit(problem, starts=S)` call (Rodas5P at rtol 1e-8, atol 1e-10;
            Levenberg–Marquardt within the bounds, noise levels set in closed form): the
            starts run one after another in one compiled program;
  scipy     `scipy.optimize.least_squares(method="trf")` within the same bounds on the same
            scales (2-point finite differences), over `solve_ivp(method="LSODA", rtol=1e-8,
            atol=1e-10)` of the model's vector field (the same JAX function, jitted: a scipy
            user's right-hand side), on the residuals whose squares sum to twice the negative
            log-likelihood (the noise levels' log terms as Data2Dynamics writes them).
Reported: how many starts reach the best known log-likelihood (within 0.1), the median time per
start and the time per start that reached it (compile time apart), and the compile time.
Also: a fit of one experiment against eight of the same kind (a decay at eight doses): the
compiled programs and the run time.

Run: `python experiments/bench/studies.py [--starts N] [--studies Boehm,Fujita] [--quick]`
(quick: the log-likelihoods, 2 Boehm starts per method, the 1-versus-8 comparison).
"""

import argparse
import os
import sys
import time
import warnings

import jax

jax.config.update("jax_enable_x64", True)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import _studies
import jax.numpy as jnp
import numpy as np
from _timing import machine_line, record, table, targets_table

import diffsim as ds
from diffsim._fit.study_objective import natural_on_host, to_natural_values

REACHED = 0.1


def starts_for(problem, count: int, seed: int = 0) -> np.ndarray:
    """(count, unknowns) natural values, uniform on each unknown's scale within its bounds."""
    tables = problem.tables
    rng = np.random.default_rng(seed)
    scaled = tables.lower + (tables.upper - tables.lower) * rng.uniform(
        size=(count, len(problem.names))
    )
    return natural_on_host(scaled, tables.scales)


def run_diffsim(problem, starts) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = ds.fit(problem, starts=starts)
    return dict(
        llh=np.asarray(result.starts["llh"]),
        compile=result.timings["compile"],
        run=result.timings["run"],
    )


def _scipy_objective(problem):
    """(residuals of scaled θ as NumPy, the llh of scaled θ) by solve_ivp per experiment."""
    from scipy.integrate import solve_ivp

    tables = problem.tables
    fields = jax.jit(lambda model, t, y: model.vector_field(t, y))
    jac = jax.jit(lambda model, t, y: jax.jacfwd(model.vector_field, 1)(t, y))
    settle = jax.jit(lambda theta, states: residuals_given_states(problem, theta, states))
    llh_given = jax.jit(lambda theta, states: -nll_given_states(problem, theta, states))

    def states_of(scaled):
        theta = np.asarray(to_natural_values(jnp.asarray(scaled), tables.scales))
        out = np.full((len(tables.row_time), _size(problem)), np.nan)
        from diffsim._fit.study_objective import parameters_dict, simulation_model

        for group in tables.groups:
            settings = np.asarray(group.settings.values(jnp.asarray(theta)))
            for m, e in enumerate(group.members):
                model = simulation_model(problem, jnp.asarray(settings[m]))
                p = parameters_dict(problem, jnp.asarray(settings[m]))
                y0 = np.asarray(group.y0_fn(p) if group.y0_fn is not None else group.y0[m])
                grid = group.ts[m]
                rows = group.rows[group.row_member == m]
                used = np.unique(group.row_time[group.row_member == m])
                try:
                    sol = solve_ivp(
                        lambda t, y: np.asarray(fields(model, t, jnp.asarray(y))),
                        (grid[0], grid[used].max()),
                        y0,
                        method="LSODA",
                        t_eval=grid[: used.max() + 1],
                        rtol=1e-8,
                        atol=1e-10,
                        jac=lambda t, y: np.asarray(jac(model, t, jnp.asarray(y))),
                    )
                    if sol.success:
                        at = group.row_time[group.row_member == m]
                        out[rows] = sol.y.T[at]
                except (ValueError, np.linalg.LinAlgError):
                    pass
        return theta, out

    def fun(scaled):
        theta, states = states_of(scaled)
        r = np.asarray(settle(jnp.asarray(theta), jnp.asarray(states)))
        return np.where(np.isfinite(r), r, 1e6)

    def llh(scaled):
        theta, states = states_of(scaled)
        return float(llh_given(jnp.asarray(theta), jnp.asarray(states)))

    return fun, llh


def _size(problem) -> int:
    group = problem.tables.groups[0]
    if group.y0 is not None:
        return group.y0.shape[1]
    from diffsim._fit.study_objective import parameters_dict

    values = group.settings.values(jnp.zeros(len(problem.names)))[0]
    return int(np.size(group.y0_fn(parameters_dict(problem, values))))


def residuals_given_states(problem, theta, states):
    from diffsim._fit import study_objective as so

    dtype = theta.dtype
    predictions, sigmas = so.observe(problem, theta, states, dtype)
    scaled, sigma, nll, jacobian = so._noise_terms(problem, predictions, sigmas, dtype)
    root = jnp.sqrt(jnp.maximum(jnp.log(2 * jnp.pi * sigma**2) + so.RESIDUAL_OFFSET, 0.0))
    return jnp.concatenate([jnp.where(jnp.isfinite(nll), scaled, jnp.nan), root])


def nll_given_states(problem, theta, states):
    from diffsim._fit import study_objective as so

    predictions, sigmas = so.observe(problem, theta, states, theta.dtype)
    return jnp.sum(so._noise_terms(problem, predictions, sigmas, theta.dtype)[2])


def run_scipy(problem, starts, max_nfev: int) -> dict:
    from scipy.optimize import least_squares

    tables = problem.tables
    fun, llh = _scipy_objective(problem)
    scaled_starts = _scaled(problem, starts)
    values, times = [], []
    for s0 in scaled_starts:
        clock = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = least_squares(
                fun, s0, bounds=(tables.lower, tables.upper), method="trf", max_nfev=max_nfev
            )
        times.append(time.perf_counter() - clock)
        values.append(llh(result.x))
    return dict(llh=np.asarray(values), run=float(np.sum(times)), compile=0.0)


def _scaled(problem, starts):
    from diffsim._fit.study_objective import scaled_on_host

    return scaled_on_host(starts, problem.tables.scales)


_COMPILES = [0]
jax.monitoring.register_event_duration_secs_listener(
    lambda name, _, **__: _COMPILES.__setitem__(
        0, _COMPILES[0] + (name == "/jax/core/compile/backend_compile_duration")
    )
)


def decay_study(doses, ts=np.linspace(0.5, 4.0, 8)) -> ds.Problem:
    """A decay y' = −k y measured at `ts` after each dose: experiments of one kind."""
    decay = ds.ODE(lambda t, y, p: -p["k"] * y, {"k": 0.5})
    experiments = [
        ds.Experiment(
            {"time": ts, "observable": ["y"] * ts.size, "value": d * np.exp(-0.7 * ts)},
            y0=_dose_start,
            set={"dose": float(d)},
            name=f"dose {d}",
        )
        for d in doses
    ]
    return ds.Problem(
        decay,
        experiments,
        {"y": ds.Observable(lambda t, y, p: y[0], sigma=0.01)},
        {
            "k": ds.Unknown(0.3, bounds=(1e-3, 10), scale="log10"),
            "dose": ds.Unknown(1.0, estimate=False),
        },
    )


def _dose_start(p):
    return jnp.stack([p["dose"]])


def one_against_eight() -> dict:
    """A decay at 1 and at 8 doses (one kind of experiment): programs and run."""
    study = decay_study
    out = {}
    for label, doses in (("1 experiment", [1.0]), ("8 experiments", np.arange(1.0, 9.0))):
        problem = study(doses)
        before = _COMPILES[0]
        result = ds.fit(problem, screen=0)
        programs = _COMPILES[0] - before
        # a fit runs in about a millisecond here: the median of many, so that one slow call
        # (another process, a page fault) does not decide the ratio
        run = []
        for _ in range(15):
            run.append(ds.fit(problem, screen=0, progress=False).timings["run"])
        out[label] = dict(programs=programs, run=float(np.median(run)), k=result.params["k"])
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=20)
    parser.add_argument("--studies", default="Boehm,Fujita,Bruno")
    parser.add_argument("--scipy-starts", type=int, default=None, help="default: --starts")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    print(machine_line())
    names = ["Boehm"] if args.quick else [n for n in args.studies.split(",") if n]
    count = 2 if args.quick else args.starts
    scipy_count = 1 if args.quick else (args.scipy_starts or args.starts)
    rows, checks = [], []
    for name, make in _studies.STUDIES.items():
        clock = time.perf_counter()
        llh = make().llh()
        reference = _studies.REFERENCE_LLH[name]
        gap = abs(llh - reference)
        seconds = time.perf_counter() - clock
        print(
            f"{name}: llh {llh:.6f} at the published parameters (AMICI {reference:.6f}, "
            f"|Δ| {gap:.1e}), {seconds:.1f} s"
        )
        checks.append((f"{name} llh within 1e-3 of AMICI's (|Δ|)", gap, gap <= 1e-3))
    for name in names:
        problem = _studies.STUDIES[name]()
        starts = starts_for(problem, count)
        best = _studies.BEST_LLH[name]
        for method in ("diffsim", "scipy"):
            if method == "diffsim":
                out = run_diffsim(problem, starts)
            else:
                budget = 30 if args.quick else 2000
                out = run_scipy(problem, starts[:scipy_count], max_nfev=budget)
            n = out["llh"].size
            reached = int(np.sum(out["llh"] >= best - REACHED))
            per_start = out["run"] / n
            per_reached = out["run"] / reached if reached else float("inf")
            top = float(np.max(out["llh"]))
            rows.append(
                [name, method, f"{reached}/{n}", f"{per_start:.2f}", f"{per_reached:.2f}"]
                + [f"{out['compile']:.1f}", f"{top:.3f}"]
            )
            record(
                f"studies ({name})",
                method,
                starts=n,
                reached=reached,
                run_s=out["run"],
                compile_s=out["compile"],
                best_llh=top,
            )
            if method != "diffsim" or args.quick:
                continue
            if name == "Boehm":
                checks.append(
                    ("Boehm: starts reaching -138.222 (>= 8 of 20)", reached, reached >= 8)
                )
                checks.append(("Boehm: s per start (<= 2)", per_start, per_start <= 2))
            else:
                share = reached / n
                checks.append((f"{name}: s per start (<= 20)", per_start, per_start <= 20))
                checks.append(
                    (f"{name}: share of starts reaching the best (>= 0.25)", share, share >= 0.25)
                )
    header = ["study", "method", "reached", "s/start", "s/reached", "compile s", "best llh"]
    print(table(rows, header))
    batch = one_against_eight()
    lines = [[k, v["programs"], f"{v['run']:.3f}", f"{v['k']:.6f}"] for k, v in batch.items()]
    print(table(lines, ["fit", "programs compiled", "run s", "k"]))
    one, eight = batch["1 experiment"], batch["8 experiments"]
    ratio = eight["run"] / one["run"]
    programs_ok = eight["programs"] <= one["programs"]
    checks.append(("8 experiments of one kind: programs", eight["programs"], programs_ok))
    checks.append(("8 experiments of one kind: run time / one's (<= 3)", ratio, ratio <= 3))
    print(targets_table(checks))


if __name__ == "__main__":
    main()
