"""`ds.lyapunov_exponent`: analytic cases, the Lorenz value, transformations, bad input."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import diffsim as ds
import models

LORENZ_PUBLISHED = 0.9056  # largest exponent at σ = 10, β = 8/3, ρ = 28 (Sprott 2003)


def _linear(t, y, a):
    return a @ y


def _rk4_matrix(a, h):
    """The RK4 step of y' = A y as a matrix: the degree-4 Taylor polynomial of exp(hA)."""
    z = h * a
    out, term = np.eye(len(a)), np.eye(len(a))
    for k in range(1, 5):
        term = term @ z / k
        out = out + term
    return out


# eigenvalues 0.3 (dominant, real) and −0.2 ± 2i; the upper block makes A non-normal, so the
# tangent has to turn into the dominant eigenvector, not only grow
A = np.array([[0.3, 1.0, 0.5], [0.0, -0.2, 2.0], [0.0, -2.0, -0.2]])
V0 = np.array([1.0, 1.0, 1.0])


def test_linear_ode_is_the_log_growth_of_the_discrete_map():
    """For a linear ODE renormalization telescopes: λ = ln(‖Mⁿ v‖ / ‖v‖) / (n h) exactly, with
    M the RK4 step matrix, whatever the renormalization interval."""
    h, steps = 0.01, 5000
    model = ds.ODE(_linear, jnp.asarray(A))
    expected = np.log(
        np.linalg.norm(np.linalg.matrix_power(_rk4_matrix(A, h), steps) @ V0) / np.linalg.norm(V0)
    ) / (steps * h)
    for every in (1, 50):
        got = ds.lyapunov_exponent(
            model,
            jnp.ones(3),
            solver=ds.RK4(),
            dt=h,
            steps=steps,
            renormalize_every=every,
            tangent=jnp.asarray(V0),
        )
        # only round-off differs: ~steps/every logs summed, each good to ~1e-16
        assert got == pytest.approx(expected, rel=1e-11, abs=1e-13)


@pytest.mark.parametrize("dtype, dt", [(jnp.float64, 5.0), (jnp.float32, 0.7)])
def test_fast_growth_between_renormalizations_stays_finite(dtype, dt):
    """y' = y over 100 steps between renormalizations grows the tangent by R(dt)^100 (R the RK4
    amplification 1 + z + z²/2 + z³/6 + z⁴/24): e^418 in float64 (its square would overflow),
    e^59 in float32 (likewise); the exponent is ln R(dt) / dt to the dtype's round-off."""
    model = ds.ODE(lambda t, y, p: y, None)
    y0 = jnp.ones(1, dtype)
    exponent = ds.lyapunov_exponent(
        model, y0, solver=ds.RK4(), dt=dt, steps=100, renormalize_every=100
    )
    growth = 1 + dt + dt**2 / 2 + dt**3 / 6 + dt**4 / 24
    rtol = 1e-12 if dtype == jnp.float64 else 1e-5
    np.testing.assert_allclose(float(exponent), np.log(growth) / dt, rtol=rtol)


def test_linear_ode_converges_to_the_largest_real_part():
    """λ_T = μ₁ + ln|c₁|/T + O(e^{−gap·T}/T), with μ₁ = 0.3 the dominant eigenvalue, c₁ the
    component of the unit start vector along its unit eigenvector, gap = 0.5; RK4's error in the
    multiplier, ln R(hμ₁)/h − μ₁ ≈ −μ₁⁵h⁴/120, is 2e-13 at h = 0.01."""
    h, steps = 0.01, 10_000
    eigenvalues, vectors = np.linalg.eig(A)
    dominant = int(np.argmax(eigenvalues.real))
    vectors = vectors / np.linalg.norm(vectors, axis=0)
    c = np.linalg.solve(vectors, V0 / np.linalg.norm(V0))[dominant]
    duration = steps * h
    got = ds.lyapunov_exponent(
        ds.ODE(_linear, jnp.asarray(A)),
        jnp.ones(3),
        solver=ds.RK4(),
        dt=h,
        steps=steps,
        tangent=jnp.asarray(V0),
    )
    expected = eigenvalues[dominant].real + np.log(abs(c)) / duration
    # e^{−0.5 T} / T = 2e-24 at T = 100: what is left is round-off (and the h⁴ term above)
    assert got == pytest.approx(expected, abs=1e-10)
    assert got == pytest.approx(0.3, abs=abs(np.log(abs(c))) / duration + 1e-10)


@pytest.mark.parametrize("solver", [ds.Leapfrog(), ds.RK4()], ids=["Leapfrog", "RK4"])
def test_harmonic_oscillator_exponent_is_zero(solver):
    """x'' = −ω²x: the flow matrix [[cos, sin/ω], [−ω sin, cos]] has singular values ω and 1/ω,
    so ‖Φ(t)v‖ ∈ [1/2, 2] for ω = 2 and |λ_T| ≤ ln 2 / T. Leapfrog's map is conjugate to a
    rotation with the same bound up to O((ωh)²); RK4 damps by (ωh)⁶/144 per step, ~1e-12 here."""
    duration, h = 200.0, 0.01
    model = models.HarmonicOscillator(omega=2.0)
    got = ds.lyapunov_exponent(
        model, jnp.array([1.0, 0.0]), solver=solver, dt=h, steps=round(duration / h)
    )
    assert abs(float(got)) <= 1.01 * np.log(2.0) / duration


def test_lorenz_28_against_the_published_value():
    """Finite-time estimates scatter about the limit like σ∞/√T: over 8 initial conditions at
    T = 500 the measured spread is ≈ 0.005 (σ∞ ≈ 0.11–0.15), so their mean has a standard error
    ≈ 0.002; RK4's bias at dt = 0.01 measured < 0.003 (against dt = 0.005). The mean must be
    within 0.01 (≈ 5 standard errors, with the bias) and every member within 0.035 (≈ 5σ)."""
    y0s = jnp.array([[1.0, 1.0, 20.0]]) + jax.random.normal(jax.random.key(1), (8, 3))

    def exponent(y0):
        return ds.lyapunov_exponent(
            models.Lorenz(), y0, solver=ds.RK4(), dt=0.01, steps=50_000, transient_steps=2_000
        )

    run = jax.jit(jax.vmap(exponent))
    exponents = np.asarray(run(y0s))
    assert np.mean(exponents) == pytest.approx(LORENZ_PUBLISHED, abs=0.01)
    assert np.all(np.abs(exponents - LORENZ_PUBLISHED) < 0.035)


def _fixed_point_exponent(rho, sigma=10.0, beta=8.0 / 3.0):
    if rho < 1:
        return max(np.roots([1.0, sigma + 1.0, sigma * (1 - rho)]).real.max(), -beta)
    coefficients = [1.0, sigma + beta + 1.0, beta * (rho + sigma), 2 * sigma * beta * (rho - 1)]
    return np.roots(coefficients).real.max()


def test_vmap_over_rho_matches_single_runs_and_the_stable_fixed_points():
    """A batch of ρ through `jax.vmap` gives the single runs' values; at ρ = 0.5 (stable
    origin) and 10 (stable C±) the exponent is the largest real part of the linearization's
    eigenvalues. On the focus C± the tangent turns in a skewed basis: ‖Φ(t)v‖ / e^{Re μ t} stays
    within [1/κ, κ], κ = 1.61 the condition number of the eigenvectors, so the error is at most
    ln κ / T = 0.48 / T (the transient has brought the state to the fixed point by e^{−12})."""
    rhos = jnp.array([0.5, 10.0, 28.0])
    duration, transient = 100.0, 20.0
    options = dict(
        solver=ds.RK4(),
        dt=0.01,
        steps=round(duration / 0.01),
        transient_steps=round(transient / 0.01),
        history=True,
    )
    y0 = jnp.array([1.0, 1.0, 20.0])

    def one(rho):
        return ds.lyapunov_exponent(models.Lorenz(rho=rho), y0, **options)

    batch, running = jax.jit(jax.vmap(one))(rhos)
    assert batch.shape == (3,) and running.shape == (3, round(duration / 0.01) // 10)
    np.testing.assert_array_equal(running[:, -1], batch)
    for rho, value in zip(rhos, batch):
        single, _ = one(rho)
        # the same arithmetic batched or not: equal up to the order of floating-point sums
        assert float(value) == pytest.approx(float(single), rel=1e-12, abs=1e-14)
    for rho, value in zip(np.asarray(rhos[:2]), np.asarray(batch[:2])):
        assert value < 0
        assert value == pytest.approx(_fixed_point_exponent(rho), abs=0.48 / duration)
    assert batch[2] > 0.5  # chaotic at ρ = 28 (the precise value: the test above)


def test_pytree_state_gives_the_array_result():
    """A state split into a tuple of leaves is the same flow: the same exponent, the tangent
    norm taken over all leaves."""

    def split(t, y, a):
        full = a @ jnp.concatenate([y[0], y[1]])
        return (full[:1], full[1:])

    h, steps = 0.01, 1000
    array = ds.lyapunov_exponent(
        ds.ODE(_linear, jnp.asarray(A)),
        jnp.ones(3),
        solver=ds.RK4(),
        dt=h,
        steps=steps,
        tangent=jnp.asarray(V0),
    )
    tree = ds.lyapunov_exponent(
        ds.ODE(split, jnp.asarray(A)),
        (jnp.ones(1), jnp.ones(2)),
        solver=ds.RK4(),
        dt=h,
        steps=steps,
        tangent=(jnp.ones(1), jnp.ones(2)),
    )
    assert float(tree) == pytest.approx(float(array), rel=1e-12)


def test_jit_traces_once_for_new_parameter_values():
    @eqx.filter_jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def exponent(model):
        return ds.lyapunov_exponent(
            model, jnp.array([1.0, 1.0, 20.0]), solver=ds.RK4(), dt=0.01, steps=100
        )

    for rho in (10.0, 20.0, 28.0):
        assert np.isfinite(exponent(models.Lorenz(rho=rho)))


def test_float32_is_kept():
    h, steps = 0.01, 2000
    model = ds.ODE(_linear, jnp.asarray(A, jnp.float32))
    single = ds.lyapunov_exponent(
        model,
        jnp.ones(3, jnp.float32),
        solver=ds.RK4(),
        dt=h,
        steps=steps,
        tangent=jnp.asarray(V0, jnp.float32),
    )
    double = ds.lyapunov_exponent(
        ds.ODE(_linear, jnp.asarray(A)),
        jnp.ones(3),
        solver=ds.RK4(),
        dt=h,
        steps=steps,
        tangent=jnp.asarray(V0),
    )
    assert single.dtype == jnp.float32 and double.dtype == jnp.float64
    # 200 logs of float32 growth factors, each good to ~1e-7: the sum divided by T = 20
    assert float(single) == pytest.approx(float(double), abs=1e-5)


def test_gradient_of_the_exponent():
    """y' = a y: λ = ln R(ha) / h exactly (R the RK4 polynomial), so dλ/da = R'(ha) / R(ha)."""
    h = 0.01

    def exponent(a):
        model = ds.ODE(lambda t, y, p: p * y, a)
        return ds.lyapunov_exponent(model, jnp.ones(1), solver=ds.RK4(), dt=h, steps=1000)

    a = 0.7
    z = h * a
    r = 1 + z + z**2 / 2 + z**3 / 6 + z**4 / 24
    r_prime = 1 + z + z**2 / 2 + z**3 / 6
    assert float(exponent(jnp.asarray(a))) == pytest.approx(np.log(r) / h, rel=1e-12)
    assert float(jax.grad(exponent)(jnp.asarray(a))) == pytest.approx(r_prime / r, rel=1e-10)


def test_blow_up_gives_nan_not_an_error():
    """y' = y² from 1 blows up at t = 1: NaN for that member, no error, under vmap too."""
    model = ds.ODE(lambda t, y, p: p * y**2, 1.0)
    run = jax.vmap(lambda y0: ds.lyapunov_exponent(model, y0, solver=ds.RK4(), dt=0.01, steps=200))
    out = np.asarray(run(jnp.array([[-1.0], [1.0]])))
    assert np.isfinite(out[0]) and out[0] < 0  # from −1 it decays like −1/(1+t)
    assert np.isnan(out[1])
    # members whose parameters are invalid (NaN, a negative frequency): NaN, not the -inf of a
    # zero tangent (their solve fails at once, and its inputs' tangents are held at zero)
    oscillator = models.HarmonicOscillator(omega=2.0)
    exponent = jax.vmap(
        lambda w: ds.lyapunov_exponent(
            eqx.tree_at(lambda m: m.omega, oscillator, w),
            jnp.array([1.0, 0.0]),
            solver=ds.RK4(),
            dt=0.1,
            steps=100,
        )
    )(jnp.array([2.0, jnp.nan, -2.0]))
    assert np.isfinite(exponent[0]) and np.all(np.isnan(exponent[1:]))


LORENZ = models.Lorenz()
Y0 = jnp.array([1.0, 1.0, 20.0])


@pytest.mark.parametrize(
    "changes, error, match",
    [
        (dict(dt=0.0), ValueError, "dt must be a finite number > 0"),
        (dict(dt=-0.01), ValueError, "dt must be a finite number > 0"),
        (dict(steps=0), ValueError, "steps must be >= 1"),
        (dict(steps=100.0), TypeError, "steps must be a Python int"),
        (dict(steps=105), ValueError, "multiple of renormalize_every"),
        (dict(transient_steps=-10), ValueError, "transient_steps must be >= 0"),
        (dict(transient_steps=15), ValueError, "multiple of renormalize_every"),
        (dict(renormalize_every=0), ValueError, "renormalize_every must be >= 1"),
        (dict(solver=ds.Tsit5()), TypeError, "fixed-step deterministic solver"),
        (dict(solver=ds.RK4), TypeError, r"Pass an instance: solver=ds\.RK4\(\)"),
        (dict(solver=ds.EulerMaruyama()), TypeError, "EulerMaruyama is a stochastic solver"),
        (dict(solver="rk4"), TypeError, "not a diffsim solver"),
        (dict(model=models.OrnsteinUhlenbeck()), TypeError, "stochastic model"),
        (dict(model=lambda t, y: y), TypeError, "must be a diffsim model"),
        (dict(y0=jnp.array([1.0, jnp.nan, 20.0])), ValueError, "y0 holds NaN or inf"),
        (dict(tangent=jnp.zeros(3)), ValueError, "non-zero"),
        (dict(tangent=jnp.ones(2)), ValueError, "tangent must be a pytree like y0"),
        (dict(history=1), TypeError, "history must be True or False"),
    ],
)
def test_bad_input(changes, error, match):
    arguments = dict(model=LORENZ, y0=Y0, solver=ds.RK4(), dt=0.01, steps=100)
    arguments.update(changes)
    model, y0 = arguments.pop("model"), arguments.pop("y0")
    with pytest.raises(error, match=match):
        ds.lyapunov_exponent(model, y0, **arguments)


def test_traced_nonpositive_dt_raises_when_run():
    run = jax.jit(lambda dt: ds.lyapunov_exponent(LORENZ, Y0, solver=ds.RK4(), dt=dt, steps=10))
    assert np.isfinite(run(0.01))
    with pytest.raises(Exception, match="dt must be > 0"):
        jax.block_until_ready(run(-0.01))
