"""Electrical circuits: differential-algebraic models (Kirchhoff's laws at nodes without
capacitance are algebraic equations)."""

import jax.numpy as jnp
from jaxtyping import Array

import diffsim as ds


class Rectifier(ds.AbstractODE):
    """A half-wave rectifier with a smoothing capacitor, a differential-algebraic system of
    index 1:

        0      = (V_s(t) − v_a)/R_s − i_D(v_a − v_b)     (node a: no capacitance, algebraic)
        C v_b' = i_D(v_a − v_b) − v_b/R_L                 (node b: capacitor and load)

    with the source V_s(t) = `amplitude`·sin(2π·`frequency`·t) (V, Hz) behind `source_resistance`
    R_s (Ω), a diode of `saturation_current` I_s (A) and `thermal_voltage` V_T (V), i_D(v) =
    I_s (exp(v/V_T) − 1), and `capacitance` C (F) in parallel with `load_resistance` R_L (Ω).
    State `[v_a, v_b]` (V); mass matrix diag(0, C). While the diode conducts the time scale is
    R_s·C (ms), between pulses R_L·C (0.1 s): stiff. Solve with `ds.Rodas5P` or
    `ds.Rosenbrock23`; start from a consistent state (`ds.consistent_initial_state`).

    The diode's exponential is continued linearly above 40 V_T (as circuit simulators limit it):
    a stage of a step may try a forward voltage far above the ~0.6 V the diode ever reaches,
    where exp would overflow; at the solution the continuation is never reached."""

    amplitude: Array = ds.parameter(5.0, positive=True, ndim=0)
    frequency: Array = ds.parameter(50.0, positive=True, ndim=0)
    source_resistance: Array = ds.parameter(10.0, positive=True, ndim=0)
    load_resistance: Array = ds.parameter(1000.0, positive=True, ndim=0)
    capacitance: Array = ds.parameter(1e-4, positive=True, ndim=0)
    saturation_current: Array = ds.parameter(1e-9, positive=True, ndim=0)
    thermal_voltage: Array = ds.parameter(0.02585, positive=True, ndim=0)

    state_names = ("v_a", "v_b")

    @property
    def mass_matrix(self):
        zero = jnp.zeros_like(self.capacitance)
        return jnp.stack([jnp.stack([zero, zero]), jnp.stack([zero, self.capacitance])])

    def source(self, t):
        """V_s(t) (V)."""
        return self.amplitude * jnp.sin(2 * jnp.pi * self.frequency * t)

    def diode_current(self, v):
        """i_D(v) (A), continued linearly above 40 V_T."""
        x = v / self.thermal_voltage
        limit = 40.0
        e_limit = jnp.exp(jnp.asarray(limit, x.dtype))
        exp_part = jnp.where(x < limit, jnp.exp(jnp.minimum(x, limit)), e_limit * (1 + x - limit))
        return self.saturation_current * (exp_part - 1)

    def vector_field(self, t, y, args=None):
        v_a, v_b = y[0], y[1]
        i_d = self.diode_current(v_a - v_b)
        node_a = (self.source(t) - v_a) / self.source_resistance - i_d
        return jnp.stack([node_a, i_d - v_b / self.load_resistance])
