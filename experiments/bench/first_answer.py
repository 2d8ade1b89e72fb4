"""Time to the first answer: the canonical call of a script, each in a fresh Python process.

A scientist's script runs once: from `python script.py` to the printed answer it pays the
interpreter, the imports, tracing, compilation and the run. Each row here is such a script, run
as a subprocess and timed from its start to its exit (median of the repeats), for

- diffsim with a cold persistent compilation cache (a new empty folder: a first run),
- diffsim with a warm cache (the same folder again: every later run of the script),
- the peer in a fresh process: scipy (`least_squares(method="lm")` over `solve_ivp(DOP853)`,
  `solve_ivp(DOP853)` for a single solve), and the same fit written by hand with diffrax and
  optimistix (no cache, as those libraries run by default).

Calls: the lynx–hare fit of `experiments/fit_lynx_hare.py` (Tsit5 rtol 1e-8, log residuals,
4 rates + 2 initial states, from the guess of that script); one Lorenz solve (Tsit5, 101
output times over 10 time units); twenty lynx–hare fits from different guesses in one script;
and `import diffsim` against `import jax` alone.

Run: `python experiments/bench/first_answer.py [--quick]`
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from _timing import machine_line, record, table, targets_table

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "experiments" / "data" / "lynx_hare.csv"

_PRELUDE = f"""
import sys, time
sys.path.insert(0, {str(ROOT)!r})
import numpy as np
values = np.loadtxt({str(DATA)!r}, delimiter=",", skiprows=1)
years, pelts = values[:, 0], values[:, 1:3]
"""

DIFFSIM_FIT = """
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import diffsim as ds
import models
def fit(alpha, beta, gamma, delta, u0, v0):
    guess = models.LotkaVolterra(alpha=alpha, beta=beta, gamma=gamma, delta=delta)
    return ds.fit(guess, jnp.array([u0, v0]), (years, pelts), params=["alpha", "beta", "gamma",
        "delta"], initial_state=True, loss="log", solver=ds.Tsit5(rtol=1e-8, atol=1e-8),
        bounds={"y0[prey]": (0.0, None), "y0[predator]": (0.0, None)})
def alpha_of(result):
    return result.params["alpha"]
"""

SCIPY_FIT = """
from scipy.integrate import solve_ivp
from scipy.optimize import least_squares
def field(t, y, a, b, c, d):
    u, v = y
    return [(a - b * v) * u, (-c + d * u) * v]
def residuals(q):
    p = np.exp(q)
    sol = solve_ivp(field, (years[0], years[-1]), p[4:], method="DOP853", t_eval=years,
                    args=tuple(p[:4]), rtol=1e-8, atol=1e-8)
    if not sol.success or sol.y.shape[1] != len(years):
        return np.full(2 * len(years), 1e3)
    return (np.log(np.maximum(sol.y.T, 1e-300)) - np.log(pelts)).ravel()
def fit(alpha, beta, gamma, delta, u0, v0):
    start = np.log([alpha, beta, gamma, delta, u0, v0])
    return np.exp(least_squares(residuals, start, method="lm").x)
def alpha_of(result):
    return result[0]
"""

HAND_FIT = """
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import diffrax, optimistix as optx
ts, target = jnp.asarray(years), jnp.log(jnp.asarray(pelts))
def residuals(q, _):
    p = jnp.exp(q)
    def field(t, y, args):
        u, v = y
        return jnp.stack([(p[0] - p[1] * v) * u, (-p[2] + p[3] * u) * v])
    sol = diffrax.diffeqsolve(diffrax.ODETerm(field), diffrax.Tsit5(), ts[0], ts[-1], None,
        p[4:], saveat=diffrax.SaveAt(ts=ts), adjoint=diffrax.ForwardMode(),
        stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-8), max_steps=100_000)
    return (jnp.log(sol.ys) - target).ravel()
solve = jax.jit(lambda q0: optx.least_squares(residuals, optx.LevenbergMarquardt(rtol=1e-8,
    atol=1e-10), q0, options={"jac": "fwd"}, max_steps=256, throw=False).value)
def fit(alpha, beta, gamma, delta, u0, v0):
    return np.exp(np.asarray(solve(jnp.log(jnp.array([alpha, beta, gamma, delta, u0, v0])))))
def alpha_of(result):
    return result[0]
"""

GUESS = "print(alpha_of(fit(0.5, 0.025, 0.8, 0.025, 30.0, 4.0)))"
TWENTY = """
rng = np.random.default_rng(0)
for i in range(20):
    scale = np.exp(rng.uniform(-0.2, 0.2, 6))
    fit(*(np.array([0.5, 0.025, 0.8, 0.025, 30.0, 4.0]) * scale))
"""

DIFFSIM_SOLVE = """
import jax.numpy as jnp
import diffsim as ds
import models
ys = ds.simulate(models.Lorenz(), jnp.array([1.0, 0.0, 0.0]), jnp.linspace(0.0, 10.0, 101),
                 solver=ds.Tsit5()).ys
print(float(ys[10, 0]))  # x(1): before the chaos spreads the tolerances apart
"""

SCIPY_SOLVE = """
from scipy.integrate import solve_ivp
def lorenz(t, y):
    return [10.0 * (y[1] - y[0]), y[0] * (28.0 - y[2]) - y[1], y[0] * y[1] - 8.0 / 3.0 * y[2]]
sol = solve_ivp(lorenz, (0.0, 10.0), [1.0, 0.0, 0.0], method="DOP853", t_eval=np.linspace(0.0,
                10.0, 101), rtol=1e-3, atol=1e-6)
print(sol.y[0, 10])
"""


def _wall(code: str, env: dict, answers: list) -> float:
    start = time.perf_counter()
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if run.returncode != 0:
        raise RuntimeError(run.stderr[-2000:])
    lines = run.stdout.strip().splitlines()
    answers.append(float(lines[-1]) if lines else None)
    return seconds


def _cases():
    return {
        "lynx–hare fit": {
            "diffsim": _PRELUDE + DIFFSIM_FIT + GUESS,
            "scipy": _PRELUDE + SCIPY_FIT + GUESS,
            "diffrax + optimistix by hand": _PRELUDE + HAND_FIT + GUESS,
        },
        "twenty lynx–hare fits": {
            "diffsim": _PRELUDE + DIFFSIM_FIT + TWENTY,
            "scipy": _PRELUDE + SCIPY_FIT + TWENTY,
        },
        "one Lorenz solve": {
            "diffsim": _PRELUDE + DIFFSIM_SOLVE,
            "scipy": _PRELUDE + SCIPY_SOLVE,
        },
        "import": {
            "diffsim": "import diffsim",
            "jax alone": "import jax",
        },
    }


def measure(repeats: int, quick: bool = False) -> tuple[dict, dict]:
    """{case: {method: median seconds}}; diffsim's rows cold and warm. `quick`: the fit against
    scipy and the imports only (the smoke run of CI). Also returns each call's answers (the
    fitted alpha, the Lorenz x(10)) per method, to check that all reach the same one."""
    base = dict(os.environ)
    base.pop("JAX_COMPILATION_CACHE_DIR", None)
    out, answers = {}, {}
    for case, methods in _cases().items():
        if quick and case not in ("lynx–hare fit", "import"):
            continue
        out[case], answers[case] = {}, {}
        for method, code in methods.items():
            got = answers[case].setdefault(method, [])
            if quick and method == "diffrax + optimistix by hand":
                continue
            if method != "diffsim":
                env = dict(base, DIFFSIM_CACHE="off")
                runs = [_wall(code, env, got) for _ in range(repeats)]
                out[case][method] = statistics.median(runs)
                continue
            cold, warm = [], []
            for _ in range(repeats):
                with tempfile.TemporaryDirectory() as folder:
                    env = dict(base, DIFFSIM_CACHE_DIR=folder)
                    env.pop("DIFFSIM_CACHE", None)
                    cold.append(_wall(code, env, got))
                    warm.append(_wall(code, env, got))
            out[case]["diffsim, cold cache"] = statistics.median(cold)
            out[case]["diffsim, warm cache"] = statistics.median(warm)
    return out, answers


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repeat, the fit and import only")
    args = parser.parse_args(argv)
    repeats = 1 if args.quick else 3
    print("# Time to the first answer (fresh processes, wall seconds from start to exit)")
    print(machine_line())
    print(f"Median of {repeats} run(s) of each script.\n")
    times, answers = measure(repeats, args.quick)
    for case in ("lynx–hare fit", "one Lorenz solve"):
        if case not in answers:
            continue
        values = [v for got in answers[case].values() for v in got]
        reference = answers[case]["scipy"][0]
        # the fit's optimum to the optimisers' tolerance; the Lorenz x(1) to
        # the solvers' tolerance, loosely
        tolerance = 1e-4 if case == "lynx–hare fit" else 1e-2
        if not all(abs(v - reference) <= tolerance * max(1.0, abs(reference)) for v in values):
            raise SystemExit(f"{case}: the methods disagree: {answers[case]}")
    rows = []
    for case, methods in times.items():
        peer = methods.get("scipy", methods.get("jax alone"))
        for method, seconds in methods.items():
            record("time to first answer", f"{case}: {method}", run_s=seconds)
            rows.append([case, method, f"{seconds:.2f}", f"{seconds / peer:.2f}"])
    print(table(rows, ["call", "method", "seconds", "vs scipy (import: vs jax)"]))
    print()
    fit = times["lynx–hare fit"]
    imports = times["import"]
    checks = [
        (
            "lynx–hare fit, cold cache <= 3x scipy (fresh processes)",
            fit["diffsim, cold cache"] / fit["scipy"],
            fit["diffsim, cold cache"] <= 3 * fit["scipy"],
        ),
        (
            "lynx–hare fit, warm cache <= 1.5x scipy (fresh processes)",
            fit["diffsim, warm cache"] / fit["scipy"],
            fit["diffsim, warm cache"] <= 1.5 * fit["scipy"],
        ),
        (
            "import diffsim - import jax <= 0.3 s (seconds)",
            imports["diffsim, warm cache"] - imports["jax alone"],
            imports["diffsim, warm cache"] - imports["jax alone"] <= 0.3,
        ),
    ]
    if "twenty lynx–hare fits" in times:
        twenty = times["twenty lynx–hare fits"]
        checks.append(
            (
                "twenty fits in one script, cold cache <= 0.2x scipy",
                twenty["diffsim, cold cache"] / twenty["scipy"],
                twenty["diffsim, cold cache"] <= 0.2 * twenty["scipy"],
            )
        )
    print(targets_table(checks))


if __name__ == "__main__":
    main()
