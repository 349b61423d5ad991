"""What the safety layer's transitions do to the car and to the traffic behind it, from one run's
per-tick trace: the largest applied-command step at a transition, the time from leaving NOMINAL to
standstill, and drive-offs after a standstill the safety layer brought about (docs/demo.md).

Ticks are the closed loop's: `state[k]` and `accel[k]` are the snapshot applied at tick k, `speed[k]`
the ego's speed after the step that applied it.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from dualloop.sim.metrics import MOVING_MPS
from dualloop.v2 import controller_pb2 as pb

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

NOMINAL = pb.SAFETY_STATE_NOMINAL
STANDSTILL_MPS: float = MOVING_MPS  # below this the car stands
DRIVE_OFF_MPS: float = 0.5  # moving again after a standstill


def transition_step(accel: FloatArray, state: IntArray) -> float:
    """The largest |applied acceleration command step| (m/s^2 per tick) over ticks k where the state
    differs from tick k-1's or either of the two is not NOMINAL. The first tick compares with nothing
    applied (0 m/s^2) in NOMINAL: it counts when it is not NOMINAL. 0 when no tick counts."""
    if accel.shape[0] == 0:
        return 0.0
    prev_accel = np.concatenate([[0.0], accel[:-1]])
    prev_state = np.concatenate([[NOMINAL], state[:-1]])
    counted = (state != prev_state) | (state != NOMINAL) | (prev_state != NOMINAL)
    steps = np.abs(accel - prev_accel)[counted]
    return float(steps.max()) if steps.size else 0.0


def time_to_standstill(t: FloatArray, speed: FloatArray, state: IntArray, dt: float) -> float:
    """Seconds from the first non-NOMINAL tick to the first tick from then on whose speed is below
    STANDSTILL_MPS (counted to the end of that tick's step); NaN when it never leaves NOMINAL or
    never stands. A car that stands already when it leaves NOMINAL: dt."""
    off = np.flatnonzero(state != NOMINAL)
    if off.size == 0:
        return float("nan")
    first = int(off[0])
    still = np.flatnonzero(speed[first:] < STANDSTILL_MPS)
    if still.size == 0:
        return float("nan")
    return float(t[first + int(still[0])] - t[first]) + dt


def drive_offs(speed: FloatArray, state: IntArray, released: npt.NDArray[np.bool_] | None = None) -> int:
    """How often the car stood (speed below STANDSTILL_MPS) in a non-NOMINAL tick and later moved
    above DRIVE_OFF_MPS with no explicit release in between. `released`: ticks at which the client or
    an operator released the standstill (None: never; the demo's client sends no release)."""
    count, armed = 0, False
    stood = (speed < STANDSTILL_MPS) & (state != NOMINAL)
    moving = speed > DRIVE_OFF_MPS
    for k in range(speed.shape[0]):
        if released is not None and released[k]:
            armed = False
        if stood[k]:
            armed = True
        elif armed and moving[k]:
            count += 1
            armed = False
    return count
