"""Per-tick, batch-vectorised gate scoring: one call for all sessions.

Hot-path rules: no Python loop over rows, no exceptions for bad data, a handful of numpy calls on
preallocated float64 buffers. A row with NaN/Inf gets score +inf and ``nonfinite=True`` so the
caller can veto it in the same tick; the raw-norm guard is reported separately from the
Mahalanobis exceedance because it must bypass the sequential filter.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .fit import GateStats

_TINY = float(np.finfo(np.float64).tiny)


class GateFlags(NamedTuple):
    """Per-row booleans (fresh arrays, safe to keep)."""

    nonfinite: np.ndarray  # a feature was NaN/Inf: score is +inf, veto now
    norm_out: np.ndarray  # raw L2 norm outside the calibrated band (always true for all-zero)
    exceed: np.ndarray  # score > threshold (Mahalanobis); goes through the sequential filter

    @property
    def immediate(self) -> np.ndarray:
        """Rows that must alarm this tick regardless of the filter."""
        return self.nonfinite | self.norm_out


class GateScorer:
    """Scores (batch, d) feature rows against fitted statistics.

    ``threshold`` defaults to +inf (never exceeds) so the same class computes raw scores for
    calibration. ``norm_low`` is raised to the smallest positive float so an all-zero row is
    always outside the band, whatever the calibration said. Not thread-safe (it reuses its
    buffers): one scorer per executor thread.
    """

    def __init__(
        self,
        stats: GateStats,
        threshold: float = float("inf"),
        norm_low: float = 0.0,
        norm_high: float = float("inf"),
        max_batch: int = 64,
    ) -> None:
        self.stats = stats
        self.variant = stats.variant
        self.dim = stats.dim
        self.threshold = float(threshold)
        self.norm_low = max(float(norm_low), _TINY)
        self.norm_high = float(norm_high)
        if self.variant == "relative":
            # One matmul gives both the tied and the background whitened coordinates.
            self._proj = np.ascontiguousarray(np.hstack([stats.whiten, stats.bg_whiten]))
        else:
            self._proj = np.ascontiguousarray(stats.whiten)
        self._bias = stats.center @ self._proj
        # -2 o_k^T folded in so the tied score needs no extra scaling op per tick.
        self._neg2_offsets_t = np.ascontiguousarray(-2.0 * stats.class_offsets.T)  # (d, K)
        self._offsets_sq = np.einsum("ij,ij->i", stats.class_offsets, stats.class_offsets)
        self._capacity = 0
        self._grow(max(1, int(max_batch)))

    def _grow(self, batch: int) -> None:
        self._capacity = batch
        self._x = np.empty((batch, self.dim))
        self._u = np.empty((batch, self._proj.shape[1]))
        self._cross = np.empty((batch, self._neg2_offsets_t.shape[1]))

    def score(self, x: np.ndarray) -> tuple[np.ndarray, GateFlags]:
        """Return (scores (batch,), flags). Raises only for a wrong shape (a wiring bug)."""
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"gate expects features of shape (batch, {self.dim}), got {x.shape}")
        b = x.shape[0]
        if b > self._capacity:
            self._grow(b)
        buf = self._x[:b]
        np.copyto(buf, x, casting="same_kind")
        sq = np.vecdot(buf, buf)
        bad: np.ndarray | None = None
        huge: np.ndarray | None = None
        # One scalar check instead of a per-row isfinite: the sum of squares is finite unless
        # some row has NaN/Inf (or overflows, which _repair also handles).
        if not math.isfinite(np.add.reduce(sq)):
            bad, huge = self._repair(buf, sq)
        norm = np.sqrt(sq, out=sq)
        norm_out = (norm < self.norm_low) | (norm > self.norm_high)
        if huge is not None:
            norm_out |= huge
        np.maximum(norm, _TINY, out=norm)  # all-zero row -> zero vector, not 0/0
        u = self._u[:b]
        np.matmul(buf, self._proj, out=u)
        u /= norm[:, None]  # normalising after the projection is the same and costs b*width
        u -= self._bias
        if self.variant == "single":
            d2 = np.vecdot(u, u)
        else:
            d2 = self._tied(u[:, : self.dim], b)
            if self.variant == "relative":
                bg = u[:, self.dim :]
                d2 -= np.vecdot(bg, bg)
        if bad is None:
            nonfinite = np.zeros(b, dtype=bool)
        else:
            nonfinite = bad
            d2[bad] = np.inf
            norm_out[bad] = False  # its own flag; the norm of a NaN row means nothing
        return d2, GateFlags(nonfinite, norm_out, d2 > self.threshold)

    def _tied(self, u: np.ndarray, b: int) -> np.ndarray:
        # min_k ||u - o_k||^2 = ||u||^2 + min_k (||o_k||^2 - 2 u.o_k): one (b,d)x(d,K) matmul.
        cross = self._cross[:b]
        np.matmul(u, self._neg2_offsets_t, out=cross)
        cross += self._offsets_sq
        d2 = np.minimum.reduce(cross, axis=1)
        d2 += np.vecdot(u, u)
        return np.maximum(d2, 0.0, out=d2)  # rounding can leave -1e-15 at a class mean

    def _repair(self, buf: np.ndarray, sq: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Rare path: split real NaN/Inf rows from finite rows whose squares overflowed.

        NaN/Inf rows are zeroed so the matmul stays clean (their score is set to +inf later).
        Overflowing rows are rescaled by their largest entry: the direction, hence d2, stays
        exact, and they are reported as outside the norm band.
        """
        overflowed = ~np.isfinite(sq)
        row_finite = np.isfinite(buf).all(axis=1)
        bad = overflowed & ~row_finite
        huge = overflowed & row_finite
        buf[bad] = 0.0
        sq[bad] = 0.0
        if huge.any():
            rows = buf[huge]
            rows /= np.abs(rows).max(axis=1)[:, None]
            buf[huge] = rows
            sq[huge] = np.vecdot(rows, rows)
        return (bad if bad.any() else None), (huge if huge.any() else None)


def score_in_chunks(scorer: GateScorer, x: np.ndarray, chunk: int = 8192) -> tuple[np.ndarray, GateFlags]:
    """Score a large offline matrix without growing the scorer's buffers to its size."""
    parts = [scorer.score(x[i : i + chunk]) for i in range(0, x.shape[0], chunk)]
    d2 = np.concatenate([p[0] for p in parts])
    flags = GateFlags(*(np.concatenate([getattr(p[1], f) for p in parts]) for f in GateFlags._fields))
    return d2, flags
