"""Conversion between the executor's dataclasses and the dualloop.v2 protobuf messages."""

from __future__ import annotations

import math
import struct
from typing import cast

import numpy as np

from dualloop.executor.checks import NAMES
from dualloop.executor.model_card import ModelCard
from dualloop.executor.snapshot import WALL_CLOCK_FIELDS, Check, Observation, Reason, Snapshot
from dualloop.v2 import controller_pb2 as pb


def model_info(card: ModelCard, tick_period_ns: int, gate_version: str = "", gate_source: str = "") -> pb.ModelInfo:
    return pb.ModelInfo(
        gate_version=gate_version,
        gate_source=gate_source,
        model_version=card.version,
        size_class=card.size_class,
        features=[pb.FeatureSpec(name=f.name, unit=f.unit, mean=f.mean, std=f.std) for f in card.features],
        plan=[pb.FeatureSpec(name=f.name, unit=f.unit, mean=f.mean, std=f.std) for f in card.plan],
        actions=card.actions,
        controls=[pb.ControlSpec(name=c.name, unit=c.unit, min=c.min, max=c.max) for c in card.controls],
        # several outputs (a card's decision_vector_outputs): their names joined by commas, in order
        decision_vector_output=",".join(p.output for p in card.decision_vector_parts),
        decision_vector_size=card.decision_vector_size,
        schema_hash=card.schema_hash(),
        tick_period_ns=tick_period_ns,
        history_features=card.history_names,
    )


def observation_from_proto(msg: pb.Observation, arrival_ns: int, received_wall_ns: int = 0) -> Observation:
    """arrival_ns: server monotonic clock at receipt; received_wall_ns: its wall clock (Unix epoch)."""
    actual = msg.actual if msg.HasField("actual") else None
    plan = msg.plan if msg.HasField("plan") else None
    return Observation(
        seq=msg.seq,
        timestamp_ns=msg.timestamp_ns,
        features=np.fromiter(msg.features, np.float32, len(msg.features)),  # ~2x np.asarray's speed
        arrival_ns=arrival_ns,
        actual_index=actual.action_index if actual is not None else -1,
        actual_controls=np.fromiter(actual.controls, np.float32, len(actual.controls)) if actual is not None else None,
        plan_id=plan.plan_id if plan is not None else "",
        plan_values=np.asarray(plan.values, dtype=np.float32) if plan is not None else None,
        sent_time_ns=msg.sent_time_ns,
        received_wall_ns=received_wall_ns,
        plan_valid_for_ns=plan.valid_for_ns if plan is not None else 0,
        plan_created_ns=plan.created_ns if plan is not None else 0,
        release_standstill=msg.release_standstill,
    )


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def saturated_float32(x: float) -> float:
    """A float32 field's value for a finite double beyond its range: the largest float32 (of the sign),
    not the +-Inf the conversion would make; Inf and NaN stay as they are (found by tests/fuzz: a
    squared Mahalanobis distance past 3.4e38 went out as gate.score = +Inf on finite input)."""
    return max(-_FLOAT32_MAX, min(x, _FLOAT32_MAX)) if math.isfinite(x) else x  # numpy's isfinite: ~0.7 us a call


def snapshot_to_proto(s: Snapshot) -> pb.DecisionSnapshot:
    """The wire message of a snapshot. The scalars go in one constructor call; the nested messages
    are filled field by field in place (a third cheaper than building each with keywords and
    copying it in; the same message, so the same bytes: tests/controller/contract/test_wire.py)."""
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
        # Reason and SafetyState carry the wire numbers; the stubs type enum fields as their enum class
        reasons=cast("list[pb.ReasonCode]", s.reasons),
        safety_state=cast("pb.SafetyState", int(s.safety_state)),
        input_hash=s.input_hash,
        shadow=s.shadow,
        snapshots_dropped=s.snapshots_dropped,
        observations_dropped=s.observations_dropped,
        observation_held=s.observation_held,
        observation_period_ns=s.observation_period_ns,
        snapshots_conflated_since_previous=s.snapshots_conflated_since_previous,
        max_lateness_since_previous_us=s.max_lateness_since_previous_us,
        ticks_missed_since_previous=s.ticks_missed_since_previous,
        invalid_input=s.invalid_input,
        hazard_lights=Reason.FALLBACK in s.reasons,
    )
    # setting a field of a nested message makes it present, as the keyword construction did
    proposed = msg.proposed
    action = proposed.action
    action.index, action.name = s.proposed_index, s.proposed_name
    action.controls[:] = s.proposed_controls.tolist()
    proposed.probabilities[:] = s.probabilities.tolist()
    proposed.confidence, proposed.margin = s.confidence, s.margin
    applied = msg.applied
    applied.index, applied.name = s.applied.index, s.applied.name
    applied.controls[:] = s.applied.controls.tolist()
    timings, t = msg.timings, s.timings
    timings.preprocess_us, timings.forward_us = t.preprocess_us, t.forward_us
    timings.gate_us, timings.postprocess_us = t.gate_us, t.postprocess_us
    if s.transport_delay_ns is not None:
        msg.transport_delay_ns = s.transport_delay_ns
        msg.observation_age_with_transport_ns = s.observation_age_with_transport_ns or 0
    if s.gate_score is not None:
        msg.gate.score = saturated_float32(s.gate_score)
        msg.gate.threshold = s.gate_threshold or 0.0
        msg.gate.veto = s.gate_veto
    if s.checks is not None and len(s.check_kinds):
        add_checks(msg, s.check_kinds, s.checks)
    if s.decision_vector is not None:
        msg.decision_vector.extend(s.decision_vector.tolist())
    cand = s.candidate
    if cand is not None:  # never applied: a separate message, nothing of it in `applied`
        c = msg.candidate_never_applied
        c.model_version = cand.model_version
        c.action.index, c.action.name = cand.index, cand.name
        c.action.controls[:] = cand.controls.tolist()
        c.confidence, c.margin = cand.confidence, cand.margin
    return msg


# DriveResponse.snapshot's tag: field 2, length-delimited
_SNAPSHOT_TAG = bytes([(pb.DriveResponse.DESCRIPTOR.fields_by_name["snapshot"].number << 3) | 2])


def varint(n: int) -> bytes:
    """A non-negative integer as a protobuf varint (a length, a tag)."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def snapshot_response(msg: pb.DecisionSnapshot) -> bytes:
    """The wire bytes of DriveResponse(snapshot=msg), without building the DriveResponse: the
    wrapper's constructor copies the whole snapshot (about 6 us of the 10 a snapshot's response
    cost). A message of one field serialises to its tag, length and bytes, so these are the bytes
    DriveResponse.SerializeToString gives (tests/controller/contract/test_wire.py)."""
    body = msg.SerializeToString()
    return _SNAPSHOT_TAG + varint(len(body)) + body


def drive_response_bytes(response: pb.DriveResponse | bytes) -> bytes:
    """The Drive stream's serializer: a response, or a snapshot's response already as bytes."""
    return response if isinstance(response, bytes) else response.SerializeToString()


class _CheckEncoder:
    """A snapshot's check results as DecisionSnapshot.checks (field 28) wire bytes, packed in one
    struct call and merged in one parse: per CheckResult, its constant head (tag, length, check,
    name) then score, threshold, veto and status with their tags. About half the cost of adding the
    messages field by field, 8 checks on every snapshot of every tick."""

    def __init__(self, kinds: tuple[Check, ...]) -> None:
        fmt, self.heads = "<", []
        for kind in kinds:
            name = NAMES[kind].encode()
            # check (1, varint), name (2, bytes), score (3, double): the constant part and the tag
            body = bytes([0x08, int(kind), 0x12, len(name)]) + name + b"\x19"
            size = len(body) + 8 + 1 + 8 + 2 + 2  # score; threshold tag + value; veto, status
            head = b"\xe2\x01" + bytes([size]) + body  # field 28, length-delimited (size < 128)
            self.heads.append(head)
            fmt += f"{len(head)}sdBdBBBB"  # head, score, 0x21 threshold, 0x28 veto, 0x30 status
        self.packer = struct.Struct(fmt)
        self.kinds = [int(k) for k in kinds]

    def encode(self, row: np.ndarray) -> tuple[bytes, list[int]]:
        """(the checks' wire bytes, the kinds that vetoed)."""
        args: list[object] = []
        vetoed = []
        for head, kind, (score, threshold, veto, status) in zip(self.heads, self.kinds, row.tolist()):
            args += (head, score, 0x21, threshold, 0x28, veto, 0x30, status)
            if veto:
                vetoed.append(kind)
        return self.packer.pack(*args), vetoed


_ENCODERS: dict[tuple[Check, ...], _CheckEncoder] = {}


def add_checks(msg: pb.DecisionSnapshot, kinds: tuple[Check, ...], row: np.ndarray) -> None:
    """A snapshot's check results (a CHECK_DTYPE row per check, executor.checks) onto the wire, and
    the kinds that vetoed in vetoed_by."""
    encoder = _ENCODERS.get(kinds)
    if encoder is None:
        encoder = _ENCODERS[kinds] = _CheckEncoder(kinds)
    wire, vetoed = encoder.encode(row)
    msg.MergeFromString(wire)
    if vetoed:
        msg.vetoed_by.extend(cast("list[pb.Check]", vetoed))


def without_wall_clock(msg: pb.DecisionSnapshot) -> bytes:
    """Deterministic bytes of a snapshot: what two LOCKSTEP replays must agree on."""
    copy = pb.DecisionSnapshot()
    copy.CopyFrom(msg)
    for name in WALL_CLOCK_FIELDS:  # the Snapshot's names are the DecisionSnapshot's
        copy.ClearField(name)
    return copy.SerializeToString(deterministic=True)
