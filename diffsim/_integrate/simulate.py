"""`simulate`: model + solver + output times → `Solution`."""

import dataclasses

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, PyTree

from .._closure import closes_over_tracer, lift_closure
from .._compile import jit
from .._custom_types import State, Times
from .._events import as_events, evaluate, Event, RateCondition, Records, round_off_time
from .._model import AbstractDDE, AbstractODE, AbstractSDE, check_model, DDE, ODE
from .._results import RESULTS, SimulationError
from .._solver.adaptive import unresolved_tolerance
from .._solver.base import AbstractSolver, check_solver
from .._validate import (
    any_traced,
    as_state,
    as_state_leaf,
    check_key,
    describe,
    is_traced,
    nonfinite_leaves,
    once,
    probe_indices,
    to_device,
)
from .common import cast_floats, scale_of_times
from .dae import check_consistent_start, check_mass_matrix
from .delay import solve_dde
from .dense import constant_piece, DenseOutput
from .families import solve_of, SolveRequest
from .hooks import check_history_values, check_jacobian_hooks, failure_notes
from .reverse import check_reversible, forward_times, Reversed, reversed_event
from .time_grid import check_ts, is_empty_span, open_end, runs_backward


class Solution(eqx.Module):
    """The result of `simulate`.

    - `ts`: the output times, shape `(times,)`, as passed in.
    - `ys`: the states at `ts`, a pytree like `y0` with a leading axis of length `times`;
      `ys[0]` is `y0`. Members that failed (see `result`) hold NaN (invalid input) or the
      non-finite values the solve produced.
    - `stats`: dict of int arrays: `num_steps` (accepted steps), `num_rejected_steps`, and
      `num_function_evals` (exact for fixed-step solvers; for explicit adaptive ones, attempted
      steps × stages per step; for Rosenbrock methods the same, besides one Jacobian per
      attempted step; absent where the count is not known: implicit diffrax solvers, whose
      Newton iterations vary, and a `ds.DiffraxSDE` of a method it cannot count).
    - `result`: int32 code, `ds.RESULTS.successful` (0) when the solve succeeded.

    With `events` (else None):

    - `event_time`: when each event happened: shape `(max_events,)` per event (a scalar when
      `max_events` is 1), `inf` in slots of occurrences that did not happen. A tuple of these
      when `events` was a tuple.
    - `event_state`: the state just before each occurrence (before its reset), shaped like
      `event_time` plus the state's shape; NaN where none happened.
    - `event_count`: int, how often each event happened.
    - `reached`: bool `(times,)`: False at output times after a terminal event (their `ys` are
      NaN).

    With `dense=True` (else None): `dense`, every step's interpolant (`ds.DenseOutput`), read
    through `evaluate(t)` and `derivative(t)`.
    """

    ts: Float[Array, " times"]
    ys: PyTree[Array]
    stats: dict[str, Int[Array, ""]]
    result: Int[Array, ""]
    event_time: PyTree[Array] = None
    event_state: PyTree[Array] = None
    event_count: PyTree[Array] = None
    reached: Array | None = None
    dense: DenseOutput | None = None

    @property
    def succeeded(self) -> Array:
        """Boolean array: True where the solve succeeded."""
        return self.result == RESULTS.successful

    def evaluate(self, t) -> PyTree[Array]:
        """The state at time(s) `t` anywhere in the span the solve covered, from the method's
        own interpolant on the step that holds `t` (needs `simulate(..., dense=True)`).

        `t`: a scalar or an array of times; each leaf of the result has shape
        `t.shape + state shape`. NaN outside the span (and after a terminal event). At an
        event with a reset, the state after it. Differentiable with respect to `t` and,
        through the solve, to parameters and `y0`.

        A solution returned from `jax.vmap` (a batch of solves) answers for every member at
        the same times: each leaf has shape `batch shape + t.shape + state shape`."""
        return self._at(t, "evaluate")

    def derivative(self, t) -> PyTree[Array]:
        """dy/dt at time(s) `t`: the derivative of the interpolant `evaluate` reads (shapes
        as there; needs `simulate(..., dense=True)`)."""
        return self._at(t, "derivative")

    def _at(self, t, which: str):
        if self.dense is None:
            raise ValueError(
                f"Solution.{which} needs the steps' interpolants: solve with "
                "ds.simulate(..., dense=True)"
            )
        t = jnp.asarray(t, self.dense.knots.dtype)
        if not jnp.issubdtype(t.dtype, jnp.floating):
            raise TypeError(f"Solution.{which}(t): t must be real times, got {t.dtype}")
        return _read_dense(self.dense, t, which)


# One compiled program per shape of `t`: run op by op, the first read of a new shape compiled
# each of its few dozen primitives apart. Measured (Tsit5, 2 states, 2 cores): first read
# 1.5-1.8 s op by op against 0.24-0.34 s compiled whole; later reads 29 ms against 0.5-1 ms.
@jit
def _read_dense(dense, t, which: str):
    def one(dense):
        values = jax.vmap(getattr(dense, which))(t.reshape(-1))
        return jax.tree.map(lambda v: v.reshape(t.shape + v.shape[1:]), values)

    # a solution returned from jax.vmap carries its batch axes in front of every array
    for _ in range(dense.knots.ndim - 1):
        one = jax.vmap(one)
    return one(dense)


def simulate(
    model: AbstractODE,
    y0: State,
    ts: Times,
    *,
    solver: AbstractSolver,
    dt: float | None = None,
    steps_per_save: int | None = None,
    max_steps: int = 100_000,
    throw: bool = True,
    checkpoint: int | str | None = "auto",
    adjoint: str | diffrax.AbstractAdjoint = "auto",
    key=None,
    events=None,
    dense: bool = False,
) -> Solution:
    """Solve the model from `y0` at `ts[0]` and return the states at every time in `ts`.

    **Arguments:**

    - `model`: a `ds.AbstractODE` (any diffsim model, or `ds.ODE(fn, params)`).
    - `y0`: the initial state at `ts[0]`, a pytree of arrays with the structure the model expects
      (e.g. `jnp.array([angle, angular_velocity])`). Its floating dtype sets the precision of the
      solve: the model's parameters and the times are cast to it, and `ys` keeps it.
    - `ts`: output times, shape `(times,)`, strictly increasing (or strictly decreasing, to
      integrate backwards), at least two; `ts[0]` is t0.
    - `solver`: a diffsim solver, fixed-step (`ds.RK4()`, `ds.Leapfrog()`, …) or adaptive
      (`ds.Tsit5(rtol=..., atol=...)`; stiff: `ds.Rodas5P(...)`, `ds.Rosenbrock23(...)`,
      `ds.Kvaerno5(...)`; `ds.Diffrax(...)`). A model with a `mass_matrix` (a DAE) needs a
      Rosenbrock method and a consistent `y0` (`ds.consistent_initial_state`).
    - `dt`: fixed-step solvers: the longest step. An interval of `ts` that `dt` divides into
      whole steps takes them; one it does not divide takes `ceil(interval / dt)` equal, shorter
      steps, so the solve lands on every output time (needs a concrete `ts`, e.g. one closed
      over by your `jit`). Adaptive solvers: the
      initial step guess (default: chosen automatically).
    - `steps_per_save`: fixed-step solvers: a static number of equal steps per output interval;
      required instead of `dt` when `ts` is traced. On a non-uniform grid, `dt` gives each interval
      its own count and every interval runs the largest count with the surplus steps masked.
    - `max_steps`: adaptive solvers: the static bound on the number of steps.
    - `throw`: raise `ds.SimulationError` (or an equinox runtime error under `jit`) when the solve
      fails. Use `throw=False` under `vmap`: then nothing raises, and `Solution.result` flags each
      failing member while the others are unaffected.
    - `checkpoint`: fixed-step solvers, memory of reverse mode: `"auto"` (blocks of ~sqrt(n)
      steps under `jax.checkpoint`), `None` (store every step) or an int (steps per block).
    - `adjoint`: adaptive solvers, how derivatives are computed: `"auto"`, `"checkpoint"`
      (diffrax's `RecursiveCheckpointAdjoint`: reverse mode only) or a `diffrax` adjoint.
      `diffrax.ForwardMode()` (forward mode only: `jax.jvp`, `jax.jacfwd`) runs JAX's forward
      mode through the solve's own loop (explicit pairs without events, Rosenbrock methods)
      with one tangent per direction asked, where `"auto"` carries one per differentiated
      input of the solve so that reverse mode can transpose it: cheaper for a Jacobian with
      fewer columns than the solve has inputs (a fit's unknowns that set several parameters
      and initial states); reverse mode then fails.
    - `key`: stochastic models (`ds.AbstractSDE`) with a stochastic solver (`ds.EulerMaruyama`,
      `ds.Milstein`): the PRNG key of the Brownian path. Step j (counted from `ts[0]`) uses
      `ds.brownian_increment(key, j, shape, dt)`, so the path depends on the key and the step
      only, not on the saved times; with a fixed key the solve is a differentiable function of
      the parameters (pathwise derivatives). `vmap` over keys for an ensemble.
    - `events`: a `ds.Event` or a tuple of them (conditions that cross zero: impacts, switches,
      stops). Crossings are located inside steps; terminal events stop the trajectory (later
      outputs NaN, `Solution.reached` False), events with a `reset` restart from the reset
      state. When several events cross in one step the earliest fires; at equal times (to
      round-off) the first in the tuple. The results are `Solution.event_time`, `event_state`,
      `event_count`. Fixed-step and adaptive ODE solvers; not stochastic ones (for first
      passages of a stochastic model use `ds.iterate` with a stop condition). Reverse mode
      through a fixed-step solve with events stores one state per checkpoint block as without
      events.
    - `dense`: keep every step's interpolant, so that `Solution.evaluate(t)` and
      `Solution.derivative(t)` answer at any time of the span: the method's own dense output
      for adaptive solvers run in diffsim's loop (explicit pairs, Rosenbrock methods; with
      events too), a cubic Hermite interpolant on every step for fixed-step solvers (without
      events). Memory: `max_steps` (adaptive) or the number of steps (fixed-step) times the
      interpolant's degree + 1 states (docs/concepts/solvers.md, "Dense output").

    **Returns:** a `ds.Solution`.

    The time loop is `lax.scan` (fixed step; the number of steps is static, compile time does not
    depend on it) or a bounded `while_loop` (adaptive: diffsim's own or diffrax's). `simulate`
    composes with `jax.jit`, `jax.vmap` and `jax.grad` applied from outside.

    **Differentiation.** Every solver supports `jax.grad`, `jax.jacfwd`, `jax.jacrev`, `jax.jvp`,
    `jax.vjp` and `jax.hessian` with respect to model parameters, `y0` and `ts`, with the default
    options. Fixed-step solves are differentiated through their `lax.scan` (exactly the
    derivative of the discrete solution); with `checkpoint="auto"` reverse mode stores one state
    per block of ~sqrt(n) steps and recomputes each block once (about one extra forward pass; peak
    memory grows like sqrt(n) instead of n, see docs/performance.md, "Gradient memory";
    `checkpoint=None` is faster when memory is no concern). Adaptive solves with up to 32
    differentiated inputs (parameters, `y0`, `ts` entries) are differentiated by their Jacobian:
    forward mode carries one tangent per input through the solve's own loop (the lean loop for
    explicit pairs and the Rosenbrock loop, diffrax's `ForwardMode` for the others), and the
    tangent J·t is transposed
    for reverse mode and differentiated again for second order, so every order works with the
    step sizes held fixed, as diffrax holds them (experiments/bench/gradients.py measures the
    gradient against diffrax's default `RecursiveCheckpointAdjoint`). Above 32 inputs (a neural
    vector field) reverse mode is a checkpointed reverse pass through the same loop (O(√max_steps)
    checkpoints; diffrax's `RecursiveCheckpointAdjoint` for solves in diffrax's loop), forward
    mode still runs forward, and second order differentiates a bounded loop (see
    `_integrate/loop_derivatives.py`; experiments/bench/hybrid.py measures it).
    `adjoint="checkpoint"` selects diffrax's `RecursiveCheckpointAdjoint` in diffrax's loop,
    reverse mode only; forward mode then raises an error that names `adjoint="auto"`.
    """
    check_model("model", model)
    check_solver("solver", solver)
    moved = getattr(model, "moved_by_time_events", ())
    if moved:
        options = dict(solver=solver, dt=dt, steps_per_save=steps_per_save, max_steps=max_steps)
        options.update(throw=throw, checkpoint=checkpoint, adjoint=adjoint, key=key)
        return _moving_parameters(model, moved, y0, ts, events, dense, options)
    # The host copy of a concrete ts plans the fixed steps: under jit, jnp.asarray of a NumPy
    # array is already a traced value.
    host_ts = ts if is_traced(ts) else np.asarray(ts)
    ts = ts if is_traced(ts) or isinstance(ts, jax.Array) else to_device(host_ts)
    y0 = jax.tree.map(as_state_leaf, as_state(y0))
    dtype = real_dtype(y0)
    if throw:  # with throw=False a non-finite input flags `result` (invalid_input), as under jit
        _check_finite_inputs(model, y0)
    check_ts(host_ts, dtype)
    model = cast_floats(model, dtype)
    times = ts.astype(dtype)
    # the start time for the trace-time checks: taken on the host when ts is concrete (indexing
    # a device array would compile two small programs before the solve's own)
    t0 = times[0] if is_traced(ts) else to_device(np.asarray(host_ts)[0], dtype)
    if isinstance(model, AbstractDDE):  # before the state check, which calls the history
        _check_history(model, y0, t0)
        check_history_values(model, t0)
    once(_check_state, model, y0, t0)
    if _own_events(model):
        y0, events = _with_own_events(model, t0, y0, host_ts, events)
    model = _lift_model(model, t0, y0)

    _check_noise(model, solver, key)
    _check_dense(dense, solver)
    event_list = None if events is None else _prepared_events(events, solver, model, t0, y0)
    if open_end(host_ts):
        _check_open_end(solver, event_list, adjoint)
    if is_empty_span(host_ts):
        solution = _without_steps(ts, y0, event_list, isinstance(events, Event), dtype)
        return _with_dense(solution, constant_piece(y0, times[0])) if dense else solution
    backward = runs_backward(host_ts)
    original, original_t0 = model, t0  # before the backward solve's change of variable
    if isinstance(model, AbstractDDE) and backward:
        raise ValueError("a delay equation integrates forward from its history: ts must increase")
    if backward:  # solved forward in s = -t (see reverse.py)
        check_reversible(model, solver)
        model, host_ts, times, t0 = Reversed(model), -host_ts, -times, -t0
        if event_list is not None:
            event_list = tuple(reversed_event(event) for event in event_list)
    once(solver.check_model, model, t0, y0)
    check_mass_matrix(model, y0, solver)
    check_jacobian_hooks(model, t0, y0)
    check_consistent_start(model, t0, y0, solver)
    request = SolveRequest(
        model=model,
        y0=y0,
        ts=times,
        host_ts=host_ts,
        dtype=dtype,
        events=event_list,
        key=key,
        dt=dt,
        steps_per_save=steps_per_save,
        max_steps=max_steps,
        checkpoint=checkpoint,
        adjoint=adjoint,
        dense=dense,
    )
    solve = solve_dde if isinstance(model, AbstractDDE) else solve_of(solver)
    ys, stats, result, reached, records, pieces = solve(solver, request)
    if pieces is not None and backward:  # the pieces are in s = -t
        pieces = DenseOutput(pieces.knots, pieces.coeffs, pieces.count, direction=-1.0)

    solution = Solution(ts=ts, ys=ys, stats=stats, result=result)
    if records is not None:
        event_time, event_state, event_count = _public_records(
            records, isinstance(events, Event), event_list
        )
        if backward:
            event_time = forward_times(event_time)
        solution = Solution(
            ts=ts,
            ys=ys,
            stats=stats,
            result=result,
            event_time=event_time,
            event_state=event_state,
            event_count=event_count,
            reached=reached,
        )
        solution = _outputs_after_timed_events(solution, event_list, times, dtype)
    solution = _with_dense(solution, pieces)
    if not throw:
        return solution
    resets = event_list is not None and any(e.reset is not None for e in event_list)
    problem = (original, original_t0, y0, resets, len(event_list or ()))
    return raise_if_failed(solution, max_steps, solver, dtype, problem)


def _moving_parameters(model, moved, y0, ts, events, dense, options) -> Solution:
    """The solve of a model whose time-triggered events set parameters (`moved`, an SBML
    model's): those parameters carried through it as states of rate 0 after the model's own
    (a solve changes only its state), and left out of the solution again."""
    if events is not None:
        raise ValueError(
            f"{type(model).__name__}'s time-triggered events set parameters "
            f"({', '.join(moved)}), which the solve carries as states: events of your own "
            "cannot be added to them here: simulate lifted = model.with_states(model."
            "moved_by_time_events) from y0 with those parameters' values appended, with "
            "events=(*lifted.events(t0), *yours)"
        )
    check_state_shape(model, as_state(y0))
    y0 = jnp.asarray(y0)
    lifted = model.with_states(moved)
    solution = simulate(lifted, _carrying(model, moved, y0), ts, dense=dense, **options)
    return _cut_to(solution, y0.shape[0])


@jit  # one program, not one per operation in an eager call
def _carrying(model, moved, y0):
    """`y0` with the parameters `moved` appended, as `model.with_states(moved)` takes it."""
    dtype = real_dtype(y0)
    carried = jnp.stack([jnp.asarray(model.params[name], dtype) for name in moved])
    return jnp.concatenate([y0, carried])


@jit
def _cut_to(solution: Solution, n: int) -> Solution:
    """`solution` of a lifted model with only the first `n` states (the model's own)."""
    cut = lambda tree: jax.tree.map(lambda a: a[..., :n], tree)  # noqa: E731
    dense_output = solution.dense
    if dense_output is not None:
        dense_output = dataclasses.replace(dense_output, coeffs=cut(dense_output.coeffs))
    return dataclasses.replace(
        solution,
        ys=cut(solution.ys),
        event_state=None if solution.event_state is None else cut(solution.event_state),
        dense=dense_output,
    )


def _outputs_after_timed_events(solution, event_list, times, dtype):
    """The solution with its outputs at the time of an event whose condition says it fires
    at a given time (an SBML model's time-triggered events, `outputs_after`) given after
    that event, as SBML and a `ds.Problem`'s changes report them."""
    timed = [i for i, e in enumerate(event_list) if hasattr(e.condition, "outputs_after")]
    if not timed:  # nothing to compute (an eager operation is a program of its own)
        return solution
    events = tuple(event_list[i] for i in timed)
    fired = tuple(solution.event_time[i] for i in timed)
    ys = _after_timed_events(events, fired, times, solution.ys, dtype)
    return eqx.tree_at(lambda s: s.ys, solution, ys)


@jit  # one program, not one per operation in an eager call
def _after_timed_events(events, fired, times, ys, dtype):
    slack = round_off_time(dtype, scale_of_times(times))
    for event, at in zip(events, fired):
        ys = event.condition.outputs_after(times, ys, jnp.ravel(at)[0], slack, event.reset)
    return ys


def _check_history(model, y0, t0) -> None:
    name = type(model).__name__
    try:
        out = eqx.filter_eval_shape(model.history, t0)
    except Exception as error:
        raise _same_kind(
            error, f"{name}'s history failed at t0: {type(error).__name__}: {error}"
        ) from error
    if not _like_state(out, y0):
        raise ValueError(
            f"{name}'s history must return a state like y0 ({describe(y0, True)}), got "
            f"{describe(out, True)}"
        )


def _like_state(out, y0) -> bool:
    """Whether `out` (shapes and dtypes) has the structure, shapes and dtypes of `y0`."""
    return jax.tree.structure(out) == jax.tree.structure(y0) and all(
        (a.shape, a.dtype) == (b.shape, b.dtype)
        for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(y0))
    )


def _with_dense(solution: Solution, pieces) -> Solution:
    return eqx.tree_at(lambda s: s.dense, solution, pieces, is_leaf=lambda x: x is None)


def _check_dense(dense, solver) -> None:
    if not isinstance(dense, bool):
        raise TypeError(f"dense must be True or False, got {dense!r}")
    if dense and solver.stochastic:
        raise NotImplementedError(
            "dense=True: a stochastic solve has no interpolant between its steps (the "
            "Brownian path is only drawn at them); save at the times you need through ts"
        )


def _check_open_end(solver, events, adjoint) -> None:
    """ts[-1] = inf: a solve that only a terminal event ends, in diffsim's own adaptive loop
    (its step sizes grow without a bound to clip them)."""
    if not solver.adaptive or solver.stochastic:
        raise ValueError(
            "ts[-1] is inf (run until a terminal event): only adaptive solvers can step "
            f"towards an open end; {type(solver).__name__} takes fixed steps: give a finite "
            "last time"
        )
    if events is None or not any(event.terminal for event in events):
        raise ValueError(
            "ts[-1] is inf: the solve runs until a terminal event, and none was given (pass "
            "events=ds.Event(condition, terminal=True), or a finite last time)"
        )
    if not solver.runs_own_loop(adjoint):
        raise ValueError(
            f"ts[-1] is inf: {type(solver).__name__} runs in diffrax's loop here, which needs "
            "a finite end; use an explicit pair (ds.Tsit5, ...) or a Rosenbrock method with "
            "adjoint='auto', or a finite last time"
        )


def _without_steps(ts, y0, events, single: bool, dtype) -> Solution:
    """The solution over an empty span (every time of `ts` the same): y0 at each, no step,
    no event."""
    n = ts.shape[0]
    ys = jax.tree.map(lambda y: jnp.broadcast_to(y, (n,) + y.shape), y0)
    zero = jnp.zeros((), jnp.int32)
    stats = {"num_steps": zero, "num_rejected_steps": zero, "num_function_evals": zero}
    solution = Solution(ts=ts, ys=ys, stats=stats, result=zero)
    if events is None:
        return solution
    times, states, counts = _public_records(Records.empty(events, y0, dtype), single, events)
    return Solution(
        ts=ts,
        ys=ys,
        stats=dict(stats, num_events=zero),
        result=zero,
        event_time=times,
        event_state=states,
        event_count=counts,
        reached=jnp.ones(n, bool),
    )


@jit
def _public_records(records, single: bool, events):
    # jitted: eagerly, the indexing that splits the records per event compiles a small program
    # for each piece
    return records.public(single, events)


# --- input preparation (Python, at trace time) ----------------------------------------------


def _check_noise(model, solver, key) -> None:
    """A stochastic model needs a stochastic solver, and a stochastic solver a key."""
    if isinstance(model, AbstractSDE) and not solver.stochastic:
        raise TypeError(
            f"{type(model).__name__} is a stochastic model: solve it with a stochastic solver "
            "(ds.EulerMaruyama() or ds.Milstein()) and a key"
        )
    if key is not None:
        check_key("key", key)
    if solver.stochastic != (key is not None):
        raise ValueError(
            "a stochastic solver needs key=jax.random.key(...) (the Brownian path's seed)"
            if solver.stochastic
            else f"key is the Brownian path of a stochastic solver; {type(solver).__name__} "
            "solves deterministic models: drop key"
        )


def _prepared_events(events, solver, model, t0, y0) -> tuple:
    """The events as a checked tuple, their arrays (a restitution, a level) in the state's
    precision."""
    event_list = as_events(events)
    if not solver.supports_events:
        raise NotImplementedError(
            "events are not supported for stochastic solvers: for a first passage or another "
            "stop condition of a stochastic model, step it with ds.iterate(step, state, key, "
            "stop=...) under jax.vmap"
            if solver.stochastic
            else f"{type(solver).__name__} does not support events"
        )
    event_list = cast_floats(event_list, t0.dtype)
    once(_check_events, event_list, model, t0, y0)
    return tuple(_lift_event(event, t0, y0) for event in event_list)


def _lift_event(event: Event, t0, y0) -> Event:
    """The event with a condition or reset that closes over traced values turned into a pytree
    holding them (`_closure.lift_closure`), so they are differentiated in every solver."""
    event = eqx.tree_at(lambda e: e.condition, event, lift_closure(event.condition, t0, y0))
    if event.reset is None:
        return event
    return eqx.tree_at(lambda e: e.reset, event, lift_closure(event.reset, t0, y0))


def _lift_model(model, t0, y0):
    """An `ODE` or `DDE` whose function (or history) closes over traced values (built inside
    a transformed function) as one of a fixed function whose parameters hold them as leaves
    (`_closure.lift_closure`); any other model unchanged."""
    if type(model) is ODE and closes_over_tracer(model.fn):
        lifted = lift_closure(model.fn, t0, y0, model.params)
        return ODE(_call_lifted, {"fn": lifted, "params": model.params}, model.mass)
    if type(model) is not DDE:
        return model
    if closes_over_tracer(model.fn):
        delayed = tuple(y0 for _ in model.lags)
        lifted = lift_closure(model.fn, t0, y0, delayed, model.params)
        history = model.constant_history if model.history_fn is None else model.history_fn
        params = {"fn": lifted, "params": model.params}
        model = DDE(_call_lifted_delayed, params, delays=model.lags, history=history)
    if model.history_fn is not None and closes_over_tracer(model.history_fn):
        lifted = lift_closure(model.history_fn, t0)
        model = eqx.tree_at(lambda m: m.history_fn, model, lifted)
    return model


def _call_lifted(t, y, params):
    return params["fn"](t, y, params["params"])


def _call_lifted_delayed(t, y, y_delayed, params):
    return params["fn"](t, y, y_delayed, params["params"])


def real_dtype(y0):
    """The real floating dtype of a state (that of its components for a complex one)."""
    leaves = jax.tree.leaves(y0)
    if not leaves:
        raise ValueError("y0 is empty: pass the initial state as an array or a pytree of arrays")
    dtype = jnp.result_type(*leaves)
    return jnp.finfo(dtype).dtype  # the real dtype underlying a complex state


def _check_finite_inputs(model, y0) -> None:
    bad = nonfinite_leaves(model)
    if bad:
        raise ValueError(
            f"model {type(model).__name__} has non-finite parameter(s) {', '.join(bad)}: "
            "every parameter must be a finite number"
        )
    bad = nonfinite_leaves(y0)
    if bad:
        where = "" if bad == ["(the value itself)"] else f" at {', '.join(bad)}"
        raise ValueError(f"y0 holds NaN or inf{where}; the initial state must be finite")


def check_state_shape(model, y0) -> None:
    """y0's shape against the model's state, where the model declares it."""
    expected = model.state_shape()
    if expected is not None and eqx.is_array(y0) and y0.shape != tuple(expected):
        labels = f" ({', '.join(model.state_names)})" if model.state_names else ""
        raise ValueError(
            f"y0 must have shape {tuple(expected)}{labels} for {type(model).__name__}, got "
            f"{y0.shape}"
        )


def _own_events(model) -> tuple[str, ...]:
    """The ids of the events a model's file defines (an SBML model's): what its vector field
    alone would miss."""
    return (*getattr(model, "timed_events", ()), *getattr(model, "triggered_events", ()))


def _with_own_events(model, t0, y0, host_ts, events):
    """(the start, the events) of a solve of a model whose file has events: given no
    events, the start after the events that fire at t0 (`fire_at_start`) and the model's
    events (`model.events`); else y0 as it is (the caller's start: a `ds.Problem`'s
    segment after a change, which fires what the change makes true itself) and `events`,
    which must hold the model's."""
    own = _own_events(model)
    if not is_traced(host_ts) and runs_backward(host_ts):
        raise ValueError(
            f"{type(model).__name__} has events ({', '.join(own)}), which a solve backward "
            "in time does not run: solve it forward"
        )
    if events is None:
        return _fired_at_start(model, t0, y0), model.events(t0)
    _check_own_events_given(model, events, model.events(t0), own)
    return y0, events


def _check_own_events_given(model, events, expected, own) -> None:
    """Events given for a model whose file has events must hold those (the vector field
    alone would miss them)."""
    kinds = lambda found: sorted(type(e.condition).__name__ for e in found)  # noqa: E731
    given = [
        e for e in as_events(events) if type(e.condition) in {type(x.condition) for x in expected}
    ]
    if kinds(given) != kinds(expected):
        raise ValueError(
            f"{type(model).__name__} has events ({', '.join(own)}), and events= does not hold "
            "them: pass events=(*model.events(t0), *yours) (and y0=model.fire_at_start(t0, "
            "y0) for the events that fire at t0), or no events to run the model's own"
        )


@jit
def _fired_at_start(model, t0, y0):
    return model.fire_at_start(t0, y0)


def _check_state(model, y0, t0) -> None:
    name = type(model).__name__
    check_state_shape(model, y0)
    try:
        # a Python number returned (a constant rate) counts as a 0-d array of the state's dtype
        out = eqx.filter_eval_shape(
            lambda m, t, y: jax.tree.map(jnp.asarray, m.vector_field(t, y)), model, t0, y0
        )
    except Exception as error:  # re-raised with the argument named; the cause stays chained
        raise _same_kind(
            error,
            f"y0 does not fit {name}, or its vector_field is broken: it failed on a state of "
            f"shape {describe(y0)}: {type(error).__name__}: {error}"
            + (" (ds.ODE calls fn(t, y, params) in this order)" if name == "ODE" else ""),
        ) from error
    if jax.tree.structure(out) != jax.tree.structure(y0) or any(
        a.shape != b.shape for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(y0))
    ):
        raise ValueError(
            f"y0 does not fit {name}: for a state of shape {describe(y0)} its vector_field "
            f"returns {describe(out)}: y0 must have the model's state shape, and the vector "
            "field must return that shape too (a network's output size, a stacked list)"
        )
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(y0)):
        if a.dtype != b.dtype:
            raise TypeError(
                f"{name}.vector_field returns {a.dtype} for a {b.dtype} state: a constant in the "
                "model has a fixed dtype; build constants from the state (e.g. jnp.asarray(c, "
                "y.dtype)) so results keep the input dtype"
            )


def _same_kind(error: Exception, message: str) -> Exception:
    """`message` as an exception of `error`'s type where that type takes a message (so a
    user's own TypeError stays a TypeError), else as a ValueError."""
    if isinstance(error, KeyError):  # KeyError's text would print in quotes, escaped
        return ModelKeyError(message)
    try:
        return type(error)(message)
    except Exception:
        return ValueError(message)


class ModelKeyError(KeyError):
    """A KeyError raised in a model's function, re-raised naming the model; its text prints
    as written (a plain KeyError quotes and escapes it)."""

    def __str__(self) -> str:
        return str(self.args[0])


def _check_events(events, model, t0, y0) -> None:
    for i, event in enumerate(events):
        where = f"events[{i}]" if len(events) > 1 else "the event"
        try:
            jax.eval_shape(lambda t, y: evaluate(event, t, y, model.vector_field), t0, y0)
        except (TypeError, ValueError) as error:
            raise type(error)(f"{where}: {error}") from None
        if not isinstance(event.condition, RateCondition):
            probe_indices(f"{where}'s condition", event.condition, t0, y0)
        if event.reset is not None:
            probe_indices(f"{where}'s reset", event.reset, t0, y0)
            out = jax.eval_shape(event.reset, t0, y0)
            if not _like_state(out, y0):
                raise ValueError(
                    f"{where}: reset(t, y) must return a state like y ({describe(y0, True)}), "
                    f"got {describe(out, True)}"
                )


# --- failures ----------------------------------------------------------------------------------

_MESSAGES = tuple(code.message for code in RESULTS)


def raise_if_failed(solution: Solution, max_steps: int, solver, dtype, problem=None) -> Solution:
    """Raise `ds.SimulationError` for a failed solve (under jit/vmap, the compiled program's
    error), its text saying what to do; `problem` = (model, t0, y0, whether an event resets,
    the number of events) lets it name a model hook, a delay equation's lag or history, a
    DAE's reset, or two events crossing in one diffrax step that caused the failure."""
    if is_traced(solution.result) or any_traced(solution.ys):
        # Inside jit/vmap/grad: the error is raised by the compiled program when it runs.
        # every output carries the check, so that a caller who reads only the event times
        # (or states) still gets the error
        def outputs(s):
            return (s.ys, s.result, s.event_time, s.event_state, s.dense)

        checked = eqx.branched_error_if(
            outputs(solution),
            solution.result != RESULTS.successful,
            solution.result,
            _MESSAGES,
        )
        return eqx.tree_at(outputs, solution, checked, is_leaf=lambda x: x is None)
    code = RESULTS(int(solution.result))
    if code == RESULTS.successful:
        return solution
    detail, message = "", None
    precision = unresolved_tolerance(solver, dtype)
    if code == RESULTS.nonfinite_state:
        detail = _when_nonfinite(solution)
    elif code == RESULTS.max_steps_reached:
        reached = _when_nonfinite(solution, stopped_early=True)
        detail = f"max_steps={max_steps}" + (f"; {reached}" if reached else "")
        if precision is not None:
            message = (
                f"the adaptive solver reached max_steps before the last output time: {precision}"
            )
        elif np.isinf(float(np.asarray(solution.ts)[-1])):
            message = (
                "the terminal event that closes the open end (ts[-1] = inf) did not happen "
                "within max_steps: check that its condition crosses zero on this trajectory, "
                "or end the span at a finite time"
            )
        elif solver.stiff:  # already a stiff solver: no use suggesting one
            message = (
                "the adaptive solver reached max_steps before the last output time: raise "
                "max_steps or loosen rtol/atol"
                + (" (or compute in float64)" if jnp.finfo(dtype).bits < 64 else "")
            )
    elif precision is not None and code in (
        RESULTS.step_size_collapsed,
        RESULTS.nonlinear_solver_failed,
    ):
        detail = f"Likely cause: {precision}"
    if (
        code == RESULTS.event_failed
        and problem is not None
        and problem[4] > 1
        and solver.adaptive
        and not solver.runs_own_loop("auto")
    ):
        # the likelier cause with several events in diffrax's loop leads the message
        message = (
            "an event could not be tracked: two of the events crossed in one step and diffrax "
            f"(which runs {type(solver).__name__}) located the one listed first, not the "
            "earliest. Give the solver a dtmax shorter than the time between them, or use an "
            "explicit pair (ds.Tsit5, ...) or a Rosenbrock method (ds.Rodas5P, ...), which "
            "locate the earliest. (Otherwise: a condition returned NaN or inf at a finite "
            "state, or jumps without a zero; write it as a continuous signed distance.)"
        )
    if code == RESULTS.step_size_collapsed and solver.stiff:
        message = (
            "the step size fell below dtmin: the solution may blow up (a finite-time "
            "singularity) or the model is not smooth there; lower dtmin or check the model"
        )
    if problem is not None:
        model, t0, y0, resets, _ = problem
        notes = failure_notes(model, solver, t0, y0, solution.ts, solution.ys, max_steps)
        if resets and model.mass_matrix is not None:
            notes += (
                " An event's reset of a model with a mass matrix must return a state that "
                "satisfies its algebraic equations (steps from one that does not fail): build "
                "it with ds.consistent_initial_state(model, y, t) inside the reset."
            )
        notes = notes.strip()
        if notes:
            detail = f"{detail.rstrip('. ')}. {notes}" if detail else notes
    raise SimulationError(code, detail, message)


def _when_nonfinite(solution: Solution, stopped_early: bool = False) -> str:
    finite = np.ones(np.shape(solution.ts), dtype=bool)
    for leaf in jax.tree.leaves(solution.ys):
        leaf = np.asarray(leaf)
        finite &= np.isfinite(leaf).reshape(leaf.shape[0], -1).all(axis=1)
    if solution.reached is not None:  # outputs after a terminal event are NaN by design
        finite |= ~np.asarray(solution.reached)
    if finite.all():
        return ""
    first_bad = int(np.argmin(finite))
    ts = np.asarray(solution.ts)
    # an adaptive solve that stopped early fills the outputs it did not reach with +inf
    unreached = stopped_early and all(
        np.all(np.isposinf(np.asarray(leaf)[first_bad:])) for leaf in jax.tree.leaves(solution.ys)
    )
    if unreached:
        return f"The outputs from t={ts[first_bad]:.6g} on were not reached"
    return (
        f"The solution is finite up to t={ts[first_bad - 1]:.6g} and not at the next output "
        f"time t={ts[first_bad]:.6g}"
    )
