"""DecisionSnapshot.checks over gRPC: a real server with the shipped model and gates, LOCKSTEP sessions."""

from __future__ import annotations

import math
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from google.protobuf.message import Message

from dualloop.controller.contract.client import DriveSession
from dualloop.controller.contract.wire import add_checks, without_wall_clock
from dualloop.controller.logs.logfile import read_log
from dualloop.controller.logs.synthetic import synthetic_log
from dualloop.controller.replay.lockstep import _observations
from dualloop.executor.checks import NAMES
from dualloop.executor.snapshot import CHECK_DTYPE, Check, Observation
from dualloop.v2 import controller_pb2 as pb

EVERY_CHECK = [
    pb.CHECK_DECISION_VECTOR_DENSITY,
    pb.CHECK_INPUT_DENSITY,
    pb.CHECK_INPUT_RANGE,
    pb.CHECK_INPUT_CHANGE,
    pb.CHECK_PLAN_RANGE,
    pb.CHECK_FREEZE,
    pb.CHECK_ACTUATION,
    pb.CHECK_MARGIN,
    pb.CHECK_SIGNAL_STUCK,
    pb.CHECK_SPEED_ACCEL,
    pb.CHECK_GAP_RATE,
    pb.CHECK_LEAD_FLICKER,
    pb.CHECK_SPEED_REPEAT,
    pb.CHECK_GAP_REPEAT,
    pb.CHECK_GAP_STEP,
    pb.CHECK_REL_ACCEL,
    pb.CHECK_REL_UNIT,
    pb.CHECK_REL_SIGN,
]
# inputs with no veto: 100 Hz synthetic driving after its first 0.6 s (which the input gate flags)
START, COUNT = 60, 200


@pytest.fixture(scope="module")
def driving(tmp_path_factory) -> list[Observation]:
    log = synthetic_log(Path(tmp_path_factory.mktemp("checks")) / "syn.mcap", seconds=3.0, rate_hz=100.0)
    return _observations(read_log(log))[START : START + COUNT]


def drive(channel: grpc.Channel, observations: list[Observation], name: str) -> list[pb.DecisionSnapshot]:
    """Every snapshot of a LOCKSTEP session fed with these observations (seq renumbered from 1); the
    session declares its actual controls to be commands, so the actuation check judges them."""
    session = DriveSession(channel, name, pb.CLOCK_MODE_LOCKSTEP, actual_controls_are_commands=True)
    for k, o in enumerate(observations):
        controls = () if o.actual_controls is None else o.actual_controls.tolist()
        session.send(
            k + 1,
            o.timestamp_ns,
            o.features.tolist(),
            actual_index=None if o.actual_controls is None else o.actual_index,
            actual_controls=controls,
            plan_id=o.plan_id,
            plan=None if o.plan_values is None else o.plan_values.tolist(),
        )
    session.close()
    return list(session.snapshots())


def without_commands(observations: list[Observation]) -> list[Observation]:
    return [
        Observation(o.seq, o.timestamp_ns, o.features.copy(), plan_id=o.plan_id, plan_values=o.plan_values)
        for o in observations
    ]


def check(snap: pb.DecisionSnapshot, kind: int) -> pb.CheckResult:
    (found,) = [c for c in snap.checks if c.check == kind]
    return found


def floats(msg: Message, skip: tuple[str, ...] = ()) -> list[float]:
    """Every float and double in a message, recursively, but for the fields named in `skip`."""
    out: list[float] = []
    for fd, value in msg.ListFields():
        if fd.name in skip:
            continue
        repeated = fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == fd.LABEL_REPEATED
        values = value if repeated else [value]
        for v in values:
            if fd.type == fd.TYPE_MESSAGE:
                out += floats(v)
            elif fd.type in (fd.TYPE_FLOAT, fd.TYPE_DOUBLE):
                out.append(v)
    return out


def test_ordinary_input_every_check_present_finite_and_quiet(shipped_channel, driving):
    snaps = drive(shipped_channel, without_commands(driving), "ordinary")
    assert len(snaps) > COUNT
    for s in snaps:
        assert [c.check for c in s.checks] == EVERY_CHECK
        assert [c.name for c in s.checks][:2] == ["decision_vector_density", "input_density"]
        assert all(math.isfinite(c.score) and math.isfinite(c.threshold) for c in s.checks)
        assert not any(c.veto for c in s.checks) and list(s.vetoed_by) == [] and not s.gate.veto
        assert check(s, pb.CHECK_ACTUATION).status == pb.CHECK_STATUS_NOT_APPLICABLE  # no command sent
        assert check(s, pb.CHECK_MARGIN).threshold == pytest.approx(0.05)
    later = snaps[10:]
    per_signal = (
        pb.CHECK_SIGNAL_STUCK,
        pb.CHECK_SPEED_ACCEL,
        pb.CHECK_GAP_RATE,
        pb.CHECK_LEAD_FLICKER,
        pb.CHECK_SPEED_REPEAT,
        pb.CHECK_GAP_REPEAT,
        pb.CHECK_GAP_STEP,
        pb.CHECK_REL_ACCEL,
    )
    judged = [k for k in EVERY_CHECK if k not in (pb.CHECK_FREEZE, pb.CHECK_ACTUATION, *per_signal)]
    for kind in judged:
        assert all(check(s, kind).status == pb.CHECK_STATUS_SCORED for s in later), kind
    # the speed check once it has seen a window (0.5 s) of observations; the gap check while a lead is seen
    for kind in (
        pb.CHECK_SIGNAL_STUCK,
        pb.CHECK_SPEED_ACCEL,
        pb.CHECK_LEAD_FLICKER,
        pb.CHECK_SPEED_REPEAT,
        pb.CHECK_REL_ACCEL,
    ):
        assert check(snaps[-1], kind).status == pb.CHECK_STATUS_SCORED, kind
    assert all(check(s, pb.CHECK_GAP_RATE).status != pb.CHECK_STATUS_NOT_SCORED for s in snaps)
    # the first tick has no previous observation: no change to judge
    assert check(snaps[0], pb.CHECK_INPUT_CHANGE).status == pb.CHECK_STATUS_NOT_APPLICABLE
    dens = [check(s, pb.CHECK_INPUT_DENSITY) for s in later]
    assert all(0.0 < c.score < c.threshold for c in dens) and len({c.score for c in dens}) > 50
    assert all(-0.5 <= check(s, pb.CHECK_INPUT_RANGE).score <= 0.0 for s in later)


def test_lockstep_checks_are_byte_identical_run_to_run(shipped_channel, driving):
    obs = without_commands(driving[:80])
    obs[50].features[0] = 200.0  # a range veto in the run, so vetoed_by is not empty
    a, b = drive(shipped_channel, obs, "twice-a"), drive(shipped_channel, obs, "twice-b")
    assert len(a) == len(b) > 80 and any(s.vetoed_by for s in a)
    for x, y in zip(a, b):
        y.session_id = x.session_id
        assert without_wall_clock(x) == without_wall_clock(y)


def test_out_of_range_feature_vetoes_by_the_range_check(shipped_channel, driving):
    obs = without_commands(driving[:60])
    bad = 40
    obs[bad].features[0] = 200.0  # ego_speed, m/s: far above the fitted 45
    snaps = drive(shipped_channel, obs, "range")
    (hit,) = [s for s in snaps if s.observation_seq == bad + 1 and not s.observation_held]
    rng = check(hit, pb.CHECK_INPUT_RANGE)
    assert rng.veto and rng.status == pb.CHECK_STATUS_SCORED and rng.threshold == 0.0
    low = -0.19609188  # the shipped input gate's ego_speed limits: [-0.196, 45] m/s
    assert rng.score == pytest.approx((200.0 - 45.0) / (45.0 - low), rel=1e-6)
    assert pb.CHECK_INPUT_RANGE in hit.vetoed_by and hit.gate.veto and pb.REASON_CODE_OOD_VETO in hit.reasons
    # the other checks still speak, each for itself
    assert [c.check for c in hit.checks] == EVERY_CHECK
    for kind in (pb.CHECK_DECISION_VECTOR_DENSITY, pb.CHECK_INPUT_DENSITY, pb.CHECK_PLAN_RANGE, pb.CHECK_MARGIN):
        assert check(hit, kind).status == pb.CHECK_STATUS_SCORED
    assert not check(hit, pb.CHECK_PLAN_RANGE).veto
    assert check(hit, pb.CHECK_INPUT_CHANGE).veto  # 200 m/s reached in 10 ms
    before = [s for s in snaps if s.observation_seq <= bad]
    assert before and not any(s.vetoed_by for s in before)


def test_nan_in_a_measured_feature_no_inf_or_nan_anywhere(shipped_channel, driving):
    obs = without_commands(driving[:60])
    bad = 30
    obs[bad].features[3] = float("nan")  # lead_distance
    snaps = drive(shipped_channel, obs, "nan")
    for s in snaps:
        # all but the superseded `gate`, kept exactly as it was for old clients (+Inf below)
        assert all(math.isfinite(v) for v in floats(s, skip=("gate",))), s.tick
    (hit,) = [s for s in snaps if s.observation_seq == bad + 1 and not s.observation_held]
    assert pb.REASON_CODE_INVALID_INPUT in hit.reasons and hit.gate.veto
    status = {c.check: c.status for c in hit.checks}
    for kind in (
        pb.CHECK_DECISION_VECTOR_DENSITY,
        pb.CHECK_INPUT_DENSITY,
        pb.CHECK_INPUT_RANGE,
        pb.CHECK_INPUT_CHANGE,
        pb.CHECK_PLAN_RANGE,
        pb.CHECK_MARGIN,
    ):
        assert status[kind] == pb.CHECK_STATUS_NOT_SCORED, kind
        assert check(hit, kind).score == 0.0
    # a gate that cannot score its features vetoes; the range checks do not claim to have seen it
    assert set(hit.vetoed_by) == {pb.CHECK_DECISION_VECTOR_DENSITY, pb.CHECK_INPUT_DENSITY}
    # the old field was +Inf here; kept as it was for old clients (float32 on the wire)
    assert hit.gate.score == float("inf")


def test_frozen_sensor_is_the_freeze_checks_veto(shipped_channel, driving):
    obs = without_commands(driving[:60])
    stuck = obs[20].features
    assert stuck[0] > 1.0  # moving: not a car at rest
    for o in obs[21:30]:
        o.features = stuck.copy()
    snaps = drive(shipped_channel, obs, "freeze")
    fresh = {s.observation_seq: s for s in snaps if not s.observation_held}
    counts = [check(fresh[seq], pb.CHECK_FREEZE).score for seq in range(21, 31)]
    assert counts == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    threshold = check(fresh[21], pb.CHECK_FREEZE).threshold
    assert threshold == 2.0
    for seq in range(21, 31):
        frozen = check(fresh[seq], pb.CHECK_FREEZE)
        assert frozen.veto == (frozen.score >= threshold)
        assert (pb.CHECK_FREEZE in fresh[seq].vetoed_by) == frozen.veto
    assert fresh[23].gate.veto and pb.REASON_CODE_OOD_VETO in fresh[23].reasons
    assert not check(fresh[35], pb.CHECK_FREEZE).veto and check(fresh[35], pb.CHECK_FREEZE).score == 0.0


def test_actuation_check_with_a_command_the_car_falls_short_of(shipped_channel, driving):
    obs = without_commands(driving[:150])
    for k, o in enumerate(obs):
        accel = float(o.features[1])
        short = 2.0 if 50 <= k < 120 else 0.0  # commanding 2 m/s^2 more braking than the car achieves
        o.actual_index = 0
        o.actual_controls = np.array([accel - short, 0.0], np.float32)
    snaps = drive(shipped_channel, obs, "actuation")
    act = [check(s, pb.CHECK_ACTUATION) for s in snaps]
    # judged once its lag model has warmed up (no verdict before: NOT_APPLICABLE), then every tick
    status = [c.status for c in act]
    assert status[0] == pb.CHECK_STATUS_NOT_APPLICABLE
    first = status.index(pb.CHECK_STATUS_SCORED)
    assert first < 100 and set(status[first:]) == {pb.CHECK_STATUS_SCORED}
    assert all(math.isfinite(c.score) and c.threshold > 0 for c in act)
    quiet = [c for s, c in zip(snaps, act) if s.observation_seq <= 50]
    assert quiet and not any(c.veto for c in quiet)
    vetoed = [s for s, c in zip(snaps, act) if c.veto]
    assert vetoed and all(51 <= s.observation_seq for s in vetoed)
    assert all(pb.CHECK_ACTUATION in s.vetoed_by and s.gate.veto for s in vetoed)
    assert max(c.score for c in act) > act[0].threshold


def test_packed_check_encoding_equals_the_messages_built_field_by_field():
    kinds = tuple(Check)
    row = np.zeros(len(kinds), CHECK_DTYPE)
    row["score"] = np.linspace(-0.5, 1e30, len(kinds))
    row["threshold"] = np.arange(len(kinds)) * 0.25
    row["veto"] = [k in (Check.INPUT_RANGE, Check.MARGIN) for k in kinds]
    row["status"] = ([1, 2, 3] * len(kinds))[: len(kinds)]
    fast = pb.DecisionSnapshot(tick=7)
    add_checks(fast, kinds, row)
    slow = pb.DecisionSnapshot(tick=7)
    for kind, (score, threshold, veto, status) in zip(kinds, row.tolist()):
        slow.checks.add(check=int(kind), name=NAMES[kind], score=score, threshold=threshold, veto=veto, status=status)
    slow.vetoed_by.extend([pb.CHECK_INPUT_RANGE, pb.CHECK_MARGIN])
    assert fast == slow and fast.SerializeToString(deterministic=True) == slow.SerializeToString(deterministic=True)
    assert [c.name for c in fast.checks] == [NAMES[k] for k in kinds] and fast.checks[2].veto


def test_realtime_snapshots_carry_the_checks_too(shipped_channel, driving):
    session = DriveSession(shipped_channel, "rt-checks", pb.CLOCK_MODE_REALTIME)
    snaps = []
    for k, o in enumerate(driving[:20]):
        session.send(k + 1, time.monotonic_ns(), o.features.tolist())
        snaps.append(session.recv())  # at least one tick per observation: the stream waits for it
    session.cancel()
    assert all([c.check for c in s.checks] == EVERY_CHECK for s in snaps)
    assert all(math.isfinite(c.score) and math.isfinite(c.threshold) for s in snaps for c in s.checks)
    assert check(snaps[-1], pb.CHECK_INPUT_DENSITY).status == pb.CHECK_STATUS_SCORED
