"""Small recorded human drives for the training tests: a 10 Hz car-following drive that measures the
five longitudinal features (the others NaN), labelled as the importers label (action_labels)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dualloop.controller.logs.logfile import write_log
from dualloop.executor.action_labels import backward_accel, lookahead_labels
from dualloop.sim import schema
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import log_pb2

LONGITUDINAL = ("ego_speed", "ego_accel", "lead_present", "lead_distance", "lead_rel_speed")


def human_drive(
    path: Path,
    session: str,
    dataset: str = "Test Drives",
    seconds: float = 120.0,
    seed: int = 0,
    flicker: tuple[float, float] | None = None,
) -> Path:
    """A follower's speed swinging around 12 m/s behind a lead; unlabelled where the look-ahead runs
    past the end. `flicker` (start, end) s: the lead flag drops on every third reading then, a
    failing sensor's flag (the per-signal lead_flicker check's fault)."""
    rng = np.random.default_rng(seed)
    t = np.arange(0.0, seconds, 0.1)
    speed = 12.0 + 4.0 * np.sin(t / 6.0 + rng.uniform(0, 6)) + 0.05 * rng.standard_normal(len(t))
    lead = speed + 1.5 * np.sin(t / 4.0)
    gap = 20.0 + np.cumsum(lead - speed) * 0.1
    accel = backward_accel(t, speed)
    label, la = lookahead_labels(t, speed)
    x = np.full((len(t), schema.N_FEATURES), np.nan, np.float32)
    x[:, schema.FEATURE_INDEX["ego_speed"]] = speed
    x[:, schema.FEATURE_INDEX["ego_accel"]] = accel
    x[:, schema.FEATURE_INDEX["lead_present"]] = 1.0
    if flicker is not None:
        during = np.flatnonzero((t >= flicker[0]) & (t < flicker[1]))
        x[during[::3], schema.FEATURE_INDEX["lead_present"]] = 0.0
    x[:, schema.FEATURE_INDEX["lead_distance"]] = gap
    x[:, schema.FEATURE_INDEX["lead_rel_speed"]] = lead - speed
    obs = []
    for i in range(1, len(t)):  # the first row has no past: no ego_accel, left out as importers do
        o = pb.Observation(seq=i, timestamp_ns=int(round(t[i] * 1e9)) + 1_000_000_000, features=x[i].tolist())
        o.actual.action_index = int(label[i])
        o.actual.controls.extend([float(la[i]), float("nan")])
        obs.append(o)
    header = log_pb2.SessionHeader(
        session_id=session,
        clock=pb.CLOCK_MODE_LOCKSTEP,
        shadow=True,
        config_json="{}",
        source=f"test import of {session}",
        feature_names=list(schema.FEATURE_NAMES),
        measured_features=list(LONGITUDINAL),
        action_names=list(schema.ACTIONS),
        control_names=list(schema.CONTROL_NAMES),
        tick_period_ns=5_000_000,
        observation_period_ns=100_000_000,
        source_details={"dataset": f"{dataset} (made up), car-following"},
    )
    return write_log(path, header, obs)
