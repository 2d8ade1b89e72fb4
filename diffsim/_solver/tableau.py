"""Butcher tableaus and the stage combination, shared by the fixed-step Runge–Kutta methods and
the lean adaptive loop (which reads diffrax's embedded pairs through `from_diffrax`)."""

from typing import NamedTuple

import jax
import numpy as np


class ButcherTableau(NamedTuple):
    """`c` (nodes, length s, `c[0] = 0`), `a` (rows 1..s-1 of the strictly lower triangle),
    `b` (weights) and, for an embedded pair, `b_error` (the weights of the error estimate:
    the difference of the two solutions' weights)."""

    c: tuple[float, ...]
    a: tuple[tuple[float, ...], ...]
    b: tuple[float, ...]
    b_error: tuple[float, ...] | None = None

    def check(self) -> None:
        s = len(self.b)
        assert len(self.c) == s and len(self.a) == s - 1
        assert all(len(row) == i + 1 for i, row in enumerate(self.a))
        # Consistency (sum of b = 1, row sums = c) is what makes the method order >= 1.
        assert abs(sum(self.b) - 1) < 1e-14
        assert all(abs(sum(row) - ci) < 1e-14 for row, ci in zip(self.a, self.c[1:]))

    @property
    def fsal(self) -> bool:
        """First same as last: the last stage is the vector field at the new state."""
        return (
            len(self.a) > 0
            and self.c[-1] == 1
            and self.b[-1] == 0
            and np.allclose(self.a[-1], self.b[:-1], rtol=0, atol=1e-15)
        )

    @classmethod
    def from_diffrax(cls, tableau) -> "ButcherTableau":
        """The same method from a `diffrax.ButcherTableau` (whose `c` and `a_lower` leave out
        the first stage's zero row)."""
        floats = lambda values: tuple(float(v) for v in values)  # noqa: E731
        return cls(
            c=(0.0,) + floats(tableau.c),
            a=tuple(floats(row) for row in tableau.a_lower),
            b=floats(tableau.b_sol),
            b_error=floats(tableau.b_error),
        )


def combine(y, dt, coefficients, ks):
    """y + dt * sum_j coefficients[j] * ks[j] over pytrees, skipping zero coefficients (at trace
    time, so the compiled step does only the arithmetic the tableau needs).

    Stages with equal coefficients are summed first and each sum is scaled once by the scalar
    dt·c (RK4's last line is dt/6·(k1 + k4) + dt/3·(k2 + k3)): fewer passes over the state than
    scaling every stage, which an ensemble step pays for under vmap."""
    groups: dict[float, list] = {}
    for c, k in zip(coefficients, ks):
        if c != 0:
            groups.setdefault(float(c), []).append(k)
    if not groups:
        return y

    def leaf(y_leaf, *k_leaves):
        flat = iter(k_leaves)
        increment = None
        for c, members in groups.items():
            total = next(flat)
            for _ in members[1:]:
                total = total + next(flat)
            term = (dt * c) * total
            increment = term if increment is None else increment + term
        return y_leaf + increment

    return jax.tree.map(leaf, y, *[k for members in groups.values() for k in members])
