"""A gate bank's tick for one session: the same decisions as ``GateBank.step``, without its per-row lists.

With one session ticking, the bank's cost is not arithmetic but Python bookkeeping around it: flat
per-(row, gate) lists built, copied and zipped, a named tuple of them, a second loop over them for
the filters, and the range check's generators. Here a tick is the scorer's own numpy calls on its
own one-row buffer (the same products on the same shapes as ``StackedScorer`` at a batch of one, so
the same bits), then one Python pass over the gates on plain floats: score, norm guard, range
check, filter, nearest gate.

It takes only the common tick: finite rows, every gate's features given, squares inside float64's
comfortable range. For anything else (NaN/Inf, no decision vector, rows near float64's limits) it
returns None before any filter state moves, and the bank takes its general path.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .score import _SQ_HIGH, _SQ_LOW, _TINY, ClassTerms, StackedScorer, class_conditional, outside_limits

_INF = float("inf")


class OneRowTick:
    """``GateBank.step`` for a single clean row (one session ticking)."""

    def __init__(self, scorer: StackedScorer, gates: Sequence[tuple[list, Callable[[Any, bool, bool], tuple[Any, bool]]]]
                 ) -> None:
        self.scorer = scorer
        v = scorer.views(1)
        # the scorer's own views at a batch of one: the same buffer rows, products and vecdot
        self._products = list(zip(scorer._proj, v.out))
        self._blocks, self._squares, self._tail = v.blocks, v.squares, v.tail
        n_linear = scorer._n_linear
        self._gates: list[tuple[float, ClassTerms | None, float, float, float, list, Callable, bool]] = [
            (scorer._cc[g], scorer._classes[g], float(scorer.norm_lows[g]), float(scorer.norm_highs[g]),
             float(scorer.thresholds[g]), state, advance, scorer._range_lists[g] is not None)
            for g, (state, advance) in enumerate(gates)]
        self._n_linear = n_linear

    def step(self, slot: int, features: Sequence[np.ndarray | None], also: Sequence[bool] | None,
             changes: Sequence[Any] | None, context: Sequence[np.ndarray | None] | None
             ) -> tuple[float, float, bool] | None:
        """(score, threshold, alarm) of the row, as ``GateBank.step`` decides them; None (and nothing
        changed) when the row needs the general path."""
        for src, (proj, out) in zip(features, self._products):
            if src is None:
                return None
            src.dot(proj, out=out)
        np.vecdot(self._blocks, self._blocks, out=self._squares)
        terms = self._tail.tolist()  # (gates, 1, terms)
        n_linear, sqrt, scorer = self._n_linear, math.sqrt, self.scorer
        decided = []
        for g, (cc, spec, low, high, threshold, _, _, ranged) in enumerate(self._gates):
            lin = terms[g][0]
            s = lin[n_linear]  # ||x||^2
            if not _SQ_LOW <= s <= _SQ_HIGH and s != 0.0:  # NaN/Inf, or squares far from 1
                return None
            n = sqrt(s)
            d = n or _TINY  # an all-zero row: the centre's distance from the origin
            d2 = (lin[n_linear + 1] / d - 2.0 * lin[0]) / d + cc
            if spec is not None:
                d2 = class_conditional(d2, lin, d, spec, n_linear)
            immediate = n < low or n > high  # the raw norm's guard
            if ranged and not immediate:
                sources = (features[g], None if changes is None else changes[g],
                           None if context is None else context[g])
                given, lo, hi = scorer.flat_limits(g, sources)
                if given:
                    values: list[float] = []
                    for i in given:
                        src = sources[i]
                        values += src[0] if isinstance(src, list) else src[0].tolist()
                    immediate = outside_limits(values, lo, hi)
            decided.append((d2, d2 > threshold, immediate))
        # every gate scored: only now move the filters
        alarm = also is not None and also[0]
        top, score, threshold = -_INF, 0.0, 0.0
        for (d2, exceed, immediate), (_, _, _, _, t, state, advance, _) in zip(decided, self._gates):
            state[slot], a = advance(state[slot], exceed, immediate)
            if a:
                alarm = True
            ratio = d2 / t if t else ratio_at_zero(d2, t)
            if ratio > top:
                top, score, threshold = ratio, d2, t
        return score, threshold, alarm


def ratio_at_zero(score: float, threshold: float) -> float:
    """score / 0.0 with IEEE (numpy) semantics instead of ZeroDivisionError."""
    if score == 0.0 or score != score:
        return math.nan
    return math.copysign(_INF, score) * math.copysign(1.0, threshold)
