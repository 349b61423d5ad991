from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PlanBehaviour(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PLAN_BEHAVIOUR_UNSPECIFIED: _ClassVar[PlanBehaviour]
    PLAN_BEHAVIOUR_KEEP: _ClassVar[PlanBehaviour]
    PLAN_BEHAVIOUR_CHANGE_LEFT: _ClassVar[PlanBehaviour]
    PLAN_BEHAVIOUR_CHANGE_RIGHT: _ClassVar[PlanBehaviour]
    PLAN_BEHAVIOUR_STOP: _ClassVar[PlanBehaviour]
PLAN_BEHAVIOUR_UNSPECIFIED: PlanBehaviour
PLAN_BEHAVIOUR_KEEP: PlanBehaviour
PLAN_BEHAVIOUR_CHANGE_LEFT: PlanBehaviour
PLAN_BEHAVIOUR_CHANGE_RIGHT: PlanBehaviour
PLAN_BEHAVIOUR_STOP: PlanBehaviour

class PlanRequest(_message.Message):
    __slots__ = ("session_id", "features", "now_ns", "previous_plan_id", "previous")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    NOW_NS_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    features: _containers.RepeatedScalarFieldContainer[float]
    now_ns: int
    previous_plan_id: str
    previous: PlanResponse
    def __init__(self, session_id: _Optional[str] = ..., features: _Optional[_Iterable[float]] = ..., now_ns: _Optional[int] = ..., previous_plan_id: _Optional[str] = ..., previous: _Optional[_Union[PlanResponse, _Mapping]] = ...) -> None: ...

class PlanResponse(_message.Message):
    __slots__ = ("plan_id", "session_id", "behaviour", "target_speed", "target_lane_offset", "valid_for_ns", "created_ns", "source")
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BEHAVIOUR_FIELD_NUMBER: _ClassVar[int]
    TARGET_SPEED_FIELD_NUMBER: _ClassVar[int]
    TARGET_LANE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    VALID_FOR_NS_FIELD_NUMBER: _ClassVar[int]
    CREATED_NS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    plan_id: str
    session_id: str
    behaviour: PlanBehaviour
    target_speed: float
    target_lane_offset: float
    valid_for_ns: int
    created_ns: int
    source: str
    def __init__(self, plan_id: _Optional[str] = ..., session_id: _Optional[str] = ..., behaviour: _Optional[_Union[PlanBehaviour, str]] = ..., target_speed: _Optional[float] = ..., target_lane_offset: _Optional[float] = ..., valid_for_ns: _Optional[int] = ..., created_ns: _Optional[int] = ..., source: _Optional[str] = ...) -> None: ...
