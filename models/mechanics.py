"""Mechanical oscillators and pendulums.

Second-order models take the state `[q, v]` stacked on the first axis (or a tuple `(q, v)`):
`jnp.array([x0, v0])` for one degree of freedom.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array

import diffsim as ds


class HarmonicOscillator(ds.AbstractSecondOrder):
    """Linear oscillator  x'' = −ω² x − 2γ x'.

    - `omega` ω: natural angular frequency (rad/s, > 0).
    - `damping` γ: damping rate (1/s, ≥ 0), or `None` for no damping term at all. With `None` the
      acceleration does not depend on the velocity, so symplectic solvers apply.

    State `[x, v]` (m, m/s). Energy per unit mass `½v² + ½ω²x²`, conserved when undamped.
    `analytic_solution` gives x(t), v(t) in closed form for every damping regime.
    """

    omega: Array = ds.parameter(1.0, positive=True, ndim=0)
    damping: Array | None = ds.parameter(None, nonnegative=True, ndim=0)

    state_names = ("x", "v")

    def acceleration(self, t, q, v):
        a = -(self.omega**2) * q
        return a if self.damping is None else a - 2 * self.damping * v

    def energy(self, y):
        return 0.5 * y[1] ** 2 + 0.5 * self.omega**2 * y[0] ** 2

    def analytic_solution(self, y0, ts):
        """States `[x, v]` at times `ts` (shape `(times, 2)`) from `y0 = [x0, v0]` at t = 0:
        x(t) = e^{−γt} (x0 C(t) + (v0 + γ x0) S(t)) with C, S the cos/sinc (underdamped),
        cosh/sinh (overdamped) or 1/t (critical) fundamental solutions."""
        ts = jnp.asarray(ts)
        x0, v0 = y0[0], y0[1]
        gamma = jnp.zeros_like(self.omega) if self.damping is None else self.damping
        s = self.omega**2 - gamma**2  # ω_d² (negative when overdamped)
        under = s > 0
        # Double-where keeps gradients finite on both sides of critical damping.
        root = jnp.sqrt(jnp.where(under, s, -s))
        wt = root * ts
        c = jnp.where(under, jnp.cos(wt), jnp.cosh(wt))
        sinc_over = jnp.where(wt == 0, 1.0, jnp.sinh(wt) / jnp.where(wt == 0, 1.0, wt))
        sin_over_root = ts * jnp.where(under, jnp.sinc(wt / jnp.pi), sinc_over)
        # dS/dt = C; dC/dt = -s S
        decay = jnp.exp(-gamma * ts)
        a = x0
        b = v0 + gamma * x0
        x = decay * (a * c + b * sin_over_root)
        v = decay * (-gamma * (a * c + b * sin_over_root) + (-a * s * sin_over_root + b * c))
        return jnp.stack([x, v], axis=-1)


class DampedPendulum(ds.AbstractSecondOrder):
    """Damped, optionally driven, pendulum  θ'' = −(g/L) sin θ − b θ' + A cos(Ω t).

    - `length` L (m, > 0), `gravity` g (m/s², > 0), `damping` b (1/s, ≥ 0).
    - `drive_amplitude` A (rad/s²) and `drive_frequency` Ω (rad/s): both or neither (no drive).

    State `[θ, ω]` (rad, rad/s). Energy per unit mass `½L²ω² + gL(1 − cos θ)`, conserved when
    b = 0 and there is no drive.
    """

    length: Array = ds.parameter(1.0, positive=True, ndim=0)
    gravity: Array = ds.parameter(9.81, positive=True, ndim=0)
    damping: Array = ds.parameter(0.0, nonnegative=True, ndim=0)
    drive_amplitude: Array | None = ds.parameter(None, ndim=0)
    drive_frequency: Array | None = ds.parameter(None, nonnegative=True, ndim=0)

    state_names = ("angle", "angular_velocity")

    def __check_init__(self):
        if (self.drive_amplitude is None) != (self.drive_frequency is None):
            raise ValueError(
                "DampedPendulum: give both drive_amplitude and drive_frequency, or neither"
            )

    def acceleration(self, t, q, v):
        a = -(self.gravity / self.length) * jnp.sin(q) - self.damping * v
        if self.drive_amplitude is not None:
            a = a + self.drive_amplitude * jnp.cos(self.drive_frequency * t)
        return a

    def energy(self, y):
        return 0.5 * self.length**2 * y[1] ** 2 + self.gravity * self.length * (1 - jnp.cos(y[0]))


class DoublePendulum(ds.AbstractLagrangian):
    """Planar double pendulum of point masses on massless rods, from its Lagrangian

        L = ½(m₁+m₂)l₁²θ₁'² + ½m₂l₂²θ₂'² + m₂l₁l₂θ₁'θ₂' cos(θ₁−θ₂)
            + (m₁+m₂)g l₁ cos θ₁ + m₂ g l₂ cos θ₂,

    angles from the downward vertical. Accelerations come from the Euler–Lagrange equations by
    autodiff. `mass1`, `mass2` (kg), `length1`, `length2` (m), `gravity` (m/s²), all > 0.

    State shape (2, 2): `[[θ₁, θ₂], [θ₁', θ₂']]`. The energy `T + V` is conserved.
    """

    mass1: Array = ds.parameter(1.0, positive=True, ndim=0)
    mass2: Array = ds.parameter(1.0, positive=True, ndim=0)
    length1: Array = ds.parameter(1.0, positive=True, ndim=0)
    length2: Array = ds.parameter(1.0, positive=True, ndim=0)
    gravity: Array = ds.parameter(9.81, positive=True, ndim=0)

    def state_shape(self):
        return (2, 2)

    def lagrangian(self, q, qdot):
        m1, m2, l1, l2, g = self.mass1, self.mass2, self.length1, self.length2, self.gravity
        t1, t2 = q[0], q[1]
        w1, w2 = qdot[0], qdot[1]
        kinetic = (
            0.5 * (m1 + m2) * l1**2 * w1**2
            + 0.5 * m2 * l2**2 * w2**2
            + m2 * l1 * l2 * w1 * w2 * jnp.cos(t1 - t2)
        )
        potential = -(m1 + m2) * g * l1 * jnp.cos(t1) - m2 * g * l2 * jnp.cos(t2)
        return kinetic - potential


class Duffing(ds.AbstractSecondOrder):
    """Driven Duffing oscillator  x'' + δx' + αx + βx³ = γ cos(ωt).

    `alpha` α (linear stiffness, 1/s²), `beta` β (cubic stiffness), `delta` δ (damping, 1/s, ≥ 0),
    `gamma` γ (drive amplitude), `omega` ω (drive frequency, rad/s). Defaults are the classic
    chaotic double-well regime (α = −1, β = 1, δ = 0.3, γ = 0.5, ω = 1.2).

    State `[x, v]`. Undriven and undamped it conserves `½v² + ½αx² + ¼βx⁴`.
    """

    alpha: Array = ds.parameter(-1.0, ndim=0)
    beta: Array = ds.parameter(1.0, ndim=0)
    delta: Array = ds.parameter(0.3, nonnegative=True, ndim=0)
    gamma: Array = ds.parameter(0.5, ndim=0)
    omega: Array = ds.parameter(1.2, nonnegative=True, ndim=0)

    state_names = ("x", "v")

    def acceleration(self, t, q, v):
        restoring = self.alpha * q + self.beta * q**3
        return self.gamma * jnp.cos(self.omega * t) - self.delta * v - restoring

    def energy(self, y):
        x, v = y[0], y[1]
        return 0.5 * v**2 + 0.5 * self.alpha * x**2 + 0.25 * self.beta * x**4


class VanDerPol(ds.AbstractSecondOrder):
    """Van der Pol oscillator  x'' − μ(1 − x²)x' + x = 0.

    `mu` μ ≥ 0: nonlinearity and strength of the damping; stiff for μ ≫ 1 (use `ds.Kvaerno5`).
    State `[x, v]`. For μ > 0 every orbit but the origin approaches a single limit cycle.
    """

    mu: Array = ds.parameter(1.0, nonnegative=True, ndim=0)

    state_names = ("x", "v")

    def acceleration(self, t, q, v):
        return self.mu * (1 - q**2) * v - q


class BouncingBall(ds.AbstractSecondOrder):
    """A ball falling under gravity with linear air drag, bouncing on a floor at height 0.

    - `gravity` g (m/s², > 0), `drag` k (1/s, ≥ 0): x'' = −g − k x'.
    - `restitution` e (> 0, ≤ 1 for real balls): the rebound speed over the impact speed.
    - `rest_speed` (m/s, ≥ 0): a rebound slower than this ends at rest on the floor (x = 0,
      v = 0, where the ball then stays). With 0 (the default) a ball with e < 1 bounces
      infinitely often before it would come to rest at a finite time, so its simulations must
      end before that: past `max_events` impacts the solve reports
      `ds.RESULTS.event_limit_reached`.

    State `[x, v]` (m, m/s). The impacts are an event: pass `events=ball.impacts(max_events)`
    to `ds.simulate` (or `events=lambda m: m.impacts(...)` to `ds.fit`, so that e is fitted).
    Without drag, `bounce_times` gives the impacts in closed form.
    """

    gravity: Array = ds.parameter(9.81, positive=True, ndim=0)
    drag: Array = ds.parameter(0.0, nonnegative=True, ndim=0)
    restitution: Array = ds.parameter(0.8, positive=True, ndim=0)
    rest_speed: Array = ds.parameter(0.0, nonnegative=True, ndim=0)

    state_names = ("x", "v")

    def acceleration(self, t, q, v):
        resting = (q <= 0) & (v == 0)  # only the state a slow rebound leaves
        return jnp.where(resting, 0.0, -self.gravity - self.drag * v)

    def impacts(self, max_events: int = 32) -> ds.Event:
        """The floor: a falling crossing of x = 0, where v → −e v (or the ball comes to rest
        when e |v| < rest_speed)."""
        return ds.Event(
            _height,
            direction=-1,
            reset=_Rebound(self.restitution, self.rest_speed),
            max_events=max_events,
        )

    def bounce_times(self, height, count: int):
        """Closed-form impact times from rest at `height` without drag (or rest): t₁ = √(2h/g),
        then flights of 2 eᵏ v₁ / g. `count` (a Python int >= 1) impacts; `height` > 0."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"bounce_times: count must be an int >= 1, got {count!r}")
        if not isinstance(height, jax.core.Tracer) and not bool(jnp.all(jnp.asarray(height) > 0)):
            raise ValueError(f"bounce_times: height must be > 0 (above the floor), got {height}")
        first = jnp.sqrt(2 * height / self.gravity)
        speed = self.gravity * first
        powers = jnp.arange(1, count, dtype=first.dtype)
        flights = 2 * speed * self.restitution**powers / self.gravity
        return first + jnp.concatenate([jnp.zeros(1, first.dtype), jnp.cumsum(flights)])


def _height(t, y):
    return y[0]


class _Rebound(eqx.Module):
    """The floor's reset; a module, so its coefficients are traced (and fitted) like
    parameters."""

    restitution: Array
    rest_speed: Array

    def __call__(self, t, y):
        rebound = -self.restitution * y[1]
        rebound = jnp.where(jnp.abs(rebound) < self.rest_speed, 0.0, rebound)
        return jnp.stack([jnp.zeros_like(y[0]), rebound])
