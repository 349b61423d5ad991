"""The simulated nominal drives the benches' sessions send: what the shipped model and gates were made
for, every 5 ms observation, long enough that no session wraps round its drive (a jump no sensor
makes, which the per-signal checks veto: a bench would then time the fallback, not what users run)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from dualloop.sim.env import ActionNoise, run_expert_batch
from dualloop.sim.schema import FEATURE_NAMES
from dualloop.sim.sensors import TRAINING_SEES_LANE_ENDS

DRIVES_SCENARIO = "dense_traffic"  # its drives last the whole duration (a cruise may end at the road's end)
STAGGER_S = 10.0  # sessions start at their own places within this much of a drive


class Drive(NamedTuple):
    """One simulated nominal drive, every 5 ms: what the sensors reported and the acceleration command
    the ego was executing when each observation was taken (what a shadow stack sends as `actual`)."""

    features: np.ndarray  # (ticks, features)
    commands: np.ndarray  # (ticks,) m/s^2


def nominal_drive(seed: int = 0, seconds: float = 10.0) -> Drive:
    """One simulated nominal cruise, with the commands in effect."""
    _, data = run_expert_batch("nominal_cruise", [seed + 1], see_lane_ends=TRAINING_SEES_LANE_ENDS, duration_s=seconds)
    assert data.applied is not None  # the simulator records the command in effect
    # the first observation precedes any command: the expert's first one stands in for it
    commands = np.nan_to_num(data.applied[0, :, 0], nan=float(data.controls[0, 0, 0]))
    valid = data.valid[0]
    return Drive(data.features[0][valid], commands[valid])


def drive_seconds(ticks: int) -> float:
    """A drive long enough for `ticks` of 5 ms from any of STAGGER_S of starting places."""
    return ticks * 0.005 + STAGGER_S


def nominal_drives(count: int, seed: int, duration_s: float) -> np.ndarray:
    """Simulated nominal drives, (count, ticks, features): the expert in dense traffic with the
    training data's action noise, every 5 ms observation."""
    seeds = [seed + k for k in range(count)]
    _, data = run_expert_batch(
        DRIVES_SCENARIO,
        seeds,
        every=1,
        noise=ActionNoise(),
        see_lane_ends=TRAINING_SEES_LANE_ENDS,
        duration_s=duration_s,
    )
    rows = [data.features[k][data.valid[k]] for k in range(count)]
    n = min(len(r) for r in rows)
    return np.stack([r[:n] for r in rows]).astype(np.float32)


def fits_simulator(feature_names: Sequence[str]) -> bool:
    """Whether a model reads the simulator's features in its order (else its drives mean nothing to it)."""
    return tuple(feature_names) == FEATURE_NAMES
