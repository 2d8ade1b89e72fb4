"""Rosenbrock methods: linearly implicit, for stiff ODEs and index-1 DAEs M y' = f(t, y).

A Rosenbrock step solves linear systems with one matrix W = M/(hγ) − J (J = ∂f/∂y at the step's
start), factorised once per step, instead of the Newton iterations of an implicit Runge–Kutta
method: no iteration to converge or fail, a fixed count of evaluations, and a step that is an
ordinary differentiable function of its inputs. The price is that J must be accurate (it enters
the order conditions), so it is computed exactly by `jax.jacfwd` (or the model's own `jacobian`).

The methods here are written in the transformed form of Hairer & Wanner (*Solving ODEs II*,
IV.7, (7.4')), which carries the mass matrix M through every stage:

    W u_i = f(t + c_i h, y + Σ_j a_ij u_j) + d_i h ∂f/∂t + M Σ_j (C_ij / h) u_j,   i = 1..s,
    y1 = y + Σ_i b_i u_i,   error = Σ_i e_i u_i.

`simulate` runs them in diffsim's own adaptive loop (`diffsim._integrate.rosenbrock_loop`).
"""

import abc
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
from jax import lax
from jax.flatten_util import ravel_pytree
from jaxtyping import Array, Float

from . import small_inverse
from .adaptive import AbstractAdaptiveSolver
from .banded import Banded, banded_jacobian, banded_mass, banded_solver


class RosenbrockTableau(NamedTuple):
    """The coefficients of a Rosenbrock method in the transformed form above (all tuples of
    floats; `a` and `C` hold the rows 2..s of strictly lower triangular matrices)."""

    gamma: float  # the diagonal γ of W = M/(hγ) − J
    a: tuple[tuple[float, ...], ...]  # stage arguments y + Σ a_ij u_j
    C: tuple[tuple[float, ...], ...]  # coupling M Σ (C_ij / h) u_j
    c: tuple[float, ...]  # stage times t + c_i h (length s)
    d: tuple[float, ...]  # time-derivative weights d_i (length s)
    b: tuple[float, ...]  # the solution's weights
    b_error: tuple[float, ...]  # the error estimate's weights
    # rows of the dense output's coefficients (Rodas form, see `Rodas5P.interpolate`)
    dense: tuple[tuple[float, ...], ...] = ()

    def check(self) -> None:
        s = len(self.b)
        assert len(self.c) == s == len(self.d) == len(self.b_error)
        assert len(self.a) == len(self.C) == s - 1
        assert all(len(row) == i + 1 for i, row in enumerate(self.a))
        assert all(len(row) == i + 1 for i, row in enumerate(self.C))
        assert all(len(row) == s for row in self.dense)


class Linearised(NamedTuple):
    """The system at the start of a step, as every stage of a Rosenbrock step needs it (flat
    states: the loop ravels a pytree state into one vector)."""

    f: object  # the flat vector field f(t, y) -> (n,)
    f0: Float[Array, " n"]  # f(t, y)
    jacobian: Float[Array, "n n"] | Banded  # ∂f/∂y at (t, y), dense or banded
    dfdt: Float[Array, " n"]  # ∂f/∂t at (t, y)
    mass: Float[Array, "n n"] | None  # M, None for an ODE (the identity)


def flat_field(model, unravel):
    """The model's vector field on flat states."""

    def f(t, y):
        return ravel_pytree(model.vector_field(t, unravel(y)))[0]

    return f


def linearise(model, f, unravel, mass, t, y) -> Linearised:
    """f, ∂f/∂y and ∂f/∂t at (t, y) for the flat field `f`: one forward-mode pass with n + 1
    tangents, or the model's own `jacobian` and one tangent for ∂f/∂t, or, for a model with a
    `jacobian_bandwidth`, its band by colouring in bandwidth + 2 passes."""
    own = model.jacobian(t, unravel(y))
    band = model.jacobian_bandwidth
    if own is None and band is not None:
        f0, jacobian, dfdt = banded_jacobian(f, jnp.asarray(t, y.dtype), y, *band)
    elif own is None:
        n = y.shape[0]

        def g(z):
            value = f(z[n], z[:n])
            return value, value

        z = jnp.concatenate([y, jnp.asarray(t, y.dtype)[None]])
        both, f0 = jax.jacfwd(g, has_aux=True)(z)
        jacobian, dfdt = both[:, :n], both[:, n]
    else:
        f0, dfdt = jax.jvp(lambda t: f(t, y), (t,), (jnp.ones_like(t),))
        jacobian = jnp.asarray(own, y.dtype).reshape(y.shape[0], y.shape[0])
    return Linearised(f=f, f0=f0, jacobian=jacobian, dfdt=dfdt, mass=mass)


def factorise(system: Linearised, h, gamma):
    """W⁻¹ for W = M/(hγ) − J, as a function of the right-hand side: one factorisation
    (partial pivoting; `small_inverse` up to 8 unknowns, LAPACK's LU above) serves every stage
    of the step; a banded J keeps W banded (`banded.banded_solver`)."""
    n = system.f0.shape[0]
    jacobian = system.jacobian
    if isinstance(jacobian, Banded):
        mass = banded_mass(system.mass, jacobian.lower, jacobian.upper, n, system.f0.dtype)
        w = mass.diagonals / (h * gamma) - jacobian.diagonals
        return banded_solver(Banded(w, jacobian.lower, jacobian.upper))
    identity = jnp.eye(n, dtype=system.f0.dtype) if system.mass is None else system.mass
    w = identity / (h * gamma) - system.jacobian
    if n <= small_inverse.SMALL_SYSTEM:
        inverse = small_inverse.inverse(w)
        return lambda rhs: inverse @ rhs
    factors = jsl.lu_factor(w)
    return lambda rhs: jsl.lu_solve(factors, rhs)


def apply_mass(mass, u):
    """M u, with None the identity."""
    return u if mass is None else mass @ u


def _lower(rows, s: int, dtype):
    """The (s, s) strictly lower triangular matrix whose rows 2..s are `rows`."""
    matrix = np.zeros((s, s))
    for i, row in enumerate(rows):
        matrix[i + 1, : len(row)] = row
    return jnp.asarray(matrix, dtype)


class AbstractRosenbrock(AbstractAdaptiveSolver):
    """An adaptive Rosenbrock method: `Solver(rtol=1e-6, atol=1e-9, dtmin=None)` like every
    adaptive solver (traced tolerances), stepped by diffsim's own loop per member under `vmap`.

    Solves stiff ODEs and mass-matrix DAEs M y' = f(t, y) of index 1 (a model's `mass_matrix`,
    see `ds.AbstractODE`). The Jacobian ∂f/∂y is the model's `jacobian(t, y)` when it defines
    one, else `jax.jacfwd` of the vector field; one LU factorisation of W = M/(hγ) − J per step.
    Derivatives of a solve in every mode through the forward-mode Jacobian of the loop (as for
    the explicit pairs). Events are located on the method's dense output inside accepted
    steps (`simulate(..., events=...)`). Not supported: stochastic models."""

    delay_stepping: ClassVar[str] = "rosenbrock"  # type: ignore[assignment]

    supports_events: ClassVar[bool] = True
    supports_mass_matrix: ClassVar[bool] = True
    order: ClassVar[int]
    # the exponent of the step-size controller is 1/error_order: the error estimate is the
    # local error of the lower-order solution, O(h^error_order)
    error_order: ClassVar[int]
    # the degree in θ of `interpolate` (dense output stores degree + 1 samples a step)
    interpolant_degree: ClassVar[int]
    stages: ClassVar[int]  # vector field evaluations per attempted step

    @property
    def stiff(self) -> bool:
        return True

    def step(self, model, t, y, dt):
        """One step of size `dt` from (t, y) on its own (for hand-written loops and order
        studies): (the new state, its error estimate), pytrees like `y`."""
        y_flat, unravel = ravel_pytree(y)
        mass = model.mass_matrix
        if mass is not None:
            mass = jnp.asarray(mass, y_flat.dtype).reshape(y_flat.shape[0], -1)
        system = linearise(model, flat_field(model, unravel), unravel, mass, t, y_flat)
        y1, error, _ = self.attempt(system, t, y_flat, dt, factorise(system, dt, self.gamma))
        return unravel(y1), unravel(error)

    @abc.abstractmethod
    def attempt(self, system: Linearised, t, y, h, solve):
        """One step of size `h` from (t, y) (flat): returns (y1, error estimate, the dense
        output's coefficients). `solve(rhs)` applies W⁻¹ for this step's W (factorised once)."""

    @abc.abstractmethod
    def interpolate(self, dense, y0, y1, theta):
        """The state at t + θh from the coefficients `attempt` returned."""


class AbstractRosenbrockTableau(AbstractRosenbrock):
    """A Rosenbrock method given by a class-level `tableau` (see `RosenbrockTableau`)."""

    tableau: ClassVar[RosenbrockTableau]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "tableau" in cls.__dict__:
            cls.tableau.check()
            cls.stages = len(cls.tableau.b)
            # the Rodas form below: θ(1 − θ)·(a polynomial of degree rows − 1)
            cls.interpolant_degree = max(len(cls.tableau.dense) + 1, 1)

    @property
    def gamma(self) -> float:
        return self.tableau.gamma

    def attempt(self, system, t, y, h, solve):
        # The stages run as a loop (one vector field and one triangular solve in its body)
        # rather than unrolled: an 8-stage method unrolled is 8 copies of the model and of the
        # solve, which the compiler then takes seconds over; the coefficients are small
        # constant arrays indexed by the stage.
        tab = self.tableau
        s, n = len(tab.b), y.shape[0]
        dtype = y.dtype
        a = _lower(tab.a, s, dtype)
        # divided by h after the product, so that the coefficients stay constants of the loop:
        # scaled by a batch of step sizes (under vmap) they became a batched array the loop
        # reads, and XLA:CPU then ran the stage loop as separate calls rather than one kernel
        coupling = _lower(tab.C, s, dtype)
        c = jnp.asarray(tab.c, dtype)
        d = jnp.asarray(tab.d, dtype)

        def stage(i, us):
            f_i = system.f(t + c[i] * h, y + a[i] @ us)
            rhs = f_i + (d[i] * h) * system.dfdt + apply_mass(system.mass, (coupling[i] @ us) / h)
            return us.at[i].set(solve(rhs))

        us = lax.fori_loop(0, s, stage, jnp.zeros((s, n), dtype))
        y1 = y + jnp.asarray(tab.b, dtype) @ us
        error = jnp.asarray(tab.b_error, dtype) @ us
        dense = jnp.asarray(tab.dense, dtype) @ us
        return y1, error, dense

    def interpolate(self, dense, y0, y1, theta):
        # Rodas form: (1 − θ) y0 + θ (y1 + (1 − θ)(k1 + θ (k2 + θ k3 + ...)))
        inner = dense[-1]
        for k in dense[-2::-1]:
            inner = k + theta * inner
        return (1 - theta) * y0 + theta * (y1 + (1 - theta) * inner)


class Rosenbrock23(AbstractRosenbrock):
    """Shampine & Reichelt's L-stable Rosenbrock (W-) method of order 2 with a third-order
    error estimate, MATLAB's `ode23s`: robust and cheap at loose tolerances (rtol ≥ 1e-4), the
    method to try first on a stiff problem that needs few digits.

    Three evaluations a step (the last is the first of the next step's stages, reused), one
    LU; a continuous second-order interpolant. L. F. Shampine, M. W. Reichelt, *The MATLAB ODE
    suite*, SIAM J. Sci. Comput. 18 (1997)."""

    order: ClassVar[int] = 2
    error_order: ClassVar[int] = 3
    interpolant_degree: ClassVar[int] = 2
    stages: ClassVar[int] = 3
    gamma: ClassVar[float] = 1 / (2 + float(np.sqrt(2)))  # d of the paper

    def attempt(self, system, t, y, h, solve):
        d, e32 = self.gamma, 6 + float(np.sqrt(2))
        mass, f0 = system.mass, system.f0
        # W of the paper is M − h d J = h d · (M/(hd) − J): stages are scaled by 1/(h d)
        hd = h * d
        k1 = solve(f0 + hd * system.dfdt) / hd
        f1 = system.f(t + 0.5 * h, y + (0.5 * h) * k1)
        k2 = solve(f1 - apply_mass(mass, k1)) / hd + k1
        y1 = y + h * k2
        f2 = system.f(t + h, y1)
        k3 = (
            solve(
                f2
                - e32 * (apply_mass(mass, k2) - f1)
                - 2 * (apply_mass(mass, k1) - f0)
                + hd * system.dfdt
            )
            / hd
        )
        error = (h / 6) * (k1 - 2 * k2 + k3)
        return y1, error, jnp.stack([h * k1, h * k2])

    def interpolate(self, dense, y0, y1, theta):
        d = self.gamma
        hk1, hk2 = dense[0], dense[1]
        return (
            y0
            + (theta * (1 - theta) / (1 - 2 * d)) * hk1
            + (theta * (theta - 2 * d) / (1 - 2 * d)) * hk2
        )


# Steinebach's Rodas5P coefficients (his Table 2, in the transformed form of Hairer & Wanner).
_A5P = (
    (3.0,),
    (2.849394379747939, 0.45842242204463923),
    (-6.954028509809101, 2.489845061869568, -10.358996098473584),
    (2.8029986275628964, 0.5072464736228206, -0.3988312541770524, -0.04721187230404641),
    (
        -7.502846399306121,
        2.561846144803919,
        -11.627539656261098,
        -0.18268767659942256,
        0.030198172008377946,
    ),
)
_C5P = (
    (-14.155112264123755,),
    (-17.97296035885952, -2.859693295451294),
    (147.12150275711716, -1.41221402718213, 71.68940251302358),
    (165.43517024871676, -0.4592823456491126, 42.90938336958603, -5.961986721573306),
    (
        24.854864614690072,
        -3.0009227002832186,
        47.4931110020768,
        5.5814197821558125,
        -0.6610691825249471,
    ),
    (
        30.91273214028599,
        -3.1208243349937974,
        77.79954646070892,
        34.28646028294783,
        -19.097331116725623,
        -28.087943162872662,
    ),
    (
        37.80277123390563,
        -3.2571969029072276,
        112.26918849496327,
        66.9347231244047,
        -40.06618937091002,
        -54.66780262877968,
        -9.48861652309627,
    ),
)
_H5P = (
    (
        25.948786856663858,
        -2.5579724845846235,
        10.433815404888879,
        -2.3679251022685204,
        0.524948541321073,
        1.1241088310450404,
        0.4272876194431874,
        -0.17202221070155493,
    ),
    (
        -9.91568850695171,
        -0.9689944594115154,
        3.0438037242978453,
        -24.495224566215796,
        20.176138334709044,
        15.98066361424651,
        -6.789040303419874,
        -6.710236069923372,
    ),
    (
        11.419903575922262,
        2.8879645146136994,
        72.92137995996029,
        80.12511834622643,
        -52.072871366152654,
        -59.78993625266729,
        -0.15582684282751913,
        4.883087185713722,
    ),
)
# Rodas5P is stiffly accurate: stages 7 and 8 start from y + Σ a_6j u_j + u_6 (+ u_7), and the
# solution is the last stage's argument plus u_8; u_8 is the error estimate.
_LAST = _A5P[-1]


class Rodas5P(AbstractRosenbrockTableau):
    """Steinebach's Rodas5P: a stiffly accurate Rosenbrock method of order 5 (embedded order
    4) with 8 stages, one LU a step and a fourth-order dense output; the method for stiff
    problems at moderate to tight tolerances (rtol ≤ 1e-4), and for index-1 DAEs.

    G. Steinebach, *Construction of Rosenbrock–Wanner method Rodas5P and numerical benchmarks
    within the Julia Differential Equations package*, BIT Numer. Math. 63 (2023)."""

    order: ClassVar[int] = 5
    error_order: ClassVar[int] = 5
    tableau = RosenbrockTableau(
        gamma=0.21193756319429014,
        a=_A5P + (_LAST + (1.0,), _LAST + (1.0, 1.0)),
        C=_C5P,
        c=(0.0, 0.6358126895828704, 0.4095798393397535, 0.9769306725060716)
        + (0.4288403609558664, 1.0, 1.0, 1.0),
        d=(0.21193756319429014, -0.42387512638858027, -0.3384627126235924)
        + (1.8046452872882734, 2.325825639765069, 0.0, 0.0, 0.0),
        b=_LAST + (1.0, 1.0, 1.0),
        b_error=(0.0,) * 7 + (1.0,),
        dense=_H5P,
    )


# Hairer & Wanner's RODAS coefficients (Solving ODEs II, IV.7, Table 7.2, as their code RODAS
# uses them), with the dense output of their continuous extension.
_A4 = (
    (1.544,),
    (0.9466785280815826, 0.2557011698983284),
    (3.314825187068521, 2.896124015972201, 0.9986419139977817),
    (1.221224509226641, 6.019134481288629, 12.53708332932087, -0.687886036105895),
)
_C4 = (
    (-5.6688,),
    (-2.430093356833875, -0.2063599157091915),
    (-0.1073529058151375, -9.594562251023355, -20.47028614809616),
    (7.496443313967647, -10.24680431464352, -33.99990352819905, 11.7089089320616),
    (8.083246795921522, -7.981132988064893, -31.52159432874371, 16.31930543123136)
    + (-6.058818238834054,),
)
_H4 = (
    (10.12623508344586, -7.487995877610167, -34.80091861555747, -7.992771707568823)
    + (1.025137723295662, 0.0),
    (-0.6762803392801253, 6.087714651680015, 16.43084320892478, 24.76722511418386)
    + (-6.594389125716872, 0.0),
)


class Rodas4(AbstractRosenbrockTableau):
    """Hairer & Wanner's RODAS: a stiffly accurate Rosenbrock method of order 4 (embedded
    order 3) with 6 stages, one LU a step and a third-order dense output; cheaper per step than
    `Rodas5P` (6 stages against 8), for moderate tolerances (rtol 1e-3 to 1e-6).

    E. Hairer, G. Wanner, *Solving Ordinary Differential Equations II*, 2nd ed., Springer
    (1996), IV.7."""

    order: ClassVar[int] = 4
    error_order: ClassVar[int] = 4
    tableau = RosenbrockTableau(
        gamma=0.25,
        a=_A4 + (_A4[-1] + (1.0,),),
        C=_C4,
        c=(0.0, 0.386, 0.21, 0.63, 1.0, 1.0),
        d=(0.25, -0.1043, 0.1035, -0.03620000000000023, 0.0, 0.0),
        b=_A4[-1] + (1.0, 1.0),
        b_error=(0.0,) * 5 + (1.0,),
        dense=_H4,
    )
