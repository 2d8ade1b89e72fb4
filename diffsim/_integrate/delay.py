"""Delay differential equations (`ds.DDE`, `ds.AbstractDDE`) by the method of steps.

The solve is diffsim's own adaptive loop (`adaptive_loop.run`) with the solution's dense
output kept as it goes: a step from t reads each delayed state y(s), s = t + c·h − τ, from the
history where s < t0 and from the stored steps where s ≥ t0. No step is longer than the
smallest lag, so every delayed state a step needs is already stored (the method of steps:
each step is an ODE step with a known delayed input). The solution of a DDE is not smooth at
t0 + k·τ (the jump in slope at t0 travels along the lags, one derivative smoother each time):
adaptive solves end a step at each of these breakpoints, k = 1 … `BREAK_ORDERS`, for every lag.

Explicit pairs (`Tsit5`, `Dopri5`) and Rosenbrock methods step adaptively; explicit
fixed-step Runge–Kutta methods (`RK4`, …) take constant steps of `dt` in the same loop, with a
cubic Hermite interpolant on each step as their history. Derivatives in every mode by the
loop's forward-mode Jacobian (`adaptive_loop.run_any_order`): the history's coefficients
carry the tangents, so the lags, parameters, `y0` and the history's parameters are all
differentiated (the step sizes held fixed, as everywhere).

Why not diffrax: its delay support was removed from the released versions, and diffsim's loop
already carries dense buffers that a step can read."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

from .._compile import jit
from .._events import round_off_time
from .._model import AbstractDDE
from .._solver.runge_kutta import AbstractRungeKutta
from .._validate import is_traced
from .adaptive_loop import Attempt, Method, run_any_order, solved
from .common import guard_inputs
from .dense import hermite_at
from .erk_loop import ExplicitPair
from .families import Solved, SolveRequest
from .rosenbrock_loop import RosenbrockMethod
from .step_control import check_adaptive_request, Controls, prepare
from .time_grid import plan_fixed_steps

# breakpoints t0 + k·τ for k = 1 … BREAK_ORDERS: after the k-th the solution's (k+1)-th
# derivative is continuous, smooth enough for a method of order ≤ 5 past the 5th
BREAK_ORDERS = 5
# up to this many lags the breakpoints are every combination t0 + Σ kᵢτᵢ (1 ≤ Σ kᵢ ≤
# BREAK_ORDERS: 20 for two lags, 55 for three); with more, each lag's own t0 + kτᵢ
_COMBINED_LAGS = 3


def _break_orders(num_lags: int) -> np.ndarray:
    """(breakpoints, lags): the multiples kᵢ of each lag in t_jump + Σ kᵢτᵢ, 1 ≤ Σ kᵢ ≤
    BREAK_ORDERS. Combinations matter: with lags 0.7 and 1.9 the kink at t0 + 2.6 left Tsit5
    up to 100× its tolerance where the single-lag breakpoints alone were cut."""
    if num_lags <= _COMBINED_LAGS:
        grid = np.stack(
            np.meshgrid(*[np.arange(BREAK_ORDERS + 1)] * num_lags, indexing="ij"), -1
        ).reshape(-1, num_lags)
        total = grid.sum(1)
        return grid[(total >= 1) & (total <= BREAK_ORDERS)]
    single = np.arange(1, BREAK_ORDERS + 1)[:, None, None] * np.eye(num_lags, dtype=int)[None]
    return single.reshape(-1, num_lags)


def _break_count(num_lags: int) -> int:
    return _break_orders(num_lags).shape[0]


def solve_dde(solver, request: SolveRequest) -> Solved:
    """Check a delay model's solve and run it in the adaptive loop (see the module text)."""
    model = request.model
    if request.adjoint != "auto":
        raise ValueError(
            "adjoint applies to solves diffrax runs; a delay equation runs diffsim's own loop, "
            "differentiated in every mode by its forward-mode Jacobian: leave adjoint='auto'"
        )
    if request.key is not None or solver.stochastic:
        raise NotImplementedError("stochastic delay equations are not supported")
    lags = _concrete_lags(model)
    if solver.needs_dt:
        if solver.delay_stepping != "runge_kutta":
            raise NotImplementedError(
                f"{type(solver).__name__} cannot step a delay equation: use an explicit "
                "Runge–Kutta method (ds.RK4(), ds.Euler(), ...) or an adaptive one (ds.Tsit5())"
            )
        if request.checkpoint != "auto":
            raise ValueError("checkpoint does not apply to delay equations (the loop is adaptive)")
        name = type(solver).__name__
        plan = plan_fixed_steps(request.host_ts, request.dt, request.steps_per_save, name)
        if is_traced(request.host_ts):
            raise ValueError(
                "a fixed-step delay solve needs a concrete ts (its number of steps bounds the "
                "loop): close over ts, or use an adaptive solver"
            )
        counts = plan.steps if plan.steps is not None else None
        total = (
            int(np.sum(counts))
            if counts is not None
            else plan.steps_per_save * (request.ts.shape[0] - 1)
        )
        # dt itself when given (the longest step: the loop cuts steps at the output times, so
        # each interval takes ceil(interval / dt) steps, the plan's count); else the first
        # interval's steps_per_save-th
        dt = (
            float(request.dt)
            if request.dt is not None
            else float(np.diff(np.asarray(request.host_ts, np.float64))[0]) / plan.steps_per_save
        )
        if lags is not None and dt > min(lags) * (1 + 1e-12):
            raise ValueError(
                f"dt = {dt:g} is longer than the smallest lag {min(lags):g}: a step would need "
                "a delayed state it has not computed yet; take dt <= the smallest lag (a "
                "divisor of the lags keeps the breakpoints t0 + k·τ on the grid)"
            )
        return _solve(
            _FixedStep(solver),
            None,
            model,
            request.y0,
            request.ts,
            jnp.asarray(dt, request.dtype),
            request.events,
            # a step cut at each breakpoint, and one for round-off at the end; each event
            # cuts a step, shifts the grid (one more step), and its reset adds breakpoints
            max_steps=total
            + _break_count(len(model.delays()))
            + 2
            + _event_budget(request.events) * (_break_count(len(model.delays())) + 2),
            dense=request.dense,
        )
    if solver.delay_stepping == "rosenbrock":
        method, error_order = RosenbrockMethod(solver), solver.error_order
    elif solver.delay_stepping == "explicit_pair":
        if solver._interpolant_below_order:
            # a step reads its delayed states from the steps before it, through their dense
            # output: Dopri8's (degree 7, below its order) stalled at 5e-8 from 1e-6 down to
            # 1e-12 (y' = −y(t − 1), 22 steps of about τ), unseen by the step control
            raise NotImplementedError(
                f"{type(solver).__name__} cannot step a delay equation accurately: its dense "
                "output, from which each step reads the delayed states, is of lower order "
                "than its steps; use ds.Tsit5 or ds.Dopri5 (or ds.Rodas5P for a stiff one)"
            )
        inner = solver.to_diffrax()
        method = ExplicitPair(inner)
        error_order = inner.order(diffrax.ODETerm(model.vector_field))
    else:
        raise NotImplementedError(
            f"{type(solver).__name__} cannot step a delay equation: use an explicit pair "
            "(ds.Tsit5, ds.Dopri5), a Rosenbrock method (ds.Rodas5P) for a stiff "
            "one, or an explicit fixed-step method (ds.RK4)"
        )
    dt = check_adaptive_request(solver, request)
    return _solve(
        method,
        (solver, error_order),
        model,
        request.y0,
        request.ts,
        dt,
        request.events,
        max_steps=int(request.max_steps),
        dense=request.dense,
    )


def _event_budget(events) -> int:
    """The most event occurrences a solve can have (each event's `max_events`)."""
    if events is None:
        return 0
    return sum(int(event.max_events) for event in events)


def _concrete_lags(model: AbstractDDE) -> list[float] | None:
    lags = model.delays()
    if any(is_traced(lag) for lag in lags):
        return None
    values = [float(lag) for lag in lags]
    for i, lag in enumerate(values):
        if not np.isfinite(lag) or lag <= 0:
            raise ValueError(f"delays()[{i}] = {lag}: every lag must be positive and finite")
    return values


@jit
def _solve(method, adaptive, model, y0, ts, dt0, events, *, max_steps: int, dense: bool):
    lags = jnp.stack([jnp.asarray(lag, ts.dtype) for lag in model.delays()])
    lags_ok = jnp.all(lags > 0) & jnp.all(jnp.isfinite(lags))
    shortest = jnp.where(lags_ok, jnp.min(lags), 1.0)
    if adaptive is None:  # constant steps of dt0 (explicit Runge–Kutta)
        # a traced lag shorter than dt: a step would read beyond the solution computed so far
        # (a concrete one is refused before the solve)
        lags_ok = lags_ok & (dt0 <= shortest * (1 + 1e-12))
        valid, model, y0, ts = guard_inputs(model, y0, ts, lags_ok)
        one = jnp.ones((), ts.dtype)
        controls = Controls(one, one, None, None, dt0, False, True)
    else:
        solver, error_order = adaptive
        valid, model, y0, ts, controls = prepare(solver, error_order, model, y0, ts, dt0)
        valid = valid & lags_ok
        # no step longer than the smallest lag: every delayed state is already stored
        dtmax = shortest if controls.dtmax is None else jnp.minimum(controls.dtmax, shortest)
        controls = controls._replace(dtmax=dtmax, dt0=jnp.minimum(controls.dt0, dtmax))
    out = run_any_order(
        _DelayMethod(method),
        model,
        y0,
        ts,
        controls,
        events,
        max_steps=max_steps,
        dense=dense,
    )
    stats = {"num_steps": out.accepted, "num_rejected_steps": out.rejected}
    result = solved(valid, out, stats, events)
    return result if dense else result._replace(dense=None)


class _DelayMethod(Method):
    """A method stepping a delay model: each step's stepper reads the past (`with_history`)."""

    inner: Method

    def stepper(self, model, y0):
        return _DelayStepper(self.inner, model, y0)


class _DelayStepper:
    def __init__(self, inner: Method, model: AbstractDDE, y0):
        self.inner, self.model, self.y0 = inner, model, y0
        # the stepper on the history alone: the first carry at t0, the orders
        self._first = inner.stepper(model, y0)
        self.error_order = self._first.error_order
        self.dense_nodes = self._first.dense_nodes

    def start(self, t, y):
        return self._first.start(t, y)  # only at t0, where the delayed states are history

    def attempt(self, t, h, y, carry) -> Attempt:
        return self._first.attempt(t, h, y, carry)

    def breaks(self, t0):
        """The times a step must end at (sorted, inf-terminated)."""
        infinity = jnp.full((1,), jnp.inf, t0.dtype)
        return jnp.concatenate([self.jump_breaks(t0), infinity])

    @property
    def breaks_per_jump(self) -> int:
        return _break_count(len(self.model.delays()))

    def jump_breaks(self, t_jump):
        """Where a jump of the solution (or its slope) at `t_jump` makes it not smooth:
        t_jump + Σ kᵢτᵢ (`_break_orders`), sorted; a breakpoint within round-off of the one
        before it (2τ₁ = τ₂ computed two ways) is dropped (inf), so that no step is cut to
        a length of round-off."""
        dtype = jnp.result_type(t_jump)
        lags = jnp.stack([jnp.asarray(lag, dtype) for lag in self.model.delays()])
        orders = jnp.asarray(_break_orders(lags.shape[0]), dtype)
        times = jnp.sort(t_jump + orders @ lags)
        slack = round_off_time(dtype, jnp.maximum(jnp.abs(times), 1.0))
        repeated = jnp.concatenate([jnp.zeros(1, bool), jnp.diff(times) <= slack[1:]])
        return jnp.sort(jnp.where(repeated, jnp.inf, times))

    def present(self, past, t, t_next) -> "_Present":
        """The model as the step from t to t_next sees it: its delayed states read from `past`
        (the steps so far)."""
        return _Present(self.model, past, self.y0, 0.5 * (t + t_next))

    def with_history(self, present: "_Present"):
        """The stepper of the next step, on the model as it sees it (`present`)."""
        return self.inner.stepper(present, self.y0)


class _Present:
    """The delay model as an ODE for one step: the delayed states from the history before t0
    and from the stored steps `past` after it.

    Which of the two a lag reads is decided for the whole step, by its midpoint, not by each
    stage's time: no step straddles t0 + τ (a breakpoint), so the step that ends there reads
    the history even at its last stage, where s = t − τ = t0 exactly (the left limit), and
    the step that starts there reads the solution (the right limit, y0). Deciding by s < t0
    at each stage read y0 at that last stage: right in value when y0 = history(t0), but its
    derivative went to y0 instead of the history, and a start with y0 ≠ history(t0) (a jump)
    was off by O(h·jump)."""

    mass_matrix = None
    jacobian_bandwidth = None

    def __init__(self, model: AbstractDDE, past, y0, middle):
        self.model, self.past, self.y0, self.middle = model, past, y0, middle

    def jacobian(self, t, y):
        return None

    def vector_field(self, t, y, args=None):
        past, t0 = self.past, self.past.knots[0]
        delayed = []
        for lag in self.model.delays():
            s = t - lag
            from_history = self.middle - lag < t0
            # Clamped by `where`, not `jnp.clip`/`jnp.minimum`: at a tie (s = t0, the first
            # step after a breakpoint) those split the derivative in t between the two sides,
            # halving ∂f/∂t, which the Rosenbrock stages use (Rosenbrock23's interpolant was
            # off by O(1) there). A step never reads beyond the stored span but for round-off.
            before = self.model.history(jnp.where(s < t0, s, t0))
            end = past.knots[past.count]
            # at a reset's time (a knot where the stored solution jumps: a breakpoint, so at
            # one end of the step's window) the stage at the window's end reads the left
            # limit, the one at its start the right limit (as at t0 above)
            left = s > self.middle - lag
            stored = past.read(jnp.where(s < t0, t0, jnp.where(s > end, end, s)), left=left)
            stored = jax.tree.map(lambda a, b: jnp.where(past.count > 0, a, b), stored, self.y0)
            delayed.append(jax.tree.map(lambda a, b: jnp.where(from_history, b, a), stored, before))
        return self.model.delayed_field(t, y, tuple(delayed))


class _FixedStep(Method):
    """An explicit fixed-step Runge–Kutta method as the adaptive loop steps it (constant
    steps, no error estimate), with a cubic Hermite interpolant on each step."""

    solver: AbstractRungeKutta

    def stepper(self, model, y0):
        return _FixedStepper(self.solver, model)


class _FixedStepper:
    error_order = 1  # unused: constant steps
    dense_nodes = 4  # cubic Hermite

    def __init__(self, solver, model):
        self.solver, self.model = solver, model

    def start(self, t, y):
        return self.model.vector_field(t, y)

    def attempt(self, t, h, y, f_y) -> Attempt:
        y1, _ = self.solver.advance(self.model, t, y, h, None, None)
        f_y1 = self.model.vector_field(t + h, y1)

        def evaluate(t_save):
            return hermite_at((t_save - t) / h, y, f_y, y1, f_y1, h)

        return Attempt(y1, jax.tree.map(jnp.zeros_like, y), evaluate, f_y1)
