"""The SessionLimits a server sends with OpenSession (apart from contract.wire, which replay uses: this
one needs the server's configuration, and importing that costs replay's start-up pydantic-settings,
yaml and grpc)."""

from __future__ import annotations

from dualloop.controller.serve.client_strings import MAX_ID_BYTES
from dualloop.controller.serve.config import ServerConfig
from dualloop.executor.core import MAX_OBSERVATION_PERIOD_NS, Executor
from dualloop.v2 import controller_pb2 as pb


def session_limits(ex: Executor, config: ServerConfig) -> pb.SessionLimits:
    """The limits a session is judged by, read from the running executor and server configuration
    (the values the executor compares against, not copies of their defaults)."""
    safety = ex.safety
    safe = ex.safe_action
    hold = safety.standstill
    return pb.SessionLimits(
        max_observation_age_ns=ex.reasons.max_observation_age_ns,
        assumed_observation_period_ns=ex.assumed_observation_period_ns,
        default_plan_valid_for_ns=ex.reasons.max_plan_age_ns,
        lockstep_max_ticks=ex.max_lockstep_ticks,
        lockstep_max_gap_ns=ex.max_lockstep_ticks * ex.period_ns,
        hold_timeout_ns=safety.hold_timeout_ns,
        recovery_dwell_ns=safety.recovery_dwell_ns,
        max_abstain_ns=safety.max_abstain_ns,
        safe_action=pb.Action(index=safe.index, name=safe.name, controls=safe.controls.tolist()),
        fallback_decel=safety.config.fallback_decel,
        blind_decel=safety.config.blind_decel,
        fallback_jerk=safety.config.jerk_limit,
        jerk_limit=safety.config.jerk_limit,
        standstill_speed=safety.config.standstill_speed,
        # 0: no stopped-lead hold on this server's model
        stopped_lead_rest_speed=hold.config.rest_speed if hold is not None else 0.0,
        stopped_lead_speed=hold.config.lead_stopped_speed if hold is not None else 0.0,
        stopped_lead_max_gap=hold.config.max_gap_m if hold is not None else 0.0,
        # the check runs only with a gate (it vetoes through OOD_VETO)
        freeze_repeats=ex.gating.freeze.repeats if ex.gating.freeze is not None else 0,
        min_margin=ex.reasons.min_margin,
        max_receive_message_bytes=config.max_receive_message_bytes,
        recommended_client_window_bytes=config.client_window_bytes,
        open_timeout_ns=int(round(config.open_timeout_s * 1e9)),
        max_session_id_bytes=MAX_ID_BYTES,
        max_plan_id_bytes=MAX_ID_BYTES,
        max_observation_period_ns=MAX_OBSERVATION_PERIOD_NS,
        max_agents_per_stream=config.max_agents_per_stream,
    )
