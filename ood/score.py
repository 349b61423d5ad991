"""Per-tick gate scoring: one call for all sessions, and for several gates at once.

A tick scores few rows (one per session), so its cost is the number of numpy calls, not
arithmetic. Here a tick is three numpy calls whatever the number of gates and rows, plus a few
float operations per (row, gate) in Python; no exceptions for bad data. A row with NaN/Inf gets
score +inf and ``nonfinite=True`` so the caller can veto it in the same tick; the raw-norm guard is
reported separately from the Mahalanobis exceedance because it must bypass the sequential filter.

The score of a row x (raw norm n, normalised z = x / n) is d2 = ||z W - c W||^2 with W the
precomputed whitening and c the training centre. Expanded, d2 = (q / n - 2 t) / n + ||c W||^2 with
q = ||x W||^2 and t = x . (W (c W)^T): the normalisation is two float operations per (row, gate)
instead of a pass over the features, and everything numpy does is linear or quadratic in the raw
features. So each gate's features are zero padded to the widest gate: one ``vecdot`` gives every
gate's ||x||^2, one stacked matmul (a small GEMM per gate) gives x W (and x W_bg) next to the
linear terms (x . W (c W)^T and, tied and relative variants, one per class and one for the
background), one ``vecdot`` the squared lengths of x W. Padding is zero, so it adds exact zeros.

The expansion cancels (d2 is the difference of terms near ||c W||^2); in float64 that costs about
1e-13 relative here, far inside any threshold's meaning. Rows whose squares are not comfortably
inside float64's range (below 1e-200 or above 1e200, or overflowing) are rescaled by their largest
entry first, which keeps the direction, hence d2, and their norm is taken from before the rescale.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import chain
from typing import NamedTuple

import numpy as np

from .fit import GateStats

_TINY = float(np.finfo(np.float64).tiny)
_INF = float("inf")
_SQ_LOW, _SQ_HIGH = 1e-200, 1e200  # squared norms outside this range are rescaled first


class GateFlags(NamedTuple):
    """Per-row booleans (fresh arrays, safe to keep)."""

    nonfinite: np.ndarray  # a feature was NaN/Inf: score is +inf, veto now
    norm_out: np.ndarray  # raw L2 norm outside the calibrated band (always true for all-zero)
    exceed: np.ndarray  # score > threshold (Mahalanobis); goes through the sequential filter

    @property
    def immediate(self) -> np.ndarray:
        """Rows that must alarm this tick regardless of the filter."""
        return self.nonfinite | self.norm_out


class RowScores(NamedTuple):
    """`StackedScorer.score_rows`: flat Python lists, row-major over (batch, gates)."""

    threshold: list[float]  # the gate's threshold
    score: list[float]  # +inf where that gate's features had NaN/Inf
    nonfinite: list[bool]
    norm_out: list[bool]
    exceed: list[bool]
    immediate: list[bool]  # nonfinite or norm_out


class _Views(NamedTuple):
    """Every buffer view and per-entry constant one batch size needs, made once per size."""

    x: np.ndarray  # (b, G, width) the features, zero padded
    x_stack: np.ndarray  # (G, b, width): what the projection reads, one GEMM per gate
    columns: tuple[np.ndarray, ...]  # per gate (b, dim_g): where callers write that gate's features
    sq: np.ndarray  # (b, G) ||x||^2
    sq_flat: np.ndarray  # (b * G,)
    u_stack: np.ndarray  # (G, b, parts * width + L): x W (and x W_bg), then the linear terms
    u_quad: np.ndarray  # (b, G, parts, width): x W (and x W_bg)
    quad: np.ndarray  # (b, G, parts): ||x W||^2 (and ||x W_bg||^2), next to the linear terms
    terms: np.ndarray  # (b, G, L + parts): the linear terms, then ||x W||^2 (and ||x W_bg||^2)
    gate: list[int]  # per entry, row-major (b, G): its gate
    low: list[float]  # per entry: the gate's norm band and threshold
    high: list[float]
    threshold: list[float]
    clean: list[bool]  # all False: nonfinite when no row is bad


class StackedScorer:
    """Scores feature rows against several gates' fitted statistics at once.

    Gate g reads its ``dim_g`` features from ``columns(b)[g]`` (write them there, then call
    ``score_rows(b)``), or ``GateScorer.score(x)`` does that for one gate.
    ``thresholds`` default to +inf (never exceed) so the same class computes raw scores for
    calibration. ``norm_low`` is raised to the smallest positive float so an all-zero row is always
    outside the band, whatever the calibration said. Not thread-safe (it reuses its buffers): one
    scorer per executor thread.
    """

    def __init__(
        self,
        stats: Sequence[GateStats],
        thresholds: Sequence[float] | None = None,
        norm_low: Sequence[float] | None = None,
        norm_high: Sequence[float] | None = None,
        max_batch: int = 64,
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
        self.norm_lows = np.maximum(per_gate(norm_low, 0.0), _TINY)
        self.norm_highs = per_gate(norm_high, _INF)
        self.dims = [s.dim for s in self.gate_stats]
        self.width = width = max(self.dims)
        self._parts = parts = 2 if any(s.variant == "relative" for s in self.gate_stats) else 1
        # per gate: the whitening(s), and the constant vectors whose dot with x the distance needs
        linear: list[list[np.ndarray]] = []
        self._cc: list[float] = []  # ||c W||^2
        self._classes: list[tuple[list[float], list[float], float | None] | None] = []
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
        self._proj = np.zeros((g_count, width, parts * width + n_linear))
        for g, s in enumerate(self.gate_stats):
            d = s.dim
            self._proj[g, :d, :d] = s.whiten
            if s.variant == "relative":
                self._proj[g, :d, width : width + d] = s.bg_whiten
            for j, vec in enumerate(linear[g]):
                self._proj[g, :d, parts * width + j] = vec
        self._capacity = 0
        self._grow(max(1, int(max_batch)))

    @property
    def n_gates(self) -> int:
        return len(self.gate_stats)

    def _grow(self, batch: int) -> None:
        g_count, width = self.n_gates, self.width
        self._capacity = batch
        self._x = np.zeros((batch, g_count, width))  # the padding stays zero forever
        self._sq = np.empty((batch, g_count))
        # x W (and x W_bg), the linear terms, then ||x W||^2 (and ||x W_bg||^2): the numbers the
        # distance needs are contiguous per (row, gate), so one tolist() reads them all
        self._u = np.empty((batch, g_count, self._proj.shape[2] + self._parts))
        self._views: dict[int, _Views] = {}

    def views(self, b: int) -> _Views:
        v = self._views.get(b)
        if v is None:
            if b > self._capacity:
                self._grow(b)
            g_count, width, quad_cols = self.n_gates, self.width, self._parts * self.width
            x, u = self._x[:b], self._u[:b]
            v = self._views[b] = _Views(
                x=x, x_stack=x.transpose(1, 0, 2), columns=tuple(x[:, g, :d] for g, d in enumerate(self.dims)),
                sq=self._sq[:b], sq_flat=self._sq[:b].reshape(b * g_count), u_stack=u[:, :, : self._proj.shape[2]].transpose(1, 0, 2),
                u_quad=u[:, :, :quad_cols].reshape(b, g_count, self._parts, width),
                quad=u[:, :, self._proj.shape[2] :], terms=u[:, :, quad_cols:], gate=list(range(g_count)) * b, low=self.norm_lows.tolist() * b, high=self.norm_highs.tolist() * b,
                threshold=self.thresholds.tolist() * b, clean=[False] * (b * g_count))
        return v

    def columns(self, b: int) -> tuple[np.ndarray, ...]:
        """Per gate, the (b, dim_g) view that ``score_rows(b)`` scores: write each tick's features here."""
        return self.views(b).columns

    def score_rows(self, b: int) -> RowScores:
        """Score the first ``b`` rows written to ``columns(b)`` for every gate, with their flags."""
        v = self.views(b)
        x = v.x
        np.vecdot(x, x, out=v.sq)
        raw = sq = v.sq_flat.tolist()  # ||x||^2 per (row, gate), row-major
        bad = huge = None
        if not sum(sq) < _SQ_HIGH or min(sq, default=1.0) < _SQ_LOW:  # NaN/Inf, or squares far from 1 (or a zero row)
            bad, huge, changed = self._condition(x, raw)
            if changed:
                np.vecdot(x, x, out=v.sq)
                sq = v.sq_flat.tolist()
        np.matmul(v.x_stack, self._proj, out=v.u_stack)  # x W and the linear terms
        np.vecdot(v.u_quad, v.u_quad, out=v.quad)
        cc, classes, q_at, sqrt = self._cc, self._classes, self._n_linear, math.sqrt
        scores, norm_out, exceed = [], [], []
        for r, s, g, lo, hi, t, lin in zip(raw, sq, v.gate, v.low, v.high, v.threshold,
                                           chain.from_iterable(v.terms.tolist())):
            n = sqrt(s) or _TINY  # an all-zero row: the centre's distance from the origin
            d2 = (lin[q_at] / n - 2.0 * lin[0]) / n + cc[g]
            spec = classes[g]
            if spec is not None:  # tied / relative: the nearest class, then minus the background
                oo, co, cc_bg = spec
                at = 1 if cc_bg is None else 2
                d2 = max(d2 + min(o - 2.0 * (lin[at + k] / n - c) for k, (o, c) in enumerate(zip(oo, co))), 0.0)
                if cc_bg is not None:
                    d2 -= (lin[q_at + 1] / n - 2.0 * lin[1]) / n + cc_bg
            r = sqrt(r)  # the raw norm, for the guard (NaN for NaN rows: never outside)
            scores.append(d2)
            norm_out.append(r < lo or r > hi)
            exceed.append(d2 > t)
        if bad is None and huge is None:
            return RowScores(v.threshold, scores, v.clean, norm_out, exceed, norm_out)
        if huge is not None:  # squares overflowed: outside any band, even an open one
            norm_out = [o or h for o, h in zip(norm_out, huge)]
        if bad is None:
            return RowScores(v.threshold, scores, v.clean, norm_out, exceed, norm_out)
        scores = [_INF if x else s for s, x in zip(scores, bad)]
        norm_out = [o and not x for o, x in zip(norm_out, bad)]  # its own flag; the norm of a NaN row means nothing
        exceed = [s > t for s, t in zip(scores, v.threshold)]
        return RowScores(v.threshold, scores, bad, norm_out, exceed, [o or x for o, x in zip(norm_out, bad)])

    def _condition(self, x: np.ndarray, sq: list[float]) -> tuple[list[bool] | None, list[bool] | None, bool]:
        """Rare path: zero NaN/Inf features (their score is set to +inf), and rescale finite ones
        whose squares overflowed (``huge``: reported outside the norm band) or sit near float64's
        limits, by their largest entry. Returns (bad, huge) per entry, row-major, and whether any
        features changed."""
        finite = np.isfinite(x).all(axis=2).reshape(-1).tolist()
        g_count, changed = self.n_gates, False
        for e, (ok, s) in enumerate(zip(finite, sq)):
            row, g = divmod(e, g_count)
            if not ok:
                x[row, g] = 0.0
            elif s != 0.0 and not _SQ_LOW <= s <= _SQ_HIGH:
                x[row, g] /= np.abs(x[row, g]).max()
            else:
                continue
            changed = True
        bad = [not ok for ok in finite]
        huge = [ok and not math.isfinite(s) for ok, s in zip(finite, sq)]
        return (bad if any(bad) else None), (huge if any(huge) else None), changed


class GateScorer(StackedScorer):
    """Scores (batch, d) feature rows against one gate's fitted statistics."""

    def __init__(
        self,
        stats: GateStats,
        threshold: float = float("inf"),
        norm_low: float = 0.0,
        norm_high: float = float("inf"),
        max_batch: int = 64,
    ) -> None:
        super().__init__([stats], [threshold], [norm_low], [norm_high], max_batch)
        self.stats = stats
        self.variant = stats.variant
        self.dim = stats.dim
        self.threshold = float(threshold)
        self.norm_low = float(self.norm_lows[0])
        self.norm_high = float(self.norm_highs[0])

    def score(self, x: np.ndarray) -> tuple[np.ndarray, GateFlags]:
        """Return (scores (batch,), flags), fresh arrays. Raises only for a wrong shape (a wiring bug)."""
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"gate expects features of shape (batch, {self.dim}), got {x.shape}")
        (column,) = self.columns(x.shape[0])
        np.copyto(column, x, casting="same_kind")
        r = self.score_rows(x.shape[0])
        return np.array(r.score, np.float64), GateFlags(*(np.array(f, bool) for f in (r.nonfinite, r.norm_out, r.exceed)))


def score_in_chunks(scorer: GateScorer, x: np.ndarray, chunk: int = 8192) -> tuple[np.ndarray, GateFlags]:
    """Score a large offline matrix without growing the scorer's buffers to its size."""
    parts = [scorer.score(x[i : i + chunk]) for i in range(0, x.shape[0], chunk)]
    d2 = np.concatenate([p[0] for p in parts])
    flags = GateFlags(*(np.concatenate([getattr(p[1], f) for p in parts]) for f in GateFlags._fields))
    return d2, flags
