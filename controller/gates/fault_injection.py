"""One-signal sensor faults injected into a real log's observations (`dualloop gate eval --real`).

A log is its observations as columns: features (N, F) float32 in the model card's order and
timestamps (N,) int64 ns, at the log's native rate. A fault replaces the observations of one window
[first, stop) (observation indices) and nothing else: one feature column for the signal faults, the
timestamps for frozen timestamps, the rows themselves for missing rows. Every random choice comes from
the `numpy.random.Generator` handed in, so an episode is a pure function of the log and the seed.
docs/real-faults.md describes each fault and its magnitudes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

STUCK: Final = "stuck"
NAN: Final = "nan_dropout"
ZERO: Final = "zero_dropout"
NOISE: Final = "noise"
SPIKES: Final = "spikes"
UNIT: Final = "unit_error"
BIAS: Final = "bias"
SIGN: Final = "sign_flip"
FLICKER: Final = "presence_flicker"
FROZEN_TIME: Final = "frozen_timestamps"
MISSING_ROWS: Final = "missing_rows"

# the pseudo-signals of the faults that change whole observations
TIMESTAMPS: Final = "timestamp"
ROWS: Final = "rows"

SPEEDS: Final = ("ego_speed", "lead_rel_speed")
LONGITUDINAL: Final = ("ego_speed", "ego_accel", "lead_distance", "lead_rel_speed")
# fault -> the signals it is injected into (those a log measures)
SIGNALS: Final[dict[str, tuple[str, ...]]] = {
    STUCK: LONGITUDINAL,
    NAN: LONGITUDINAL,
    ZERO: LONGITUDINAL,
    NOISE: LONGITUDINAL,
    SPIKES: LONGITUDINAL,
    UNIT: (*SPEEDS, "lead_distance"),
    BIAS: ("lead_distance",),
    SIGN: ("lead_rel_speed",),
    FLICKER: ("lead_present",),
    FROZEN_TIME: (TIMESTAMPS,),
    MISSING_ROWS: (ROWS,),
}
FAULTS: Final = tuple(SIGNALS)
# signals about the lead vehicle: their faults are injected only while a lead is present
LEAD_SIGNALS: Final = frozenset({"lead_present", "lead_distance", "lead_rel_speed"})

DURATION_S: Final = (1.6, 3.0)
BIAS_M: Final = 15.0
KMH_PER_MS: Final = 3.6
FT_PER_M: Final = 1 / 0.3048
NOISE_SIGMAS: Final = (0.5, 2.0)  # noise standard deviation, in units of the signal's spread
SPIKE_SIGMAS: Final = (4.0, 8.0)  # spike height, in units of the signal's spread
SPIKE_SHARE: Final = 0.25  # of the window's observations
# the smallest spread a signal is given (a signal nearly constant on a log still gets noise a sensor could make)
MIN_SPREAD: Final[dict[str, float]] = {"ego_speed": 0.5, "ego_accel": 0.2, "lead_distance": 2.0, "lead_rel_speed": 0.5}
UNITS: Final[dict[str, str]] = {"ego_speed": "m/s", "ego_accel": "m/s^2", "lead_distance": "m", "lead_rel_speed": "m/s"}


@dataclass(frozen=True)
class Episode:
    """One fault in one log: `fault` on `signal` over observations [first, stop)."""

    fault: str
    signal: str
    first: int
    stop: int
    magnitude: float  # noise sigma, spike height (physical units), bias, unit factor; 0 where none


@dataclass
class Faulted:
    """A log's observations with faults injected: `keep` says which rows remain (missing rows)."""

    features: np.ndarray  # (N, F) float32
    timestamps: np.ndarray  # (N,) int64
    keep: np.ndarray  # (N,) bool


def spread(values: np.ndarray, signal: str) -> float:
    """A robust spread of a signal on a log (IQR / 1.349: its standard deviation if normal), floored."""
    finite = values[np.isfinite(values)]
    iqr = float(np.subtract(*np.percentile(finite, [75, 25]))) if finite.size else 0.0
    return max(iqr / 1.349, MIN_SPREAD.get(signal, 0.0))


def draw_magnitude(fault: str, signal: str, values: np.ndarray, rng: np.random.Generator) -> float:
    """The fault's magnitude on this log (physical units of the signal)."""
    if fault == NOISE:
        return float(rng.uniform(*NOISE_SIGMAS)) * spread(values, signal)
    if fault == SPIKES:
        return float(rng.uniform(*SPIKE_SIGMAS)) * spread(values, signal)
    if fault == BIAS:
        return BIAS_M
    if fault == UNIT:
        return KMH_PER_MS if signal in SPEEDS else FT_PER_M
    return 0.0


def inject(
    features: np.ndarray,
    timestamps: np.ndarray,
    episodes: list[Episode],
    names: list[str],
    rng: np.random.Generator,
) -> Faulted:
    """The observations with every episode's fault injected (their windows must not overlap)."""
    x = features.copy()
    ts = timestamps.copy()
    keep = np.ones(len(ts), bool)
    for ep in sorted(episodes, key=lambda e: e.first):
        if ep.first < 1 or ep.stop > len(ts) or ep.stop <= ep.first:
            raise ValueError(f"episode window [{ep.first}, {ep.stop}) is not inside observations [1, {len(ts)})")
        w = slice(ep.first, ep.stop)
        n = ep.stop - ep.first
        if ep.fault == FROZEN_TIME:
            ts[w] = ts[ep.first - 1]  # the sensor clock stops; the data keeps coming
            continue
        if ep.fault == MISSING_ROWS:
            keep[w] = False
            continue
        if ep.signal not in names:
            raise ValueError(f"{ep.fault}: no feature {ep.signal!r} in the model's features")
        col = names.index(ep.signal)
        if ep.fault == STUCK:
            x[w, col] = x[ep.first - 1, col]
        elif ep.fault == NAN:
            x[w, col] = np.nan
        elif ep.fault == ZERO:
            x[w, col] = 0.0
        elif ep.fault == NOISE:
            x[w, col] += rng.normal(0.0, ep.magnitude, n).astype(np.float32)
        elif ep.fault == SPIKES:
            hit = rng.random(n) < SPIKE_SHARE
            hit[rng.integers(n)] = True  # at least one spike
            sign = rng.choice(np.array([-1.0, 1.0]), n)
            x[w, col] += np.where(hit, sign * ep.magnitude, 0.0).astype(np.float32)
        elif ep.fault == UNIT:
            x[w, col] *= np.float32(ep.magnitude)
        elif ep.fault == BIAS:
            x[w, col] += np.float32(ep.magnitude)
        elif ep.fault == SIGN:
            x[w, col] = -x[w, col]
        elif ep.fault == FLICKER:
            # the flag drops and returns at random: each observation toggled with probability 1/2
            flip = rng.random(n) < 0.5
            flip[rng.integers(n)] = True
            x[w, col] = np.where(flip, 1.0 - x[w, col], x[w, col])
        else:
            raise ValueError(f"unknown fault {ep.fault!r}; known: {', '.join(FAULTS)}")
    return Faulted(x, ts, keep)


def changed_rows(
    faulted: Faulted, features: np.ndarray, timestamps: np.ndarray, rows: slice = slice(None)
) -> np.ndarray:
    """Per observation of `rows`, whether the faults changed it: a value (NaN equal to NaN), its
    timestamp, or dropped it."""
    x, x0 = faulted.features[rows], features[rows]
    same = ((x == x0) | (np.isnan(x) & np.isnan(x0))).all(axis=1)
    return ~same | (faulted.timestamps[rows] != timestamps[rows]) | ~faulted.keep[rows]


def first_change(faulted: Faulted, features: np.ndarray, timestamps: np.ndarray, ep: Episode) -> int:
    """The first observation of the episode's window the fault changed: where a detector can first
    see it. Spikes and a flickering flag may first show late in their window (a quarter of the
    readings spiked leaves the first one clean three times in four); a fault that changed nothing
    starts with its window."""
    changed = np.flatnonzero(changed_rows(faulted, features, timestamps, slice(ep.first, ep.stop)))
    return ep.first + int(changed[0]) if changed.size else ep.first


def moved_by(
    faulted: Faulted,
    features: np.ndarray,
    timestamps: np.ndarray,
    names: list[str],
    ep: Episode,
    onset: int,
    within_s: float,
) -> float | None:
    """How far the fault moved its signal's reading from the true one over its first `within_s` from
    `onset` (the largest difference, in the signal's units; inf where a reading became NaN), None
    for a fault on the timestamps or the rows. A signal stuck while it hardly changes, zeroed near
    0 or in km/h near 0 moves by little: the figure says how much a check had to see."""
    if ep.signal not in names:
        return None
    end = np.searchsorted(timestamps, timestamps[onset] + int(within_s * 1e9), side="right")
    w = slice(onset, max(int(end), onset + 1))
    col = names.index(ep.signal)
    x, x0 = faulted.features[w, col].astype(np.float64), features[w, col].astype(np.float64)
    diff = np.where(np.isnan(x) != np.isnan(x0), np.inf, np.abs(np.nan_to_num(x) - np.nan_to_num(x0)))
    return float(diff.max())


def eligible(fault: str, signal: str, features: np.ndarray, names: list[str], first: int, stop: int) -> bool:
    """Whether the window is one where the fault means something: the signal measured (finite) across
    it, and a lead present throughout for a lead signal's fault."""
    if signal in (TIMESTAMPS, ROWS):
        return True
    if signal not in names:
        return False
    w = slice(first - 1, stop)  # the stuck value is the one before the window
    if not np.isfinite(features[w, names.index(signal)]).all():
        return False
    if signal in LEAD_SIGNALS and "lead_present" in names:
        return bool((features[w, names.index("lead_present")] > 0.5).all())
    return True


def draw_windows(
    timestamps: np.ndarray,
    rng: np.random.Generator,
    slot_s: float,
    warmup_s: float,
) -> list[tuple[int, int]]:
    """Non-overlapping windows [first, stop) of observations, one per slot of `slot_s` after a
    warm-up: onset uniform in the slot (leaving room for the longest fault and the rest of the slot
    for recovery), duration uniform in DURATION_S."""
    t = (timestamps - timestamps[0]) / 1e9
    room = slot_s - DURATION_S[1]
    if room <= 0:
        raise ValueError(f"a slot of {slot_s} s has no room for a {DURATION_S[1]} s fault")
    out = []
    start = warmup_s
    while start + slot_s <= t[-1]:
        onset = start + float(rng.uniform(0.0, room / 2))  # the slot's second half is for recovery
        duration = float(rng.uniform(*DURATION_S))
        first = int(np.searchsorted(t, onset))
        stop = int(np.searchsorted(t, onset + duration))
        if 1 <= first < stop < len(t):
            out.append((first, stop))
        start += slot_s
    return out
