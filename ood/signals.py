"""Per-signal checks: one sensor failing while the others stay healthy.

The density gates see one tick's values, so a signal that sticks, jumps by a constant or flickers
while staying inside its usual range looks typical to them, and the freeze check needs the whole
vector to repeat. These checks judge each signal against physics and against the other signals,
over time, in the signals' own units, without the model:

- **stuck** (s): how long a signal has read bit for bit the same value on consecutive fresh
  observations while it should change: the ego moving faster than walking pace (ego_speed,
  lead_distance, lead_rel_speed; the lead signals while a lead is present). Real sensors at 10-100 Hz
  repeat for up to 0.9 s while moving (a quantised speed at near-constant cruise, a radar holding its
  track); ego_accel is left out because a derived acceleration holds for seconds (2.1 s on one data set).
- **speed_accel** (m/s): the ego speed's change over the last `speed_window_s` against the integral
  of ego_accel over the same observations (trapezoids). A speed that jumps, sticks while the car
  accelerates, or reads in km/h, and an acceleration that drops out or sticks while the speed moves,
  disagree with each other.
- **gap_rate** (m): the lead distance against the relative speed: the innovation
  |dgap - mean(rel) * dt| between fresh observations, and the score is the second-largest innovation
  of the last `gap_window_s` (of those from `gap_floor_m` on). A spike is two jumps (there and back),
  noise many; one jump alone is what a lead changing looks like (a cut-in, the lead leaving the lane,
  the radar switching target: 35 to 98 m at an unchanged relative speed in the simulator), and so is a
  constant bias's onset: a single jump is never judged, as no rule on these two signals can tell the
  two apart. A jump together with a jump of the relative speed of at least `new_lead_rel_jump`, or
  right after the gap was stuck longer than `stuck_s` (its catch-up), starts the window afresh.
- **lead_flicker** (toggles): how often the lead-present flag changed over the last `flicker_window_s`
  of fresh observations. A real lead appears and disappears; it does not blink.

Only fresh observations are evidence (a tick that reuses its observation reports the last verdict),
a gap in the stream longer than `max_gap_s` starts every check afresh, and a check whose signals the
session does not measure (NaN by its sensor profile) is not applicable. A non-finite reading of a
signal a check reads restarts that check. ``SignalMonitor.step`` (a live tick's rows) and ``.scan`` (a
replay's observations of one slot) run the same per-observation update in the same float64 arithmetic,
so both give identical verdicts.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

_NAN = math.nan
_MAX_KEPT = 1024  # readings a window keeps at most (1 s at 1 kHz)
STUCK, SPEED_ACCEL, GAP_RATE, LEAD_FLICKER = range(4)
CHECKS = ("stuck", "speed_accel", "gap_rate", "lead_flicker")
# the features each check reads, in SignalSettings' names
_READS = (
    ("speed_feature",),  # and whichever of the stuck signals are measured
    ("speed_feature", "accel_feature"),
    ("present_feature", "distance_feature", "rel_speed_feature"),
    ("present_feature",),
)


@dataclass(frozen=True)
class SignalSettings:
    """The signals' names and each check's threshold and time constants (docs/contract.md#checks).
    Thresholds were set on the shared real data sets, leave one data set out (docs/measurements.md)."""

    speed_feature: str = "ego_speed"  # m/s
    accel_feature: str = "ego_accel"  # m/s^2
    present_feature: str = "lead_present"  # 1 when a lead is measured
    distance_feature: str = "lead_distance"  # m
    rel_speed_feature: str = "lead_rel_speed"  # m/s, lead minus ego
    moving_speed: float = 1.5  # m/s: faster than this, speed and lead readings must change
    stuck_s: float = 1.2  # s of bit-identical readings while moving
    speed_window_s: float = 0.5
    speed_accel_m_s: float = 2.5  # m/s
    gap_jump_m: float = 6.0  # m: an innovation this large with a jump of the relative speed is a new lead
    gap_floor_m: float = 1.0  # m: innovations from this size on are kept for the window
    gap_window_s: float = 1.0
    new_lead_rel_jump: float = 1.0  # m/s
    gap_rate_m: float = 6.5  # m
    flicker_window_s: float = 1.0
    flicker_toggles: float = 2.0  # more toggles than this in the window veto
    max_gap_s: float = 0.5  # a longer pause between fresh observations starts afresh

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_feature"):
                if not value:
                    raise ValueError(f"signal checks: {f.name} must name a feature")
            elif not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0.0):
                raise ValueError(f"signal checks: {f.name} must be a finite number > 0, got {value!r}")

    @property
    def thresholds(self) -> tuple[float, float, float, float]:
        return (self.stuck_s, self.speed_accel_m_s, self.gap_rate_m, self.flicker_toggles)


class _Slot:
    """One session's memory: the last fresh reading of each signal and each check's running state."""

    __slots__ = (
        "t",
        "last",
        "run_start",
        "window",
        "integral",
        "gap",
        "jumps",
        "toggles",
        "present",
        "out",
    )

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.t = -1  # ns of the last fresh observation (-1: none)
        self.last: list[float] = []  # speed, accel, present, distance, rel (NaN where unknown)
        self.run_start: list[int] = [-1, -1, -1]  # per stuck signal: ns its current run began (-1: none)
        # bounded by time, and by count against a sensor faster than any real one (the oldest then goes
        # and the window is too short to judge: no verdict)
        self.window: deque[tuple[int, float, float]] = deque(maxlen=_MAX_KEPT)  # (ns, speed, accel integral)
        self.integral = 0.0
        self.gap: tuple[int, float, float] | None = None  # (ns, gap, rel) of the last lead reading
        self.jumps: deque[tuple[int, float]] = deque(maxlen=_MAX_KEPT)  # (ns, |innovation|) of the window's large ones
        self.toggles: deque[int] = deque(maxlen=_MAX_KEPT)  # ns of each toggle in the window
        self.present = _NAN
        self.out: tuple[float, float, float, float] = (_NAN, _NAN, _NAN, _NAN)


class SignalMonitor:
    """The four checks for `n_slots` sessions on a feature schema (`feature_names`)."""

    def __init__(self, n_slots: int, settings: SignalSettings, feature_names: Sequence[str]) -> None:
        names = list(feature_names)
        s = settings
        self.settings = s
        wanted = (s.speed_feature, s.accel_feature, s.present_feature, s.distance_feature, s.rel_speed_feature)
        # position of each signal in the features (-1: the schema lacks it)
        self.at = tuple(names.index(n) if n in names else -1 for n in wanted)
        self.thresholds = s.thresholds
        self._slots = [_Slot() for _ in range(n_slots)]
        # per slot: which signals its session measures (speed, accel, present, distance, rel)
        self._measures: list[tuple[bool, ...]] = [tuple(a >= 0 for a in self.at)] * n_slots
        self._window_ns = int(s.speed_window_s * 1e9)
        self._flicker_ns = int(s.flicker_window_s * 1e9)
        self._max_gap_ns = int(s.max_gap_s * 1e9)
        self._gap_window_ns = int(s.gap_window_s * 1e9)

    @property
    def available(self) -> bool:
        """Whether the schema has anything these checks read (the ego speed at least)."""
        return self.at[0] >= 0

    def set_present(self, slot: int, present: npt.NDArray[np.bool_] | None) -> None:
        """The features the slot's session measures (None: all the schema has)."""
        self._measures[slot] = tuple(a >= 0 and (present is None or bool(present[a])) for a in self.at)

    def reset(self, slot: int) -> None:
        self._slots[slot] = _Slot()
        self._measures[slot] = tuple(a >= 0 for a in self.at)

    def applies(self, slot: int) -> tuple[bool, bool, bool, bool]:
        """Which checks can judge this slot's session at all (its sensor profile measures their signals)."""
        speed, accel, present, distance, rel = self._measures[slot]
        return speed, speed and accel, present and distance and rel, present

    def step(
        self, x: npt.NDArray[Any], slots: Sequence[int], fresh: Sequence[bool], times: Sequence[int]
    ) -> list[tuple[float, float, float, float]]:
        """Each row's four scores (NaN: no verdict) after this tick; rows x (batch, features) raw inputs."""
        item = x.item
        at = self.at
        out = []
        for i, (slot, is_fresh, t) in enumerate(zip(slots, fresh, times)):
            state = self._slots[slot]
            if is_fresh:
                values = [item(i, a) if a >= 0 else _NAN for a in at]
                state.out = self._update(state, self._measures[slot], int(t), values)
            out.append(state.out)
        return out

    def scan(self, x: npt.NDArray[Any], slot: int, times: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        """The scores (rows, 4) after each of a session's fresh observations in turn (a replay's rows
        the ticks used), leaving the slot as live ticks would."""
        state, measures = self._slots[slot], self._measures[slot]
        cols = [x[:, a].tolist() if a >= 0 else [_NAN] * len(x) for a in self.at]
        out = np.empty((len(x), 4))
        for k, (t, *values) in enumerate(zip(times.tolist(), *cols)):
            state.out = self._update(state, measures, t, values)
            out[k] = state.out
        return out

    def _update(
        self, st: _Slot, measures: tuple[bool, ...], t: int, values: list[float]
    ) -> tuple[float, float, float, float]:
        """One fresh observation at t ns (values: speed, accel, present, distance, rel as floats)."""
        m_speed, m_accel, m_present, m_distance, m_rel = measures
        if st.t >= 0 and (t - st.t > self._max_gap_ns or t <= st.t):  # a pause: nothing carries over
            st.clear()
        last = st.last or [_NAN] * 5
        # how long the gap had been stuck before this reading (a jump after it is its catch-up); before
        # the stuck check moves its run
        gap_stuck_s = (st.t - st.run_start[1]) * 1e-9 if st.run_start[1] >= 0 else 0.0
        stuck = self._stuck(st, measures, t, values, last) if m_speed else _NAN
        speed_accel = self._speed_accel(st, t, values, last) if m_speed and m_accel else _NAN
        gap_rate = self._gap_rate(st, t, values, gap_stuck_s) if m_present and m_distance and m_rel else _NAN
        flicker = self._flicker(st, t, values[2]) if m_present else _NAN
        st.t = t
        st.last = values
        return stuck, speed_accel, gap_rate, flicker

    def _stuck(self, st: _Slot, measures: tuple[bool, ...], t: int, values: list[float], last: list[float]) -> float:
        """stuck: bit-identical readings while moving (and, for the lead, a lead present)."""
        speed, present = values[0], values[2]
        moving = speed == speed and abs(speed) > self.settings.moving_speed
        lead = measures[2] and present == 1.0
        stuck = 0.0
        for j, (idx, measured, cond) in enumerate(
            ((0, True, moving), (3, measures[3], moving and lead), (4, measures[4], moving and lead))
        ):
            if measured and cond and st.t >= 0 and values[idx] == last[idx]:  # a repeat
                if st.run_start[j] < 0:
                    st.run_start[j] = st.t  # the run began with the previous reading
                stuck = max(stuck, (t - st.run_start[j]) * 1e-9)
            else:
                st.run_start[j] = -1
        return stuck

    def _speed_accel(self, st: _Slot, t: int, values: list[float], last: list[float]) -> float:
        """speed_accel: the speed's change against the integrated acceleration."""
        speed, accel = values[0], values[1]
        if not (speed == speed and accel == accel):
            st.window.clear()
            st.integral = 0.0
            return _NAN
        if st.window:
            dt_ns = t - st.t if st.t >= 0 else 0
            st.integral += 0.5 * (accel + last[1]) * (dt_ns * 1e-9)
        st.window.append((t, speed, st.integral))
        w = st.window
        while len(w) > 2 and t - w[1][0] >= self._window_ns:
            w.popleft()  # keep one observation at least a window old
        t0, v0, i0 = w[0]
        return abs((speed - v0) - (st.integral - i0)) if t - t0 >= self._window_ns else _NAN

    def _gap_rate(self, st: _Slot, t: int, values: list[float], gap_stuck_s: float) -> float:
        """gap_rate: the gap's change against the relative speed."""
        s = self.settings
        present, distance, rel = values[2], values[3], values[4]
        if not (present == 1.0 and distance == distance and rel == rel):
            # no lead (or no reading): the next one starts a new track
            st.gap = None
            st.jumps.clear()
            return _NAN
        gap_rate = 0.0
        jumps = st.jumps
        if st.gap is not None:
            g_t, g0, r0 = st.gap
            e = abs((distance - g0) - 0.5 * (rel + r0) * ((t - g_t) * 1e-9))  # the innovation
            new_lead = e >= s.gap_jump_m and (abs(rel - r0) >= s.new_lead_rel_jump or gap_stuck_s > s.stuck_s)
            if new_lead:  # a new lead, or a stuck gap catching up: its track starts afresh
                jumps.clear()
            elif e >= s.gap_floor_m:
                jumps.append((t, e))
        while jumps and t - jumps[0][0] >= self._gap_window_ns:
            jumps.popleft()
        if len(jumps) >= 2:  # the second-largest innovation in the window
            gap_rate = heapq.nlargest(2, [e for _, e in jumps])[1]
        st.gap = (t, distance, rel)
        return gap_rate

    def _flicker(self, st: _Slot, t: int, present: float) -> float:
        """lead_flicker: toggles of the lead flag in the window."""
        if present != present:
            st.toggles.clear()
            st.present = _NAN
            return _NAN
        if st.present == st.present and present != st.present:
            st.toggles.append(t)
        st.present = present
        while st.toggles and t - st.toggles[0] >= self._flicker_ns:
            st.toggles.popleft()
        return float(len(st.toggles))
