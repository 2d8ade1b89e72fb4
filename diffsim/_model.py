"""Model base classes: what the physics is, separate from how it is stepped.

Every model is an `equinox.Module` whose fields are its parameters (traced by `jit`, so new values
never recompile) and whose methods are its physics. All of them expose
`vector_field(t, y, args=None) -> dy/dt`, so `diffrax.ODETerm(model.vector_field)` works too.
"""

import abc
from collections.abc import Callable
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.extend.core as jex
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from ._parameter import check_parameters
from ._validate import as_parameter, is_traced, nonfinite_leaves


class AbstractODE(eqx.Module):
    """A first-order system dy/dt = f(t, y).

    Subclasses implement `vector_field`. Optional hooks: `state_names` (labels of the components of
    a flat state), `positive_state` (every component stays positive: populations, concentrations;
    `ds.fit` then fits initial states in log space), `state_shape()` (the expected shape of an
    array state, checked by `simulate`), `energy(y)` and other invariants; for stiff solvers
    `mass_matrix` (a differential-algebraic system M y' = f(t, y)) and `jacobian(t, y)`.
    """

    state_names: ClassVar[tuple[str, ...] | None] = None
    positive_state: ClassVar[bool] = False
    # the field holding a dict of named scalar parameters (ds.ODE's `params`, an SBML model's),
    # which a ds.Problem addresses by key; None: the parameters are the model's own fields
    parameters_field: ClassVar[str | None] = None

    def __check_init__(self):
        check_parameters(self)

    @abc.abstractmethod
    def vector_field(self, t, y, args=None):
        """dy/dt at time `t` (scalar) and state `y` (a pytree); returns the structure of `y`.
        `args` is accepted and ignored so that the bound method is a `diffrax.ODETerm`."""

    def state_shape(self) -> tuple[int, ...] | None:
        """The shape an array state must have, or None when any shape the vector field accepts is
        fine."""
        return None if self.state_names is None else (len(self.state_names),)

    @property
    def mass_matrix(self) -> Any:
        """M of M y' = f(t, y), an (n, n) array over the n components of the flattened state
        (`jax.flatten_util.ravel_pytree` order), constant in time and state; None (the default)
        for an ODE y' = f(t, y). A singular M makes the model a differential-algebraic system:
        each zero row of M is an algebraic equation 0 = f_i(t, y) (index 1: its components are
        determined by it). Only solvers with `supports_mass_matrix` (the Rosenbrock methods)
        solve such models; start them from a consistent state (`ds.consistent_initial_state`)."""
        return None

    @property
    def jacobian_bandwidth(self) -> tuple[int, int] | None:
        """(lower, upper): ∂f/∂y is zero more than `lower` places below or `upper` above its
        diagonal (over the flattened state), as for a one-dimensional method-of-lines model
        whose points couple to their neighbours; None (the default) when it is not known.
        Stiff solvers then take the Jacobian in lower + upper + 2 forward-mode evaluations
        instead of n + 1 (column colouring) and keep W banded: a tridiagonal band (1, 1) is
        solved in O(n) per stage instead of a dense O(n³) LU per step. Static Python ints."""
        return None

    def jacobian(self, t, y) -> Any:
        """∂f/∂y at (t, y), an (n, n) array for a flat state of n components, or None (the
        default): stiff solvers then take it by `jax.jacfwd` of the vector field. Define it
        when a closed form is cheaper than n forward-mode evaluations."""
        return None


class AbstractSDE(AbstractODE):
    """An Itô stochastic differential equation dy = f(t, y) dt + g(t, y) dW.

    Subclasses implement `drift(t, y)` (f, shaped like `y`) and `diffusion(t, y)` (g). With
    `noise = "diagonal"` (the default) g is shaped like `y` and each component has its own
    independent Brownian motion; with `noise = "general"` g has shape `y.shape + (m,)` and
    `brownian_shape(y)` returns `(m,)`. `vector_field` is the drift (the deterministic part), but
    `simulate` solves an SDE only with a stochastic solver (`ds.EulerMaruyama`, `ds.Milstein`)
    and a `key`.
    """

    noise: ClassVar[str] = "diagonal"

    @abc.abstractmethod
    def drift(self, t, y):
        """f(t, y): the deterministic rate, shaped like `y`."""

    @abc.abstractmethod
    def diffusion(self, t, y):
        """g(t, y): shaped like `y` (diagonal noise) or `y.shape + (m,)` (general noise)."""

    def vector_field(self, t, y, args=None):
        return self.drift(t, y)

    def brownian_shape(self, y) -> tuple[int, ...]:
        """The shape of one Brownian increment."""
        if self.noise == "diagonal":
            return tuple(jnp.shape(y))
        return tuple(jax.eval_shape(lambda: self.diffusion(0.0, y)).shape[-1:])

    def noise_term(self, t, y, dw):
        """g(t, y) dW: elementwise for diagonal noise, a matrix-vector product otherwise."""
        g = self.diffusion(t, y)
        return g * dw if self.noise == "diagonal" else jnp.einsum("...m,m->...", g, dw)


class AbstractLangevin(AbstractSDE):
    """Underdamped Langevin dynamics of particles of mass m at temperature k_B T:

        dq = v dt,   dv = (F(q)/m − γ v) dt + √(2γ k_B T / m) dW,

    with the state `[q, v]` stacked on the first axis. Subclasses implement `force(q)` (F, shaped
    like q) and have the fields `friction` γ (1/time), `temperature` k_B T (energy) and `mass` m.
    Besides the generic SDE solvers, `ds.BAOAB` steps these with the exact velocity
    (Ornstein–Uhlenbeck) update, which keeps the equilibrium distribution to O(dt²).
    """

    friction: eqx.AbstractVar[Any]
    temperature: eqx.AbstractVar[Any]
    mass: eqx.AbstractVar[Any]

    @abc.abstractmethod
    def force(self, q):
        """F(q) = −∇U(q), shaped like q."""

    def drift(self, t, y):
        q, v = y[0], y[1]
        return jnp.stack([v, self.force(q) / self.mass - self.friction * v])

    def diffusion(self, t, y):
        amplitude = jnp.sqrt(2 * self.friction * self.temperature / self.mass)
        return jnp.stack([jnp.zeros_like(y[0]), jnp.broadcast_to(amplitude, y[1].shape)])


# --- (q, v) states ---------------------------------------------------------------------------


def split_pair(y, what: str = "(q, v)"):
    """Split a two-part state: a tuple/list `(q, v)` or an array stacked as `[q, v]` on axis 0."""
    if isinstance(y, (tuple, list)):
        if len(y) != 2:
            raise ValueError(f"a state {what} must have 2 parts, got {len(y)}")
        return y[0], y[1]
    if jnp.ndim(y) >= 1 and jnp.shape(y)[0] == 2:
        return y[0], y[1]
    raise ValueError(
        f"a state {what} is a tuple of two arrays or an array stacked on axis 0 "
        f"(shape (2, ...)); got {type(y).__name__} of shape {jnp.shape(y)}"
    )


def join_pair(like, a, b):
    """Rebuild a two-part state in the layout of `like` (tuple, list or stacked array)."""
    if isinstance(like, (tuple, list)):
        return type(like)((a, b))
    return jnp.stack([a, b])


class AbstractSecondOrder(AbstractODE):
    """A mechanical system q'' = a(t, q, v) with state `(q, v)`.

    The state is a tuple `(q, v)` or an array stacked as `[q, v]` on its first axis (so a pendulum's
    state is `jnp.array([angle, angular_velocity])`). Symplectic solvers need an acceleration that
    does not depend on `v`; they check this from the traced computation and refuse otherwise.
    """

    @abc.abstractmethod
    def acceleration(self, t, q, v):
        """d²q/dt² at time `t`, position `q` and velocity `v` (same structure as `q`)."""

    def vector_field(self, t, y, args=None):
        q, v = split_pair(y)
        return join_pair(y, v, self.acceleration(t, q, v))


class AbstractHamiltonian(AbstractODE):
    """A Hamiltonian system with state `(q, p)`: dq/dt = ∂H/∂p, dp/dt = −∂H/∂q (by `jax.grad`).

    The state layout is that of `AbstractSecondOrder` (tuple or stacked array).
    """

    @abc.abstractmethod
    def hamiltonian(self, q, p):
        """The total energy H(q, p) (a scalar)."""

    def vector_field(self, t, y, args=None):
        q, p = split_pair(y, "(q, p)")
        dh_dq, dh_dp = jax.grad(self.hamiltonian, argnums=(0, 1))(q, p)
        return join_pair(y, dh_dp, jax.tree.map(jnp.negative, dh_dq))

    def energy(self, y):
        """H at the state `y` (works on a single state; `jax.vmap` it over `sol.ys`)."""
        return self.hamiltonian(*split_pair(y, "(q, p)"))


class AbstractSeparableHamiltonian(AbstractHamiltonian):
    """H(q, p) = T(p) + V(q): the form that splitting methods (`Leapfrog`, `Yoshida4`) need."""

    @abc.abstractmethod
    def kinetic(self, p):
        """Kinetic energy T(p) (a scalar)."""

    @abc.abstractmethod
    def potential(self, q):
        """Potential energy V(q) (a scalar)."""

    def hamiltonian(self, q, p):
        return self.kinetic(p) + self.potential(q)

    def vector_field(self, t, y, args=None):
        q, p = split_pair(y, "(q, p)")
        dq = jax.grad(self.kinetic)(p)
        dp = jax.tree.map(jnp.negative, jax.grad(self.potential)(q))
        return join_pair(y, dq, dp)


class AbstractLagrangian(AbstractSecondOrder):
    """A system given by its Lagrangian L(q, q̇); accelerations solve the Euler–Lagrange equations

        M(q, q̇) q̈ = ∂L/∂q − (∂²L/∂q̇∂q) q̇,   M = ∂²L/∂q̇²,

    with every derivative taken by autodiff. `q` may be any pytree; it is flattened for the solve.
    """

    @abc.abstractmethod
    def lagrangian(self, q, qdot):
        """L(q, q̇) = T − V (a scalar)."""

    def acceleration(self, t, q, v):
        q_flat, unravel = ravel_pytree(q)
        v_flat, _ = ravel_pytree(v)

        def lagrangian_flat(qf, vf):
            return self.lagrangian(unravel(qf), unravel(vf))

        dl_dv = jax.grad(lagrangian_flat, argnums=1)
        dl_dq = jax.grad(lagrangian_flat, argnums=0)(q_flat, v_flat)
        mass = jax.jacfwd(dl_dv, argnums=1)(q_flat, v_flat)
        mixed = jax.jacfwd(dl_dv, argnums=0)(q_flat, v_flat)
        return unravel(_solve_small(mass, dl_dq - mixed @ v_flat))

    def energy(self, y):
        """The energy function E = q̇·∂L/∂q̇ − L, conserved when L does not depend on time."""
        q, v = split_pair(y)
        dl_dv = jax.grad(self.lagrangian, argnums=1)(q, v)
        momentum_dot_v = sum(
            jnp.vdot(a, b) for a, b in zip(jax.tree.leaves(dl_dv), jax.tree.leaves(v))
        )
        return momentum_dot_v - self.lagrangian(q, v)


class ODE(AbstractODE):
    """Wrap a plain function `fn(t, y, params) -> dy/dt` as a model.

    `params` is any pytree of numbers/arrays; they are traced, so new values do not recompile.
    `fn` is static: pass the same function object each time (a new `lambda` per call recompiles).

    With `mass_matrix=M` (an (n, n) array over the n components of the flattened state, possibly
    singular) the model is M y' = fn(t, y, params), a differential-algebraic system when M is
    singular (see `AbstractODE.mass_matrix`).

    **Example:** `ds.ODE(lambda t, y, p: -p["k"] * y, {"k": 0.5})`
    """

    fn: Callable = eqx.field(static=True)
    params: Any = None
    mass: Any = None

    parameters_field: ClassVar[str | None] = "params"

    def __init__(self, fn: Callable, params: Any = None, mass_matrix: Any = None):
        if not callable(fn):
            raise TypeError(f"ODE(fn, params): fn must be callable as fn(t, y, params), got {fn!r}")
        self.fn = fn
        self.params = jax.tree.map(_as_array_if_number, params)
        self.mass = None if mass_matrix is None else _as_array_if_number(mass_matrix)

    @property
    def mass_matrix(self):
        return self.mass

    def __check_init__(self):
        bad = nonfinite_leaves(self.params)
        if bad:
            raise ValueError(
                f"ODE: parameters {', '.join('params' + b for b in bad)} are not finite"
            )

    def vector_field(self, t, y, args=None):
        return self.fn(t, y, self.params)


class AbstractDDE(AbstractODE):
    """A delay differential equation dy/dt = f(t, y(t), (y(t − τ1), …, y(t − τk))) with
    constant lags τi > 0 and a history y(t) for t ≤ t0.

    Subclasses implement `delayed_field(t, y, y_delayed)` (`y_delayed` a tuple of states, one
    per lag, in the order of `delays()`), `delays()` (a tuple of positive scalars, traced: the
    solution is differentiable with respect to them) and `history(t)` (the state at a time
    t ≤ t0). `simulate` solves it by the method of steps: the delayed states are read from
    the history before t0 and from the solution's own dense output after it
    (docs/delays.md).
    """

    @abc.abstractmethod
    def delayed_field(self, t, y, y_delayed):
        """dy/dt at time `t`, state `y` and the delayed states `y_delayed` (a tuple)."""

    @abc.abstractmethod
    def delays(self) -> tuple:
        """The lags (τ1, …, τk), positive scalars in the time unit of `t`."""

    @abc.abstractmethod
    def history(self, t):
        """The state at a time t ≤ t0 (the solve's start), shaped like `y0`."""

    def vector_field(self, t, y, args=None):
        """The field with the delayed states read from the history: exact while every t − τi
        ≤ t0 (the first interval of the method of steps), which is where `simulate` uses it
        (its checks and its first step); beyond, the solve reads its own past."""
        return self.delayed_field(t, y, tuple(self.history(t - lag) for lag in self.delays()))


class DDE(AbstractDDE):
    """Wrap a plain function `fn(t, y, y_delayed, params) -> dy/dt` as a delay model, where
    `y_delayed` is the tuple of states at t − τ for each lag in `delays`.

    - `params`: any pytree of numbers/arrays (traced).
    - `delays`: a tuple of positive lags (a single number is one lag); traced, so the solution
      is differentiable with respect to them.
    - `history`: the state for t ≤ t0, a function `history(t)` or a constant state (the
      default history of `simulate`'s `y0` is not assumed: pass it).

    **Example:** Mackey–Glass, `ds.DDE(lambda t, y, yd, p: p["b"] * yd[0] / (1 + yd[0] ** 10)
    - p["g"] * y, {"b": 0.2, "g": 0.1}, delays=(17.0,), history=jnp.array(0.5))`
    """

    fn: Callable = eqx.field(static=True)
    params: Any
    lags: tuple
    constant_history: Any
    # a bare name in ds.fit's params= and ds.sweep's axes: an entry of `params`, as for ds.ODE
    parameters_field: ClassVar[str | None] = "params"
    # not static: a history that is an equinox Module (or a closure lifted by simulate) holds
    # arrays, which are traced and differentiated like parameters
    history_fn: Callable | None

    def __init__(self, fn: Callable, params: Any = None, *, delays, history):
        if not callable(fn):
            raise TypeError(
                "DDE(fn, params, delays=..., history=...): fn must be callable as "
                f"fn(t, y, y_delayed, params), got {fn!r}"
            )
        if isinstance(delays, (tuple, list)):
            lags = delays
        elif jnp.ndim(delays) == 1:  # an array of lags, e.g. jnp.array([1.0, 0.5])
            lags = tuple(delays[i] for i in range(jnp.shape(delays)[0]))
        else:
            lags = (delays,)
        if len(lags) == 0:
            raise ValueError("DDE: delays is empty; a model without lags is a ds.ODE")
        self.fn = fn
        self.params = jax.tree.map(_as_array_if_number, params)
        self.lags = tuple(_as_array_if_number(lag) for lag in lags)
        if callable(history):
            self.history_fn, self.constant_history = history, None
        else:
            self.history_fn = None
            self.constant_history = jax.tree.map(_as_array_if_number, history)

    def __check_init__(self):
        bad = nonfinite_leaves((self.params, self.lags, self.constant_history))
        if bad:
            raise ValueError(f"DDE: parameters, lags or history {', '.join(bad)} are not finite")
        for i, lag in enumerate(self.lags):
            if jnp.ndim(lag) != 0:
                raise ValueError(
                    f"DDE: delays[{i}] must be a scalar lag, got shape {jnp.shape(lag)}"
                )
            if not is_traced(lag) and not float(lag) > 0:
                raise ValueError(
                    f"DDE: delays[{i}] = {float(lag)}; every lag must be positive (a zero lag "
                    "is the present state: use y)"
                )

    def delayed_field(self, t, y, y_delayed):
        return self.fn(t, y, y_delayed, self.params)

    def delays(self) -> tuple:
        return self.lags

    def history(self, t):
        if self.history_fn is not None:
            return self.history_fn(t)
        return self.constant_history


def _as_array_if_number(x):
    if isinstance(x, (bool, str)) or x is None:
        return x
    if isinstance(x, (int, float, complex)) or hasattr(x, "dtype"):
        return x if is_traced(x) else as_parameter(x)
    return x


# --- structural dependence, used by symplectic solvers ---------------------------------------


def output_depends_on(fn: Callable, args: tuple, argnum: int) -> bool:
    """Whether the output of `fn(*args)` structurally depends on `args[argnum]`.

    Traces `fn` once to a jaxpr (no computation) and follows data dependencies from the inputs of
    `args[argnum]` to the outputs. Sub-computations (`cond`, `scan`, inner `jit`) count as depending
    on all of their inputs, which errs on the side of "depends".
    """
    reaching = inputs_reaching_output(fn, args)
    dynamic = eqx.filter(args, eqx.is_array)
    before = sum(len(jax.tree.leaves(a)) for a in dynamic[:argnum])
    return any(reaching[before : before + len(jax.tree.leaves(dynamic[argnum]))])


def inputs_reaching_output(fn: Callable, args: tuple) -> tuple[bool, ...]:
    """For each array leaf of `args` (in `jax.tree.leaves` order), whether the output of
    `fn(*args)` structurally depends on it: one trace for every input, as `output_depends_on`
    decides for one (a study asks it of every unknown: one trace of a large model's initial
    state instead of one per unknown)."""
    dynamic, static = eqx.partition(args, eqx.is_array)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), dynamic)

    def fn_dynamic(*dynamic_args):
        return fn(*eqx.combine(dynamic_args, static))

    jaxpr = jax.make_jaxpr(fn_dynamic)(*abstract).jaxpr
    needed = {v for v in jaxpr.outvars if isinstance(v, jex.Var)}
    for eqn in reversed(jaxpr.eqns):
        if any(v in needed for v in eqn.outvars):
            needed.update(v for v in eqn.invars if isinstance(v, jex.Var))
    return tuple(v in needed for v in jaxpr.invars)


def acceleration_depends_on_velocity(model: AbstractSecondOrder, t, q, v) -> bool:
    def accel(model, t, q, v):
        return model.acceleration(t, q, v)

    return output_depends_on(accel, (model, t, q, v), argnum=3)


def _solve_small(matrix, rhs):
    """`jnp.linalg.solve` for one right-hand side, in closed form (Cramer's rule) for 1–2
    unknowns: on CPU a LAPACK call per stage per step costs more than the whole RK4 step of a
    double pendulum, and a 2×2 mass matrix is well conditioned wherever the model is regular."""
    n = rhs.shape[0]
    if n == 1:
        return rhs / matrix[0, 0]
    if n == 2:
        (a, b), (c, d) = matrix[0], matrix[1]
        det = a * d - b * c
        return jnp.stack([d * rhs[0] - b * rhs[1], a * rhs[1] - c * rhs[0]]) / det
    return jnp.linalg.solve(matrix, rhs)


def check_model(name: str, model) -> None:
    """The one check that `model` is a diffsim model instance, with the fixes users need."""
    if isinstance(model, AbstractODE):
        return
    hint, got = "", type(model).__name__
    if isinstance(model, type) and issubclass(model, AbstractODE):
        hint, got = (
            f" Pass an instance: {name}={model.__name__}(...).",
            f"the class {model.__name__}",
        )
    elif callable(model):
        hint = " For a plain function f(t, y), wrap it: ds.ODE(f, params)."
    raise TypeError(
        f"{name} must be a diffsim model (a ds.AbstractODE subclass such as models.Lorenz, or "
        f"ds.ODE(fn, params) for a plain function), got {got}.{hint}"
    )
