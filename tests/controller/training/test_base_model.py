"""The shipped base model: a complete card, and collision-free closed-loop driving on held-out seeds."""

from __future__ import annotations

import numpy as np
import pytest

from dualloop import ood
from dualloop.controller.demo.closed_loop import drive_in_process
from dualloop.controller.training.rollouts import run_model_batch
from dualloop.executor.core import Executor
from dualloop.executor.model_runner import DecisionModel
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES
from dualloop.sim import schema
from dualloop.sim.scenarios import NOMINAL_SCENARIOS

STEP_SEEDS = (950_001, 950_002, 950_003, 950_004)

HELD_OUT = (950_001, 950_002)  # no training, validation, test, gate or demo seed is near these
BATCH_HELD_OUT = list(range(960_000, 960_006))


@pytest.fixture(scope="module")
def base() -> DecisionModel:
    return DecisionModel(BASE_MODEL_PATH)


def test_card_is_complete(base):
    card = base.card
    assert card.size_class == "base" and card.version and card.temperature != 1.0
    assert card.feature_names == list(schema.FEATURE_NAMES) and card.actions == list(schema.ACTIONS)
    m = card.training_metrics
    for key in (
        "test_accuracy",
        "test_ece_before",
        "test_ece_after",
        "forward_b1_p50_us",
        "forward_b1_p99_us",
        *(f"test_recall_{a}" for a in schema.ACTIONS),
    ):
        assert key in m, key
    assert m["test_accuracy"] > m["test_majority_baseline"] + 0.15
    # temperature scaling minimises the validation NLL: it must not raise the test NLL or ECE beyond
    # their estimates' resolution on the test split (a temperature of 1.002 moved the ECE by 5e-5; one of
    # 0.949, fitted on validation rows from other drives, moved the test NLL by +1.5e-4 of 0.522)
    assert m["test_nll_after"] <= m["test_nll_before"] + 1e-3
    assert m["test_ece_after"] <= m["test_ece_before"] + 1e-3


def test_takes_masks_and_was_trained_on_recorded_drives(base):
    """The shipped model meets sensor profiles (mask input), proposes a driver's action
    without a plan, and its card says which recorded drives it learnt from."""
    card = base.card
    assert card.mask_input and card.plan_default == schema.no_plan().tolist()
    m = card.training_metrics
    assert m["log_share"] > 0 and m["logs_rows_sha256"] and int(str(m["logs_files"])) > 0
    for dataset in ("ngsim-i-80", "openacc-astazero", "openacc-zalazone"):
        assert dataset in str(m["logs_labelled_rows"]) and f"val_logs_{dataset}_agreement" in m


def test_int8_variant_loads_with_its_card(base):
    int8 = DecisionModel(BASE_MODEL_PATH.with_suffix(".int8.onnx"))
    assert int8.card.feature_names == base.card.feature_names and int8.card.version != base.card.version


@pytest.mark.slow
@pytest.mark.parametrize("scenario", NOMINAL_SCENARIOS)
def test_drives_nominal_scenarios_without_collision(base, scenario):
    gates = [ood.load_gate(g) for g in DEFAULT_GATES]
    for seed in HELD_OUT:
        run = drive_in_process(Executor(base, None, gates), scenario, seed)
        m = run.metrics
        assert m.collisions == 0 and not m.off_road, f"{scenario} seed {seed}: {m.collisions} collisions"
        assert np.isfinite(run.applied_accel).all() and len(run.t) > 100


@pytest.mark.slow
@pytest.mark.parametrize("scenario", NOMINAL_SCENARIOS)
def test_drives_a_batch_of_held_out_seeds_without_collision(base, scenario):
    """Six more held-out seeds per scenario, the model and its gates driving (batched roll-outs): the
    first model of the DAgger training left the road in 11 of 144 such drives without gates, 2 of
    them behind a hard-braking lead."""
    gates = [ood.load_gate(g) for g in DEFAULT_GATES]
    metrics, data = run_model_batch(base, scenario, BATCH_HELD_OUT, gates=gates)
    failed = [(m.seed, m.collisions, m.off_road) for m in metrics if m.collisions or m.off_road]
    assert not failed, f"{scenario}: (seed, collisions, off road) {failed}"
    assert data.valid.all()


class SpeedStep:
    """A plan source that keeps the lane and steps its target speed once, at `at_s`."""

    name = "speed-step"

    def __init__(self, before: float, after: float, at_s: float) -> None:
        self.before, self.after, self.at_ns = before, after, int(at_s * 1e9)

    def plan(self, request):
        from dualloop.planner.plan import Plan, make_plan_id

        speed = self.before if request.now_ns < self.at_ns else self.after
        return Plan(
            make_plan_id(self.name, request.session_id, request.now_ns),
            request.session_id,
            request.now_ns,
            10**9,
            self.name,
            "keep",
            speed,
            0.0,
        )


def drive_speed_step(
    model: DecisionModel, seed: int, before: float = 25.0, after: float = 12.0, at_s: float = 3.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, object]:
    """dense_traffic with keep plans whose target steps from `before` to `after`: per 5 ms step the
    ego's lane offset (true), lane index and speed, and the run."""
    from dualloop.controller.contract.lockstep_planning import LockstepPlanning
    from dualloop.controller.demo.closed_loop import InProcessDecider, run_closed_loop
    from dualloop.sim.env import make_scenario
    from dualloop.sim.world import EGO

    env = make_scenario("dense_traffic", seed)
    offset, lane, speed = [], [], []
    step = env.step

    def recording_step(accel, steer):
        step(accel, steer)
        offset.append(float(env.true_features()[schema.FEATURE_INDEX["lane_offset"]]))
        lane.append(int(env.world.ego_lane()[0]))
        speed.append(float(env.world.v[0, EGO]))

    env.step = recording_step
    planning = LockstepPlanning(SpeedStep(before, after, at_s), 200_000_000)
    run = run_closed_loop(env, InProcessDecider(Executor(model), f"step-{seed}", planning), seed)
    return np.array(offset), np.array(lane), np.array(speed), run


@pytest.mark.slow
def test_follows_a_lower_target_speed_without_leaving_its_lane(base):
    """The planner's target speed follows the traffic, so it steps within a drive. In dense
    traffic a keep plan stepping from 25 to 12 m/s: the model slows to the new target and stays on
    its lane's centre. The model trained on one target per drive sat 0.6-1.5 m off its lane centre
    on these seeds (one run ended in the next lane); the model before DAgger kept within 0.41 m, the
    DAgger model (which no longer leaves the road behind a hard-braking lead) within 0.58 m."""
    for seed in STEP_SEEDS:
        offset, lane, speed, run = drive_speed_step(base, seed)
        assert run.metrics.collisions == 0 and not run.metrics.off_road
        assert {p[3] for p in run.plans} == {25.0, 12.0}
        assert (lane == lane[0]).all(), f"seed {seed}: changed lanes"
        assert np.abs(offset).max() < 0.6, f"seed {seed}: {np.abs(offset).max():.2f} m off the lane centre"
        last_5s = speed[-1000:]
        assert 12.0 - 2.0 <= last_5s.mean() <= 12.0 + 0.5, f"seed {seed}: {last_5s.mean():.1f} m/s"
