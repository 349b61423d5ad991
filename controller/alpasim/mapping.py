"""alpasim's egodriver messages as dualloop features, and dualloop's decision as an egodriver plan.

Pure functions, no gRPC: what the egodriver contract carries becomes the model card's features by
name; what it cannot carry (other road users, lanes beside the ego) is left out of the session's
sensor profile and sent as NaN, never guessed. docs/alpasim.md has the table.

Frames and units: alpasim's rig frame is x forward, y left, z up, origin on the ground below the
rear axle; metres, m/s, rad, microseconds. dualloop's schema is + = left too, so no sign changes;
times become nanoseconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from carla_driver_interface.protocol import DynamicState

# What each source can give, by dualloop feature name (the model card's; a card without one of them
# simply does not get it). Everything else a card names is missing for an egodriver session.
STATE_FEATURES = ("ego_speed", "ego_accel", "yaw_rate")
ROUTE_FEATURES = ("lane_offset", "heading_error", "road_curvature")
# the stretch of route ahead of the ego whose heading change gives the curvature: long enough to
# average out waypoint jitter, short enough to be the road under the ego (the model's sensor is local)
CURVATURE_SPAN_M = 20.0
# the least route ahead of the ego to judge curvature on at all
MIN_CURVATURE_SPAN_M = 5.0


class EgodriverInputError(ValueError):
    """An egodriver message dualloop cannot take; the message names the field."""


def _finite(name: str, *values: float) -> None:
    if not all(math.isfinite(v) for v in values):
        raise EgodriverInputError(f"{name} must be finite, got {', '.join(repr(v) for v in values)}")


def state_features(state: DynamicState | None) -> dict[str, float]:
    """The ego features a DynamicState measures (rig frame). A sub-message the runtime did not set is
    not measured: proto3 tells an unset message from a zero one, and a zero would be a lie."""
    out: dict[str, float] = {}
    if state is None:
        return out
    if state.HasField("linear_velocity"):
        v = state.linear_velocity
        _finite("DynamicState.linear_velocity", v.x, v.y, v.z)
        # signed along the car's heading, the rig's x (at the rear axle, the rig's origin, a car moves
        # along its heading, so x is nearly all its speed): a car reversing reads negative, outside
        # the speeds the model knows, so the gates veto it. hypot(x, y) read it as driving forward.
        out["ego_speed"] = float(v.x)
    if state.HasField("linear_acceleration"):
        a = state.linear_acceleration
        _finite("DynamicState.linear_acceleration", a.x, a.y, a.z)
        out["ego_accel"] = float(a.x)  # longitudinal: the rig's x is the car's forward axis
    if state.HasField("angular_velocity"):
        w = state.angular_velocity
        _finite("DynamicState.angular_velocity", w.x, w.y, w.z)
        out["yaw_rate"] = float(w.z)
    return out


def _wrap(angle: float) -> float:
    return (angle + math.pi) % (2 * math.pi) - math.pi


def route_features(route_in_rig: np.ndarray) -> dict[str, float]:
    """lane_offset, heading_error and road_curvature from the route (N x 3, rig frame), taken as the
    centre line of the ego's lane, as alpasim's route is: the ego is the rig's origin, so its offset
    is the signed distance from the route's nearest point and its heading error minus the route's
    heading there. Curvature needs route ahead of the ego; fewer than two waypoints give nothing."""
    pts = np.asarray(route_in_rig, np.float64)
    if pts.ndim != 2 or pts.shape[1] < 2:
        raise EgodriverInputError(f"Route.waypoints must be N x 3, got shape {pts.shape}")
    if not np.isfinite(pts).all():
        bad = int(np.flatnonzero(~np.isfinite(pts).all(axis=1))[0])
        raise EgodriverInputError(f"Route.waypoints[{bad}] must be finite, got {pts[bad].tolist()}")
    xy = pts[:, :2]
    # repeated waypoints make zero-length segments without a heading: drop them
    keep = np.concatenate([[True], np.linalg.norm(np.diff(xy, axis=0), axis=1) > 1e-6])
    xy = xy[keep]
    if len(xy) < 2:
        return {}
    seg = np.diff(xy, axis=0)
    length = np.linalg.norm(seg, axis=1)
    # the ego's projection on each segment, the first and last extended (a route may start ahead of
    # the rear axle, or end beside it)
    t = -np.einsum("ij,ij->i", xy[:-1], seg) / length**2
    t[1:] = np.maximum(t[1:], 0.0)
    t[:-1] = np.minimum(t[:-1], 1.0)
    foot = xy[:-1] + t[:, None] * seg
    i = int(np.argmin(np.linalg.norm(foot, axis=1)))
    tangent = seg[i] / length[i]
    heading = math.atan2(tangent[1], tangent[0])
    # + = the ego left of the route: the cross product of the route's direction and foot -> ego
    out = {
        "lane_offset": float(tangent[0] * -foot[i][1] - tangent[1] * -foot[i][0]),
        "heading_error": _wrap(-heading),
    }
    arc = np.concatenate([[0.0], np.cumsum(length)])
    s0 = arc[i] + t[i] * length[i]
    ahead = min(arc[-1] - s0, CURVATURE_SPAN_M)
    if ahead >= MIN_CURVATURE_SPAN_M:
        j = min(int(np.searchsorted(arc, s0 + ahead, side="left")) - 1, len(seg) - 1)
        j = max(j, i)
        far = math.atan2(seg[j][1], seg[j][0])
        # the heading change between the segment under the ego and the one span ahead, over the
        # distance between their midpoints: + = turning left, as the schema's road_curvature
        dist = (arc[j] + length[j] / 2) - (arc[i] + length[i] / 2)
        out["road_curvature"] = _wrap(far - heading) / dist if dist > 1e-6 else 0.0
    return out


def measured_features(state: DynamicState | None, route_in_rig: np.ndarray | None) -> dict[str, float]:
    """Every feature this egodriver step measures, by name."""
    out = state_features(state)
    if route_in_rig is not None and len(route_in_rig):
        out.update(route_features(route_in_rig))
    return out


def feature_vector(names: Sequence[str], provided: Sequence[str], measured: dict[str, float]) -> np.ndarray:
    """The card's feature vector: measured values of the provided features, NaN elsewhere. A provided
    feature this step did not measure stays NaN too, which the executor reports as INVALID_INPUT (a
    sensor that dropped out), rather than being filled in."""
    x = np.full(len(names), np.nan, np.float32)
    for k, name in enumerate(names):
        if name in provided and name in measured:
            x[k] = measured[name]
    return x


@dataclass(frozen=True)
class PlanPoint:
    """One pose of the plan in the rig frame at the decision, dt_us after it."""

    dt_us: int
    x: float
    y: float
    yaw: float


def plan_from_controls(
    accel: float,
    steer: float,
    speed: float,
    horizon_s: float,
    point_period_s: float,
    wheelbase_m: float,
    substeps: int = 10,
) -> list[PlanPoint]:
    """The applied (accel m/s^2, front-wheel steer rad, + = left) held over the horizon, as the poses
    a kinematic bicycle about the rear axle (the rig's origin) reaches from `speed`: x' = v cos(yaw),
    y' = v sin(yaw), yaw' = v tan(steer) / wheelbase, v' = accel. Braking stops the car, it never
    reverses, and a negative speed (the car reversing, which the gates veto) starts the plan from a
    standstill: the model's actions only drive forward, so braking answers a stop where the car is.
    The runtime asks again long before the horizon; the horizon only gives its controller a path to
    track."""
    _finite("applied controls", accel, steer)
    if horizon_s <= 0 or point_period_s <= 0:
        raise ValueError(f"horizon_s ({horizon_s}) and point_period_s ({point_period_s}) must be > 0")
    n = max(1, round(horizon_s / point_period_s))
    dt = point_period_s / substeps
    curvature = math.tan(steer) / wheelbase_m
    x = y = yaw = 0.0
    v = max(speed, 0.0)
    out: list[PlanPoint] = []
    for k in range(1, n + 1):
        for _ in range(substeps):
            v_next = max(v + accel * dt, 0.0)
            v_mid = 0.5 * (v + v_next)  # exact distance under constant acceleration (until the stop)
            ds = v_mid * dt
            # midpoint heading: second-order accurate on the arc
            x += ds * math.cos(yaw + 0.5 * ds * curvature)
            y += ds * math.sin(yaw + 0.5 * ds * curvature)
            yaw += ds * curvature
            v = v_next
        out.append(PlanPoint(round(k * point_period_s * 1e6), x, y, yaw))
    return out
