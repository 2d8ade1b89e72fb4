"""Dense output: the solution at any time of the span, from every step's own interpolant.

Each accepted step stores its interpolant (the method's dense output; Hermite cubics for
fixed-step methods) as Chebyshev coefficients of a polynomial on the step: the interpolant is
sampled at `nodes` Chebyshev–Lobatto points (nodes = its degree + 1, so the polynomial is
reproduced exactly) and turned into coefficients by a fixed, well-conditioned matrix. Why
Chebyshev coefficients and not the methods' own stage data: one form serves every family
(explicit pairs, Rosenbrock methods, fixed-step Hermite), its evaluation and its derivatives in
t are smooth everywhere (no division by the distance to a node, as in barycentric formulas),
and the coefficients carry the solve's tangents, so `evaluate` is differentiable with respect
to parameters, `y0` and `t`.

Memory: `max_steps` rows (adaptive) or one row per step (fixed-step) of `nodes` states each:
max_steps · nodes · state size · 8 bytes in float64 (100,000 steps of a 3-component state with
Tsit5's 5 nodes: 12 MB). Lower `max_steps` for large states.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, PyTree


def chebyshev_nodes(nodes: int) -> np.ndarray:
    """The Chebyshev–Lobatto points mapped to [0, 1] (0 and 1 included), shape (nodes,)."""
    return (1.0 - np.cos(np.pi * np.arange(nodes) / (nodes - 1))) / 2.0


def _to_coefficients(nodes: int) -> np.ndarray:
    """The matrix taking values at `chebyshev_nodes(nodes)` to Chebyshev coefficients."""
    x = 2.0 * chebyshev_nodes(nodes) - 1.0
    vandermonde = np.cos(np.outer(np.arccos(np.clip(x, -1.0, 1.0)), np.arange(nodes)))
    return np.linalg.inv(vandermonde)


def coefficients(values):
    """Chebyshev coefficients of a pytree of node values, each leaf (nodes, *shape)."""

    def leaf(v):
        matrix = jnp.asarray(_to_coefficients(v.shape[0]), v.dtype)
        return jnp.tensordot(matrix, v, axes=1)

    return jax.tree.map(leaf, values)


def sample_step(evaluate, t, t_end, y, y_end, nodes: int):
    """The Chebyshev coefficients of one step's interpolant `evaluate(t)` on [t, t_end]; the
    end points take the step's own states, so that consecutive pieces meet exactly."""
    theta = jnp.asarray(chebyshev_nodes(nodes)[1:-1], t.dtype)
    inner = jax.vmap(evaluate)(t + theta * (t_end - t))
    values = jax.tree.map(
        lambda a, mid, b: jnp.concatenate([a[None], mid, b[None]]), y, inner, y_end
    )
    return coefficients(values)


def hermite_values(y0, f0, y1, f1, h, nodes: int = 4):
    """The cubic Hermite interpolant of (y0, f0) and (y1, f1) over a step of length `h`, at
    `chebyshev_nodes(nodes)`: each leaf (nodes, *shape)."""
    theta = chebyshev_nodes(nodes)
    h00 = 2 * theta**3 - 3 * theta**2 + 1
    h10 = theta**3 - 2 * theta**2 + theta
    h01 = -2 * theta**3 + 3 * theta**2
    h11 = theta**3 - theta**2

    def leaf(a, fa, b, fb):
        w = [
            jnp.asarray(c, a.dtype).reshape((nodes,) + (1,) * a.ndim) for c in (h00, h10, h01, h11)
        ]
        return w[0] * a[None] + w[1] * (h * fa)[None] + w[2] * b[None] + w[3] * (h * fb)[None]

    return jax.tree.map(leaf, y0, f0, y1, f1)


def hermite_at(theta, y0, f0, y1, f1, h):
    """The cubic Hermite interpolant of (y0, f0) and (y1, f1) over a step of length `h` at
    the fraction `theta` (a scalar) of the step."""
    h00 = 2 * theta**3 - 3 * theta**2 + 1
    h10 = theta**3 - 2 * theta**2 + theta
    h01 = -2 * theta**3 + 3 * theta**2
    h11 = theta**3 - theta**2
    return jax.tree.map(
        lambda a, fa, b, fb: h00 * a + h10 * h * fa + h01 * b + h11 * h * fb, y0, f0, y1, f1
    )


def empty_pieces(y0, t0, pieces: int, nodes: int):
    """The buffers of a solve's dense output: knots (pieces + 1,) starting at t0 (inf after
    the last step taken), coefficients (pieces, nodes, *shape)."""
    knots = jnp.full((pieces + 1,), jnp.inf, t0.dtype).at[0].set(t0)
    coeffs = jax.tree.map(lambda y: jnp.zeros((pieces, nodes) + y.shape, y.dtype), y0)
    return knots, coeffs


def constant_piece(y0, t0) -> "DenseOutput":
    """The dense output of an empty span: y0 at t0 (the derivative there is NaN: no step was
    taken)."""
    coeffs = jax.tree.map(lambda y: y[None, None], y0)
    return DenseOutput(jnp.stack([t0, t0]), coeffs, jnp.asarray(1, jnp.int32))


class DenseOutput(eqx.Module):
    """The solution between output times (`simulate(..., dense=True)`; read it through
    `Solution.evaluate` and `Solution.derivative`).

    - `knots`: the step boundaries, shape `(pieces + 1,)`, increasing, `inf` after the last
      step taken (in the integration's own time s = -t for a backward solve).
    - `coeffs`: a pytree like `y0`, each leaf `(pieces, nodes) + shape`: the Chebyshev
      coefficients of each step's interpolant on [knots[i], knots[i+1]].
    - `count`: int, the number of steps stored.
    - `direction`: +1, or -1 for a solve backwards in time.
    """

    knots: Float[Array, " pieces_plus_one"]
    coeffs: PyTree[Array]
    count: Int[Array, ""]
    direction: float = eqx.field(static=True, default=1.0)

    def _piece(self, t, left=None):
        s = self.direction * jnp.asarray(t, self.knots.dtype)
        last = jnp.maximum(self.count - 1, 0)
        # the piece that holds s; at the last knot the last piece of positive width (a
        # fixed-step solve on an uneven grid leaves pieces of zero width at interval ends);
        # at an inner knot the piece after it
        end = s >= self.knots[self.count]
        above, below = s, s
        if left is not None:
            # a side chosen: a knot within round-off of s counts as s (a delay equation's
            # t_e + τ − τ is t_e only up to round-off), and the piece before it (`left`) or
            # after it is read
            slack = 16 * jnp.finfo(self.knots.dtype).eps * jnp.maximum(jnp.abs(s), 1.0)
            above, below = s + slack, s - slack
            end = end & ~left
        side = jnp.where(
            end | (False if left is None else left),
            jnp.searchsorted(self.knots, below, side="left"),
            jnp.searchsorted(self.knots, above, side="right"),
        )
        i = jnp.clip(side - 1, 0, last)
        a, b = self.knots[i], self.knots[i + 1]
        inside = (s >= self.knots[0]) & (s <= self.knots[self.count]) & (self.count > 0)
        width = jnp.where(b > a, b - a, 1.0)
        # not clipped to [-1, 1]: at a knot a clip would halve the derivative in t (JAX splits
        # the gradient of min/max at a tie), and s is inside the piece but for round-off
        x = 2.0 * (s - a) / width - 1.0
        return i, x, width, inside

    def evaluate(self, t) -> PyTree[Array]:
        """The state at time `t` (a scalar): NaN outside the span the solve covered."""
        _, _, _, inside = self._piece(t)
        return jax.tree.map(lambda v: jnp.where(inside, v, jnp.nan), self.read(t))

    def read(self, t, left=None) -> PyTree[Array]:
        """The state at time `t` (a scalar) from the piece nearest to it, without the check
        that `t` is inside the span (a delay equation reads its past with it). With `left`
        (a bool) given, at a knot within round-off of `t` (where the solution may jump: a
        reset) the left limit where it is true, the right one where false."""
        i, x, _, _ = self._piece(t, left)

        def leaf(c):
            c = c[i]
            basis = _chebyshev(x, c.shape[0]).astype(c.dtype)
            return jnp.tensordot(basis, c, axes=1)

        return jax.tree.map(leaf, self.coeffs)

    def derivative(self, t) -> PyTree[Array]:
        """d/dt of the state at time `t` (a scalar), the derivative of the interpolant."""
        i, x, width, inside = self._piece(t)

        def leaf(c):
            c = c[i]
            slope = _chebyshev_slope(x, c.shape[0]).astype(c.dtype)
            value = jnp.tensordot(slope, c, axes=1) * (2.0 * self.direction / width)
            return jnp.where(inside & (self.knots[i + 1] > self.knots[i]), value, jnp.nan)

        return jax.tree.map(leaf, self.coeffs)


def _chebyshev(x, n: int):
    """T_0(x) … T_{n-1}(x), shape (n,), by the three-term recurrence."""
    values = [jnp.ones_like(x), x]
    for _ in range(2, n):
        values.append(2 * x * values[-1] - values[-2])
    return jnp.stack(values[:n])


def _chebyshev_slope(x, n: int):
    """T_0'(x) … T_{n-1}'(x): T'_{j+1} = 2 T_j + 2x T'_j − T'_{j−1}."""
    values = _chebyshev(x, n)
    slopes = [jnp.zeros_like(x), jnp.ones_like(x)]
    for j in range(1, n - 1):
        slopes.append(2 * values[j] + 2 * x * slopes[j] - slopes[j - 1])
    return jnp.stack(slopes[:n])
