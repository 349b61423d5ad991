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
  of fresh observations. A real lead appears and disappears; it does not blink (never twice within a
  second on the shared real data sets).
- **speed_repeat** (m/s) and **gap_repeat** (m): a float sensor read while its vehicle accelerates
  does not repeat its exact value, so a repeat is judged at once by how far physics says the signal
  should have moved since its run of repeats began. For the integrated signal (ego_speed, lead_distance)
  that is |integral of its rate (ego_accel, lead_rel_speed)| over the run; for the rate signal, the
  integrated signal's change over the run that the repeated rate does not explain,
  |d(ego_speed) - ego_accel * T| and |d(lead_distance) - lead_rel_speed * T|. A sensor that holds its
  value between its own slower samples (a 20 Hz radar in a 100 Hz stream, a quantised speed) moves
  little in that time; the thresholds sit above the largest such value on the shared real data sets.
  A signal stuck while its rate is zero (constant speed, a steady gap) is physically undetectable here
  and scores 0; the `stuck` check's duration still sees it.
- **rel_accel** (m/s^2): how fast lead_rel_speed changes, |its change since the previous reading| /
  the time between them (at least `rel_span_s`), and the score is the second-largest of the last
  `hold_s` (of those from `rel_floor_m_s2` on; 0 with fewer than two): the relative acceleration,
  the lead's minus the ego's, which two cars' brakes and engines bound (one braking at 10 m/s^2
  while the other accelerates). A noisy relative speed jumps again and
  again, a spike twice (there and back); one step alone is what a new lead at about the same gap
  looks like (the simulator's braking lead handing over to the car ahead of it, 52 m away either
  way) and is not judged, as for gap_rate. A step of the gap the relative speed does not explain
  (`gap_jump_m`) is a new lead and is not a rate. The span keeps a fast stream's own noise out (0.1
  m/s of noise between readings 10 ms apart would read 10 m/s^2): faster than 12.5 Hz the score is a
  step between readings over 0.08 s, not the true relative acceleration. Clean real drives reach
  9.3 m/s^2 at most (Vicolungo; the largest, not the second-largest).
- **gap_step** (m): how far the gap reads from its track. The track is the last trusted reading
  moved on by the relative speed; a reading within `gap_jump_m` of it is trusted and becomes the
  track, one further off is not and leaves the track as predicted, so a bias (+15 m from one reading
  on, the relative speed unchanged) scores its offset from its onset until it ends, and a spike scores
  only while it lasts. The track starts afresh at a new target (a step of the gap of `gap_step_max_m`
  or more: a lead leaving the lane hands over to the next car ahead, often at the same speed, 64 m in
  the simulator's nominal cruise; the old track is kept for `prior_keep_s`, and a reading back on it
  returns to it: the big step was a spike; no clean real drive steps 40 m with its lead flag set),
  except to `gap_unit_factor` times the track (within `gap_unit_tolerance`) at an unchanged relative
  speed, a gap switched to feet, or to exactly 0 m, a dropped reading (no lead is that near): both
  are faults and distrusted. It also starts afresh at a stuck gap's catch-up, when the lead flag
  drops, after `step_hold_s` of distrusted readings, and at a new lead (the relative speed jumping
  with a step of the gap) within `step_confirm_s` of a distrusted reading; a later new lead moves the
  track by its step, as a biased radar reads the next lead too far as well.
  A lead change inside the band at an unchanged relative speed is indistinguishable from a bias and
  is vetoed (none on the shared real data sets, whose lead changes come with the flag or a jump of
  the relative speed).
- **rel_unit** (m/s): a relative speed switched to km/h steps to 3.6 times its previous reading
  (`rel_unit_factor` times where its last two readings put it, within `rel_unit_tolerance`) while the
  gap steps not (no new lead), the reading was not stuck (its catch-up) and it is not back near the
  reading before the last (the end of a dip of noise). Such a step larger than
  the threshold begins a run in that unit, scored by the step until the run ends (`_UnitRun`: the
  reading back near the last one divided by the factor, a jump by more than half the step, the
  gap's last second agreeing with the readings as read, or `step_hold_s` unless the gap then agrees
  with the divided readings), the lead flag drops or a new lead comes. No shared real drive steps so
  (every step of 0.5 m/s or more), nor does the simulator's nominal driving at 200 Hz. A relative speed near 0
  switched to km/h changes by less and stays unseen; a persisting one that stays near 0 longer than
  the hold is trusted again.
- **rel_sign** (m): the gap's change over the last `rel_sign_window_s` against the relative speed's
  integral over the same readings (trapezoids): where they go opposite ways, the smaller of the two,
  else 0. A relative speed with its sign flipped (the lead reported pulling away while the ego
  closes on it) agrees with the gap's change between readings as far as the noise can tell (0.05 m
  per tick at 5 m/s and 200 Hz) and with every other check, yet over seconds the two disagree
  plainly. A step of the gap the relative speed does not explain (`gap_jump_m`: a new lead, a stuck
  gap's catch-up, a spike) starts the window afresh. Clean real drives reach 1.34 m on the held-out
  drives; the threshold (4 m) lets a flip through while the closing speed stays below 2 m/s.

Only fresh observations are evidence (a tick that reuses its observation reports the last verdict),
a gap in the stream longer than `max_gap_s` starts every check afresh, and a check whose signals the
session does not measure (NaN by its sensor profile) is not applicable. A non-finite reading of a
signal a check reads restarts that check. ``SignalMonitor.step`` (a live tick's rows) and ``.scan`` (a
replay's observations of one slot) run the same per-observation update in the same float64 arithmetic,
so both give identical verdicts.
"""

from __future__ import annotations

import importlib
import math
import os
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from dualloop.ood.signal_settings import CHECKS, Scores, SignalSettings

_NAN = math.nan
_compiled: Any
try:
    # by name: the C extension has no stub, and mypy would take `from ... import` for an attribute
    _compiled = importlib.import_module("dualloop.ood._signals")
except ImportError:  # not built (no compiler at install time): the Python path
    _compiled = None
_MAX_KEPT = 1024  # readings a window keeps at most (1 s at 1 kHz)
_SCORE_CAP = 1e12  # the largest score a check reports, in its own units (far above every threshold)


class _TopTwo:
    """The two largest values of a sliding window of readings, keeping only those that may still be
    one of the two: a value with two later ones at least as large never is again, since they leave
    the window after it. A window of 1 s at 200 Hz holds about 200 readings; this keeps a few.
    `max_kept`: the window also drops its oldest reading past this many (as a bounded deque)."""

    __slots__ = ("entries", "added", "max_kept", "_second")

    def __init__(self, max_kept: int | None = None) -> None:
        self.entries: list[list[Any]] = []  # [ns, value, later values at least as large, reading number]
        self.added = 0  # readings added since the last clear
        self.max_kept = max_kept
        self._second: float | None = 0.0  # second()'s value (None: to be found again)

    def __len__(self) -> int:
        return len(self.entries)

    def clear(self) -> None:
        self.entries.clear()
        self.added = 0
        self._second = 0.0

    def expire(self, t: int, span_ns: int) -> bool:
        """Drop the readings `span_ns` or more before t; whether any went."""
        entries = self.entries
        n = 0
        while n < len(entries) and t - entries[n][0] >= span_ns:
            n += 1
        if n:
            del entries[:n]
            self._second = None
        return n > 0

    def add(self, t: int, value: float) -> None:
        kept = []
        for entry in self.entries:
            if entry[1] <= value:
                if entry[2]:  # its second later reading at least as large: never one of the two again
                    continue
                entry[2] = 1
            kept.append(entry)
        if self.max_kept is not None and kept and kept[0][3] < self.added + 1 - self.max_kept:
            del kept[0]  # the bounded window's oldest reading leaves as this one comes
        kept.append([t, value, 0, self.added])
        self.entries = kept
        self.added += 1
        self._second = None

    def second(self) -> float:
        """The second-largest value (0.0 with fewer than two readings)."""
        if self._second is None:
            first = second = -math.inf
            for entry in self.entries:
                v = entry[1]
                if v > first:
                    first, second = v, first
                elif v > second:
                    second = v
            self._second = second if len(self.entries) >= 2 else 0.0
        return self._second


class _UnitRun:
    """A run of lead_rel_speed readings taken to be in the unit (rel_unit) since the step to it. It ends
    when a reading is back near the last one divided by the factor; jumps by more than half that step
    (noise, or a spike the step was part of); the gap over the last `gap_window_s` agrees with the
    readings as read rather than divided by the factor (by `gap_floor_m` or more); or after
    `step_hold_s`, unless the gap then agrees with the divided readings by that much (a unit error
    that persists)."""

    __slots__ = ("step", "t", "integral", "recent", "settings", "hold_ns", "window_ns")

    def __init__(
        self,
        step: float,
        t0: int,
        g0: float,
        t: int,
        gap: float,
        integral: float,
        settings: SignalSettings,
        hold_ns: int,
        window_ns: int,
    ):
        self.step = step  # m/s
        self.t = t  # ns of the step
        self.integral = integral  # m: the readings' integral since the reading before the step
        # (ns, gap, integral) of the window's readings, oldest first
        self.recent: deque[tuple[int, float, float]] = deque([(t0, g0, 0.0), (t, gap, integral)], maxlen=_MAX_KEPT)
        self.settings = settings
        self.hold_ns, self.window_ns = hold_ns, window_ns  # the monitor's step_hold_s and gap_window_s in ns

    def advance(self, rel: float, r0: float, distance: float, t: int, dt: float) -> bool:
        """Take the next reading (rel, after r0, dt s later; the gap `distance`); whether the run ends."""
        s = self.settings
        factor = s.rel_unit_factor
        if abs(rel - r0 / factor) <= 0.25 * abs(rel - r0) or abs(rel - r0) > 0.5 * self.step:
            return True
        self.integral += 0.5 * (rel + r0) * dt
        recent = self.recent
        recent.append((t, distance, self.integral))
        while len(recent) > 2 and t - recent[1][0] >= self.window_ns:
            recent.popleft()
        _, g_first, i_first = recent[0]
        moved, integral = distance - g_first, self.integral - i_first
        as_read, divided = abs(moved - integral), abs(moved - integral / factor)
        if divided - as_read >= s.gap_floor_m:
            return True
        return t - self.t > self.hold_ns and not as_read - divided >= s.gap_floor_m


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
        "repeats",
        "ref",
        "prior",
        "prior_t",
        "step_t",
        "rel_last",
        "rel_top",
        "rel_score",
        "unit",
        "rel_before",
        "trend",
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
        self.jumps = _TopTwo(_MAX_KEPT)  # |innovation| of the window's large ones
        self.toggles: deque[int] = deque(maxlen=_MAX_KEPT)  # ns of each toggle in the window
        self.present = _NAN
        # per pair (speed, gap): the integrated signal's run (integral of the rate over it; NaN: no
        # run) and the rate's run (the integrated signal, the rate and the ns when it began; None: none)
        self.repeats: list[list[Any]] = [[_NAN, None], [_NAN, None]]
        self.ref = _NAN  # m: the gap's track at the last reading (NaN: no track)
        self.prior = _NAN  # m: the track before its last restart (NaN: none kept)
        self.prior_t = -1  # ns of that restart
        self.step_t = -1  # ns of the first of the current run of distrusted readings (-1: none)
        # rel_accel: the last lead reading (ns, gap, rel), and the rates of the hold time
        self.rel_last: tuple[int, float, float] | None = None
        self.rel_top = _TopTwo()
        self.rel_score = 0.0  # the second-largest of rel_top (0 with fewer than two)
        self.unit: _UnitRun | None = None  # rel_unit: the current run of readings in the unit (None: none)
        self.rel_before = _NAN  # rel_unit: the lead reading before the last (NaN: none)
        # rel_sign: (ns, gap, the relative speed's integral since the window began) of the window's readings
        self.trend: deque[tuple[int, float, float]] = deque(maxlen=_MAX_KEPT)
        self.out: Scores = (_NAN,) * 10


def compiled_available() -> bool:
    """The C update (``ood._signals``) was built and imports."""
    return _compiled is not None


_wanted = os.environ.get("DUALLOOP_SIGNALS_PURE_PYTHON", "") in ("", "0")


def compiled_wanted() -> bool:
    """Whether monitors take the C update by default: built, and not refused (the environment, or
    `use_compiled(False)`)."""
    return _compiled is not None and _wanted


def use_compiled(on: bool) -> bool:
    """Choose the default path of monitors built from now on (those built before keep theirs); returns
    the previous choice, to restore it."""
    global _wanted
    before, _wanted = _wanted, bool(on)
    return before


class SignalMonitor:
    """The ten checks for `n_slots` sessions on a feature schema (`feature_names`). `compiled`: the C
    update (None: where it was built, unless the environment refuses it; True: it, or an error)."""

    def __init__(
        self, n_slots: int, settings: SignalSettings, feature_names: Sequence[str], compiled: bool | None = None
    ) -> None:
        names = list(feature_names)
        s = settings
        self.settings = s
        wanted = (s.speed_feature, s.accel_feature, s.present_feature, s.distance_feature, s.rel_speed_feature)
        # position of each signal in the features (-1: the schema lacks it)
        self.at = tuple(names.index(n) if n in names else -1 for n in wanted)
        self.thresholds = s.thresholds
        # per slot: which signals its session measures (speed, accel, present, distance, rel)
        self._measures: list[tuple[bool, ...]] = [tuple(a >= 0 for a in self.at)] * n_slots
        self._window_ns = int(s.speed_window_s * 1e9)
        self._flicker_ns = int(s.flicker_window_s * 1e9)
        self._max_gap_ns = int(s.max_gap_s * 1e9)
        self._gap_window_ns = int(s.gap_window_s * 1e9)
        self._step_hold_ns = int(s.step_hold_s * 1e9)
        self._step_confirm_ns = int(s.step_confirm_s * 1e9)
        self._prior_ns = int(s.prior_keep_s * 1e9)
        self._hold_ns = int(s.hold_s * 1e9)
        self._sign_ns = int(s.rel_sign_window_s * 1e9)
        self._gap_jump_m = s.gap_jump_m
        if compiled and _compiled is None:
            raise RuntimeError("signal checks: the C update (ood._signals) was not built; reinstall (pip install -e .)")
        # the C update's state for every slot (None: the Python path's _Slot)
        self._checks: Any = None
        self._slots: list[_Slot] = []
        if compiled or (compiled is None and compiled_wanted()):
            self._checks = _compiled.Checks(n_slots, self._compiled_settings(), self._compiled_nanos(), self.thresholds)
        else:
            self._slots = [_Slot() for _ in range(n_slots)]

    @property
    def is_compiled(self) -> bool:
        return self._checks is not None

    def _compiled_settings(self) -> tuple[float, ...]:
        """The settings the C update reads, in the order of its `enum Setting`."""
        s = self.settings
        return (
            s.moving_speed,
            s.stuck_s,
            s.gap_jump_m,
            s.gap_floor_m,
            s.new_lead_rel_jump,
            s.gap_step_max_m,
            s.gap_unit_factor,
            s.gap_unit_tolerance,
            s.rel_span_s,
            s.rel_floor_m_s2,
            s.rel_unit_factor,
            s.rel_unit_tolerance,
            s.rel_unit_m_s,
        )

    def _compiled_nanos(self) -> tuple[int, ...]:
        """The durations the C update reads, in ns, in the order of its `enum Nanos`."""
        return (
            self._window_ns,
            self._flicker_ns,
            self._max_gap_ns,
            self._gap_window_ns,
            self._step_hold_ns,
            self._step_confirm_ns,
            self._prior_ns,
            self._hold_ns,
            self._sign_ns,
        )

    def _readings(self, x: npt.NDArray[Any]) -> npt.NDArray[np.float64]:
        """(rows, 5) float64: each row's five readings (NaN where the schema lacks the signal)."""
        at = self.at
        if min(at) >= 0:
            return np.ascontiguousarray(x[:, at], np.float64)
        out = np.full((len(x), len(at)), _NAN)
        for k, a in enumerate(at):
            if a >= 0:
                out[:, k] = x[:, a]
        return out

    @property
    def available(self) -> bool:
        """Whether the schema has anything these checks read (the ego speed at least)."""
        return self.at[0] >= 0

    def set_present(self, slot: int, present: npt.NDArray[np.bool_] | None) -> None:
        """The features the slot's session measures (None: all the schema has)."""
        self._measures[slot] = tuple(a >= 0 and (present is None or bool(present[a])) for a in self.at)
        if self._checks is not None:
            self._checks.measure(slot, self._measures[slot])

    def reset(self, slot: int) -> None:
        self._measures[slot] = tuple(a >= 0 for a in self.at)
        if self._checks is not None:
            self._checks.reset(slot, self._measures[slot])
        else:
            self._slots[slot] = _Slot()

    def applies(self, slot: int) -> tuple[bool, ...]:
        """Which checks can judge this slot's session at all (its sensor profile measures their signals)."""
        speed, accel, present, distance, rel = self._measures[slot]
        lead = present and distance and rel
        return speed, speed and accel, lead, present, speed and accel, speed and lead, lead, lead, lead, lead

    def step(
        self,
        x: npt.NDArray[Any],
        slots: Sequence[int],
        fresh: Sequence[bool],
        times: Sequence[int],
        veto: list[bool] | None = None,
    ) -> list[Scores]:
        """Each row's ten scores (NaN: no verdict) after this tick; rows x (batch, features) raw inputs.
        `veto`, one item per row, is set True where a row's scores veto (a score above its threshold)."""
        if self._checks is not None:
            result: list[Scores] = self._checks.step(self._readings(x), slots, fresh, times, veto)
            return result
        at = self.at
        # every row's five readings as Python floats in one conversion (the schema has them all)
        rows = x[:, at].tolist() if min(at) >= 0 else [[r[a] if a >= 0 else _NAN for a in at] for r in x.tolist()]
        states, measures, update = self._slots, self._measures, self._update
        out = []
        for slot, is_fresh, t, values in zip(slots, fresh, times, rows):
            state = states[slot]
            if is_fresh:
                state.out = update(state, measures[slot], int(t), values)
            out.append(state.out)
        if veto is not None:
            limits = self.thresholds
            for i, row in enumerate(out):
                if any(v > lim for v, lim in zip(row, limits)):  # NaN: no verdict
                    veto[i] = True
        return out

    def scan(self, x: npt.NDArray[Any], slot: int, times: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        """The scores (rows, 10) after each of a session's fresh observations in turn (a replay's rows
        the ticks used), leaving the slot as live ticks would."""
        if self._checks is not None:
            out = np.empty((len(x), len(CHECKS)))
            self._checks.scan(self._readings(x), slot, np.ascontiguousarray(times, np.int64), out)
            return out
        state, measures = self._slots[slot], self._measures[slot]
        cols = [x[:, a].tolist() if a >= 0 else [_NAN] * len(x) for a in self.at]
        out = np.empty((len(x), len(CHECKS)))
        for k, (t, *values) in enumerate(zip(times.tolist(), *cols)):
            state.out = self._update(state, measures, t, values)
            out[k] = state.out
        return out

    def _update(self, st: _Slot, measures: tuple[bool, ...], t: int, values: list[float]) -> Scores:
        """One fresh observation at t ns (values: speed, accel, present, distance, rel as floats)."""
        m_speed, m_accel, m_present, m_distance, m_rel = measures
        s = self.settings
        if st.t >= 0 and (t - st.t > self._max_gap_ns or t <= st.t):  # a pause: nothing carries over
            st.clear()
        last = st.last or [_NAN] * 5
        # how long the gap had been stuck before this reading (a jump after it is its catch-up); before
        # the stuck check moves its run
        gap_stuck_s = (st.t - st.run_start[1]) * 1e-9 if st.run_start[1] >= 0 else 0.0
        rel_stuck_s = (st.t - st.run_start[2]) * 1e-9 if st.run_start[2] >= 0 else 0.0
        stuck = self._stuck(st, measures, t, values, last) if m_speed else _NAN
        speed_accel = self._speed_accel(st, t, values, last) if m_speed and m_accel else _NAN
        gap_rate = self._gap_rate(st, t, values, gap_stuck_s) if m_present and m_distance and m_rel else _NAN
        flicker = self._flicker(st, t, values[2]) if m_present else _NAN
        speed_repeat = gap_repeat = gap_step = _NAN
        if m_speed and m_accel:
            moving = abs(values[0]) > s.moving_speed
            speed_repeat = self._repeat(st.repeats[0], st.t, t, values[0], values[1], last[0], last[1], moving)
        if m_present and m_distance and m_rel and values[2] != 1.0:  # no lead: no verdict
            st.repeats[1] = [_NAN, None]
        elif m_present and m_distance and m_rel:
            lead = abs(values[0]) > s.moving_speed and last[2] == 1.0
            gap_repeat = self._repeat(st.repeats[1], st.t, t, values[3], values[4], last[3], last[4], lead)
        rel_accel = rel_unit = rel_sign = _NAN
        if m_present and m_distance and m_rel:
            gap_step = self._gap_step(st, t, values, last, gap_stuck_s)
            rel_unit = self._rel_unit(st, t, values, last, rel_stuck_s)
            rel_accel = self._rel_accel(st, t, values)
            rel_sign = self._rel_sign(st, t, values, last)
        st.t = t
        st.last = values
        scores = (
            stuck,
            speed_accel,
            gap_rate,
            flicker,
            speed_repeat,
            gap_repeat,
            gap_step,
            rel_accel,
            rel_unit,
            rel_sign,
        )
        # finite by contract (DecisionSnapshot.checks): readings near the float64 limits overflow the
        # physics (a rate times a time); the cap still vetoes, NaN stays "no verdict" (max() would
        # not see past a NaN, hence the comparisons)
        cap = _SCORE_CAP
        if (
            stuck > cap
            or speed_accel > cap
            or gap_rate > cap
            or flicker > cap
            or speed_repeat > cap
            or gap_repeat > cap
            or gap_step > cap
            or rel_accel > cap
            or rel_unit > cap
            or rel_sign > cap
        ):
            return tuple(cap if v > cap else v for v in scores)  # type: ignore[return-value]
        return scores

    def _stuck(self, st: _Slot, measures: tuple[bool, ...], t: int, values: list[float], last: list[float]) -> float:
        """stuck: bit-identical readings while moving (and, for the lead, a lead present)."""
        speed = values[0]
        moving = speed == speed and abs(speed) > self.settings.moving_speed and st.t >= 0
        lead = moving and measures[2] and values[2] == 1.0
        runs = st.run_start
        stuck = 0.0
        # (run, reading, judged): the speed while moving, the gap and the relative speed also with a lead
        for j, idx, judged in ((0, 0, moving), (1, 3, lead and measures[3]), (2, 4, lead and measures[4])):
            if judged and values[idx] == last[idx]:  # a repeat
                if runs[j] < 0:
                    runs[j] = st.t  # the run began with the previous reading
                stuck = max(stuck, (t - runs[j]) * 1e-9)
            else:
                runs[j] = -1
        return stuck

    @staticmethod
    def _repeat(
        runs: list[Any], t0: int, t: int, x: float, rate: float, x0: float, rate0: float, judged: bool
    ) -> float:
        """speed_repeat / gap_repeat for one pair: how far a repeated signal should have moved (its own
        units; 0 without a repeat, NaN without a verdict). `runs` is the pair's state, t0 the previous
        fresh observation's ns and x0, rate0 its readings (NaN: none)."""
        if not (judged and t0 >= 0 and x == x and rate == rate and x0 == x0 and rate0 == rate0):
            runs[0], runs[1] = _NAN, None
            return _NAN if x != x or rate != rate else 0.0
        score = 0.0
        if x == x0:  # the integrated signal repeats: it should have moved by the rate's integral
            integral = (runs[0] if runs[0] == runs[0] else 0.0) + 0.5 * (rate + rate0) * ((t - t0) * 1e-9)
            runs[0] = integral
            score = abs(integral)
        else:
            runs[0] = _NAN
        if rate == rate0:  # the rate repeats: the integrated signal's change it does not explain
            if runs[1] is None:
                runs[1] = (x0, rate0, t0)  # the run began with the previous reading
            xs, rs, ts = runs[1]
            score = max(score, abs((x - xs) - rs * ((t - ts) * 1e-9)))
        else:
            runs[1] = None
        return score

    def _gap_step(self, st: _Slot, t: int, values: list[float], last: list[float], gap_stuck_s: float) -> float:
        """gap_step: how far a reading is from the gap's track (the readings it trusted, moved on by
        the relative speed); a reading 6 m or more off is not trusted and leaves the track as it was."""
        s = self.settings
        present, distance, rel = values[2], values[3], values[4]
        if not (present == 1.0 and distance == distance and rel == rel):
            st.ref, st.step_t, st.prior = _NAN, -1, _NAN
            return _NAN
        g0, r0 = last[3], last[4]
        if st.t < 0 or last[2] != 1.0 or g0 != g0 or r0 != r0 or st.ref != st.ref:  # a new track
            st.ref, st.step_t, st.prior = distance, -1, _NAN
            return 0.0
        moved = 0.5 * (rel + r0) * ((t - st.t) * 1e-9)  # what the relative speed explains
        step = (distance - g0) - moved  # the innovation since the previous reading
        jump = abs(step) >= s.gap_jump_m
        # a new lead: the relative speed jumps with the gap; a new target: the gap jumps further than
        # any plausible offset (the lead left the lane and the next car ahead, at the same speed, leads)
        # (a gap of exactly 0 m with the lead flag set is a dropped reading, never a new lead: none is that near)
        new_lead = jump and abs(rel - r0) >= s.new_lead_rel_jump and distance != 0.0
        young = st.step_t >= 0 and t - st.step_t < self._step_confirm_ns
        predicted = st.ref + moved
        if st.prior == st.prior:  # the track before the last restart, for a while
            st.prior = st.prior + moved if t - st.prior_t <= self._prior_ns else _NAN
        # ... unless it is the track in another unit at an unchanged relative speed: a gap read in feet
        unit_step = not new_lead and self._unit_step(distance, predicted)
        new_target = jump and abs(step) >= s.gap_step_max_m and not unit_step and distance != 0.0
        if new_target or (jump and gap_stuck_s > s.stuck_s) or (new_lead and young):
            # a new target, a stuck gap catching up, or a new lead right after a distrusted reading (that
            # reading may have been a spike): a new track from this reading, the old one kept a while in
            # case this reading was the spike
            if st.prior != st.prior:  # a spike train restarts again and again: keep the first track
                st.prior, st.prior_t = predicted, t
            st.ref, st.step_t = distance, -1
            return 0.0
        if new_lead:  # a biased radar reads the next lead too far as well: the track follows the new lead
            predicted += step
        off = abs(distance - predicted)
        if off >= s.gap_jump_m and abs(distance - st.prior) < s.gap_jump_m:  # back on the old track
            off = abs(distance - st.prior)
            st.prior = _NAN
        if off < s.gap_jump_m:  # trusted: the track is this reading
            st.ref, st.step_t = distance, -1
            return off
        st.ref = predicted
        if st.step_t < 0:
            st.step_t = t
        elif t - st.step_t > self._step_hold_ns:  # off for so long that the track was the wrong one
            st.ref, st.step_t = distance, -1
            return 0.0
        return off

    def _unit_step(self, distance: float, predicted: float) -> bool:
        """Whether a reading is the track times the unit factor, within the tolerance (a gap switched to
        feet): such a step is a fault, not a new target. Only upwards: the step back down ends the fault
        (and a track restarted on a new lead during the fault reads in feet), and a gap read too short
        errs towards braking."""
        s = self.settings
        return predicted > 0.0 and abs(distance / (predicted * s.gap_unit_factor) - 1.0) <= s.gap_unit_tolerance

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

    def _rel_accel(self, st: _Slot, t: int, values: list[float]) -> float:
        """rel_accel: the relative speed's change since the previous reading over the time between them
        (at least the span), the second-largest of the hold time."""
        present, distance, rel = values[2], values[3], values[4]
        if not (present == 1.0 and distance == distance and rel == rel):
            st.rel_last = None
            st.rel_top.clear()
            st.rel_score = 0.0
            return _NAN
        last, st.rel_last = st.rel_last, (t, distance, rel)
        top = st.rel_top
        entries = top.entries
        changed = bool(entries) and t - entries[0][0] >= self._hold_ns and top.expire(t, self._hold_ns)
        if last is not None:
            t1, g1, r1 = last
            dt = (t - t1) * 1e-9
            # a step of the gap the relative speed does not explain is a new lead, whose relative speed
            # is another car's; a rate below the floor can never be one of two above the threshold
            if abs((distance - g1) - 0.5 * (rel + r1) * dt) < self.settings.gap_jump_m:
                rate = abs(rel - r1) / max(dt, self.settings.rel_span_s)
                if rate >= self.settings.rel_floor_m_s2:
                    top.add(t, rate)
                    changed = True
        if changed:
            st.rel_score = top.second()
        return st.rel_score

    def _rel_unit(self, st: _Slot, t: int, values: list[float], last: list[float], stuck_s: float) -> float:
        """rel_unit: the step to the unit factor times the previous reading that began the current run
        of readings in that unit, m/s (0: none; only steps above the threshold begin one)."""
        s = self.settings
        present, distance, rel = values[2], values[3], values[4]
        r0, g0 = last[4], last[3]
        before, st.rel_before = st.rel_before, r0
        if not (present == 1.0 and distance == distance and rel == rel):
            st.unit, st.rel_before = None, _NAN
            return _NAN
        if not (st.t >= 0 and last[2] == 1.0 and r0 == r0 and g0 == g0):
            st.unit, st.rel_before = None, _NAN
            return 0.0
        factor = s.rel_unit_factor
        dt = (t - st.t) * 1e-9
        # a step of the gap the relative speed does not explain: a new lead, whose relative speed is its own
        new_lead = abs((distance - g0) - 0.5 * (rel + r0) * dt) >= s.gap_jump_m
        run = st.unit
        if run is not None:
            if new_lead or run.advance(rel, r0, distance, t, dt):
                st.unit = run = None
            return 0.0 if run is None else run.step
        # where the reading would be by the last two (a 10 Hz relative speed moves 0.1 m/s between readings)
        expected = 2.0 * r0 - before if before == before else r0
        step = abs(rel - r0)
        unit = abs(rel - expected * factor) <= s.rel_unit_tolerance * abs(expected * factor)
        # a reading back near the one before the last ends a dip of noise (a 200 Hz radar's), whose
        # trend through the dip the step would otherwise match
        unit = unit and not abs(rel - before) <= s.rel_unit_m_s
        # a step after the reading was stuck longer than the stuck check allows is its catch-up
        if not new_lead and step > s.rel_unit_m_s and unit and stuck_s <= s.stuck_s:
            integral = 0.5 * (rel + r0) * dt
            st.unit = _UnitRun(step, st.t, g0, t, distance, integral, s, self._step_hold_ns, self._gap_window_ns)
            return step
        return 0.0

    def _rel_sign(self, st: _Slot, t: int, values: list[float], last: list[float]) -> float:
        """rel_sign: the gap's change and the relative speed's integral over the window where they go
        opposite ways (the smaller of the two), m; 0 where they agree."""
        present, distance, rel = values[2], values[3], values[4]
        trend = st.trend
        if not (present == 1.0 and distance == distance and rel == rel):
            trend.clear()
            return _NAN
        integral = 0.0
        if trend:  # the previous reading was a lead reading too (the window is cleared otherwise)
            moved = 0.5 * (rel + last[4]) * ((t - st.t) * 1e-9)
            if abs((distance - last[3]) - moved) >= self._gap_jump_m:  # a new lead: a window afresh
                trend.clear()
            else:
                integral = trend[-1][2] + moved
        trend.append((t, distance, integral))
        if len(trend) > 2 and t - trend[1][0] >= self._sign_ns:
            trend.popleft()  # keep one reading at least the window old
            while len(trend) > 2 and t - trend[1][0] >= self._sign_ns:
                trend.popleft()
        _, g_first, i_first = trend[0]
        change, integral = distance - g_first, integral - i_first
        if change * integral >= 0.0:  # the same way, or either still
            return 0.0
        return min(abs(change), abs(integral))

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
                jumps.add(t, e)
        entries = jumps.entries
        if entries and t - entries[0][0] >= self._gap_window_ns:
            jumps.expire(t, self._gap_window_ns)
        if len(jumps.entries) >= 2:  # the second-largest innovation in the window
            gap_rate = jumps.second()
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
