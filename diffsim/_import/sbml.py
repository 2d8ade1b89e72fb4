"""`ds.sbml.load`: an SBML model (levels 2 and 3) as a diffsim model.

The file is read by python-libsbml; its mathematics become SymPy expressions node by node and
JAX functions by walking those (`expressions.py`): nothing in the file is evaluated as Python.
What is read:

- compartments (constant sizes; one that time-triggered events resize is a state of rate 0,
  the species in concentration in it keeping their amounts across the event), species (in
  concentration or, with `hasOnlySubstanceUnits`, amount; boundary and constant species keep
  their value; initial values converted with the compartment's size in the model solved),
  parameters; initial assignments of parameters,
  compartments and stoichiometries (their values from the other parameters, computed as
  assignment rules are); reaction and species reference ids in the mathematics;
- reactions with their kinetic laws (local parameters substituted) and constant
  stoichiometries: d[S]/dt = Σ stoichiometry · rate / volume of S's compartment (a species in
  amount units without the division);
- assignment rules (evaluated in dependency order wherever a value is needed), rate rules (their
  variable becomes a state), initial assignments, function definitions, `piecewise` (as
  `jnp.where`), the csymbol time; a comparison of time with a value of the parameters (a step
  input) also reads a flag that `model.changes()` sets, so that the solver stops there and
  each side is integrated with its own vector field (`_on_flags`);
- time-triggered events (`time >= c`, c from the parameters) with assignments to species,
  compartments and parameters: `ds.simulate` runs them itself (`model.time_events`, as
  `ds.Event`s at t = c; the parameters they set carried through the solve as states,
  `model.with_states`); a `ds.Problem` makes them each experiment's changes at given
  times (`model.with_events_as_changes`, from `model.changes()`), so the solver stops at
  each and the state jumps exactly (`ds.petab.load` likewise, an event at a period's start
  acting after its conditions);
- events triggered by the state (a comparison of two values of the state, parameters and
  time) with assignments to species, compartments and parameters (which become states of
  rate 0): `ds.simulate` and `ds.Problem` run them (`model.state_events()`, as
  `ds.Event`s), and `model.fire_on_jump` fires those a jump makes true.

What is not, refused when the file is loaded with the element's id: triggers of other
forms (and, or, ==), events with delays, priorities of events triggered by the state or that
are not constant numbers (time-triggered events of one instant act in their priorities'
order, `SBMLModel.act_at_once`), level-3 packages a file requires,
algebraic rules, fast reactions, variable stoichiometry, compartments that rules change,
conversion factors, an id `time`; and any file libsbml's consistency checks find invalid.

The model's parameters (`model.params`, a dict by SBML id: every parameter and compartment
size) are traced like any model's fields: `ds.Problem` estimates them by name.
"""

import copy
import dataclasses
import itertools
import math
import numbers
import re
import weakref
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._compile import jit
from .._events import Event
from .._model import AbstractODE
from .._validate import is_traced, user_path
from .._warn import warn
from .expressions import (
    as_number,
    compile_expression,
    ExpressionError,
    from_ast,
    sympy,
    TIME_NAME,
    time_symbol,
)


class SBMLError(ValueError):
    """An SBML file that cannot be read, or that uses a feature diffsim does not support (the
    message names the file and the element)."""


@dataclasses.dataclass(frozen=True, eq=False)
class _Structure:
    """What a model file defines, compiled (static: hashed by identity)."""

    source: str
    states: tuple[str, ...]  # ids of the state variables, in the state vector's order
    rates: tuple[Callable, ...]  # per state: env -> its rate of change
    rules: tuple[tuple[str, Callable], ...]  # assignment rules, in dependency order
    initial: tuple[tuple[str, Callable], ...]  # initial assignments, in dependency order
    # state id -> (its value in the file, "times"/"over"/None: multiplied or divided by its
    # compartment's size, that compartment), or None where an initial assignment sets it
    initial_values: dict
    expressions: dict  # id -> the SymPy expression of each rule and rate (for observables)
    # time-triggered events: (id, env -> trigger time, fires when true at t0, assignments
    # ((variable, env -> value, its SymPy expression), ...), the ids the time reads, whether
    # the trigger is strict, time > c, its priority (a number, or None), whether its values
    # are those at the trigger (SBML's useValuesFromTriggerTime))
    events: tuple = ()
    # the order in which time-triggered events of one instant act: by priority, highest
    # first, then those without one, each set in the file's order (SBML)
    timed_order: tuple = ()
    # events triggered by the state, those of one trigger together: (their ids, env -> a
    # value that crosses zero rising where the trigger becomes true, fires when true at t0,
    # assignments as `events`' (to states only))
    state_events: tuple = ()
    # switches on time (a piecewise's `time >= c`, c from the parameters): (the flag's name,
    # env -> c, the ids c reads); see `_on_flags`
    switches: tuple = ()
    # values given by expressions of the parameters (PEtab v2 conditions): (id, (env -> value,
    # ...)): the id takes the k-th when the parameter `choose:<id>` is k (0: its own value)
    choices: tuple = ()


# the structures of `SBMLModel.with_states`, by structure and the names made states: made
# once, since a structure is static, hashed by identity (a new one would compile a new solve)
_LIFTED: "weakref.WeakKeyDictionary[_Structure, dict]" = weakref.WeakKeyDictionary()


# how many times each event triggered by the state may fire in one solve (`state_events`):
# a static size of the records the solve keeps
EVENT_LIMIT = 64


def _at_rest(env):
    """The rate of a parameter carried as a state (`SBMLModel.with_states`)."""
    return 0.0


# A solve traces its model's field many times (each stage of a Rosenbrock step, its Jacobian,
# a steady state's event and Newton iteration: 30 times for Zheng's log-likelihood), and the
# generated code of a large model binds its operations one by one (Zheng's 15 species: 0.14 s
# a trace). Under `jit` it is traced once per model structure and argument types, and each
# later call reuses the jaxpr (transformed where differentiated or batched): Zheng's
# log-likelihood traced in 1.9 s instead of 4.0 s, compiled in 9.0 s instead of 11.1 s.
@jit
def _vector_field(model, t, y):
    env = model.environment(t, y, model.params)
    dtype = jnp.result_type(y)
    if not model.structure.rates:  # a model of constant parameters alone
        return jnp.zeros((0,), dtype)
    return jnp.stack([jnp.asarray(rate(env), dtype) for rate in model.structure.rates])


class SBMLModel(AbstractODE):
    """A model read from an SBML file by `ds.sbml.load`.

    - `params`: dict SBML id → value of every parameter and compartment size (traced: change
      them with `eqx.tree_at`, estimate them by name in a `ds.Problem`).
    - `state_names`: the ids of the state variables (species, and variables of rate rules).
    - `initial_state(values=None)`: the initial state, from the file's initial values and
      initial assignments; `values` (dict id → number) overrides parameters before the
      assignments and species' initial values after them (PEtab's condition table).
    - `value(name, t, y)`: any symbol's value at (t, y): a state, a parameter, or the variable
      of an assignment rule.
    """

    params: dict
    structure: _Structure = eqx.field(static=True)

    parameters_field: ClassVar[str | None] = "params"

    @property
    def state_names(self) -> tuple[str, ...]:  # type: ignore[override]
        return self.structure.states

    def vector_field(self, t, y, args=None):
        return _vector_field(self, jnp.asarray(t), y)

    def environment(self, t, y, params: Mapping) -> dict:
        """Every symbol's value at (t, y) with the parameters `params` (a dict by id, which may
        hold more names than the model's): the states, the assignment rules and `params`."""
        env = self.chosen(params)
        env["time"] = t
        for i, name in enumerate(self.structure.states):
            env[name] = y[i]
        for name, rule in self.structure.rules:
            env[name] = rule(env)
        return env

    def value(self, name: str, t, y):
        env = self.environment(t, y, self.params)
        if name not in env:
            raise KeyError(f"{name!r} is not a symbol of the model from {self.structure.source}")
        return env[name]

    def with_choices(self, choices: Mapping, reads=()) -> "SBMLModel":
        """The model where each id of `choices` (a parameter or a compartment; a species'
        initial value where `chosen` is applied to the values it starts from, as `ds.petab`
        does) takes the k-th of its expressions of the parameters (functions env -> value)
        when the parameter `choose:<id>` is k ≥ 1, and its own value at 0 (the default):
        settings and changes that are formulas (PEtab v2's conditions) become numbers that
        select them, so that experiments with different formulas batch. A formula is
        evaluated from the parameters' current values wherever the id is read (equal to
        v2's assignment at the period's start while what it reads stays constant).
        `reads`: the ids the expressions read, made parameters of the model where they are
        not (NaN until a `ds.Problem` sets them: every one is evaluated, selected or not)."""
        copied = copy.copy(self)
        merged = dict(self.structure.choices)
        for name, options in choices.items():
            if name in merged:  # the numbers would no longer be the caller's
                raise ValueError(f"{name} already has formulas to choose from")
            merged[name] = tuple(options)
        structure = dataclasses.replace(self.structure, choices=tuple(merged.items()))
        object.__setattr__(copied, "structure", structure)
        dtype = jnp.result_type(float)
        params = {
            **{n: jnp.asarray(jnp.nan, dtype) for n in reads if n not in self.structure.states},
            **self.params,
            **{f"choose:{n}": jnp.zeros((), dtype) for n in merged},
        }
        object.__setattr__(copied, "params", params)
        return copied

    def chosen(self, params: Mapping) -> dict:
        """`params` (a dict by id) with the values `with_choices` selects put in (ids not in
        `params` left out)."""
        env = dict(params)
        for name, options in self.structure.choices:
            if name not in env:
                continue
            choice, value = env[f"choose:{name}"], env[name]
            for k, option in enumerate(options, start=1):
                value = jnp.where(choice == k, option(params), value)
            env[name] = value
        return env

    @property
    def timed_events(self) -> tuple[str, ...]:
        """The ids of the file's time-triggered events (see `changes`)."""
        return tuple(event[0] for event in self.structure.events)

    @property
    def triggered_events(self) -> tuple[str, ...]:
        """The ids of the file's events triggered by the state (see `state_events`)."""
        return tuple(eid for event in self.structure.state_events for eid in event[0])

    def state_events(self, max_events: int = EVENT_LIMIT) -> tuple:
        """The file's events triggered by the state, as `ds.Event`s (events of one trigger
        as one): `ds.simulate` of the model uses them when given no events (and fires at
        the start those SBML fires there, `fire_at_start`); with events of your own, pass
        `events=(*model.events(t0), *yours)` from `y0=model.fire_at_start(t0, y0)`;
        `ds.Problem` passes them itself. Each
        fires where its trigger turns true (lhs − rhs of `lhs >= rhs` crossing zero rising,
        as the solver locates it on its dense output) and restarts from the state its
        assignments give, all evaluated at the state just before. Each may fire
        `max_events` times; one more stops the solve (`ds.RESULTS.event_limit_reached`). A
        trigger made true by a jump rather than by the flow (a change at a period's start,
        or at t0 one whose initial value is false) is not seen by the solver:
        `fire_on_jump` applies those."""
        return tuple(
            Event(_Trigger(self, k), direction=1, reset=_Fire(self, k), max_events=max_events)
            for k in range(len(self.structure.state_events))
        )

    @property
    def moved_by_time_events(self) -> tuple[str, ...]:
        """The parameters the file's time-triggered events set: `ds.simulate` carries them
        as states of rate 0 through its solve (`with_states`), a `ds.Problem` as its
        experiments' changes (`changes`)."""
        states = self.structure.states
        names = (v for e in self.structure.events for v, _, _ in e[3] if v not in states)
        return tuple(dict.fromkeys(names))

    def with_states(self, names: tuple[str, ...]) -> "SBMLModel":
        """The model with the parameters `names` as states of rate 0 after its own (their
        values in the state vector, no longer in `params`)."""
        names = tuple(names)
        timing = sorted({e[0] for e in self.structure.events if e[4] & set(names)})
        if timing:
            raise ValueError(
                f"the times of events {', '.join(timing)} read parameters that events set "
                f"({', '.join(names)}): a solve cannot place them in advance"
            )
        made = _LIFTED.setdefault(self.structure, {})
        structure = made.get(names)
        if structure is None:
            structure = dataclasses.replace(
                self.structure,
                states=self.structure.states + names,
                rates=self.structure.rates + tuple(_at_rest for _ in names),
            )
            made[names] = structure
        copied = copy.copy(self)  # of any subclass (a hybrid model keeps its networks)
        object.__setattr__(copied, "structure", structure)
        object.__setattr__(
            copied, "params", {k: v for k, v in self.params.items() if k not in names}
        )
        return copied

    def time_events(self, t0=0.0) -> tuple:
        """The file's time-triggered events as `ds.Event`s, for a solve from `t0` (what
        `ds.simulate` of the model uses when given no events, with `fire_at_start`): each
        fires where the time reaches its c (t − c crossing zero rising; the event time's
        derivative in c is exact) and restarts from the state its assignments give, evaluated
        at the state just before; events whose c is equal fire together. An event whose c is
        at or before `t0` never fires in the solve (`fire_at_start` applies it at `t0` where
        SBML fires it). Events that set a parameter are refused (a solve changes only the
        state): take `with_states(moved_by_time_events)`'s, as `ds.simulate` does."""
        fixed = [
            f"{event[0]} sets {variable}"
            for event in self.structure.events
            for variable, _, _ in event[3]
            if variable not in self.structure.states
        ]
        if fixed:
            raise ValueError(
                f"{type(self).__name__} has time-triggered events that set parameters "
                f"({', '.join(fixed)}), which a solve of its state cannot change: use "
                "model.with_states(model.moved_by_time_events) (as ds.simulate does), or "
                "the model in a ds.Problem (its experiments' changes at given times)"
            )
        if not self.structure.events:
            return ()
        times = self.event_times()
        if not is_traced(times):
            self._check_order(np.asarray(times))
        t0 = jnp.asarray(t0, times.dtype)
        return tuple(
            Event(_TimeTrigger(self, k, t0), direction=1, reset=_TimeFire(self, k), max_events=1)
            for k in range(len(self.structure.events))
        )

    def _check_order(self, times) -> None:
        """Refuses two time-triggered events of one time (`times`, numbers) that assign one
        variable in no order their priorities give (SBML leaves it open)."""
        events = self.structure.events
        for j, k in itertools.combinations(range(len(events)), 2):
            shared = {v for v, _, _ in events[j][3]} & {v for v, _, _ in events[k][3]}
            ordered = None not in (events[j][6], events[k][6]) and events[j][6] != events[k][6]
            if times[j] == times[k] and shared and not ordered:
                raise SBMLError(
                    f"{self.structure.source}: events {events[j][0]} and {events[k][0]} both "
                    f"assign {', '.join(sorted(shared))} at t = {times[j]:g}, in no order "
                    "their priorities give"
                )

    def events(self, t0=0.0) -> tuple:
        """Every event of the file as `ds.Event`s for a solve from `t0`: `time_events(t0)`,
        then `state_events()`. With events of your own, pass `events=(*model.events(t0),
        *yours)` to `ds.simulate`, from `y0=model.fire_at_start(t0, y0)` (the events that
        fire at t0; `ds.simulate` given no events does both itself)."""
        return (*self.time_events(t0), *self.state_events())

    def event_times(self):
        """The trigger time c of each time-triggered event (`timed_events`' order), from the
        model's parameters: an array (events,)."""
        env = self.chosen(dict(self.params))
        return jnp.stack([self._time_of(event, env) for event in self.structure.events])

    def event_time(self, k: int):
        """The trigger time c of the `k`-th time-triggered event: a scalar."""
        return self._time_of(self.structure.events[k], self.chosen(dict(self.params)))

    def _time_of(self, event, env):
        return jnp.asarray(event[1](env), jnp.result_type(*self.params.values(), float))

    def fire_at_start(self, t0, y0):
        """The state at `t0` after the events SBML fires there: the time-triggered ones whose
        time c is before `t0` (or at it, for `time >= c`) with `initialValue="false"`, and
        those with `time > c` at c = t0, all evaluated at `y0`; then the events triggered by
        the state whose trigger is true there with `initialValue="false"` (`fire_on_jump`)."""
        t0 = jnp.asarray(t0, jnp.result_type(y0))
        y = y0
        if self.structure.events:
            times = self.event_times()
            due = []
            for k, event in enumerate(self.structure.events):
                c, fires_at_start, strict = times[k], event[2], event[5]
                early = (c < t0) | ((c == t0) & (not strict))
                due.append(jnp.where(early, fires_at_start, c == t0))
            y = self.act_at_once(t0, y0, due)
        return self.fire_on_jump(t0, y0, y, start=True)

    def act_at_once(self, t, y, acting):
        """The state after the time-triggered events with `acting[k]` (a bool each, per
        `timed_events`) act at one instant `t` from `y`: in `timed_order` (by priority),
        each event's values taken at `y` (SBML's useValuesFromTriggerTime) or at the state
        the events before it leave, a later event's value of a variable replacing an
        earlier's."""
        structure = self.structure
        at_trigger = self.environment(t, y, self.params)
        new = y
        for k in structure.timed_order:
            _, _, _, assignments, _, _, _, uses_trigger_values = structure.events[k]
            env = at_trigger if uses_trigger_values else self.environment(t, new, self.params)
            for variable, compiled, _ in assignments:
                i = structure.states.index(variable)
                value = jnp.asarray(compiled(env), y.dtype)
                new = new.at[i].set(jnp.where(acting[k], value, new[i]))
        return new

    def fire_on_jump(
        self, t, y_before, y_after, before: "SBMLModel | None" = None, start: bool = False
    ):
        """The state at `t` after a jump from `y_before` (under the parameters of `before`,
        default this model's) to `y_after` (under this model's): each event triggered by the
        state whose trigger is false before and true after fires, in the file's order, its
        assignments evaluated at the state it then has. `start`: the jump is at the start
        (from the initial state `y_before`: events that fire there), where a trigger counts
        as false before if its initial value is false (SBML's `initialValue`).
        `y_before=None`: the start, with nothing before it (`y_before` = `y_after`)."""
        if y_before is None:
            y_before, start = y_after, True
        before = self if before is None else before
        t = jnp.asarray(t, jnp.result_type(y_after))
        y = y_after
        for k, (_, distance, fires_at_start, _) in enumerate(self.structure.state_events):
            now = distance(self.environment(t, y, self.params)) >= 0
            if start and fires_at_start:
                was = jnp.zeros((), bool)
            else:
                was = distance(before.environment(t, y_before, before.params)) >= 0
            y = jnp.where(now & ~was, _Fire(self, k)(t, y), y)
        return y

    def without_events(self) -> "SBMLModel":
        """The same model without its events, to simulate with `changes()` applied by a
        `ds.Experiment`."""
        copied = copy.copy(self)  # of any subclass (a hybrid model keeps its networks)
        without = dataclasses.replace(self.structure, events=(), timed_order=())
        object.__setattr__(copied, "structure", without)
        return copied

    def changes(self, values: Mapping | None = None, t0: float = 0.0, varying=()) -> list:
        """The file's time-triggered events and its switches on time as
        `ds.Experiment(changes=...)`: a list of `(time, {variable: value})`, the times from the
        parameters (`values`, dict id → number, overriding the file's: a condition's
        settings); events at one time merged; each switch's flag (`time_switches`) set at t0
        and at its time (unless that time is not a finite number known before the fit: read
        from an estimated parameter, from one that an event, a formula (`with_choices`) or
        the names in `varying` (what an experiment's own changes set) may change; then the
        flag follows the time); at a switch's time itself the flag already says "after",
        so a measurement exactly there reads `time > c` as true and `time <= c` as false;
        an event whose time is at or before `t0` acts at `t0` if its trigger may fire there
        (SBML's `initialValue="false"`), else never. A parameter's new value must be a number
        or another parameter; a species' may be any expression of the state and parameters
        just before the event."""
        source = self.structure.source
        env = {**{k: float(v) for k, v in self.params.items()}, **dict(values or {})}
        env["time"] = float(t0)
        merged: dict[float, dict] = {}
        ranked: dict[float, dict] = {}  # time -> variable -> the priority of what set it
        for k in self.structure.timed_order:
            eid, time_of, fires_at_start, assignments, reads, strict, priority, at_trigger = (
                self.structure.events[k]
            )
            unknown = sorted(n for n in reads if not isinstance(env.get(n, 0.0), numbers.Real))
            if unknown:
                raise SBMLError(
                    f"{source}: the time of event {eid} depends on {', '.join(unknown)}, "
                    "which is estimated; diffsim needs event times known before the fit"
                )
            time = float(time_of(env))
            # at t0 the trigger is already true (time >= c with c <= t0, time > c with c <
            # t0): it fires there only if its initial value is false (SBML); `time > t0` is
            # false at t0 and true just after, so it fires at t0
            if time < t0 or (time == t0 and not strict):
                if not fires_at_start:
                    continue
            time = max(time, float(t0))
            changes = merged.setdefault(time, {})
            earlier = dict(changes)  # what the events before it at this instant set
            for variable, compiled, expr in assignments:
                before = ranked.setdefault(time, {}).get(variable, "none")
                if variable in changes and (priority is None or before in (None, priority)):
                    raise SBMLError(
                        f"{source}: two events assign {variable} at t = {time:g} (event {eid}), "
                        "in no order their priorities give"
                    )
                ranked[time][variable] = priority
                if variable in self.structure.states:
                    value = StateAssignment(self, compiled, time)
                    if earlier and not at_trigger:  # its values after the events before it
                        value = AfterChanges(self, earlier, value)
                    changes[variable] = value
                elif expr.is_number:
                    changes[variable] = float(expr)
                elif expr.is_Symbol and expr.name in self.params:
                    moved_now = not at_trigger and expr.name in earlier
                    changes[variable] = earlier[expr.name] if moved_now else expr.name
                else:
                    raise SBMLError(
                        f"{source}: event {eid} sets parameter {variable} to {expr}, which "
                        "diffsim does not support (a number or another parameter only)"
                    )
        moved = set(varying) | {
            variable for event in self.structure.events for variable, _, _ in event[3]
        }
        moved |= {n for n, _ in self.structure.choices if env.get(f"choose:{n}", 0.0) != 0.0}
        for flag, time_of, reads in self.structure.switches:
            estimated = sorted(n for n in reads if not isinstance(env.get(n, 0.0), numbers.Real))
            if estimated:
                warn(
                    f"{source}: the switch on time at {flag.removeprefix('after:')} reads "
                    f"{', '.join(estimated)}, which is estimated: the solver crosses the switch "
                    "inside a step, and derivatives miss the effect of moving it (the "
                    f"log-likelihood's gradient in {', '.join(estimated)} lacks that term, so "
                    "a fit may stop away from the optimum in it); fix it, or profile it with "
                    "the rest fitted"
                )
            if reads & moved or estimated:
                continue  # a time the fit or a change moves: the flag follows the time
            time = float(time_of(env))
            if not math.isfinite(time):
                continue  # never (or undefined): the comparison reads the time as it is
            merged.setdefault(float(t0), {})[flag] = 1.0 if time <= t0 else 0.0
            if time > t0:
                merged.setdefault(time, {})[flag] = 1.0
        return sorted((time, changes) for time, changes in merged.items() if changes)

    def with_events_as_changes(self, experiments, unknowns, where=None):
        """(the model without its events, `experiments` with the file's time-triggered events
        and switches on time as their changes at given times): what a `ds.Problem` of the
        model solves, each experiment's changes at the times its settings (`set`) and `t0`
        give (`changes`); `unknowns` (dict name -> `ds.Unknown`): what is estimated (an
        event time may not read it) or held. Where an experiment's own changes act at an
        event's time, they act first and the event after them (PEtab v2's order): its
        assignments read the state and parameters they leave. `where(experiment)`: the
        place named in errors."""
        fixed = {n: u.value for n, u in unknowns.items() if not u.estimate}
        estimated = {n: n for n, u in unknowns.items() if u.estimate}
        where = where or (lambda e: f"{self.structure.source}: experiment {e.name}")
        merged = []
        for e in experiments:
            values = {
                **fixed,
                **estimated,
                **{k: fixed.get(v, v) for k, v in (e.set or {}).items()},
            }
            varying = {n for _, a in (e.changes or []) for n in a}
            events = self.changes(values, t0=e.t0, varying=varying)
            changes = _merged_changes(e.changes, events, self, where(e))
            merged.append(dataclasses.replace(e, changes=changes))
        return self.without_events(), merged

    @property
    def time_switches(self) -> tuple[str, ...]:
        """The flags of the file's switches on time (a piecewise's `time >= c`), named
        `after:c`: parameters whose default, -1, leaves each comparison reading the time; 0
        and 1 say before and after c whatever the time (`changes` sets them, so that a solve
        stops at c and integrates each side with its own vector field)."""
        return tuple(switch[0] for switch in self.structure.switches)

    def initial_state(self, values: Mapping | None = None):
        values = dict(values or {})
        params = self.chosen({k: values.get(k, v) for k, v in self.params.items()})
        env = dict(params)
        dtype = jnp.result_type(*params.values()) if params else jnp.result_type(float)
        env["time"] = jnp.zeros((), dtype)
        for name, rule in self.structure.rules:  # sizes and values from the parameters
            try:
                env[name] = rule(env)
            except ExpressionError:
                pass  # it reads a state: evaluated below
        for name, given in self.structure.initial_values.items():
            if given is not None:
                value, size_enters, compartment = given
                if size_enters == "times":  # an amount from a concentration
                    value = value * env[compartment]
                elif size_enters == "over":  # a concentration from an amount
                    value = value / env[compartment]
                env[name] = value
        for name, rule in self.structure.rules:  # what initial assignments may read
            try:
                env[name] = rule(env)
            except ExpressionError:
                pass  # it reads a state set by an initial assignment: evaluated below
        for name, assignment in self.structure.initial:
            env[name] = assignment(env)
            for rule_name, rule in self.structure.rules:
                try:
                    env[rule_name] = rule(env)
                except ExpressionError:
                    pass
        for name in self.structure.states:
            if name in values:
                env[name] = values[name]
            if name not in env:
                raise SBMLError(
                    f"{self.structure.source}: {name} has no initial value (none in the file, "
                    "no initial assignment, none given)"
                )
        if not self.structure.states:
            return jnp.zeros((0,), dtype)
        return jnp.stack([jnp.asarray(env[name], dtype) for name in self.structure.states])


class _Trigger(eqx.Module):
    """The `k`-th event triggered by the state as a `ds.Event` condition: a value crossing
    zero rising where the trigger turns true."""

    model: SBMLModel
    k: int = eqx.field(static=True)

    def __call__(self, t, y):
        distance = self.model.structure.state_events[self.k][1]
        return jnp.asarray(distance(self.model.environment(t, y, self.model.params)))


class _Fire(eqx.Module):
    """The `k`-th event triggered by the state as a `ds.Event` reset: its assignments, all
    evaluated at the state just before."""

    model: SBMLModel
    k: int = eqx.field(static=True)

    def __call__(self, t, y):
        structure = self.model.structure
        env = self.model.environment(t, y, self.model.params)
        new = y
        for variable, compiled, _ in structure.state_events[self.k][3]:
            value = jnp.asarray(compiled(env), y.dtype)
            new = new.at[structure.states.index(variable)].set(value)
        return new


class _TimeTrigger(eqx.Module):
    """The `k`-th time-triggered event as a `ds.Event` condition for a solve from `t0`:
    t − c, rising through zero at the event's time c; 1 throughout where c is at or before
    `t0` (`SBMLModel.fire_at_start` decides those)."""

    model: SBMLModel
    k: int = eqx.field(static=True)
    t0: Any

    def __call__(self, t, y):
        c = self.model.event_time(self.k)  # its own only: the loop calls this many times
        t = jnp.asarray(t, c.dtype)
        return jnp.where(c <= self.t0, jnp.ones_like(t), t - c)

    def outputs_after(self, ts, ys, fired, slack, reset):
        """`ys` (outputs at `ts`) with those at the event's time c given after its reset
        (SBML reports the state after an event at its time, as a `ds.Problem`'s change at a
        given time does; a solve writes an output at the event's located time `fired` from
        the step ending there, before the reset): outputs within `slack` (the times'
        round-off) of c that were not written after the event fired."""
        times = self.model.event_times()
        c = times[self.k]
        ts = ts.astype(c.dtype)
        # the reset applies every event of this time: the first of them fixes the outputs
        first = jnp.all(times[: self.k] != c)
        at = first & (c > self.t0) & (jnp.abs(ts - c) <= slack) & ~(fired < ts)
        return jnp.where(at[:, None], jax.vmap(reset)(ts, ys), ys)


class _TimeFire(eqx.Module):
    """The `k`-th time-triggered event as a `ds.Event` reset: it and every time-triggered
    event of the same time (a solve fires one of the events that cross at one instant and
    moves the others past their zero) act, in their order (`SBMLModel.act_at_once`)."""

    model: SBMLModel
    k: int = eqx.field(static=True)

    def __call__(self, t, y):
        times = self.model.event_times()
        same = [j == self.k or times[j] == times[self.k] for j in range(times.shape[0])]
        new = self.model.act_at_once(t, y, [jnp.asarray(s) for s in same])
        # an event triggered by the state that the jump makes true fires now (the solver
        # sees only crossings by the flow), as at a `ds.Problem`'s change
        return self.model.fire_on_jump(t, y, new)


def _merged_changes(first, second, model, where: str):
    """Two lists of changes at given times as one, `second`'s (the model's events) acting
    after `first`'s (the experiment's own) where their times are equal, as PEtab v2 orders
    them: an assignment of `second` is evaluated at the state and parameters `first` leaves
    there (`AfterChanges`), and sets its target last."""
    merged: dict = {}
    for time, assignments in first or []:
        at = merged.setdefault(float(time), {})
        for target, value in assignments.items():
            if target in at:
                raise SBMLError(f"{where}: {target} is set twice at t = {time:g}")
            at[target] = value
    before = {time: dict(at) for time, at in merged.items()}
    for time, assignments in second or []:
        earlier = before.get(float(time), {})
        at = merged.setdefault(float(time), {})
        for target, value in assignments.items():
            if earlier and isinstance(value, StateAssignment):
                value = AfterChanges(model, earlier, value)
            elif isinstance(value, str) and value in earlier:
                value = earlier[value]  # a parameter the experiment's changes set just now
            at[target] = value
    return sorted(merged.items()) or None


class StateAssignment:
    """A species' new value at a change (an SBML event, a PEtab v2 period): a compiled
    expression evaluated at (the change's time, the state and parameters just before it)."""

    def __init__(self, model: SBMLModel, compiled: Callable, time: float):
        self.model, self.compiled, self.time = model, compiled, time

    # equal assignments (the same expression at the same time) let experiments batch together
    # (`study_changes.signature`)
    def _key(self):
        return (id(self.model.structure), id(self.compiled), self.time)

    def __eq__(self, other):
        return isinstance(other, StateAssignment) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __call__(self, y, p):
        env = self.model.environment(jnp.asarray(self.time, jnp.result_type(y)), y, p)
        return self.compiled(env)


class AfterChanges:
    """A state's new value at a time where other changes act first (an SBML event at the
    start of a PEtab v2 period acts after the period's conditions, v2's order): `then`
    (a `StateAssignment`) evaluated at the state and parameters that `first` (dict id ->
    a number, a parameter's id or a `StateAssignment`, all of the state and parameters
    just before) leaves."""

    def __init__(self, model: SBMLModel, first: Mapping, then: StateAssignment):
        self.model, self.then = model, then
        self.first = tuple(sorted(first.items()))

    def _key(self):
        return (id(self.model.structure), self.first, self.then)

    def __eq__(self, other):
        return isinstance(other, AfterChanges) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __call__(self, y, p):
        states = self.model.structure.states
        y_after, p_after = y, dict(p)
        for target, value in self.first:
            if callable(value):
                value = value(y, p)
            elif isinstance(value, str):
                value = p[value]
            if target in states:
                y_after = y_after.at[states.index(target)].set(jnp.asarray(value, y.dtype))
            else:
                p_after[target] = jnp.asarray(value, jnp.result_type(p.get(target, value)))
        return self.then(y_after, p_after)


def load(path) -> SBMLModel:
    """Read an SBML model (levels 2–3) as a `ds.SBMLModel` (see the module text for what is
    read and what is refused).

    **Raises:** `ds.sbml.SBMLError` naming the file and what is wrong (unreadable, invalid, or
    an unsupported element by its id)."""
    import libsbml

    path = user_path(path, "ds.sbml.load(path)")
    source = str(path)
    if not path.is_file():
        raise FileNotFoundError(f"ds.sbml.load: no file at {source}")
    document = libsbml.SBMLReader().readSBMLFromFile(source)
    errors = _errors(document, libsbml)
    if not errors and document.getModel() is not None:
        # the rules of SBML itself (unique ids, what a function definition may read, ...):
        # reading checks only the syntax, and a file breaking them loaded with a silent meaning
        # (a parameter and a species of one id side by side). Units and modelling practice
        # are advice, not validity: not checked.
        document.setConsistencyChecks(libsbml.LIBSBML_CAT_UNITS_CONSISTENCY, False)
        document.setConsistencyChecks(libsbml.LIBSBML_CAT_MODELING_PRACTICE, False)
        document.checkConsistency()
        errors = _errors(document, libsbml)
    if errors:
        first = errors[0]
        message = " ".join(first.getMessage().split())
        # libsbml's message is the rule's whole text, then "Reference: L3V2 Section 3.4.3 "
        # and what this file does wrong: that last part, with the rule's number
        specific = re.search(r"Reference: L\dV\d Sections? [\d.]+(?: and [\d.]+)? (.+)$", message)
        raise SBMLError(
            f"{source} is not a valid SBML file: line {first.getLine()}: "
            f"{specific.group(1) if specific else message} (SBML rule {first.getErrorId()}"
            f"{f'; {len(errors)} errors' if len(errors) > 1 else ''})"
        )
    model = document.getModel()
    if model is None:
        raise SBMLError(f"{source} holds no SBML model")
    _refuse_packages(document, source)
    return _build(model, source)


def _refuse_packages(document, source: str) -> None:
    """A level-3 package the file marks as required changes what the model means (`comp`:
    submodels whose species and reactions belong to the model): read without it, the model
    would be another. Packages not required (layout, fbc's bounds) leave the dynamics."""
    if document.getLevel() < 3:  # level 2 has no packages (libsbml lists its layout anyway)
        return
    names = [document.getPlugin(i).getPackageName() for i in range(document.getNumPlugins())]
    names += [document.getUnknownPackagePrefix(i) for i in range(document.getNumUnknownPackages())]
    for name in names:
        # level 3 version 2's own mathematics travels as a package nobody declares
        if name != "l3v2extendedmath" and document.getPackageRequired(name):
            _refuse(source, f"the SBML package '{name}', which the file requires")


def _errors(document, libsbml) -> list:
    return [
        document.getError(i)
        for i in range(document.getNumErrors())
        if document.getError(i).getSeverity() >= libsbml.LIBSBML_SEV_ERROR
    ]


def _refuse(source, what):
    raise SBMLError(f"{source}: {what}, which diffsim does not support")


def _build(model, source: str) -> SBMLModel:
    def math_of(node, where, condition=False):
        """The mathematics of an element as SymPy: a number (true and false as 1 and 0,
        as SBML allows) unless it is a `condition` (a trigger, a function's body)."""
        if node is None:  # level 3 version 2 lets an element leave out its math
            raise SBMLError(f"{source}: {where} has no math, which diffsim does not read")
        try:
            expr = from_ast(node, functions, where)
        except ExpressionError as error:
            raise SBMLError(f"{source}: {error}") from None
        return expr if condition else as_number(expr)

    functions = {}
    for fd in model.getListOfFunctionDefinitions():
        lam = fd.getMath()
        if lam is None:
            _refuse(source, f"function definition {fd.getId()} without math")
        count = lam.getNumChildren()
        arguments = [sympy.Symbol(lam.getChild(i).getName()) for i in range(count - 1)]
        body = math_of(lam.getChild(count - 1), f"function {fd.getId()}", condition=True)
        functions[fd.getId()] = sympy.Lambda(tuple(arguments), body)

    if model.getNumConstraints():
        pass  # constraints only assert; they do not change the dynamics
    _refuse_time_ids(model, source)
    initially = {ia.getSymbol() for ia in model.getListOfInitialAssignments()}
    rated = {r.getVariable() for r in model.getListOfRules() if r.isRate()}
    changed = {variable: "a rate rule" for variable in rated}
    for event in model.getListOfEvents():
        for assignment in event.getListOfEventAssignments():
            changed[assignment.getVariable()] = f"event {event.getId() or '(unnamed)'}"
    # parameters that events triggered by the state set: states of rate 0, as a reset inside
    # a solve changes only the state
    switched = [
        variable
        for event in _state_triggered(model, math_of, rated)
        for variable in (a.getVariable() for a in event.getListOfEventAssignments())
        if model.getParameter(variable) is not None and variable not in rated
    ]
    switched = list(dict.fromkeys(switched))
    params: dict[str, Any] = {}
    volumes = {}
    # compartments whose size events set: states that keep their size between events (rate
    # 0), so that an event's new size may be any expression of the state and parameters
    resized = []
    for compartment in model.getListOfCompartments():
        cid = compartment.getId()
        if cid in rated:
            _refuse(source, f"compartment {cid} of variable size (set by a rate rule)")
        # a constant="false" compartment that nothing changes is constant
        if cid in changed:
            resized.append(cid)
        if compartment.isSetSize():
            size = float(compartment.getSize())
            if not size > 0 and not _dimensionless(compartment):
                raise SBMLError(
                    f"{source}: compartment {cid} has size {size:g}; a compartment's size "
                    "must be positive (species in it are amounts per size)"
                )
        elif cid in initially:
            size = float("nan")  # set by its initial assignment below
        elif _dimensionless(compartment):
            # no size: no parameter (a NaN one would flag every solve's inputs invalid);
            # mathematics that reads it is refused as reading an undefined id
            volumes[cid] = sympy.Symbol(cid)
            continue
        elif model.getLevel() >= 3:
            raise SBMLError(
                f"{source}: compartment {cid} has no size (SBML level 3 gives none by default); "
                "give it a size attribute or an initial assignment"
            )
        else:
            size = 1.0  # SBML level 2's default
        params[cid] = size
        volumes[cid] = sympy.Symbol(cid)
    for parameter in model.getListOfParameters():
        params[parameter.getId()] = (
            float(parameter.getValue()) if parameter.isSetValue() else float("nan")
        )

    rules, rate_rules = {}, {}
    for rule in model.getListOfRules():
        variable = rule.getVariable()
        if rule.isAlgebraic():
            _refuse(source, "an algebraic rule")
        expr = math_of(rule.getMath(), f"rule for {variable}")
        if rule.isAssignment():
            rules[variable] = expr
        elif rule.isRate():
            rate_rules[variable] = expr
    if any(c.getId() in rules for c in model.getListOfCompartments()):
        _refuse(source, "a compartment set by a rule")
    for variable in rules:  # computed wherever needed: not a parameter one could set
        params.pop(variable, None)

    states, initial_values, concentration = [], {}, {}
    species_compartment = {}
    # first in `initial_values`: a species' initial value reads its compartment's size
    for cid in resized + switched:
        size = params.pop(cid)
        initial_values[cid] = None if math.isnan(size) else (size, None, None)
    if model.isSetConversionFactor() if hasattr(model, "isSetConversionFactor") else False:
        _refuse(source, f"the model's conversion factor {model.getConversionFactor()}")
    for species in model.getListOfSpecies():
        sid = species.getId()
        if species.isSetConversionFactor() if hasattr(species, "isSetConversionFactor") else False:
            _refuse(source, f"species {sid} with a conversion factor")
        if sid in rules:
            continue  # computed by its assignment rule
        compartment = species.getCompartment()
        # in a compartment of dimension 0 a species has no concentration: an amount (SBML)
        where = model.getCompartment(compartment)
        amount_units = species.getHasOnlySubstanceUnits() or (
            where is not None and _dimensionless(where)
        )
        concentration[sid] = not amount_units
        species_compartment[sid] = compartment
        # (value, how the compartment's size enters): evaluated with the size the model has
        # then (a setting, an estimate), not the file's
        if species.isSetInitialConcentration():
            value = species.getInitialConcentration()
            initial_values[sid] = (value, "times" if amount_units else None, compartment)
        elif species.isSetInitialAmount():
            value = species.getInitialAmount()
            initial_values[sid] = (value, None if amount_units else "over", compartment)
        else:
            initial_values[sid] = None
        states.append(sid)
    states.extend(resized + switched)
    for variable in rate_rules:
        if variable not in states:
            if variable not in params:
                _refuse(source, f"rate rule for {variable}, which is no species or parameter")
            initial_values[variable] = (params.pop(variable), None, None)
            states.append(variable)
    # initial assignments to constant parameters and compartments set their values for the
    # whole solve (SBML): they become values computed from the other parameters, as
    # assignment rules are (the file's value attribute is overridden)
    derived = _derived_by_initial_assignment(
        model, math_of, source, params, rules, set(states), changed
    )
    rules.update(derived)
    for variable in derived:
        params.pop(variable)

    # d/dt of every state: rate rules, else Σ stoichiometry · rate (/ volume)
    flux = {s: sympy.Integer(0) for s in states}
    # what a reaction's id (its rate) and a species reference's id (its stoichiometry) stand
    # for where the file's mathematics reads them (SBML level 3)
    named: dict = {}
    derived_stoichiometry = _stoichiometry_by_initial_assignment(
        model, math_of, source, params, rules, set(states)
    )
    for reaction in model.getListOfReactions():
        rid = reaction.getId()
        if reaction.isSetFast() and reaction.getFast():
            _refuse(source, f"fast reaction {rid}")
        law = reaction.getKineticLaw()
        if law is None or law.getMath() is None:
            _refuse(source, f"reaction {rid} without a kinetic law")
        rate = math_of(law.getMath(), f"the kinetic law of {rid}")
        local = {}
        for lp in list(law.getListOfParameters()) + list(
            law.getListOfLocalParameters() if hasattr(law, "getListOfLocalParameters") else []
        ):
            local[sympy.Symbol(lp.getId())] = sympy.Float(lp.getValue())
        rate = rate.subs(local)
        named[rid] = rate
        for sign, references in (
            (-1, reaction.getListOfReactants()),
            (1, reaction.getListOfProducts()),
        ):
            for reference in references:
                sid = reference.getSpecies()
                if (
                    reference.isSetStoichiometryMath()
                    if hasattr(reference, "isSetStoichiometryMath")
                    else False
                ):
                    _refuse(source, f"variable stoichiometry of {sid} in {rid}")
                if reference.isSetId() and reference.getId() in rules | rate_rules.keys():
                    _refuse(source, f"variable stoichiometry of {sid} in {rid}")
                stoichiometry = sympy.Float(
                    reference.getStoichiometry() if reference.isSetStoichiometry() else 1.0
                )
                if (
                    model.getLevel() >= 3
                    and not reference.isSetStoichiometry()
                    and not (reference.isSetId() and reference.getId() in derived_stoichiometry)
                ):
                    # level 2 gives an unwritten stoichiometry the default 1; level 3 leaves it
                    # undefined (a file that meant another value would load silently wrong)
                    warn(
                        f"{source}: the stoichiometry of {sid} in reaction {rid} is not set "
                        "(SBML level 3 leaves it undefined, with no initial assignment); taken "
                        "as 1: set the species reference's stoichiometry attribute to be sure"
                    )
                if reference.isSetId() and reference.getId() in derived_stoichiometry:
                    stoichiometry = derived_stoichiometry[reference.getId()]
                if reference.isSetId():
                    named[reference.getId()] = stoichiometry
                if sid not in flux:
                    continue  # a species fixed by a rule, boundary or not
                species = model.getSpecies(sid)
                if species.getBoundaryCondition() or species.getConstant():
                    continue
                term = sign * stoichiometry * rate
                if concentration[sid]:
                    term = term / volumes[species_compartment[sid]]
                flux[sid] = flux[sid] + term
    # the events' mathematics may read them too (a trigger on a reaction's rate)
    event_math = []
    for event in model.getListOfEvents():
        eid = event.getId() or "(unnamed)"
        trigger = event.getTrigger()
        if trigger is not None and trigger.getMath() is not None:
            where = f"the trigger of event {eid}"
            event_math.append(math_of(trigger.getMath(), where, condition=True))
        for a in event.getListOfEventAssignments():
            if a.getMath() is not None:
                where = f"event {eid}'s assignment to {a.getVariable()}"
                event_math.append(math_of(a.getMath(), where))
    read = [*rules.values(), *rate_rules.values(), *flux.values(), *event_math]
    rules.update(_read_names(named, read))
    # every switch on time in the vector field and the rules reads a flag that changes at
    # its time can set (see `_on_flags`)
    switches: dict = {}
    flux = {s: _on_flags(e, params, switches) for s, e in flux.items()}
    rate_rules = {v: _on_flags(e, params, switches) for v, e in rate_rules.items()}
    rules = {v: _on_flags(e, params, switches) for v, e in rules.items()}
    for name in switches:
        params[name] = _FOLLOW_TIME
    rates = []
    expressions = {}
    for state in states:
        expr = rate_rules.get(state, flux[state])
        expressions[state] = expr
        rates.append(compile_expression(expr, f"{source}: d{state}/dt"))

    order = _ordered(rules, source, "assignment rules")
    compiled_rules = tuple(
        (name, compile_expression(rules[name], f"{source}: rule for {name}")) for name in order
    )
    assignments = {}
    for ia in model.getListOfInitialAssignments():
        if ia.getSymbol() in derived or ia.getSymbol() in derived_stoichiometry:
            continue  # a parameter's, a compartment's or a stoichiometry's value (above)
        assignments[ia.getSymbol()] = math_of(
            ia.getMath(), f"initial assignment of {ia.getSymbol()}"
        )
    compiled_initial = tuple(
        (name, compile_expression(assignments[name], f"{source}: initial assignment of {name}"))
        for name in _ordered(assignments, source, "initial assignments")
    )
    expressions.update(rules)
    # an id no element defines would fail only when the model is simulated
    known = set(states) | set(params) | set(rules) | {TIME_NAME}
    labelled = [
        (f"d{k}/dt" if k in states else f"the rule for {k}", e) for k, e in expressions.items()
    ]
    labelled += [(f"the initial assignment of {k}", e) for k, e in assignments.items()]
    for where, expr in labelled:
        undefined = sorted(x.name for x in expr.free_symbols if x.name not in known)
        if undefined:
            raise SBMLError(
                f"{source} is not a valid SBML file: {where} reads "
                f"{undefined}, which no species, compartment, parameter or rule defines"
            )
    amounts_kept = {  # compartment -> the species in it whose amount its changes keep
        cid: [
            s
            for s in states
            if concentration.get(s)
            and species_compartment[s] == cid
            and not model.getSpecies(s).getConstant()
        ]
        for cid in resized
    }
    events, state_events = _events(model, math_of, source, params, states, rules, amounts_kept)
    structure = _Structure(
        source=source,
        states=tuple(states),
        rates=tuple(rates),
        rules=compiled_rules,
        initial=compiled_initial,
        initial_values=initial_values,
        expressions=expressions,
        events=events,
        timed_order=_timed_order(events),
        state_events=state_events,
        switches=tuple(
            (
                name,
                compile_expression(at, f"{source}: the switch time {at}"),
                frozenset(x.name for x in at.free_symbols),
            )
            for name, (at, _) in switches.items()
        ),
    )
    return SBMLModel(
        params={k: jnp.asarray(v, jnp.result_type(float)) for k, v in params.items()},
        structure=structure,
    )


def _dimensionless(compartment) -> bool:
    """A compartment of spatial dimension 0 (its size means nothing); level 3 leaves the
    dimension unset unless given."""
    return compartment.isSetSpatialDimensions() and compartment.getSpatialDimensionsAsDouble() == 0


def _refuse_time_ids(model, source: str):
    """An element whose id is `time` would be read as SBML's time (the csymbol) in the
    mathematics diffsim builds: refused rather than confused."""
    elements = [
        ("compartment", model.getListOfCompartments()),
        ("species", model.getListOfSpecies()),
        ("parameter", model.getListOfParameters()),
        ("reaction", model.getListOfReactions()),
        ("function definition", model.getListOfFunctionDefinitions()),
    ]
    for reaction in model.getListOfReactions():
        references = [*reaction.getListOfReactants(), *reaction.getListOfProducts()]
        elements.append(("species reference", references))
    for kind, listed in elements:
        if any(element.getId() == TIME_NAME for element in listed):
            raise SBMLError(
                f"{source}: a {kind} has the id 'time', which diffsim cannot tell apart from "
                "SBML's time in the model's mathematics; rename it"
            )


def _reads_dynamics(expr, rules: dict, states: set) -> list[str]:
    """The states (and time) `expr` reads, directly or through assignment rules."""
    found, seen, todo = set(), set(), [expr]
    while todo:
        for symbol in todo.pop().free_symbols:
            name = symbol.name
            if name in states or symbol == time_symbol():
                found.add(name)
            elif name in rules and name not in seen:
                seen.add(name)
                todo.append(rules[name])
    return sorted(found)


def _derived_by_initial_assignment(model, math_of, source, params, rules, states, changed) -> dict:
    """id -> expression of each parameter and compartment an initial assignment sets: its
    value for the whole solve, from the other parameters (SBML evaluates it once, at the
    start, where the parameters it reads have their values). `rules`: the assignment rules
    (a rate rule's variable is one of the `states`)."""
    derived = {}
    for ia in model.getListOfInitialAssignments():
        symbol = ia.getSymbol()
        if symbol not in params:
            continue  # a species', a rate rule's variable's (initial states), a stoichiometry's
        if symbol in changed:
            _refuse(source, f"the initial assignment of {symbol}, which {changed[symbol]} sets")
        expr = math_of(ia.getMath(), f"initial assignment of {symbol}")
        dynamic = _reads_dynamics(expr, rules, states | set(changed))
        if dynamic:
            # computed wherever read, it would follow what the state or an event does later
            _refuse(
                source,
                f"the initial assignment of parameter {symbol}, which reads {dynamic} (an "
                "initial assignment of a parameter or compartment that reads the state or "
                "what an event changes)",
            )
        derived[symbol] = expr
    return derived


def _stoichiometry_by_initial_assignment(model, math_of, source, params, rules, states) -> dict:
    """species reference id -> the expression of its stoichiometry that an initial assignment
    sets (from the parameters)."""
    references = {
        reference.getId()
        for reaction in model.getListOfReactions()
        for reference in [*reaction.getListOfReactants(), *reaction.getListOfProducts()]
        if reference.isSetId()
    }
    found = {}
    for ia in model.getListOfInitialAssignments():
        symbol = ia.getSymbol()
        if symbol not in references:
            continue
        expr = math_of(ia.getMath(), f"initial assignment of {symbol}")
        dynamic = _reads_dynamics(expr, rules, states)
        if dynamic:
            _refuse(source, f"the stoichiometry {symbol}, whose initial assignment reads {dynamic}")
        found[symbol] = expr
    return found


def _read_names(named: dict, expressions) -> dict:
    """The entries of `named` (a reaction's rate, a stoichiometry by id) that `expressions`
    read, and those that these read in turn: made assignment rules only where read, so that
    a reaction's rate is not computed twice in every evaluation of the vector field."""
    found, todo = {}, list(expressions)
    while todo:
        for symbol in todo.pop().free_symbols:
            if symbol.name in named and symbol.name not in found:
                found[symbol.name] = named[symbol.name]
                todo.append(named[symbol.name])
    return found


def _events(
    model, math_of, source, params: dict, states: list, rules: dict, amounts_kept: dict
) -> tuple[tuple, tuple]:
    """(the events triggered when time reaches a value the parameters set, `time >= c` or
    `time > c`; those triggered by the state, a comparison >=, >, <=, < of the state,
    parameters and time); anything else is refused naming the event. An event that sets
    a compartment's size (`amounts_kept`: compartment -> the species in concentration in it)
    keeps the amounts of the species in it (SBML): their concentrations, or the values the
    event gives them read in the old size, are scaled by the old size over the new."""
    timed, triggered = [], []
    for event in model.getListOfEvents():
        eid = event.getId() or "(unnamed)"
        if event.isSetDelay():
            _refuse(source, f"event {eid} with a delay")
        trigger = event.getTrigger()
        if trigger is None or trigger.getMath() is None:
            _refuse(source, f"event {eid} without a trigger")
        condition = math_of(trigger.getMath(), f"the trigger of event {eid}", condition=True)
        at, strict = _trigger_time(condition)
        by_time = at is not None and {s.name for s in at.free_symbols} <= set(params)
        distance = None if by_time else _trigger_distance(condition)
        if not by_time and distance is None:
            _refuse(
                source,
                f"event {eid}'s trigger {condition} (a trigger is read when it compares two "
                "values, >=, >, <= or <, of the state, parameters and time; and, or, == and "
                "other forms are not)",
            )
        priority = None
        if event.isSetPriority():
            # the order of events at one instant (each with useValuesFromTriggerTime="false"
            # reading what the earlier ones set: case 01331 of SBML's test suite), followed
            # for time-triggered events of a constant priority
            if not by_time:
                _refuse(source, f"event {eid} with a priority (its trigger reads the state)")
            priority = _constant(
                math_of(event.getPriority().getMath(), f"event {eid}'s priority"),
                source,
                f"event {eid}'s priority",
            )
        assignments = []
        for assignment in event.getListOfEventAssignments():
            variable = assignment.getVariable()
            if variable not in states and variable not in params or variable in rules:
                _refuse(source, f"event {eid}'s assignment to {variable}, no species or parameter")
            if distance is not None and variable not in states:
                _refuse(
                    source,
                    f"event {eid}'s assignment to parameter {variable} (its trigger reads a "
                    "parameter that an event triggered by the state sets)",
                )
            expr = math_of(assignment.getMath(), f"event {eid}'s assignment to {variable}")
            compiled = compile_expression(expr, f"{source}: event {eid}'s assignment to {variable}")
            assignments.append((variable, compiled, expr))
        given = {variable: expr for variable, _, expr in assignments}
        for compartment, _, new_size in list(assignments):
            for species in amounts_kept.get(compartment, ()):
                # its amount is kept: the value before the event, or the one the event gives
                # (a concentration in the size before it, as SBML's test suite has it:
                # cases 01779, 01780), over the new size
                value = given.get(species, sympy.Symbol(species))
                expr = value * sympy.Symbol(compartment) / new_size
                where = f"{source}: event {eid}'s new concentration of {species}"
                kept = (species, compile_expression(expr, where), expr)
                assignments = [a for a in assignments if a[0] != species] + [kept]
        # SBML level 2 triggers have no initial value: true (no firing at t0 if already true)
        fires_at_start = hasattr(trigger, "isSetInitialValue") and trigger.isSetInitialValue()
        fires_at_start = fires_at_start and not trigger.getInitialValue()
        if distance is not None:
            triggered.append((eid, distance, fires_at_start, assignments))
            continue
        timed.append(
            (
                eid,
                compile_expression(at, f"{source}: the trigger time of event {eid}"),
                fires_at_start,
                tuple(assignments),
                frozenset(s.name for s in at.free_symbols),
                strict,
                priority,
                event.getUseValuesFromTriggerTime(),
            )
        )
    return tuple(timed), _by_trigger(triggered, source)


def _constant(expr, source: str, what: str) -> float:
    """The number `expr` (SymPy) is, `true` and `false` as 1 and 0; anything that reads a
    symbol is refused, naming `what`."""
    if expr is sympy.true or expr is sympy.false:
        return float(expr is sympy.true)
    try:
        return float(expr)
    except TypeError:
        _refuse(source, f"{what} {expr} (a constant number only)")


def _timed_order(timed) -> tuple:
    """The order in which time-triggered events of one instant act (SBML): by priority,
    highest first, then those without one; each set in the file's order."""
    return tuple(
        sorted(
            range(len(timed)),
            key=lambda k: (0, -timed[k][6], k) if timed[k][6] is not None else (1, 0, k),
        )
    )


def _by_trigger(triggered: list, source: str) -> tuple:
    """The events triggered by the state, those of one trigger (the same expression and
    initial value) as one: they fire at the same instant, where a solve fires only the
    first of the `ds.Event`s that cross together. Each: (their ids, the trigger's distance
    compiled, fires at t0, their assignments in the file's order)."""
    grouped: dict = {}
    for eid, distance, fires_at_start, assignments in triggered:
        key = (sympy.srepr(sympy.expand(distance)), fires_at_start)
        if key not in grouped:
            grouped[key] = ([], distance, fires_at_start, [])
        grouped[key][0].append(eid)
        grouped[key][3].extend(assignments)
    return tuple(
        (
            tuple(ids),
            compile_expression(distance, f"{source}: the trigger of event {ids[0]}"),
            fires_at_start,
            tuple(assignments),
        )
        for ids, distance, fires_at_start, assignments in grouped.values()
    )


def _state_triggered(model, math_of, rated: set) -> list:
    """The file's events whose trigger is not `time >= c` with c from constant parameters and
    compartments (`rated`: the variables of rate rules, not constant): read before the states
    are, to know which parameters such events set (`_events` decides with the parameters
    as built)."""
    constant = {p.getId() for p in model.getListOfParameters()}
    constant |= {c.getId() for c in model.getListOfCompartments()}
    constant -= rated | {r.getVariable() for r in model.getListOfRules()}
    found = []
    for event in model.getListOfEvents():
        trigger = event.getTrigger()
        if trigger is None or trigger.getMath() is None:
            continue  # refused in `_events`
        where = f"the trigger of event {event.getId()}"
        at, _ = _trigger_time(math_of(trigger.getMath(), where, condition=True))
        if at is None or not {s.name for s in at.free_symbols} <= constant:
            found.append(event)
    return found


def _trigger_distance(condition):
    """A value that crosses zero from below where `condition` (lhs >= rhs, >, <=, <) turns
    true: lhs − rhs, or rhs − lhs; None for any other condition."""
    if isinstance(condition, (sympy.GreaterThan, sympy.StrictGreaterThan)):
        return condition.lhs - condition.rhs
    if isinstance(condition, (sympy.LessThan, sympy.StrictLessThan)):
        return condition.rhs - condition.lhs
    return None


# A switch's flag: -1 follows the time itself (the value of the file's condition at t); 0 is
# "before the switch time", 1 "after it", whatever t is.
_FOLLOW_TIME = -1.0


def _on_flags(expr, params: dict, switches: dict):
    """`expr` with each comparison of time with a value of the parameters (`time >= c`,
    `time - c < 0`, …) made to read a flag, the parameter `after:c`, besides the time.

    Why: a solve stopped at c (a change there, `SBMLModel.changes`) still evaluates the
    vector field at c itself as the last time of the step before, where `time >= c` already
    holds, and at c as the first of the step after, where `time <= c` still does: one side of
    the switch would be integrated with the other side's field. With the flag set to 0 up to
    c and to 1 from c on, each side sees its own field on its whole interval (the way AMICI
    integrates Heaviside functions). Left at -1 (`_FOLLOW_TIME`, its default), the flag
    changes nothing: the comparison reads the time as the file says.
    `switches` collects the flags' names -> (c, the flag's symbol)."""

    found: dict = {}

    def as_switch(relation):  # asked twice by `replace` (does it match, what replaces it)
        if relation not in found:
            found[relation] = _switched(relation)
        return found[relation]

    def _switched(relation):
        time = time_symbol()
        orderings = (
            sympy.GreaterThan,
            sympy.StrictGreaterThan,
            sympy.LessThan,
            sympy.StrictLessThan,
        )
        if not isinstance(relation, orderings) or time not in relation.free_symbols:
            return None
        difference = sympy.expand(relation.lhs - relation.rhs)
        slope = difference.coeff(time)
        if not slope.is_number or slope == 0:
            return None
        rest = difference - slope * time
        if time in rest.free_symbols or not {x.name for x in rest.free_symbols} <= set(params):
            return None
        at = -rest / slope
        name = f"after:{float(at)!r}" if at.is_number else f"after:{at}"
        flag = switches.setdefault(name, (at, sympy.Symbol(name)))[1]
        later = isinstance(relation, (sympy.GreaterThan, sympy.StrictGreaterThan)) == (slope > 0)
        flagged = flag > 0.5 if later else sympy.And(flag > -0.5, flag < 0.5)
        return sympy.Or(flagged, sympy.And(flag < -0.5, relation))

    return expr.replace(lambda e: as_switch(e) is not None, as_switch)


def _trigger_time(condition):
    """(c, whether strict) of a trigger `time >= c` (or `time > c`, `c <= time`, `c < time`)
    free of time and the states; (None, False) for any other trigger."""
    strict = isinstance(condition, (sympy.StrictGreaterThan, sympy.StrictLessThan))
    if isinstance(condition, (sympy.GreaterThan, sympy.StrictGreaterThan)):
        later, earlier = condition.lhs, condition.rhs
    elif isinstance(condition, (sympy.LessThan, sympy.StrictLessThan)):
        later, earlier = condition.rhs, condition.lhs
    else:
        return None, False
    time = time_symbol()
    if later != time or time in earlier.free_symbols:
        return None, False
    return earlier, strict


def _ordered(definitions: dict, source: str, what: str) -> list[str]:
    """The ids of `definitions` (id -> expression) in an order where each comes after those
    it reads."""
    order, state = [], {}

    def visit(name, trail):
        if state.get(name) == "done":
            return
        if state.get(name) == "visiting":
            cycle = " -> ".join(trail + [name])
            raise SBMLError(f"{source}: the {what} depend on each other in a cycle ({cycle})")
        state[name] = "visiting"
        for symbol in definitions[name].free_symbols:
            if symbol.name in definitions and symbol != time_symbol():
                visit(symbol.name, trail + [name])
        state[name] = "done"
        order.append(name)

    for name in definitions:
        visit(name, [])
    return order
