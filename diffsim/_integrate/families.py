"""Which loop solves which solver family.

Each family's solve registers itself for the family's base class (`@solves(AbstractFamily)`);
`simulate` looks the solver up along its class's method resolution order, so a subclass runs
its family's loop and a new family (a base class in `_solver/` and its loop here) is added
without touching `simulate`, `sweep` or `fit`.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

from .._solver.base import AbstractSolver


class Solved(NamedTuple):
    """What a family's solve returns to `simulate`."""

    ys: Any  # the states at the output times, a pytree like y0 with a leading time axis
    stats: dict  # num_steps, num_rejected_steps, num_function_evals (when known), num_events
    result: Any  # int32 RESULTS code
    reached: Any = None  # with events: bool (times,), False after a terminal event
    records: Any = None  # with events: the `Records` of every occurrence


_SOLVES: dict[type, Callable[..., Solved]] = {}


def solves(family: type[AbstractSolver]):
    """Register the decorated function as the solve of `family` (a solver base class)."""

    def register(solve):
        _SOLVES[family] = solve
        return solve

    return register


def solve_of(solver: AbstractSolver) -> Callable[..., Solved]:
    """The solve registered for the nearest family of `solver`'s class."""
    for cls in type(solver).__mro__:
        if cls in _SOLVES:
            return _SOLVES[cls]
    raise TypeError(
        f"{type(solver).__name__} belongs to no solver family with a registered solve; a new "
        "family registers its loop with diffsim._integrate.families.solves"
    )


class SolveRequest(NamedTuple):
    """One `simulate` call after its common checks, passed whole to the family's solve."""

    model: Any  # cast to the state's precision
    y0: Any  # the initial state, a pytree of arrays
    ts: Any  # output times, an array in the state's real dtype (traced under jit)
    host_ts: Any  # the same times as a NumPy array when concrete (plans fixed steps), else traced
    dtype: Any  # the real dtype of the solve
    events: tuple | None  # the events, cast to the state's precision
    key: Any  # the Brownian path's PRNG key of a stochastic solve, else None
    dt: Any  # fixed step, or an adaptive solver's first step; None when not given
    steps_per_save: int | None
    max_steps: int
    checkpoint: Any
    adjoint: Any
