"""`ds.Event`: something that happens when a scalar function of the state crosses zero.

This module holds the event description and the rules shared by the fixed-step and the adaptive
event loops (`_integrate/event_loop.py`, `_integrate/adaptive.py`): which sign changes count as
a crossing, how a state just after an event is kept from firing the same event again, what a
firing does (`EventTable`), and the per-event records a `Solution` reports.
"""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._results import RESULTS
from ._validate import all_finite, is_count


class Event(eqx.Module):
    """An event of `ds.simulate(..., events=...)`: `condition(t, y)` crosses zero.

    **Arguments:**

    - `condition(t, y) -> scalar`: a float that changes sign at the event (e.g. the height of a
      ball, `lambda t, y: y[0]`). It may be an `equinox.Module` holding arrays (they are traced
      and differentiated like model parameters) or a closure. A boolean condition (`y[0] >
      level`) is an event where it flips (as +1 / -1; `direction=+1` from False to True),
      located by bisection on the dense output; its event time carries no derivative (a jump
      has no slope to follow), and the solves diffrax runs cannot locate it
      (`ds.RESULTS.event_failed`): write a signed distance (`y[0] - level`) for those.
    - `direction`: `-1` fires only when the condition goes from positive to zero or negative
      (falling), `+1` only from negative to zero or positive (rising), `0` (default) both.
    - `terminal`: stop the trajectory at the event. Default: True without `reset`, False with one.
    - `reset(t, y) -> y`: the state the integration restarts from at the event time (a bounce,
      an impact, a switch); same structure, shapes and dtypes as `y`.
    - `max_events`: static number of occurrences recorded (and, with `reset`, allowed: one more
      crossing stops the trajectory with `ds.RESULTS.event_limit_reached`). A terminal event
      stops the trajectory at its `max_events`-th occurrence (default the first; scipy's
      `terminal=n`), the earlier ones recorded. A non-terminal event without reset only records
      its first `max_events` crossings (a Poincaré section, say); its state is not changed,
      though a fixed-step solver splits the step at the event (a step to the event time, then
      the rest of the step), which moves the solution by the method's truncation error of the
      shorter steps.

    The crossing is detected from the sign of `condition` at the ends of each step and located
    inside the step by root finding on the solver's interpolant (fixed-step solvers: the cubic
    Hermite interpolant through both step ends; adaptive solvers: the method's dense output), so
    the event time is accurate to the solver's order, not to the step. The event time is a
    differentiable function of the parameters and initial state (implicit function theorem), so
    `jax.grad` flows through impacts.
    """

    condition: Callable
    reset: Callable | None
    direction: int = eqx.field(static=True)
    terminal: bool = eqx.field(static=True)
    max_events: int = eqx.field(static=True)

    def __init__(
        self,
        condition: Callable,
        *,
        direction: int = 0,
        terminal: bool | None = None,
        reset: Callable | None = None,
        max_events: int = 1,
    ):
        if not callable(condition):
            raise TypeError(
                f"Event: condition must be callable as condition(t, y), got {condition!r}"
            )
        if reset is not None and not callable(reset):
            raise TypeError(f"Event: reset must be callable as reset(t, y) -> y, got {reset!r}")
        if direction not in (-1, 0, 1) or isinstance(direction, bool):
            raise ValueError(
                f"Event: direction must be -1 (falling), 0 (either way) or +1 (rising), "
                f"got {direction!r}"
            )
        if terminal is not None and not isinstance(terminal, (bool, np.bool_)):
            raise TypeError(
                f"Event: terminal must be True or False, got {terminal!r}; to stop at the n-th "
                "occurrence pass terminal=True, max_events=n"
            )
        if terminal is None:
            terminal = reset is None
        if terminal and reset is not None:
            raise ValueError(
                "Event: a terminal event stops the trajectory, so it cannot also reset it; pass "
                "terminal=False (the default with reset) to restart from reset(t, y)"
            )
        if not is_count(max_events) or max_events < 1:
            raise ValueError(f"Event: max_events must be an int >= 1, got {max_events!r}")
        self.condition = condition
        self.reset = reset
        self.direction = int(direction)
        self.terminal = bool(terminal)
        self.max_events = int(max_events)


def as_events(events) -> tuple[Event, ...]:
    """`events` as a tuple (a single `Event` or a sequence of them)."""
    single = isinstance(events, Event)
    if not single and not isinstance(events, (tuple, list)):
        hint = " (wrap a condition: ds.Event(condition, ...))" if callable(events) else ""
        raise TypeError(
            f"events must be a ds.Event or a tuple of them, got {type(events).__name__}{hint}"
        )
    items = (events,) if single else tuple(events)
    if not items:
        raise ValueError("events is empty: pass a ds.Event or a tuple of them")
    for i, event in enumerate(items):
        if not isinstance(event, Event):
            raise TypeError(
                f"events[{i}] must be a ds.Event(condition, ...), got {type(event).__name__}"
            )
    return items


class RateCondition(eqx.Module):
    """A condition that reads the solution's rate dy/dt as well, `condition(t, y, dydt)`
    (internal: `ds.steady_state` of a delay equation, whose dy/dt depends on the past, which
    only the loop knows). The loops pass the rate from the field they step with."""

    def __call__(self, t, y, dydt):
        raise NotImplementedError


def evaluate(event: Event, t, y, field=None):
    """The condition's value as a scalar of the time's dtype (checked shape); `field(t, y)` is
    the vector field the solve steps with (a `RateCondition` reads it)."""
    if isinstance(event.condition, RateCondition):
        if field is None:
            raise NotImplementedError(
                "a condition on dy/dt is only evaluated in diffsim's own adaptive loop"
            )
        value = jnp.asarray(event.condition(t, y, field(t, y)))
    else:
        value = jnp.asarray(event.condition(t, y))
    if value.shape != ():
        raise ValueError(
            f"an event condition must return a scalar, got shape {value.shape}; e.g. "
            "condition = lambda t, y: y[0] for the first component"
        )
    if value.dtype == jnp.bool_:
        # a discrete condition: +1 while it holds, -1 while not, so it crosses when it flips
        # (direction=+1: from False to True); the flip is bracketed on the dense output
        return jnp.where(value, 1, -1).astype(jnp.result_type(t))
    if not jnp.issubdtype(value.dtype, jnp.floating):
        raise TypeError(
            f"an event condition must return a float that crosses zero (or a bool), got "
            f"{value.dtype}; e.g. y[0] - level, or y[0] > level"
        )
    return value.astype(jnp.result_type(t))


def crossed(event: Event, before, after):
    """Whether a change of the condition from `before` to `after` counts as this event: the
    sign rule of diffrax's event detection, so that fixed-step and adaptive solvers fire alike
    (falling: from > 0 to <= 0; rising: from <= 0 to > 0; either: the sign changes). Values of
    exactly zero at t0 and after an event are first moved off zero (`start_value`,
    `restart_value`)."""
    # a NaN is no crossing (the loops flag a condition that stops being finite)
    finite = jnp.isfinite(before) & jnp.isfinite(after)
    before, after = jnp.sign(before), jnp.sign(after)
    if event.direction < 0:
        return finite & (before > 0) & (after <= 0)
    if event.direction > 0:
        return finite & (before <= 0) & (after > 0)
    return finite & (before != after)


def start_value(event: Event, model, t, y, time_scale):
    """The condition at t0, as the first crossing test sees it. A condition on zero at t0 (up
    to round-off) is taken to come from the side opposite to where the flow carries it, so a
    trajectory that leaves zero in the event's direction fires at t0 (a ball released at the
    floor with a downward speed bounces at once)."""
    return _off_zero(event, model, t, y, time_scale, heading=-1)


def restart_value(event: Event, model, t, y, time_scale):
    """The condition at a state an event has just produced, as the next crossing test sees it.

    After an event the state sits on the zero of its condition up to the root finder's
    round-off, on either side of it. A value within that round-off is replaced by a tiny number
    with the sign of the condition's rate along the flow (where the trajectory is heading), so a
    bounce does not fire again at once and a genuine later crossing still does.
    """
    return _off_zero(event, model, t, y, time_scale, heading=1)


def _off_zero(event, model, t, y, time_scale, *, heading: int):
    value, rate = jax.jvp(
        lambda s: evaluate(event, s, _flow(model, s, y, t), model.vector_field),
        (t,),
        (jnp.ones_like(t),),
    )
    slack = jnp.abs(rate) * round_off_time(value.dtype, time_scale)
    return jnp.where(jnp.abs(value) <= slack, heading * jnp.sign(rate) * slack, value)


def round_off_time(dtype, time_scale):
    """The time within which a condition's value is its zero's round-off: 64 ulp of the
    solve's times (`restart_value` moves a value within its rate times this off zero, and
    the root finder sees the start value over twice this)."""
    return 64 * jnp.finfo(dtype).eps * time_scale


def _flow(model, s, y, t):
    """y moved along the vector field by s − t (first order): only its derivative in s at s = t
    is used, to get the condition's rate of change."""
    f = model.vector_field(t, y)
    return jax.tree.map(lambda a, b: a + (s - t) * b, y, f)


class Records(eqx.Module):
    """Per event: when and where it happened (`max_events` slots, inf / NaN when unused) and
    how often."""

    times: tuple
    states: tuple
    counts: Any

    @staticmethod
    def empty(events, y0, dtype):
        times = tuple(jnp.full(e.max_events, jnp.inf, dtype) for e in events)
        states = tuple(
            jax.tree.map(lambda x: jnp.full((e.max_events,) + x.shape, jnp.nan, x.dtype), y0)
            for e in events
        )
        return Records(times, states, jnp.zeros(len(events), jnp.int32))

    def add(self, which, fired, t, y, events):
        """Record the occurrence of event `which` at (t, y) when `fired`; slots beyond
        `max_events` are not written."""
        times, states = [], []
        for i, event in enumerate(events):
            slot = self.counts[i]
            write = fired & (which == i) & (slot < event.max_events)
            index = jnp.minimum(slot, event.max_events - 1)
            times.append(self.times[i].at[index].set(jnp.where(write, t, self.times[i][index])))
            states.append(
                jax.tree.map(
                    lambda buf, x: buf.at[index].set(jnp.where(write, x, buf[index])),
                    self.states[i],
                    y,
                )
            )
        counts = self.counts + (fired & (jnp.arange(len(events), dtype=jnp.int32) == which)).astype(
            jnp.int32
        )
        return Records(tuple(times), tuple(states), counts)

    def public(self, single: bool, events):
        """(event_time, event_state, event_count) in the form `Solution` reports: for a single
        event arrays (scalars when `max_events` is 1), for several a tuple of them."""

        def squeeze(i):
            if events[i].max_events == 1:
                return self.times[i][0], jax.tree.map(lambda s: s[0], self.states[i])
            return self.times[i], self.states[i]

        parts = [squeeze(i) for i in range(len(events))]
        times = tuple(p[0] for p in parts)
        states = tuple(p[1] for p in parts)
        counts = tuple(self.counts[i] for i in range(len(events)))
        if single:
            return times[0], states[0], counts[0]
        return times, states, counts


def restarts(events) -> int:
    """How often the integration can restart after an event: every occurrence of every event
    that does not stop it, and those of a terminal event before its last (static; it sets the
    bounds of both event loops)."""
    return sum(e.max_events - 1 if e.terminal else e.max_events for e in events)


class EventTable(eqx.Module):
    """The rules both event loops of `simulate` (fixed-step and adaptive) follow, so that the
    two fire, stop, reset and count alike: which events are watched, what a firing does, when a
    reset event is past its limit, the values the next crossing test starts from, and how many
    times the integration can restart.

    Built once per solve from the (static) events; the flags are arrays so that the loops
    index them with the traced number of the event that fired."""

    events: tuple  # the ds.Event modules (their callables are static, their arrays traced)
    terminal: Any  # bool (n,): the event stops the trajectory
    resets: Any  # bool (n,): the event has a reset
    limits: Any  # int32 (n,): max_events

    def __init__(self, events: tuple):
        self.events = tuple(events)
        self.terminal = jnp.array([e.terminal for e in self.events])
        self.resets = jnp.array([e.reset is not None for e in self.events])
        self.limits = jnp.array([e.max_events for e in self.events], jnp.int32)

    @property
    def restarts(self) -> int:
        return restarts(self.events)

    @property
    def any_reset(self) -> bool:
        return any(e.reset is not None for e in self.events)

    def start(self, model, t0, y0, time_scale):
        """The condition values the first crossing test starts from, and the result code: a
        condition that is not finite at t0 can never be tracked (`RESULTS.event_failed`)."""
        g0 = tuple(start_value(e, model, t0, y0, time_scale) for e in self.events)
        untracked = ~jnp.all(jnp.isfinite(jnp.stack(g0)))
        code = jnp.where(untracked, RESULTS.event_failed, RESULTS.successful).astype(jnp.int32)
        return g0, untracked, code

    def watched(self, counts):
        """bool (n,): events still looked for. A recording-only event stops being watched once
        its slots are full; terminal and reset events always are (a reset past its limit stops
        the trajectory)."""
        return self.terminal | self.resets | (counts < self.limits)

    def over_limit(self, fired, which, counts):
        """A reset event that fired once more than `max_events` allows: the trajectory stops
        there (`RESULTS.event_limit_reached`) instead of being reset."""
        return fired & self.resets[which] & (counts[which] >= self.limits[which])

    def stops(self, fired, which, counts, over_limit):
        """Whether the firing of event `which` ends the trajectory (`counts`: the occurrences
        before this one): a terminal event at its `max_events`-th occurrence."""
        last = counts[which] + 1 >= self.limits[which]
        return fired & ((self.terminal[which] & last) | over_limit)

    def after(self, which, apply, t, y):
        """The state the integration continues from after event `which` at (t, y): its reset
        where `apply` (a firing within the limit), else y unchanged."""
        y_next = y
        for i, event in enumerate(self.events):
            if event.reset is not None:
                y_next = jax.tree.map(
                    lambda a, b: jnp.where(apply & (which == i), a, b), event.reset(t, y), y_next
                )
        return y_next

    def restart(self, model, t, y, time_scale):
        """The condition values the next crossing test starts from after an event."""
        return tuple(restart_value(e, model, t, y, time_scale) for e in self.events)

    def lost(self, g, y):
        """A condition that turned NaN or inf where the state is finite: its crossings cannot
        be found any more, so the member stops there (`RESULTS.event_failed`) rather than run
        on as if it had none."""
        return ~jnp.all(jnp.isfinite(jnp.stack(g))) & all_finite(y)

    def code(self, code, over_limit, lost):
        """The result code after an event step: limits, then lost conditions."""
        code = jnp.where(over_limit, RESULTS.event_limit_reached, code)
        return jnp.where(lost, RESULTS.event_failed, code).astype(jnp.int32)
