"""`ds.multiple_shooting`: a `ds.Problem` whose experiments are cut into time windows, each
window after the first starting from a state that is estimated with the rest (multiple
shooting, Bock 1981), its continuity with the window before measured as zero.

Why: over a long series (many periods of an oscillation, a chaotic stretch, a network that
starts far off), the likelihood of one simulation from t0 has many local optima and steep
walls; the windows' own starts let each window follow its data from the first step, so a fit
or a training run sees a smoother objective, and the continuity measurements pull the windows
together as it converges. The result is a problem like any other (`ds.fit`, `ds.train`); its
unknowns' values on the model then go back to the original problem
(`problem.llh(result.params)`), which is continuous by construction.
"""

import dataclasses

import jax.numpy as jnp
import numpy as np

from .study import Experiment, Observable, Problem, Unknown, vector_state_size

_START, _NEXT = "shoot:start:{}", "shoot:next:{}"


def multiple_shooting(problem: Problem, segments: int, *, sigma=None) -> Problem:
    """`problem` with each experiment cut into `segments` windows of equal length between its
    t0 and its last measurement.

    **Arguments:**

    - `problem`: a `ds.Problem` whose experiments have no changes at given times.
    - `segments`: windows per experiment (≥ 2).
    - `sigma`: the noise of the continuity measurements: at the end of each window but the
      last, every state component minus the next window's start, measured as 0 with this
      standard deviation (a number or one per component, in the state's units: smaller
      pulls the windows together harder, and too small a value makes the fit as hard as one
      shot; default: 5% of each component's largest magnitude at the windows' starts).

    **Returns:** a `ds.Problem` with the same model and observables plus `continuity:<i>` per
    state component, the windows as experiments (`"<name> [window k]"`; a measurement at a
    boundary belongs to the window it ends), and per window after the first its start, the
    unknowns `"<name> [window k]:<i>"` (linear scale, unbounded, estimated), initialised
    from the original problem's trajectory at its unknowns' values. Windows after the first
    start from their unknowns, not from a pre-equilibration. A first window whose
    experiment starts from a constant state (no function of the parameters, no
    pre-equilibration or reinitialisation) starts from it through the same settings, so
    that all windows of that kind run as one vmapped batch (`_first_window_joins`).
    `ds.fit`'s screen scatters unbounded unknowns by ±max(|value|, 1): give `starts=` (e.g.
    `problem.theta()[None]`) to start from the trajectory itself.
    """
    if not isinstance(problem, Problem):
        raise TypeError(f"ds.multiple_shooting: expected a ds.Problem, got {problem!r}")
    if isinstance(segments, bool) or not isinstance(segments, int) or segments < 2:
        raise ValueError(f"ds.multiple_shooting: segments must be an int >= 2, got {segments!r}")
    for name, changes in zip(problem.experiment_names, problem.changes):
        if changes:
            raise ValueError(
                f"ds.multiple_shooting: experiment {name!r} has changes at given times, "
                "which its windows would have to split; not supported"
            )
    names = list(problem.observables)
    size = vector_state_size(
        problem, "ds.multiple_shooting", " (its windows' starts are unknowns per component)"
    )
    boundaries = [
        _boundaries(label, e, rows, segments)
        for label, e, rows in zip(problem.experiment_names, problem.experiments, problem.rows)
    ]
    starts = _trajectory_at(problem, boundaries, size)
    for label, states in zip(problem.experiment_names, starts):
        bad = np.nonzero(~np.all(np.isfinite(states), axis=1))[0]
        if bad.size:
            raise ValueError(
                f"ds.multiple_shooting: experiment {label!r} cannot be simulated to the start "
                f"of its window {bad[0] + 1} at the unknowns' values (the solve failed): "
                "start from values it can be simulated at"
            )
    sigmas = _continuity_sigmas(sigma, starts, size)
    observables = dict(problem.observables)
    unknowns = dict(problem.unknowns)
    taken = sorted(
        {f"continuity:{i}" for i in range(size)} & set(observables)
        | {f(i) for f in (_START.format, _NEXT.format) for i in range(size)} & set(unknowns)
    )
    if taken:
        raise ValueError(f"ds.multiple_shooting: the problem already has {taken}")
    for i in range(size):
        observables[f"continuity:{i}"] = Observable(_Defect(i), sigma=float(sigmas[i]))
        # what each window's own settings point at (its start, the next window's start)
        unknowns[_START.format(i)] = Unknown(0.0, estimate=False)
        unknowns[_NEXT.format(i)] = Unknown(0.0, estimate=False)
    experiments = []
    window_start = _WindowStart(size)  # one function: experiments batch by its identity
    for e, (experiment, label, rows) in enumerate(
        zip(problem.experiments, problem.experiment_names, problem.rows)
    ):
        edges = boundaries[e]
        window_of = np.searchsorted(edges, rows.time, side="left")  # edges[k-1] < t <= edges[k]
        joins = _first_window_joins(experiment)
        for k in range(segments):
            start = [f"{label} [window {k}]:{i}" for i in range(size)]
            after = [f"{label} [window {k + 1}]:{i}" for i in range(size)]
            if k:
                for i, name in enumerate(start):
                    if name in unknowns:
                        raise ValueError(f"ds.multiple_shooting: the problem already has {name!r}")
                    unknowns[name] = Unknown(float(starts[e][k - 1][i]))
            mine = window_of == k
            data = {
                "time": rows.time[mine],
                "observable": [names[o] for o in rows.observable[mine]],
                "value": rows.value[mine],
            }
            for column, cells in rows.overrides.items():
                data[column] = np.asarray(cells, dtype=object)[mine]
            settings = dict(experiment.set or {})
            if k < segments - 1:  # the continuity at this window's end
                end = float(edges[k])
                data["time"] = np.concatenate([data["time"], np.full(size, end)])
                data["observable"] = data["observable"] + [f"continuity:{i}" for i in range(size)]
                data["value"] = np.concatenate([data["value"], np.zeros(size)])
                for column in rows.overrides:
                    data[column] = np.concatenate([data[column], np.full(size, np.nan, object)])
                settings.update({_NEXT.format(i): after[i] for i in range(size)})
            if k:
                settings.update({_START.format(i): start[i] for i in range(size)})
            elif joins:  # the first window starts from its experiment's constant state
                y0 = np.asarray(experiment.y0, dtype=float).ravel()
                settings.update({_START.format(i): float(y0[i]) for i in range(size)})
            experiments.append(
                dataclasses.replace(
                    experiment,
                    data=data,
                    y0=experiment.y0 if k == 0 and not joins else window_start,
                    t0=float(experiment.t0) if k == 0 else float(edges[k - 1]),
                    set=settings,
                    pre_equilibrate=experiment.pre_equilibrate if k == 0 else None,
                    reinitialize=experiment.reinitialize if k == 0 else (),
                    name=f"{label} [window {k}]",
                )
            )
    return Problem(
        problem.model,
        experiments,
        observables,
        unknowns,
        solver=problem.solver,
        max_steps=problem.max_steps,
    )


class _WindowStart:
    """A window's initial state: the unknowns its settings point `shoot:start:<i>` at."""

    def __init__(self, size: int):
        self.size = size

    def __call__(self, p):
        return jnp.stack([jnp.asarray(p[_START.format(i)]) for i in range(self.size)])


class _Defect:
    """A continuity measurement: state component i minus the next window's start."""

    def __init__(self, i: int):
        self.i = i

    def __call__(self, t, y, p):
        return y[self.i] - p[_NEXT.format(self.i)]


def _continuity_sigmas(sigma, starts, size: int) -> np.ndarray:
    """Per state component, the continuity measurements' noise: `sigma` (a number, or one per
    component), by default 5% of the component's largest magnitude at the windows' starts
    (1e-3 of the largest component's where a component is zero there): in the state's own
    units, whatever the observables' noise models and scalings."""
    if sigma is None:
        largest = np.max(np.abs(np.concatenate(starts)), axis=0)
        if not np.max(largest) > 0:
            return np.ones(size)
        return np.maximum(0.05 * largest, 1e-3 * np.max(largest))
    sigmas = np.asarray(sigma, dtype=float).ravel()
    if sigmas.size == 1:
        sigmas = np.full(size, sigmas[0])
    if sigmas.size != size or not np.all(np.isfinite(sigmas)) or not np.all(sigmas > 0):
        raise ValueError(
            f"ds.multiple_shooting: sigma must be positive (a number or one per state "
            f"component, {size}), got {sigma!r}"
        )
    return sigmas


def _boundaries(label: str, experiment: Experiment, rows, segments: int) -> np.ndarray:
    """The windows' ends but the last: equal lengths from t0 to the last measurement."""
    t0, t1 = float(experiment.t0), float(np.max(rows.time))
    if not t1 > t0:
        raise ValueError(
            f"ds.multiple_shooting: experiment {label!r} has no measurement after its t0 to "
            "cut into windows"
        )
    return t0 + (t1 - t0) * np.arange(1, segments) / segments


def _trajectory_at(problem: Problem, boundaries, size: int) -> list:
    """Per experiment, (segments − 1, size): the states at its boundaries, simulated at the
    unknowns' values (a problem measuring every state component there)."""
    observables = {
        f"state:{i}": Observable(lambda t, y, p, i=i: y[i], sigma=1.0) for i in range(size)
    }
    experiments = [
        dataclasses.replace(
            experiment,
            data={
                "time": np.repeat(edges, size),
                "observable": [f"state:{i}" for _ in edges for i in range(size)],
                "value": np.zeros(edges.size * size),
            },
        )
        for experiment, edges in zip(problem.experiments, boundaries)
    ]
    probe = Problem(
        problem.model,
        experiments,
        observables,
        # held at their values: what only the original observables read is read by nothing
        {n: dataclasses.replace(u, estimate=False) for n, u in problem.unknowns.items()},
        solver=problem.solver,
        max_steps=problem.max_steps,
    )
    return [
        np.asarray(p["prediction"]).reshape(len(edges), size)
        for p, edges in zip(probe.predictions(), boundaries)
    ]


def _first_window_joins(experiment: Experiment) -> bool:
    """Whether an experiment's first window can start as the later ones do, from the
    `shoot:start` settings (its constant initial state as values): then every window of the
    problem runs in one vmapped batch, one copy of the solves in a compiled fit or training
    step instead of two. Not where its start is a function of the parameters, or comes from
    a pre-equilibration or its reinitialisation."""
    return (
        not callable(experiment.y0)
        and experiment.pre_equilibrate is None
        and not experiment.reinitialize
    )
