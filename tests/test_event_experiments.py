"""The events and stochastic experiments (quick runs)."""

from pathlib import Path

from helpers import check_outputs, load_experiment

ROOT = Path(__file__).parent.parent


def test_bouncing_ball_experiment(tmp_path):
    record = load_experiment("bouncing_ball").run(tmp_path, quick=True)
    check_outputs(record, tmp_path)
    assert record["converged"]
    assert all(record["within_3_se"].values())
    # (test_events.py checks the derivatives of impact times through resets against the
    # closed form; the full run adds central differences on this drag model)
    # 3 mm noise: the estimated noise level must come out near it (91 residuals)
    assert 0.0022 < record["noise_sd_estimated"] < 0.0038


def test_kramers_experiment(tmp_path):
    record = load_experiment("kramers").run(tmp_path, quick=True)
    check_outputs(record, tmp_path)
    for row in record["rows"]:
        assert row["crossings"] > 0.9 * row["members"]  # horizon 4/k: ~2% censored
        if row["solver"] == "BAOAB":
            # Kramers' formula is asymptotic in ΔU/kT; at 3 the measured rate of reaching the
            # far well is 86% of it (1000 paths; the full run shows the approach: 0.91 at 4,
            # 0.98 at 6); 200 paths give ±7%, so 0.65–1.05 is a 3-SE band
            assert 0.65 < row["ratio_to_kramers"] < 1.05
