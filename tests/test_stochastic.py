"""Stochastic differential equations: moments, strong orders, pathwise gradients, key contract."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import diffsim as ds
import models

PATHS = 20_000


def _final(model, solver, y0, t1, dt, keys):
    ts = np.array([0.0, t1])

    def one(key):
        return ds.simulate(model, y0, ts, solver=solver, dt=dt, key=key).ys[-1]

    return jax.jit(jax.vmap(one))(keys)


def test_ornstein_uhlenbeck_moments_against_closed_form():
    ou = models.OrnsteinUhlenbeck(theta=2.0, mu=1.0, sigma=0.5)
    dt, n, x0 = 0.01, 100, 0.0
    x = np.asarray(_final(ou, ds.EulerMaruyama(), jnp.array([x0]), 1.0, dt, _keys(PATHS)))[:, 0]
    # Euler–Maruyama on OU is the AR(1) recursion X' = aX + θμh + σ√h Z, a = 1 − θh, whose
    # moments are exact: mean μ + (x0 − μ)aⁿ, variance σ²h(1 − a²ⁿ)/(1 − a²).
    a = 1 - 2.0 * dt
    mean = 1.0 + (x0 - 1.0) * a**n
    variance = 0.25 * dt * (1 - a ** (2 * n)) / (1 - a**2)
    # sampling: se(mean) = sqrt(var/N), se(var) = var·sqrt(2/(N−1)); 4 se bounds
    assert abs(x.mean() - mean) < 4 * np.sqrt(variance / PATHS)
    assert abs(x.var(ddof=1) - variance) < 4 * variance * np.sqrt(2 / (PATHS - 1))
    # and the discrete moments are within O(θh) of the continuous ones
    assert mean == pytest.approx(float(ou.mean(x0, 1.0)), rel=2 * 2.0 * dt)
    assert variance == pytest.approx(float(ou.variance(1.0)), rel=2 * 2.0 * dt)


@pytest.mark.parametrize(
    "solver, order", [(ds.EulerMaruyama(), 0.5), (ds.Milstein(), 1.0)], ids=["EM", "Milstein"]
)
def test_strong_order_on_geometric_brownian_motion(solver, order):
    gbm = models.GeometricBrownianMotion(mu=0.1, sigma=0.5)
    keys = _keys(2000)
    errors = []
    steps = [8, 16, 32, 64]
    for n in steps:
        dt = 1.0 / n
        x = _final(gbm, solver, jnp.array([1.0]), 1.0, dt, keys)[:, 0]
        # the same Brownian path, from the documented increments of steps 0..n-1
        w = jax.vmap(lambda k: _brownian(k, n, dt))(keys)[:, 0]
        errors.append(float(jnp.mean(jnp.abs(x - gbm.exact(1.0, 1.0, w)))))
    slope = np.polyfit(np.log(1.0 / np.array(steps)), np.log(errors), 1)[0]
    # 2000 paths on one set of paths for every dt: the slope's sampling error is a few 0.01
    assert abs(slope - order) < 0.12, (slope, errors)


def test_pathwise_gradient_of_the_mean_of_gbm():
    keys = _keys(PATHS)
    dt, n = 0.01, 100

    def mean_final(mu):
        gbm = models.GeometricBrownianMotion(mu=mu, sigma=0.5)
        return _final(gbm, ds.EulerMaruyama(), jnp.array([1.0]), 1.0, dt, keys)[:, 0]

    # per-path derivatives dX_T/dμ (one forward pass); their mean is the gradient of the mean
    samples = np.asarray(jax.jacfwd(mean_final)(0.1))
    gradient = float(jax.grad(lambda mu: jnp.mean(mean_final(mu)))(0.1))
    assert gradient == pytest.approx(samples.mean(), rel=1e-9)
    # EM on GBM: E[X_n] = (1 + μh)ⁿ exactly, so d/dμ = n h (1 + μh)^{n−1} (closed form e^μ)
    exact_discrete = n * dt * (1 + 0.1 * dt) ** (n - 1)
    se = samples.std(ddof=1) / np.sqrt(PATHS)
    assert abs(gradient - exact_discrete) < 4 * se
    assert exact_discrete == pytest.approx(np.exp(0.1), rel=0.01)


def test_path_does_not_depend_on_saved_times_or_batching():
    gbm = models.GeometricBrownianMotion(mu=0.1, sigma=0.5)
    key = jax.random.key(7)
    ends = [
        ds.simulate(gbm, jnp.array([1.0]), ts, solver=ds.Milstein(), dt=0.01, key=key).ys[-1]
        for ts in (np.array([0.0, 1.0]), np.linspace(0.0, 1.0, 11), np.array([0.0, 0.3, 1.0]))
    ]
    assert ends[0] == ends[1] == ends[2]
    keys = _keys(64)
    whole = _final(gbm, ds.EulerMaruyama(), jnp.array([1.0]), 1.0, 0.01, keys)
    halves = [
        _final(gbm, ds.EulerMaruyama(), jnp.array([1.0]), 1.0, 0.01, k)
        for k in (keys[:32], keys[32:])
    ]
    assert jnp.array_equal(whole, jnp.concatenate(halves))


class _GBMWithItsPath(ds.AbstractSDE):
    """[X, W]: GBM and its own driving Brownian motion, one noise through a (2, 1) diffusion."""

    mu: jax.Array = ds.parameter(0.1, ndim=0)
    sigma: jax.Array = ds.parameter(0.5, ndim=0)
    noise = "general"

    def drift(self, t, y):
        return jnp.stack([self.mu * y[0], jnp.zeros_like(y[1])])

    def diffusion(self, t, y):
        return jnp.stack([self.sigma * y[0], jnp.ones_like(y[1])])[:, None]


class _CrossDiagonal(ds.AbstractSDE):
    """Diagonal noise g = s·[y_1, 1]: the first component's noise depends on the second state."""

    s: jax.Array = ds.parameter(0.5, ndim=0)

    def drift(self, t, y):
        return jnp.zeros_like(y)

    def diffusion(self, t, y):
        return self.s * jnp.stack([y[1], jnp.ones_like(y[0])])


def test_general_noise_shares_one_brownian_motion():
    model = _GBMWithItsPath()
    key = jax.random.key(3)
    y = ds.simulate(
        model,
        jnp.array([1.0, 0.0]),
        np.array([0.0, 1.0]),
        solver=ds.EulerMaruyama(),
        dt=1 / 64,
        key=key,
    ).ys[-1]
    # EM integrates dW exactly: the second component is W(1) from the documented increments
    assert float(y[1]) == pytest.approx(float(_brownian(key, 64, 1 / 64)[0]), abs=1e-12)


@pytest.mark.parametrize(
    "model, solver, key, message",
    [
        (models.OrnsteinUhlenbeck(), ds.RK4(), None, "stochastic model"),
        (models.OrnsteinUhlenbeck(), ds.EulerMaruyama(), None, "needs key="),
        (models.HarmonicOscillator(), ds.RK4(), jax.random.key(0), "drop key"),
        (models.HarmonicOscillator(), ds.EulerMaruyama(), jax.random.key(0), "deterministic"),
        (_GBMWithItsPath(), ds.Milstein(), jax.random.key(0), "Milstein needs diagonal"),
        # diagonal noise whose g_0 reads y_1: Milstein's ∂g_i/∂y_i by one jvp would be wrong
        (_CrossDiagonal(), ds.Milstein(), jax.random.key(0), r"g_0 depends on y_1 \(∂g_0/∂y_1"),
        # ShARK takes additive noise only: diffrax's own error named neither solver nor model
        (
            _CrossDiagonal(),
            ds.DiffraxSDE(diffrax.ShARK()),
            jax.random.key(0),
            r"diffrax.ShARK\(\) solves SDEs with additive noise only.*_CrossDiagonal",
        ),
    ],
)
def test_wrong_pairings_get_clear_errors(model, solver, key, message):
    y0 = jnp.array([1.0, 0.0]) if not isinstance(model, models.OrnsteinUhlenbeck) else jnp.ones(1)
    with pytest.raises((TypeError, ValueError), match=message):
        ds.simulate(model, y0, np.array([0.0, 1.0]), solver=solver, dt=0.1, key=key)


def _keys(n):
    return jax.random.split(jax.random.key(0), n)


def _brownian(key, n, dt):
    """W(n dt) of a one-dimensional path, from the increments `simulate` documents."""
    increments = jax.vmap(lambda j: ds.brownian_increment(key, j, (1,), jnp.asarray(dt)))(
        jnp.arange(n)
    )
    return jnp.sum(increments, axis=0)


def test_sweep_of_an_sde_is_the_same_whatever_the_chunking():
    axes = {"theta": np.linspace(0.5, 2.0, 6), "sigma": [0.1, 0.5, 1.0]}
    options = dict(
        solver=ds.EulerMaruyama(),
        dt=0.05,
        reduce="final_state",
        key=jax.random.key(11),
        progress=False,
    )
    model = models.OrnsteinUhlenbeck(mu=1.0)
    small = ds.sweep(model, axes, jnp.zeros(1), np.array([0.0, 2.0]), chunk_size=4, **options)
    large = ds.sweep(model, axes, jnp.zeros(1), np.array([0.0, 2.0]), chunk_size=18, **options)
    assert np.array_equal(small["final_state"].values, large["final_state"].values)
    # member (i, j) of the C-ordered grid is index 3i + j; its path key is documented
    member = ds.simulate(
        models.OrnsteinUhlenbeck(theta=axes["theta"][4], mu=1.0, sigma=0.5),
        jnp.zeros(1),
        np.array([0.0, 2.0]),
        solver=ds.EulerMaruyama(),
        dt=0.05,
        key=jax.random.fold_in(jax.random.fold_in(jax.random.key(11), 3 * 4 + 1), 1),
    )
    assert float(small["final_state"].values[4, 1, 0]) == float(member.ys[-1, 0])
    with pytest.raises(ValueError, match="give the sweep a key"):
        ds.sweep(
            model,
            axes,
            jnp.zeros(1),
            np.array([0.0, 2.0]),
            solver=ds.EulerMaruyama(),
            dt=0.05,
            progress=False,
        )


def test_langevin_velocities_reach_equipartition():
    # Started at rest in a well, the velocity relaxes (rate γ) to the Maxwell distribution:
    # ⟨v²⟩ = k_B T / m. After t = 10/γ the memory of the start is e^{-10}. Euler–Maruyama heats
    # an underdamped oscillator: its stationary variance is too large by about ω₀²h/(2γ) (2% here,
    # ω₀² = 8ΔU/m = 4); the bound is 4 standard errors of the mean of 4000 paths (9%) + 1%.
    model = models.Langevin(barrier=1.0, friction=1.0, temperature=0.25, mass=2.0)
    y = _final(model, ds.EulerMaruyama(), jnp.array([1.0, 0.0]), 10.0, 0.01, _keys(4000))
    v2 = np.asarray(y[:, 1]) ** 2
    target = 0.25 / 2.0
    assert abs(v2.mean() - target) < 4 * v2.std(ddof=1) / np.sqrt(v2.size) + 0.01 * target


def test_baoab_keeps_the_boltzmann_distribution_where_euler_maruyama_overheats():
    # One well of the double well at k_B T = 0.1 (barrier 10 k_B T: no escape in t = 10),
    # relaxed for 10/γ from rest at x = 1. Boltzmann: ⟨v²⟩ = k_B T/m, ⟨x⟩ by quadrature over
    # x > 0. At dt = 0.1 BAOAB agrees within 4 standard errors of 4000 paths (+0.5% for its
    # O(dt²) bias); Euler–Maruyama's ⟨v²⟩ is three times too large there.
    model = models.Langevin(barrier=1.0, friction=1.0, temperature=0.1, mass=1.0)
    x = np.linspace(0.0, 2.5, 200_001)
    weight = np.exp(-((x**2 - 1) ** 2) / 0.1)
    mean_x = float((x * weight).sum() / weight.sum())
    y0, keys = jnp.array([1.0, 0.0]), _keys(4000)
    y = np.asarray(_final(model, ds.BAOAB(), y0, 10.0, 0.1, keys))
    v2 = y[:, 1] ** 2
    assert abs(v2.mean() - 0.1) < 4 * v2.std(ddof=1) / np.sqrt(v2.size) + 0.005 * 0.1
    assert abs(y[:, 0].mean() - mean_x) < 4 * y[:, 0].std(ddof=1) / np.sqrt(len(y)) + 0.005
    hot = np.asarray(_final(model, ds.EulerMaruyama(), y0, 10.0, 0.1, keys))[:, 1] ** 2
    assert hot.mean() > 2 * 0.1
    with pytest.raises(TypeError, match="AbstractLangevin"):
        ds.simulate(
            models.OrnsteinUhlenbeck(),
            jnp.zeros(1),
            np.array([0.0, 1.0]),
            solver=ds.BAOAB(),
            dt=0.1,
            key=jax.random.key(0),
        )


def test_baoab_carries_its_force_and_stochastic_solvers_count_their_evaluations():
    # BAOAB's closing half kick uses the force at the new positions, the next step's opening
    # one: carried as the solver state, a step evaluates the force once, the trajectory is the
    # textbook two-force step repeated, and stats count 1 a step plus 1 an interval.
    traced = []

    class Counted(models.Langevin):
        def force(self, x):
            traced.append(None)
            return super().force(x)

    model = Counted(barrier=1.0, friction=0.5, temperature=0.2)
    y0, key, dt = jnp.array([-1.0, 0.3]), jax.random.key(3), 0.01
    dw = ds.brownian_increment(key, 0, (2,), dt)
    state = ds.BAOAB().init(model, 0.0, y0)
    traced.clear()
    ds.BAOAB().advance(model, 0.0, y0, dt, state, dw)
    assert len(traced) == 1  # the step's own force, at its end, which it hands on
    ts = np.linspace(0.0, 1.0, 5)  # 4 intervals of 25 steps
    sol = ds.simulate(model, y0, ts, solver=ds.BAOAB(), dt=dt, key=key)
    assert int(sol.stats["num_function_evals"]) == 100 + 4

    def textbook(y, j):  # B A O A B with both kicks' forces evaluated, noise of step j
        dw = ds.brownian_increment(key, j, (2,), dt)
        return ds.BAOAB().step(model, j.astype(y.dtype) * dt, y, dt, dw), None

    alone, _ = jax.lax.scan(textbook, y0, jnp.arange(100))
    # the same arithmetic in another loop: round-off of ~1e-16 a step over 100 steps
    np.testing.assert_allclose(sol.ys[-1], alone, rtol=1e-12, atol=1e-12)

    em = ds.simulate(model, y0, ts, solver=ds.EulerMaruyama(), dt=dt, key=key)
    assert int(em.stats["num_function_evals"]) == 100
    # a diffrax method: its stages (ShARK: 2) per step; one this wrapper cannot count is left out
    ou, x0 = models.OrnsteinUhlenbeck(), jnp.zeros(1)
    shark = ds.simulate(ou, x0, ts, solver=ds.DiffraxSDE(diffrax.ShARK()), dt=dt, key=key)
    assert int(shark.stats["num_function_evals"]) == 2 * 100
    assert ds.DiffraxSDE(diffrax.ReversibleHeun()).evals_per_step is None


def test_kramers_rate_limits():
    # transition-state theory as friction → 0; the overdamped Smoluchowski rate
    # ω_0 ω_b / (2π γ) e^{−ΔU/kT} as friction → ∞ (m = 1: ω_0² = 8ΔU, ω_b² = 4ΔU)
    barrier, temperature = 1.0, 0.2
    boltzmann = np.exp(-barrier / temperature)
    omega0, omega_b = np.sqrt(8 * barrier), np.sqrt(4 * barrier)
    weak = models.Langevin(barrier=barrier, friction=1e-6, temperature=temperature)
    strong = models.Langevin(barrier=barrier, friction=1e4, temperature=temperature)
    assert float(weak.kramers_rate()) == pytest.approx(omega0 / (2 * np.pi) * boltzmann, rel=1e-5)
    overdamped = omega0 * omega_b / (2 * np.pi * 1e4) * boltzmann
    assert float(strong.kramers_rate()) == pytest.approx(overdamped, rel=1e-6)


def _walk_step(key, position):
    return position + jnp.where(jax.random.bernoulli(key), 1, -1).astype(position.dtype)


def test_iterate_gives_first_passage_times_of_a_random_walk():
    # A ±1 random walk from 0 leaves (−a, a) after a² steps on average (gambler's ruin), with
    # variance (2/3) a²(a² − 1).
    a, members = 10, 4000
    stop = lambda x: jnp.abs(x) >= a  # noqa: E731

    def first_passage(key):
        return ds.iterate(_walk_step, jnp.array(0, jnp.int32), key, stop=stop, max_steps=10_000)

    out = jax.jit(jax.vmap(first_passage))(_keys(members))
    assert bool(out.stopped.all()) and bool((jnp.abs(out.state) == a).all())
    steps = np.asarray(out.steps, np.float64)
    se = np.sqrt(2 / 3 * a**2 * (a**2 - 1) / members)
    assert abs(steps.mean() - a**2) < 4 * se
    # a member's result does not depend on its batch
    alone = first_passage(_keys(members)[17])
    assert int(alone.steps) == int(out.steps[17]) and int(alone.state) == int(out.state[17])
    capped = ds.iterate(_walk_step, jnp.array(0, jnp.int32), _keys(1)[0], stop=stop, max_steps=3)
    assert int(capped.steps) == 3 and not bool(capped.stopped)


def test_stochastic_sir_conserves_people_and_follows_the_deterministic_mean():
    n_people = 1e5
    model = models.StochasticSIR(beta=0.3, gamma=0.1, population=n_people)
    y0 = jnp.array([n_people - 1000.0, 1000.0, 0.0])
    ends = _final(model, ds.EulerMaruyama(), y0, 30.0, 0.05, _keys(1000))
    # each increment moves people between compartments: the total is kept to round-off
    assert float(jnp.max(jnp.abs(ends.sum(axis=1) - n_people))) < 1e-7 * n_people
    deterministic = ds.simulate(
        models.SIR(beta=0.3, gamma=0.1, population=n_people),
        y0,
        np.array([0.0, 30.0]),
        solver=ds.RK4(),
        dt=0.05,
    ).ys[-1]
    # Through the nonlinear drift, noise shifts the ensemble mean from the deterministic path by
    # O(1/I₀) relative (measured: 1.7% for I₀ = 100, 0.4% for I₀ = 1000), plus Euler–Maruyama's
    # O(h) bias: allow 1%, and 4 standard errors of the mean of 1000 paths.
    infected = np.asarray(ends[:, 1])
    se = infected.std(ddof=1) / np.sqrt(infected.size)
    assert abs(infected.mean() - float(deterministic[1])) < 4 * se + 0.01 * float(deterministic[1])


def test_diffrax_sde_solvers_share_the_brownian_path():
    # The adapter hands diffrax the very increment the built-in solvers use: diffrax's Euler
    # is Euler–Maruyama step for step (diagonal noise on OU, general noise on the SIR).
    key, ts = jax.random.key(3), np.linspace(0.0, 1.0, 11)
    ou = models.OrnsteinUhlenbeck(theta=2.0, mu=1.0, sigma=0.5)
    sir = models.StochasticSIR()
    for model, y0 in ((ou, jnp.array([0.0])), (sir, jnp.array([990.0, 10.0, 0.0]))):
        ours = ds.simulate(model, y0, ts, solver=ds.EulerMaruyama(), dt=0.01, key=key)
        theirs = ds.simulate(model, y0, ts, solver=ds.DiffraxSDE(diffrax.Euler()), dt=0.01, key=key)
        np.testing.assert_allclose(theirs.ys, ours.ys, rtol=1e-13, atol=1e-13)


def test_diffrax_shark_matches_ornstein_uhlenbeck_moments():
    # ShARK (needs the space-time Lévy area) at dt = 0.05 on OU from 0: mean and variance at
    # t = 1 against the closed form, within 4 standard errors of 20000 paths.
    ou = models.OrnsteinUhlenbeck(theta=2.0, mu=1.0, sigma=0.5)
    x = np.asarray(
        _final(ou, ds.DiffraxSDE(diffrax.ShARK()), jnp.array([0.0]), 1.0, 0.05, _keys(20_000))
    )[:, 0]
    mean = 1.0 - np.exp(-2.0)
    variance = 0.25 / 4 * (1 - np.exp(-4.0))
    assert abs(x.mean() - mean) < 4 * np.sqrt(variance / x.size)
    assert abs(x.var() / variance - 1) < 4 * np.sqrt(2 / x.size)
    with pytest.raises(TypeError, match="diffrax solver"):
        ds.DiffraxSDE(ds.EulerMaruyama())


def test_stratonovich_solvers_of_diffrax_solve_the_ito_equation():
    """diffsim's SDEs are Itô equations; diffrax's Heun and SPaRK converge to the Stratonovich
    solution of what they are given, so they get the drift corrected by −½ g ∂g/∂y. Pathwise
    against GBM's exact Itô solution on the same Brownian path, with diagonal noise and with
    general noise (the model that carries its own path): the uncorrected drift ends
    e^{σ²/2} ≈ 1.13 times too high (a mean error of ~0.14), the corrected one within the
    methods' O(dt) strong error (measured 7e-4 and 1.0e-3 at dt = 1/64)."""
    gbm, dt, n = models.GeometricBrownianMotion(mu=0.1, sigma=0.5), 1 / 64, 64
    keys = _keys(500)
    w = jax.vmap(lambda k: _brownian(k, n, dt))(keys)[:, 0]
    for solver in (ds.DiffraxSDE(diffrax.Heun()), ds.DiffraxSDE(diffrax.SPaRK())):
        x = _final(gbm, solver, jnp.array([1.0]), 1.0, dt, keys)[:, 0]
        assert float(jnp.mean(jnp.abs(x - gbm.exact(1.0, 1.0, w)))) < 0.005, solver
    heun = ds.DiffraxSDE(diffrax.Heun())
    y = _final(_GBMWithItsPath(), heun, jnp.array([1.0, 0.0]), 1.0, dt, keys)
    np.testing.assert_allclose(y[:, 1], w, atol=1e-12)  # its own path, integrated exactly
    assert float(jnp.mean(jnp.abs(y[:, 0] - gbm.exact(1.0, 1.0, y[:, 1])))) < 0.005
