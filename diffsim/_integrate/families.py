"""Which loop solves which solver family.

Each family's solve registers itself for the family's base class (`@solves(AbstractFamily)`);
`simulate` looks the solver up along its class's method resolution order, so a subclass runs
its family's loop and a new family (a base class in `_solver/` and its loop here, imported
in `_integrate/__init__.py`) is added without touching `simulate`, `sweep` or `fit`.
"""

from collections.abc import Callable
from typing import NamedTuple

import diffrax
import numpy as np
from jaxtyping import Array, Bool, Float, Int, Key, PyTree

from .._events import Event, Records
from .._model import AbstractODE
from .._solver.base import AbstractSolver


class Solved(NamedTuple):
    """What a family's solve returns to `simulate`."""

    ys: PyTree[Array]  # the states at the output times, like y0 with a leading time axis
    stats: dict[str, Int[Array, ""]]  # num_steps, num_rejected_steps, num_function_evals
    # (when known), num_events
    result: Int[Array, ""]  # RESULTS code
    reached: Bool[Array, " times"] | None = None  # with events: False after a terminal event
    records: Records | None = None  # with events: every occurrence
    dense: object = None  # with dense=True: the `dense.DenseOutput` of the solve


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

    model: AbstractODE  # cast to the state's precision
    y0: PyTree[Array]  # the initial state
    ts: Float[Array, " times"]  # in the state's real dtype (traced under jit)
    host_ts: np.ndarray | Array  # the same times on the host when concrete (they plan fixed
    # steps), else the traced ts
    dtype: np.dtype  # the real dtype of the solve
    events: tuple[Event, ...] | None  # cast to the state's precision
    key: Key[Array, ""] | None  # the Brownian path's key of a stochastic solve
    dt: float | Array | None  # the fixed step, or an adaptive solver's first step
    steps_per_save: int | None
    max_steps: int
    checkpoint: int | str | None  # "auto", None or steps per checkpointed block
    adjoint: str | diffrax.AbstractAdjoint
    dense: bool = False  # keep every step's interpolant (`Solution.evaluate`)
