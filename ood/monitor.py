"""Per-tick gate for a batch of session slots: score, then filter, in one call."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from dualloop.ood.filter import CusumFilter, KOfNFilter
from dualloop.ood.mahalanobis import GateFlags, GateScorer


class GateStep(NamedTuple):
    """Result for the rows passed to ``GateMonitor.step`` (same order)."""

    score: np.ndarray  # (batch,) float64; +inf for NaN/Inf rows
    alarm: np.ndarray  # (batch,) bool: veto this tick
    flags: GateFlags  # why: nonfinite / norm_out (immediate) and exceed (filtered)


class GateMonitor:
    """Owns a scorer and a per-slot sequential filter.

    ``step(features, slots)``: features is (batch, d) for the sessions ticking now and ``slots``
    their slot indices (None = all ``n_slots`` in order). NaN/Inf rows and norm-guard hits alarm
    in the same tick; score exceedances alarm only once the filter confirms them.
    """

    def __init__(self, scorer: GateScorer, filt: KOfNFilter | CusumFilter) -> None:
        self.scorer = scorer
        self.filter = filt
        self.threshold = scorer.threshold

    @property
    def n_slots(self) -> int:
        return self.filter.n_slots

    def step(
        self,
        features: np.ndarray,
        slots: np.ndarray | None = None,
        changes: np.ndarray | None = None,
        context: np.ndarray | None = None,
    ) -> GateStep:
        """``changes``, ``context``: each row's change since its previous observation and its context
        (plan), for the gate's feature range."""
        score, flags = self.scorer.score(features, changes, context)
        alarm = self.filter.update(flags.exceed, immediate=flags.immediate, slots=slots)
        return GateStep(score, alarm, flags)

    def reset(self, slot: int | np.ndarray) -> None:
        """Clear a slot's filter state (new session in that slot, or after recovery)."""
        self.filter.reset(slot)
