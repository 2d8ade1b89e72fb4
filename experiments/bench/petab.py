"""PEtab problems read from their files (`ds.petab.load`): load time, the log-likelihood and its
gradient at the nominal parameters against AMICI's, and multi-start fits against scipy.

The problems: the eight of experiments/data/petab/ (the PEtab benchmark collection, unchanged).
For each:
  load      `ds.petab.load(yaml)`: the SBML model read and turned into JAX functions, the
            tables into a `ds.Problem` (no compilation);
  llh       the first `problem.llh()` (compiling its program) and |Δ| against AMICI's value
            (Crauste: scipy's at rtol 1e-12, experiments/data/README.md);
  gradient  one `jax.value_and_grad` of the llh with respect to the estimated parameters on
            their scales (Rodas5P at rtol 1e-8, atol 1e-10; median of 5 after compiling),
            against AMICI's `t_fwd` budget for one forward-sensitivity gradient on its CI
            machine (AMICI-dev/AMICI tests/benchmark_models/benchmark_models.yaml, in
            ../shared/data/petab/README.md);
  starts    S starts, every estimated parameter uniform on its scale within its bounds
            (NumPy `default_rng(0)`, as `diffsim fit problem.yaml` draws them and the
            collection's benchmarks do): how many reach the best known llh (within 0.1), the
            median time per start and the time per start that reached it (compile apart).
            The peer, from the first P of the same starts: pyPESTO + AMICI (the field's
            reference: AMICI compiles the SBML model to C++ with forward sensitivities;
            pyPESTO optimises with fides, its trust region on AMICI's Fisher information, and
            with its default, scipy's L-BFGS-B) where `amici`, `pypesto`, `fides` and
            `petab` import (`pip install swig amici "pypesto[petab]" fides`: pyPESTO's PEtab
            import needs the `petab` library, which plain `pypesto` does not install; AMICI
            builds from source with the system's C++ compiler, ~3 minutes; not a dependency
            of the bench extra); else scipy's `least_squares(trf)` over `solve_ivp(LSODA)`
            on the same residuals and scales (experiments/bench/studies.py), each start
            capped in time.

Run: `python experiments/bench/petab.py [--starts S] [--peer-starts P] [--problems A,B]
[--peer scipy|pypesto] [--quick]` (quick, for CI: Boehm alone, 2 starts, 1 peer start).
"""

import argparse
import logging
import math
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from _timing import machine_line, record, table, targets_table

import diffsim as ds
from diffsim._fit.study_objective import negative_log_likelihood, scaled_on_host, to_natural_values

DATA = Path(__file__).resolve().parents[1] / "data" / "petab"
REACHED = 0.1
# AMICI's llh at the nominal parameters and its t_fwd budget (s) for one gradient
AMICI = {
    "Boehm_JProteomeRes2014": (-138.22199693517703, 0.05),
    "Bruno_JExpBot2016": (46.688176988431806, 0.05),
    "Crauste_CellSystems2017": (-190.9639776, 0.05),  # scipy at rtol 1e-12 (see the README)
    "Elowitz_Nature2000": (63.20279991419332, 0.11),
    "Fiedler_BMCSystBiol2016": (58.58390161681, 0.05),
    "Fujita_SciSignal2010": (53.08377736998929, 0.5),
    "Weber_BMC2015": (-296.2017922646865, 0.1),
    "Zheng_PNAS2012": (278.33353271001477, 0.05),
}


@eqx.filter_jit
def _llh_and_gradient(problem, scaled):
    def llh(scaled):
        nll, _ = negative_log_likelihood(problem, to_natural_values(scaled, problem.tables.scales))
        return -nll

    return jax.value_and_grad(llh)(scaled)


def gradient_timing(problem) -> dict:
    scaled = jnp.asarray(scaled_on_host(problem.theta(), problem.tables.scales))
    clock = time.perf_counter()
    compiled = _llh_and_gradient.lower(problem, scaled).compile()
    compile_s = time.perf_counter() - clock
    value, gradient = jax.block_until_ready(compiled(problem, scaled))
    times = []
    for _ in range(5):
        clock = time.perf_counter()
        jax.block_until_ready(compiled(problem, scaled))
        times.append(time.perf_counter() - clock)
    return dict(
        compile=compile_s,
        run=statistics.median(times),
        llh=float(value),
        finite=bool(np.all(np.isfinite(np.asarray(gradient)))),
    )


def _finite(llh) -> np.ndarray:
    """Log-likelihoods with a failed start's NaN as −inf (it reached nothing)."""
    llh = np.asarray(llh, dtype=float)
    return np.where(np.isfinite(llh), llh, -np.inf)


def run_diffsim(problem, starts) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = ds.fit(problem, starts=starts, progress=False)
    return dict(
        llh=_finite(result.starts["llh"]),
        compile=result.timings["compile"],
        run=result.timings["run"],
    )


class _OutOfTime(Exception):
    pass


def run_peer(problem, starts, quick: bool, seconds: float) -> dict:
    """scipy's `least_squares(trf)` over `solve_ivp(LSODA)` (the studies benchmark's objective)
    from each start, each given at most `seconds` (then its best point so far counts): with
    finite differences over LSODA a start of a 20-parameter problem can take an hour."""
    import studies
    from scipy.optimize import least_squares

    tables = problem.tables
    fun, llh = studies._scipy_objective(problem)
    values, times = [], []
    for s0 in scaled_on_host(starts, tables.scales):
        best = {"loss": np.inf, "x": s0}
        clock = time.perf_counter()

        def timed(x, clock=clock, best=best):
            if time.perf_counter() - clock > seconds:
                raise _OutOfTime
            r = fun(x)
            loss = float(np.sum(r**2))
            if loss < best["loss"]:
                best.update(loss=loss, x=np.array(x))
            return r

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                result = least_squares(
                    timed,
                    s0,
                    bounds=(tables.lower, tables.upper),
                    method="trf",
                    max_nfev=30 if quick else 2000,
                )
                x = result.x
            except _OutOfTime:
                x = best["x"]
        times.append(time.perf_counter() - clock)
        values.append(llh(x))
    return dict(llh=_finite(values), run=float(np.sum(times)), compile=0.0)


def pypesto_importable() -> bool:
    """Whether pyPESTO, AMICI and fides import (AMICI also needs `swig` to compile a model).
    This file's folder leaves the module search path meanwhile: its name would shadow the
    `petab` library that pyPESTO imports."""
    here = os.path.dirname(os.path.abspath(__file__))
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        import amici  # noqa: F401
        import fides  # noqa: F401
        import petab.v1  # noqa: F401
        import pypesto.petab  # noqa: F401
    except ImportError:
        return False
    finally:
        sys.path[:] = saved
    return True


def run_pypesto(path: Path, problem, starts) -> dict:
    """pyPESTO + AMICI from the same starts on the same scales: {optimiser: outcome}, fides
    (pyPESTO's recommendation with AMICI: a trust region on the Fisher information) and its
    default (scipy's L-BFGS-B), one start after another on one core as diffsim's. The model
    is compiled afresh (its compile time reported); AMICI's objective is −llh."""
    import tempfile

    import petab.v1 as petab_v1
    import pypesto.optimize as optimize
    import pypesto.petab

    # AMICI logs every failed trial simulation (routine at extreme starts) and its mappings
    for name in ("amici", "pypesto"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    # the swig that pip installs lives beside this interpreter, which AMICI's build looks for
    # on PATH
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
    clock = time.perf_counter()
    peer_petab = petab_v1.Problem.from_yaml(str(path))
    # AMICI refuses observable or noise parameters that change from one time point to the
    # next (Fiedler's); PEtab's own flattening gives each its own observable, the same llh
    if petab_v1.lint.measurement_table_has_timepoint_specific_mappings(peer_petab.measurement_df):
        petab_v1.flatten_timepoint_specific_output_overrides(peer_petab)
    with tempfile.TemporaryDirectory(prefix="amici-") as folder:
        importer = pypesto.petab.PetabImporter(
            peer_petab,
            output_folder=folder,
            model_name=path.stem.replace("-", "_"),
        )
        peer_problem = importer.create_problem(verbose=False)
        compile_s = time.perf_counter() - clock
        scaled = scaled_on_host(starts, problem.tables.scales)
        column = {name: i for i, name in enumerate(problem.names)}
        free = [peer_problem.x_names[i] for i in peer_problem.x_free_indices]
        unknown = sorted(set(free) - set(column))
        if unknown:
            raise ValueError(f"{path.name}: pyPESTO estimates {unknown}, which diffsim does not")
        # pyPESTO takes guesses of every parameter, the fixed ones at their values
        guesses = np.zeros((len(starts), peer_problem.dim_full))
        guesses[:, peer_problem.x_fixed_indices] = peer_problem.x_fixed_vals
        guesses[:, peer_problem.x_free_indices] = np.asarray(scaled)[
            :, [column[name] for name in free]
        ]
        outcomes = {}
        for label, optimizer in (
            ("fides", optimize.FidesOptimizer(verbose=0)),
            ("L-BFGS-B", optimize.ScipyOptimizer()),
        ):
            peer_problem.set_x_guesses(guesses)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = optimize.minimize(
                    peer_problem, optimizer=optimizer, n_starts=len(guesses), progress_bar=False
                )
            runs = result.optimize_result.list
            outcomes[f"pyPESTO + AMICI ({label})"] = dict(
                llh=_finite([-float(r.fval) for r in runs]),
                run=float(sum(r.time for r in runs)),
                compile=compile_s,
            )
    return outcomes


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=20, help="0: no fits")
    parser.add_argument(
        "--peer-starts", type=int, default=None, help="default: every start (pyPESTO), 3 (scipy)"
    )
    parser.add_argument("--peer-seconds", type=float, default=300.0, help="per peer start")
    parser.add_argument("--problems", default=",".join(sorted(AMICI)))
    parser.add_argument(
        "--peer",
        choices=("auto", "scipy", "pypesto"),
        default="auto",
        help="auto: pyPESTO + AMICI where they import, else scipy",
    )
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    print(machine_line())
    names = ["Boehm_JProteomeRes2014"] if args.quick else [n for n in args.problems.split(",") if n]
    unknown = sorted(set(names) - set(AMICI))
    if unknown:
        parser.error(f"unknown problems {unknown}; known: {sorted(AMICI)}")
    peer = args.peer
    if peer == "auto":
        peer = "pypesto" if pypesto_importable() else "scipy"
    elif peer == "pypesto" and not pypesto_importable():
        parser.error("--peer pypesto: amici, pypesto and fides do not import here")
    checks, loads, fits = [], [], []
    for name in names:
        (path,) = (DATA / name).glob("*.yaml")
        clock = time.perf_counter()
        problem = ds.petab.load(path)
        load_s = time.perf_counter() - clock
        clock = time.perf_counter()
        llh = problem.llh()
        first_llh_s = time.perf_counter() - clock
        reference, budget = AMICI[name]
        gap = abs(llh - reference)
        checks.append((f"{name}: llh within 1e-3 of the reference (|Δ|)", gap, gap <= 1e-3))
        row = [name, len(problem.names), f"{load_s:.2f}", f"{first_llh_s:.1f}", f"{gap:.1e}"]
        grad = gradient_timing(problem)
        loads.append(row + [f"{grad['compile']:.1f}", f"{grad['run']:.3f}", f"{budget:g}"])
        print("progress:", " | ".join(map(str, loads[-1])), file=sys.stderr, flush=True)
        record(
            f"petab ({name})",
            "diffsim",
            load_s=load_s,
            llh_s=first_llh_s,
            gap=gap,
            gradient_compile_s=grad["compile"],
            gradient_run_s=grad["run"],
        )
        checks.append(
            (
                f"{name}: gradient s / AMICI's t_fwd (<= 1)",
                grad["run"] / budget,
                grad["run"] <= budget,
            )
        )
        count = 2 if args.quick else args.starts
        if count == 0:  # --starts 0: load, llh and gradient only
            continue
        starts = problem.uniform_starts(count, seed=0)
        best = max(reference, llh)
        outcomes = {"diffsim": run_diffsim(problem, starts)}
        if args.quick:
            peer_count = 1
        elif args.peer_starts is None:
            peer_count = count if peer == "pypesto" else 3
        else:
            peer_count = args.peer_starts
        peer_starts = starts[:peer_count]
        if len(peer_starts) and peer == "pypesto":
            outcomes.update(run_pypesto(path, problem, peer_starts))
        elif len(peer_starts):  # --peer-starts 0: diffsim's starts only
            outcomes[peer] = run_peer(problem, peer_starts, args.quick, args.peer_seconds)
        best = max(best, *(float(np.max(o["llh"])) for o in outcomes.values()))
        shares = {}
        for method, out in outcomes.items():
            n = out["llh"].size
            reached = int(np.sum(out["llh"] >= best - REACHED))
            per_start = out["run"] / n
            per_reached = out["run"] / reached if reached else float("inf")
            shares[method] = (reached / n, per_reached)
            fits.append(
                [name, method, f"{reached}/{n}", f"{per_start:.2f}", f"{per_reached:.2f}"]
                + [f"{out['compile']:.1f}", f"{float(np.max(out['llh'])):.3f}"]
            )
            print("progress:", " | ".join(map(str, fits[-1])), file=sys.stderr, flush=True)
            record(
                f"petab starts ({name})",
                method,
                starts=n,
                reached=reached,
                run_s=out["run"],
                compile_s=out["compile"],
                best_llh=float(np.max(out["llh"])),
            )
        for method in shares if not args.quick else ():
            if method == "diffsim":
                continue
            ours, theirs = shares["diffsim"], shares[method]
            checks.append(
                (
                    f"{name}: share reaching the best, diffsim − {method}",
                    ours[0] - theirs[0],
                    ours[0] >= theirs[0],
                )
            )
            if math.isfinite(theirs[1]) or math.isfinite(ours[1]):
                checks.append(
                    (
                        f"{name}: s per start reaching the best, diffsim / {method}",
                        ours[1] / theirs[1],
                        ours[1] <= theirs[1],
                    )
                )
    header = ["problem", "unknowns", "load s", "first llh s", "|Δ llh|", "gradient compile s"]
    print(table(loads, header + ["gradient s", "AMICI t_fwd s"]))
    if fits:
        header = ["problem", "method", "reached", "s/start", "s/reached", "compile s", "best llh"]
        print(table(fits, header))
        print(
            "peer: pyPESTO + AMICI (the same starts; fides and L-BFGS-B)"
            if peer == "pypesto"
            else "peer: scipy (least_squares over solve_ivp(LSODA); pyPESTO + AMICI did not "
            "import here, see the module text)"
        )
    print(targets_table(checks))


if __name__ == "__main__":
    main()
