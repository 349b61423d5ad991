"""`dualloop demo-safety`'s reading of what reached the actuators, on synthetic command traces whose
answers are known (the onset bound, the transition steps, name/band contradictions, drive-offs,
unavoidable collisions), and the whole command on one untuned seed with the shipped model."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from dualloop.controller.cli import main
from dualloop.controller.demo.closed_loop import ClosedLoopRun
from dualloop.controller.demo.transitions import (
    Truth,
    cell,
    summarise,
    transition_figures,
    unavoidable_by_braking,
)
from dualloop.executor.action_labels import action_of_accel
from dualloop.v2 import controller_pb2 as pb

N, J = 600, 2.5
STEP = J * 0.005


def _run(accel: np.ndarray, states: np.ndarray, reasons: np.ndarray | None = None) -> ClosedLoopRun:
    return ClosedLoopRun(
        scenario="synthetic",
        seed=0,
        metrics=SimpleNamespace(collisions=0),  # type: ignore[arg-type]
        t=np.arange(len(accel)) * 0.005,
        applied_index=action_of_accel(accel),
        applied_accel=accel,
        applied_steer=np.zeros(len(accel)),
        safety_state=states,
        reasons=np.zeros(len(accel), np.int64) if reasons is None else reasons,
        gate_score=np.zeros(len(accel)),
        lateness_us=np.zeros(len(accel)),
        tick_work_us=np.zeros(len(accel)),
        round_trip_us=np.zeros(len(accel)),
    )


def _ramp(start: float, target: float, n: int) -> np.ndarray:
    out, a = np.empty(n), start
    for k in range(n):
        a = max(target, a - STEP)
        out[k] = a
    return out


def test_a_jerk_limited_stop_meets_every_bound() -> None:
    states = np.full(N, pb.SAFETY_STATE_NOMINAL)
    states[100:] = pb.SAFETY_STATE_FALLBACK_ACTIVE
    accel = np.r_[np.full(100, 0.3), _ramp(0.3, -3.0, N - 100)]
    fig = transition_figures(_run(accel, states), J)
    assert fig.onsets == 1 and fig.onset_bound_violations == 0
    assert fig.largest_step <= STEP + 1e-12 and fig.name_band_contradictions == 0


def test_a_step_into_braking_breaks_the_bounds() -> None:
    states = np.full(N, pb.SAFETY_STATE_NOMINAL)
    states[100:] = pb.SAFETY_STATE_VETO_HOLD
    accel = np.r_[np.full(100, 0.3), np.full(N - 100, -6.0)]  # the old pass-through of a vetoed brake_hard
    run = _run(accel, states)
    run.applied_index[100:] = 2  # and named "keep"
    fig = transition_figures(run, J)
    assert fig.onset_bound_violations == 200  # every tick of the first second
    assert fig.largest_step == 6.3 and fig.name_band_contradictions == N - 100
    # the same step as trusted-threat braking is allowed (it says so)
    threat = np.zeros(N, np.int64)
    threat[100:] = 1 << pb.REASON_CODE_THREAT_BRAKING
    allowed = transition_figures(_run(accel, states, threat), J)
    assert allowed.onset_bound_violations == 0 and allowed.largest_step == 0.0


def test_a_run_that_never_left_nominal_has_no_onset_figure_a_dash_that_hides_no_other_seed() -> None:
    """The table printed `nan` (docs/demo.md: `-`, the JSON's null); and as the summary's min() kept
    nan when such a seed came first, a scenario's other seeds' figures were lost too."""
    nominal = np.full(N, pb.SAFETY_STATE_NOMINAL)
    calm = transition_figures(_run(np.full(N, 0.3), nominal), J)
    states = nominal.copy()
    states[100:] = pb.SAFETY_STATE_FALLBACK_ACTIVE
    stop = transition_figures(_run(np.r_[np.full(100, 0.3), _ramp(0.3, -3.0, N - 100)], states), J)
    assert calm.onsets == 0 and stop.onsets == 1
    assert cell(calm.min_applied_first_second) == "-"
    row = summarise([calm, stop], STEP, 0.001)[0]
    assert row["min_applied_first_second"] == stop.min_applied_first_second < 0.0
    assert summarise([calm], STEP, 0.001)[0]["min_applied_first_second"] is None
    assert cell(None) == "-" and cell(-1.5) == "-1.5" and cell(0) == "0"


def test_leaving_a_standstill_hold_is_a_drive_off() -> None:
    states = np.full(N, pb.SAFETY_STATE_FALLBACK_ACTIVE)
    accel = np.full(N, -3.0)
    held = np.zeros(N, np.int64)
    held[200:400] = 1 << pb.REASON_CODE_STANDSTILL_HOLD
    assert transition_figures(_run(accel, states, held), J).drive_offs == 200
    held[200:] = 1 << pb.REASON_CODE_STANDSTILL_HOLD
    fig = transition_figures(_run(accel, states, held), J)
    assert fig.drive_offs == 0 and fig.standstill_ticks == N - 200


def test_the_steering_step_is_read_around_transitions_at_speed() -> None:
    """A one-tick return of the steering at the end of a recovery counts at 10 m/s and faster; below,
    the recovery may turn faster (its lateral-jerk bound), and inside NOMINAL the model's own steps
    never count."""
    states = np.full(N, pb.SAFETY_STATE_NOMINAL)
    states[100:300] = pb.SAFETY_STATE_RECOVERING
    run = _run(np.zeros(N), states)
    run.applied_steer[300:] = 0.03  # the model's command, met in one step
    run.applied_steer[400:] = 0.09  # the model's own step, inside NOMINAL
    assert transition_figures(run, J).largest_steer_step == 0.03
    assert transition_figures(run, J, truth=_cruise(N, 20.0)).largest_steer_step == 0.03
    assert transition_figures(run, J, truth=_cruise(N, 5.0)).largest_steer_step == 0.0


def _cruise(n: int, speed: float) -> Truth:
    return Truth(np.full(n, speed), np.zeros(n, bool), np.full(n, 150.0), np.zeros(n))


def _cut_in(gap: float, closing: float) -> Truth:
    """At 30 m/s, a car cuts in `gap` m ahead `closing` m/s slower at tick 100; the ego brakes at
    8 m/s^2 from then on, and the run ends at contact or when the closing stops."""
    speeds, present, gaps, rels = [], [], [], []
    v, g, lead_v = 30.0, 150.0, 30.0 - closing
    for k in range(400):
        if k == 100:
            g = gap
        if k >= 100:
            v = max(v - 8.0 * 0.005, 0.0)
            g -= (v - lead_v) * 0.005
        speeds.append(v)
        present.append(k >= 100)
        gaps.append(g)
        rels.append(lead_v - v if k >= 100 else 0.0)
        if g <= 0.05 or (k > 100 and v <= lead_v):
            break
    return Truth(np.array(speeds), np.array(present), np.array(gaps), np.array(rels))


def test_a_collision_is_unavoidable_only_when_braking_at_the_tyre_limit_could_not_stop_the_closing() -> None:
    """The speed_out_of_range cut-in (12 m ahead, 20 m/s closing: 16.7 m/s^2 needed) ends in contact
    even braking at the tyre limit from its first tick: unavoidable. 30 m ahead (6.7 m/s^2) braking
    stops the closing first, so a collision there is the controller's."""
    close = _cut_in(12.0, 20.0)
    assert close.lead_gap[-1] < 0.1 and unavoidable_by_braking(close)
    far = _cut_in(30.0, 20.0)
    assert far.lead_gap.min() > 1.0 and not unavoidable_by_braking(far)
    # a run that ends apart from its lead did not end in that contact
    apart = Truth(close.speed, close.lead_present, close.lead_gap + 5.0, close.lead_rel_speed)
    assert not unavoidable_by_braking(apart)
    # judged per run in the figures: counted, and reported apart
    states = np.full(len(close.speed), pb.SAFETY_STATE_FALLBACK_ACTIVE)
    run = _run(np.full(len(close.speed), -3.0), states)
    run.metrics = SimpleNamespace(collisions=1)  # type: ignore[assignment]
    fig = transition_figures(run, J, truth=close)
    assert fig.collisions == 1 and fig.unavoidable_collisions == 1
    assert transition_figures(run, J, truth=_cruise(len(close.speed), 30.0)).unavoidable_collisions == 0


@pytest.mark.slow
def test_demo_safety_check_passes_on_the_shipped_model(tmp_path: Path) -> None:
    """The whole command on the first untuned seed: the shipped model and gates in the executor, every
    OOD and forced-veto scenario driven in closed loop, what reached the actuators read and judged."""
    out = tmp_path / "safety.json"
    assert main(["demo-safety", "--seeds", "1", "--check", "--json", str(out)]) == 0
    written = json.loads(out.read_text())
    assert len(written["runs"]) == 8
    for row in written["summary"]:
        assert row["largest_step"] <= row["step_limit"] + 1e-9
        assert row["largest_steer_step"] <= row["steer_step_limit"] + 1e-6
        assert row["onset_bound_violations"] == 0 and row["drive_offs"] == 0
        assert row["collisions"] == row["unavoidable"]
