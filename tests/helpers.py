"""Registries of solvers and model cases that drive the conformance tests, and a count of the
programs a call traces and compiles."""

from collections import Counter

import jax
import jax.monitoring
import jax.numpy as jnp
import numpy as np

import diffsim as ds
import models

FIXED_STEP_SOLVERS = [
    ds.Euler(),
    ds.Midpoint(),
    ds.Heun(),
    ds.Ralston(),
    ds.RK4(),
    ds.RK38(),
    ds.SymplecticEuler(),
    ds.Leapfrog(),
    ds.Yoshida4(),
]
RUNGE_KUTTA_SOLVERS = [s for s in FIXED_STEP_SOLVERS if isinstance(s, ds.AbstractRungeKutta)]
SYMPLECTIC_SOLVERS = [s for s in FIXED_STEP_SOLVERS if isinstance(s, ds.AbstractSymplectic)]
ADAPTIVE_SOLVERS = [
    ds.Tsit5(rtol=1e-8, atol=1e-8),
    ds.Dopri5(rtol=1e-8, atol=1e-8),
    ds.Dopri8(rtol=1e-8, atol=1e-8),
    ds.Kvaerno5(rtol=1e-8, atol=1e-8),
    ds.Rosenbrock23(rtol=1e-8, atol=1e-8),
    ds.Rodas5P(rtol=1e-8, atol=1e-8),
]
ALL_SOLVERS = FIXED_STEP_SOLVERS + ADAPTIVE_SOLVERS

# JAX's own events, counted for the whole process from the first import of this module.
EVENTS = Counter()
COMPILE = "/jax/core/compile/backend_compile_duration"
TRACE = "/jax/core/compile/jaxpr_trace_duration"
MISSES = "/jax/compilation_cache/cache_misses"
HITS = "/jax/compilation_cache/cache_hits"
jax.monitoring.register_event_duration_secs_listener(lambda name, _, **__: EVENTS.update([name]))
jax.monitoring.register_event_listener(lambda name, **_: EVENTS.update([name]))


def counted(fn):
    """(the value of fn(), the XLA compilations it ran, the functions it traced)."""
    before = dict(EVENTS)
    out = fn()
    jax.block_until_ready(jax.tree.leaves(out, is_leaf=lambda x: isinstance(x, jax.Array)))
    return out, EVENTS[COMPILE] - before.get(COMPILE, 0), EVENTS[TRACE] - before.get(TRACE, 0)


def solver_id(solver) -> str:
    return type(solver).__name__


def _nbody_state():
    q = jnp.array([[1.0, 0.0], [-0.5, 0.8], [-0.5, -0.8]])
    p = jnp.array([[0.0, 0.5], [-0.4, -0.25], [0.4, -0.25]])
    return jnp.stack([q, p])


def _heat_state():
    model = models.Heat1D(diffusivity=0.1, n=16)
    return jnp.sin(jnp.pi * model.grid())


# (model, y0, a solver that suits it, dt for a fixed-step solver over t in [0, 1]).
# The Heat1D dt respects the explicit stability limit dx^2/(2 kappa) = 0.0173.
MODEL_CASES = {
    "HarmonicOscillator": (
        models.HarmonicOscillator(omega=2.0),
        jnp.array([1.0, 0.0]),
        ds.Leapfrog(),
        0.01,
    ),
    "DampedPendulum": (
        models.DampedPendulum(length=1.0, gravity=9.81, damping=0.1),
        jnp.array([1.0, 0.0]),
        ds.RK4(),
        0.01,
    ),
    "DoublePendulum": (
        models.DoublePendulum(),
        jnp.array([[1.0, 0.5], [0.0, 0.0]]),
        ds.RK4(),
        0.01,
    ),
    "Duffing": (models.Duffing(), jnp.array([1.0, 0.0]), ds.RK4(), 0.01),
    "VanDerPol": (models.VanDerPol(mu=1.0), jnp.array([2.0, 0.0]), ds.Tsit5(), None),
    "Kepler": (models.Kepler(), models.Kepler().initial_state(0.5), ds.Yoshida4(), 0.01),
    "NBody": (models.NBody(masses=jnp.ones(3)), _nbody_state(), ds.Leapfrog(), 0.01),
    "Lorenz": (models.Lorenz(), jnp.array([1.0, 1.0, 1.0]), ds.Dopri5(), None),
    "LotkaVolterra": (models.LotkaVolterra(), jnp.array([30.0, 4.0]), ds.RK4(), 0.01),
    "SIR": (models.SIR(), jnp.array([990.0, 10.0, 0.0]), ds.RK38(), 0.01),
    "SEIR": (models.SEIR(), jnp.array([990.0, 0.0, 10.0, 0.0]), ds.Tsit5(), None),
    "Robertson": (models.Robertson(), jnp.array([1.0, 0.0, 0.0]), ds.Kvaerno5(), None),
    "Heat1D": (models.Heat1D(diffusivity=0.1, n=16), _heat_state(), ds.RK4(), 0.01),
    "BoehmSTAT5": (
        models.BoehmSTAT5(),
        models.BoehmSTAT5().initial_state(),
        ds.Rodas5P(rtol=1e-6, atol=1e-9),
        None,
    ),
}


def first_parameter(model):
    """Name of the first scalar floating parameter of a model (what the conformance tests vary)."""
    import dataclasses

    for field in dataclasses.fields(model):
        value = getattr(model, field.name)
        if hasattr(value, "dtype") and jnp.issubdtype(value.dtype, jnp.floating):
            return field.name
    raise AssertionError(f"{type(model).__name__} has no floating parameter")


def load_experiment(name):
    """Import `experiments/<name>.py` as a module (the folder is not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parent.parent / "experiments" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_outputs(record, out, suffixes=("png",)):
    """An experiment's run listed files, wrote each (non-empty) into `out`, and wrote at least
    one file of each of `suffixes`."""
    assert record["files"], "the experiment wrote no files"
    for name in record["files"]:
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    written = {name.rsplit(".", 1)[-1] for name in record["files"]}
    assert set(suffixes) <= written, (suffixes, sorted(written))


def named_cases(rows):
    """pytest parameters from rows (name, *values): the name is the case's id."""
    import pytest

    return [pytest.param(*values, id=name) for name, *values in rows]


def synthetic_posterior(samples: dict, diverging=None, *, predictions: bool = False, thin: int = 1):
    """A `ds.Posterior` as `ds.sample` builds it, from given draws (name → (chains, draws)),
    without sampling: to test what a posterior reports about its draws, and its file."""
    chains, draws = next(iter(samples.values())).shape
    diverging = np.zeros((chains, draws), bool) if diverging is None else diverging
    kept = -(-draws // thin)
    predicted = np.ones((chains, kept, 3, 1)) if predictions else None
    return ds.Posterior(
        samples=samples,
        names=tuple(samples),
        sample_stats=dict(
            diverging=diverging,
            lp=np.zeros((chains, draws)),
            acceptance_rate=np.full((chains, draws), 0.8),
            n_steps=np.full((chains, draws), 7),
            step_size=np.full(chains, 0.5),
        ),
        warmup_divergences=np.zeros(chains, int),
        predictions=predicted,
        replicated=predicted,
        data=ds.Data(np.arange(3.0), np.ones(3)),
        likelihood="normal",
        t0=0.0,
        seconds=1.0,
        settings=ds._fit.posterior.PosteriorSettings(
            chains=chains,
            draws=draws,
            warmup=0,
            thin=thin,
            target_accept=0.8,
            dense_mass=True,
            priors={name: "Normal(loc=0, scale=1)" for name in samples},
            solver="Tsit5(rtol=1e-06, atol=1e-06)",
            model="Synthetic",
        ),
    )
