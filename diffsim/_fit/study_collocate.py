"""`ds.collocate`: a start for training the networks inside a `ds.Problem`'s model, found
without solving it: the model's vector field fitted to the derivatives of smoothing splines
through the measured states (collocation: Varah 1982; for neural ODEs Roesch, Rackauckas &
Stumpf 2021).

Why: training from a random network by simulating from t0 (`ds.train`) starts on a
log-likelihood whose trajectories have left the data after the first oscillation, and on a
long or chaotic series it crawls for thousands of steps (Ko's double pendulum: a training
log-likelihood of −7,404 after 1,500 steps, −918 after 15,000; −665 within 1,000 steps from
this start, docs/performance.md). Where every state is measured, the data give the state and
its derivative at each time, so the network can first be fitted by regression, in a second,
and `ds.train` then only polishes the trajectory.

Why by hand: scipy's `make_smoothing_spline` (its smoothing chosen by generalised
cross-validation) gives the states and derivatives, optax's Adam fits the field; what is
left, which observable reads which state and how each experiment sets the parameters, is the
problem's own knowledge, here.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

from .libraries import third_party_promotion
from .study import Problem, vector_state_size
from .study_objective import (
    parameters_dict,
    scaled_on_host,
    simulation_model,
    to_natural_values,
)
from .study_train import network_paths, networks_of, with_trained

_MIN_TIMES = 5  # a cubic smoothing spline needs at least this many distinct times


def collocate(
    problem: Problem,
    networks,
    *,
    steps: int = 5000,
    learning_rate: float = 3e-3,
) -> Problem:
    """`problem` with its networks (and its estimated unknowns that are parameters of the
    model) fitted so that the model's vector field matches the data's derivatives: a start
    for `ds.train`.

    **Arguments:**

    - `problem`: a `ds.Problem` in which every state component is measured directly (an
      observable `y[i]`, any noise model) in at least one experiment, at 5 or more distinct
      times; only such experiments are used (and none with changes at given times).
    - `networks`: the networks to fit, named as for `ds.train` (`"net"`, `'nets["net1"]'`).
    - `steps`, `learning_rate`: Adam's steps (one compiled `lax.scan`) and initial step
      size (cosine decay to 0).

    **Returns:** the problem with the fitted model and unknowns
    (`problem.with_model(model, unknowns=...)`), for `ds.train(problem, networks, ...)`.

    Each experiment's measured states are smoothed per component by a cubic smoothing spline
    (its smoothing chosen by generalised cross-validation; replicates averaged), the
    spline's state x̂(t) and derivative x̂'(t) taken at the measurement times common to all
    components, and the loss is the mean over times and components of
    ((f(t, x̂, p) − x̂')/s)², s a component's root mean square of x̂'. The fit only needs the
    field, not a solve: seconds for thousands of steps. It is a start: the derivative of a
    spline through noisy or sparse data is rough, and a model whose states cannot follow the
    data exactly (a structural misfit) is fitted where its derivatives can be matched, so
    train on the trajectories afterwards.
    """
    import optax
    from scipy.interpolate import make_smoothing_spline

    if not isinstance(problem, Problem):
        raise TypeError(f"ds.collocate: expected a ds.Problem, got {type(problem).__name__}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"ds.collocate: steps must be an int >= 1, got {steps!r}")
    if not (isinstance(learning_rate, (int, float)) and learning_rate > 0):
        raise ValueError(f"ds.collocate: learning_rate must be positive, got {learning_rate!r}")
    paths = network_paths(problem.model, networks, "ds.collocate")
    tables = problem.tables
    dtype = jnp.result_type(float)
    natural = np.asarray(problem.first_guess(), float)
    # (experiments, parameters): each experiment's parameter values, as it sets them
    values = np.concatenate(
        [np.asarray(g.settings.values(jnp.asarray(natural))) for g in tables.groups]
    )
    # each experiment's row in the groups' settings tables, stacked in group order
    position = np.argsort(np.concatenate([g.members for g in tables.groups]))
    values = values[position]
    size = vector_state_size(problem, "ds.collocate", "")
    reads = _state_observables(problem, values[0], size)

    times, states, slopes, members = [], [], [], []
    for k, rows in enumerate(problem.rows):
        if problem.changes[k]:  # parameters that switch at given times: not one field
            continue
        picked = _splined(rows, reads, size, make_smoothing_spline)
        if picked is None:
            continue
        t, x, dx = picked
        times.append(t)
        states.append(x)
        slopes.append(dx)
        members.append(np.full(t.size, k))
    if not times:
        missing = [i for i in range(size) if not any(r == i for r in reads.values())]
        names = _state_names(problem, size)
        what = (
            f"states {[names[i] for i in missing]} are measured by no observable that is the "
            "state itself (y[i])"
            if missing
            else f"no experiment measures every state at {_MIN_TIMES} or more distinct times"
        )
        raise ValueError(
            f"ds.collocate: {what}; collocation needs every state's data to fit the vector "
            "field; train on the trajectories with ds.train alone"
        )
    t = jnp.asarray(np.concatenate(times), dtype)
    x = jnp.asarray(np.concatenate(states), dtype)
    dx = jnp.asarray(np.concatenate(slopes), dtype)
    member = np.concatenate(members)
    scale = np.sqrt(np.mean(np.asarray(dx) ** 2, axis=0))
    scale = jnp.asarray(np.where(scale > 0, scale, 1.0), dtype)

    lower, upper = jnp.asarray(tables.lower, dtype), jnp.asarray(tables.upper, dtype)
    weights, model_of = networks_of(problem.model, paths)
    params = (jnp.asarray(scaled_on_host(natural, tables.scales), dtype), weights)
    settings = [g.settings for g in tables.groups]
    row_of = jnp.asarray(position[member])

    def loss(params):
        scaled, weights = params
        theta = to_natural_values(scaled, tables.scales)
        model = model_of(weights)
        # every point's parameter values, as its experiment sets them
        table = jnp.concatenate([s.values(theta) for s in settings])

        def field(t, x, v):
            return simulation_model(problem, v, model).vector_field(t, x, None)

        f = jax.vmap(field)(t, x, table[row_of])
        return jnp.mean(((f - dx) / scale[None, :]) ** 2)

    optimizer = optax.adam(optax.cosine_decay_schedule(learning_rate, steps))

    @jax.jit
    def fit(params):
        def step(carry, _):
            params, state = carry
            value, grad = jax.value_and_grad(loss)(params)
            with third_party_promotion():  # optax mixes its int step count with floats
                updates, state = optimizer.update(grad, state, params)
            scaled, weights = optax.apply_updates(params, updates)
            return ((jnp.clip(scaled, lower, upper), weights), state), value

        (params, _), history = jax.lax.scan(step, (params, optimizer.init(params)), None, steps)
        return params, history[0], loss(params)

    fitted, first, last = fit(params)
    if not math.isfinite(float(last)):
        raise ValueError(
            f"ds.collocate: the loss is not finite after {steps} steps (it was {float(first):.3g}"
            " at the start): lower learning_rate"
        )
    scaled, weights = fitted
    return with_trained(problem, model_of(weights), scaled)[2]


def _state_names(problem: Problem, size: int) -> list:
    names = getattr(problem.model, "state_names", None)
    return list(names) if names and len(names) == size else [f"y[{i}]" for i in range(size)]


def _state_observables(problem: Problem, values, size: int) -> dict:
    """observable index → the state component it is (`fn(t, y, p) == y[i]`), for those that
    are one: each observable is evaluated at two random states and must return one
    component's value at both, exactly."""
    p = parameters_dict(problem, jnp.asarray(values))
    # in the floats' dtype, so that an observable y[i] returns the probe's value exactly
    probes = jnp.asarray(np.random.default_rng(0).uniform(0.5, 2.0, (2, size)), float)
    reads = {}
    for k, observable in enumerate(problem.observables.values()):
        try:
            out = [float(observable.fn(0.5, y, p)) for y in probes]
        except Exception:  # a function of more than the state (or of other shapes): not one
            continue
        for i in range(size):
            if all(o == float(y[i]) for o, y in zip(out, probes)):
                reads[k] = i
                break
    return reads


def _splined(rows, reads: dict, size: int, smoothing_spline):
    """One experiment's (times, states (times, size), derivatives (times, size)) from the
    smoothing splines through each state's measurements, at the times within every
    component's measured range; None unless every state is measured at `_MIN_TIMES` or
    more distinct times."""
    splines, spans, measured = [], [], []
    for i in range(size):
        mine = np.isin(rows.observable, [k for k, r in reads.items() if r == i])
        mine &= np.isfinite(rows.value)
        t, v = rows.time[mine], rows.value[mine]
        distinct = np.unique(t)
        if distinct.size < _MIN_TIMES:
            return None
        mean = np.array([v[t == s].mean() for s in distinct])  # replicates averaged
        splines.append(smoothing_spline(distinct, mean))
        spans.append((distinct[0], distinct[-1]))
        measured.append(distinct)
    start, end = max(s[0] for s in spans), min(s[1] for s in spans)
    times = np.unique(np.concatenate(measured))
    times = times[(times >= start) & (times <= end)]
    if times.size < _MIN_TIMES:
        return None
    states = np.stack([s(times) for s in splines], axis=1)
    slopes = np.stack([s.derivative()(times) for s in splines], axis=1)
    return times, states, slopes
