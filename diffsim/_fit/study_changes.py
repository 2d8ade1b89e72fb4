"""Changes at given times within an experiment (`ds.Experiment(changes=...)`): a dose added to
a state, an input switched on or off, a parameter that takes a new value from a time on
(a dosing schedule, PEtab's and SBML's time-triggered events).

An experiment with K changes is simulated in K + 1 segments, from one change's time to the
next: each segment runs the model with its own parameter values and starts from the state the
one before ended in, after the change's assignments to states. The solver thus stops exactly
at every change (no step straddles a jump of the vector field, and the state's jump is applied
exactly). A batch of experiments with the same number (and kind) of changes runs its segments
as one `lax.scan`, every segment's output times padded to one width, so that one solve is
compiled however many changes an experiment has.

A measurement at a change's time reads the state after the change (a dose at t = 2 is seen by
a measurement at t = 2); a change at `t0` acts on the initial state (after a
pre-equilibration).
"""

import dataclasses
import math
import numbers
from collections.abc import Mapping

import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class Change:
    """One checked change: its time, the parameters it sets (name → a number or another
    parameter's name) and the states it assigns (index → a number, a parameter's name, or a
    function `(y, p) -> value` of the state and parameters just before the change)."""

    time: float
    parameters: dict
    states: dict


def checked_changes(experiment, label: str, parameter_names, state_names, size: int):
    """The experiment's changes, checked and in time order: a tuple of `Change`."""
    items = experiment.changes
    if items is None:
        return ()
    if isinstance(items, Mapping):
        items = list(items.items())
    try:
        items = list(items)
    except TypeError:
        raise TypeError(
            f"{label}: changes must be a list of (time, {{name: value}}) pairs, got {items!r}"
        ) from None
    parameters = set(parameter_names)
    states = tuple(state_names or ())
    checked = []
    for item in items:
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise TypeError(
                f"{label}: each change must be a pair (time, {{name: value}}), got {item!r}"
            )
        time, assignments = item
        if not isinstance(time, numbers.Real) or not math.isfinite(float(time)):
            raise ValueError(f"{label}: a change's time must be a finite number, got {time!r}")
        time = float(time)
        where = f"{label}'s change at t = {time:g}"
        if time < float(experiment.t0):
            raise ValueError(f"{where} precedes its t0 = {experiment.t0:g}")
        if not isinstance(assignments, Mapping) or not assignments:
            raise TypeError(
                f"{where}: the assignments must be a non-empty dict name -> value, got "
                f"{assignments!r}"
            )
        set_parameters, set_states = {}, {}
        for name, value in assignments.items():
            index = _state_index(name, states, size)
            if isinstance(name, str) and name in parameters:
                if index is not None:
                    raise ValueError(f"{where}: {name!r} is both a parameter and a state")
                if callable(value):
                    raise TypeError(
                        f"{where}: parameter {name!r} takes a number or another parameter's "
                        "name (a function of the state assigns states only)"
                    )
                set_parameters[name] = _checked_value(value, f"{where}[{name!r}]", parameters)
            elif index is not None:
                if index in set_states:
                    raise ValueError(f"{where} assigns state {name!r} twice")
                set_states[index] = (
                    value
                    if callable(value)
                    else _checked_value(value, f"{where}[{name!r}]", parameters)
                )
            else:
                raise ValueError(
                    f"{where} names {name!r}, which is neither a parameter "
                    f"({', '.join(parameter_names) or 'none'}) nor a state "
                    f"({', '.join(states) if states else f'indices 0 … {size - 1}'})"
                )
        checked.append(Change(time, set_parameters, set_states))
    checked.sort(key=lambda c: c.time)
    for before, after in zip(checked, checked[1:]):
        if before.time == after.time:
            raise ValueError(
                f"{label} has two changes at t = {after.time:g}: give them as one dict"
            )
    return tuple(checked)


def _state_index(name, states: tuple, size: int):
    if isinstance(name, str):
        return states.index(name) if name in states else None
    if isinstance(name, (int, np.integer)) and not isinstance(name, bool) and 0 <= name < size:
        return int(name)
    return None


def _checked_value(value, where: str, parameters: set):
    if isinstance(value, str):
        if value not in parameters:
            raise ValueError(
                f"{where} = {value!r} names no parameter: use a number, a parameter's name "
                "or (for a state) a function (y, p) -> value"
            )
        return value
    if not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise ValueError(
            f"{where} must be a finite number, a parameter's name or (for a state) a "
            f"function (y, p) -> value, got {value!r}"
        )
    return float(value)


def signature(changes: tuple) -> tuple:
    """What experiments batched together must share: the number of changes and where a
    function assigns a state (the functions are traced into the batch's program)."""
    return (
        len(changes),
        tuple(
            (j + 1, i, _identity(v))
            for j, change in enumerate(changes)
            for i, v in sorted(change.states.items())
            if callable(v)
        ),
    )


def _identity(fn):
    """A function's key for batching: itself where it defines equality and a hash (an SBML
    or PEtab assignment: equal when the same expression acts at the same time), else its
    identity."""
    if type(fn).__eq__ is object.__eq__:
        return id(fn)
    try:
        hash(fn)
    except TypeError:
        return id(fn)
    return fn


def working_precision(times) -> np.ndarray:
    """Times (float64 on the host) rounded to the precision the solves run in, so that times
    told apart on the host are apart in the solve (float32 merges times 1e-8 apart)."""
    return np.asarray(np.asarray(times, np.float64).astype(jnp.result_type(float)), np.float64)


def working_round_off() -> float:
    """A relative difference the working precision resolves with room: 16 units of its last
    place, at least 1e-9 (float64: 1e-9; float32: 1.9e-6)."""
    return max(1e-9, 16 * float(np.finfo(jnp.result_type(float)).eps))


def segment_of(changes: tuple, times) -> np.ndarray:
    """The segment each time lies in (0 before the first change); a time equal to a change's
    lies after it."""
    return np.searchsorted([c.time for c in changes], times, side="right").astype(np.int32)


def segment_grids(t0: float, changes: tuple, times) -> list[np.ndarray]:
    """Each segment's output times: its start, the measurement times within it and, but for
    the last, the next change's time (where the next segment starts)."""
    starts = list(working_precision([float(t0)] + [c.time for c in changes]))
    ends = starts[1:] + [None]
    times = working_precision(times)
    grids = []
    for start, end in zip(starts, ends):
        inside = times[(times >= start) & ((times < end) if end is not None else True)]
        grid = [[start], inside] + ([[end]] if end is not None else [])
        grids.append(np.unique(np.concatenate(grid)))
    return grids


@dataclasses.dataclass(frozen=True)
class SegmentTables:
    """A batch's changes: per member and segment, the settings, the assignments that start
    it, its output times and where among them it ends."""

    settings: object  # ParameterTable (members, segments, parameters)
    assigned: np.ndarray  # (members, segments, n) bool: states set by a number or a name
    values: object  # ParameterTable (members, segments, n): those states' new values
    functions: tuple  # ((segment, state index, fn(y, p)), ...), shared by the batch
    ts: np.ndarray  # (members, segments, width)
    end: np.ndarray  # (members, segments) int: index of the segment's end in its times


def state_assignments(changes: tuple, size: int, resolve) -> tuple:
    """(assigned (segments, n) bool, (kind, index, constant) each (segments, n)) of the
    states the changes set to numbers or parameters' values (`resolve(value, j)`: the source
    of a value of change j, a name read in the settings just before it); segment 0 assigns
    none."""
    segments = len(changes) + 1
    assigned = np.zeros((segments, size), bool)
    kind = np.zeros((segments, size), np.int32)
    index = np.zeros((segments, size), np.int32)
    constant = np.zeros((segments, size), np.float64)
    for j, change in enumerate(changes, start=1):
        for i, value in change.states.items():
            if callable(value):
                continue
            assigned[j, i] = True
            kind[j, i], index[j, i], constant[j, i] = resolve(value, j)
    return assigned, (kind, index, constant)


def functions_of(changes: tuple) -> tuple:
    return tuple(
        (j, i, value)
        for j, change in enumerate(changes, start=1)
        for i, value in sorted(change.states.items())
        if callable(value)
    )
