"""`snapshot_to_proto` builds the same message, so the same bytes, as building every nested message with
keywords (the reference below, the function as it was): on seeded random snapshots covering every
optional part (no proposal, no gate, no transport delay, reasons, checks, a decision vector)."""

from __future__ import annotations

from typing import cast

import numpy as np
import pytest

from dualloop.controller.contract.wire import (
    add_checks,
    drive_response_bytes,
    saturated_float32,
    snapshot_response,
    snapshot_to_proto,
)
from dualloop.executor.snapshot import (
    CHECK_DTYPE,
    AppliedAction,
    Check,
    PlanState,
    Reason,
    SafetyState,
    Snapshot,
    StageTimings,
)
from dualloop.v2 import controller_pb2 as pb


def _reference(s: Snapshot) -> pb.DecisionSnapshot:
    msg = pb.DecisionSnapshot(
        session_id=s.session_id,
        tick=s.tick,
        scheduled_time_ns=s.scheduled_time_ns,
        emit_time_ns=s.emit_time_ns,
        lateness_us=s.lateness_us,
        observation_seq=s.observation_seq,
        observation_age_ns=s.observation_age_ns,
        plan_id=s.plan_id,
        plan_age_ns=s.plan_age_ns,
        plan_state=cast("pb.PlanState", int(s.plan_state)),
        plan_valid_for_ns=s.plan_valid_for_ns,
        model_version=s.model_version,
        proposed=pb.Proposal(
            action=pb.Action(index=s.proposed_index, name=s.proposed_name, controls=s.proposed_controls.tolist()),
            probabilities=s.probabilities.tolist(),
            confidence=s.confidence,
            margin=s.margin,
        ),
        applied=pb.Action(index=s.applied.index, name=s.applied.name, controls=s.applied.controls.tolist()),
        # Reason and SafetyState carry the wire numbers; the stubs type enum fields as their enum class
        reasons=cast("list[pb.ReasonCode]", [int(r) for r in s.reasons]),
        safety_state=cast("pb.SafetyState", int(s.safety_state)),
        input_hash=s.input_hash,
        timings=pb.StageTimings(
            preprocess_us=s.timings.preprocess_us,
            forward_us=s.timings.forward_us,
            gate_us=s.timings.gate_us,
            postprocess_us=s.timings.postprocess_us,
        ),
        shadow=s.shadow,
        snapshots_dropped=s.snapshots_dropped,
        observations_dropped=s.observations_dropped,
        observation_held=s.observation_held,
        observation_period_ns=s.observation_period_ns,
        snapshots_conflated_since_previous=s.snapshots_conflated_since_previous,
        max_lateness_since_previous_us=s.max_lateness_since_previous_us,
        ticks_missed_since_previous=s.ticks_missed_since_previous,
        invalid_input=s.invalid_input,
        hazard_lights=Reason.FALLBACK in s.reasons,  # the minimal-risk manoeuvre asks for them
    )
    if s.transport_delay_ns is not None:
        msg.transport_delay_ns = s.transport_delay_ns
        msg.observation_age_with_transport_ns = s.observation_age_with_transport_ns or 0
    if s.gate_score is not None:
        msg.gate.score = s.gate_score
        msg.gate.threshold = s.gate_threshold or 0.0
        msg.gate.veto = s.gate_veto
    if s.checks is not None and len(s.check_kinds):
        add_checks(msg, s.check_kinds, s.checks)
    if s.decision_vector is not None:
        msg.decision_vector.extend(s.decision_vector.tolist())
    return msg


KINDS = (Check.INPUT_DENSITY, Check.INPUT_RANGE, Check.FREEZE, Check.MARGIN)


def _random_snapshot(rng: np.random.Generator) -> Snapshot:
    def maybe(p: float = 0.5) -> bool:
        return bool(rng.random() < p)

    def ns() -> int:
        return int(rng.integers(0, 2**62)) if maybe() else 0

    def floats(k: int) -> np.ndarray:
        return rng.normal(0.0, 2.0, k).astype(np.float32) if maybe(0.8) else np.zeros(k, np.float32)

    def pick(*options: str) -> str:
        return options[int(rng.integers(len(options)))]

    scored = maybe(0.8)
    empty = np.zeros(0, np.float32)
    checks = np.zeros(len(KINDS), CHECK_DTYPE)
    checks["score"], checks["threshold"] = rng.normal(size=len(KINDS)), rng.normal(size=len(KINDS))
    checks["veto"], checks["status"] = rng.random(len(KINDS)) < 0.3, rng.integers(1, 4, len(KINDS))
    transport = int(rng.integers(-(10**6), 10**9)) if maybe() else None
    gated = maybe()
    return Snapshot(
        session_id=pick("", "car-1", "a" * 40),
        tick=int(rng.integers(0, 2**40)) if maybe() else 0,
        scheduled_time_ns=ns(),
        emit_time_ns=ns(),
        lateness_us=int(rng.integers(0, 10**4)) if maybe() else 0,
        observation_seq=int(rng.integers(1, 10**6)),
        observation_age_ns=ns(),
        model_version=pick("", "v1-abc"),
        proposed_index=int(rng.integers(0, 5)) if scored else -1,
        proposed_name=pick("", "keep", "brake") if scored else "",
        probabilities=floats(5) if scored else empty,
        proposed_controls=floats(2) if scored else empty,
        confidence=float(rng.random()) if scored and maybe() else 0.0,
        margin=float(np.float32(rng.random())) if scored and maybe() else 0.0,
        applied=AppliedAction(int(rng.integers(0, 5)), pick("", "keep"), floats(2)),
        reasons=tuple(Reason(int(r)) for r in rng.choice([1, 2, 3, 4, 5, 6, 7, 8], int(rng.integers(0, 4)))),
        safety_state=SafetyState(int(rng.integers(1, 5))),
        input_hash=int(rng.integers(0, 2**63)) * int(rng.integers(1, 3)) if maybe() else 0,
        timings=StageTimings(*(int(v) for v in rng.integers(0, 3, 4) * rng.integers(0, 1000, 4))),
        shadow=maybe(),
        plan_id=pick("", "plan-7"),
        plan_age_ns=ns(),
        plan_state=PlanState(int(rng.integers(1, 4))),
        plan_valid_for_ns=ns(),
        decision_vector=floats(16) if maybe(0.3) else None,
        gate_score=float(rng.normal()) if gated else None,
        gate_threshold=float(rng.random()) if gated and maybe() else (0.0 if gated else None),
        gate_veto=maybe() if gated else False,
        snapshots_dropped=int(rng.integers(0, 100)) if maybe() else 0,
        observations_dropped=int(rng.integers(0, 100)) if maybe() else 0,
        observation_held=maybe(),
        observation_period_ns=ns(),
        actual_index=-1,
        invalid_input=[(), ("features",), ("plan",), ("features", "plan")][int(rng.integers(0, 4))],
        snapshots_conflated_since_previous=int(rng.integers(0, 5)) if maybe() else 0,
        max_lateness_since_previous_us=int(rng.integers(0, 10**4)) if maybe() else 0,
        ticks_missed_since_previous=int(rng.integers(0, 5)) if maybe() else 0,
        transport_delay_ns=transport,
        observation_age_with_transport_ns=None if transport is None else ns(),
        check_kinds=KINDS if maybe(0.9) else (),
        checks=checks if maybe(0.9) else None,
    )


@pytest.mark.parametrize("seed", range(4))
def test_snapshot_to_proto_gives_the_reference_bytes(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(500):
        snap = _random_snapshot(rng)
        got, want = snapshot_to_proto(snap), _reference(snap)
        assert got == want
        assert got.SerializeToString() == want.SerializeToString()
        assert got.SerializeToString(deterministic=True) == want.SerializeToString(deterministic=True)


def test_snapshot_response_gives_drive_response_bytes() -> None:
    """The pre-serialised response, for snapshots of 1 to 3 length bytes (a long decision vector)."""
    rng = np.random.default_rng(7)
    for size in (0, 16, 40, 5000):
        for _ in range(50):
            snap = _random_snapshot(rng)
            snap.decision_vector = rng.normal(size=size).astype(np.float32) if size else None
            msg = snapshot_to_proto(snap)
            want = pb.DriveResponse(snapshot=msg).SerializeToString()
            assert snapshot_response(msg) == want
            assert pb.DriveResponse.FromString(snapshot_response(msg)).snapshot == msg
    opened = pb.DriveResponse(opened=pb.SessionOpened(session_id="a"))
    assert drive_response_bytes(opened) == opened.SerializeToString()
    assert drive_response_bytes(b"\x12\x00") == b"\x12\x00"


def test_the_comparison_can_fail() -> None:
    """A snapshot whose timings are all zero still carries the (empty) StageTimings message: the
    comparison sees a message that lacks it."""
    snap = _random_snapshot(np.random.default_rng(0))
    snap.timings = StageTimings()
    msg = snapshot_to_proto(snap)
    assert msg.HasField("timings") and msg.HasField("proposed") and msg.HasField("applied")
    msg.ClearField("timings")
    assert msg.SerializeToString() != _reference(snap).SerializeToString()
    assert cast("object", msg) != _reference(snap)


@pytest.mark.parametrize("kind", [float, np.float64, np.float32])
def test_a_finite_score_past_float32s_range_is_sent_as_its_largest_value(kind) -> None:
    """Finite beyond float32: the largest float32 of its sign (never the Inf the field's conversion
    makes); Inf and NaN as they are; anything in range unchanged."""
    top = float(np.finfo(np.float32).max)
    values = [kind(1.5), kind(-0.0), kind(top), kind(np.inf), kind(-np.inf), kind(np.nan)]
    if kind is not np.float32:
        values += [kind(1e39), kind(-1e300)]
    out = [saturated_float32(v) for v in values]
    assert out[:5] == [1.5, -0.0, top, np.inf, -np.inf] and np.isnan(out[5])
    assert out[6:] == ([] if kind is np.float32 else [top, -top])
    msg = pb.DecisionSnapshot()
    for v in out[:5] + out[6:]:
        msg.gate.score = v
        assert pb.DecisionSnapshot.FromString(msg.SerializeToString()).gate.score == float(np.float32(v))
