from dualloop.v2 import controller_pb2 as _controller_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SessionHeader(_message.Message):
    __slots__ = ("session_id", "clock", "shadow", "model_version", "model_schema_hash", "gate_version", "config_json", "source", "start_time_unix_ns", "format_version", "feature_names", "measured_features", "filled_features", "action_names", "control_names", "tick_period_ns", "part", "source_details", "observation_period_ns")
    class SourceDetailsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    SHADOW_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_SCHEMA_HASH_FIELD_NUMBER: _ClassVar[int]
    GATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    START_TIME_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    FEATURE_NAMES_FIELD_NUMBER: _ClassVar[int]
    MEASURED_FEATURES_FIELD_NUMBER: _ClassVar[int]
    FILLED_FEATURES_FIELD_NUMBER: _ClassVar[int]
    ACTION_NAMES_FIELD_NUMBER: _ClassVar[int]
    CONTROL_NAMES_FIELD_NUMBER: _ClassVar[int]
    TICK_PERIOD_NS_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    SOURCE_DETAILS_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_PERIOD_NS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    clock: _controller_pb2.ClockMode
    shadow: bool
    model_version: str
    model_schema_hash: str
    gate_version: str
    config_json: str
    source: str
    start_time_unix_ns: int
    format_version: int
    feature_names: _containers.RepeatedScalarFieldContainer[str]
    measured_features: _containers.RepeatedScalarFieldContainer[str]
    filled_features: _containers.RepeatedScalarFieldContainer[str]
    action_names: _containers.RepeatedScalarFieldContainer[str]
    control_names: _containers.RepeatedScalarFieldContainer[str]
    tick_period_ns: int
    part: int
    source_details: _containers.ScalarMap[str, str]
    observation_period_ns: int
    def __init__(self, session_id: _Optional[str] = ..., clock: _Optional[_Union[_controller_pb2.ClockMode, str]] = ..., shadow: _Optional[bool] = ..., model_version: _Optional[str] = ..., model_schema_hash: _Optional[str] = ..., gate_version: _Optional[str] = ..., config_json: _Optional[str] = ..., source: _Optional[str] = ..., start_time_unix_ns: _Optional[int] = ..., format_version: _Optional[int] = ..., feature_names: _Optional[_Iterable[str]] = ..., measured_features: _Optional[_Iterable[str]] = ..., filled_features: _Optional[_Iterable[str]] = ..., action_names: _Optional[_Iterable[str]] = ..., control_names: _Optional[_Iterable[str]] = ..., tick_period_ns: _Optional[int] = ..., part: _Optional[int] = ..., source_details: _Optional[_Mapping[str, str]] = ..., observation_period_ns: _Optional[int] = ...) -> None: ...

class PlanRecord(_message.Message):
    __slots__ = ("session_id", "created_time_ns", "plan", "source")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    created_time_ns: int
    plan: _controller_pb2.PlanUpdate
    source: str
    def __init__(self, session_id: _Optional[str] = ..., created_time_ns: _Optional[int] = ..., plan: _Optional[_Union[_controller_pb2.PlanUpdate, _Mapping]] = ..., source: _Optional[str] = ...) -> None: ...

class SessionSummary(_message.Message):
    __slots__ = ("session_id", "end_time_unix_ns", "observations_written", "snapshots_written", "plans_written", "observations_dropped", "snapshots_dropped", "plans_dropped")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    END_TIME_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    PLANS_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    PLANS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    end_time_unix_ns: int
    observations_written: int
    snapshots_written: int
    plans_written: int
    observations_dropped: int
    snapshots_dropped: int
    plans_dropped: int
    def __init__(self, session_id: _Optional[str] = ..., end_time_unix_ns: _Optional[int] = ..., observations_written: _Optional[int] = ..., snapshots_written: _Optional[int] = ..., plans_written: _Optional[int] = ..., observations_dropped: _Optional[int] = ..., snapshots_dropped: _Optional[int] = ..., plans_dropped: _Optional[int] = ...) -> None: ...
