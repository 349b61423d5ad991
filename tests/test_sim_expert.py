import numpy as np
import pytest

from sim.env import run_expert_batch
from sim.scenarios import NOMINAL_SCENARIOS
from sim.schema import ACTION_INDEX, PLAN_INDEX, label_from_accel

SEEDS = list(range(24))


@pytest.mark.parametrize("name", NOMINAL_SCENARIOS)
def test_expert_never_collides_on_nominal_scenarios(name: str) -> None:
    metrics, data = run_expert_batch(name, SEEDS, every=20)
    crashed = [m.seed for m in metrics if m.collisions or m.off_road]
    assert crashed == [], f"{name}: expert crashed on seeds {crashed}"
    assert all(m.duration_s > 0.99 * 15.0 for m in metrics)
    assert np.isfinite(data.features).all()
    np.testing.assert_array_equal(data.label, label_from_accel(data.controls[..., 0]))
    if name == "slow_merge":  # the ramp ends: every episode must have planned the merge
        assert (data.plan[..., PLAN_INDEX["plan_change_left"]] > 0).any(axis=1).all()


def test_expert_answers_a_hard_braking_lead() -> None:
    metrics, data = run_expert_batch("lead_brakes_hard", [0, 1, 2, 3, 4, 5], every=10)
    hard = (data.label == ACTION_INDEX["brake_hard"]).any(axis=1)
    swerved = (data.plan[..., PLAN_INDEX["plan_keep"]] == 0).any(axis=1)
    assert (hard | swerved).all()  # either it brakes hard or it plans around the lead
    assert hard.any() and sum(m.hard_brakes for m in metrics) >= 1


def test_no_lane_change_from_a_standstill() -> None:
    """Behind a stopped car the expert waits rather than steering at full lock at 0 m/s."""
    _, data = run_expert_batch("stopped_vehicle_ahead", SEEDS, every=20)
    behaviour = data.plan[..., PLAN_INDEX["plan_keep"]:].argmax(axis=2)
    changing = (behaviour == 1) | (behaviour == 2)
    still = data.features[..., 0] < 1.0
    assert not (changing & still & data.valid).any()
    assert np.abs(data.controls[..., 1][data.valid]).max() < 0.2
