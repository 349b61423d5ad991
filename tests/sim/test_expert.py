import numpy as np
import pytest

from dualloop.sim.env import run_expert_batch
from dualloop.sim.scenarios import NOMINAL_SCENARIOS
from dualloop.sim.schema import ACTION_INDEX, PLAN_INDEX, label_from_accel

SEEDS = list(range(24))


@pytest.mark.slow
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


def test_target_speeds_change_within_training_drives() -> None:
    """Training roll-outs: drives whose target follows the traffic (on the planner's ladder), drives
    whose target steps at random, drives at their cruise speed; the plan states the target."""
    from dualloop.sim.env import EXPERT_TARGET_STEPS as steps
    from dualloop.sim.scenarios import build_scenario

    instance = build_scenario("dense_traffic", SEEDS)
    schedule = steps.sample(SEEDS, instance.cruise_speed, instance.duration_s)
    follow = schedule.follow
    random = ~follow & np.isfinite(schedule.starts[:, 1])
    fixed = ~follow & ~random
    assert follow.any() and random.any() and fixed.any()
    metrics, data = run_expert_batch("dense_traffic", SEEDS, every=20)
    assert not [m.seed for m in metrics if m.collisions or m.off_road]
    target = data.plan[..., PLAN_INDEX["target_speed"]].astype(np.float64)
    cruise = np.broadcast_to(instance.cruise_speed[:, None], target.shape)
    assert (target >= steps.low_fraction * cruise - 1e-3).all() and (target <= cruise + 1e-3).all()
    np.testing.assert_allclose(target[fixed], cruise[fixed], atol=1e-4)
    # traffic at 12-16 m/s: a target that follows it is well below the cruise speed, on the ladder
    rungs = target[follow] / (steps.step_fraction * cruise[follow])
    np.testing.assert_allclose(rungs, np.round(rungs), atol=1e-3)
    assert np.median(target[follow]) <= 0.7 * 25.0
    # random steps hold for at least dwell_s[0] between changes
    for b in np.flatnonzero(random):
        changes = np.flatnonzero(np.abs(np.diff(target[b])) > 1e-3)
        assert changes.size >= 1 and (np.diff(data.t[changes]) >= steps.dwell_s[0] - 0.2).all()


@pytest.mark.slow
def test_closed_loop_scenarios_keep_one_target_and_ood_ones_never_step() -> None:
    from dualloop.sim.env import make_scenario
    from dualloop.sim.scenarios import OOD_SCENARIOS

    env = make_scenario("dense_traffic", 3)
    assert env.expert.schedule is None  # the simulator's own plans in closed loop: the cruise speed
    for name in OOD_SCENARIOS:
        _, data = run_expert_batch(name, [1, 2], every=200, relabel=True)
        assert data.alt_plan is None
        speeds = data.plan[..., PLAN_INDEX["target_speed"]][data.valid]
        assert len(np.unique(speeds[speeds > 0])) <= 2  # one cruise speed per drive


def test_relabelled_states_keep_the_steering_and_brake_for_a_lower_target() -> None:
    """The same recorded state under another target: the expert's steering does not change, its
    acceleration follows the target (lower target, never more acceleration)."""
    _, data = run_expert_batch("dense_traffic", [11, 12, 13], every=20, relabel=True)
    assert data.alt_plan is not None and data.alt_label is not None and data.alt_controls is not None
    np.testing.assert_array_equal(data.alt_controls[..., 1], data.controls[..., 1])
    np.testing.assert_array_equal(
        np.delete(data.alt_plan, PLAN_INDEX["target_speed"], axis=2),
        np.delete(data.plan, PLAN_INDEX["target_speed"], axis=2),
    )
    np.testing.assert_array_equal(data.alt_label, label_from_accel(data.alt_controls[..., 0]))
    t_old = data.plan[..., PLAN_INDEX["target_speed"]]
    t_new = data.alt_plan[..., PLAN_INDEX["target_speed"]]
    lower, higher = t_new < t_old - 1.0, t_new > t_old + 1.0
    assert lower.any() and higher.any()
    assert (data.alt_controls[..., 0][lower] <= data.controls[..., 0][lower] + 1e-6).all()
    assert (data.alt_controls[..., 0][higher] >= data.controls[..., 0][higher] - 1e-6).all()


@pytest.mark.slow
def test_no_lane_change_from_a_standstill() -> None:
    """Behind a stopped car the expert waits rather than steering at full lock at 0 m/s."""
    _, data = run_expert_batch("stopped_vehicle_ahead", SEEDS, every=20)
    behaviour = data.plan[..., PLAN_INDEX["plan_keep"] :].argmax(axis=2)
    changing = (behaviour == 1) | (behaviour == 2)
    still = data.features[..., 0] < 1.0
    assert not (changing & still & data.valid).any()
    assert np.abs(data.controls[..., 1][data.valid]).max() < 0.2
