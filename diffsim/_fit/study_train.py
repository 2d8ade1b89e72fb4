"""`ds.train`: the neural networks inside a `ds.Problem`'s model (a universal differential
equation, a neural ODE, a PEtab-SciML problem) trained together with its mechanistic unknowns
by first-order optimisation, as practitioners do: Adam on the negative log-likelihood (the
gradient by the reverse pass through the solver), then optionally L-BFGS to polish, with
early stopping on a validation problem.

The steps run in compiled chunks (`lax.scan` of `every` steps: one program per phase, however
many steps, a last shorter chunk included); between chunks the host records the
log-likelihood, checks the validation problem, keeps the best state and advances the progress
bar. A step that lands where the loss or gradient is not finite (a solve failed at an absurd
network) is taken back and the next one from the last finite point is shorter; the
mechanistic unknowns move on their scales and are held within their bounds.

Why by hand around optax: optax gives Adam's updates (L-BFGS is `lbfgs.py`, whose steps are
one evaluation each); the loop around them, which knows the problem's scales, bounds,
validation and progress, is this module.
"""

import dataclasses
import math
import time
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from .._compile import jit
from .._paths import get, path_of
from .._progress import progress_bar
from .._warn import warn
from .data import FitWarning
from .lbfgs import lbfgs_init, lbfgs_step
from .study import Problem
from .study_objective import (
    natural_on_host,
    negative_log_likelihood,
    scaled_on_host,
    to_natural_values,
)


@dataclasses.dataclass(frozen=True)
class Trained:
    """What `ds.train` returns.

    - `model`: the problem's model with the trained networks (the best state: by the
      validation log-likelihood where a validation problem was given, else by the training
      loss); `problem`: the problem about it (`problem.with_model(model)`), which `ds.fit`
      takes for the mechanistic unknowns' uncertainty given the networks.
    - `params`: the mechanistic unknowns' natural values at the best state (dict by name).
    - `llh`: the training log-likelihood there; `validation_llh`: the validation problem's
      (None without one).
    - `history`: dict of arrays per chunk: `step`, `phase` ("adam"/"lbfgs"), `llh` (training,
      at the chunk's end), `validation_llh` (NaN without a validation problem).
    - `best_step`, `steps` (taken), `stopped_early` (patience ran out), `skipped` (steps
      whose loss or gradient was not finite), `seconds` (compile and run: `compile`, `run`).
    - `interrupted`: training was stopped by Ctrl-C (KeyboardInterrupt) after `steps`
      steps; the rest is the best state of the chunks that had finished.
    """

    model: Any
    problem: Problem
    params: dict
    llh: float
    validation_llh: float | None
    history: dict
    best_step: int
    steps: int
    stopped_early: bool
    skipped: int
    seconds: dict
    interrupted: bool = False


def train(
    problem: Problem,
    networks,
    *,
    steps: int = 2000,
    learning_rate: float = 1e-3,
    lbfgs_steps: int = 0,
    validation: Problem | None = None,
    every: int = 50,
    patience: int | None = None,
    clip: float | None = 1.0,
    batch_size: int | None = None,
    key=None,
    progress: bool = True,
) -> Trained:
    """Train the networks `networks` of `problem`'s model (and its estimated mechanistic
    unknowns) by maximum likelihood.

    **Arguments:**

    - `problem`: a `ds.Problem` whose model holds the networks (e.g. `ds.petab.load` of a
      PEtab-SciML problem, or a `ds.AbstractODE` with an `eqx.nn.MLP` field). Training starts
      from the weights the model holds (re-initialise them for a fresh start, e.g.
      `ds.petab.Network.initialised(key)`) and from the unknowns' values.
    - `networks`: a name or list of names of the model's networks: a field (`"net"`), a
      nested field (`"closure.net"`) or an entry of a dict field (`'nets["net1"]'`). Every
      floating array inside is trained.
    - `steps`, `learning_rate`: Adam's steps and step size; `clip`: the largest global norm
      of a gradient (None: no clipping; long series of a stiff or chaotic model need it).
      Both are values the compiled program reads, not constants in it: the same problem
      trained again at another rate or norm runs the program compiled first (from the
      persistent cache).
    - `lbfgs_steps`: L-BFGS steps after Adam: each is one evaluation of the loss and its
      gradient, which the line search accepts or shortens (a step into a failed solve is
      shortened); it stops evaluating once converged.
    - `validation`: a `ds.Problem` of the same model (other data: a held-out experiment)
      evaluated every `every` steps; the best state by its log-likelihood is returned, and
      with `patience`, training stops after that many checks without improvement.
    - `batch_size`: mini-batches of experiments: each Adam step simulates at most this many
      experiments of each group of experiments that run as one batch (drawn anew each step,
      without replacement, from `key`, default `jax.random.key(0)`), their log-likelihood
      scaled by the group's size over the batch's so that its mean over the draws is the
      whole one; L-BFGS, the checks and the reported log-likelihoods use every experiment.
      None (the default): every step uses every experiment.
    - `every`: the steps of one compiled chunk (and between checks; one program per phase,
      its last chunk shorter where `every` does not divide the steps); `progress`: a bar.

    **Returns:** a `ds.Trained` (its `problem` goes on to `ds.fit` for the mechanistic
    unknowns' standard errors given the networks).
    """
    if not isinstance(problem, Problem):
        raise TypeError(f"ds.train: expected a ds.Problem, got {type(problem).__name__}")
    if validation is not None and not isinstance(validation, Problem):
        raise TypeError(
            f"ds.train: validation must be a ds.Problem, got {type(validation).__name__}"
        )
    for name, value, minimum in (
        ("steps", steps, 0),
        ("lbfgs_steps", lbfgs_steps, 0),
        ("every", every, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"ds.train: {name} must be an int >= {minimum}, got {value!r}")
    if steps + lbfgs_steps == 0:
        raise ValueError("ds.train: steps + lbfgs_steps is 0: nothing to train")
    if patience is not None and (not isinstance(patience, int) or patience < 1):
        raise ValueError(f"ds.train: patience must be None or an int >= 1, got {patience!r}")
    if not (isinstance(learning_rate, (int, float)) and learning_rate > 0):
        raise ValueError(f"ds.train: learning_rate must be positive, got {learning_rate!r}")
    if clip is not None and not (isinstance(clip, (int, float)) and clip > 0):
        raise ValueError(f"ds.train: clip must be None or positive, got {clip!r}")
    if batch_size is not None and (
        isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
    ):
        raise ValueError(f"ds.train: batch_size must be None or an int >= 1, got {batch_size!r}")
    if key is None:
        key = jax.random.key(0)
    else:
        from .._validate import check_key

        check_key("key", key)
    # per group of experiments run as one batch: (how many a mini-batch simulates, of how
    # many), None where it simulates all
    sizes = tuple(
        None if batch_size is None or batch_size >= len(g.members) else (batch_size, len(g.members))
        for g in problem.tables.groups
    )
    paths = network_paths(problem.model, networks)

    tables = problem.tables
    dtype = jnp.result_type(float)
    lower, upper = jnp.asarray(tables.lower, dtype), jnp.asarray(tables.upper, dtype)
    weights, model_of = networks_of(problem.model, paths)
    params = (jnp.asarray(scaled_on_host(problem.first_guess(), tables.scales), dtype), weights)

    if validation is not None:
        _check_validation(validation, problem)
        validation = _scored_validation(validation, problem)

    def parts(params, batch=None):
        """(negative log-likelihood, negative log-prior); with `batch`, a mini-batch's
        (`negative_log_likelihood`)."""
        scaled, weights = params
        return negative_log_likelihood(
            problem,
            to_natural_values(scaled, tables.scales),
            model=model_of(weights),
            batch=batch,
        )

    def project(params):
        scaled, weights = params
        return jnp.clip(scaled, lower, upper), weights

    phases = []
    if steps:
        phases.append(("adam", steps, _Adam(learning_rate, clip)))
    if lbfgs_steps:
        phases.append(("lbfgs", lbfgs_steps, _LBFGS()))

    history = {"step": [], "phase": [], "llh": [], "validation_llh": []}
    best = dict(score=-math.inf, params=params, step=0, llh=math.nan, validation=None)
    seconds = dict(compile=0.0, run=0.0)
    taken, skipped, checks_without_gain, stopped = 0, 0, 0, False
    bar = progress_bar(steps + lbfgs_steps, enabled=progress, description="train", unit="step")
    interrupted = False
    try:
        for phase, count, optimizer in phases:
            state = optimizer.init(params)
            key, phase_key = jax.random.split(key)
            carry = (params, state, params, jnp.ones((), dtype), phase_key)
            batched = sizes if phase == "adam" and any(k is not None for k in sizes) else None
            chunk = None
            done = 0
            # one program for the phase: where `every` does not divide the steps, a last,
            # shorter chunk runs in it with the steps past its end skipped (compiled for its
            # own length, it was a second program, as long to compile as the first; the
            # skipping costs ~10 % of the compile, so only such a phase has it)
            length = min(every, count)
            masked = count % length != 0
            while done < count and not stopped:
                taking = min(length, count - done)
                active = jnp.asarray(taking, jnp.int32)
                arguments = (parts, project, optimizer, phase, length, batched, carry)
                arguments = (*arguments, active, masked)
                if chunk is None:
                    clock = time.perf_counter()
                    chunk = _chunk.lower(*arguments).compile()
                    seconds["compile"] += time.perf_counter() - clock
                clock = time.perf_counter()
                carry, nll, bad = chunk(*arguments)
                params = carry[0]
                nll, bad = float(nll), int(bad)
                seconds["run"] += time.perf_counter() - clock
                done += taking
                taken += taking
                skipped += bad
                bar.update(taking)
                llh = -nll
                validation_llh = math.nan
                if validation is not None:
                    validation_llh = _validation_llh(validation, problem, params, model_of)
                score = validation_llh if validation is not None else llh
                history["step"].append(taken)
                history["phase"].append(phase)
                history["llh"].append(llh)
                history["validation_llh"].append(validation_llh)
                if math.isfinite(score) and score > best["score"]:
                    best = dict(
                        score=score,
                        params=params,
                        step=taken,
                        llh=llh,
                        validation=validation_llh if validation is not None else None,
                    )
                    checks_without_gain = 0
                else:
                    checks_without_gain += 1
                    stopped = patience is not None and checks_without_gain >= patience
    except KeyboardInterrupt:
        # a long training stopped by hand keeps what it had learned, as an interrupted
        # multi-start of `ds.fit` keeps the starts that finished
        if not history["step"]:
            raise
        interrupted = True
        warn(
            f"ds.train: interrupted after {taken} steps; returning the best state of the "
            f"chunks that finished (step {best['step']})",
            FitWarning,
        )
    finally:
        bar.close()
    if not math.isfinite(best["score"]):
        raise ValueError(
            "ds.train: no step gave a finite log-likelihood (every solve failed): lower "
            "learning_rate, clip the gradient harder, or start from other weights"
        )
    scaled, weights = best["params"]
    trained, model, trained_problem = with_trained(problem, model_of(weights), scaled)
    return Trained(
        model=model,
        problem=trained_problem,
        params=trained,
        llh=best["llh"],
        validation_llh=best["validation"],
        history={k: np.asarray(v) for k, v in history.items()},
        best_step=best["step"],
        steps=taken,
        stopped_early=stopped,
        skipped=skipped,
        seconds=seconds,
        interrupted=interrupted,
    )


# XLA's default emitters, not diffsim's faster-compiling ones (`_compile.py`): a training's
# wall time is its run, and the chunk of the tests' UDE (600 Adam + 200 L-BFGS steps) ran 0.67–
# 0.91 s with them against 1.0–1.3 s with the others, for 16–19 s against 12–15 s of compiling.
@eqx.filter_jit
def _chunk(parts, project, optimizer, phase, length, sizes, carry, active, masked):
    """The first `active` (traced, ≤ `length`) of `length` steps of `optimizer` from `carry`
    = (params, optimiser state, the last params with a finite loss and gradient, the factor
    on the updates, a PRNG key): (the carry after them, the negative log-likelihood at the
    end, how many steps met a non-finite loss or gradient). With `masked` (static) the steps
    past `active` leave the carry as it is; without, `active` must be `length`. `sizes`
    (static; per group, (a mini-batch's members, the group's) or None for all; None for no
    mini-batches): each step draws its members from the key.

    A step from a point whose loss or gradient is not finite (a solve failed there) goes
    back to the last finite point and halves the factor on the updates, so that the next
    step from there is shorter; each finite step doubles it back towards 1."""
    import optax

    def loss(params, batch=None):
        nll, prior = parts(params, batch)
        return nll + prior

    def draw(key):
        """Per group, the members of this step's mini-batch."""
        keys = jax.random.split(key, len(sizes))
        return tuple(
            None if size is None else jax.random.permutation(keys[g], size[1])[: size[0]]
            for g, size in enumerate(sizes)
        )

    def take(carry):
        params, state, good, factor, key = carry
        key, step_key = jax.random.split(key)
        batch = None if sizes is None else draw(step_key)
        value, grad = jax.value_and_grad(loss)(params, batch)
        finite = jnp.isfinite(value)
        for leaf in jax.tree.leaves(grad):
            finite = finite & jnp.all(jnp.isfinite(leaf))

        def advance(_):
            updates, new_state = optimizer.update(grad, state, params)
            updates = jax.tree.map(lambda u: factor.astype(u.dtype) * u, updates)
            return project(optax.apply_updates(params, updates)), new_state

        def back(_):
            return good, state

        moved, state = jax.lax.cond(finite, advance, back, None)
        good = jax.tree.map(lambda p, g: jnp.where(finite, p, g), params, good)
        factor = jnp.where(finite, jnp.minimum(2.0 * factor, 1.0), 0.5 * factor)
        return (moved, state, good, factor, key), ~finite

    def search(carry):
        """One L-BFGS step: one evaluation of the loss and its gradient (none once
        converged)."""
        params, state = carry[:2]
        unravel = ravel_pytree(params)[1]
        flat = lambda tree: ravel_pytree(tree)[0]  # noqa: E731
        value_and_grad = jax.value_and_grad(lambda x: loss(unravel(x)))

        def run(state):
            return lbfgs_step(value_and_grad, lambda x: flat(project(unravel(x))), state)

        state, finite = jax.lax.cond(state.done, lambda s: (s, jnp.array(True)), run, state)
        return (unravel(state.x), state, *carry[2:]), ~finite

    one = search if phase == "lbfgs" else take

    def step(carry, index):
        if not masked:
            return one(carry)
        return jax.lax.cond(index < active, one, lambda c: (c, jnp.array(False)), carry)

    # optax's updates mix Python floats with int32 step counts (Adam's bias correction),
    # which a caller's strict dtype promotion would refuse
    with jax.numpy_dtype_promotion("standard"):
        carry, bad = jax.lax.scan(step, carry, jnp.arange(length))
    return carry, parts(carry[0])[0], jnp.sum(bad)


class _Adam:
    """Adam (optax's `adam`: `scale_by_adam`, then the step size) after clipping the
    gradient's global norm, the step size and the norm held in its state (arrays the
    compiled chunk reads) rather than in the program as constants, so that another rate
    or norm is the same program. The price: its fresh compile is 0.4–0.6 s longer than with
    them as constants (of 8.7–9.8 s, the tests' UDE; optax's `inject_hyperparams`, which
    does the same, 0.6–2.2 s)."""

    def __init__(self, learning_rate: float, clip: float | None):
        self.learning_rate = learning_rate
        self.clip = math.inf if clip is None else clip

    def init(self, params):
        import optax

        dtype = jnp.result_type(*jax.tree.leaves(params))
        rate, norm = jnp.asarray(self.learning_rate, dtype), jnp.asarray(self.clip, dtype)
        return optax.scale_by_adam().init(params), rate, norm

    def update(self, grad, state, params):
        import optax

        inner, rate, norm = state
        size = optax.tree.norm(grad)
        # optax's clip_by_global_norm: g · norm / ‖g‖ where ‖g‖ exceeds the norm
        shrink = jnp.where(size < norm, 1.0, norm / jnp.where(size > 0, size, 1.0))
        grad = jax.tree.map(lambda g: (shrink * g).astype(g.dtype), grad)
        updates, inner = optax.scale_by_adam().update(grad, inner, params)
        updates = jax.tree.map(lambda u: (-rate * u).astype(u.dtype), updates)
        return updates, (inner, rate, norm)


class _LBFGS:
    """`ds.train`'s L-BFGS phase (`lbfgs.py`: one evaluation a step), as its phases' loop
    takes an optimiser: `init(params)` gives its state."""

    def init(self, params):
        return lbfgs_init(ravel_pytree(params)[0])


def _trained_values(problem: Problem, scaled) -> dict:
    """name → natural value of the estimated unknowns at `scaled` (on their scales)."""
    values = natural_on_host(np.asarray(scaled), problem.tables.scales)
    return {n: float(v) for n, v in zip(problem.names, values)}


def _with_parameters(problem: Problem, model, values: dict):
    """`model` with its own parameters among `values` (name → number) set to them."""
    names = [n for n in values if n in problem.model_parameters]
    if not names:
        return model
    getters = [problem.model_parameters[n] for n in names]
    replacements = [
        jnp.asarray(values[n], jnp.result_type(g(model))) for n, g in zip(names, getters)
    ]
    return eqx.tree_at(lambda m: [g(m) for g in getters], model, replacements)


def _scored_validation(validation: Problem, problem: Problem) -> Problem:
    """The validation problem with every unknown the training estimates and it reads (a
    parameter of its model, or an unknown it leaves at its value) estimated too: its
    log-likelihood then takes their trained values through θ. (A study's model parameters
    are constants of its tables, read from its model when built; the trained state's must
    not be the values training started from.) An unknown it fixes explicitly stays fixed."""
    unknowns = dict(validation.unknowns)
    for name in problem.names:
        own = validation.unknowns.get(name)
        if own is not None and own.estimate is False:
            continue
        if own is not None or name in validation.model_parameters:
            unknowns[name] = dataclasses.replace(problem.unknowns[name], prior=None)
    if unknowns == dict(validation.unknowns):
        return validation
    return validation.with_model(validation.model, unknowns=unknowns)


def _validation_llh(validation: Problem, problem: Problem, params, model_of) -> float:
    """The validation problem's log-likelihood in the state being trained: its networks and
    the trained values of the unknowns it shares with the training problem."""
    scaled, weights = params
    trained = _trained_values(problem, scaled)
    shared = {n: v for n, v in trained.items() if n in validation.names}
    theta = jnp.asarray(validation.theta(shared), jnp.result_type(float))
    return float(_llh_with(validation, theta, model_of(weights)))


def _check_validation(validation: Problem, problem: Problem) -> None:
    """The validation problem is scored with the training problem's model (its networks
    trained), so its own model must be of the same kind, with the same states and arrays of the
    same shapes at the same places. Its static parts are not compared as objects: a model file
    loaded twice (a PEtab-SciML problem's training and validation YAML) holds two equal
    compiled structures that compare by identity."""

    def shapes(model):
        arrays = jax.tree_util.tree_flatten_with_path(eqx.filter(model, eqx.is_array))[0]
        leaves = [(jax.tree_util.keystr(k), np.shape(x), jnp.result_type(x)) for k, x in arrays]
        return type(model), getattr(model, "state_names", None), leaves

    if shapes(validation.model) != shapes(problem.model):
        raise ValueError(
            "ds.train: the validation problem's model differs in structure or in its arrays' "
            f"shapes from the trained problem's ({type(validation.model).__name__} against "
            f"{type(problem.model).__name__}): it is scored with the trained model, so build "
            "it on the same model (e.g. ds.Problem(problem.model, other_experiments, ...))"
        )


@jit
def _llh_with(problem, theta, model):
    return -negative_log_likelihood(problem, theta, model=model)[0]


def networks_of(model, paths):
    """(the floating arrays of the networks at `paths`, `model_of(weights)`: `model` with
    those arrays replaced)."""
    weights = [eqx.filter(get(model, p), eqx.is_inexact_array) for p in paths]

    def model_of(weights):
        nets = [
            eqx.combine(w, eqx.filter(get(model, p), eqx.is_inexact_array, inverse=True))
            for w, p in zip(weights, paths)
        ]
        return eqx.tree_at(lambda m: [get(m, p) for p in paths], model, nets)

    return weights, model_of


def with_trained(problem: Problem, model, scaled):
    """(name → natural value of the estimated unknowns at `scaled`, `model` with its own
    parameters among them set, the problem about that model with its unknowns starting
    there). The model and the problem hold the trained values of the model's own parameters
    too: `ds.simulate(model, ...)` and `ds.fit(problem)` start from the state that was
    trained, not from where training started."""
    trained = _trained_values(problem, scaled)
    model = _with_parameters(problem, model, trained)
    unknowns = {
        name: dataclasses.replace(u, value=trained[name]) if name in trained else u
        for name, u in problem.unknowns.items()
    }
    return trained, model, problem.with_model(model, unknowns=unknowns)


def network_paths(model, networks, caller: str = "ds.train") -> list:
    if not isinstance(networks, (str, list, tuple)):
        raise TypeError(
            f"{caller}: networks must be a name or a list of names of the model's networks "
            f"(e.g. 'net' for a field net), got a {type(networks).__name__}"
        )
    names = [networks] if isinstance(networks, str) else list(networks)
    if not names:
        raise ValueError(f"{caller}: name the networks to train, e.g. networks='net'")
    paths = []
    for name in names:
        path = path_of(model, name) if isinstance(name, str) else None
        value = None if path is None else get(model, path)
        if (
            value is None
            or eqx.is_array(value)
            or not jax.tree.leaves(eqx.filter(value, eqx.is_array))
        ):
            raise ValueError(
                f"{caller}: {name!r} names no network of {type(model).__name__} (a module "
                "holding floating arrays: a field such as 'net', or 'nets[\"net1\"]' for a "
                "PEtab-SciML model)"
            )
        _check_weights(name, value, caller)
        paths.append(path)
    return paths


def _check_weights(name: str, network, caller: str = "ds.train") -> None:
    """Every array of a network to train is floating (an integer one would stay as it is,
    silently) and finite (a NaN weight makes every solve fail)."""
    arrays, _ = jax.tree_util.tree_flatten_with_path(eqx.filter(network, eqx.is_array))
    for where, leaf in arrays:
        label = f"{name}{jax.tree_util.keystr(where)}"
        if not jnp.issubdtype(leaf.dtype, jnp.inexact):
            raise ValueError(
                f"{caller}: {label} is an array of {leaf.dtype}, which training cannot move: "
                "cast the network's arrays to floats (e.g. jax.tree.map(lambda x: "
                "x.astype(float) if eqx.is_array(x) else x, net))"
            )
        if not bool(jnp.all(jnp.isfinite(leaf))):
            raise ValueError(
                f"{caller}: {label} holds non-finite weights (NaN or inf): every simulation "
                "would fail; start from finite weights (e.g. a fresh initialisation)"
            )
