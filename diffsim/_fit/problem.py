"""The least-squares problem behind `ds.fit`: unknowns, transforms, residuals, shooting windows.

The unknowns form one flat vector: the fitted parameter entries, then the fitted initial-state
components, then (multiple shooting) the states at the window starts. The optimiser works in
unconstrained coordinates `u`; bounds map them to natural values `p` (log for one bound, logit
for two), and every reported number is in natural units.
"""

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._events import Event
from .._integrate.loop_derivatives import JACOBIAN_INPUTS
from .._integrate.simulate import simulate
from .._integrate.steady_state import steady_state
from .._integrate.time_grid import plan_fixed_steps
from .._model import AbstractODE
from .._parameter import parameter_constraints
from .._paths import get, path_of

IDENTITY, LOWER, UPPER, BOTH = "identity", "log", "upper-log", "logit"


@dataclasses.dataclass(frozen=True)
class Layout:
    """Static description of the unknowns (hashable: part of the compiled program's key)."""

    names: tuple[str, ...]  # one per entry
    fields: tuple[tuple[str, tuple[int, ...]], ...]  # fitted parameter fields and shapes
    y0_indices: tuple[int, ...]  # fitted components of the flattened initial state
    kinds: tuple[str, ...]  # transform per entry
    num_nodes: int = 0  # multiple shooting: extra state entries (unconstrained)

    @property
    def num_fitted(self) -> int:
        return len(self.names)

    @property
    def size(self) -> int:
        return len(self.names) + self.num_nodes


def to_natural(u, lower, upper, kinds):
    """Unconstrained `u` → natural `p` (entry-wise by `kinds`; `lower`/`upper` are finite
    placeholders where a kind does not use them, so no inf meets a derivative)."""
    kinds = np.asarray(kinds + (IDENTITY,) * (u.shape[-1] - len(kinds)))
    lower, upper = _pad(lower, u), _pad(upper, u)
    # Bounds hold strictly in floating point: u is held where the distance to the bound it
    # approaches would fall below the bound's own rounding (a data set that pulls an unknown
    # beyond its bound drives u towards infinity). Beyond that the unknown stops moving.
    info = jnp.finfo(u.dtype)
    near = jnp.log(info.eps) + 2.0
    one_sided = jnp.log(
        jnp.maximum(info.eps * jnp.abs(jnp.where(kinds == UPPER, upper, lower)), info.tiny)
    )
    u_one = jnp.maximum(u, one_sided + 2.0)
    u_two = jnp.clip(u, near, -near)
    return jnp.select(
        [kinds == LOWER, kinds == UPPER, kinds == BOTH],
        [
            lower + jnp.exp(u_one),
            upper - jnp.exp(u_one),
            lower + (upper - lower) * jax.nn.sigmoid(u_two),
        ],
        u,
    )


def to_unconstrained(p, lower, upper, kinds):
    """Natural `p` → unconstrained `u` (inverse of `to_natural`)."""
    kinds = np.asarray(kinds + (IDENTITY,) * (p.shape[-1] - len(kinds)))
    lower, upper = _pad(lower, p), _pad(upper, p)
    safe = lambda ok, x: jnp.where(ok, x, 1.0)  # noqa: E731
    fraction = (p - lower) / (upper - lower)
    return jnp.select(
        [kinds == LOWER, kinds == UPPER, kinds == BOTH],
        [
            jnp.log(safe(kinds == LOWER, p - lower)),
            jnp.log(safe(kinds == UPPER, upper - p)),
            jnp.log(safe(kinds == BOTH, fraction)) - jnp.log(safe(kinds == BOTH, 1 - fraction)),
        ],
        p,
    )


def _pad(bound, like):
    extra = like.shape[-1] - bound.shape[-1]
    return bound if extra == 0 else jnp.concatenate([bound, jnp.zeros(extra, bound.dtype)])


class Problem(eqx.Module):
    """Everything a residual evaluation needs; arrays are traced, the rest is static."""

    model: AbstractODE
    y0: jax.Array  # the whole initial state, flattened (the guess for fitted components)
    lower: jax.Array  # (num_fitted,) natural-scale bounds (placeholders where unused)
    upper: jax.Array
    values: jax.Array  # (times, observables); missing values replaced by 1
    scale: jax.Array  # (times, observables): 1/noise or sqrt(weight), 0 where missing
    continuity: jax.Array  # (state,): weight of the multiple-shooting defects per component
    solver: Any
    layout: Layout = eqx.field(static=True)
    ts: tuple[float, ...] = eqx.field(static=True)  # simulation times (t0 first)
    first_observed: int = eqx.field(static=True)  # index in ts of the first observation time
    y0_shape: tuple[int, ...] = eqx.field(static=True)
    observe: Callable | None = eqx.field(static=True)
    log_loss: bool = eqx.field(static=True)
    dt: float | None = eqx.field(static=True)
    max_steps: int = eqx.field(static=True)
    events: Any  # ds.Event(s), or a function model -> events, or None
    windows: tuple[tuple[int, int], ...] = eqx.field(static=True)  # (start, end) indices in ts
    batched: bool = eqx.field(static=True)  # windows share a relative grid: one vmapped solve
    steps_per_save: int | None = eqx.field(static=True)  # fixed-step solver, batched windows
    # Only forward-mode derivatives are taken (least squares with a forward Jacobian): adaptive
    # solves then use diffrax.ForwardMode, whose loop is leaner than the any-order default.
    forward_only: bool = eqx.field(static=True, default=False)
    # start each simulation from the steady state of the model (True) or of the model a
    # function returns (the pre-stimulus condition), y0 the state it equilibrates from
    pre_equilibrate: Any = eqx.field(static=True, default=False)

    def natural(self, u):
        return to_natural(u, self.lower, self.upper, self.layout.kinds)

    def unconstrained(self, p):
        return to_unconstrained(p, self.lower, self.upper, self.layout.kinds)

    def assemble(self, p):
        """Natural unknowns → (model, flat y0, window-start states of shape (windows-1, n))."""
        layout = self.layout
        model, offset = self.model, 0
        for name, shape in layout.fields:
            size = math.prod(shape)
            value = p[offset : offset + size].reshape(shape)
            path = path_of(self.model, name)
            model = eqx.tree_at(lambda m, path=path: get(m, path), model, value)
            offset += size
        y0 = self.y0
        if layout.y0_indices:
            count = len(layout.y0_indices)
            y0 = y0.at[np.asarray(layout.y0_indices)].set(p[offset : offset + count])
            offset += count
        nodes = p[offset:].reshape(-1, self.y0.shape[0])
        return model, y0, nodes

    def states(self, model, y0, nodes):
        """States at every simulation time, shape (times, n), and the defects between each
        window's end and the next window's start, shape (windows-1, n)."""
        if self.pre_equilibrate is not False:
            y0 = self._equilibrium(model, y0)
        starts = jnp.concatenate([y0[None], nodes])
        if len(self.windows) == 1:
            return self._solve(model, y0, np.asarray(self.ts)), starts[:0]
        if self.batched:
            ends = self._solve_windows_batched(model, starts)
        else:
            ends = [
                self._solve(model, start, np.asarray(self.ts[a : b + 1]))
                for start, (a, b) in zip(starts, self.windows)
            ]
        pieces = [trajectory[:-1] for trajectory in ends] + [ends[-1][-1:]]
        defects = jnp.stack([trajectory[-1] for trajectory in ends[:-1]]) - nodes
        return jnp.concatenate(pieces), defects

    def _solve(self, model, y0, ts, *, steps_per_save=None):
        dt = None if steps_per_save is not None else self.dt
        options = {}
        # The default adjoint takes forward-mode derivatives of up to JACOBIAN_INPUTS inputs
        # through the solve's own loop; beyond that it prepares for a reverse pass (a primal
        # solve, then the tangent's), which ForwardMode's one pass beats when only forward
        # mode is asked for
        many = self.layout.size > JACOBIAN_INPUTS
        if self.forward_only and self.solver.adaptive and many:
            options["adjoint"] = diffrax.ForwardMode()
        solution = simulate(
            model,
            y0.reshape(self.y0_shape),
            ts,
            solver=self.solver,
            dt=dt,
            steps_per_save=steps_per_save,
            max_steps=self.max_steps,
            throw=False,
            events=self._events(model),
            **options,
        )
        ys = solution.ys.reshape(solution.ys.shape[0], -1)
        return jnp.where(solution.succeeded, ys, jnp.nan)

    def _equilibrium(self, model, y0):
        """The steady state the first simulation starts from (`pre_equilibrate`), flat; NaN
        where none is found, so the residuals say the fit failed there."""
        base = model if self.pre_equilibrate is True else self.pre_equilibrate(model)
        state = steady_state(base, y0.reshape(self.y0_shape), t0=self.ts[0], throw=False)
        return jnp.where(state.succeeded, state.y.reshape(-1), jnp.nan)

    def _events(self, model):
        if callable(self.events) and not isinstance(self.events, Event):
            return self.events(model)
        return self.events

    def _solve_windows_batched(self, model, starts):
        a0, b0 = self.windows[0]
        relative = np.asarray(self.ts[a0 : b0 + 1]) - self.ts[a0]
        offsets = np.asarray([self.ts[a] for a, _ in self.windows])
        times = jnp.asarray(offsets[:, None] + relative[None, :], starts.dtype)
        solve = lambda y, ts: self._solve(model, y, ts, steps_per_save=self.steps_per_save)  # noqa: E731
        batched = jax.vmap(solve)(starts, times)
        return [batched[k] for k in range(len(self.windows))]

    def observed(self, states):
        """Model predictions of the data, shape (times, observables)."""
        states = states[self.first_observed :]
        if self.observe is None:
            return states.reshape(states.shape[0], -1)
        predict = jax.vmap(lambda y: jnp.ravel(jnp.asarray(self.observe(y.reshape(self.y0_shape)))))
        return predict(states)

    def data_residuals(self, predictions):
        if self.log_loss:
            positive = predictions > 0
            logs = jnp.log(jnp.where(positive, predictions, 1.0))
            difference = jnp.where(positive, logs, jnp.nan) - jnp.log(self.values)
        else:
            difference = predictions - self.values
        return jnp.where(self.scale > 0, difference * self.scale, 0.0)

    @property
    def num_residuals(self) -> int:
        """The length of `residuals`: the data values, then the shooting defects."""
        return math.prod(self.values.shape) + (len(self.windows) - 1) * self.y0.shape[0]

    def residuals(self, p):
        """Weighted residuals of the data, then the scaled multiple-shooting defects; flat."""
        model, y0, nodes = self.assemble(p)
        states, defects = self.states(model, y0, nodes)
        data = self.data_residuals(self.observed(states)).ravel()
        weighted = defects * self.continuity[None]  # (windows - 1, n) by (n,): broadcast explicitly
        return jnp.concatenate([data, weighted.ravel()])


def windows(num_times: int, segments: int) -> tuple[tuple[int, int], ...]:
    """Split simulation indices 0..num_times-1 into `segments` windows sharing their ends."""
    intervals = num_times - 1
    if segments > intervals:
        raise ValueError(
            f"segments={segments} but the data have only {intervals} intervals between times "
            f"(t0 and the observations): use at most {intervals} segments"
        )
    cuts = np.round(np.linspace(0, intervals, segments + 1)).astype(int)
    return tuple((int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:]))


def batchable_windows(ts, spans, solver, dt) -> tuple[bool, int | None]:
    """Whether the shooting windows share one relative time grid (then they are solved in one
    vmapped solve), and the static steps per output interval a fixed-step solver then needs."""
    grids = [np.asarray(ts[a : b + 1]) - ts[a] for a, b in spans]
    first = grids[0]
    if not all(g.shape == first.shape and np.allclose(g, first, rtol=1e-9, atol=0) for g in grids):
        return False, None
    if not solver.needs_dt:
        return True, None
    plan = plan_fixed_steps(grids[0], dt, None, type(solver).__name__)
    if plan.steps is not None:  # unequal counts per interval: solve the windows one by one
        return False, None
    return True, plan.steps_per_save


def parameter_bounds(model, name, bounds) -> tuple[float, float]:
    """The bounds of a fitted field: the user's, else those its `ds.parameter` declares."""
    if name in bounds:
        low, high = bounds[name]
        return (-np.inf if low is None else float(low), np.inf if high is None else float(high))
    field = next((f for f in dataclasses.fields(model) if f.name == name), None)
    if field is None:  # a path (a params-dict entry, a nested field): nothing declared
        return -np.inf, np.inf
    constraint = parameter_constraints(field) or {}
    if constraint.get("positive") or constraint.get("nonnegative"):
        return 0.0, np.inf
    return -np.inf, np.inf


def kind_of(low: float, high: float) -> str:
    if np.isfinite(low) and np.isfinite(high):
        return BOTH
    if np.isfinite(low):
        return LOWER
    if np.isfinite(high):
        return UPPER
    return IDENTITY
