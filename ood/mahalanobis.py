"""Per-tick gate scoring: one call for all sessions, and for several gates at once.

A tick scores few rows (one per session), so its cost is the number of numpy calls, not
arithmetic: here a tick is one product per gate, straight from the caller's arrays (no copy), one
``vecdot`` and one ``tolist()`` for all gates and rows, then a few float operations per (row, gate)
in Python. No exceptions for bad data. A row with NaN/Inf gets score +inf and ``nonfinite=True``
so the caller can veto it in the same tick; the raw-norm guard is reported separately from the
Mahalanobis exceedance because it must bypass the sequential filter.

The score of a row x (raw norm n, normalised z = x / n) is d2 = ||z W - c W||^2 with W the
precomputed whitening and c the training centre. Expanded, d2 = (q / n - 2 t) / n + ||c W||^2 with
q = ||x W||^2 and t = x . W (c W)^T: the normalisation is two float operations per (row, gate)
instead of a pass over the features, and all numpy does is linear in x and then sums of squares.
Gate g's projection maps its features to [x | x W | (x W_bg) | linear terms], every block zero
padded to the widest gate (the identity block copies x, so ||x||^2 comes from the same ``vecdot``
as ||x W||^2); the linear terms are x . W (c W)^T and, tied and relative variants, one per class
and one for the background. Padding is zero, so it adds exact zeros.

The expansion cancels (d2 is the difference of terms near ||c W||^2); in float64 that costs about
1e-13 relative here, far inside any threshold's meaning. Rows whose squares are not comfortably
inside float64's range (below 1e-200 or above 1e200, or overflowing) are scored again rescaled by
their largest entry, which keeps the direction, hence d2; their norm is taken from before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import chain
from operator import gt as _gt
from operator import lt as _lt
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from dualloop.ood.calibrate import FeatureRange
from dualloop.ood.fit import GateStats

_TINY = float(np.finfo(np.float64).tiny)
_INF = float("inf")
_NAN = float("nan")
_SQ_LOW, _SQ_HIGH = 1e-200, 1e200  # squared norms outside this range are scored rescaled
_VECTORISED_FROM = 64  # rows; below it a Python pass over plain floats costs fewer numpy calls
_PYTHON_RANGE_ROWS = 4  # rows; up to it the range check in Python beats numpy's per-call cost (design notes)


ClassTerms = tuple[list[float], list[float], float | None]  # per class ||o_k||^2, (c W) . o_k; ||c W_bg||^2


def class_conditional(d2: float, lin: list[float], d: float, spec: ClassTerms, n_linear: int) -> float:
    """A tied / relative gate's score from the single-Gaussian expansion ``d2`` of one row: the
    nearest class, then (relative) minus the background's distance. ``lin`` is the row's linear
    terms then its squares (the buffer's tail), ``d`` its raw norm (the smallest float for zero)."""
    oo, co, cc_bg = spec
    at = 1 if cc_bg is None else 2
    d2 = max(d2 + min(o - 2.0 * (lin[at + k] / d - c) for k, (o, c) in enumerate(zip(oo, co))), 0.0)
    if cc_bg is not None:
        d2 -= (lin[n_linear + 2] / d - 2.0 * lin[1]) / d + cc_bg
    return d2


def outside_limits(values: list[float], low: list[float], high: list[float]) -> bool:
    """Some value below its low or above its high limit; map(lt/gt) compare in C, and NaN compares
    False, as in numpy."""
    return any(map(_lt, values, low)) or any(map(_gt, values, high))


class GateFlags(NamedTuple):
    """Per-row booleans (fresh arrays, safe to keep)."""

    nonfinite: npt.NDArray[np.bool_]  # a feature was NaN/Inf: score is +inf, veto now
    norm_out: npt.NDArray[np.bool_]  # raw L2 norm outside the calibrated band (always true for all-zero)
    exceed: npt.NDArray[np.bool_]  # score > threshold (Mahalanobis); goes through the sequential filter
    out_of_range: npt.NDArray[np.bool_]  # a value, its change or a context value outside the FeatureRange: veto now

    @property
    def immediate(self) -> npt.NDArray[np.bool_]:
        """Rows that must alarm this tick regardless of the filter."""
        return self.nonfinite | self.norm_out | self.out_of_range


class RowScores(NamedTuple):
    """`StackedScorer.score_rows`: flat Python lists, row-major over (batch, gates)."""

    threshold: list[float]  # the gate's threshold
    score: list[float]  # +inf where that gate's features had NaN/Inf
    nonfinite: list[bool]
    norm_out: list[bool]
    exceed: list[bool]
    immediate: list[bool]  # nonfinite, norm_out or out_of_range
    out_of_range: list[bool]  # a value, its change or a context value outside the gate's FeatureRange


class _Views(NamedTuple):
    """Every buffer view and per-entry constant one batch size needs, made once per size."""

    out: tuple[np.ndarray, ...]  # per gate (b, cols), C-contiguous: [x | x W | (x W_bg) | linear | squares]
    blocks: np.ndarray  # (G, b, 1 + parts, width): x, x W (and x W_bg)
    squares: np.ndarray  # (G, b, 1 + parts): ||x||^2, ||x W||^2 (and ||x W_bg||^2)
    tail: np.ndarray  # (G, b, L + 1 + parts): the linear terms, then the squares
    low: list[float]  # per entry, row-major (b, G): the gate's norm band and threshold
    high: list[float]
    threshold: list[float]
    clean: list[bool]  # all False: nonfinite when no row is bad
    zeros: list[float]
    order: list[tuple[int, int]]  # gate-major: (row-major entry, gate)


class StackedScorer:
    """Scores feature rows against several gates' fitted statistics at once.

    ``score_rows(b, rows)``: ``rows[g]`` is gate g's (b, dim_g) features (float32 or float64, read
    in place; None: every row is NaN). ``thresholds`` default to +inf (never exceed) so the same
    class computes raw scores for calibration. ``norm_low`` is raised to the smallest positive
    float so an all-zero row is always outside the band, whatever the calibration said. Not
    thread-safe (it reuses its buffers): one scorer per executor thread.
    """

    def __init__(
        self,
        stats: Sequence[GateStats],
        thresholds: Sequence[float] | None = None,
        norm_low: Sequence[float] | None = None,
        norm_high: Sequence[float] | None = None,
        max_batch: int = 64,
        ranges: Sequence[FeatureRange | None] | None = None,
    ) -> None:
        self.gate_stats = list(stats)
        g_count = len(self.gate_stats)
        if g_count == 0:
            raise ValueError("a scorer needs the statistics of at least one gate")

        def per_gate(values: Sequence[float] | None, default: float) -> np.ndarray:
            out = np.full(g_count, default) if values is None else np.array(values, np.float64)
            if out.shape != (g_count,):
                raise ValueError(f"expected {g_count} values (one per gate), got {out.shape}")
            return out

        self.thresholds = per_gate(thresholds, _INF)
        ranges = [None] * g_count if ranges is None else list(ranges)
        if len(ranges) != g_count:
            raise ValueError(f"expected {g_count} feature ranges (one per gate, None for none), got {len(ranges)}")
        for s, rng in zip(self.gate_stats, ranges):
            if rng is not None and len(rng.low) != s.dim:
                raise ValueError(f"a feature range of {len(rng.low)} features for a gate of {s.dim}")
        # per gate: [values, changes, context] as (low, high) or None each (FeatureRange.limits), or None
        self._ranges = [None if rng is None else rng.limits() for rng in ranges]
        self._range_lists = [
            None if lim is None else [None if pair is None else (pair[0].tolist(), pair[1].tolist()) for pair in lim]
            for lim in self._ranges
        ]
        self._any_range = any(rng is not None for rng in ranges)
        self._ranged = [g for g, lim in enumerate(self._range_lists) if lim is not None]
        self._flat: dict[tuple[int, bool, bool, bool], tuple[tuple[int, ...], list[float], list[float]]] = {}
        self.norm_lows = np.maximum(per_gate(norm_low, 0.0), _TINY)
        self.norm_highs = per_gate(norm_high, _INF)
        self.dims = [s.dim for s in self.gate_stats]
        self.width = width = max(self.dims)
        self._parts = parts = 2 if any(s.variant == "relative" for s in self.gate_stats) else 1
        # per gate: the whitening(s), and the constant vectors whose dot with x the distance needs
        linear: list[list[np.ndarray]] = []
        self._cc: list[float] = []  # ||c W||^2
        self._classes: list[ClassTerms | None] = []
        for s in self.gate_stats:
            cw = s.center @ s.whiten
            vecs = [s.whiten @ cw]
            self._cc.append(float(cw @ cw))
            if s.variant == "single":
                self._classes.append(None)
            else:
                cc_bg = None
                if s.variant == "relative":
                    cw_bg = s.center @ s.bg_whiten
                    vecs.append(s.bg_whiten @ cw_bg)
                    cc_bg = float(cw_bg @ cw_bg)
                offsets = s.class_offsets  # (K, d): class means, whitened and centred
                vecs += list(offsets @ s.whiten.T)  # x . (W o_k)
                self._classes.append(([float(o @ o) for o in offsets], [float(cw @ o) for o in offsets], cc_bg))
            linear.append(vecs)
        self._n_linear = n_linear = max(len(v) for v in linear)
        # each gate's product fills a whole buffer row (the squares' columns with zeros, for the
        # vecdot to overwrite), so it can be written by ndarray.dot, which wants a C-contiguous out
        self._n_cols = cols = (1 + parts) * width + n_linear + 1 + parts
        self._proj = []
        for s, vecs in zip(self.gate_stats, linear):
            d, proj = s.dim, np.zeros((s.dim, cols))
            proj[:, :d] = np.eye(d)  # x itself, for ||x||^2
            proj[:, width : width + d] = s.whiten
            if s.variant == "relative":
                proj[:, 2 * width : 2 * width + d] = s.bg_whiten
            for j, vec in enumerate(vecs):
                proj[:, (1 + parts) * width + j] = vec
            self._proj.append(proj)
        self._capacity = 0
        self._grow(max(1, int(max_batch)))

    @property
    def n_gates(self) -> int:
        return len(self.gate_stats)

    def _grow(self, batch: int) -> None:
        self._capacity = batch
        self._u = np.zeros((self.n_gates, batch, self._n_cols))  # gate-major: each gate's rows contiguous
        self._views: dict[int, _Views] = {}

    def views(self, b: int) -> _Views:
        v = self._views.get(b)
        if v is None:
            if b > self._capacity:
                self._grow(b)
            g_count = self.n_gates
            out, blocks, squares, tail = self._buffer_views(self._u[:, :b])
            v = self._views[b] = _Views(
                out=out,
                blocks=blocks,
                squares=squares,
                tail=tail,
                low=self.norm_lows.tolist() * b,
                high=self.norm_highs.tolist() * b,
                threshold=self.thresholds.tolist() * b,
                clean=[False] * (b * g_count),
                zeros=[0.0] * (b * g_count),
                order=[(row * g_count + g, g) for g in range(g_count) for row in range(b)],
            )
        return v

    def _buffer_views(self, u: np.ndarray) -> tuple[tuple[np.ndarray, ...], np.ndarray, np.ndarray, np.ndarray]:
        """(out per gate, blocks, squares, tail) of a (G, b, cols) buffer (see `_Views`)."""
        g_count, b = u.shape[:2]
        width, cols, parts = self.width, self._n_cols, self._parts
        return (
            tuple(u[g] for g in range(g_count)),
            u[:, :, : (1 + parts) * width].reshape(g_count, b, 1 + parts, width),
            u[:, :, cols - 1 - parts :],
            u[:, :, (1 + parts) * width :],
        )

    def score_rows(
        self,
        b: int,
        rows: Sequence[np.ndarray | None],
        nan_rows: np.ndarray | None = None,
        changes: Sequence[np.ndarray | None] | None = None,
        context: Sequence[np.ndarray | None] | None = None,
    ) -> RowScores:
        """Score ``b`` rows for every gate; ``rows[g]``: gate g's (b, dim_g) features (None: all NaN).

        ``nan_rows`` (optional, (b,) bool): rows to score as NaN in every gate, because the caller
        knows they hold NaN/Inf. Other rows should not hold +-Inf: a matmul with Inf warns (Inf * 0);
        ``GateScorer.score`` replaces them by NaN, which flows through quietly. ``changes[g]``
        (optional, (b, dim_g) or None): each row's change since the session's previous observation
        (``ChangeTracker``; NaN where none is known) and ``context[g]`` (optional, (b, k) or None):
        the values that condition the model with the row (its plan), both checked against gate g's
        ``FeatureRange``."""
        r = self._score_rows(b, rows, nan_rows)
        if not self._any_range:
            return r
        outside = self._outside_range(b, rows, nan_rows, changes, context)
        if outside is None:
            return r
        immediate, oor = r.immediate[:], self._views[b].clean[:]
        for e in outside:
            immediate[e] = oor[e] = True
        return r._replace(immediate=immediate, out_of_range=oor)

    def _outside_range(
        self,
        b: int,
        rows: Sequence[np.ndarray | None],
        nan_rows: np.ndarray | None,
        changes: Sequence[np.ndarray | None] | None,
        context: Sequence[np.ndarray | None] | None,
    ) -> list[int] | None:
        """Entries (row-major (row, gate)) with a value, change or context value outside the gate's
        limits; None when there are none. NaN compares False: NaN is the nonfinite flag's."""
        if b <= _PYTHON_RANGE_ROWS:
            return self._outside_range_few(b, rows, nan_rows, changes, context)
        hits = None
        g_count = self.n_gates
        for g, limits in enumerate(self._ranges):
            if limits is None:
                continue
            out = None
            sources = (rows[g], None if changes is None else changes[g], None if context is None else context[g])
            for src, lim in zip(sources, limits):
                if src is None or lim is None:
                    continue
                src, (low, high) = np.asarray(src), lim
                if not ((src < low).any() or (src > high).any()):  # the common case: two calls
                    continue
                now = ((src < low) | (src > high)).any(axis=1)
                out = now if out is None else out | now
            if out is None:
                continue
            if nan_rows is not None:
                out &= ~nan_rows
            hits = (hits or []) + [row * g_count + g for row in np.flatnonzero(out).tolist()]
        return hits

    def _outside_range_few(
        self,
        b: int,
        rows: Sequence[np.ndarray | None],
        nan_rows: np.ndarray | None,
        changes: Sequence[np.ndarray | None] | None,
        context: Sequence[np.ndarray | None] | None,
    ) -> list[int] | None:
        """``_outside_range`` for a few rows, row by row (``outside_row``): a tick of few sessions would
        pay more for the numpy calls than for the comparisons. Same comparisons, same NaN rule."""
        hits = None
        g_count = self.n_gates
        skip = None if nan_rows is None else nan_rows.tolist()
        for g in self._ranged:
            sources = (rows[g], None if changes is None else changes[g], None if context is None else context[g])
            for row in range(b):
                if (skip is None or not skip[row]) and self.outside_row(g, sources, row):
                    hits = (hits or []) + [row * g_count + g]
        return hits

    def outside_row(self, g: int, sources: tuple[Any, Any, Any], row: int) -> bool:
        """Row ``row`` of ``sources`` (its values, changes and context, arrays or lists of rows; None: not
        given) has a value outside gate g's limits: the one range check of a few rows, in Python over
        plain floats, for this scorer's small batches and for a one-row tick. NaN compares False."""
        given, low, high = self.flat_limits(g, sources)
        if not given:
            return False
        values: list[float] = []
        for i in given:  # flat_limits lists only the sources given (not None)
            src = sources[i]
            values += src[row] if isinstance(src, list) else src[row].tolist()
        return outside_limits(values, low, high)

    def flat_limits(self, g: int, sources: Sequence[object | None]) -> tuple[tuple[int, ...], list[float], list[float]]:
        """Gate g's limits for the ``sources`` given (values, changes, context; None: not given) as one
        (low, high) pair of lists, concatenated in that order, and which sources they cover: a row's
        check is then two C-level passes over one list instead of two per source."""
        key = (g, sources[0] is not None, sources[1] is not None, sources[2] is not None)
        flat = self._flat.get(key)
        if flat is None:
            limits = self._range_lists[g] or [None, None, None]
            chosen = [(i, lim) for i, (src, lim) in enumerate(zip(key[1:], limits)) if src and lim is not None]
            flat = self._flat[key] = (
                tuple(i for i, _ in chosen),
                [v for _, lim in chosen for v in lim[0]],
                [v for _, lim in chosen for v in lim[1]],
            )
        return flat

    def _score_rows(self, b: int, rows: Sequence[np.ndarray | None], nan_rows: np.ndarray | None = None) -> RowScores:
        """``score_rows`` without the feature range check."""
        v = self.views(b)
        for src, proj, out in zip(rows, self._proj, v.out):
            if src is None:
                out[...] = _NAN
            elif nan_rows is None:
                src.dot(proj, out=out)
            else:  # rows with NaN/Inf: NaN throughout, never Inf into the matmul
                np.where(nan_rows[:, None], _NAN, src).dot(proj, out=out)
        np.vecdot(v.blocks, v.blocks, out=v.squares)
        if b > _VECTORISED_FROM and all(c is None for c in self._classes):
            return self._single_vectorised(b, v, rows, nan_rows)
        cc, classes, n_linear, sqrt = self._cc, self._classes, self._n_linear, math.sqrt
        low, high, threshold = v.low, v.high, v.threshold
        scores, norm_out, exceed, special = v.zeros[:], v.clean[:], v.clean[:], None
        # the buffer is gate-major; entries are row-major (row, gate): v.order gives each one's place
        for (e, g), lin in zip(v.order, chain.from_iterable(v.tail.tolist())):
            s = lin[n_linear]  # ||x||^2
            n = sqrt(s)
            if not _SQ_LOW <= s <= _SQ_HIGH and s != 0.0:  # NaN/Inf, or squares far from 1: see _special
                special = (special or []) + [(e, s)]
            d = n or _TINY  # an all-zero row: the centre's distance from the origin
            d2 = (lin[n_linear + 1] / d - 2.0 * lin[0]) / d + cc[g]
            spec = classes[g]
            if spec is not None:
                d2 = class_conditional(d2, lin, d, spec, n_linear)
            scores[e] = d2
            norm_out[e] = n < low[e] or n > high[e]  # the raw norm's guard (NaN: never outside)
            exceed[e] = d2 > threshold[e]
        if special is None:
            return RowScores(threshold, scores, v.clean, norm_out, exceed, norm_out, v.clean)
        return self._special(b, rows, nan_rows, special, scores, norm_out, exceed)

    def _single_vectorised(
        self, b: int, v: _Views, rows: Sequence[np.ndarray | None], nan_rows: np.ndarray | None
    ) -> RowScores:
        """The loop above for many rows of single-variant gates (replay, calibration), as numpy
        operations in the same order on the same float64 values: the same scores and flags."""
        s, d2, norm_out, exceed, special = self._single_arrays(v.tail)
        scores, norm_list, exceed_list = d2.T.ravel().tolist(), norm_out.T.ravel().tolist(), exceed.T.ravel().tolist()
        if not special.any():
            return RowScores(v.threshold, scores, v.clean, norm_list, exceed_list, norm_list, v.clean)
        g_count = self.n_gates
        spec = [(row * g_count + g, float(s[g, row])) for g, row in zip(*np.nonzero(special))]
        return self._special(b, rows, nan_rows, sorted(spec), scores, norm_list, exceed_list)

    def _single_arrays(self, tail: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(||x||^2, d2, norm_out, exceed, special), each (G, b), of single-variant gates' products."""
        nl = self._n_linear
        s = tail[:, :, nl]  # (G, b): ||x||^2
        with np.errstate(invalid="ignore", over="ignore"):  # NaN/Inf rows: handled as special below
            n = np.sqrt(s)
            d = np.where(n == 0.0, _TINY, n)
            d2 = (tail[:, :, nl + 1] / d - 2.0 * tail[:, :, 0]) / d + np.array(self._cc)[:, None]
        norm_out = (n < self.norm_lows[:, None]) | (n > self.norm_highs[:, None])
        exceed = d2 > self.thresholds[:, None]
        special = ~((s >= _SQ_LOW) & (s <= _SQ_HIGH)) & (s != 0.0)  # NaN compares False: special
        return s, d2, norm_out, exceed, special

    def _special(
        self,
        b: int,
        rows: Sequence[np.ndarray | None],
        nan_rows: np.ndarray | None,
        special: list[tuple[int, float]],
        scores: list[float],
        norm_out: list[bool],
        exceed: list[bool],
    ) -> RowScores:
        """Rare path. NaN/Inf features: score +inf, ``nonfinite``, no norm flag. Finite features whose
        squares overflowed or sit near float64's limits: scored again rescaled by their largest
        entry (same direction, same d2); overflow is outside any norm band."""
        g_count, threshold = self.n_gates, self._views[b].threshold
        bad = [False] * len(scores)
        rescaled: list[np.ndarray | None] = [None] * g_count
        for e, s in special:
            row, g = divmod(e, g_count)
            src = rows[g]
            x = None if src is None or (nan_rows is not None and nan_rows[row]) else np.asarray(src[row], np.float64)
            if x is None or not np.isfinite(x).all():
                bad[e] = True
                continue
            again_g = rescaled[g]
            if again_g is None:
                again_g = rescaled[g] = np.zeros((b, self.dims[g]))
            again_g[row] = x / np.abs(x).max()
            if s == _INF:
                norm_out[e] = True  # squares overflowed: outside any band, even an open one
        if any(r is not None for r in rescaled):
            again = self._score_rows(b, [np.zeros((b, d)) if r is None else r for r, d in zip(rescaled, self.dims)])
            for e, _ in special:
                if not bad[e]:
                    scores[e], exceed[e] = again.score[e], again.exceed[e]
        for e, _ in special:
            if bad[e]:
                scores[e], norm_out[e], exceed[e] = _INF, False, _INF > threshold[e]
        if not any(bad):
            return RowScores(threshold, scores, self._views[b].clean, norm_out, exceed, norm_out, self._views[b].clean)
        return RowScores(
            threshold, scores, bad, norm_out, exceed, [o or x for o, x in zip(norm_out, bad)], self._views[b].clean
        )


class GateScorer(StackedScorer):
    """Scores (batch, d) feature rows against one gate's fitted statistics."""

    def __init__(
        self,
        stats: GateStats,
        threshold: float = float("inf"),
        norm_low: float = 0.0,
        norm_high: float = float("inf"),
        max_batch: int = 64,
        feature_range: FeatureRange | None = None,
    ) -> None:
        super().__init__([stats], [threshold], [norm_low], [norm_high], max_batch, [feature_range])
        self.feature_range = feature_range
        self.stats = stats
        self.variant = stats.variant
        self.dim = stats.dim
        self.threshold = float(threshold)
        self.norm_low = float(self.norm_lows[0])
        self.norm_high = float(self.norm_highs[0])

    def score(
        self, x: np.ndarray, changes: np.ndarray | None = None, context: np.ndarray | None = None
    ) -> tuple[np.ndarray, GateFlags]:
        """Return (scores (batch,), flags), fresh arrays. Raises only for a wrong shape (a wiring bug).
        ``changes``, ``context``: for the feature range, see ``score_rows``."""
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"gate expects features of shape (batch, {self.dim}), got {x.shape}")
        x = np.asarray(x, np.float64)
        inf = np.isinf(x)
        if inf.any():
            x = np.where(inf, _NAN, x)
        if len(x) > _VECTORISED_FROM and self.variant == "single":
            many = self._score_many(x, changes, context)
            if many is not None:
                return many
        r = self.score_rows(
            x.shape[0],
            [x],
            changes=None if changes is None else [changes],
            context=None if context is None else [context],
        )
        return np.array(r.score, np.float64), GateFlags(
            *(np.array(f, bool) for f in (r.nonfinite, r.norm_out, r.exceed, r.out_of_range))
        )

    def _score_many(
        self, x: np.ndarray, changes: np.ndarray | None, context: np.ndarray | None
    ) -> tuple[np.ndarray, GateFlags] | None:
        """`score` of many rows (float64, no Inf) of a single-variant gate, `score_rows`' operations
        kept as arrays: its product in a buffer of its own (the per-row lists of `views` and the
        tick's buffers grown to a replay's size cost more than the scoring), rows with NaN scored
        as `_special` scores them. None when a finite row's squares need rescaling (`_special`)."""
        b = len(x)
        u = np.empty((1, b, self._n_cols))
        (out,), blocks, squares, tail = self._buffer_views(u)
        x.dot(self._proj[0], out=out)
        np.vecdot(blocks, blocks, out=squares)
        _, d2_g, norm_g, exceed_g, special_g = self._single_arrays(tail)
        d2, norm_out, exceed, special = d2_g[0], norm_g[0], exceed_g[0], special_g[0]
        nonfinite = np.zeros(b, bool)
        if special.any():
            nonfinite = special & ~np.isfinite(x).all(axis=1)
            if (special & ~nonfinite).any():
                return None
            d2[nonfinite], norm_out[nonfinite], exceed[nonfinite] = _INF, False, _INF > self.threshold
        out_of_range = np.zeros(b, bool)
        if self._any_range:
            hits = self._outside_range(
                b, [x], None, None if changes is None else [changes], None if context is None else [context]
            )
            if hits:
                out_of_range[hits] = True
        return d2, GateFlags(nonfinite, norm_out, exceed, out_of_range)


def score_in_chunks(
    scorer: GateScorer,
    x: np.ndarray,
    chunk: int = 8192,
    changes: np.ndarray | None = None,
    context: np.ndarray | None = None,
) -> tuple[np.ndarray, GateFlags]:
    """Score a large offline matrix without growing the scorer's buffers to its size."""

    def cut(a: np.ndarray | None, i: int) -> np.ndarray | None:
        return None if a is None else a[i : i + chunk]

    parts = [scorer.score(x[i : i + chunk], cut(changes, i), cut(context, i)) for i in range(0, x.shape[0], chunk)]
    d2 = np.concatenate([p[0] for p in parts])
    flags = GateFlags(*(np.concatenate([getattr(p[1], f) for p in parts]) for f in GateFlags._fields))
    return d2, flags
