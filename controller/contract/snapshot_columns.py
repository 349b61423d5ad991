"""A DriveAgents response's snapshots as one SnapshotColumns message, and back.

Building a DecisionSnapshot message per agent costs about 10 us of Python per agent and tick, more
than the agent's decision work. As columns the per-agent cost is one attribute read per field; the
message is filled with a list per field (`snapshot_columns`). `snapshots_from_columns` turns columns
back into the per-agent messages, through the same `snapshot_to_proto` a per-agent response uses,
so a client (and the tests) can compare the two ways field by field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

from dualloop.controller.contract.columns import check_sizes, float_runs, runs, sparse_rows
from dualloop.controller.contract.wire import saturated_float32, snapshot_to_proto, varint
from dualloop.executor.snapshot import (
    CHECK_DTYPE,
    AppliedAction,
    CandidateProposal,
    Check,
    PlanState,
    Reason,
    SafetyState,
    Snapshot,
    StageTimings,
)
from dualloop.v2 import controller_pb2 as pb

_EMPTY = np.zeros(0, np.float32)
# the columns of an entry per agent: all but the runs (laid end to end) and the sparse ones
_RUNS_AND_SPARSE = {
    *("proposed_controls", "probabilities", "applied_controls", "decision_vector", "reasons", "invalid_input"),
    *("check", "check_score", "check_threshold", "check_veto", "check_status"),
    *("gate_score", "gate_threshold", "gate_veto", "transport_delay_ns", "observation_age_with_transport_ns"),
}
_PER_AGENT = tuple(
    f.name
    for f in pb.SnapshotColumns.DESCRIPTOR.fields
    if f.name not in _RUNS_AND_SPARSE and not f.name.startswith("candidate_")
)


# a packed repeated field's element as little-endian bytes: float, double, fixed64, and varints below 128
# (bools, and the enums a snapshot carries), whose varint is their one byte
_PACKED = {"float": "<f4", "double": "<f8", "fixed64": "<u8", "small": "u1"}


def _set_packed(cols: pb.SnapshotColumns, field: str, values: np.ndarray, kind: str) -> None:
    """cols.field = values, merged as one packed field's bytes: converting each value costs ~40 ns
    (2,000 check results a tick at 128 agents), copying them as bytes almost nothing. The same
    message as assigning the values (tests/controller/contract/test_snapshot_columns.py)."""
    if kind == "small" and len(values) and not (0 <= int(values.min()) and int(values.max()) < 0x80):
        getattr(cols, field)[:] = values.tolist()  # a value past one byte's varint: the general way
        return
    raw = np.asarray(values).astype(_PACKED[kind]).tobytes()
    number = cols.DESCRIPTOR.fields_by_name[field].number
    getattr(cols, field)[:] = []
    if raw:
        cols.MergeFromString(varint(number << 3 | 2) + varint(len(raw)) + raw)


def _flat(cols: pb.SnapshotColumns, field: str, arrays: list[np.ndarray]) -> None:
    """Float arrays end to end in cols.field, their sizes in cols.field_count."""
    getattr(cols, field + "_count")[:] = [len(a) for a in arrays]
    _set_packed(cols, field, np.concatenate(arrays) if arrays else _EMPTY, "float")


def snapshot_columns(snaps: Sequence[Snapshot]) -> pb.SnapshotColumns:
    """The snapshots as columns, each field as `snapshot_to_proto` would set it."""
    cols = pb.SnapshotColumns(
        session_id=[s.session_id for s in snaps],
        tick=[s.tick for s in snaps],
        scheduled_time_ns=[s.scheduled_time_ns for s in snaps],
        emit_time_ns=[s.emit_time_ns for s in snaps],
        lateness_us=[s.lateness_us for s in snaps],
        observation_seq=[s.observation_seq for s in snaps],
        observation_age_ns=[s.observation_age_ns for s in snaps],
        plan_id=[s.plan_id for s in snaps],
        plan_age_ns=[s.plan_age_ns for s in snaps],
        model_version=[s.model_version for s in snaps],
        proposed_index=[s.proposed_index for s in snaps],
        proposed_name=[s.proposed_name for s in snaps],
        confidence=[s.confidence for s in snaps],
        margin=[s.margin for s in snaps],
        applied_index=[s.applied.index for s in snaps],
        applied_name=[s.applied.name for s in snaps],
        reasons_count=[len(s.reasons) for s in snaps],
        reasons=cast("list[pb.ReasonCode]", [int(r) for s in snaps for r in s.reasons]),
        safety_state=cast("list[pb.SafetyState]", [int(s.safety_state) for s in snaps]),
        input_hash=[s.input_hash for s in snaps],
        preprocess_us=[s.timings.preprocess_us for s in snaps],
        forward_us=[s.timings.forward_us for s in snaps],
        gate_us=[s.timings.gate_us for s in snaps],
        postprocess_us=[s.timings.postprocess_us for s in snaps],
        shadow=[s.shadow for s in snaps],
        snapshots_dropped=[s.snapshots_dropped for s in snaps],
        observations_dropped=[s.observations_dropped for s in snaps],
        observation_held=[s.observation_held for s in snaps],
        observation_period_ns=[s.observation_period_ns for s in snaps],
        plan_state=cast("list[pb.PlanState]", [int(s.plan_state) for s in snaps]),
        plan_valid_for_ns=[s.plan_valid_for_ns for s in snaps],
        snapshots_conflated_since_previous=[s.snapshots_conflated_since_previous for s in snaps],
        max_lateness_since_previous_us=[s.max_lateness_since_previous_us for s in snaps],
        ticks_missed_since_previous=[s.ticks_missed_since_previous for s in snaps],
        invalid_input_count=[len(s.invalid_input) for s in snaps],
        invalid_input=[name for s in snaps for name in s.invalid_input],
        hazard_lights=[Reason.FALLBACK in s.reasons for s in snaps],
    )
    _flat(cols, "proposed_controls", [s.proposed_controls for s in snaps])
    _flat(cols, "probabilities", [s.probabilities for s in snaps])
    _flat(cols, "applied_controls", [s.applied.controls for s in snaps])
    _gates(cols, snaps)
    _checks(cols, snaps)
    _transport(cols, snaps)
    vectors = [_EMPTY if s.decision_vector is None else s.decision_vector for s in snaps]
    _flat(cols, "decision_vector", vectors)
    _candidates(cols, snaps)
    return cols


def _gates(cols: pb.SnapshotColumns, snaps: Sequence[Snapshot]) -> None:
    gated = [s for s in snaps if s.gate_score is not None]
    cols.has_gate[:] = [s.gate_score is not None for s in snaps]
    if not gated:
        return
    cols.gate_score[:] = [saturated_float32(s.gate_score) for s in gated]  # type: ignore[arg-type]
    cols.gate_threshold[:] = [s.gate_threshold or 0.0 for s in gated]
    cols.gate_veto[:] = [s.gate_veto for s in gated]


def _checks(cols: pb.SnapshotColumns, snaps: Sequence[Snapshot]) -> None:
    judged = [s for s in snaps if s.checks is not None and len(s.check_kinds)]
    cols.checks_count[:] = [len(s.check_kinds) if s.checks is not None else 0 for s in snaps]
    if not judged:
        return
    # each snapshot's row of the tick's table, end to end (a structured concatenate costs 7 us a row)
    table = np.frombuffer(b"".join([s.checks.tobytes() for s in judged]), CHECK_DTYPE)  # type: ignore[union-attr]
    kinds = judged[0].check_kinds
    if all(s.check_kinds is kinds for s in judged):  # the executor's one tuple: every snapshot's
        check = np.tile(np.array(kinds, np.int64), len(judged))
    else:
        check = np.array([int(k) for s in judged for k in s.check_kinds], np.int64)
    _set_packed(cols, "check", check, "small")
    _set_packed(cols, "check_score", table["score"], "double")
    _set_packed(cols, "check_threshold", table["threshold"], "double")
    _set_packed(cols, "check_veto", table["veto"], "small")
    _set_packed(cols, "check_status", table["status"], "small")


def _transport(cols: pb.SnapshotColumns, snaps: Sequence[Snapshot]) -> None:
    timed = [s for s in snaps if s.transport_delay_ns is not None]
    cols.has_transport_delay[:] = [s.transport_delay_ns is not None for s in snaps]
    cols.transport_delay_ns[:] = [s.transport_delay_ns for s in timed]
    cols.observation_age_with_transport_ns[:] = [s.observation_age_with_transport_ns or 0 for s in timed]


def _candidates(cols: pb.SnapshotColumns, snaps: Sequence[Snapshot]) -> None:
    cols.has_candidate[:] = [s.candidate is not None for s in snaps]
    cands = [s.candidate for s in snaps if s.candidate is not None]
    if not cands:
        return
    cols.candidate_model_version[:] = [c.model_version for c in cands]
    cols.candidate_index[:] = [c.index for c in cands]
    cols.candidate_name[:] = [c.name for c in cands]
    _flat(cols, "candidate_controls", [c.controls for c in cands])
    cols.candidate_confidence[:] = [c.confidence for c in cands]
    cols.candidate_margin[:] = [c.margin for c in cands]


def snapshots_from_columns(cols: pb.SnapshotColumns) -> list[pb.DecisionSnapshot]:
    """The per-agent DecisionSnapshot messages the columns hold, as a response's `snapshots` holds them."""
    n = len(cols.session_id)
    check_sizes(cols, _PER_AGENT, n, "agents")
    proposed = float_runs(cols, "proposed_controls", n)
    probs = float_runs(cols, "probabilities", n)
    applied = float_runs(cols, "applied_controls", n)
    vectors = float_runs(cols, "decision_vector", n)
    reasons = runs(cols, "reasons", "reasons_count", n)
    invalid = runs(cols, "invalid_input", "invalid_input_count", n)
    kinds = runs(cols, "check", "checks_count", n)
    table = np.zeros(len(cols.check), CHECK_DTYPE)
    check_sizes(cols, ("check_score", "check_threshold", "check_veto", "check_status"), len(table), "check results")
    table["score"], table["threshold"] = cols.check_score, cols.check_threshold
    table["veto"], table["status"] = cols.check_veto, cols.check_status
    cands = _candidate_rows(cols, n)
    gates = sparse_rows(cols, "has_gate", ("gate_score", "gate_threshold", "gate_veto"), n)
    transport = sparse_rows(cols, "has_transport_delay", ("transport_delay_ns", "observation_age_with_transport_ns"), n)
    out, at = [], 0
    for i in range(n):
        k = cols.checks_count[i]
        gate, timed = gates[i], transport[i]
        snap = Snapshot(
            session_id=cols.session_id[i],
            tick=cols.tick[i],
            scheduled_time_ns=cols.scheduled_time_ns[i],
            emit_time_ns=cols.emit_time_ns[i],
            lateness_us=cols.lateness_us[i],
            observation_seq=cols.observation_seq[i],
            observation_age_ns=cols.observation_age_ns[i],
            model_version=cols.model_version[i],
            proposed_index=cols.proposed_index[i],
            proposed_name=cols.proposed_name[i],
            probabilities=probs[i],
            proposed_controls=proposed[i],
            confidence=cols.confidence[i],
            margin=cols.margin[i],
            applied=AppliedAction(cols.applied_index[i], cols.applied_name[i], applied[i]),
            reasons=tuple(Reason(r) for r in reasons[i]),
            safety_state=SafetyState(cols.safety_state[i]),
            input_hash=cols.input_hash[i],
            timings=StageTimings(cols.preprocess_us[i], cols.forward_us[i], cols.gate_us[i], cols.postprocess_us[i]),
            shadow=cols.shadow[i],
            plan_id=cols.plan_id[i],
            plan_age_ns=cols.plan_age_ns[i],
            plan_state=PlanState(cols.plan_state[i]),
            plan_valid_for_ns=cols.plan_valid_for_ns[i],
            decision_vector=vectors[i] if len(vectors[i]) else None,
            gate_score=None if gate is None else gate[0],
            gate_threshold=None if gate is None else gate[1],
            gate_veto=False if gate is None else gate[2],
            snapshots_dropped=cols.snapshots_dropped[i],
            observations_dropped=cols.observations_dropped[i],
            observation_held=cols.observation_held[i],
            observation_period_ns=cols.observation_period_ns[i],
            invalid_input=tuple(invalid[i]),
            snapshots_conflated_since_previous=cols.snapshots_conflated_since_previous[i],
            max_lateness_since_previous_us=cols.max_lateness_since_previous_us[i],
            ticks_missed_since_previous=cols.ticks_missed_since_previous[i],
            transport_delay_ns=None if timed is None else timed[0],
            observation_age_with_transport_ns=None if timed is None else timed[1],
            check_kinds=tuple(Check(c) for c in kinds[i]),
            checks=table[at : at + k] if k else None,
            candidate=cands[i],
        )
        at += k
        out.append(snapshot_to_proto(snap))
    return out


def _candidate_rows(cols: pb.SnapshotColumns, n: int) -> list[CandidateProposal | None]:
    names = ("candidate_model_version", "candidate_index", "candidate_name", "candidate_confidence", "candidate_margin")
    rows = sparse_rows(cols, "has_candidate", names, n)
    controls = iter(float_runs(cols, "candidate_controls", sum(r is not None for r in rows)))
    return [None if r is None else CandidateProposal(r[0], r[1], r[2], next(controls), r[3], r[4]) for r in rows]
