"""`ds.train`'s L-BFGS (`diffsim/_fit/lbfgs.py`: one evaluation of the loss and gradient a
step, its line search a state of the loop) on functions with known minima."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from diffsim._fit.lbfgs import lbfgs_init, lbfgs_step


def _run(f, x0, steps, project=lambda x: x):
    """`steps` steps from x0 in one scan: (the state, whether each evaluation was finite)."""
    value_and_grad = jax.value_and_grad(f)

    def body(state, _):
        return jax.lax.cond(
            state.done,
            lambda s: (s, jnp.array(True)),
            lambda s: lbfgs_step(value_and_grad, project, s),
            state,
        )

    return jax.jit(lambda x: jax.lax.scan(body, lbfgs_init(x), None, length=steps))(x0)


def test_rosenbrock_s_valley_is_followed_to_its_minimum():
    """Rosenbrock's function from (−1.2, 1) (its classic start; L-BFGS with a line search
    takes 30–40 iterations): at (1, 1) to 1e-8 within 100 evaluations, rejected tries
    included, and it stops there (`done`); a quadratic of condition 1e3 in 8 dimensions:
    its solution A⁻¹b to 1e-6 within 60."""
    rosenbrock = lambda x: (1 - x[0]) ** 2 + 100 * (x[1] - x[0] ** 2) ** 2  # noqa: E731
    state, finite = _run(rosenbrock, jnp.array([-1.2, 1.0]), 100)
    np.testing.assert_allclose(state.x, [1.0, 1.0], atol=1e-8)
    assert bool(state.done) and bool(jnp.all(finite))
    a = jnp.diag(jnp.logspace(0.0, 3.0, 8))
    b = jnp.arange(1.0, 9.0)
    state, _ = _run(lambda x: 0.5 * x @ a @ x - b @ x, jnp.zeros(8), 60)
    np.testing.assert_allclose(state.x, jnp.linalg.solve(a, b), atol=1e-6)


def test_a_step_into_a_failed_solve_is_shortened_and_the_bounds_hold():
    """A loss that is NaN from x = 1 on (a solve failing there), its minimum at 2 beyond:
    steps into the NaN region are rejected (counted as not finite) and shortened, so the
    iterate approaches 1 from below; bounded at 0.5, it stops on the bound, the minimum
    within them, and every point it accepts lies within."""

    def loss(x):
        return jnp.where(x[0] < 1.0, (x[0] - 2.0) ** 2, jnp.nan)

    state, finite = _run(loss, jnp.zeros(1), 40)
    assert 0.99 < float(state.x[0]) < 1.0 and not bool(jnp.all(finite))
    state, finite = _run(loss, jnp.zeros(1), 40, project=lambda x: jnp.clip(x, -1.0, 0.5))
    assert float(state.x[0]) == pytest.approx(0.5) and bool(state.done)
    assert float(state.f) == pytest.approx(2.25)
