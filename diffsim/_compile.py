"""How diffsim compiles the programs it runs itself: `ds.fit`, `ds.profile`, `ds.refit`,
`ds.sample`, an eager `ds.simulate`, `problem.llh()`, the analyses.

A scientist's script runs once, so compilation is most of its wall time. XLA:CPU's older
emitters (the DebugOptions field `xla_cpu_use_fusion_emitters=false`) compile these programs
30–50 % faster at the same run time: a Boehm study's fit 12.3 s → 8.6 s of compilation at 1.85
and 1.83 s a start, an eager Rodas5P solve 2.0 s → 1.0–1.3 s (docs/howto/avoid-recompilation.md,
"XLA options on CPU"). On the CPU, diffsim asks for them as an option of its own programs
(`jax.jit`'s `compiler_options`), never as a flag of the process: a program the user jits (a
`jax.jit` of a loss that calls `ds.simulate`) is compiled as XLA's defaults, or the user's
`XLA_FLAGS`, say. Where `XLA_FLAGS` names the option itself, the user's choice is kept for
diffsim's programs too. `ds.sweep`'s chunks, a problem's Sobol' or Morris design points and
`ds.train`'s steps keep XLA's defaults: their wall time is their run (the newer emitters run
a `vmap`ped adaptive loop up to ~10 % faster, a training's steps ~30 % faster). On other
backends diffsim's programs compile as before.

JAX accepts `compiler_options` on a top-level program only, so under a transformation (the
user's `jax.jit`, `jax.grad`, `jax.vmap`) a diffsim program is the plain `eqx.filter_jit`
without them, inlined into the user's program as before.
"""

import functools
import os

import equinox as eqx
import jax
from jax._src import core as _core  # trace_state_clean: JAX has no public test of it

_OPTION = "xla_cpu_use_fusion_emitters"


def compiler_options() -> dict | None:
    """The options diffsim's own programs are compiled with (None: XLA's defaults), read from
    the environment when a program is defined (XLA reads `XLA_FLAGS` once, at start-up)."""
    if _OPTION in os.environ.get("XLA_FLAGS", ""):
        return None
    return {_OPTION: False}


def _top_level_on_cpu() -> bool:
    """Whether no JAX transformation is tracing now (a program called here is compiled on its
    own, not inlined into another) and the program is for the CPU (the option was measured
    there only; the backend is read at the call, not at import, where it may not be chosen)."""
    clean = getattr(_core, "trace_state_clean", None)
    return clean is not None and bool(clean()) and jax.default_backend() == "cpu"


class _Program:
    """`eqx.filter_jit(fun)`, compiled with `compiler_options()` when called at top level."""

    def __init__(self, fun, **jitkwargs):
        self._plain = eqx.filter_jit(fun, **jitkwargs)
        options = compiler_options()
        self._own = (
            eqx.filter_jit(fun, compiler_options=options, **jitkwargs) if options else self._plain
        )
        functools.update_wrapper(self, fun)

    def _pick(self):
        if self._own is self._plain:  # no options (XLA_FLAGS names one): nothing to decide
            return self._plain
        return self._own if _top_level_on_cpu() else self._plain

    def __call__(self, *args, **kwargs):
        return self._pick()(*args, **kwargs)

    def lower(self, *args, **kwargs):
        return self._pick().lower(*args, **kwargs)


def jit(fun=None, **jitkwargs):
    """`eqx.filter_jit` for diffsim's own programs (see the module's docstring); as a decorator
    with or without arguments."""
    if fun is None:
        return functools.partial(jit, **jitkwargs)
    return _Program(fun, **jitkwargs)
