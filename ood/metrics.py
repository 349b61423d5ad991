"""Evaluation helpers for gate quality and its cost in false vetoes (numpy only).

Conventions: a larger score means "more OOD"; OOD rows are the positives for AUROC.
"""

from __future__ import annotations

import math

import numpy as np


def _clean(scores: np.ndarray, what: str) -> np.ndarray:
    s = np.asarray(scores, dtype=np.float64).ravel()
    if np.isnan(s).any():
        raise ValueError(f"{what} contains NaN; +inf is allowed (a vetoed row), NaN is not a score")
    if s.size == 0:
        raise ValueError(f"{what} is empty")
    return s


def average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, tied values sharing the mean of their ranks."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    last = np.cumsum(counts)
    return (last - (counts - 1) / 2.0)[inverse]


def auroc(scores_in: np.ndarray, scores_out: np.ndarray) -> float:
    """Area under the ROC curve for separating OOD (positives) from in-distribution rows.

    Mann-Whitney form: P(score_out > score_in) + 0.5 * P(tie), from average ranks.
    """
    s_in = _clean(scores_in, "scores_in")
    s_out = _clean(scores_out, "scores_out")
    ranks = average_ranks(np.concatenate([s_out, s_in]))
    n_out, n_in = s_out.size, s_in.size
    u = ranks[:n_out].sum() - n_out * (n_out + 1) / 2.0
    return float(u / (n_out * n_in))


def tnr_at_tpr(scores_in: np.ndarray, scores_out: np.ndarray, tpr: float = 0.95) -> float:
    """TNR at the given TPR, in the OOD literature's convention (Lee et al. 2018).

    TPR: fraction of in-distribution rows accepted (score <= t) - t is the smallest held-out
    score reaching it; TNR: fraction of OOD rows rejected at that t (score > t).
    """
    s_in = np.sort(_clean(scores_in, "scores_in"))
    s_out = _clean(scores_out, "scores_out")
    if not 0.0 < tpr <= 1.0:
        raise ValueError(f"tpr must be in (0, 1], got {tpr}")
    t = s_in[max(math.ceil(tpr * s_in.size - 1e-9), 1) - 1]
    return float(np.mean(s_out > t))


def detection_delay(alarms: np.ndarray, onset: int) -> int | None:
    """Ticks from the fault onset (index) to the first alarm at or after it; 0 = same tick.

    None if the fault was never detected. Alarms before the onset are false alarms and ignored.
    """
    a = np.asarray(alarms, dtype=bool).ravel()
    if not 0 <= onset < a.size:
        raise ValueError(f"onset {onset} outside the alarm array of length {a.size}")
    hits = np.flatnonzero(a[onset:])
    return int(hits[0]) if hits.size else None


def false_veto_rate(alarms: np.ndarray, tick_period_s: float) -> dict[str, float]:
    """False-veto statistics on an in-distribution alarm trace (one bool per tick).

    ``per_tick`` / ``per_hour`` count vetoed ticks; ``episodes_per_hour`` counts rising edges,
    which is what a driver or supervisor notices.
    """
    a = np.asarray(alarms, dtype=bool).ravel()
    if a.size == 0 or tick_period_s <= 0:
        raise ValueError("need a non-empty alarm trace and a positive tick period")
    ticks_per_hour = 3600.0 / tick_period_s
    per_tick = float(a.mean())
    episodes = int(a[0]) + int(np.count_nonzero(a[1:] & ~a[:-1]))
    hours = a.size / ticks_per_hour
    return {
        "per_tick": per_tick,
        "per_hour": per_tick * ticks_per_hour,
        "episodes": float(episodes),
        "episodes_per_hour": episodes / hours,
        "hours": hours,
    }
