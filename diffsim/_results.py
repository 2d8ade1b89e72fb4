"""Result codes of a simulation and the error raised for them.

A solve never raises from inside compiled code on its own: it returns a result code per trajectory
(`Solution.result`). `simulate(..., throw=True)` turns a non-zero code into an error whose text says
what went wrong and what to do; with `throw=False` (the way to run under `vmap`) the codes are left
for the caller, one per member.
"""

import enum


class RESULTS(enum.IntEnum):
    """Outcome of a simulation; `Solution.result` holds these values as an int32 array.

    `successful` (0), `invalid_input` (1), `max_steps_reached` (2), `step_size_collapsed` (3),
    `nonlinear_solver_failed` (4), `solver_failed` (5), `nonfinite_state` (6),
    `event_limit_reached` (7), `event_failed` (8), `inconsistent_initial_state` (9),
    `no_steady_state` (10, `ds.steady_state`).
    `RESULTS(code).message` (or
    `ds.result_message(code)`) says what went wrong and what to do. Sweep stores hold -1 for
    members not computed yet."""

    successful = 0
    invalid_input = 1
    max_steps_reached = 2
    step_size_collapsed = 3
    nonlinear_solver_failed = 4
    solver_failed = 5
    nonfinite_state = 6
    event_limit_reached = 7
    event_failed = 8
    inconsistent_initial_state = 9
    no_steady_state = 10

    @property
    def message(self) -> str:
        return _MESSAGES[self]


_MESSAGES = {
    RESULTS.successful: "the simulation succeeded",
    RESULTS.invalid_input: (
        "invalid input: a model parameter or y0 is not finite, a parameter breaks its "
        "constraint (e.g. a length <= 0), ts is not strictly increasing (a ts traced under jit "
        "must increase; pass a concrete one to integrate backwards), a tolerance is negative "
        "or dtmin exceeds dtmax, or a delay equation's lag is not positive and finite or is "
        "shorter than a fixed step dt; check the inputs of this member"
    ),
    RESULTS.max_steps_reached: (
        "the adaptive solver reached max_steps before the last output time: raise max_steps, "
        "loosen rtol/atol, or use a stiff solver (ds.Rodas5P) if the problem is stiff; if "
        "the solution grows without bound (a blow-up in finite time), the steps shrink towards "
        "it and no solver can pass it"
    ),
    RESULTS.step_size_collapsed: (
        "the step size fell below dtmin: the solution may blow up (finite-time singularity) or "
        "the problem is stiff; use a stiff solver (ds.Rodas5P) or lower dtmin"
    ),
    RESULTS.nonlinear_solver_failed: (
        "the implicit solver's nonlinear (Newton) iteration failed to converge: with adaptive "
        "steps tighten rtol/atol so the steps shrink; with constant steps (where the "
        "steps cannot shrink) use ds.Rodas5P, which has no Newton iteration, or adaptive "
        "steps; or check the vector field for discontinuities"
    ),
    RESULTS.solver_failed: "the underlying diffrax solver reported a failure",
    RESULTS.nonfinite_state: (
        "the state became non-finite (NaN or inf): for a fixed-step solver make dt smaller "
        "(the step may be beyond the method's stability limit); otherwise check the model for "
        "divisions by zero or blow-up"
    ),
    RESULTS.event_limit_reached: (
        "an event with a reset occurred more often than its max_events: raise max_events (a "
        "bouncing ball with restitution < 1 bounces infinitely often before it comes to rest, so "
        "end the simulation earlier or add a terminal event for the resting state)"
    ),
    RESULTS.event_failed: (
        "an event could not be tracked: its condition returned NaN or inf at a finite state, or "
        "its crossing could not be located (a condition that jumps, like a step function, has "
        "no zero for the root finder to find). Write the condition as a continuous signed "
        "distance that is finite wherever the state is (e.g. y[0] - level). Or, in a solve "
        "diffrax runs (ds.Kvaerno5, ds.Diffrax, an adjoint other than 'auto'), two conditions "
        "crossed in one step and diffrax located the one listed first, not the earliest: "
        "give the solver a dtmax shorter than the time between them, or use an explicit pair "
        "(ds.Tsit5, ...) or a Rosenbrock method (ds.Rodas5P, ...), which locate the earliest"
    ),
    RESULTS.inconsistent_initial_state: (
        "y0 does not satisfy the algebraic equations of the differential-algebraic model (the "
        "rows of its mass matrix that are zero): start from "
        "ds.consistent_initial_state(model, y0, t0), which solves them for the algebraic "
        "components"
    ),
    RESULTS.no_steady_state: (
        "no equilibrium was found: the trajectory from y0 did not come to rest within "
        "max_time (it oscillates, grows without bound, or settles more slowly), or Newton's "
        "method did not converge from y0. Check the model, raise max_time, loosen rtol/atol, "
        "or use method='simulate' from a nearer y0"
    ),
}


class PrecisionWarning(UserWarning):
    """A solve asks for more than its floating-point type resolves: a fixed step below the
    spacing of the times it steps through, or tolerances below the type's epsilon. The result
    is then dominated by rounding (a state can freeze at its initial value)."""


class SimulationError(RuntimeError):
    """Raised by `simulate(..., throw=True)` when a solve does not succeed."""

    def __init__(self, code: RESULTS, detail: str = "", message: str | None = None):
        self.code = code
        text = f"simulation failed ({code.name}): {code.message if message is None else message}"
        super().__init__(text + (f". {detail}" if detail else ""))


def result_message(code) -> str:
    """The explanation of a result code (an int or a 0-d array of one)."""
    return RESULTS(int(code)).message
