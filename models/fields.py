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
