"""What a driver's action was, in one definition shared by import, replay, training and the sim.

A discrete longitudinal action is the band its acceleration falls in:

    a < -3.5 brake_hard   -3.5 <= a < -0.5 brake   -0.5 <= a <= 0.5 keep   a > 0.5 accelerate   (m/s^2)

A recorded human's action at time t is the band of their *look-ahead* acceleration: the mean slope
of their speed over the next LOOKAHEAD_S seconds, (v(t + H) - v(t)) / H, with v(t + H) linearly
interpolated between samples. It is what the driver went on to do, so it is what a decision taken
at t is compared with. Ticks whose horizon runs past the end of the drive (or over a gap in the
speed signal) have no label (-1).

The acceleration a model or a baseline may *see* at t must be causal: `backward_accel` is the slope
of the speed over the previous ACCEL_WINDOW_S seconds, as a sensor fusion without look-ahead gives.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

ACTIONS: Final = ("brake_hard", "brake", "keep", "accelerate")
BRAKE_HARD_BELOW: Final = -3.5  # m/s^2
BRAKE_BELOW: Final = -0.5
KEEP_AT_MOST: Final = 0.5
LOOKAHEAD_S: Final = 0.5
ACCEL_WINDOW_S: Final = 0.5
UNLABELLED: Final = -1

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def action_of_accel(accel: npt.ArrayLike) -> IntArray:
    """Index into ACTIONS of each acceleration's band, element-wise (any shape; a 0-d array for a
    scalar). NaN has no band: UNLABELLED."""
    a = np.asarray(accel, dtype=np.float64)
    label = np.full(a.shape, ACTIONS.index("accelerate"), dtype=np.int64)
    label[a <= KEEP_AT_MOST] = ACTIONS.index("keep")
    label[a < BRAKE_BELOW] = ACTIONS.index("brake")
    label[a < BRAKE_HARD_BELOW] = ACTIONS.index("brake_hard")
    label[np.isnan(a)] = UNLABELLED
    return label


def _shifted_speed(t_s: FloatArray, speed: FloatArray, shift_s: float, max_gap_s: float) -> FloatArray:
    """Speed interpolated at t + shift (NaN outside the samples or across a gap longer than max_gap_s)."""
    target = t_s + shift_s
    out = np.interp(target, t_s, speed)
    out[(target < t_s[0]) | (target > t_s[-1])] = np.nan
    right = np.clip(np.searchsorted(t_s, target, side="left"), 1, len(t_s) - 1)
    gap = t_s[right] - t_s[right - 1]
    out[gap > max_gap_s] = np.nan
    return out


def _validate(t_s: npt.ArrayLike, speed: npt.ArrayLike) -> tuple[FloatArray, FloatArray]:
    t = np.asarray(t_s, dtype=np.float64)
    v = np.asarray(speed, dtype=np.float64)
    if t.ndim != 1 or t.shape != v.shape:
        raise ValueError(f"time and speed must be 1-d and the same length, got {t.shape} and {v.shape}")
    if len(t) > 1 and not np.all(np.diff(t) > 0):
        raise ValueError("time must strictly increase")
    return t, v


def lookahead_accel(
    t_s: npt.ArrayLike, speed: npt.ArrayLike, horizon_s: float = LOOKAHEAD_S, max_gap_s: float = 1.0
) -> FloatArray:
    """(v(t + H) - v(t)) / H per sample; NaN where t + H is past the end, across a gap in the
    samples longer than max_gap_s, or where a speed is NaN."""
    t, v = _validate(t_s, speed)
    if len(t) < 2:
        return np.full(len(t), np.nan)
    return (_shifted_speed(t, v, horizon_s, max_gap_s) - v) / horizon_s


def lookahead_labels(
    t_s: npt.ArrayLike, speed: npt.ArrayLike, horizon_s: float = LOOKAHEAD_S, max_gap_s: float = 1.0
) -> tuple[IntArray, FloatArray]:
    """(action index or UNLABELLED, look-ahead acceleration) per sample: the human's action."""
    accel = lookahead_accel(t_s, speed, horizon_s, max_gap_s)
    return action_of_accel(accel), accel


def backward_accel(
    t_s: npt.ArrayLike, speed: npt.ArrayLike, window_s: float = ACCEL_WINDOW_S, max_gap_s: float = 1.0
) -> FloatArray:
    """(v(t) - v(t - W)) / W per sample, from past samples only; the first samples, whose window
    reaches before the drive, use the span they have (NaN for the very first)."""
    t, v = _validate(t_s, speed)
    if len(t) < 2:
        return np.full(len(t), np.nan)
    past = _shifted_speed(t, v, -window_s, max_gap_s)
    span = np.full(len(t), window_s)
    early = np.isnan(past) & (t - t[0] < window_s)
    past[early] = v[0]
    span[early] = t[early] - t[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        out: FloatArray = (v - past) / span
    out[span == 0] = np.nan
    return out
