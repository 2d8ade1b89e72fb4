"""The chaos gallery (experiments/lorenz_butterfly.py, lorenz_lyapunov.py, double_pendulum.py):
quick runs, their files and the science they show."""

import json

import numpy as np
import pytest
from helpers import check_outputs, load_experiment

LORENZ_PUBLISHED = 0.9056  # largest exponent at σ = 10, β = 8/3, ρ = 28 (Sprott 2003)


def _files_exist(out, record):
    check_outputs(record, out, ("png", "pdf", "nc", "json"))
    summary = next(name for name in record["files"] if name.endswith(".json"))
    assert json.loads((out / summary).read_text())["config"] == record["config"]


def test_lorenz_lyapunov_quick(tmp_path):
    record = load_experiment("lorenz_lyapunov").run(tmp_path, quick=True)
    _files_exist(tmp_path, record)
    duration = record["config"]["duration"]  # 100 time units in the quick run
    # 16 initial conditions at ρ = 28 over T = 100: each scatters by σ∞/√T ≈ 0.02 (measured
    # 0.023), their mean by ≈ 0.006; 0.03 is 5 of those, RK4's bias at dt = 0.01 (< 0.003)
    # included
    assert record["lambda_rho28_mean"] == pytest.approx(LORENZ_PUBLISHED, abs=0.03)
    assert record["lambda_rho28_std"] < 0.05  # the 1/√T spread above, with room
    # Stable fixed points: λ is the largest real part of the linearization's eigenvalues, up to
    # ln κ / T (κ = 1.61, the condition number of the eigenvectors at C± for ρ = 10; the origin
    # at ρ = 0 has orthogonal eigenvectors, κ = 1)
    at, fixed = record["lambda_at"], record["fixed_point_at"]
    assert fixed["10"] == pytest.approx(-0.5955, abs=1e-4)  # the closed form itself
    assert at["10"] < 0
    assert at["10"] == pytest.approx(fixed["10"], abs=np.log(1.61) / duration)
    assert at["0"] == pytest.approx(-1.0, abs=1e-6)  # ρ = 0: eigenvalues −1, −10, −β
    # chaos above ρ_H, and a stable periodic orbit in the window 99.52 < ρ < 100.80: λ = 0 up
    # to O(1/T) (the quick run measures 0.003)
    assert at["50"] > 0.8 and at["200"] > 0.8
    assert abs(at["100"]) < 0.05


def test_lorenz_butterfly_quick(tmp_path):
    record = load_experiment("lorenz_butterfly").run(tmp_path, quick=True)
    _files_exist(tmp_path, record)
    # The mean log sensitivity |dy/dρ| of 16 starts over 2 ≤ t ≤ 30 grows at the Lyapunov
    # rate: over 12 seeds 0.899 ± 0.009 (the first ~15 time units run ~3% slow, see the
    # docstring); 0.04 is 4 of those spreads plus that bias.
    assert record["sensitivity_growth_rate"] == pytest.approx(LORENZ_PUBLISHED, abs=0.04)
    # The separation itself over its linear regime, 2 ≤ t ≲ 17 only: 0.876 ± 0.020 over 12
    # seeds, so ±0.1 around 0.9056 covers the bias and 3.5 spreads.
    assert record["separation_growth_rate"] == pytest.approx(LORENZ_PUBLISHED, abs=0.1)
    start, end = record["fit_window"]
    assert end - start > 10  # 10⁻⁹ grows to 0.1 in ~18 time units: a real exponential regime
    # x of the two runs from (1, 1, 20) part when 1e-9 e^{0.9 t} reaches ~1: t ≈ 20-25
    assert 15 < record["divergence_time_x"] < 30
    # saturation: two points of the attractor far apart in time are on average
    # `attractor_size` apart; 16 members over a few time units fluctuate by ~15% (12 seeds:
    # 13–18 against 17)
    assert 0.6 < record["saturated_separation"] / record["attractor_size"] < 1.4
    assert 12 < record["attractor_size"] < 25


def test_double_pendulum_quick(tmp_path):
    record = load_experiment("double_pendulum").run(tmp_path, quick=True)
    _files_exist(tmp_path, record)
    # RK4 at dt = 2 ms over 10 s: the measured relative energy error is 1.5e-7 (it grows like
    # dt⁴, 1e-8 at 1 ms); 1e-6 leaves room and would catch a wrong equation of motion or solver
    assert record["max_energy_error"] < 1e-6
    rates = np.array(record["growth_rates"])
    deltas = np.array(record["config"]["deltas"][1:])
    final = np.array(record["final_angle_separation"])
    # the separations grow exponentially: the smallest ones by > 10⁴ in 10 s (e^{1.2·10}/10 for
    # a rate ≈ 1.2 /s that varies along the path); every fitted rate positive
    small = deltas <= 1e-7
    assert np.all(final[small] / deltas[small] > 1e4)
    assert np.all(rates[np.isfinite(rates)] > 0.3)
    # one rate for the members in their linear regime: a finite-time exponent of this path,
    # 1.2 /s measured; positive and O(1) /s (the pendulum's time scale √(l/g) = 0.32 s)
    assert 0.5 < record["pooled_growth_rate"] < 3.0
    # the finite-time exponent ln(‖Δy(t)‖/δ)/t of the smallest perturbation measures the same
    # growth along the same path as an end-point ratio instead of a slope (it includes the
    # first second's turning into the growing direction): measured 1.21 against 1.20
    assert record["finite_time_exponent"] == pytest.approx(record["pooled_growth_rate"], rel=0.3)
    # larger perturbations diverge first
    times = [t for t in record["divergence_times"] if t is not None]
    assert len(times) >= 2 and times == sorted(times, reverse=True)
