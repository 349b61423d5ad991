"""Several gates watching the same session slots, run as one per tick.

An executor with a gate on the decision vector and one on the raw inputs would otherwise pay every
numpy call of scoring and filtering once per gate and per tick; at a batch of one that per-call cost
is the whole cost. A ``GateBank`` scores all gates in one ``StackedScorer`` pass (a fixed handful
of numpy calls), then makes each (row, gate)'s decisions in one pass of Python over plain numbers:
the norm guard, the threshold, the gate's own sequential filter rule (``filter.advance`` on the
filter's own per-slot state, so ``monitor.reset(slot)`` and a replay's ``filter.scan`` act on the
same state), and per row: any gate's alarm vetoes, and the row reports the gate nearest its
threshold (largest score / threshold, the first one on a tie), as ``executor.gating.nearest_gate``
does for a replay. One clean row (one session ticking) takes ``decision.RowDecider``: the same
decisions in one pass over the gates, without the per-(row, gate) lists.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from dualloop.ood.decision import Decisions, FilterSlots, RowDecider, quiet_state, ratio_at_zero
from dualloop.ood.mahalanobis import RowScores, StackedScorer
from dualloop.ood.monitor import GateMonitor

_INF = float("inf")
_F64, _BOOL = np.dtype(np.float64), np.dtype(bool)  # dtype objects: np.array resolves them faster than types


class BankStep(NamedTuple):
    """(batch,) results of one tick."""

    score: np.ndarray  # float64: the score of the gate nearest its threshold (+inf for NaN/Inf input)
    threshold: np.ndarray  # float64: that gate's threshold
    alarm: np.ndarray  # bool: some gate alarmed (filtered exceedance, norm guard or NaN/Inf), or `also`


class GateBank:
    def __init__(self, monitors: Sequence[GateMonitor], n_slots: int) -> None:
        self.monitors = list(monitors)
        if not self.monitors:
            raise ValueError("a gate bank needs at least one gate monitor")
        for j, m in enumerate(self.monitors):
            if m.filter.n_slots < n_slots:
                raise ValueError(f"monitor {j} has {m.filter.n_slots} slots, the bank needs {n_slots}")
        scorers = [m.scorer for m in self.monitors]
        self.scorer = StackedScorer(
            [s.stats for s in scorers],
            [s.threshold for s in scorers],
            [s.norm_low for s in scorers],
            [s.norm_high for s in scorers],
            max_batch=n_slots,
            ranges=[s.feature_range for s in scorers],
        )
        self.n_slots = n_slots
        self._gates: list[FilterSlots] = [(mon.filter.slot_states, mon.filter.advance) for mon in self.monitors]
        # per gate, with the state a clean (row, gate) leaves as it is without alarm (not advanced)
        self._filters = [(*g, quiet_state(m.filter.advance, m.filter.zero)) for g, m in zip(self._gates, self.monitors)]
        self._decider = RowDecider(self.scorer, self._gates, [mon.filter.zero for mon in self.monitors])
        self._last: RowScores | None = None  # the last general step's scores (None: the one-row tick's)

    @property
    def n_gates(self) -> int:
        return len(self.monitors)

    def step(
        self,
        slots: Sequence[int],
        features: Sequence[np.ndarray | None],
        nan_rows: np.ndarray | None = None,
        also: Sequence[bool] | None = None,
        changes: Sequence[np.ndarray | None] | None = None,
        context: Sequence[np.ndarray | None] | None = None,
    ) -> BankStep:
        """One tick for the rows of ``slots`` (slot numbers, in row order): ``features[g]`` is gate
        g's (rows, dim_g) features (None: every row NaN), ``nan_rows`` rows to score as NaN in every
        gate (see ``StackedScorer.score_rows``), ``also`` per row a veto from elsewhere (the freeze
        check), ``changes[g]`` and ``context[g]`` the rows' changes since their previous observation
        and their context (plan) for gate g's feature range (see ``StackedScorer.score_rows``)."""
        score, threshold, alarm = self.step_lists(slots, features, nan_rows, also, changes, context)
        return BankStep(np.array(score, _F64), np.array(threshold, _F64), np.array(alarm, _BOOL))

    def step_lists(
        self,
        slots: Sequence[int],
        features: Sequence[np.ndarray | None],
        nan_rows: np.ndarray | None = None,
        also: Sequence[bool] | None = None,
        changes: Sequence[np.ndarray | None] | None = None,
        context: Sequence[np.ndarray | None] | None = None,
    ) -> Decisions:
        """``step`` as Python lists (score, threshold, alarm per row), fresh: a caller that folds in more
        per-row verdicts (the executor's actuation check) does it on floats, then makes its arrays once."""
        n = len(slots)
        if n == 1 and nan_rows is None:  # one session ticking, finite inputs: the common tick
            one = self._decider.step(slots[0], features, also, changes, context)
            if one is not None:
                self._last = None  # in the one-row tick's buffer: ``entries``
                return one
        r = self._last = self.scorer.score_rows(n, features, nan_rows, changes, context)
        scores, thresholds, exceed, immediate = r.score, r.threshold, r.exceed, r.immediate
        best_score, best_threshold, veto = [], [], []
        i = 0
        for row, slot in enumerate(slots):
            top, score, threshold = -_INF, 0.0, 0.0
            alarm = also is not None and also[row]
            for state, advance, quiet in self._filters:
                s = scores[i]
                t = thresholds[i]
                if exceed[i] or immediate[i] or state[slot] != quiet:  # else the filter stays as it is
                    state[slot], a = advance(state[slot], exceed[i], immediate[i])
                    if a:
                        alarm = True
                ratio = s / t if t else ratio_at_zero(s, t)
                if ratio > top:
                    top, score, threshold = ratio, s, t
                i += 1
            best_score.append(score)
            best_threshold.append(threshold)
            veto.append(bool(alarm))
        return best_score, best_threshold, veto

    def entries(self) -> tuple[list[float], list[bool]]:
        """The last step's (score, norm guard or NaN/Inf hit) of every (row, gate), row-major: what each
        gate said of each row before the filters and the nearest-gate choice (DecisionSnapshot.checks).
        Scores are +inf where a gate's features were not finite."""
        r = self._last
        if r is None:
            return self._decider.entries()
        return r.score, [a or b for a, b in zip(r.norm_out, r.nonfinite)]
