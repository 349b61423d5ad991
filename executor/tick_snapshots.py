"""A live tick's Snapshots, row by row, from the columns `Executor._postprocess` decided.

The columns arrive as Python values (a numpy scalar per row and field costs more than the rules
themselves at a live tick's few dozen rows); building the Snapshots also moves each session's tick
count and REALTIME grid position on, in the same pass over the rows.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from dualloop.executor.gating import GateVerdicts
from dualloop.executor.sessions import Session
from dualloop.executor.snapshot import (
    INT64_MAX,
    AppliedAction,
    Check,
    Clock,
    Observation,
    PlanState,
    Reason,
    SafetyState,
    Snapshot,
    StageTimings,
)


class TickRows(NamedTuple):
    """One tick's columns, a value per row. A NamedTuple: it is built every tick, and a frozen
    dataclass's __init__ costs about ten times as much."""

    tick_index: int
    tick_ns: int
    lateness_us: int
    ages: list[int]
    periods: list[int]
    held: list[bool]
    finite: list[bool]
    hashes: list[int]
    plan_ages: list[int]
    plan_states: list[int]
    reasons: list[list[Reason]]
    proposals: list[AppliedAction | None]
    probabilities: list[np.ndarray]  # the rows of the tick's probabilities, when the model ran
    confidences: list[float]
    margins: list[float]
    decided: list[tuple[AppliedAction, SafetyState]]
    decision_vectors: np.ndarray | None  # None: no row's outputs
    model_ok: np.ndarray
    gate: GateVerdicts | None
    checks: list[np.ndarray]


_PLAN_STATES = {int(state): state for state in PlanState}


def tick_snapshots(
    rows: list[Session], observations: list[Observation], c: TickRows, version: str, kinds: tuple[Check, ...]
) -> list[Snapshot]:
    """The tick's Snapshots (`version`: the model's; `kinds`: the check table's columns)."""
    tick_index, tick_ns, lateness_us, ages, periods, held, finite_rows, hashes, plan_ages, plan_states = c[:10]
    reasons, proposals, prob_rows, confs, margins, decided, decision_vectors, model_ok, gate, table_rows = c[10:]
    if gate is not None:  # as Python floats and bools, one conversion per tick rather than per row
        gate_scores, gate_thresholds, gate_vetoes = (np.asarray(v).tolist() for v in gate[:3])
    plan_state_of = [_PLAN_STATES[int(v)] for v in plan_states]  # an Enum call costs ~1 us a row
    empty = np.zeros(0, np.float32)
    vector_ok = [False] * len(rows) if decision_vectors is None else model_ok  # the model's outputs, per row
    snaps = []
    for i, (s, obs, age, proposal) in enumerate(zip(rows, observations, ages, proposals)):
        if proposal is not None:
            idx, name = proposal.index, proposal.name
            prop_probs, prop_controls, conf, marg = prob_rows[i], proposal.controls, confs[i], margins[i]
        else:
            idx, name, prop_probs, prop_controls, conf, marg = -1, "", empty, empty, 0.0, 0.0
        applied, state = decided[i]
        s.ticks, missed, transport = s.ticks + 1, 0, None
        if s.clock is Clock.REALTIME:
            # grid indices skipped since this session's previous tick (missed deadlines)
            if s.last_tick_index is not None:
                missed = max(0, tick_index - s.last_tick_index - 1)
            s.last_tick_index = tick_index
            if obs.sent_time_ns:
                # saturated, as the plan age: a client clock at int64's edge must not overflow the field
                transport = max(-INT64_MAX, min(obs.received_wall_ns - obs.sent_time_ns, INT64_MAX))
        vector = decision_vectors[i].copy() if s.include_decision_vector and vector_ok[i] else None  # type: ignore[index]
        # positionally, in field order (keywords cost ~1.5 us a row); tests/executor/test_tick_snapshots.py
        snaps.append(
            Snapshot(
                s.session_id,  # session_id
                tick_index,  # tick
                tick_ns,  # scheduled_time_ns
                0,  # emit_time_ns
                lateness_us,  # lateness_us
                obs.seq,  # observation_seq
                age,  # observation_age_ns
                version,  # model_version
                idx,  # proposed_index
                name,  # proposed_name
                prop_probs,  # probabilities
                prop_controls,  # proposed_controls
                conf,  # confidence
                marg,  # margin
                applied,  # applied
                tuple(reasons[i]),  # reasons
                state,  # safety_state
                hashes[i],  # input_hash
                StageTimings(),  # timings
                s.shadow,  # shadow
                s.plan_id,  # plan_id
                plan_ages[i],  # plan_age_ns
                plan_state_of[i],  # plan_state
                s.plan_valid_for_ns if s.has_plan else 0,  # plan_valid_for_ns
                vector,  # decision_vector
                gate_scores[i] if gate is not None else None,  # gate_score
                gate_thresholds[i] if gate is not None else None,  # gate_threshold
                gate_vetoes[i] if gate is not None else False,  # gate_veto
                s.snapshots_dropped,  # snapshots_dropped
                s.observations_dropped,  # observations_dropped
                held[i],  # observation_held
                periods[i],  # observation_period_ns
                obs.actual_index,  # actual_index
                obs.actual_controls,  # actual_controls
                obs.invalid_parts if finite_rows[i] else ("features", *obs.invalid_parts),  # invalid_input
                {},  # extra
                0,  # snapshots_conflated_since_previous
                lateness_us,  # max_lateness_since_previous_us
                missed,  # ticks_missed_since_previous
                transport,  # transport_delay_ns
                None
                if transport is None
                else max(-INT64_MAX, min(age + transport, INT64_MAX)),  # observation_age_with_transport_ns
                kinds,  # check_kinds
                table_rows[i],  # checks
            )
        )
    return snaps
