"""The simulated nominal drives the benches' sessions send: what the shipped model and gates were made
for, every 5 ms observation, long enough that no session of a run up to a few minutes wraps round
its drive (a jump no sensor makes, which the per-signal checks veto: a bench would then time the
fallback, not what users run)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
from rich.console import Console

from dualloop.executor.model_runner import DecisionModel
from dualloop.sim.env import ActionNoise, run_expert_batch
from dualloop.sim.schema import FEATURE_NAMES
from dualloop.sim.sensors import TRAINING_SEES_LANE_ENDS

DRIVES_SCENARIO = "dense_traffic"  # its drives last the whole duration (a cruise may end at the road's end)
STAGGER_S = 10.0  # sessions start at their own places within this much of a drive
SESSION_DRIVES = 8  # drives a bench's sessions share, each session from its own place in one


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


def save_session_drives(
    feature_names: Sequence[str], seconds: float, folder: Path, count: int = SESSION_DRIVES
) -> Path | None:
    """`count` (at most SESSION_DRIVES) nominal drives of `seconds` for a model's sessions to send
    (STAGGER_S more, for their starting places), saved as .npy in `folder`; None for a model that does
    not read the simulator's features in its order (its sessions send draws near its card's means).
    The drives end with the shortest one's road, about 150 s: a longer run's sessions wrap round (a
    veto and a recovery each time, in the reasons the benches report), once per drive's length."""
    if tuple(feature_names) != FEATURE_NAMES:
        return None
    path = folder / "drives.npy"
    np.save(path, nominal_drives(max(1, min(count, SESSION_DRIVES)), 0, seconds + STAGGER_S))
    return path


def simulate_session_drives(model: Path, seconds: float, folder: Path, sessions: int, console: Console) -> Path | None:
    """`save_session_drives` for a model file's sessions, telling the console what runs (8 drives
    of 23 s take about 3 s to simulate on the project's VM)."""
    with console.status(f"simulating the sessions' nominal drives ({seconds + STAGGER_S:.0f} s)"):
        path = save_session_drives(DecisionModel(model).card.feature_names, seconds, folder, sessions)
    if path is None:
        console.print(f"{model.name} does not read the simulator's features: its sessions send draws near its means")
    return path


def start_places(rng: np.random.Generator, sessions: int, length: int, period_s: float) -> np.ndarray:
    """Each session's first reading's place in its drive of `length` readings: within STAGGER_S."""
    return rng.integers(0, max(1, min(int(STAGGER_S / period_s), length - 1)), sessions)


async def sensor_readings(period_s: float, stop_at: float) -> AsyncIterator[tuple[int, int, int]]:
    """(seq from 1, slot, sensor time ns) of each reading a session sends until `stop_at` (monotonic
    s): one per period from now, paced by `sensor_slot`."""
    seq, period_ns, t0_ns, slot = 0, round(period_s * 1e9), time.monotonic_ns(), -1
    while time.monotonic() < stop_at:
        seq += 1
        now = time.monotonic_ns()
        slot = sensor_slot(slot, now - t0_ns, period_ns)
        ts = t0_ns + slot * period_ns
        if ts > now:  # woken early (the loop's timer may be): a reading is never sent before its time
            await asyncio.sleep((ts - now) * 1e-9)
        yield seq, slot, ts
        await asyncio.sleep(max(0.0, (ts + period_ns - time.monotonic_ns()) * 1e-9))


def sensor_slot(previous: int, elapsed_ns: int, period_ns: int) -> int:
    """The slot (periods since the first) of the reading a session sends `elapsed_ns` after its
    first: the newest that is due, and always after the `previous` one sent. A sender woken late
    sends the reading of its time and skips those it missed (a stalled sensor's old readings are
    superseded) rather than a burst of them, whose near-equal times would read as a step of every
    signal in no time; and never one reading twice (the freeze check's repeats)."""
    return max(previous + 1, elapsed_ns // period_ns)
