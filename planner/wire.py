"""Plan / PlanRequest <-> planner.proto messages. The only serialisation planner/ uses on any pipe
or socket: typed protobuf, never pickle."""

from __future__ import annotations

from typing import cast

import numpy as np
import numpy.typing as npt

from dualloop.planner.plan import Plan, PlanRequest
from dualloop.sim.schema import BEHAVIOURS
from dualloop.v2 import planner_pb2 as pb

# Derived from sim.schema.BEHAVIOURS so a new behaviour fails here at import, not on the wire.
BEHAVIOUR_TO_WIRE: dict[str, pb.PlanBehaviour] = {
    b: cast("pb.PlanBehaviour", pb.PlanBehaviour.Value(f"PLAN_BEHAVIOUR_{b.upper()}")) for b in BEHAVIOURS
}
WIRE_TO_BEHAVIOUR: dict[int, str] = {v: k for k, v in BEHAVIOUR_TO_WIRE.items()}


def plan_to_pb(plan: Plan) -> pb.PlanResponse:
    return pb.PlanResponse(
        plan_id=plan.plan_id,
        session_id=plan.session_id,
        behaviour=BEHAVIOUR_TO_WIRE[plan.behaviour],
        target_speed=plan.target_speed,
        target_lane_offset=plan.target_lane_offset,
        valid_for_ns=plan.valid_for_ns,
        created_ns=plan.created_ns,
        source=plan.source,
    )


def plan_from_pb(msg: pb.PlanResponse) -> Plan:
    """Raises PlanError (a ValueError) for an unknown behaviour or non-finite targets."""
    behaviour = WIRE_TO_BEHAVIOUR.get(msg.behaviour, f"<wire value {msg.behaviour}>")
    return Plan(
        plan_id=msg.plan_id,
        session_id=msg.session_id,
        created_ns=msg.created_ns,
        valid_for_ns=msg.valid_for_ns,
        source=msg.source,
        behaviour=behaviour,
        target_speed=float(msg.target_speed),
        target_lane_offset=float(msg.target_lane_offset),
    )


def request_to_pb(request: PlanRequest) -> pb.PlanRequest:
    msg = pb.PlanRequest(session_id=request.session_id, features=request.features.tolist(), now_ns=request.now_ns)
    if request.previous is not None:
        msg.previous_plan_id = request.previous.plan_id
        msg.previous.CopyFrom(plan_to_pb(request.previous))
    return msg


def request_bytes(session_id: str, features: npt.NDArray[np.float32], now_ns: int, previous_pb: bytes = b"") -> bytes:
    """A serialised PlanRequest built in one go: the same message as request_to_pb(...).SerializeToString()
    for a previous plan whose PlanResponse bytes are previous_pb, at half the cost (the server's tick
    loop encodes its requests, and the previous plan is taken in as the bytes it came in, not
    rebuilt field by field)."""
    msg = pb.PlanRequest(session_id=session_id, features=features.tolist(), now_ns=now_ns)
    if previous_pb:
        msg.previous.MergeFromString(previous_pb)
        msg.previous_plan_id = msg.previous.plan_id
    return msg.SerializeToString()


def request_from_pb(msg: pb.PlanRequest) -> PlanRequest:
    previous = plan_from_pb(msg.previous) if msg.HasField("previous") else None
    return PlanRequest(
        session_id=msg.session_id,
        features=np.asarray(msg.features, dtype=np.float32),
        now_ns=msg.now_ns,
        previous=previous,
    )
