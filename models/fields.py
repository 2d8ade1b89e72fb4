"""PDEs by the method of lines."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array

import diffsim as ds


class Heat1D(ds.AbstractODE):
    """Heat equation u_t = κ u_xx on (0, L) with u(0) = u(L) = 0, by the method of lines:
    second-order central differences on `n` interior points x_i = i·L/(n+1).

    - `diffusivity` κ (m²/s, > 0), `length` L (m, > 0), `n` (static: the state shape).

    State: u at the interior points, shape (n,). The semi-discrete system is stiff: explicit
    solvers need dt ≤ dx²/(2κ); `ds.Kvaerno5` has no such limit. Fourier mode k,
    sin(kπx/L), decays exactly at the rate `mode_decay_rate(k)` = (4κ/dx²) sin²(kπ dx/(2L)).
    """

    diffusivity: Array = ds.parameter(1.0, positive=True, ndim=0)
    length: Array = ds.parameter(1.0, positive=True, ndim=0)
    n: int = eqx.field(default=64, static=True)

    def __check_init__(self):
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(
                f"Heat1D(n=...): the number of interior points must be an int >= 1, got {self.n!r}"
            )

    def state_shape(self):
        return (self.n,)

    @property
    def jacobian_bandwidth(self):
        return (1, 1)  # a point couples to its two neighbours

    @property
    def spacing(self):
        return self.length / (self.n + 1)

    def grid(self):
        """Interior points x_i, shape (n,)."""
        return self.spacing * jnp.arange(1, self.n + 1, dtype=self.length.dtype)

    def vector_field(self, t, y, args=None):
        padded = jnp.pad(y, 1)  # Dirichlet boundaries u = 0
        laplacian = (padded[:-2] - 2 * y + padded[2:]) / self.spacing**2
        return self.diffusivity * laplacian

    def mode_decay_rate(self, k):
        """Exact decay rate of the discrete Fourier mode k (1/s)."""
        return (
            4
            * self.diffusivity
            / self.spacing**2
            * jnp.sin(k * jnp.pi * self.spacing / (2 * self.length)) ** 2
        )


class Nagumo1D(ds.AbstractODE):
    """The bistable reaction–diffusion (Nagumo, or Allen–Cahn) equation

        u_t = D u_xx + k u (1 − u)(u − a)

    on (0, L) with zero-flux boundaries, by the method of lines on `n` cells of width
    dx = L/n (cell centres x_i = (i + ½) dx). `diffusivity` D (m²/s), `rate` k (1/s), `threshold`
    a in (0, ½), `length` L (m), `n` static. State: u at the cell centres, shape (n,).

    A front joining u = 1 (behind) to u = 0 (ahead) travels at the exact speed
    `front_speed()` = √(D k / 2)(1 − 2a) with the profile `front(x, t, x0)` = 1/(1 + exp((x −
    x0 − c t)/w)), w = √(2D/k) (McKean 1970). Stiff twice over: the diffusion eigenvalues reach
    4D/dx² and the reaction rate k; its Jacobian is tridiagonal (`jacobian_bandwidth` = (1, 1)),
    so `ds.Rodas5P` solves 1,000 cells without a dense LU."""

    diffusivity: Array = ds.parameter(1.0, positive=True, ndim=0)
    rate: Array = ds.parameter(1000.0, positive=True, ndim=0)
    threshold: Array = ds.parameter(0.25, positive=True, ndim=0)
    length: Array = ds.parameter(5.0, positive=True, ndim=0)
    n: int = eqx.field(default=1000, static=True)

    def __check_init__(self):
        if not isinstance(self.n, int) or self.n < 2:
            raise ValueError(
                f"Nagumo1D(n=...): the number of cells must be an int >= 2, got {self.n!r}"
            )

    def state_shape(self):
        return (self.n,)

    @property
    def jacobian_bandwidth(self):
        return (1, 1)

    @property
    def spacing(self):
        return self.length / self.n

    def grid(self):
        """Cell centres x_i, shape (n,)."""
        return self.spacing * (jnp.arange(self.n, dtype=self.length.dtype) + 0.5)

    def vector_field(self, t, y, args=None):
        padded = jnp.pad(y, 1, mode="edge")  # zero flux: the ghost cell mirrors its neighbour
        laplacian = (padded[:-2] - 2 * y + padded[2:]) / self.spacing**2
        return self.diffusivity * laplacian + self.rate * y * (1 - y) * (y - self.threshold)

    def front_speed(self):
        """c = √(D k / 2)(1 − 2a) (m/s), positive when u = 1 invades u = 0."""
        return jnp.sqrt(self.diffusivity * self.rate / 2) * (1 - 2 * self.threshold)

    def front(self, x, t, x0):
        """The travelling front at time t that was at x0 at t = 0."""
        width = jnp.sqrt(2 * self.diffusivity / self.rate)
        return 1 / (1 + jnp.exp((x - x0 - self.front_speed() * t) / width))
