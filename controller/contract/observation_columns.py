"""Observations of several DriveAgents agents as one ObservationColumns message, and back.

A client with a hundred agents builds one message with a list per field (`observation_columns`,
from per-agent messages, or `columns_of_arrays` straight from its arrays); the server reads the
columns into the executor's observations with one numpy split per array (`observations_from_columns`)
instead of a message per agent. `observation_message` is the Observation message an agent's
observation is recorded as, the one a per-agent client would have sent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from dualloop.controller.contract.columns import check_sizes, float_runs, sparse_rows
from dualloop.executor.snapshot import Observation
from dualloop.v2 import controller_pb2 as pb

# the columns of an entry per agent; the optional ones may also be left empty: every agent's default
# (an Observation's unset field), as a client without plans or send times would rather not fill them
_PER_AGENT = ("seq", "timestamp_ns", "features_count")
_OPTIONAL = ("sent_time_ns", "release_standstill", "has_plan", "has_actual")


def observation_columns(observations: Mapping[str, pb.Observation]) -> pb.ObservationColumns:
    """Per-agent Observation messages (by session id) as columns."""
    obs = list(observations.values())
    planned = [o.plan for o in obs if o.HasField("plan")]
    acted = [o.actual for o in obs if o.HasField("actual")]
    return pb.ObservationColumns(
        session_id=list(observations),
        seq=[o.seq for o in obs],
        timestamp_ns=[o.timestamp_ns for o in obs],
        features_count=[len(o.features) for o in obs],
        features=[v for o in obs for v in o.features],
        sent_time_ns=[o.sent_time_ns for o in obs],
        release_standstill=[o.release_standstill for o in obs],
        has_plan=[o.HasField("plan") for o in obs],
        plan_id=[p.plan_id for p in planned],
        plan_values_count=[len(p.values) for p in planned],
        plan_values=[v for p in planned for v in p.values],
        plan_valid_for_ns=[p.valid_for_ns for p in planned],
        plan_created_ns=[p.created_ns for p in planned],
        has_actual=[o.HasField("actual") for o in obs],
        actual_index=[a.action_index for a in acted],
        actual_controls_count=[len(a.controls) for a in acted],
        actual_controls=[v for a in acted for v in a.controls],
    )


def columns_of_arrays(
    session_ids: Sequence[str], seq: int, timestamp_ns: int, features: np.ndarray, sent_time_ns: int = 0
) -> pb.ObservationColumns:
    """One tick of agents sharing a sequence number and a timestamp: features (agents, F), no plans,
    no actual actions (a simulator's traffic, a vectorised environment's sub-environments)."""
    n = len(session_ids)
    if features.ndim != 2 or len(features) != n:
        raise ValueError(f"features must be (agents, features) for {n} agents, got shape {features.shape}")
    cols = pb.ObservationColumns(
        session_id=session_ids,
        seq=[seq] * n,
        timestamp_ns=[timestamp_ns] * n,
        features_count=[features.shape[1]] * n,
        sent_time_ns=[sent_time_ns] * n,
        release_standstill=[False] * n,
        has_plan=[False] * n,
        has_actual=[False] * n,
    )
    cols.features[:] = np.asarray(features, np.float32).ravel().tolist()
    return cols


def observations_from_columns(
    columns: pb.ObservationColumns, arrival_ns: int, received_wall_ns: int = 0
) -> list[tuple[str, Observation]]:
    """Each agent's (session id, observation), as `observation_from_proto` reads a message's;
    ColumnsError when the columns' sizes do not add up."""
    n = len(columns.session_id)
    check_sizes(columns, _PER_AGENT, n, "agents")
    check_sizes(columns, [name for name in _OPTIONAL if len(getattr(columns, name))], n, "agents (or none)")
    features = float_runs(columns, "features", n)
    plan_rows = sparse_rows(columns, "has_plan", ("plan_id", "plan_valid_for_ns", "plan_created_ns"), n, True)
    plan_values = iter(float_runs(columns, "plan_values", sum(r is not None for r in plan_rows)))
    actual_rows = sparse_rows(columns, "has_actual", ("actual_index",), n, True)
    controls = iter(float_runs(columns, "actual_controls", sum(r is not None for r in actual_rows)))
    # each column as a list once: indexing a message's repeated field costs more than the list
    sent_time_ns = list(columns.sent_time_ns) or [0] * n
    release_standstill = list(columns.release_standstill) or [False] * n
    out = []
    for session_id, seq, timestamp_ns, row, plan, actual, sent, release in zip(
        columns.session_id,
        list(columns.seq),
        list(columns.timestamp_ns),
        features,
        plan_rows,
        actual_rows,
        sent_time_ns,
        release_standstill,
    ):
        obs = Observation(
            seq=seq,
            timestamp_ns=timestamp_ns,
            features=row,
            arrival_ns=arrival_ns,
            actual_index=-1 if actual is None else actual[0],
            actual_controls=None if actual is None else next(controls),
            plan_id="" if plan is None else plan[0],
            plan_values=None if plan is None else next(plan_values),
            sent_time_ns=sent,
            received_wall_ns=received_wall_ns,
            plan_valid_for_ns=0 if plan is None else plan[1],
            plan_created_ns=0 if plan is None else plan[2],
            release_standstill=release,
        )
        out.append((session_id, obs))
    return out


def observation_message(obs: Observation) -> pb.Observation:
    """The Observation message of an observation read from columns: what a client sending a message
    per agent would have sent (the server records it)."""
    msg = pb.Observation(
        seq=obs.seq,
        timestamp_ns=obs.timestamp_ns,
        features=obs.features.tolist(),
        sent_time_ns=obs.sent_time_ns,
        release_standstill=obs.release_standstill,
    )
    if obs.actual_controls is not None:
        msg.actual.action_index = obs.actual_index
        msg.actual.controls[:] = obs.actual_controls.tolist()
    if obs.plan_values is not None:
        plan = msg.plan
        plan.plan_id, plan.valid_for_ns, plan.created_ns = obs.plan_id, obs.plan_valid_for_ns, obs.plan_created_ns
        plan.values[:] = obs.plan_values.tolist()
    return msg
