"""The lead's readings when one of the gap and the relative speed fails and the other stays healthy.

A float sensor read while the lead moves does not repeat its value bit for bit for long: the
`gap_repeat` check vetoes a run of repeats that physics says should have moved, and the threat
assessor may not read the stuck signal. It may read the healthy one, and from it stand in for the
stuck one (`LeadRuns`, followed on every tick by the live tick and by the replay alike):

- the gap stuck: its last reading before it stuck, moved on by the relative speed's integral since
  (trapezoids over ticks), while the relative speed keeps changing and never steps as at another lead;
- the relative speed stuck: the gap's rate, a least-squares line through its distinct readings of the
  last `rate_window_s`, while the gap keeps changing.

Which of the two stuck is the one that has repeated longer; one that has repeated for more than
`stuck_after_s` is never the healthy one. Without this, a lead braking hard behind either stuck
reading was met at the fallback's 3 m/s^2.

A relative speed the checks doubt alone (its sign against the gap's trend, its unit, its rate of
change: `rel_sign`, `rel_unit`, `rel_accel`) is stood in for by the gap's rate too, over the gap's
distinct readings of the last `rate_window_s` whatever the relative speed did meanwhile: told the lead
pulls away, the model does not brake for a lead braking hard, and without a stand-in neither did the
fallback.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

_NAN = math.nan


class LeadDoubt(IntEnum):
    """What the per-signal checks leave the threat assessor of a tick's lead readings."""

    NONE = 0  # no check of the lead's readings vetoed
    ONE_STUCK = 1  # only the gap's repeat check (and its rate) vetoed: one of gap and relative speed stuck
    ALL = 2  # the flag, the gap and the relative speed are all doubted
    REL_DOUBTED = 3  # a check of the relative speed alone vetoed (and of the gap's, at most its rate and repeat)
    REL_AGAINST_TREND = 4  # as REL_DOUBTED, the relative speed's sign against the gap's trend among them


class TimedReadings:
    """(tick ns, value) readings, oldest first, the newest `maxlen` at most (as a deque with maxlen).
    Two flat arrays, which the garbage collector does not walk: a deque of up to 256 tuples per
    session and run was most of what a full collection still visited at 512 sessions."""

    __slots__ = ("maxlen", "_t", "_x", "_start")

    def __init__(self, maxlen: int = 256) -> None:
        self.maxlen = maxlen
        self._t = array("q")
        self._x = array("d")
        self._start = 0  # readings before it were dropped (trimmed in one go once there are maxlen)

    def __len__(self) -> int:
        return len(self._t) - self._start

    def __iter__(self) -> Iterator[tuple[int, float]]:
        start = self._start
        return zip(self._t[start:], self._x[start:])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TimedReadings) and self.maxlen == other.maxlen and list(self) == list(other)

    def __repr__(self) -> str:
        return f"TimedReadings({list(self)!r}, maxlen={self.maxlen})"

    def clear(self) -> None:
        del self._t[:], self._x[:]
        self._start = 0

    def restart(self, t_ns: int, value: float) -> None:
        """clear, then append."""
        t, x = self._t, self._x
        del t[:], x[:]
        t.append(t_ns)
        x.append(value)
        self._start = 0

    def append(self, t_ns: int, value: float, forget_before_ns: int | None = None) -> None:
        """Add the newest reading; with forget_before_ns, then `drop_older_than` it (one call per tick)."""
        t = self._t
        t.append(t_ns)
        self._x.append(value)
        start = self._start
        if len(t) - start > self.maxlen:
            start += 1
        if forget_before_ns is not None:
            end = len(t)
            while start < end and t[start] < forget_before_ns:
                start += 1
        if start >= self.maxlen:  # `_forget`, inline: once a tick
            del t[:start], self._x[:start]
            start = 0
        self._start = start

    def drop_older_than(self, cutoff_ns: int) -> None:
        """Forget every reading before cutoff_ns."""
        t, start, end = self._t, self._start, len(self._t)
        while start < end and t[start] < cutoff_ns:
            start += 1
        if start != self._start:
            self._forget(start)

    def keep_one_at_or_before(self, cutoff_ns: int) -> None:
        """Forget the oldest readings while the next is at or before cutoff_ns too and more than two are kept."""
        t, start, end = self._t, self._start, len(self._t)
        while end - start > 2 and t[start + 1] <= cutoff_ns:
            start += 1
        if start != self._start:
            self._forget(start)

    def _forget(self, start: int) -> None:
        """Readings before index `start` forgotten: trimmed from the arrays once there are maxlen."""
        if start >= self.maxlen:
            del self._t[:start], self._x[:start]
            start = 0
        self._start = start


@dataclass(slots=True)
class LeadRuns:
    """The current runs of bit-identical gap and relative-speed readings, with what each run keeps
    of the other signal: the relative speed's integral over the gap's run (m), the gap's distinct
    readings (tick ns, m) over the relative speed's run; and the gap's distinct readings of the last
    rate window whatever the relative speed did (`trend`). -1 / NaN: no run."""

    gap: float = _NAN
    gap_since: int = -1
    moved: float = 0.0
    new_lead: bool = False  # the relative speed stepped as at another lead during the gap's run
    rel: float = _NAN
    rel_since: int = -1
    gaps: TimedReadings = field(default_factory=TimedReadings)
    trend: TimedReadings = field(default_factory=TimedReadings)
    last_ns: int = -1

    def reset(self) -> None:
        self.gap, self.gap_since, self.moved, self.new_lead = _NAN, -1, 0.0, False
        self.rel, self.rel_since, self.last_ns = _NAN, -1, -1
        self.gaps.clear()
        self.trend.clear()

    def start(self, now_ns: int, gap: float, rel: float) -> None:
        self.gap, self.gap_since, self.moved, self.new_lead = gap, now_ns, 0.0, False
        self.rel, self.rel_since, self.last_ns = rel, now_ns, now_ns
        self.gaps.restart(now_ns, gap)
        self.trend.restart(now_ns, gap)


class StuckReadings:
    """Follows a session's LeadRuns and stands in for the stuck reading of the two."""

    def __init__(
        self, stale_s: float, reckon_s: float, stuck_after_s: float, new_lead_rel_step: float, rate_window_s: float
    ) -> None:
        """`stale_s`: a longer pause between ticks starts the runs afresh; `reckon_s`: the longest a
        stuck gap is reckoned; `new_lead_rel_step`: a step of the relative speed (m/s) between ticks
        that says another lead; the other two as the module says."""
        self._stale_ns = int(stale_s * 1e9)
        self._reckon_ns = int(reckon_s * 1e9)
        self._stuck_ns = int(stuck_after_s * 1e9)
        self._window_ns = int(rate_window_s * 1e9)
        self._rel_step = new_lead_rel_step

    def follow(self, run: LeadRuns, now_ns: int, present: float, gap: float, rel: float) -> None:
        """Advance the runs by one tick's readings (NaN present: none may be read)."""
        if not (present == 1.0 and math.isfinite(gap) and math.isfinite(rel)):
            run.reset()
            return
        if run.last_ns < 0 or now_ns - run.last_ns > self._stale_ns:
            run.start(now_ns, gap, rel)
            return
        new_gap = gap != run.gap
        trend = run.trend
        window_start = now_ns - self._window_ns
        if new_gap:
            run.gap, run.gap_since, run.moved, run.new_lead = gap, now_ns, 0.0, False
            trend.append(now_ns, gap, window_start)
        else:
            run.moved += 0.5 * (rel + run.rel) * ((now_ns - run.last_ns) * 1e-9)
            trend.drop_older_than(window_start)
        gaps = run.gaps
        if rel != run.rel:
            run.new_lead = run.new_lead or abs(rel - run.rel) >= self._rel_step
            run.rel, run.rel_since = rel, now_ns
            gaps.restart(now_ns, gap)
        elif new_gap:
            gaps.append(now_ns, gap)
            gaps.keep_one_at_or_before(window_start)  # one reading at least the window old
        run.last_ns = now_ns

    def follow_rows(self, run: LeadRuns, ticks_ns: np.ndarray, lead: np.ndarray) -> None:
        """`follow` over consecutive ticks (a replay's run of clean ticks; `lead` (ticks, 3) the flag,
        gap and relative speed, NaN where a row may not be read), leaving the runs exactly as tick by
        tick: only the ticks from where both runs last started and the rate window's (or all were reset)
        are stepped."""
        n = len(ticks_ns)
        if n == 0:
            return
        p, g, r = lead[:, 0], lead[:, 1], lead[:, 2]
        ok = (p == 1.0) & np.isfinite(g) & np.isfinite(r)
        before = np.concatenate(([run.last_ns], ticks_ns[:-1])).astype(np.int64)
        reset = ~ok | (before < 0) | (ticks_ns - before > self._stale_ns)
        reset[1:] |= ~ok[:-1]
        new_gap = np.flatnonzero(g[1:] != g[:-1]) + 1
        new_rel = np.flatnonzero(r[1:] != r[:-1]) + 1
        last_reset = int(np.flatnonzero(reset)[-1]) if reset.any() else -1
        both = min(int(new_gap[-1]) if new_gap.size else -1, int(new_rel[-1]) if new_rel.size else -1)
        window = int(np.searchsorted(ticks_ns, ticks_ns[-1] - self._window_ns))  # the trend's first tick
        first = max(last_reset, min(both, window))
        if first > 0 and not ok[first - 1]:
            run.reset()
        elif first > 0:  # the tick before as the runs' last readings: the run `first` continues restarts later
            run.gap, run.rel, run.last_ns = float(g[first - 1]), float(r[first - 1]), int(ticks_ns[first - 1])
        for k in range(max(first, 0), n):
            self.follow(run, int(ticks_ns[k]), float(p[k]), float(g[k]), float(r[k]))

    def stand_in(
        self, run: LeadRuns, now_ns: int, gap: float, rel: float, doubt: LeadDoubt = LeadDoubt.ONE_STUCK
    ) -> tuple[float, float]:
        """This tick's (gap, relative speed) with the doubted one of the two replaced by what the other
        says: the stuck one (ONE_STUCK), the relative speed (REL_DOUBTED); NaN for both where the
        other cannot be told healthy."""
        if run.last_ns != now_ns or gap != run.gap or rel != run.rel:
            return _NAN, _NAN
        gap_for, rel_for = now_ns - run.gap_since, now_ns - run.rel_since
        if doubt == LeadDoubt.REL_DOUBTED or doubt == LeadDoubt.REL_AGAINST_TREND:  # the gap, unless stuck itself
            if gap_for > self._stuck_ns:
                return _NAN, _NAN
            return gap, _least_squares_rate(run.trend, now_ns, self._window_ns)
        if gap_for > rel_for and rel_for <= self._stuck_ns:  # the gap stuck
            if run.new_lead or gap_for > self._reckon_ns:
                return _NAN, _NAN
            return max(run.gap + run.moved, 1e-3), rel  # reckoned, never the 0 m of a dropped reading
        if rel_for > gap_for and gap_for <= self._stuck_ns:  # the relative speed stuck
            return gap, _least_squares_rate(run.gaps, now_ns, self._window_ns)
        return _NAN, _NAN


def _least_squares_rate(gaps: TimedReadings, now_ns: int, window_ns: int) -> float:
    """The least-squares slope (m/s) of the gap's distinct readings of the last window; NaN with
    fewer than three or spanning less than half the window."""
    readings = [(t, x) for t, x in gaps if now_ns - t <= window_ns]
    if len(readings) < 3 or readings[-1][0] - readings[0][0] < window_ns // 2:
        return _NAN
    t0 = readings[0][0]
    ts = [(t - t0) * 1e-9 for t, _ in readings]
    mean_t = sum(ts) / len(ts)
    mean_x = sum(x for _, x in readings) / len(readings)
    sxx = sum((t - mean_t) ** 2 for t in ts)
    sxy = sum((t - mean_t) * (x - mean_x) for t, (_, x) in zip(ts, readings))
    return sxy / sxx
