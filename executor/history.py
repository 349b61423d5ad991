"""History features: what a session's own recent observations say, derived by the executor.

One observation holds the state but not where it is heading: the human's look-ahead action is far
better predicted from how the speed, the acceleration and the lead have been changing over the last
second (docs/measurements.md, docs/contract.md#history-features). A model whose card lists
`history_features` gets them after the wire features; the executor derives them from the session's
own observation stream (every observation received, also those conflated away before a tick), so a
client sends nothing new, but dropped observations and jittery timestamps change what it sees.

Definitions (t in integer ns of sensor time; observation i of a session; only j <= i are used):

    bin(x, e)[i] = mean of x_j over the newest <= K observations j <= i with
                   t_i - e - BIN < t_j - TOL <= t_i - e             (BIN = 0.1 s, TOL = 1 ms, K = 32)
                   (at 10 Hz one observation, at 100 Hz ten: sample-and-hold noise averages out);
                   an empty bin is the value of the last observation at or before t_i - e + TOL
    past(e) ok   = that last observation exists and 0 < t_i - t_jl <= e + GAP    (GAP = 0.3 s)
    slope(x, D)  = (bin(x, 0) - bin(x, D)) / D                       (D in s, the nominal window)

    name                         x                              D     unit    fallback
    speed_slope_{0.1,0.2,0.3}s   ego_speed                      D     m/s^2   current ego_accel
    accel_change_{0.2,0.5}s      ego_accel                      D     m/s^3   0
    lead_rel_speed_slope_{0.2,0.5}s lead_rel_speed              D     m/s^2   0, also without a lead
    lead_distance_slope_0.5s     lead_distance                  0.5   m/s     0, also without a lead
    lead_accel_{0.5,1.0}s        ego_speed + lead_rel_speed     D     m/s^2   0, also without a lead

The fallback ("nothing changed") applies where past(D) is not ok (the session's first D seconds, a
gap in the stream) or the slope is not finite; "without a lead": lead_present < 0.5 at t_i or at
t_jl (a lead switch is not a change). A history feature is missing (masked, like a wire feature)
when a feature it needs (x, lead_present) is not in the session's sensor profile; a fallback the
profile does not measure stands in as 0 (a stack without an accelerometer still gets the speed's slopes).

Batch (replay, training) and live (a per-session ring buffer of the last HORIZON seconds) run the
same `HistoryDeriver.derive` on the same observations, with float64 inside and one float32 cast at
the end; bins are summed newest first with explicit adds, starting from +0.0, so both give the same
bits whatever the array lengths (tests/executor/test_history.py).
"""

from __future__ import annotations

import bisect
import importlib
import math
import os
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import numpy as np
import numpy.typing as npt

_compiled: Any
try:
    # by name: the C extension has no stub, and mypy would take `from ... import` for an attribute
    _compiled = importlib.import_module("dualloop.executor._history")
except ImportError:  # not built (no compiler at install time): the numpy pass
    _compiled = None
_wanted = os.environ.get("DUALLOOP_HISTORY_PURE_PYTHON", "") in ("", "0")


def compiled_available() -> bool:
    """The C pass (``executor._history``) was built and imports."""
    return _compiled is not None


def compiled_wanted() -> bool:
    """Whether rings sum their bins in C by default: built, and not refused by the environment."""
    return _compiled is not None and _wanted


TOL_NS = 1_000_000
BIN_NS = 100_000_000
GAP_NS = 300_000_000
K = 32  # most observations one bin averages (320 Hz); newer ones win


@dataclass(frozen=True)
class HistorySpec:
    name: str
    unit: str
    series: tuple[str, ...]  # the features summed into the series whose slope this is
    delay_ns: int
    fallback: str | None  # the feature whose current value stands in; None: 0
    needs_lead: bool

    @property
    def sources(self) -> tuple[str, ...]:
        extra = ((self.fallback,) if self.fallback else ()) + (("lead_present",) if self.needs_lead else ())
        return tuple(dict.fromkeys(self.series + extra))

    @property
    def required(self) -> tuple[str, ...]:
        """What a sensor profile must measure for this feature to be present: its series and the lead flag.
        An unmeasured fallback stands in as 0: a stack without ego_accel still gets the speed's slopes."""
        return tuple(dict.fromkeys(self.series + (("lead_present",) if self.needs_lead else ())))


def _specs() -> dict[str, HistorySpec]:
    out: list[HistorySpec] = []
    for d in (0.1, 0.2, 0.3):
        out.append(HistorySpec(f"speed_slope_{d}s", "m/s^2", ("ego_speed",), int(d * 1e9), "ego_accel", False))
    for d in (0.2, 0.5):
        out.append(HistorySpec(f"accel_change_{d}s", "m/s^3", ("ego_accel",), int(d * 1e9), None, False))
    for d in (0.2, 0.5):
        out.append(HistorySpec(f"lead_rel_speed_slope_{d}s", "m/s^2", ("lead_rel_speed",), int(d * 1e9), None, True))
    out.append(HistorySpec("lead_distance_slope_0.5s", "m/s", ("lead_distance",), 500_000_000, None, True))
    for d in (0.5, 1.0):
        out.append(HistorySpec(f"lead_accel_{d}s", "m/s^2", ("ego_speed", "lead_rel_speed"), int(d * 1e9), None, True))
    return {s.name: s for s in out}


SPECS: dict[str, HistorySpec] = _specs()
DEFAULT_HISTORY: tuple[str, ...] = tuple(SPECS)  # what `dualloop train` gives a model


class HistoryError(ValueError):
    """A card's history features the executor cannot derive (unknown name, a source it lacks)."""


def tuple_getter(indices: Sequence[int]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """row -> (row[i] for i in indices) as a tuple, in one C-level call from two indices on
    (itemgetter of one index returns the item itself, and of none is refused)."""
    if len(indices) > 1:
        return itemgetter(*indices)
    at = list(indices)
    return lambda row: tuple(row[i] for i in at)


class HistoryDeriver:
    """The history features a card names, resolved against its wire features."""

    def __init__(self, names: Sequence[str], feature_names: Sequence[str]) -> None:
        unknown = [n for n in names if n not in SPECS]
        if unknown:
            raise HistoryError(f"unknown history features {unknown}; known: {', '.join(SPECS)}")
        self.names = tuple(names)
        self.specs = [SPECS[n] for n in names]
        features = list(feature_names)
        read = {f for s in self.specs for f in s.sources}
        lacking = sorted(read - set(features))
        if lacking:
            raise HistoryError(f"history features {list(names)} read {lacking}, which are not wire features")
        needed = sorted(read, key=features.index)
        self.columns = np.array([features.index(f) for f in needed], np.int64)  # wire columns read
        # the same columns of a row as a list (an observation's features as Python floats)
        self.pick = tuple_getter(self.columns.tolist())
        col = {f: i for i, f in enumerate(needed)}
        self._series = sorted({s.series for s in self.specs})
        self._series_cols = [[col[f] for f in series] for series in self._series]
        # a picked row's series (HistoryState._append): each one's first column, the others added in order
        self._series_first = tuple_getter([cols[0] for cols in self._series_cols])
        self._series_more = [(s, c) for s, cols in enumerate(self._series_cols) for c in cols[1:]]
        self._delays = sorted({s.delay_ns for s in self.specs})
        self._lead = col.get("lead_present")
        # (F, H): wire feature f is read by history feature h (for the sensor profile)
        self._reads = np.zeros((len(features), len(self.specs)), np.int64)
        for h, s in enumerate(self.specs):
            for f in s.required:
                self._reads[features.index(f), h] = 1
        self._col = col
        self.horizon_ns = max(self._delays) + max(BIN_NS, GAP_NS) + 2 * TOL_NS

    def __len__(self) -> int:
        return len(self.specs)

    def present(self, present: npt.NDArray[np.bool_] | None) -> npt.NDArray[np.bool_] | None:
        """(..., H) which history features a sensor profile (..., F) gives; None: all."""
        if present is None:
            return None
        return np.asarray((~np.asarray(present, bool)).astype(np.int64) @ self._reads == 0)

    def derive(self, t_ns: np.ndarray, x: np.ndarray, rows: np.ndarray) -> npt.NDArray[np.float32]:
        """(len(rows), H) float32 for observations `rows` of one session's stream: timestamps
        (L,) int64, non-decreasing; x (L, len(columns)), the wire columns `columns` (float32)."""
        t = np.asarray(t_ns, np.int64)
        rows = np.asarray(rows, np.int64)
        x64 = np.asarray(x, np.float32).astype(np.float64)
        series = np.empty((len(t), len(self._series)), np.float64)
        for s, cols in enumerate(self._series_cols):
            series[:, s] = x64[:, cols[0]]
            for c in cols[1:]:
                series[:, s] += x64[:, c]
        (now, _, _), *pasts = _bins(t, series, rows, (0, *self._delays))
        past = dict(zip(self._delays, pasts))
        out = np.empty((len(rows), len(self.specs)), np.float64)
        for h, spec in enumerate(self.specs):
            s = self._series.index(spec.series)
            value, ok, jl = past[spec.delay_ns]
            with np.errstate(invalid="ignore", over="ignore"):
                slope = (now[:, s] - value[:, s]) / (spec.delay_ns / 1e9)
            if spec.needs_lead:
                lp = x64[:, self._col["lead_present"]]
                ok = ok & (lp[rows] >= 0.5) & (lp[np.maximum(jl, 0)] >= 0.5)
            fallback = x64[rows, self._col[spec.fallback]] if spec.fallback else 0.0
            out[:, h] = np.where(ok & np.isfinite(slope), slope, fallback)
        # a non-finite fallback belongs to a row the executor refuses anyway: keep the model input finite
        return np.where(np.isfinite(out), out, 0.0).astype(np.float32)

    def batch(self, t_ns: np.ndarray, features: np.ndarray, rows: np.ndarray | None = None) -> npt.NDArray[np.float32]:
        """A whole session: features (L, F) wire order; rows None = every observation."""
        r = np.arange(len(t_ns)) if rows is None else rows
        return self.derive(t_ns, np.asarray(features)[:, self.columns], r)

    def sessions(self, t_ns: np.ndarray, features: np.ndarray, session: np.ndarray) -> npt.NDArray[np.float32]:
        """Many sessions' rows (N, F) at once, `session` (N,) their session ids; each session's rows
        in time order (training data)."""
        out = np.zeros((len(t_ns), len(self.specs)), np.float32)
        session = np.asarray(session)
        if len(session) == 0:
            return out
        starts = np.flatnonzero(np.r_[True, session[1:] != session[:-1]])
        for a, b in zip(starts, np.r_[starts[1:], len(session)]):
            out[a:b] = self.batch(t_ns[a:b], features[a:b])
        return out

    def state(self) -> HistoryState:
        return HistoryState(self)


def _bins(
    t: np.ndarray, series: np.ndarray, rows: np.ndarray, delays: Sequence[int]
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per delay e: (bin(series, e) at rows (R, S), past(e) ok (R,), jl (R,)).

    A bin's sum is the running sum, newest first from +0.0, of the observations up to its newest
    one jl, stopped after its count: the k-th entry of jl's running sums. Those are made once per
    observation some bin ends at (`_running_sums`) and read by every bin of every row ending there
    (at a steady rate, one observation's bins end where six later ones' past bins do): the same
    adds in the same order as summing each bin on its own, so the same bits."""
    ti = t[rows]
    e = np.array(delays, np.int64)[:, None]  # (bins, 1); everything below is (bins, R)
    found = np.searchsorted(t, np.concatenate([ti - e + TOL_NS, ti - e - BIN_NS + TOL_NS]), side="right")
    jl = np.minimum(found[: len(e)] - 1, rows)  # causal even when later observations share t_i
    n = np.minimum(jl - found[len(e) :] + 1, K)
    safe = np.maximum(jl, 0)
    sums = np.empty((*jl.shape, series.shape[1]), np.float64)
    for a in range(0, len(rows), _SUM_CHUNK):  # bounded memory on long streams
        ends, count = safe[:, a : a + _SUM_CHUNK], n[:, a : a + _SUM_CHUNK]
        first = int(ends.min())
        needed = np.zeros(int(ends.max()) - first + 1, bool)
        needed[ends - first] = True
        at = np.cumsum(needed) - 1  # an end's column in the table
        table_ends = np.flatnonzero(needed) + first
        depth = max(int(count.max()), 1)
        table = _running_sums(series, table_ends, depth)
        # entry [count - 1, end] of the (depth, ends) table, as one flat take
        at_sums = (np.maximum(count, 1) - 1) * len(table_ends) + at[ends - first]
        sums[:, a : a + _SUM_CHUNK] = np.take(table.reshape(-1, series.shape[1]), at_sums, axis=0)
    value = sums
    value /= np.maximum(n, 1)[..., None]
    empty = n < 1
    if empty.any():  # an empty bin: the value of its last observation
        value[empty] = series[safe[empty]]
    span = ti - t[safe]
    ok = (jl >= 0) & (span > 0) & (span <= e + GAP_NS)
    return list(zip(value, ok, jl))


_SUM_CHUNK = 8192  # rows whose bins are summed together (their table: ~ rows x K x S floats)


def _running_sums(series: np.ndarray, ends: np.ndarray, depth: int) -> np.ndarray:
    """(depth, len(ends), S): [k, j] the sum of series[ends[j] - i] for i = 0..k, added newest first
    starting from +0.0, one add of whole rows per k. `ends` increase; places before the stream's
    start read its first row (no bin reaches them)."""
    out = np.empty((depth, len(ends), series.shape[1]), np.float64)
    first, last = int(ends[0]), int(ends[-1])
    contiguous = last - first + 1 == len(ends)  # every observation ends some bin: slices, not gathers
    for k in range(depth):
        if not contiguous:
            np.add(series[np.maximum(ends - k, 0)], 0.0 if k == 0 else out[k - 1], out=out[k])
            continue
        head = max(k - first, 0)  # ends whose k-th newest is before the stream's start
        # the sum starts from +0.0 (a leading -0.0 becomes +0.0)
        np.add(series[first - k + head : last - k + 1], 0.0 if k == 0 else out[k - 1, head:], out=out[k, head:])
        if head:
            np.add(series[0], out[k - 1, :head], out=out[k, :head])
    return out


def episode_history(deriver: HistoryDeriver, t: np.ndarray, features: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """(B, T, H) history features of simulated episodes (B, T, F) recorded at times t (T,) s, each
    episode's valid prefix as one observation stream. Recorded every k-th 5 ms step, a bin holds
    fewer observations than the executor's at 200 Hz would: on noise-free sensors the same means."""
    t_ns = np.round(np.asarray(t, np.float64) * 1e9).astype(np.int64)
    out = np.zeros((*features.shape[:2], len(deriver)), np.float32)
    for b in range(features.shape[0]):
        n = int(valid[b].sum())  # valid is a prefix: an episode only ends
        if n:
            out[b, :n] = deriver.batch(t_ns[:n], features[b, :n])
    return out


class HistoryState:
    """One session's live derivation: the last `horizon_ns` of observations, and the newest one's
    history features: the same operations in the same order as `HistoryDeriver.derive`, so the same
    bits at a fraction of its cost for one row (tests/executor/test_history.py compares them). The
    bins of the newest observation are gathered in one (bins, K + 1, S) array, a +0.0 row first and
    +0.0 rows past each bin's count, and summed newest first by `np.add.accumulate` (sequential adds,
    never numpy's pairwise summation): one numpy pass instead of K adds per bin in Python."""

    def __init__(self, deriver: HistoryDeriver, ring: HistoryRing | None = None, slot: int = 0) -> None:
        """`ring`: also keep the observations in this slot of a ring, for `HistoryRing.newest`."""
        self.deriver = deriver
        self._ring, self._slot = ring, slot
        self._dropped = 0  # observations deleted from the front (absolute index = _dropped + list index)
        # arrays, not lists: the garbage collector does not walk them (a list of a session's ~300
        # timestamps is visited item by item by every collection; at 512 sessions a full collection
        # took ~20 ms with lists, a stall of several ticks)
        self._t = array("q")
        # per observation, deriver._series order; row 0 is +0.0 (the sums' start and padding), so
        # observation j is row j + 1
        self._buf = np.zeros((65, len(deriver._series)), np.float64)
        self._lead = array("d")  # lead_present per observation (nan when not read)
        self._start = 0
        d = deriver
        self._plan = [
            (
                d._series.index(s.series),
                d._delays.index(s.delay_ns) + 1,  # its bin's place in _newest's bins (0: now)
                s.delay_ns / 1e9,
                s.needs_lead,
                None if s.fallback is None else d._col[s.fallback],
            )
            for s in d.specs
        ]
        self._bins = (0, *d._delays)
        self._newest_first = np.arange(K)[None, :]  # k: the k-th newest observation of a bin

    def __len__(self) -> int:
        return len(self._t) - self._start

    def push(self, t_ns: int, features: np.ndarray) -> npt.NDArray[np.float32]:
        """Add an observation (wire features (F,)); its history features (H,)."""
        x = self.deriver.pick(np.asarray(features, np.float32).tolist())
        self._append(int(t_ns), x)
        return self._newest(x)

    def load(self, t_ns: np.ndarray, features: np.ndarray) -> None:
        """Continue after a batch of observations (a replay's), as pushing them one by one would."""
        if len(t_ns) == 0:
            return
        keep = np.flatnonzero(np.asarray(t_ns) >= int(t_ns[-1]) - self.deriver.horizon_ns)
        pick = self.deriver.pick
        # the tail only: at most horizon_ns of observations
        for t, row in zip(np.asarray(t_ns)[keep].tolist(), np.asarray(features, np.float32)[keep].tolist()):
            self._append(int(t), pick(row))

    def _append(self, t_ns: int, x: Sequence[float]) -> None:
        d = self.deriver
        series = list(d._series_first(x))
        for s, c in d._series_more:
            series[s] += x[c]
        # drop what no future observation's bins or past(e) can reach
        self._start = bisect.bisect_left(self._t, t_ns - d.horizon_ns, self._start)
        m = len(self._t)
        if self._start > 1024:
            self._buf[1 : 1 + m - self._start] = self._buf[1 + self._start : 1 + m]
            del self._t[: self._start], self._lead[: self._start]
            m -= self._start
            self._dropped += self._start
            self._start = 0
        if m + 1 >= len(self._buf):
            self._buf = np.concatenate([self._buf, np.zeros_like(self._buf)])
        self._buf[m + 1] = series
        self._t.append(t_ns)
        lead = x[d._lead] if d._lead is not None else math.nan
        self._lead.append(lead)
        ring = self._ring
        if ring is not None:
            series.append(lead)
            newest, slot = self._dropped + m, self._slot
            at = newest % ring.size
            ring.buf[slot, at] = series
            ring.t[slot, at] = t_ns
            ring.newest_at[slot] = newest
            ring.begin_at[slot] = self._dropped + self._start

    def append(self, t_ns: int, features: np.ndarray) -> None:
        """Add an observation (wire features (F,)) whose history features `HistoryRing.newest`
        derives later, if a tick uses it."""
        self._append(int(t_ns), self.deriver.pick(np.asarray(features, np.float32).tolist()))

    def _newest(self, x: Sequence[float]) -> npt.NDArray[np.float32]:
        """The newest observation's history features: `_bins` of every delay (0 first), then slopes."""
        t, start = self._t, self._start
        i = len(t) - 1
        ti = t[i]
        last, count, safe, ok = [], [], [], []
        for e in self._bins:
            jl = min(bisect.bisect_right(t, ti - e + TOL_NS, start) - 1, i)
            lo = bisect.bisect_right(t, ti - e - BIN_NS + TOL_NS, start)
            sf = max(jl, start)
            span = ti - t[sf]
            last.append(jl)
            count.append(min(jl - lo + 1, K))
            safe.append(sf)
            ok.append(jl >= start and 0 < span <= e + GAP_NS)
        n = np.array(count)[:, None]
        # rows of each bin, newest first, after the +0.0 start; +0.0 (row 0) past its count
        rows = np.where(self._newest_first < n, np.array(last)[:, None] + 1 - self._newest_first, 0)
        gathered = self._buf[np.concatenate([np.zeros_like(n), rows], axis=1)]
        acc = np.add.accumulate(gathered, axis=1)[:, -1]
        value = np.where(n >= 1, acc / np.maximum(n, 1), self._buf[np.array(safe) + 1]).tolist()
        now = value[0]
        lead = self._lead
        out = []
        for s, b, d_s, needs_lead, fallback_col in self._plan:
            slope = (now[s] - value[b][s]) / d_s
            good = ok[b]
            if needs_lead:
                good = good and lead[-1] >= 0.5 and lead[safe[b]] >= 0.5
            v = slope if good and math.isfinite(slope) else (x[fallback_col] if fallback_col is not None else 0.0)
            out.append(v if math.isfinite(v) else 0.0)
        return np.array(out, np.float32)


# HistoryRing._bounds: a padded place sorts below every bound (a window spans at most the horizon,
# ~1.3 s, and bounds reach 1.1 s back); rows lie this far apart in the one sorted array
_PAD_NS = 1 << 40
_ROW_STRIDE_NS = 1 << 42
_RING_FROM = 3  # rows; fewer cost less each on its own (1 row: 37 us there, 63 us in the ring's pass)


class HistoryRing:
    """The newest `size` observations of every session slot side by side, (slots, size, S + 1): the
    series, then lead_present; each slot's HistoryState writes its observations here too. A tick
    derives the history features of all its fresh observations in one pass (`newest`): the bins'
    bounds found per session as `HistoryState._newest` bisects them, every (bin, series) sum a feature
    reads added newest first from +0.0, in one C call where executor/_history.c was built or in numpy
    (`_sums`, the reference), then the slopes and fallbacks taken over whole columns; the same
    operations in the same order, so the same bits (tests/executor/test_history.py). A session whose
    horizon holds more than `size` observations (a sensor faster than size / horizon, ~390 Hz) takes
    its own `HistoryState._newest`, and so does a tick of one or two rows (the pass's fixed cost is
    more than theirs)."""

    def __init__(self, deriver: HistoryDeriver, slots: int, size: int = 512, compiled: bool | None = None) -> None:
        """`compiled`: sum the bins in C (executor/_history.c; None: where it was built, unless
        DUALLOOP_HISTORY_PURE_PYTHON=1), else the numpy pass, the reference it is tested against."""
        if compiled and _compiled is None:
            raise RuntimeError(
                "history features: the C pass (executor._history) was not built; reinstall (pip install -e .)"
            )
        self.compiled = compiled_wanted() if compiled is None else compiled
        self.deriver = deriver
        self.size = size
        d = deriver
        n_series = len(d._series)
        # grown to the highest slot a state takes (a server sized for thousands of sessions with a
        # few open holds a few rings, 24 kB each); place `size` of each slot stays +0.0: the row a
        # bin's sum adds past its count
        self.buf = np.zeros((min(slots, 8), size + 1, n_series + 1), np.float64)
        self.t = np.zeros((len(self.buf), size), np.int64)  # each observation's timestamp, same places
        # per slot, as its state's absolute indices (observation j is at place j % size): the newest
        # observation and the first within the horizon
        self.newest_at = np.zeros(len(self.buf), np.int64)
        self.begin_at = np.zeros(len(self.buf), np.int64)
        self._bins = (0, *d._delays)
        specs = d.specs
        self._series = np.array([d._series.index(s.series) for s in specs])
        self._bin = np.array([d._delays.index(s.delay_ns) + 1 for s in specs])
        self._seconds = np.array([s.delay_ns / 1e9 for s in specs])
        self._needs_lead = np.array([s.needs_lead for s in specs])
        self._has_fallback = np.array([s.fallback is not None for s in specs])
        # the fallback's column among deriver.columns (0 where there is none: masked by _has_fallback)
        self._fallback = np.array([0 if s.fallback is None else d._col[s.fallback] for s in specs])
        self._k = np.arange(K)
        # the (bin, series) sums the features read: every series' bin 0, and each feature's own bin of
        # its series (15 of the 6 x 6 at the default features; the lead flag's column is never summed)
        pairs = sorted({(0, int(v)) for v in self._series} | set(zip(self._bin.tolist(), self._series.tolist())))
        self._pair_bin = np.array([b for b, _ in pairs], np.int64)
        self._pair_series = np.array([v for _, v in pairs], np.int64)
        self._now_pair = np.array([pairs.index((0, v)) for v in self._series.tolist()], np.intp)
        self._past_pair = np.array([pairs.index(p) for p in zip(self._bin.tolist(), self._series.tolist())], np.intp)
        self._delays = np.array(self._bins, np.int64)
        self._limits = np.array([TOL_NS, BIN_NS, GAP_NS, K], np.int64)

    def state(self, slot: int) -> HistoryState:
        if slot >= len(self.buf):
            grown = np.zeros((max(slot + 1, 2 * len(self.buf)), *self.buf.shape[1:]), np.float64)
            grown[: len(self.buf)] = self.buf
            grown_t = np.zeros((len(grown), self.size), np.int64)
            grown_t[: len(self.t)] = self.t
            self.buf, self.t = grown, grown_t
            more = np.zeros(len(grown) - len(self.newest_at), np.int64)
            self.newest_at, self.begin_at = (
                np.concatenate([self.newest_at, more]),
                np.concatenate([self.begin_at, more]),
            )
        return HistoryState(self.deriver, self, slot)

    def newest(self, states: Sequence[HistoryState], features: np.ndarray) -> npt.NDArray[np.float32]:
        """(rows, H) float32: each state's newest observation's history features; `features` (rows, F)
        those observations' wire features."""
        n, size = len(states), self.size
        x = np.asarray(features, np.float32)[:, self.deriver.columns].astype(np.float64)
        out = np.empty((n, len(self._series)), np.float32)
        if n < _RING_FROM:  # each row its state's own way
            for r, st in enumerate(states):
                out[r] = st._newest(x[r].tolist())
            return out
        slot_all = np.array([st._slot for st in states], np.int64)
        newest_all, begin_all = self.newest_at[slot_all], self.begin_at[slot_all]
        own = newest_all - begin_all >= size  # more observations within the horizon than places
        if own.any():
            for r in np.flatnonzero(own).tolist():
                out[r] = states[r]._newest(x[r].tolist())
            rows: Any = np.flatnonzero(~own)
            if not len(rows):
                return out
        else:
            rows = slice(None)
        slot_a, newest, begin = slot_all[rows], newest_all[rows], begin_all[rows]
        sums = self._sums_compiled if self.compiled else self._sums
        value, ok_a, lead_now, lead_at = sums(slot_a, newest, begin)
        good = ok_a & (~self._needs_lead | ((lead_now >= 0.5)[:, None] & (lead_at >= 0.5)))
        with np.errstate(invalid="ignore", over="ignore"):
            slope = (value[:, self._now_pair] - value[:, self._past_pair]) / self._seconds
        fallback = np.where(self._has_fallback, x[rows][:, self._fallback], 0.0)
        v = np.where(good & np.isfinite(slope), slope, fallback)
        out[rows] = np.where(np.isfinite(v), v, 0.0)
        return out

    def _sums(self, slot_a: np.ndarray, newest: np.ndarray, begin: np.ndarray) -> tuple[np.ndarray, ...]:
        """Per row (m rows): the value of each summed (bin, series) pair (m, pairs), whether each
        feature's past(e) is ok (m, H), the lead flag now (m,) and at each feature's past(e) (m, H)."""
        size = self.size
        t_now = self.t[slot_a, newest % size]
        slot = slot_a[:, None, None]
        jl_a, n_a, safe_a, ok_bins = self._bounds(slot_a, newest, begin, t_now)
        kmax = max(int(n_a.max()), 1)
        k = self._k[:kmax, None, None]
        pair_bin, width = self._pair_bin, self.buf.shape[2]
        jl_p, n_p = jl_a[:, pair_bin], n_a[:, pair_bin]  # (m, pairs)
        # (k, m, pairs): where each summed pair's k-th newest observation is, or the +0.0 place past
        # its bin's count, in the flat buffer; k first, so that each add below is one slab
        place = np.where(k < n_p, (jl_p - k) % size, size) + (slot_a * (size + 1))[:, None]
        g = self.buf.reshape(-1).take(place * width + self._pair_series)
        acc = g[0] + 0.0  # the sum starts from +0.0 (as `_bins`): a leading -0.0 becomes +0.0
        for j in range(1, kmax):  # newest first, one add at a time: the state's order, so its bits
            acc += g[j]
        safe_rows = self.buf[slot[:, :, 0], safe_a % size]  # (m, bins, S + 1)
        value = np.where(n_p >= 1, acc / np.maximum(n_p, 1), safe_rows[:, pair_bin, self._pair_series])
        # bin 0's last observation is the newest itself
        return value, ok_bins[:, self._bin], safe_rows[:, 0, -1], safe_rows[:, self._bin, -1]

    def _sums_compiled(self, slot_a: np.ndarray, newest: np.ndarray, begin: np.ndarray) -> tuple[np.ndarray, ...]:
        """`_sums` in one C call (executor/_history.c): the same bounds, sums and divisions."""
        m, bins = len(slot_a), len(self._bins)
        value = np.empty((m, len(self._pair_bin)), np.float64)
        ok, lead = np.empty((m, bins), bool), np.empty((m, bins), np.float64)
        pairs = self._pair_bin, self._pair_series
        _compiled.bins(self.buf, self.t, slot_a, newest, begin, self._delays, *pairs, self._limits, value, ok, lead)
        return value, ok[:, self._bin], lead[:, 0], lead[:, self._bin]

    def _bounds(
        self, slots: np.ndarray, newest: np.ndarray, begin: np.ndarray, t_now: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Each row's bins as `HistoryState._newest` bisects them, for all rows in one search: per
        bin (m, bins) the last observation jl, the count (<= K), past(e)'s observation and whether
        past(e) is ok; indices absolute (see `newest`). Each row's window of timestamps is taken
        relative to its newest (within the horizon, so no overflow), older places padded below any
        bound, and the rows laid end to end with a stride apart: one sorted array, one searchsorted
        for every bound of every row."""
        m, size = len(slots), self.size
        width = int((newest - begin).max()) + 1
        first = newest - (width - 1)  # the window's oldest place; those before `begin` are padding
        places = first[:, None] + np.arange(width)
        rel = self.t.take(slots[:, None] * size + places % size) - t_now[:, None]
        rel[places < begin[:, None]] = -_PAD_NS
        stride = np.arange(m, dtype=np.int64)[:, None] * _ROW_STRIDE_NS
        upper = np.array([TOL_NS - e for e in self._bins], np.int64)
        lower = upper - BIN_NS
        queries = np.concatenate([upper, lower])[None, :] + stride  # (m, 2 * bins)
        found = np.searchsorted((rel + stride).ravel(), queries.ravel(), side="right").reshape(m, -1)
        found += (first - np.arange(m, dtype=np.int64) * width)[:, None]  # bisect_right, absolute
        b = len(self._bins)
        jl = np.minimum(found[:, :b] - 1, newest[:, None])
        count = np.minimum(jl - found[:, b:] + 1, K)
        safe = np.maximum(jl, begin[:, None])
        span = t_now[:, None] - self.t[slots[:, None], safe % size]
        limit = np.array([e + GAP_NS for e in self._bins], np.int64)
        ok = (jl >= begin[:, None]) & (span > 0) & (span <= limit)
        return jl, count, safe, ok
