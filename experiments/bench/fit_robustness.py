"""Fit robustness: how often a least-squares ODE fit from a random start reaches the best optimum.

Seven problems, each a least-squares fit of an ODE model to data, float64:
  lynx–hare     the Hudson's Bay pelts 1900–1920 (`experiments/data/lynx_hare.csv`), Lotka–Volterra,
                4 rates and both initial populations, log residuals;
  pendulum      damped pendulum length and damping from 101 noisy angles over 10 s (seed 0);
  SIR           transmission, recovery and the initial infected count from 61 daily infected counts
                with Poisson noise (N = 1000, seed 1);
  Lorenz        sigma, rho, beta from 101 noisy (sd 0.5) states over one time unit (seed 2);
  FitzHugh–Nagumo  a, b, c of Ramsay et al. (2007)'s form from 51 noisy (sd 0.1) voltages over
                10 time units, the recovery variable unobserved (seed 3);
  Robertson     the three rate constants of the stiff reaction from 30 noisy (sd 0.005) values of
                (y1, 1e4 y2, y3) on a log time grid to t = 100 (seed 4);
  bouncing ball gravity and restitution (drag 0.08 1/s and rest speed 0.1 m/s known) from 151
                noisy (3 mm) heights at 60 frames/s over 2.5 s, the impacts an event with a
                reset that depends on the restitution (seed 5).
For each problem, the same 50 starts for every method (NumPy `default_rng(0)`): every unknown
drawn log-uniform within a factor of 10 of the best known optimum (all unknowns are positive).

Methods, from the same starts, on the same data and residuals, at the same solver tolerances
(Tsit5 / DOP853 at rtol = atol = 1e-8; the stiff problem Kvaerno5 / LSODA at rtol 1e-8,
atol 1e-10):
  diffsim default  `ds.fit(model, y0, data, ...)` once per start with its default settings (the
                   first call compiles, the others reuse the compiled program): the screen
                   of 64 points around the start, the 3 lowest fitted to the first half of the
                   record, the best carried to the whole record;
  diffsim unscreened  the same with `screen=0`: one optimisation from the start itself (the
                   growing horizon kept), to show what the screen adds;
  diffsim starts   one `ds.fit(..., starts=S)` call with the (50, k) array of all starts (given
                   starts are not screened; they run one after another in one program);
  scipy lm, trf    `scipy.optimize.least_squares(method="lm" / "trf")`, default tolerances and
                   2-point finite-difference Jacobians, over `scipy.integrate.solve_ivp` (DOP853;
                   LSODA for the stiff problem; for the ball a loop that restarts the solve at each
                   impact event), the unknowns optimised in log space (p = exp(u)), as a careful
                   scipy user would; a solve that fails, or runs past 120,000 right-hand-side
                   evaluations (10,000 DOP853 steps: solve_ivp has no step limit of its own, and
                   bad parameters can make a model stiff), returns a large constant residual;
  diffrax + optx   a hand-written `optx.least_squares` with `LevenbergMarquardt(rtol=1e-8,
                   atol=1e-10)`, 256 steps at most, over `diffrax.diffeqsolve` (Tsit5 or Kvaerno5,
                   `PIDController`, `ForwardMode`, diffrax's default max_steps of 4096 per solve),
                   log-parametrised, `jax.jit(jax.vmap(...))` over all starts in one program
                   (under vmap every LM step waits for the slowest start's solve, so a start that
                   wanders where the model is stiff slows the whole batch); not run for the ball
                   (resets at events would need a hand-written restart loop around diffrax), nor
                   in the quick run.

Scoring: the methods' own losses come from different integrators (and differ by ~1e-7 relative at
these tolerances), so every final estimate is re-scored with one reference: the same residuals
from `solve_ivp` at rtol = atol = 1e-12 (DOP853; Radau with rtol 1e-11, atol 1e-14 and the
analytic Jacobian for the stiff problem). The best known loss is the smallest of the re-scored
loss of `ds.fit` started at the best known optimum (lynx–hare: loss ≈ 2.01866 at alpha 0.540,
beta 0.0272, gamma 0.796, delta 0.0237, y0 (34.6, 5.84); the synthetic problems: the truth) and
every re-scored final loss; a start succeeds when its loss <= best (1 + 1e-6). Reported per
problem and method: successes, the median number of residual evaluations (simulations) per start
and the wall time of the whole batch of starts, compilation included (the persistent
compilation cache is off). Evaluations: diffsim counts simulations (the screen's included), not
its forward-mode Jacobians (each one solve carrying k tangents); diffrax + optx counts LM steps
(one simulation and one forward-mode Jacobian each); scipy's `nfev` leaves out the
finite-difference Jacobians (k more simulations each), whose total is given as "all solves".
A second table counts the starts that end within 1e-3 of the best loss: those counted there but
not in the first stopped near the optimum without reaching it.

Run: `python experiments/bench/fit_robustness.py [--starts N] [--problems NAME,...]
[--methods NAME,...] [--quick]`
(the quick run: pendulum and SIR, 4 starts, the diffsim methods and scipy lm only).
"""

import argparse
import dataclasses
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import diffrax
import jax.numpy as jnp
import numpy as np
import optimistix as optx
from jaxtyping import Array
from scipy.integrate import solve_ivp
from scipy.optimize import least_squares

sys.path.insert(0, os.path.dirname(__file__))
from _timing import machine_line, record, table, targets_table

import diffsim as ds
import models

DATA = Path(__file__).resolve().parents[1] / "data" / "lynx_hare.csv"
RTOL, ATOL = 1e-8, 1e-8  # every non-stiff solve of the fits
STIFF_RTOL, STIFF_ATOL = 1e-8, 1e-10  # the stiff problem's
SUCCESS = 1e-6  # relative excess over the best known loss that still counts as reaching it
NEAR = 1e-3  # a looser count: ended near the optimum
PENALTY = 1e6  # scipy's residuals where the model cannot be simulated
FACTOR = 10.0  # starts: log-uniform within this factor of the best known optimum
MAX_EVENTS = 24
RHS_BUDGET = 12 * 10_000  # per solve_ivp call: 10,000 DOP853 steps
METHODS = (
    "diffsim default",
    "diffsim unscreened",
    "diffsim starts",
    "scipy lm",
    "scipy trf",
    "diffrax + optx",
)
QUICK_METHODS = ("diffsim default", "diffsim starts", "scipy lm")
QUICK_PROBLEMS = ("pendulum", "SIR")


class FitzHughNagumo(ds.AbstractODE):
    """FitzHugh–Nagumo neuron in the form of Ramsay et al. (2007):

        V' = c (V − V³/3 + R),   R' = −(V − a + bR) / c.

    `a`, `b`, `c` (> 0); defaults a = b = 0.2, c = 3. State `[V, R]` (voltage, recovery)."""

    a: Array = ds.parameter(0.2, positive=True, ndim=0)
    b: Array = ds.parameter(0.2, positive=True, ndim=0)
    c: Array = ds.parameter(3.0, positive=True, ndim=0)

    state_names = ("V", "R")

    def vector_field(self, t, y, args=None):
        v, r = y[0], y[1]
        return jnp.stack([self.c * (v - v**3 / 3 + r), -(v - self.a + self.b * r) / self.c])


# --- the vector fields written out, for scipy (xp = numpy) and diffrax (xp = jax.numpy) ----------


def _lotka_volterra(t, y, p, xp):
    alpha, beta, gamma, delta = p[0], p[1], p[2], p[3]
    return xp.array([(alpha - beta * y[1]) * y[0], (-gamma + delta * y[0]) * y[1]])


def _pendulum(t, y, p, xp):
    length, damping = p[0], p[1]
    return xp.array([y[1], -(9.81 / length) * xp.sin(y[0]) - damping * y[1]])


SIR_POPULATION = 1000.0


def _sir(t, y, p, xp):
    infection = p[0] * y[0] * y[1] / SIR_POPULATION
    recovery = p[1] * y[1]
    return xp.array([-infection, infection - recovery, recovery])


def _lorenz(t, y, p, xp):
    sigma, rho, beta = p[0], p[1], p[2]
    return xp.array([sigma * (y[1] - y[0]), y[0] * (rho - y[2]) - y[1], y[0] * y[1] - beta * y[2]])


def _fitzhugh_nagumo(t, y, p, xp):
    a, b, c = p[0], p[1], p[2]
    return xp.array([c * (y[0] - y[0] ** 3 / 3 + y[1]), -(y[0] - a + b * y[1]) / c])


def _robertson(t, y, p, xp):
    forward, back, production = p[0] * y[0], p[2] * y[1] * y[2], p[1] * y[1] ** 2
    return xp.array([-forward + back, forward - production - back, production])


def _robertson_jacobian(t, y, p):
    k1, k2, k3 = p
    return np.array(
        [
            [-k1, k3 * y[2], k3 * y[1]],
            [k1, -2 * k2 * y[1] - k3 * y[2], -k3 * y[1]],
            [0.0, 2 * k2 * y[1], 0.0],
        ]
    )


BALL_REST_SPEED = 0.1  # m/s: slower rebounds end at rest (known, not fitted)
BALL_DRAG = 0.08  # 1/s (known, not fitted)


def _ball(t, y, p, xp):
    return xp.array([y[1], -p[0] - BALL_DRAG * y[1]])


# --- the problems ---------------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class Problem:
    """One least-squares fit: the model, what is fitted, the data and their residuals."""

    name: str
    model_cls: type
    params: tuple[str, ...]  # fitted fields, in the order of the unknowns
    y0: np.ndarray  # the whole initial state (its fitted components are overwritten)
    fitted_states: tuple[int, ...]  # fitted components of y0, in the order of the unknowns
    initial_state: object  # what ds.fit is given for them
    ts: np.ndarray
    values: np.ndarray  # (times, observables)
    components: tuple[int, ...]  # observed state components
    field: Callable  # (t, y, params, xp) -> dy/dt
    best: np.ndarray  # best known optimum (all unknowns), in the order of FitResult.names
    description: str
    factors: np.ndarray | None = None  # observed = state[components] * factors
    loss: str = "squared"
    stiff: bool = False
    fixed: dict = dataclasses.field(default_factory=dict)  # other fields of the model
    ball: bool = False  # impacts at x = 0 with v -> -e v (the bouncing ball)
    data: object = None  # what ds.fit is given (default: (ts, values))

    @property
    def k(self) -> int:
        return len(self.params) + len(self.fitted_states)

    def model(self, p):
        return self.model_cls(
            **self.fixed, **{n: float(v) for n, v in zip(self.params, p[: len(self.params)])}
        )

    def initial(self, p) -> np.ndarray:
        y0 = np.array(self.y0, dtype=float)
        y0[list(self.fitted_states)] = p[len(self.params) :]
        return y0

    def observe(self, y):
        if self.factors is None and len(self.components) == len(self.y0):
            return y
        if len(self.components) == 1:
            return y[self.components[0]]
        return y[np.asarray(self.components)] * self.factors

    def observed(self, states):
        """(times, state) -> (times, observables), NumPy or JAX."""
        out = states[:, list(self.components)]
        return out if self.factors is None else out * self.factors

    def residuals(self, predictions, xp):
        if self.loss == "log":
            return xp.log(predictions) - xp.log(self.values)
        return predictions - self.values

    def fit_options(self) -> dict:
        if self.stiff:
            solver = ds.Kvaerno5(rtol=STIFF_RTOL, atol=STIFF_ATOL)
        else:
            solver = ds.Tsit5(rtol=RTOL, atol=ATOL)
        options = dict(params=list(self.params), solver=solver, loss=self.loss)
        if self.initial_state:
            options["initial_state"] = self.initial_state
        if self.factors is not None or len(self.components) != len(self.y0):
            options["observe"] = self.observe
        if self.ball:
            options["events"] = _impacts
        return options

    def ds_data(self):
        return (self.ts, self.values[:, 0] if self.values.shape[1] == 1 else self.values)


def _impacts(ball):
    return ball.impacts(max_events=MAX_EVENTS)


def _synthetic(model, y0, ts, *, solver=None, events=None):
    solver = solver or ds.Tsit5(rtol=1e-12, atol=1e-12)
    return np.asarray(ds.simulate(model, jnp.asarray(y0), ts, solver=solver, events=events).ys)


def _lynx_hare_problem() -> Problem:
    data = ds.Data.from_csv(DATA, time="year", columns=["hare", "lynx"])
    return Problem(
        name="lynx–hare",
        model_cls=models.LotkaVolterra,
        params=("alpha", "beta", "gamma", "delta"),
        y0=np.array([34.6, 5.84]),
        fitted_states=(0, 1),
        initial_state=True,
        ts=np.asarray(data.ts, float),
        values=np.asarray(data.values, float),
        components=(0, 1),
        field=_lotka_volterra,
        best=np.array([0.540, 0.0272, 0.796, 0.0237, 34.6, 5.84]),
        description="Lotka–Volterra, 4 rates + 2 initial states, 21 × 2 pelts, log residuals",
        loss="log",
        data=data,
    )


def _pendulum_problem() -> Problem:
    ts = np.linspace(0.0, 10.0, 101)
    truth = np.array([1.3, 0.25])
    y0 = np.array([1.0, 0.0])
    clean = _synthetic(models.DampedPendulum(length=truth[0], damping=truth[1]), y0, ts)[:, 0]
    values = clean + 0.05 * np.random.default_rng(0).standard_normal(ts.size)
    return Problem(
        name="pendulum",
        model_cls=models.DampedPendulum,
        params=("length", "damping"),
        y0=y0,
        fitted_states=(),
        initial_state=False,
        ts=ts,
        values=values[:, None],
        components=(0,),
        field=_pendulum,
        best=truth,
        description="damped pendulum length, damping; 101 angles (sd 0.05)",
    )


def _sir_problem() -> Problem:
    ts = np.arange(61.0)
    truth = np.array([0.3, 0.1, 10.0])
    y0 = np.array([SIR_POPULATION - truth[2], truth[2], 0.0])
    sir = models.SIR(beta=truth[0], gamma=truth[1], population=SIR_POPULATION)
    infected = _synthetic(sir, y0, ts)[:, 1]
    values = np.random.default_rng(1).poisson(infected).astype(float)
    return Problem(
        name="SIR",
        model_cls=models.SIR,
        params=("beta", "gamma"),
        y0=y0,
        fitted_states=(1,),
        initial_state=["I"],
        ts=ts,
        values=values[:, None],
        components=(1,),
        field=_sir,
        best=truth,
        description="SIR beta, gamma, I(0); 61 daily Poisson counts of I (N = 1000)",
        fixed=dict(population=SIR_POPULATION),
    )


def _lorenz_problem() -> Problem:
    ts = np.linspace(0.0, 1.0, 101)
    truth = np.array([10.0, 28.0, 8.0 / 3.0])
    y0 = np.array([-8.0, 7.0, 27.0])
    clean = _synthetic(models.Lorenz(sigma=truth[0], rho=truth[1], beta=truth[2]), y0, ts)
    values = clean + 0.5 * np.random.default_rng(2).standard_normal(clean.shape)
    return Problem(
        name="Lorenz",
        model_cls=models.Lorenz,
        params=("sigma", "rho", "beta"),
        y0=y0,
        fitted_states=(),
        initial_state=False,
        ts=ts,
        values=values,
        components=(0, 1, 2),
        field=_lorenz,
        best=truth,
        description="Lorenz sigma, rho, beta; 101 × 3 states over t in [0, 1] (sd 0.5)",
    )


def _fitzhugh_nagumo_problem() -> Problem:
    ts = np.linspace(0.0, 10.0, 51)
    truth = np.array([0.2, 0.2, 3.0])
    y0 = np.array([-1.0, 1.0])
    clean = _synthetic(FitzHughNagumo(a=truth[0], b=truth[1], c=truth[2]), y0, ts)[:, 0]
    values = clean + 0.1 * np.random.default_rng(3).standard_normal(ts.size)
    return Problem(
        name="FitzHugh–Nagumo",
        model_cls=FitzHughNagumo,
        params=("a", "b", "c"),
        y0=y0,
        fitted_states=(),
        initial_state=False,
        ts=ts,
        values=values[:, None],
        components=(0,),
        field=_fitzhugh_nagumo,
        best=truth,
        description="FitzHugh–Nagumo a, b, c; 51 voltages over t in [0, 10] (sd 0.1), R unobserved",
    )


def _robertson_problem() -> Problem:
    ts = np.concatenate([[0.0], np.logspace(-5, 2, 29)])
    truth = np.array([0.04, 3e7, 1e4])
    y0 = np.array([1.0, 0.0, 0.0])
    factors = np.array([1.0, 1e4, 1.0])
    robertson = models.Robertson(k1=truth[0], k2=truth[1], k3=truth[2])
    clean = _synthetic(robertson, y0, ts, solver=ds.Kvaerno5(rtol=1e-11, atol=1e-14)) * factors
    values = clean + 0.005 * np.random.default_rng(4).standard_normal(clean.shape)
    return Problem(
        name="Robertson",
        model_cls=models.Robertson,
        params=("k1", "k2", "k3"),
        y0=y0,
        fitted_states=(),
        initial_state=False,
        ts=ts,
        values=values,
        components=(0, 1, 2),
        factors=factors,
        field=_robertson,
        best=truth,
        description="Robertson k1, k2, k3 (stiff); 30 × (y1, 1e4 y2, y3) to t = 100 (sd 0.005)",
        stiff=True,
    )


def _ball_problem() -> Problem:
    ts = np.arange(151) / 60.0
    truth = np.array([9.81, 0.78])
    y0 = np.array([1.2, 0.0])
    ball = models.BouncingBall(
        gravity=truth[0], restitution=truth[1], drag=BALL_DRAG, rest_speed=BALL_REST_SPEED
    )
    clean = _synthetic(ball, y0, ts, events=_impacts(ball))[:, 0]
    values = clean + 0.003 * np.random.default_rng(5).standard_normal(ts.size)
    return Problem(
        name="bouncing ball",
        model_cls=models.BouncingBall,
        params=("gravity", "restitution"),
        y0=y0,
        fitted_states=(),
        initial_state=False,
        ts=ts,
        values=values[:, None],
        components=(0,),
        field=_ball,
        best=truth,
        description="bouncing ball g, e (impact events); 151 heights over 2.5 s (sd 3 mm)",
        fixed=dict(drag=BALL_DRAG, rest_speed=BALL_REST_SPEED),
        ball=True,
    )


PROBLEMS = {
    "lynx–hare": _lynx_hare_problem,
    "pendulum": _pendulum_problem,
    "SIR": _sir_problem,
    "Lorenz": _lorenz_problem,
    "FitzHugh–Nagumo": _fitzhugh_nagumo_problem,
    "Robertson": _robertson_problem,
    "bouncing ball": _ball_problem,
}


def draw_starts(problem: Problem, n: int, seed: int = 0) -> np.ndarray:
    """(n, k) starts, log-uniform within FACTOR of the best known optimum."""
    spread = np.log(FACTOR)
    u = np.random.default_rng(seed).uniform(-spread, spread, (n, problem.k))
    return problem.best[None] * np.exp(u)


# --- scipy ----------------------------------------------------------------------------------------


class _Budget(Exception):
    """A solve_ivp call ran past its budget of right-hand-side evaluations."""


def _counted(field, params, calls):
    """The right-hand side for solve_ivp, stopped past RHS_BUDGET evaluations (the share of
    ds.fit's max_steps: a model that cannot be simulated in that much work counts as failed)."""

    def rhs(t, y):
        calls[0] += 1
        if calls[0] > RHS_BUDGET:
            raise _Budget
        return field(t, y, params, np)

    return rhs


def scipy_states(problem: Problem, p, method, rtol, atol, jac=False):
    """States (times, n) at the data times, or None where the solve fails."""
    params, y0 = p[: len(problem.params)], problem.initial(p)
    rhs = _counted(problem.field, params, [0])
    try:
        if problem.ball:
            return _ball_states(problem, rhs, params[1], y0, method, rtol, atol)
        options = {}
        if jac:
            options["jac"] = lambda t, y: _robertson_jacobian(t, y, params)
        ts = problem.ts
        solution = solve_ivp(
            rhs, (ts[0], ts[-1]), y0, method=method, t_eval=ts, rtol=rtol, atol=atol, **options
        )
    except _Budget:
        return None
    if solution.status != 0 or solution.y.shape[1] != ts.size:
        return None
    return solution.y.T


def _ball_states(problem: Problem, rhs, restitution, y0, method, rtol, atol):
    """The ball between impacts by solve_ivp, restarted at each floor crossing with v → −e v
    (at rest on the floor once a rebound is slower than the rest speed); None past MAX_EVENTS
    impacts, where ds.simulate reports a failure too."""
    ts = problem.ts
    states = np.zeros((ts.size, 2))

    def floor(t, y):
        return y[0]

    floor.terminal, floor.direction = True, -1
    t, y, impacts, index = ts[0], np.asarray(y0, float), 0, 0
    while index < ts.size:
        solution = solve_ivp(
            rhs,
            (t, ts[-1]),
            y,
            method=method,
            t_eval=ts[index:],
            events=floor,
            rtol=rtol,
            atol=atol,
        )
        if solution.status == -1:
            return None
        count = np.asarray(solution.t).size  # scipy returns lists when t_eval is left empty
        if count:
            states[index : index + count] = np.asarray(solution.y).T
        index += count
        if solution.status == 0:
            break
        impacts += 1
        if impacts > MAX_EVENTS:
            return None
        t = solution.t_events[0][0]
        rebound = -restitution * solution.y_events[0][0][1]
        if abs(rebound) < BALL_REST_SPEED:
            break  # at rest on the floor: the remaining states stay 0
        y = np.array([0.0, rebound])
        while index < ts.size and ts[index] <= t:  # a data time at the impact itself
            states[index] = [0.0, rebound]
            index += 1
    return states


def scipy_residual_fn(problem: Problem, method, rtol, atol, jac=False):
    size = problem.values.size

    def residuals(p):
        with np.errstate(all="ignore"):
            states = scipy_states(problem, p, method, rtol, atol, jac)
            if states is None:
                return None
            if problem.loss == "log" and np.any(problem.observed(states) <= 0):
                return None
            r = problem.residuals(problem.observed(states), np).ravel()
        return r if np.all(np.isfinite(r)) else None

    residuals.size = size
    return residuals


def scipy_batch(problem: Problem, starts, method: str):
    """Each start fitted by least_squares; returns (estimates, evaluations, all solves)."""
    solver = "LSODA" if problem.stiff else "DOP853"
    rtol, atol = (STIFF_RTOL, STIFF_ATOL) if problem.stiff else (RTOL, ATOL)
    residuals = scipy_residual_fn(problem, solver, rtol, atol)
    calls = [0]

    def in_log_space(u):
        calls[0] += 1
        r = residuals(np.exp(u))
        return np.full(residuals.size, PENALTY) if r is None else r

    estimates = np.full(starts.shape, np.nan)
    evaluations = np.zeros(len(starts), int)
    solves = np.zeros(len(starts), int)
    for i, start in enumerate(starts):
        calls[0] = 0
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = least_squares(in_log_space, np.log(start), method=method)
            estimates[i] = np.exp(result.x)
            evaluations[i] = result.nfev
        except Exception:  # a failed fit counts as a failure
            evaluations[i] = calls[0]
        solves[i] = calls[0]
    return estimates, evaluations, solves


def reference_losses(problem: Problem, estimates) -> np.ndarray:
    """Each estimate's loss from the reference integrator (inf where it cannot be simulated)."""
    if problem.stiff:
        residuals = scipy_residual_fn(problem, "Radau", 1e-11, 1e-14, jac=True)
    else:
        residuals = scipy_residual_fn(problem, "DOP853", 1e-12, 1e-12)
    losses = np.full(len(estimates), np.inf)
    for i, p in enumerate(estimates):
        if np.all(np.isfinite(p)) and np.all(p > 0):
            r = residuals(np.asarray(p, float))
            if r is not None:
                losses[i] = float(np.sum(r**2))
    return losses


# --- diffsim --------------------------------------------------------------------------------------


def diffsim_default(problem: Problem, starts, **extra):
    """ds.fit once per start; returns (estimates, evaluations)."""
    options = {**problem.fit_options(), **extra}
    data = problem.data if problem.data is not None else problem.ds_data()
    estimates = np.full(starts.shape, np.nan)
    evaluations = np.zeros(len(starts), int)
    for i, start in enumerate(starts):
        try:
            result = ds.fit(
                problem.model(start), jnp.asarray(problem.initial(start)), data, **options
            )
        except Exception:  # e.g. a start that cannot be simulated: a failure
            continue
        estimates[i] = [result.params[n] for n in result.names]
        evaluations[i] = result.num_solves
    return estimates, evaluations


def diffsim_starts(problem: Problem, starts):
    """One ds.fit over every start; returns (estimates, evaluations)."""
    data = problem.data if problem.data is not None else problem.ds_data()
    best = problem.best
    result = ds.fit(
        problem.model(best),
        jnp.asarray(problem.initial(best)),
        data,
        starts=np.asarray(starts),
        **problem.fit_options(),
    )
    estimates = np.stack([np.asarray(result.starts["params"][n]) for n in result.names], axis=1)
    return estimates, np.asarray(result.starts["evaluations"])


def diffsim_reference(problem: Problem) -> np.ndarray:
    data = problem.data if problem.data is not None else problem.ds_data()
    best = problem.best
    result = ds.fit(
        problem.model(best), jnp.asarray(problem.initial(best)), data, **problem.fit_options()
    )
    return np.array([result.params[n] for n in result.names])


# --- diffrax + optimistix by hand -----------------------------------------------------------------


def make_hand_fit(problem: Problem):
    ts = jnp.asarray(problem.ts)
    base = jnp.asarray(problem.y0, float)
    fitted = np.asarray(problem.fitted_states, int)
    num_params = len(problem.params)
    term = diffrax.ODETerm(lambda t, y, p: problem.field(t, y, p, jnp))
    if problem.stiff:
        solver, rtol, atol = diffrax.Kvaerno5(), STIFF_RTOL, STIFF_ATOL
    else:
        solver, rtol, atol = diffrax.Tsit5(), RTOL, ATOL

    def residuals(u, _):
        p = jnp.exp(u)
        y0 = base.at[fitted].set(p[num_params:]) if fitted.size else base
        solution = diffrax.diffeqsolve(
            term,
            solver,
            ts[0],
            ts[-1],
            dt0=None,
            y0=y0,
            args=p[:num_params],
            saveat=diffrax.SaveAt(ts=ts),
            stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
            adjoint=diffrax.ForwardMode(),
            throw=False,
        )
        predictions = problem.observed(solution.ys)
        ok = solution.result == diffrax.RESULTS.successful
        if problem.loss == "log":
            ok = ok & jnp.all(predictions > 0)
            predictions = jnp.where(predictions > 0, predictions, 1.0)
        r = problem.residuals(predictions, jnp).ravel()
        return jnp.where(ok & jnp.isfinite(r), r, jnp.inf)

    lm = optx.LevenbergMarquardt(rtol=1e-8, atol=1e-10)

    def one(u0):
        solution = optx.least_squares(
            residuals, lm, u0, options={"jac": "fwd"}, throw=False, max_steps=256
        )
        return jnp.exp(solution.value), solution.stats["num_steps"]

    return jax.jit(jax.vmap(one))


def hand_batch(problem: Problem, starts):
    estimates, steps = jax.block_until_ready(make_hand_fit(problem)(jnp.log(jnp.asarray(starts))))
    return np.asarray(estimates), np.asarray(steps)


# --- the benchmark --------------------------------------------------------------------------------


def run_method(problem: Problem, method: str, starts) -> dict:
    start = time.perf_counter()
    solves = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ds.FitWarning)
        if method == "diffsim default":
            estimates, evaluations = diffsim_default(problem, starts)
        elif method == "diffsim unscreened":
            estimates, evaluations = diffsim_default(problem, starts, screen=0)
        elif method == "diffsim starts":
            try:
                estimates, evaluations = diffsim_starts(problem, starts)
            except Exception as error:  # the whole batch failed: every start fails
                print(f"  {problem.name}: diffsim starts raised {error!r}", file=sys.stderr)
                estimates = np.full(starts.shape, np.nan)
                evaluations = np.zeros(len(starts), int)
        elif method in ("scipy lm", "scipy trf"):
            estimates, evaluations, solves = scipy_batch(problem, starts, method.split()[1])
        else:
            estimates, evaluations = hand_batch(problem, starts)
    seconds = time.perf_counter() - start
    return dict(estimates=estimates, evaluations=evaluations, solves=solves, seconds=seconds)


def skipped(problem: Problem, method: str) -> bool:
    return method == "diffrax + optx" and problem.ball


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=50)
    parser.add_argument("--problems", default=None, help="comma-separated problem names")
    parser.add_argument("--quick", action="store_true", help="2 problems, 4 starts, 3 methods")
    parser.add_argument("--methods", default=None, help="comma-separated methods (default: all)")
    args = parser.parse_args(argv)
    ds.config(cache=False)  # compilation is part of the measured wall time
    if args.problems:
        names = [n.strip() for n in args.problems.split(",")]
    else:
        names = list(QUICK_PROBLEMS if args.quick else PROBLEMS)
    count = 4 if args.quick else args.starts
    methods = QUICK_METHODS if args.quick else METHODS
    if args.methods:
        methods = tuple(m.strip() for m in args.methods.split(","))
        unknown = sorted(set(methods) - set(METHODS))
        if unknown or "diffsim default" not in methods or "scipy lm" not in methods:
            parser.error(
                f"--methods takes names from {METHODS} and needs 'diffsim default' and "
                f"'scipy lm' (the targets compare them); got {unknown or list(methods)}"
            )
    print(machine_line())
    print(
        f"{count} starts per problem, log-uniform within a factor {FACTOR:g} of the best known "
        f"optimum; success: reference loss <= best (1 + {SUCCESS:g}); float64\n"
    )

    outcomes: dict[str, dict[str, dict]] = {}
    built: dict[str, Problem] = {}
    best_losses: dict[str, float] = {}
    for name in names:
        problem = built[name] = PROBLEMS[name]()
        starts = draw_starts(problem, count)
        outcomes[name] = {}
        for method in methods:
            if skipped(problem, method):
                continue
            outcome = run_method(problem, method, starts)
            outcome["losses"] = reference_losses(problem, outcome["estimates"])
            outcomes[name][method] = outcome
            print(
                f"  {name}: {method} done in {outcome['seconds']:.1f} s",
                file=sys.stderr,
                flush=True,
            )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ds.FitWarning)
            reference = reference_losses(problem, diffsim_reference(problem)[None])[0]
        finite = [
            np.min(o["losses"][np.isfinite(o["losses"])], initial=np.inf)
            for o in outcomes[name].values()
        ]
        best_losses[name] = best = float(min([reference, *finite]))
        reached = {
            m: int(np.sum(o["losses"] <= best * (1 + SUCCESS))) for m, o in outcomes[name].items()
        }
        print(f"  {name}: best loss {best:.8g}; successes {reached}", file=sys.stderr, flush=True)

    rows, near_rows, totals = [], [], {m: [0, 0, 0] for m in methods}
    describe = []
    for name in names:
        problem, best = built[name], best_losses[name]
        describe.append(
            [name, problem.description, "Kvaerno5 / LSODA" if problem.stiff else "Tsit5 / DOP853"]
        )
        describe[-1].append(f"{best:.6g}")
        row, near_row = [name], [name]
        for method in methods:
            if method not in outcomes[name]:
                row.append("skipped (events)")
                near_row.append("-")
                continue
            o = outcomes[name][method]
            success = o["losses"] <= best * (1 + SUCCESS)
            near = int(np.sum(o["losses"] <= best * (1 + NEAR)))
            o["successes"] = int(np.sum(success))
            totals[method][0] += o["successes"]
            totals[method][1] += len(success)
            totals[method][2] += near
            near_row.append(f"{near}/{len(success)}")
            median = float(np.median(o["evaluations"]))
            cell = f"{o['successes']}/{len(success)}, {median:.0f} ev"
            if o["solves"] is not None:
                cell += f" ({np.median(o['solves']):.0f} all solves)"
            row.append(cell + f", {o['seconds']:.1f} s")
            fields = dict(
                members=len(success),
                starts=len(success),
                successes=o["successes"],
                near_optimum=near,
                success_rate=o["successes"] / len(success),
                median_evaluations=median,
                run_s=o["seconds"],
                best_loss=best,
            )
            if o["solves"] is not None:
                fields["median_solves"] = float(np.median(o["solves"]))
            record(f"fit robustness ({name})", method, **fields)
        rows.append(row)
        near_rows.append(near_row)
    overall, near_overall = ["overall"], ["overall"]
    for method in methods:
        won, tried, near = totals[method]
        overall.append(f"{won}/{tried} ({100 * won / max(tried, 1):.0f}%)" if tried else "-")
        near_overall.append(f"{near}/{tried}" if tried else "-")
    rows.append(overall)
    near_rows.append(near_overall)

    print(table(describe, ["problem", "fit", "solvers (JAX / scipy)", "best known loss"]))
    print()
    print(
        "successes / starts, median residual evaluations (ev) per start, wall time of the batch "
        "(compilation included):\n"
    )
    print(table(rows, ["problem", *methods]))
    print(
        f"\nstarts that end within {NEAR:g} (relative) of the best known loss: a start counted "
        "here but not above stopped near the optimum without reaching it\n"
    )
    print(table(near_rows, ["problem", *methods]))

    checks = []
    for name in names:
        o = outcomes[name]
        ds_rate = o["diffsim default"]["successes"] / count
        lm_rate = o["scipy lm"]["successes"] / count
        checks.append(
            (
                f"{name}: diffsim default success - scipy lm success >= 0",
                ds_rate - lm_rate,
                ds_rate >= lm_rate,
            )
        )
    won, tried, _ = totals["diffsim default"]
    checks.append(
        ("diffsim default success over the set >= 0.95", won / tried, won >= 0.95 * tried)
    )
    for name in names if "diffsim starts" in methods else ():
        o = outcomes[name]
        ratio = o["diffsim starts"]["seconds"] / o["scipy lm"]["seconds"]
        checks.append((f"{name}: diffsim starts wall / scipy lm wall < 1", ratio, ratio < 1))
    print()
    print(targets_table(checks))


if __name__ == "__main__":
    main()
