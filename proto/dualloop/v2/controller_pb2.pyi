from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ClockMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CLOCK_MODE_UNSPECIFIED: _ClassVar[ClockMode]
    CLOCK_MODE_REALTIME: _ClassVar[ClockMode]
    CLOCK_MODE_LOCKSTEP: _ClassVar[ClockMode]

class ReasonCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REASON_CODE_UNSPECIFIED: _ClassVar[ReasonCode]
    REASON_CODE_OOD_VETO: _ClassVar[ReasonCode]
    REASON_CODE_LOW_MARGIN: _ClassVar[ReasonCode]
    REASON_CODE_STALE_OBSERVATION: _ClassVar[ReasonCode]
    REASON_CODE_STALE_PLAN: _ClassVar[ReasonCode]
    REASON_CODE_INVALID_INPUT: _ClassVar[ReasonCode]
    REASON_CODE_MODEL_ERROR: _ClassVar[ReasonCode]
    REASON_CODE_FALLBACK: _ClassVar[ReasonCode]
    REASON_CODE_SAFE_DEFAULT: _ClassVar[ReasonCode]
    REASON_CODE_THREAT_BRAKING: _ClassVar[ReasonCode]
    REASON_CODE_STANDSTILL_HOLD: _ClassVar[ReasonCode]
    REASON_CODE_STOPPED_LEAD_HOLD: _ClassVar[ReasonCode]

class SafetyState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SAFETY_STATE_UNSPECIFIED: _ClassVar[SafetyState]
    SAFETY_STATE_NOMINAL: _ClassVar[SafetyState]
    SAFETY_STATE_VETO_HOLD: _ClassVar[SafetyState]
    SAFETY_STATE_FALLBACK_ACTIVE: _ClassVar[SafetyState]
    SAFETY_STATE_RECOVERING: _ClassVar[SafetyState]

class PlanState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PLAN_STATE_UNSPECIFIED: _ClassVar[PlanState]
    PLAN_STATE_NONE: _ClassVar[PlanState]
    PLAN_STATE_VALID: _ClassVar[PlanState]
    PLAN_STATE_EXPIRED: _ClassVar[PlanState]

class Check(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHECK_UNSPECIFIED: _ClassVar[Check]
    CHECK_DECISION_VECTOR_DENSITY: _ClassVar[Check]
    CHECK_INPUT_DENSITY: _ClassVar[Check]
    CHECK_INPUT_RANGE: _ClassVar[Check]
    CHECK_INPUT_CHANGE: _ClassVar[Check]
    CHECK_PLAN_RANGE: _ClassVar[Check]
    CHECK_FREEZE: _ClassVar[Check]
    CHECK_ACTUATION: _ClassVar[Check]
    CHECK_MARGIN: _ClassVar[Check]
    CHECK_SIGNAL_STUCK: _ClassVar[Check]
    CHECK_SPEED_ACCEL: _ClassVar[Check]
    CHECK_GAP_RATE: _ClassVar[Check]
    CHECK_LEAD_FLICKER: _ClassVar[Check]
    CHECK_SPEED_REPEAT: _ClassVar[Check]
    CHECK_GAP_REPEAT: _ClassVar[Check]
    CHECK_GAP_STEP: _ClassVar[Check]
    CHECK_REL_ACCEL: _ClassVar[Check]
    CHECK_REL_UNIT: _ClassVar[Check]
    CHECK_REL_SIGN: _ClassVar[Check]

class CheckStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHECK_STATUS_UNSPECIFIED: _ClassVar[CheckStatus]
    CHECK_STATUS_SCORED: _ClassVar[CheckStatus]
    CHECK_STATUS_NOT_APPLICABLE: _ClassVar[CheckStatus]
    CHECK_STATUS_NOT_SCORED: _ClassVar[CheckStatus]
CLOCK_MODE_UNSPECIFIED: ClockMode
CLOCK_MODE_REALTIME: ClockMode
CLOCK_MODE_LOCKSTEP: ClockMode
REASON_CODE_UNSPECIFIED: ReasonCode
REASON_CODE_OOD_VETO: ReasonCode
REASON_CODE_LOW_MARGIN: ReasonCode
REASON_CODE_STALE_OBSERVATION: ReasonCode
REASON_CODE_STALE_PLAN: ReasonCode
REASON_CODE_INVALID_INPUT: ReasonCode
REASON_CODE_MODEL_ERROR: ReasonCode
REASON_CODE_FALLBACK: ReasonCode
REASON_CODE_SAFE_DEFAULT: ReasonCode
REASON_CODE_THREAT_BRAKING: ReasonCode
REASON_CODE_STANDSTILL_HOLD: ReasonCode
REASON_CODE_STOPPED_LEAD_HOLD: ReasonCode
SAFETY_STATE_UNSPECIFIED: SafetyState
SAFETY_STATE_NOMINAL: SafetyState
SAFETY_STATE_VETO_HOLD: SafetyState
SAFETY_STATE_FALLBACK_ACTIVE: SafetyState
SAFETY_STATE_RECOVERING: SafetyState
PLAN_STATE_UNSPECIFIED: PlanState
PLAN_STATE_NONE: PlanState
PLAN_STATE_VALID: PlanState
PLAN_STATE_EXPIRED: PlanState
CHECK_UNSPECIFIED: Check
CHECK_DECISION_VECTOR_DENSITY: Check
CHECK_INPUT_DENSITY: Check
CHECK_INPUT_RANGE: Check
CHECK_INPUT_CHANGE: Check
CHECK_PLAN_RANGE: Check
CHECK_FREEZE: Check
CHECK_ACTUATION: Check
CHECK_MARGIN: Check
CHECK_SIGNAL_STUCK: Check
CHECK_SPEED_ACCEL: Check
CHECK_GAP_RATE: Check
CHECK_LEAD_FLICKER: Check
CHECK_SPEED_REPEAT: Check
CHECK_GAP_REPEAT: Check
CHECK_GAP_STEP: Check
CHECK_REL_ACCEL: Check
CHECK_REL_UNIT: Check
CHECK_REL_SIGN: Check
CHECK_STATUS_UNSPECIFIED: CheckStatus
CHECK_STATUS_SCORED: CheckStatus
CHECK_STATUS_NOT_APPLICABLE: CheckStatus
CHECK_STATUS_NOT_SCORED: CheckStatus

class OpenSession(_message.Message):
    __slots__ = ("session_id", "clock", "shadow", "include_decision_vector", "expected_schema_hash", "observation_period_ns", "provided_features", "require_plan", "actual_controls_are_commands")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    SHADOW_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_DECISION_VECTOR_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SCHEMA_HASH_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_PERIOD_NS_FIELD_NUMBER: _ClassVar[int]
    PROVIDED_FEATURES_FIELD_NUMBER: _ClassVar[int]
    REQUIRE_PLAN_FIELD_NUMBER: _ClassVar[int]
    ACTUAL_CONTROLS_ARE_COMMANDS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    clock: ClockMode
    shadow: bool
    include_decision_vector: bool
    expected_schema_hash: str
    observation_period_ns: int
    provided_features: _containers.RepeatedScalarFieldContainer[str]
    require_plan: bool
    actual_controls_are_commands: bool
    def __init__(self, session_id: _Optional[str] = ..., clock: _Optional[_Union[ClockMode, str]] = ..., shadow: _Optional[bool] = ..., include_decision_vector: _Optional[bool] = ..., expected_schema_hash: _Optional[str] = ..., observation_period_ns: _Optional[int] = ..., provided_features: _Optional[_Iterable[str]] = ..., require_plan: _Optional[bool] = ..., actual_controls_are_commands: _Optional[bool] = ...) -> None: ...

class ActualAction(_message.Message):
    __slots__ = ("action_index", "controls")
    ACTION_INDEX_FIELD_NUMBER: _ClassVar[int]
    CONTROLS_FIELD_NUMBER: _ClassVar[int]
    action_index: int
    controls: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, action_index: _Optional[int] = ..., controls: _Optional[_Iterable[float]] = ...) -> None: ...

class PlanUpdate(_message.Message):
    __slots__ = ("plan_id", "values", "valid_for_ns", "created_ns")
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    VALID_FOR_NS_FIELD_NUMBER: _ClassVar[int]
    CREATED_NS_FIELD_NUMBER: _ClassVar[int]
    plan_id: str
    values: _containers.RepeatedScalarFieldContainer[float]
    valid_for_ns: int
    created_ns: int
    def __init__(self, plan_id: _Optional[str] = ..., values: _Optional[_Iterable[float]] = ..., valid_for_ns: _Optional[int] = ..., created_ns: _Optional[int] = ...) -> None: ...

class Observation(_message.Message):
    __slots__ = ("seq", "timestamp_ns", "features", "actual", "plan", "sent_time_ns", "release_standstill")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_NS_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    ACTUAL_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    SENT_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    RELEASE_STANDSTILL_FIELD_NUMBER: _ClassVar[int]
    seq: int
    timestamp_ns: int
    features: _containers.RepeatedScalarFieldContainer[float]
    actual: ActualAction
    plan: PlanUpdate
    sent_time_ns: int
    release_standstill: bool
    def __init__(self, seq: _Optional[int] = ..., timestamp_ns: _Optional[int] = ..., features: _Optional[_Iterable[float]] = ..., actual: _Optional[_Union[ActualAction, _Mapping]] = ..., plan: _Optional[_Union[PlanUpdate, _Mapping]] = ..., sent_time_ns: _Optional[int] = ..., release_standstill: _Optional[bool] = ...) -> None: ...

class DriveRequest(_message.Message):
    __slots__ = ("open", "observation")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    open: OpenSession
    observation: Observation
    def __init__(self, open: _Optional[_Union[OpenSession, _Mapping]] = ..., observation: _Optional[_Union[Observation, _Mapping]] = ...) -> None: ...

class SessionOpened(_message.Message):
    __slots__ = ("session_id", "clock", "tick_period_ns", "model", "observation_period_ns", "provided_features", "limits", "require_plan", "session_instance")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    TICK_PERIOD_NS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_PERIOD_NS_FIELD_NUMBER: _ClassVar[int]
    PROVIDED_FEATURES_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    REQUIRE_PLAN_FIELD_NUMBER: _ClassVar[int]
    SESSION_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    clock: ClockMode
    tick_period_ns: int
    model: ModelInfo
    observation_period_ns: int
    provided_features: _containers.RepeatedScalarFieldContainer[str]
    limits: SessionLimits
    require_plan: bool
    session_instance: str
    def __init__(self, session_id: _Optional[str] = ..., clock: _Optional[_Union[ClockMode, str]] = ..., tick_period_ns: _Optional[int] = ..., model: _Optional[_Union[ModelInfo, _Mapping]] = ..., observation_period_ns: _Optional[int] = ..., provided_features: _Optional[_Iterable[str]] = ..., limits: _Optional[_Union[SessionLimits, _Mapping]] = ..., require_plan: _Optional[bool] = ..., session_instance: _Optional[str] = ...) -> None: ...

class SessionLimits(_message.Message):
    __slots__ = ("max_observation_age_ns", "assumed_observation_period_ns", "default_plan_valid_for_ns", "lockstep_max_ticks", "lockstep_max_gap_ns", "hold_timeout_ns", "recovery_dwell_ns", "max_abstain_ns", "safe_action", "fallback_decel", "blind_decel", "fallback_jerk", "freeze_repeats", "min_margin", "max_receive_message_bytes", "recommended_client_window_bytes", "open_timeout_ns", "jerk_limit", "standstill_speed", "stopped_lead_rest_speed", "stopped_lead_speed", "stopped_lead_max_gap", "max_session_id_bytes", "max_plan_id_bytes", "max_observation_period_ns", "max_agents_per_stream")
    MAX_OBSERVATION_AGE_NS_FIELD_NUMBER: _ClassVar[int]
    ASSUMED_OBSERVATION_PERIOD_NS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_PLAN_VALID_FOR_NS_FIELD_NUMBER: _ClassVar[int]
    LOCKSTEP_MAX_TICKS_FIELD_NUMBER: _ClassVar[int]
    LOCKSTEP_MAX_GAP_NS_FIELD_NUMBER: _ClassVar[int]
    HOLD_TIMEOUT_NS_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_DWELL_NS_FIELD_NUMBER: _ClassVar[int]
    MAX_ABSTAIN_NS_FIELD_NUMBER: _ClassVar[int]
    SAFE_ACTION_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_DECEL_FIELD_NUMBER: _ClassVar[int]
    BLIND_DECEL_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_JERK_FIELD_NUMBER: _ClassVar[int]
    FREEZE_REPEATS_FIELD_NUMBER: _ClassVar[int]
    MIN_MARGIN_FIELD_NUMBER: _ClassVar[int]
    MAX_RECEIVE_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    RECOMMENDED_CLIENT_WINDOW_BYTES_FIELD_NUMBER: _ClassVar[int]
    OPEN_TIMEOUT_NS_FIELD_NUMBER: _ClassVar[int]
    JERK_LIMIT_FIELD_NUMBER: _ClassVar[int]
    STANDSTILL_SPEED_FIELD_NUMBER: _ClassVar[int]
    STOPPED_LEAD_REST_SPEED_FIELD_NUMBER: _ClassVar[int]
    STOPPED_LEAD_SPEED_FIELD_NUMBER: _ClassVar[int]
    STOPPED_LEAD_MAX_GAP_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSION_ID_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_PLAN_ID_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_OBSERVATION_PERIOD_NS_FIELD_NUMBER: _ClassVar[int]
    MAX_AGENTS_PER_STREAM_FIELD_NUMBER: _ClassVar[int]
    max_observation_age_ns: int
    assumed_observation_period_ns: int
    default_plan_valid_for_ns: int
    lockstep_max_ticks: int
    lockstep_max_gap_ns: int
    hold_timeout_ns: int
    recovery_dwell_ns: int
    max_abstain_ns: int
    safe_action: Action
    fallback_decel: float
    blind_decel: float
    fallback_jerk: float
    freeze_repeats: int
    min_margin: float
    max_receive_message_bytes: int
    recommended_client_window_bytes: int
    open_timeout_ns: int
    jerk_limit: float
    standstill_speed: float
    stopped_lead_rest_speed: float
    stopped_lead_speed: float
    stopped_lead_max_gap: float
    max_session_id_bytes: int
    max_plan_id_bytes: int
    max_observation_period_ns: int
    max_agents_per_stream: int
    def __init__(self, max_observation_age_ns: _Optional[int] = ..., assumed_observation_period_ns: _Optional[int] = ..., default_plan_valid_for_ns: _Optional[int] = ..., lockstep_max_ticks: _Optional[int] = ..., lockstep_max_gap_ns: _Optional[int] = ..., hold_timeout_ns: _Optional[int] = ..., recovery_dwell_ns: _Optional[int] = ..., max_abstain_ns: _Optional[int] = ..., safe_action: _Optional[_Union[Action, _Mapping]] = ..., fallback_decel: _Optional[float] = ..., blind_decel: _Optional[float] = ..., fallback_jerk: _Optional[float] = ..., freeze_repeats: _Optional[int] = ..., min_margin: _Optional[float] = ..., max_receive_message_bytes: _Optional[int] = ..., recommended_client_window_bytes: _Optional[int] = ..., open_timeout_ns: _Optional[int] = ..., jerk_limit: _Optional[float] = ..., standstill_speed: _Optional[float] = ..., stopped_lead_rest_speed: _Optional[float] = ..., stopped_lead_speed: _Optional[float] = ..., stopped_lead_max_gap: _Optional[float] = ..., max_session_id_bytes: _Optional[int] = ..., max_plan_id_bytes: _Optional[int] = ..., max_observation_period_ns: _Optional[int] = ..., max_agents_per_stream: _Optional[int] = ...) -> None: ...

class Action(_message.Message):
    __slots__ = ("index", "name", "controls")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONTROLS_FIELD_NUMBER: _ClassVar[int]
    index: int
    name: str
    controls: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, index: _Optional[int] = ..., name: _Optional[str] = ..., controls: _Optional[_Iterable[float]] = ...) -> None: ...

class Proposal(_message.Message):
    __slots__ = ("action", "probabilities", "confidence", "margin")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    PROBABILITIES_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    MARGIN_FIELD_NUMBER: _ClassVar[int]
    action: Action
    probabilities: _containers.RepeatedScalarFieldContainer[float]
    confidence: float
    margin: float
    def __init__(self, action: _Optional[_Union[Action, _Mapping]] = ..., probabilities: _Optional[_Iterable[float]] = ..., confidence: _Optional[float] = ..., margin: _Optional[float] = ...) -> None: ...

class GateResult(_message.Message):
    __slots__ = ("score", "threshold", "veto")
    SCORE_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    VETO_FIELD_NUMBER: _ClassVar[int]
    score: float
    threshold: float
    veto: bool
    def __init__(self, score: _Optional[float] = ..., threshold: _Optional[float] = ..., veto: _Optional[bool] = ...) -> None: ...

class StageTimings(_message.Message):
    __slots__ = ("preprocess_us", "forward_us", "gate_us", "postprocess_us")
    PREPROCESS_US_FIELD_NUMBER: _ClassVar[int]
    FORWARD_US_FIELD_NUMBER: _ClassVar[int]
    GATE_US_FIELD_NUMBER: _ClassVar[int]
    POSTPROCESS_US_FIELD_NUMBER: _ClassVar[int]
    preprocess_us: int
    forward_us: int
    gate_us: int
    postprocess_us: int
    def __init__(self, preprocess_us: _Optional[int] = ..., forward_us: _Optional[int] = ..., gate_us: _Optional[int] = ..., postprocess_us: _Optional[int] = ...) -> None: ...

class DecisionSnapshot(_message.Message):
    __slots__ = ("session_id", "tick", "scheduled_time_ns", "emit_time_ns", "lateness_us", "observation_seq", "observation_age_ns", "plan_id", "plan_age_ns", "model_version", "proposed", "applied", "reasons", "safety_state", "gate", "decision_vector", "input_hash", "timings", "shadow", "snapshots_dropped", "observations_dropped", "plan", "observation_held", "observation_period_ns", "snapshots_conflated_since_previous", "max_lateness_since_previous_us", "ticks_missed_since_previous", "transport_delay_ns", "observation_age_with_transport_ns", "plan_state", "plan_valid_for_ns", "invalid_input", "checks", "vetoed_by", "candidate_never_applied", "hazard_lights")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TICK_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    EMIT_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    LATENESS_US_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_SEQ_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_AGE_NS_FIELD_NUMBER: _ClassVar[int]
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    PLAN_AGE_NS_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROPOSED_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    SAFETY_STATE_FIELD_NUMBER: _ClassVar[int]
    GATE_FIELD_NUMBER: _ClassVar[int]
    DECISION_VECTOR_FIELD_NUMBER: _ClassVar[int]
    INPUT_HASH_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    SHADOW_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_HELD_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_PERIOD_NS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_CONFLATED_SINCE_PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    MAX_LATENESS_SINCE_PREVIOUS_US_FIELD_NUMBER: _ClassVar[int]
    TICKS_MISSED_SINCE_PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_DELAY_NS_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_AGE_WITH_TRANSPORT_NS_FIELD_NUMBER: _ClassVar[int]
    PLAN_STATE_FIELD_NUMBER: _ClassVar[int]
    PLAN_VALID_FOR_NS_FIELD_NUMBER: _ClassVar[int]
    INVALID_INPUT_FIELD_NUMBER: _ClassVar[int]
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    VETOED_BY_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_NEVER_APPLIED_FIELD_NUMBER: _ClassVar[int]
    HAZARD_LIGHTS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    tick: int
    scheduled_time_ns: int
    emit_time_ns: int
    lateness_us: int
    observation_seq: int
    observation_age_ns: int
    plan_id: str
    plan_age_ns: int
    model_version: str
    proposed: Proposal
    applied: Action
    reasons: _containers.RepeatedScalarFieldContainer[ReasonCode]
    safety_state: SafetyState
    gate: GateResult
    decision_vector: _containers.RepeatedScalarFieldContainer[float]
    input_hash: int
    timings: StageTimings
    shadow: bool
    snapshots_dropped: int
    observations_dropped: int
    plan: PlanSummary
    observation_held: bool
    observation_period_ns: int
    snapshots_conflated_since_previous: int
    max_lateness_since_previous_us: int
    ticks_missed_since_previous: int
    transport_delay_ns: int
    observation_age_with_transport_ns: int
    plan_state: PlanState
    plan_valid_for_ns: int
    invalid_input: _containers.RepeatedScalarFieldContainer[str]
    checks: _containers.RepeatedCompositeFieldContainer[CheckResult]
    vetoed_by: _containers.RepeatedScalarFieldContainer[Check]
    candidate_never_applied: CandidateProposal
    hazard_lights: bool
    def __init__(self, session_id: _Optional[str] = ..., tick: _Optional[int] = ..., scheduled_time_ns: _Optional[int] = ..., emit_time_ns: _Optional[int] = ..., lateness_us: _Optional[int] = ..., observation_seq: _Optional[int] = ..., observation_age_ns: _Optional[int] = ..., plan_id: _Optional[str] = ..., plan_age_ns: _Optional[int] = ..., model_version: _Optional[str] = ..., proposed: _Optional[_Union[Proposal, _Mapping]] = ..., applied: _Optional[_Union[Action, _Mapping]] = ..., reasons: _Optional[_Iterable[_Union[ReasonCode, str]]] = ..., safety_state: _Optional[_Union[SafetyState, str]] = ..., gate: _Optional[_Union[GateResult, _Mapping]] = ..., decision_vector: _Optional[_Iterable[float]] = ..., input_hash: _Optional[int] = ..., timings: _Optional[_Union[StageTimings, _Mapping]] = ..., shadow: _Optional[bool] = ..., snapshots_dropped: _Optional[int] = ..., observations_dropped: _Optional[int] = ..., plan: _Optional[_Union[PlanSummary, _Mapping]] = ..., observation_held: _Optional[bool] = ..., observation_period_ns: _Optional[int] = ..., snapshots_conflated_since_previous: _Optional[int] = ..., max_lateness_since_previous_us: _Optional[int] = ..., ticks_missed_since_previous: _Optional[int] = ..., transport_delay_ns: _Optional[int] = ..., observation_age_with_transport_ns: _Optional[int] = ..., plan_state: _Optional[_Union[PlanState, str]] = ..., plan_valid_for_ns: _Optional[int] = ..., invalid_input: _Optional[_Iterable[str]] = ..., checks: _Optional[_Iterable[_Union[CheckResult, _Mapping]]] = ..., vetoed_by: _Optional[_Iterable[_Union[Check, str]]] = ..., candidate_never_applied: _Optional[_Union[CandidateProposal, _Mapping]] = ..., hazard_lights: _Optional[bool] = ...) -> None: ...

class CandidateProposal(_message.Message):
    __slots__ = ("model_version", "action", "confidence", "margin")
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    MARGIN_FIELD_NUMBER: _ClassVar[int]
    model_version: str
    action: Action
    confidence: float
    margin: float
    def __init__(self, model_version: _Optional[str] = ..., action: _Optional[_Union[Action, _Mapping]] = ..., confidence: _Optional[float] = ..., margin: _Optional[float] = ...) -> None: ...

class CheckResult(_message.Message):
    __slots__ = ("check", "name", "score", "threshold", "veto", "status")
    CHECK_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    VETO_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    check: Check
    name: str
    score: float
    threshold: float
    veto: bool
    status: CheckStatus
    def __init__(self, check: _Optional[_Union[Check, str]] = ..., name: _Optional[str] = ..., score: _Optional[float] = ..., threshold: _Optional[float] = ..., veto: _Optional[bool] = ..., status: _Optional[_Union[CheckStatus, str]] = ...) -> None: ...

class PlanSummary(_message.Message):
    __slots__ = ("source", "behaviour", "target_speed", "target_lane_offset")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    BEHAVIOUR_FIELD_NUMBER: _ClassVar[int]
    TARGET_SPEED_FIELD_NUMBER: _ClassVar[int]
    TARGET_LANE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    source: str
    behaviour: str
    target_speed: float
    target_lane_offset: float
    def __init__(self, source: _Optional[str] = ..., behaviour: _Optional[str] = ..., target_speed: _Optional[float] = ..., target_lane_offset: _Optional[float] = ...) -> None: ...

class DriveResponse(_message.Message):
    __slots__ = ("opened", "snapshot")
    OPENED_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    opened: SessionOpened
    snapshot: DecisionSnapshot
    def __init__(self, opened: _Optional[_Union[SessionOpened, _Mapping]] = ..., snapshot: _Optional[_Union[DecisionSnapshot, _Mapping]] = ...) -> None: ...

class GetModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetModelInfoResponse(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: ModelInfo
    def __init__(self, model: _Optional[_Union[ModelInfo, _Mapping]] = ...) -> None: ...

class FeatureSpec(_message.Message):
    __slots__ = ("name", "unit", "mean", "std")
    NAME_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    MEAN_FIELD_NUMBER: _ClassVar[int]
    STD_FIELD_NUMBER: _ClassVar[int]
    name: str
    unit: str
    mean: float
    std: float
    def __init__(self, name: _Optional[str] = ..., unit: _Optional[str] = ..., mean: _Optional[float] = ..., std: _Optional[float] = ...) -> None: ...

class ControlSpec(_message.Message):
    __slots__ = ("name", "unit", "min", "max")
    NAME_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    name: str
    unit: str
    min: float
    max: float
    def __init__(self, name: _Optional[str] = ..., unit: _Optional[str] = ..., min: _Optional[float] = ..., max: _Optional[float] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("model_version", "size_class", "features", "plan", "actions", "controls", "decision_vector_output", "decision_vector_size", "schema_hash", "tick_period_ns", "gate_version", "gate_source", "planner", "history_features")
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SIZE_CLASS_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    CONTROLS_FIELD_NUMBER: _ClassVar[int]
    DECISION_VECTOR_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    DECISION_VECTOR_SIZE_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_HASH_FIELD_NUMBER: _ClassVar[int]
    TICK_PERIOD_NS_FIELD_NUMBER: _ClassVar[int]
    GATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    GATE_SOURCE_FIELD_NUMBER: _ClassVar[int]
    PLANNER_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FEATURES_FIELD_NUMBER: _ClassVar[int]
    model_version: str
    size_class: str
    features: _containers.RepeatedCompositeFieldContainer[FeatureSpec]
    plan: _containers.RepeatedCompositeFieldContainer[FeatureSpec]
    actions: _containers.RepeatedScalarFieldContainer[str]
    controls: _containers.RepeatedCompositeFieldContainer[ControlSpec]
    decision_vector_output: str
    decision_vector_size: int
    schema_hash: str
    tick_period_ns: int
    gate_version: str
    gate_source: str
    planner: str
    history_features: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model_version: _Optional[str] = ..., size_class: _Optional[str] = ..., features: _Optional[_Iterable[_Union[FeatureSpec, _Mapping]]] = ..., plan: _Optional[_Iterable[_Union[FeatureSpec, _Mapping]]] = ..., actions: _Optional[_Iterable[str]] = ..., controls: _Optional[_Iterable[_Union[ControlSpec, _Mapping]]] = ..., decision_vector_output: _Optional[str] = ..., decision_vector_size: _Optional[int] = ..., schema_hash: _Optional[str] = ..., tick_period_ns: _Optional[int] = ..., gate_version: _Optional[str] = ..., gate_source: _Optional[str] = ..., planner: _Optional[str] = ..., history_features: _Optional[_Iterable[str]] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ("reset",)
    RESET_FIELD_NUMBER: _ClassVar[int]
    reset: bool
    def __init__(self, reset: _Optional[bool] = ...) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("ticks", "missed_deadlines", "lateness_p50_us", "lateness_p99_us", "lateness_p999_us", "lateness_max_us", "lateness_bucket_upper_us", "lateness_histogram", "sessions_open", "sessions_opened", "snapshots_sent", "scheduling", "window_s", "ticks_total", "missed_deadlines_total", "uptime_s", "snapshots_sent_total", "records_dropped_total", "recorder_queue_bytes", "candidate")
    TICKS_FIELD_NUMBER: _ClassVar[int]
    MISSED_DEADLINES_FIELD_NUMBER: _ClassVar[int]
    LATENESS_P50_US_FIELD_NUMBER: _ClassVar[int]
    LATENESS_P99_US_FIELD_NUMBER: _ClassVar[int]
    LATENESS_P999_US_FIELD_NUMBER: _ClassVar[int]
    LATENESS_MAX_US_FIELD_NUMBER: _ClassVar[int]
    LATENESS_BUCKET_UPPER_US_FIELD_NUMBER: _ClassVar[int]
    LATENESS_HISTOGRAM_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_OPEN_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_OPENED_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_SENT_FIELD_NUMBER: _ClassVar[int]
    SCHEDULING_FIELD_NUMBER: _ClassVar[int]
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    TICKS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    MISSED_DEADLINES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_SENT_TOTAL_FIELD_NUMBER: _ClassVar[int]
    RECORDS_DROPPED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    RECORDER_QUEUE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    ticks: int
    missed_deadlines: int
    lateness_p50_us: float
    lateness_p99_us: float
    lateness_p999_us: float
    lateness_max_us: float
    lateness_bucket_upper_us: _containers.RepeatedScalarFieldContainer[float]
    lateness_histogram: _containers.RepeatedScalarFieldContainer[int]
    sessions_open: int
    sessions_opened: int
    snapshots_sent: int
    scheduling: str
    window_s: float
    ticks_total: int
    missed_deadlines_total: int
    uptime_s: float
    snapshots_sent_total: int
    records_dropped_total: int
    recorder_queue_bytes: int
    candidate: CandidateStatus
    def __init__(self, ticks: _Optional[int] = ..., missed_deadlines: _Optional[int] = ..., lateness_p50_us: _Optional[float] = ..., lateness_p99_us: _Optional[float] = ..., lateness_p999_us: _Optional[float] = ..., lateness_max_us: _Optional[float] = ..., lateness_bucket_upper_us: _Optional[_Iterable[float]] = ..., lateness_histogram: _Optional[_Iterable[int]] = ..., sessions_open: _Optional[int] = ..., sessions_opened: _Optional[int] = ..., snapshots_sent: _Optional[int] = ..., scheduling: _Optional[str] = ..., window_s: _Optional[float] = ..., ticks_total: _Optional[int] = ..., missed_deadlines_total: _Optional[int] = ..., uptime_s: _Optional[float] = ..., snapshots_sent_total: _Optional[int] = ..., records_dropped_total: _Optional[int] = ..., recorder_queue_bytes: _Optional[int] = ..., candidate: _Optional[_Union[CandidateStatus, _Mapping]] = ...) -> None: ...

class CandidateStatus(_message.Message):
    __slots__ = ("version", "paused", "forward_median_us", "measured_batch", "model_budget_us")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    FORWARD_MEDIAN_US_FIELD_NUMBER: _ClassVar[int]
    MEASURED_BATCH_FIELD_NUMBER: _ClassVar[int]
    MODEL_BUDGET_US_FIELD_NUMBER: _ClassVar[int]
    version: str
    paused: str
    forward_median_us: float
    measured_batch: int
    model_budget_us: float
    def __init__(self, version: _Optional[str] = ..., paused: _Optional[str] = ..., forward_median_us: _Optional[float] = ..., measured_batch: _Optional[int] = ..., model_budget_us: _Optional[float] = ...) -> None: ...

class GetShadowStatsRequest(_message.Message):
    __slots__ = ("session_id", "reset", "session_instance")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RESET_FIELD_NUMBER: _ClassVar[int]
    SESSION_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    reset: bool
    session_instance: str
    def __init__(self, session_id: _Optional[str] = ..., reset: _Optional[bool] = ..., session_instance: _Optional[str] = ...) -> None: ...

class AgreementGroup(_message.Message):
    __slots__ = ("key", "ticks", "agreeing", "control_mae", "control_rmse")
    KEY_FIELD_NUMBER: _ClassVar[int]
    TICKS_FIELD_NUMBER: _ClassVar[int]
    AGREEING_FIELD_NUMBER: _ClassVar[int]
    CONTROL_MAE_FIELD_NUMBER: _ClassVar[int]
    CONTROL_RMSE_FIELD_NUMBER: _ClassVar[int]
    key: str
    ticks: int
    agreeing: int
    control_mae: _containers.RepeatedScalarFieldContainer[float]
    control_rmse: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, key: _Optional[str] = ..., ticks: _Optional[int] = ..., agreeing: _Optional[int] = ..., control_mae: _Optional[_Iterable[float]] = ..., control_rmse: _Optional[_Iterable[float]] = ...) -> None: ...

class GetShadowStatsResponse(_message.Message):
    __slots__ = ("session_id", "actions", "confusion", "groups", "ticks_without_actual", "proposed_confusion", "proposed_groups", "session_instance", "ticks_invalid_actual_controls", "candidate")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    CONFUSION_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    TICKS_WITHOUT_ACTUAL_FIELD_NUMBER: _ClassVar[int]
    PROPOSED_CONFUSION_FIELD_NUMBER: _ClassVar[int]
    PROPOSED_GROUPS_FIELD_NUMBER: _ClassVar[int]
    SESSION_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    TICKS_INVALID_ACTUAL_CONTROLS_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    actions: _containers.RepeatedScalarFieldContainer[str]
    confusion: _containers.RepeatedScalarFieldContainer[int]
    groups: _containers.RepeatedCompositeFieldContainer[AgreementGroup]
    ticks_without_actual: int
    proposed_confusion: _containers.RepeatedScalarFieldContainer[int]
    proposed_groups: _containers.RepeatedCompositeFieldContainer[AgreementGroup]
    session_instance: str
    ticks_invalid_actual_controls: int
    candidate: CandidateAgreement
    def __init__(self, session_id: _Optional[str] = ..., actions: _Optional[_Iterable[str]] = ..., confusion: _Optional[_Iterable[int]] = ..., groups: _Optional[_Iterable[_Union[AgreementGroup, _Mapping]]] = ..., ticks_without_actual: _Optional[int] = ..., proposed_confusion: _Optional[_Iterable[int]] = ..., proposed_groups: _Optional[_Iterable[_Union[AgreementGroup, _Mapping]]] = ..., session_instance: _Optional[str] = ..., ticks_invalid_actual_controls: _Optional[int] = ..., candidate: _Optional[_Union[CandidateAgreement, _Mapping]] = ...) -> None: ...

class CandidateAgreement(_message.Message):
    __slots__ = ("candidate_version", "live_version", "ticks", "compared", "agreeing_with_live_proposed", "agreeing_with_applied", "migration", "control_mad", "with_actual", "live_agreeing_with_actual", "candidate_agreeing_with_actual")
    CANDIDATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    LIVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    TICKS_FIELD_NUMBER: _ClassVar[int]
    COMPARED_FIELD_NUMBER: _ClassVar[int]
    AGREEING_WITH_LIVE_PROPOSED_FIELD_NUMBER: _ClassVar[int]
    AGREEING_WITH_APPLIED_FIELD_NUMBER: _ClassVar[int]
    MIGRATION_FIELD_NUMBER: _ClassVar[int]
    CONTROL_MAD_FIELD_NUMBER: _ClassVar[int]
    WITH_ACTUAL_FIELD_NUMBER: _ClassVar[int]
    LIVE_AGREEING_WITH_ACTUAL_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_AGREEING_WITH_ACTUAL_FIELD_NUMBER: _ClassVar[int]
    candidate_version: str
    live_version: str
    ticks: int
    compared: int
    agreeing_with_live_proposed: int
    agreeing_with_applied: int
    migration: _containers.RepeatedScalarFieldContainer[int]
    control_mad: _containers.RepeatedScalarFieldContainer[float]
    with_actual: int
    live_agreeing_with_actual: int
    candidate_agreeing_with_actual: int
    def __init__(self, candidate_version: _Optional[str] = ..., live_version: _Optional[str] = ..., ticks: _Optional[int] = ..., compared: _Optional[int] = ..., agreeing_with_live_proposed: _Optional[int] = ..., agreeing_with_applied: _Optional[int] = ..., migration: _Optional[_Iterable[int]] = ..., control_mad: _Optional[_Iterable[float]] = ..., with_actual: _Optional[int] = ..., live_agreeing_with_actual: _Optional[int] = ..., candidate_agreeing_with_actual: _Optional[int] = ...) -> None: ...

class LoadCandidateRequest(_message.Message):
    __slots__ = ("model_path", "gate_paths", "promote")
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    GATE_PATHS_FIELD_NUMBER: _ClassVar[int]
    PROMOTE_FIELD_NUMBER: _ClassVar[int]
    model_path: str
    gate_paths: _containers.RepeatedScalarFieldContainer[str]
    promote: bool
    def __init__(self, model_path: _Optional[str] = ..., gate_paths: _Optional[_Iterable[str]] = ..., promote: _Optional[bool] = ...) -> None: ...

class LoadCandidateResponse(_message.Message):
    __slots__ = ("candidate_version", "live_version", "sessions_open", "promoted", "worker_pid", "candidate")
    CANDIDATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    LIVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_OPEN_FIELD_NUMBER: _ClassVar[int]
    PROMOTED_FIELD_NUMBER: _ClassVar[int]
    WORKER_PID_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    candidate_version: str
    live_version: str
    sessions_open: int
    promoted: bool
    worker_pid: int
    candidate: CandidateStatus
    def __init__(self, candidate_version: _Optional[str] = ..., live_version: _Optional[str] = ..., sessions_open: _Optional[int] = ..., promoted: _Optional[bool] = ..., worker_pid: _Optional[int] = ..., candidate: _Optional[_Union[CandidateStatus, _Mapping]] = ...) -> None: ...

class PromoteCandidateRequest(_message.Message):
    __slots__ = ("expected_version",)
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    expected_version: str
    def __init__(self, expected_version: _Optional[str] = ...) -> None: ...

class PromoteCandidateResponse(_message.Message):
    __slots__ = ("previous_version", "model_version", "sessions_kept", "worker_pid")
    PREVIOUS_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_KEPT_FIELD_NUMBER: _ClassVar[int]
    WORKER_PID_FIELD_NUMBER: _ClassVar[int]
    previous_version: str
    model_version: str
    sessions_kept: int
    worker_pid: int
    def __init__(self, previous_version: _Optional[str] = ..., model_version: _Optional[str] = ..., sessions_kept: _Optional[int] = ..., worker_pid: _Optional[int] = ...) -> None: ...

class AgentObservation(_message.Message):
    __slots__ = ("session_id", "observation")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    observation: Observation
    def __init__(self, session_id: _Optional[str] = ..., observation: _Optional[_Union[Observation, _Mapping]] = ...) -> None: ...

class DriveAgentsRequest(_message.Message):
    __slots__ = ("join", "observations", "leave", "observation_columns", "snapshot_columns")
    JOIN_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    LEAVE_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    join: _containers.RepeatedCompositeFieldContainer[OpenSession]
    observations: _containers.RepeatedCompositeFieldContainer[AgentObservation]
    leave: _containers.RepeatedScalarFieldContainer[str]
    observation_columns: ObservationColumns
    snapshot_columns: bool
    def __init__(self, join: _Optional[_Iterable[_Union[OpenSession, _Mapping]]] = ..., observations: _Optional[_Iterable[_Union[AgentObservation, _Mapping]]] = ..., leave: _Optional[_Iterable[str]] = ..., observation_columns: _Optional[_Union[ObservationColumns, _Mapping]] = ..., snapshot_columns: _Optional[bool] = ...) -> None: ...

class AgentError(_message.Message):
    __slots__ = ("session_id", "code", "message")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    code: int
    message: str
    def __init__(self, session_id: _Optional[str] = ..., code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class DriveAgentsResponse(_message.Message):
    __slots__ = ("opened", "errors", "snapshots", "left", "tick", "agent_snapshots_dropped", "model", "limits", "tick_period_ns", "columns")
    OPENED_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    LEFT_FIELD_NUMBER: _ClassVar[int]
    TICK_FIELD_NUMBER: _ClassVar[int]
    AGENT_SNAPSHOTS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    TICK_PERIOD_NS_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    opened: _containers.RepeatedCompositeFieldContainer[SessionOpened]
    errors: _containers.RepeatedCompositeFieldContainer[AgentError]
    snapshots: _containers.RepeatedCompositeFieldContainer[DecisionSnapshot]
    left: _containers.RepeatedScalarFieldContainer[str]
    tick: int
    agent_snapshots_dropped: int
    model: ModelInfo
    limits: SessionLimits
    tick_period_ns: int
    columns: SnapshotColumns
    def __init__(self, opened: _Optional[_Iterable[_Union[SessionOpened, _Mapping]]] = ..., errors: _Optional[_Iterable[_Union[AgentError, _Mapping]]] = ..., snapshots: _Optional[_Iterable[_Union[DecisionSnapshot, _Mapping]]] = ..., left: _Optional[_Iterable[str]] = ..., tick: _Optional[int] = ..., agent_snapshots_dropped: _Optional[int] = ..., model: _Optional[_Union[ModelInfo, _Mapping]] = ..., limits: _Optional[_Union[SessionLimits, _Mapping]] = ..., tick_period_ns: _Optional[int] = ..., columns: _Optional[_Union[SnapshotColumns, _Mapping]] = ...) -> None: ...

class ObservationColumns(_message.Message):
    __slots__ = ("session_id", "seq", "timestamp_ns", "features_count", "features", "sent_time_ns", "release_standstill", "has_plan", "plan_id", "plan_values_count", "plan_values", "plan_valid_for_ns", "plan_created_ns", "has_actual", "actual_index", "actual_controls_count", "actual_controls")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_NS_FIELD_NUMBER: _ClassVar[int]
    FEATURES_COUNT_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    SENT_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    RELEASE_STANDSTILL_FIELD_NUMBER: _ClassVar[int]
    HAS_PLAN_FIELD_NUMBER: _ClassVar[int]
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    PLAN_VALUES_COUNT_FIELD_NUMBER: _ClassVar[int]
    PLAN_VALUES_FIELD_NUMBER: _ClassVar[int]
    PLAN_VALID_FOR_NS_FIELD_NUMBER: _ClassVar[int]
    PLAN_CREATED_NS_FIELD_NUMBER: _ClassVar[int]
    HAS_ACTUAL_FIELD_NUMBER: _ClassVar[int]
    ACTUAL_INDEX_FIELD_NUMBER: _ClassVar[int]
    ACTUAL_CONTROLS_COUNT_FIELD_NUMBER: _ClassVar[int]
    ACTUAL_CONTROLS_FIELD_NUMBER: _ClassVar[int]
    session_id: _containers.RepeatedScalarFieldContainer[str]
    seq: _containers.RepeatedScalarFieldContainer[int]
    timestamp_ns: _containers.RepeatedScalarFieldContainer[int]
    features_count: _containers.RepeatedScalarFieldContainer[int]
    features: _containers.RepeatedScalarFieldContainer[float]
    sent_time_ns: _containers.RepeatedScalarFieldContainer[int]
    release_standstill: _containers.RepeatedScalarFieldContainer[bool]
    has_plan: _containers.RepeatedScalarFieldContainer[bool]
    plan_id: _containers.RepeatedScalarFieldContainer[str]
    plan_values_count: _containers.RepeatedScalarFieldContainer[int]
    plan_values: _containers.RepeatedScalarFieldContainer[float]
    plan_valid_for_ns: _containers.RepeatedScalarFieldContainer[int]
    plan_created_ns: _containers.RepeatedScalarFieldContainer[int]
    has_actual: _containers.RepeatedScalarFieldContainer[bool]
    actual_index: _containers.RepeatedScalarFieldContainer[int]
    actual_controls_count: _containers.RepeatedScalarFieldContainer[int]
    actual_controls: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, session_id: _Optional[_Iterable[str]] = ..., seq: _Optional[_Iterable[int]] = ..., timestamp_ns: _Optional[_Iterable[int]] = ..., features_count: _Optional[_Iterable[int]] = ..., features: _Optional[_Iterable[float]] = ..., sent_time_ns: _Optional[_Iterable[int]] = ..., release_standstill: _Optional[_Iterable[bool]] = ..., has_plan: _Optional[_Iterable[bool]] = ..., plan_id: _Optional[_Iterable[str]] = ..., plan_values_count: _Optional[_Iterable[int]] = ..., plan_values: _Optional[_Iterable[float]] = ..., plan_valid_for_ns: _Optional[_Iterable[int]] = ..., plan_created_ns: _Optional[_Iterable[int]] = ..., has_actual: _Optional[_Iterable[bool]] = ..., actual_index: _Optional[_Iterable[int]] = ..., actual_controls_count: _Optional[_Iterable[int]] = ..., actual_controls: _Optional[_Iterable[float]] = ...) -> None: ...

class SnapshotColumns(_message.Message):
    __slots__ = ("session_id", "tick", "scheduled_time_ns", "emit_time_ns", "lateness_us", "observation_seq", "observation_age_ns", "plan_id", "plan_age_ns", "model_version", "proposed_index", "proposed_name", "proposed_controls_count", "proposed_controls", "probabilities_count", "probabilities", "confidence", "margin", "applied_index", "applied_name", "applied_controls_count", "applied_controls", "reasons_count", "reasons", "safety_state", "has_gate", "gate_score", "gate_threshold", "gate_veto", "decision_vector_count", "decision_vector", "input_hash", "preprocess_us", "forward_us", "gate_us", "postprocess_us", "shadow", "snapshots_dropped", "observations_dropped", "observation_held", "observation_period_ns", "plan_state", "plan_valid_for_ns", "checks_count", "check", "check_score", "check_threshold", "check_veto", "check_status", "snapshots_conflated_since_previous", "max_lateness_since_previous_us", "ticks_missed_since_previous", "has_transport_delay", "transport_delay_ns", "observation_age_with_transport_ns", "invalid_input_count", "invalid_input", "has_candidate", "candidate_model_version", "candidate_index", "candidate_name", "candidate_controls_count", "candidate_controls", "candidate_confidence", "candidate_margin", "hazard_lights")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TICK_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    EMIT_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    LATENESS_US_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_SEQ_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_AGE_NS_FIELD_NUMBER: _ClassVar[int]
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    PLAN_AGE_NS_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROPOSED_INDEX_FIELD_NUMBER: _ClassVar[int]
    PROPOSED_NAME_FIELD_NUMBER: _ClassVar[int]
    PROPOSED_CONTROLS_COUNT_FIELD_NUMBER: _ClassVar[int]
    PROPOSED_CONTROLS_FIELD_NUMBER: _ClassVar[int]
    PROBABILITIES_COUNT_FIELD_NUMBER: _ClassVar[int]
    PROBABILITIES_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    MARGIN_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    APPLIED_NAME_FIELD_NUMBER: _ClassVar[int]
    APPLIED_CONTROLS_COUNT_FIELD_NUMBER: _ClassVar[int]
    APPLIED_CONTROLS_FIELD_NUMBER: _ClassVar[int]
    REASONS_COUNT_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    SAFETY_STATE_FIELD_NUMBER: _ClassVar[int]
    HAS_GATE_FIELD_NUMBER: _ClassVar[int]
    GATE_SCORE_FIELD_NUMBER: _ClassVar[int]
    GATE_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    GATE_VETO_FIELD_NUMBER: _ClassVar[int]
    DECISION_VECTOR_COUNT_FIELD_NUMBER: _ClassVar[int]
    DECISION_VECTOR_FIELD_NUMBER: _ClassVar[int]
    INPUT_HASH_FIELD_NUMBER: _ClassVar[int]
    PREPROCESS_US_FIELD_NUMBER: _ClassVar[int]
    FORWARD_US_FIELD_NUMBER: _ClassVar[int]
    GATE_US_FIELD_NUMBER: _ClassVar[int]
    POSTPROCESS_US_FIELD_NUMBER: _ClassVar[int]
    SHADOW_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_HELD_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_PERIOD_NS_FIELD_NUMBER: _ClassVar[int]
    PLAN_STATE_FIELD_NUMBER: _ClassVar[int]
    PLAN_VALID_FOR_NS_FIELD_NUMBER: _ClassVar[int]
    CHECKS_COUNT_FIELD_NUMBER: _ClassVar[int]
    CHECK_FIELD_NUMBER: _ClassVar[int]
    CHECK_SCORE_FIELD_NUMBER: _ClassVar[int]
    CHECK_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    CHECK_VETO_FIELD_NUMBER: _ClassVar[int]
    CHECK_STATUS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_CONFLATED_SINCE_PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    MAX_LATENESS_SINCE_PREVIOUS_US_FIELD_NUMBER: _ClassVar[int]
    TICKS_MISSED_SINCE_PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    HAS_TRANSPORT_DELAY_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_DELAY_NS_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_AGE_WITH_TRANSPORT_NS_FIELD_NUMBER: _ClassVar[int]
    INVALID_INPUT_COUNT_FIELD_NUMBER: _ClassVar[int]
    INVALID_INPUT_FIELD_NUMBER: _ClassVar[int]
    HAS_CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_INDEX_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_NAME_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_CONTROLS_COUNT_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_CONTROLS_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_MARGIN_FIELD_NUMBER: _ClassVar[int]
    HAZARD_LIGHTS_FIELD_NUMBER: _ClassVar[int]
    session_id: _containers.RepeatedScalarFieldContainer[str]
    tick: _containers.RepeatedScalarFieldContainer[int]
    scheduled_time_ns: _containers.RepeatedScalarFieldContainer[int]
    emit_time_ns: _containers.RepeatedScalarFieldContainer[int]
    lateness_us: _containers.RepeatedScalarFieldContainer[int]
    observation_seq: _containers.RepeatedScalarFieldContainer[int]
    observation_age_ns: _containers.RepeatedScalarFieldContainer[int]
    plan_id: _containers.RepeatedScalarFieldContainer[str]
    plan_age_ns: _containers.RepeatedScalarFieldContainer[int]
    model_version: _containers.RepeatedScalarFieldContainer[str]
    proposed_index: _containers.RepeatedScalarFieldContainer[int]
    proposed_name: _containers.RepeatedScalarFieldContainer[str]
    proposed_controls_count: _containers.RepeatedScalarFieldContainer[int]
    proposed_controls: _containers.RepeatedScalarFieldContainer[float]
    probabilities_count: _containers.RepeatedScalarFieldContainer[int]
    probabilities: _containers.RepeatedScalarFieldContainer[float]
    confidence: _containers.RepeatedScalarFieldContainer[float]
    margin: _containers.RepeatedScalarFieldContainer[float]
    applied_index: _containers.RepeatedScalarFieldContainer[int]
    applied_name: _containers.RepeatedScalarFieldContainer[str]
    applied_controls_count: _containers.RepeatedScalarFieldContainer[int]
    applied_controls: _containers.RepeatedScalarFieldContainer[float]
    reasons_count: _containers.RepeatedScalarFieldContainer[int]
    reasons: _containers.RepeatedScalarFieldContainer[ReasonCode]
    safety_state: _containers.RepeatedScalarFieldContainer[SafetyState]
    has_gate: _containers.RepeatedScalarFieldContainer[bool]
    gate_score: _containers.RepeatedScalarFieldContainer[float]
    gate_threshold: _containers.RepeatedScalarFieldContainer[float]
    gate_veto: _containers.RepeatedScalarFieldContainer[bool]
    decision_vector_count: _containers.RepeatedScalarFieldContainer[int]
    decision_vector: _containers.RepeatedScalarFieldContainer[float]
    input_hash: _containers.RepeatedScalarFieldContainer[int]
    preprocess_us: _containers.RepeatedScalarFieldContainer[int]
    forward_us: _containers.RepeatedScalarFieldContainer[int]
    gate_us: _containers.RepeatedScalarFieldContainer[int]
    postprocess_us: _containers.RepeatedScalarFieldContainer[int]
    shadow: _containers.RepeatedScalarFieldContainer[bool]
    snapshots_dropped: _containers.RepeatedScalarFieldContainer[int]
    observations_dropped: _containers.RepeatedScalarFieldContainer[int]
    observation_held: _containers.RepeatedScalarFieldContainer[bool]
    observation_period_ns: _containers.RepeatedScalarFieldContainer[int]
    plan_state: _containers.RepeatedScalarFieldContainer[PlanState]
    plan_valid_for_ns: _containers.RepeatedScalarFieldContainer[int]
    checks_count: _containers.RepeatedScalarFieldContainer[int]
    check: _containers.RepeatedScalarFieldContainer[Check]
    check_score: _containers.RepeatedScalarFieldContainer[float]
    check_threshold: _containers.RepeatedScalarFieldContainer[float]
    check_veto: _containers.RepeatedScalarFieldContainer[bool]
    check_status: _containers.RepeatedScalarFieldContainer[CheckStatus]
    snapshots_conflated_since_previous: _containers.RepeatedScalarFieldContainer[int]
    max_lateness_since_previous_us: _containers.RepeatedScalarFieldContainer[int]
    ticks_missed_since_previous: _containers.RepeatedScalarFieldContainer[int]
    has_transport_delay: _containers.RepeatedScalarFieldContainer[bool]
    transport_delay_ns: _containers.RepeatedScalarFieldContainer[int]
    observation_age_with_transport_ns: _containers.RepeatedScalarFieldContainer[int]
    invalid_input_count: _containers.RepeatedScalarFieldContainer[int]
    invalid_input: _containers.RepeatedScalarFieldContainer[str]
    has_candidate: _containers.RepeatedScalarFieldContainer[bool]
    candidate_model_version: _containers.RepeatedScalarFieldContainer[str]
    candidate_index: _containers.RepeatedScalarFieldContainer[int]
    candidate_name: _containers.RepeatedScalarFieldContainer[str]
    candidate_controls_count: _containers.RepeatedScalarFieldContainer[int]
    candidate_controls: _containers.RepeatedScalarFieldContainer[float]
    candidate_confidence: _containers.RepeatedScalarFieldContainer[float]
    candidate_margin: _containers.RepeatedScalarFieldContainer[float]
    hazard_lights: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, session_id: _Optional[_Iterable[str]] = ..., tick: _Optional[_Iterable[int]] = ..., scheduled_time_ns: _Optional[_Iterable[int]] = ..., emit_time_ns: _Optional[_Iterable[int]] = ..., lateness_us: _Optional[_Iterable[int]] = ..., observation_seq: _Optional[_Iterable[int]] = ..., observation_age_ns: _Optional[_Iterable[int]] = ..., plan_id: _Optional[_Iterable[str]] = ..., plan_age_ns: _Optional[_Iterable[int]] = ..., model_version: _Optional[_Iterable[str]] = ..., proposed_index: _Optional[_Iterable[int]] = ..., proposed_name: _Optional[_Iterable[str]] = ..., proposed_controls_count: _Optional[_Iterable[int]] = ..., proposed_controls: _Optional[_Iterable[float]] = ..., probabilities_count: _Optional[_Iterable[int]] = ..., probabilities: _Optional[_Iterable[float]] = ..., confidence: _Optional[_Iterable[float]] = ..., margin: _Optional[_Iterable[float]] = ..., applied_index: _Optional[_Iterable[int]] = ..., applied_name: _Optional[_Iterable[str]] = ..., applied_controls_count: _Optional[_Iterable[int]] = ..., applied_controls: _Optional[_Iterable[float]] = ..., reasons_count: _Optional[_Iterable[int]] = ..., reasons: _Optional[_Iterable[_Union[ReasonCode, str]]] = ..., safety_state: _Optional[_Iterable[_Union[SafetyState, str]]] = ..., has_gate: _Optional[_Iterable[bool]] = ..., gate_score: _Optional[_Iterable[float]] = ..., gate_threshold: _Optional[_Iterable[float]] = ..., gate_veto: _Optional[_Iterable[bool]] = ..., decision_vector_count: _Optional[_Iterable[int]] = ..., decision_vector: _Optional[_Iterable[float]] = ..., input_hash: _Optional[_Iterable[int]] = ..., preprocess_us: _Optional[_Iterable[int]] = ..., forward_us: _Optional[_Iterable[int]] = ..., gate_us: _Optional[_Iterable[int]] = ..., postprocess_us: _Optional[_Iterable[int]] = ..., shadow: _Optional[_Iterable[bool]] = ..., snapshots_dropped: _Optional[_Iterable[int]] = ..., observations_dropped: _Optional[_Iterable[int]] = ..., observation_held: _Optional[_Iterable[bool]] = ..., observation_period_ns: _Optional[_Iterable[int]] = ..., plan_state: _Optional[_Iterable[_Union[PlanState, str]]] = ..., plan_valid_for_ns: _Optional[_Iterable[int]] = ..., checks_count: _Optional[_Iterable[int]] = ..., check: _Optional[_Iterable[_Union[Check, str]]] = ..., check_score: _Optional[_Iterable[float]] = ..., check_threshold: _Optional[_Iterable[float]] = ..., check_veto: _Optional[_Iterable[bool]] = ..., check_status: _Optional[_Iterable[_Union[CheckStatus, str]]] = ..., snapshots_conflated_since_previous: _Optional[_Iterable[int]] = ..., max_lateness_since_previous_us: _Optional[_Iterable[int]] = ..., ticks_missed_since_previous: _Optional[_Iterable[int]] = ..., has_transport_delay: _Optional[_Iterable[bool]] = ..., transport_delay_ns: _Optional[_Iterable[int]] = ..., observation_age_with_transport_ns: _Optional[_Iterable[int]] = ..., invalid_input_count: _Optional[_Iterable[int]] = ..., invalid_input: _Optional[_Iterable[str]] = ..., has_candidate: _Optional[_Iterable[bool]] = ..., candidate_model_version: _Optional[_Iterable[str]] = ..., candidate_index: _Optional[_Iterable[int]] = ..., candidate_name: _Optional[_Iterable[str]] = ..., candidate_controls_count: _Optional[_Iterable[int]] = ..., candidate_controls: _Optional[_Iterable[float]] = ..., candidate_confidence: _Optional[_Iterable[float]] = ..., candidate_margin: _Optional[_Iterable[float]] = ..., hazard_lights: _Optional[_Iterable[bool]] = ...) -> None: ...
