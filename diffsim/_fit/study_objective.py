"""The compiled objective of a `ds.Problem`: simulate every experiment (each group of
experiments as one `vmap`ped batch), evaluate every measurement's observable and noise, and
return the negative log-likelihood, or residuals whose sum of squares is twice it (plus a
constant), for least-squares optimisers.

Residual form (Data2Dynamics' error model, Raue et al. 2013): a measurement with normal noise
contributes (m − y)/σ and √(log(2πσ²) + C), so that Σ r² = 2·NLL + const and a
Levenberg–Marquardt step sees how σ enters; a Laplace one √(2(log 2σ + |m − y|/σ) + C) (not
smooth at m = y: `ds.fit` minimises those by BFGS); a prior √(2(−log π(x)) + C). C keeps the
roots real for σ (and densities) down to e^(−C/2); below that the root is held at 0 (a σ of
1e-9 is no measurement's noise).
"""

import math

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._compile import jit
from .._integrate.simulate import simulate
from .._integrate.steady_state import steady_state
from .problem import kind_of, to_natural, to_unconstrained

# keeps √(log(2πσ²) + C) and √(2(−log π) + C) real for σ ≳ 1e-9 and densities ≲ e^20
RESIDUAL_OFFSET = 40.0


# --- a study's parameters ------------------------------------------------------------------


def simulation_model(problem, values, model=None):
    """The model (`problem.model` unless given) with its parameters set from `values` (one
    entry per parameter name; the extras are ignored)."""
    model = problem.model if model is None else model
    names = list(problem.model_parameters)
    if not names:
        return model
    getters = [problem.model_parameters[n] for n in names]
    replacements = [
        values[k].astype(jnp.result_type(getter(model))) for k, getter in enumerate(getters)
    ]
    return eqx.tree_at(lambda m: [g(m) for g in getters], model, replacements)


def parameters_dict(problem, values) -> dict:
    """The dict `p` the study's functions see: every parameter by name."""
    return {name: values[k] for k, name in enumerate(problem.parameter_names)}


# --- scales and the optimiser's coordinates ------------------------------------------------------


def to_natural_values(theta_scaled, scales):
    """Values on each unknown's scale → natural values."""
    scales = np.asarray(scales)
    return jnp.where(
        scales == "log10",
        10.0**theta_scaled,
        jnp.where(scales == "log", jnp.exp(theta_scaled), theta_scaled),
    )


def to_scaled_values(x, scales):
    """Natural values → each unknown's scale."""
    scales = np.asarray(scales)
    safe = jnp.where(scales == "lin", 1.0, x)
    return jnp.where(
        scales == "log10", jnp.log10(safe), jnp.where(scales == "log", jnp.log(safe), x)
    )


def natural_on_host(theta_scaled, scales) -> np.ndarray:
    """`to_natural_values` in NumPy, for host-side tables (nothing compiled)."""
    scales = np.asarray(scales)
    x = np.asarray(theta_scaled, np.float64)
    with np.errstate(over="ignore"):
        return np.where(scales == "log10", 10.0**x, np.where(scales == "log", np.exp(x), x))


def scaled_on_host(x, scales) -> np.ndarray:
    """`to_scaled_values` in NumPy."""
    scales = np.asarray(scales)
    x = np.asarray(x, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(scales == "log10", np.log10(x), np.where(scales == "log", np.log(x), x))


def bound_kinds(tables) -> tuple[str, ...]:
    return tuple(kind_of(lo, hi) for lo, hi in zip(tables.lower, tables.upper))


def _finite(bound, fill):
    return np.where(np.isfinite(bound), bound, fill)


def scaled_from_u(u, tables):
    """The optimiser's unconstrained coordinates → values on each unknown's scale, strictly
    inside its bounds (a logistic map between two bounds: uniform on the scale, so ten decades
    of a log10 unknown are ten equal stretches of u)."""
    lower = jnp.asarray(_finite(tables.lower, 0.0), u.dtype)
    upper = jnp.asarray(_finite(tables.upper, 0.0), u.dtype)
    return to_natural(u, lower, upper, bound_kinds(tables))


def u_from_scaled(theta_scaled, tables):
    lower = jnp.asarray(_finite(tables.lower, 0.0), theta_scaled.dtype)
    upper = jnp.asarray(_finite(tables.upper, 0.0), theta_scaled.dtype)
    return to_unconstrained(theta_scaled, lower, upper, bound_kinds(tables))


# --- simulations and measurements -------------------------------------------------------------


def _simulate_group(problem, group, theta, dtype, base=None, subset=None, forward=False):
    """States at the group's output times, (members, times, n); NaN for a member whose
    simulation (or pre-equilibration) failed. With `subset` (an index array of members),
    only those are simulated: (len(subset), times, n). `forward`: differentiated in forward
    mode only (`_solve`)."""
    settings = group.settings.values(theta)
    pre = None if group.pre is None else group.pre.values(theta)
    reset = None if group.reset is None else jnp.asarray(group.reset)
    y0s = None if group.y0 is None else jnp.asarray(group.y0, dtype)
    ts = jnp.asarray(group.ts, dtype)

    def initial(values, y0):
        if group.y0_fn is None:
            return y0
        return jnp.asarray(group.y0_fn(parameters_dict(problem, values)), dtype)

    def member(values, pre_values, y0, times, anew, segments):
        start = initial(values, y0)
        if pre_values is None and _fires(model_in_use):
            # at t0 an event of the state fires if its trigger holds there and its
            # initial value is false (after a pre-equilibration the solve goes on instead)
            start = simulation_model(problem, values, base).fire_on_jump(times[0], None, start)
        if pre_values is not None:
            rest = steady_state(
                simulation_model(problem, pre_values, base),
                initial(pre_values, y0),
                t0=times[0],
                throw=False,
            )
            rested = jnp.where(anew, start, rest.y)
            start = jnp.where(rest.succeeded, rested, jnp.nan)
        if segments is not None:
            return _run_segments(problem, group.segments.functions, start, segments, base, forward)
        return _solve(problem, simulation_model(problem, values, base), start, times, forward)

    model_in_use = problem.model if base is None else base
    if group.pre is not None and _fires(model_in_use):
        raise ValueError(
            f"{type(model_in_use).__name__} has events triggered by the state "
            f"({', '.join(model_in_use.triggered_events)}), which a pre-equilibration's "
            "steady-state search does not apply: diffsim cannot pre-equilibrate this model"
        )
    segments = None
    if group.segments is not None:
        tables = group.segments
        segments = (
            tables.settings.values(theta),
            jnp.asarray(tables.assigned),
            tables.values.values(theta).astype(dtype),
            jnp.asarray(tables.ts, dtype),
            jnp.asarray(tables.end),
        )

    arguments = (settings, pre, y0s, ts, reset, segments)
    if subset is not None:
        arguments = jax.tree.map(lambda a: a[subset], arguments)
    members = group.ts.shape[0] if subset is None else len(subset)
    if members == 1:
        # one member: vmap would trace and compile its solves' while loops batched, for a
        # batch of one (Zheng's log-likelihood: 19.3 s to trace, 10.3 s to compile batched)
        alone = member(*jax.tree.map(lambda a: a[0], arguments))
        return alone[None]
    if forward and group.segments is None and jax.default_backend() in _IN_TURN_ON:
        return _in_turn(member, arguments)
    axes = tuple(None if a is None else 0 for a in arguments)
    return jax.vmap(member, in_axes=axes)(*arguments)


# Where a fit's forward-mode passes (its residuals and their Jacobian, `forward`) simulate the
# members of a group without changes at given times one after another rather than as a vmapped
# batch. A batch steps in lockstep: every member takes as many steps as the slowest (its
# tangents computed, the finished ones masked), which members of different dynamics (PEtab
# conditions that switch reactions off) pay at every iteration; where they step alike, a batch
# of small systems costs little more than one. Measured (2 cores, 6 seeded uniform starts × 5,
# both programs in one process, calls interleaved; in turn / batched): Bruno (6 conditions)
# residuals 0.67, Jacobian 0.78; Fiedler (3) 0.91, 0.54; but Fujita (6 conditions of doses
# given as changes at given times, which step alike) 2.37 and 1.04, so a group with changes
# stays batched, though Weber's (two, changes and pre-equilibration) would gain (0.91, 0.79):
# changes stand in for "members that step alike", which is not known before the run. On an
# accelerator the batch's parallelism wins (not measured).
_IN_TURN_ON = ("cpu",)


def _in_turn(member, arguments):
    """`jax.vmap(member)` over the leading axis of the arguments that are not None, as a
    `lax.map`: one member's solve at a time (one copy of it in the program, as the batch)."""
    given = [a for a in arguments if a is not None]

    def one(values):
        values = iter(values)
        return member(*(None if a is None else next(values) for a in arguments))

    return jax.lax.map(one, given)


def _fires(model) -> bool:
    """Whether `model` has events triggered by the state (an SBML model's)."""
    return bool(getattr(model, "triggered_events", ()))


def _solve(problem, model, start, times, forward=False):
    """The states at `times` (NaN where the solve failed). `forward`: the solve is only
    differentiated in forward mode (a fit's Jacobian), whose tangents then run through the
    loop one per unknown instead of one per input of the solve (the Jacobian `simulate`'s
    default takes so that reverse mode can transpose it): a study's unknowns set more inputs
    than there are unknowns (Bruno's 13 set 25 parameters and initial states), and above 32
    inputs the default prepares a reverse pass."""
    options = {"adjoint": diffrax.ForwardMode()} if forward else {}
    if _fires(model):
        options["events"] = model.state_events()
    solution = simulate(
        model,
        start,
        times,
        solver=problem.solver,
        max_steps=problem.max_steps,
        throw=False,
        **options,
    )
    return jnp.where(solution.succeeded, solution.ys, jnp.nan)


def _run_segments(problem, functions, start, segments, base, forward=False):
    """One experiment with changes at given times (`study_changes`): its segments in turn,
    as one `lax.scan` (one solve compiled however many segments); the states at every
    segment's padded times, concatenated, (segments · width, n)."""
    values, assigned, new_values, times, end = segments
    previous = jnp.concatenate([values[:1], values[:-1]])  # each change sees the values before

    segments = values.shape[0]

    def by_function(at):
        """Segment `at`'s assignments by functions of the state before it."""

        def apply(changed, y, p):
            for when, i, fn in functions:
                if when == at:
                    changed = changed.at[i].set(jnp.asarray(fn(y, p), y.dtype))
            return changed

        return apply

    # one branch per segment (the index is the scan's, not batched): each evaluates only its
    # own functions, so one singular at another segment's state cannot poison a gradient
    branches = [by_function(at) for at in range(segments)]

    def segment(y, inputs):
        j, own, before, assign, new, ts, stop = inputs
        changed = jnp.where(assign, new, y)
        if functions:
            changed = jax.lax.switch(j, branches, changed, y, parameters_dict(problem, before))
        model = simulation_model(problem, own, base)
        if _fires(model):
            # a trigger the change makes true fires now (the solver sees only crossings)
            earlier = simulation_model(problem, before, base)
            changed = model.fire_on_jump(ts[0], y, changed, earlier)
        ys = _solve(problem, model, changed, ts, forward)
        return ys[stop], ys

    steps = jnp.arange(segments)
    _, ys = jax.lax.scan(
        segment, start, (steps, values, previous, assigned, new_values, times, end)
    )
    return ys.reshape(ys.shape[0] * ys.shape[1], ys.shape[-1])  # (a model may have no state)


def row_states(problem, theta, dtype, model=None, batch=None, forward=False):
    """The state at every measurement, (measurements, n), in the study's row order; `model`
    in place of `problem.model` when given.

    `batch` (per group, an index array of its members, or None for all): only those members
    are simulated; the rows of the others take a simulated member's states (solved, so that
    no failed solve enters; `negative_log_likelihood` selects those rows out). `forward`:
    differentiated in forward mode only (`_solve`)."""
    tables = problem.tables
    pieces = []
    for g, group in enumerate(tables.groups):
        subset = None if batch is None else batch[g]
        states = _simulate_group(problem, group, theta, dtype, model, subset, forward)
        member = jnp.asarray(group.row_member)
        if subset is not None:
            # each member's place in the subset (the subset's first where it is not in it)
            place = (
                jnp.zeros(len(group.members), jnp.int32)
                .at[subset]
                .set(jnp.arange(subset.shape[0], dtype=jnp.int32))
            )
            member = place[member]
        pieces.append(states[member, jnp.asarray(group.row_time)])
    return _in_row_order(pieces, tables.groups)


def _in_row_order(pieces, groups):
    """Per-group arrays over their measurement rows, joined in the study's row order."""
    inverse = np.argsort(np.concatenate([group.rows for group in groups]))
    return jnp.concatenate(pieces)[jnp.asarray(inverse)]


def batch_weights(problem, batch, dtype):
    """Each measurement's weight in a mini-batch's log-likelihood (`row_states`' `batch`):
    members/|subset| for the rows of a chosen member of its group, 0 for the others, so that
    over uniformly drawn subsets its mean is the whole log-likelihood."""
    pieces = []
    for group, subset in zip(problem.tables.groups, batch):
        if subset is None:  # every member simulated
            pieces.append(jnp.ones(len(group.rows), dtype))
        else:
            members = len(group.members)
            chosen = jnp.zeros(members, dtype).at[subset].set(1.0)
            pieces.append(members / subset.shape[0] * chosen[jnp.asarray(group.row_member)])
    return _in_row_order(pieces, problem.tables.groups)


def observe(problem, theta, states, dtype):
    """(predictions, σ) of every measurement, each (measurements,)."""
    tables = problem.tables
    values = tables.rows.values(theta)
    times = jnp.asarray(tables.row_time, dtype)
    predictions = jnp.zeros(len(tables.row_time), dtype)
    sigmas = jnp.ones(len(tables.row_time), dtype)
    for o, observable in enumerate(problem.observables.values()):
        rows = np.nonzero(tables.row_observable == o)[0]
        if rows.size == 0:
            continue

        def one(t, y, row_values, observable=observable):
            p = parameters_dict(problem, row_values)
            prediction = jnp.asarray(observable.fn(t, y, p), dtype)
            sigma = observable.sigma
            if isinstance(sigma, str):
                sigma = p[sigma]
            elif callable(sigma):
                sigma = sigma(t, y, p)
            return prediction, jnp.asarray(sigma, dtype)

        index = jnp.asarray(rows)
        prediction, sigma = jax.vmap(one)(times[index], states[index], values[index])
        predictions = predictions.at[index].set(prediction.reshape(-1))
        sigmas = sigmas.at[index].set(sigma.reshape(-1))
    return predictions, sigmas


def noise_constants(problem):
    """Static per-measurement arrays of the noise models: (logged, ln of the log's base (1
    where not logged), the measurement on the noise model's scale, its log-Jacobian (log m
    for log, log(m ln 10) for log10, 0 on linear values), Laplace or not)."""
    tables = problem.tables
    observables = list(problem.observables.values())
    base = np.asarray([o.log_base or 0.0 for o in observables])[tables.row_observable]
    laplace = np.asarray([o.laplace for o in observables])[tables.row_observable]
    logged = base > 0
    ln_base = np.log(np.where(logged, base, math.e))
    log_measured = np.log(np.where(logged, tables.row_value, 1.0))
    measured = np.where(logged, log_measured / ln_base, tables.row_value)
    jacobian = np.where(logged, log_measured + np.log(ln_base), 0.0)
    return logged, ln_base, measured, jacobian, laplace


def _measured_terms(problem, measured, dtype):
    """(the measurements on their noise models' scales, their log-Jacobians), from the study's
    own values, or from `measured` (traced: `ds.refit`'s replicates)."""
    logged, ln_base, transformed, jacobian, _ = noise_constants(problem)
    if measured is None:
        return jnp.asarray(transformed, dtype), jnp.asarray(jacobian, dtype)
    log_measured = jnp.log(jnp.where(jnp.asarray(logged), measured, 1.0))
    transformed = jnp.where(logged, log_measured / jnp.asarray(ln_base, dtype), measured)
    jacobian = jnp.where(logged, log_measured + jnp.asarray(np.log(ln_base), dtype), 0.0)
    return transformed, jacobian


def _noise_terms(problem, predictions, sigmas, dtype, measured=None):
    """Per measurement: ((m − y)/σ on the noise model's scale, σ, the negative
    log-likelihood, the log-Jacobian of m's transformation)."""
    logged, ln_base, _, _, laplace = noise_constants(problem)
    measured, jacobian = _measured_terms(problem, measured, dtype)
    positive = predictions > 0
    # only positive values reach the log, for every row: a prediction of exactly 0 on a
    # linear row would otherwise make the unselected log's derivative 1/0, and reverse mode
    # (jax.grad: ds.sample, ds.train) multiplies it by the zero the where sends there: NaN
    safe = jnp.where(positive, predictions, 1.0)
    transformed = jnp.where(logged, jnp.log(safe) / jnp.asarray(ln_base, dtype), predictions)
    # a log model of a prediction that is not positive: no likelihood (NaN, an infinite loss)
    transformed = jnp.where(jnp.asarray(logged) & ~positive, jnp.nan, transformed)
    difference = measured - transformed
    valid_sigma = sigmas > 0
    sigma = jnp.where(valid_sigma, sigmas, 1.0)
    normal = 0.5 * jnp.log(2 * jnp.pi * sigma**2) + 0.5 * (difference / sigma) ** 2
    laplacian = jnp.log(2 * sigma) + jnp.abs(difference) / sigma
    nll = jnp.where(jnp.asarray(laplace), laplacian, normal) + jacobian
    nll = jnp.where(valid_sigma, nll, jnp.nan)
    return difference / sigma, sigma, nll, jacobian


def _prior_terms(problem, theta, dtype):
    """−log π(x) of every estimated unknown with a prior, (with priors,); π of the value on
    its scale for a prior on the scale."""
    terms = []
    for i, name in enumerate(problem.names):
        unknown = problem.unknowns[name]
        if unknown.prior is not None:
            x = to_scaled_values(theta[i], unknown.scale) if unknown.prior_on_scale else theta[i]
            terms.append(-jnp.asarray(unknown.prior.log_prob(x), dtype))
    return jnp.stack(terms) if terms else jnp.zeros((0,), dtype)


def negative_log_likelihood(problem, theta, measured=None, model=None, batch=None):
    """(NLL of the measurements, −log-prior) at natural θ (traced); `measured` replaces the
    study's values (same rows), `model` the problem's model (the same structure); `batch`
    (per group, the members to simulate: `row_states`) makes the NLL a mini-batch's,
    weighted to be the whole one's in the mean (`batch_weights`)."""
    return _likelihood_terms(problem, theta, measured, model, batch)[:2]


def smallest_logged(problem, predictions):
    """The smallest |prediction| of a measurement under log-scale noise (inf where none is):
    one the solver's absolute tolerance does not resolve relatively makes that row's
    likelihood, and a fit, wrong (`check_resolved`)."""
    logged = jnp.asarray(noise_constants(problem)[0])
    return jnp.min(jnp.where(logged, jnp.abs(predictions), jnp.inf), initial=jnp.inf)


def likelihood_and_smallest(problem, theta):
    """(NLL, −log-prior, `smallest_logged`) at natural θ, from one simulation."""
    return _likelihood_terms(problem, theta)


def _likelihood_terms(problem, theta, measured=None, model=None, batch=None):
    dtype = theta.dtype
    states = row_states(problem, theta, dtype, model, batch)
    predictions, sigmas = observe(problem, theta, states, dtype)
    smallest = smallest_logged(problem, predictions)
    _, _, nll, _ = _noise_terms(problem, predictions, sigmas, dtype, measured)
    if batch is not None:
        # a row of an undrawn member reads another member's states under its own settings,
        # which may be no prediction at all (a log-noise prediction ≤ 0 is NaN): selected out
        weights = batch_weights(problem, batch, dtype)
        nll = jnp.where(weights > 0, weights * nll, 0.0)
    return jnp.sum(nll), jnp.sum(_prior_terms(problem, theta, dtype)), smallest


# Where the solver controls a state's error only to its absolute tolerance (atol), a value
# near atol has no correct digits: harmless under normal noise (the error is far below σ),
# but log-scale noise compares log(prediction), so a decay to 1e-18 solved at atol 1e-10
# came out 1,000 times too large, and a fit ended far from the optimum reporting convergence.
# A prediction below this many atol is warned about.
UNRESOLVED_ATOLS = 1e3


def check_resolved(problem, smallest: float) -> str | None:
    """The warning for a log-noise prediction (`smallest_logged`) the solver's atol does not
    resolve, with a tolerance that would; None where it is resolved."""
    atol = float(np.min(np.asarray(getattr(problem.solver, "atol", 0.0))))
    if not (np.isfinite(smallest) and atol > 0 and smallest < UNRESOLVED_ATOLS * atol):
        return None
    needed = 10.0 ** np.floor(np.log10(max(smallest, 1e-300) / UNRESOLVED_ATOLS))
    return (
        f"a prediction under log-scale noise is {smallest:.3g}, below {UNRESOLVED_ATOLS:g} × "
        f"the solver's atol ({atol:g}): its relative error is not controlled, and so neither "
        "is its log-likelihood (a fit may end away from the optimum); pass a solver with a "
        f"smaller atol, e.g. solver=ds.Rodas5P(rtol=1e-8, atol={needed:.0e}) to ds.Problem"
    )


def residuals(problem, theta, measured=None):
    """Residuals whose sum of squares is 2·(NLL − log-prior) + a constant (see the module
    text), at natural θ (traced): the measurements' (m − y)/σ, their √(log 2πσ² + C) (or the
    Laplace form), then the priors'. `measured` replaces the study's values."""
    return residuals_and_terms(problem, theta, measured)[0]


def residuals_and_terms(problem, theta, measured=None, *, forward=False):
    """(`residuals`, (NLL, −log-prior, `smallest_logged`)) at natural θ from one simulation:
    the likelihood itself beside its least-squares form, which differs from it by a constant
    only where no root is clipped (σ ≳ 1e-9, prior densities ≲ e^20). `forward`: for a
    caller that differentiates it in forward mode only (`jax.jacfwd`; reverse mode then
    fails), which is cheaper there (`_solve`)."""
    states = row_states(problem, theta, theta.dtype, forward=forward)
    return residuals_of_states(problem, theta, states, measured)


def residuals_of_states(problem, theta, states, measured=None):
    """`residuals_and_terms` given the state at every measurement (`row_states`)."""
    dtype = theta.dtype
    predictions, sigmas = observe(problem, theta, states, dtype)
    scaled, sigma, nll, jacobian = _noise_terms(problem, predictions, sigmas, dtype, measured)
    laplace = noise_constants(problem)[4]
    offset = RESIDUAL_OFFSET
    normal_root = jnp.sqrt(jnp.maximum(jnp.log(2 * jnp.pi * sigma**2) + offset, 0.0))
    laplace_root = jnp.sqrt(jnp.maximum(2 * (nll - jacobian) + offset, 0.0))
    first = jnp.where(jnp.asarray(laplace), 0.0, scaled)
    second = jnp.where(jnp.asarray(laplace), laplace_root, normal_root)
    # a measurement the model cannot predict (NaN) makes the residuals NaN: the loss is then
    # infinite, and the optimiser steps back
    first = jnp.where(jnp.isfinite(nll), first, jnp.nan)
    prior = _prior_terms(problem, theta, dtype)
    prior_roots = jnp.sqrt(jnp.maximum(2 * prior + offset, 0.0))
    terms = (jnp.sum(nll), jnp.sum(prior), smallest_logged(problem, predictions))
    return jnp.concatenate([first, second, prior_roots]), terms


def fisher_residuals(problem, theta, measured=None, *, forward=False):
    """Residuals whose Jacobian J gives the expected Fisher information JᵀJ of the
    measurements at natural θ: (m − y)/σ with σ held, and c·log σ with y held (c = √2 for
    normal noise, 1 for Laplace: the information about log σ of one measurement).
    `forward` as for `residuals_and_terms`."""
    dtype = theta.dtype
    states = row_states(problem, theta, dtype, forward=forward)
    predictions, sigmas = observe(problem, theta, states, dtype)
    held = jax.lax.stop_gradient
    scaled, _, _, _ = _noise_terms(problem, predictions, held(sigmas), dtype, measured)
    laplace = noise_constants(problem)[4]
    weight = jnp.asarray(np.where(laplace, 1.0, math.sqrt(2.0)), dtype)
    spread = weight * jnp.log(jnp.where(sigmas > 0, sigmas, jnp.nan))
    return jnp.concatenate([scaled, spread])


def prior_hessian(problem, scaled):
    """The Hessian of the negative log-priors with respect to the unknowns on their scales."""

    def total(scaled):
        theta = to_natural_values(scaled, problem.tables.scales)
        return jnp.sum(_prior_terms(problem, theta, scaled.dtype))

    return jax.hessian(total)(scaled)


def residual_constant(problem) -> float:
    """The constant c in Σ r² = 2·(NLL − log-prior) + c, for converting a loss to a NLL:
    C per measurement and prior, minus twice the measurements' log-Jacobians."""
    _, _, _, jacobian, _ = noise_constants(problem)
    priors = sum(problem.unknowns[n].prior is not None for n in problem.names)
    rows = len(problem.tables.row_time)
    return RESIDUAL_OFFSET * (rows + priors) - 2 * float(np.sum(jacobian))


# --- entry points compiled once per problem -------------------------------------------------------


# one compiled program per problem (a Problem is a static argument: hashed by identity)
@jit
def evaluate_llh(problem, theta):
    """(log-likelihood, log-prior, `smallest_logged`) at natural θ."""
    nll, prior, smallest = likelihood_and_smallest(problem, theta)
    return -nll, -prior, smallest


# `problem.log_likelihood` called outside `jit` (a user's loop, finite differences, `jax.grad`
# of it) ran op by op, 1.5–3.8 s a call for a study of four small experiments; compiled once,
# the next calls take milliseconds. Inside a caller's `jit` it is inlined (no extra program).
@jit
def evaluate_log_likelihood(problem, theta, model=None):
    """The log-likelihood at natural θ, with `model` in place of the problem's (or None)."""
    return -negative_log_likelihood(problem, theta, model=model)[0]


@jit
def evaluate_predictions(problem, theta):
    """(the model's prediction, the noise's σ, (m − y)/σ on the noise model's scale) of every
    measurement at natural θ."""
    states = row_states(problem, theta, theta.dtype)
    predictions, sigmas = observe(problem, theta, states, theta.dtype)
    scaled = _noise_terms(problem, predictions, sigmas, theta.dtype)[0]
    return predictions, sigmas, scaled
