"""A gate bank's decisions on one session's row: the same as ``GateBank.step``, without its per-row lists.

With one session ticking, the bank's cost is not arithmetic but Python bookkeeping around it: flat
per-(row, gate) lists built, copied and zipped, a named tuple of them, a second loop over them for
the filters, and the range check's generators. Here a tick is the scorer's own numpy calls on its
own one-row buffer (the same products on the same shapes as ``StackedScorer`` at a batch of one, so
the same bits), then one Python pass over the gates on plain floats: score, norm guard, range
check, filter, nearest gate. A filter at its zero state on a clean tick stays there, so it is not
advanced at all (checked per filter when the decider is built).

It takes only the common tick: finite rows, every gate's features given, squares inside float64's
comfortable range. For anything else (NaN/Inf, no decision vector, rows near float64's limits) it
returns None before any filter state moves, and the bank takes its general path.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from dualloop.ood.mahalanobis import _SQ_HIGH, _SQ_LOW, _TINY, ClassTerms, StackedScorer, class_conditional

_INF = float("inf")

# A gate's filter as the tick drives it: its live per-slot states and its rule, advance(state, exceed,
# immediate) -> (state, alarm). Any: the state is k-of-n bits (int) or a CUSUM statistic (float), per gate.
FilterSlots = tuple[list[Any], Callable[[Any, bool, bool], tuple[Any, bool]]]
# ([score], [threshold], [alarm]) of one row, as ``GateBank.step_lists`` returns them
Decisions = tuple[list[float], list[float], list[bool]]


class _Gate(NamedTuple):
    """What one gate's decision needs, as plain Python numbers."""

    cc: float  # ||c W||^2
    spec: ClassTerms | None  # tied / relative terms, None for a single Gaussian
    low: float  # norm band
    high: float
    threshold: float
    position: int  # the gate's place in the bank
    ranged: bool  # has a FeatureRange
    state: list[Any]  # the filter's live per-slot states
    advance: Callable[[Any, bool, bool], tuple[Any, bool]]
    quiet: Any  # a state that a clean tick leaves as it is, without alarm (the filter's zero)


class RowDecider:
    """``GateBank.step`` for a single clean row (one session ticking)."""

    def __init__(
        self,
        scorer: StackedScorer,
        gates: Sequence[FilterSlots],
        zeros: Sequence[Any],
    ) -> None:
        self.scorer = scorer
        v = scorer.views(1)
        # the scorer's own views at a batch of one: the same buffer rows, products and vecdot;
        # per gate: its projection and the buffer row the product fills
        self._products = [(proj, out) for proj, out in zip(scorer._proj, v.out)]
        self._blocks, self._squares = v.blocks, v.squares
        self._tail = v.tail.reshape(scorer.n_gates, -1)  # a view: the batch axis has one row
        self._n_linear = scorer._n_linear
        self._gates = []
        for g, ((state, advance), zero) in enumerate(zip(gates, zeros)):
            quiet = quiet_state(advance, zero)
            self._gates.append(
                _Gate(
                    scorer._cc[g],
                    scorer._classes[g],
                    float(scorer.norm_lows[g]),
                    float(scorer.norm_highs[g]),
                    float(scorer.thresholds[g]),
                    g,
                    scorer._range_lists[g] is not None,
                    state,
                    advance,
                    quiet,
                )
            )

    def step(
        self,
        slot: int,
        features: Sequence[np.ndarray | None],
        also: Sequence[bool] | None,
        changes: Sequence[Any] | None,
        context: Sequence[np.ndarray | None] | None,
    ) -> Decisions | None:
        """([score], [threshold], [alarm]) of the row, as ``GateBank.step_lists`` gives them; None (and
        nothing changed) when the row needs the general path."""
        if not self._products_of(features):
            return None
        return self._decide(slot, features, also, changes, context)

    def _products_of(self, features: Sequence[np.ndarray | None]) -> bool:
        """The scorer's numpy calls at a batch of one, into its buffer; False when a gate's features are None."""
        for src, (proj, out) in zip(features, self._products):
            if src is None:
                return False
            src.dot(proj, out=out)
        np.vecdot(self._blocks, self._blocks, out=self._squares)
        return True

    def _decide(
        self,
        slot: int,
        features: Sequence[np.ndarray | None],
        also: Sequence[bool] | None,
        changes: Sequence[Any] | None,
        context: Sequence[np.ndarray | None] | None,
    ) -> Decisions | None:
        """The decisions from the scorer's buffer once numpy has filled it (the reference pass)."""
        n_linear, sqrt = self._n_linear, math.sqrt
        decided = []
        for gate, lin in zip(self._gates, self._tail.tolist()):
            s = lin[n_linear]  # ||x||^2
            if not _SQ_LOW <= s <= _SQ_HIGH and s != 0.0:  # NaN/Inf, or squares far from 1
                return None
            n = sqrt(s)
            d = n or _TINY  # an all-zero row: the centre's distance from the origin
            d2 = (lin[n_linear + 1] / d - 2.0 * lin[0]) / d + gate.cc
            if gate.spec is not None:
                d2 = class_conditional(d2, lin, d, gate.spec, n_linear)
            immediate = n < gate.low or n > gate.high  # the raw norm's guard
            if gate.ranged and not immediate:
                g = gate.position
                sources = (
                    features[g],
                    None if changes is None else changes[g],
                    None if context is None else context[g],
                )
                immediate = self.scorer.outside_row(g, sources, 0)
            decided.append((d2, d2 > gate.threshold, immediate))
        # every gate scored: only now move the filters
        alarm = also is not None and also[0]
        top, score, threshold = -_INF, 0.0, 0.0
        for (d2, exceed, immediate), gate in zip(decided, self._gates):
            state = gate.state
            if exceed or immediate or state[slot] != gate.quiet:  # else the filter stays as it is
                state[slot], a = gate.advance(state[slot], exceed, immediate)
                if a:
                    alarm = True
            t = gate.threshold
            ratio = d2 / t if t else ratio_at_zero(d2, t)
            if ratio > top:
                top, score, threshold = ratio, d2, t
        return [score], [threshold], [bool(alarm)]

    def entries(self) -> tuple[list[float], list[bool]]:
        """(score, norm guard) per gate of the last tick this took, from the buffer it left (the
        operations of ``_decide``, hence its bits); call only after a tick it decided."""
        n_linear, sqrt = self._n_linear, math.sqrt
        scores, norm_out = [], []
        for gate, lin in zip(self._gates, self._tail.tolist()):
            n = sqrt(lin[n_linear])
            d = n or _TINY
            d2 = (lin[n_linear + 1] / d - 2.0 * lin[0]) / d + gate.cc
            if gate.spec is not None:
                d2 = class_conditional(d2, lin, d, gate.spec, n_linear)
            scores.append(d2)
            norm_out.append(n < gate.low or n > gate.high)
        return scores, norm_out


_NEVER = object()  # a filter whose zero state moves on a clean tick is always advanced


def quiet_state(advance: Callable[[Any, bool, bool], tuple[Any, bool]], zero: Any) -> Any:
    """The state a clean tick leaves as it is, without alarm: the filter's `zero` where it is one, else a
    value no state equals (such a filter is advanced on every tick)."""
    return zero if advance(zero, False, False) == (zero, False) else _NEVER


def ratio_at_zero(score: float, threshold: float) -> float:
    """score / 0.0 with IEEE (numpy) semantics instead of ZeroDivisionError."""
    if score == 0.0 or score != score:
        return math.nan
    return math.copysign(_INF, score) * math.copysign(1.0, threshold)
