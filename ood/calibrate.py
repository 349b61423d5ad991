"""Split-conformal calibration of the score threshold and of the raw-norm band.

Threshold: with n held-out in-distribution scores, take the k-th smallest score where
k = ceil((n + 1)(1 - alpha)) (the ceil((n+1)(1-alpha))/n empirical quantile). For a fresh
score exchangeable with the held-out ones, P(score > threshold) <= alpha, and on average it is
at least alpha - 1/(n+1): the per-tick false-veto rate is pinned to alpha from both sides.
This needs n >= 1/alpha - 1 held-out rows; with fewer we refuse instead of returning +inf,
because a gate that can never veto must not be produced silently.

Norm band: the same order-statistic argument applied to each tail at alpha/2, optionally widened
by a multiplicative ``margin`` (low / margin, high * margin). The guard bypasses the sequential
filter, so its rate is paid in full as immediate vetoes: alpha = 1e-3 at 200 Hz is one veto every
~5 s per session. The margin buys a far lower nominal rate (the stated alpha becomes an upper
bound) while gross faults (dropped or saturated sensors, all-zero vectors) stay outside the band.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

# (n+1)(1-alpha) is often an integer in exact arithmetic (n=999, alpha=0.001); floating-point
# error must not push ceil() to the next rank.
_RANK_EPS = 1e-9


@dataclass(frozen=True)
class ThresholdCalibration:
    """The score threshold and the evidence for it."""

    threshold: float
    alpha: float  # target per-tick false-veto rate (before the sequential filter)
    n: int  # number of held-out in-distribution rows
    rank: int  # threshold = rank-th smallest held-out score
    quantile_level: float  # rank / n
    empirical_rate: float  # fraction of held-out scores > threshold
    data_description: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "threshold": float(self.threshold),
            "alpha": float(self.alpha),
            "n": int(self.n),
            "rank": int(self.rank),
            "quantile_level": float(self.quantile_level),
            "empirical_rate": float(self.empirical_rate),
            "data_description": str(self.data_description),
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> ThresholdCalibration:
        return ThresholdCalibration(
            threshold=float(d["threshold"]),
            alpha=float(d["alpha"]),
            n=int(d["n"]),
            rank=int(d["rank"]),
            quantile_level=float(d["quantile_level"]),
            empirical_rate=float(d["empirical_rate"]),
            data_description=str(d["data_description"]),
        )


@dataclass(frozen=True)
class NormBand:
    """Accepted range [low, high] of the raw L2 norm; outside -> immediate veto."""

    low: float
    high: float
    alpha: float  # target per-tick rate of norm-guard hits on in-distribution data (upper bound)
    n: int
    empirical_rate: float  # of the final (widened) band on the held-out norms
    margin: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "low": float(self.low),
            "high": float(self.high),
            "alpha": float(self.alpha),
            "n": int(self.n),
            "empirical_rate": float(self.empirical_rate),
            "margin": float(self.margin),
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> NormBand:
        return NormBand(
            low=float(d["low"]), high=float(d["high"]), alpha=float(d["alpha"]), n=int(d["n"]),
            empirical_rate=float(d["empirical_rate"]), margin=float(d["margin"]),
        )


def _check_alpha(alpha: float) -> float:
    alpha = float(alpha)
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    return alpha


def conformal_rank(n: int, alpha: float) -> int:
    """1-based rank of the order statistic used as the (1 - alpha) conformal threshold."""
    return math.ceil((n + 1) * (1.0 - alpha) - _RANK_EPS)


def calibrate_threshold(scores: np.ndarray, alpha: float, data_description: str) -> ThresholdCalibration:
    """Threshold on held-out in-distribution scores at per-tick false-veto rate ``alpha``."""
    alpha = _check_alpha(alpha)
    if not data_description or not data_description.strip():
        raise ValueError("data_description must say which held-out data the threshold was measured on")
    s = np.asarray(scores, dtype=np.float64).ravel()
    if not np.isfinite(s).all():
        raise ValueError("calibration scores contain NaN/Inf; clean the held-out data first")
    n = s.size
    rank = conformal_rank(n, alpha)
    if rank > n:
        raise ValueError(
            f"alpha={alpha} needs at least {math.ceil(1.0 / alpha - 1.0 - _RANK_EPS)} held-out rows, got {n}"
        )
    threshold = float(np.partition(s, rank - 1)[rank - 1])
    return ThresholdCalibration(
        threshold=threshold,
        alpha=alpha,
        n=n,
        rank=rank,
        quantile_level=rank / n,
        empirical_rate=float(np.mean(s > threshold)),
        data_description=data_description,
    )


def calibrate_norm_band(norms: np.ndarray, alpha: float, margin: float = 1.0) -> NormBand:
    """Two-sided band on held-out raw norms, alpha/2 per tail, widened by ``margin`` >= 1."""
    alpha = _check_alpha(alpha)
    if not (margin >= 1.0 and np.isfinite(margin)):
        raise ValueError(f"norm margin must be a finite factor >= 1, got {margin}")
    v = np.sort(np.asarray(norms, dtype=np.float64).ravel())
    n = v.size
    if not np.isfinite(v).all():
        raise ValueError("calibration norms contain NaN/Inf")
    hi_rank = conformal_rank(n, alpha / 2.0)
    lo_rank = math.floor((n + 1) * (alpha / 2.0) + _RANK_EPS)
    if hi_rank > n or lo_rank < 1:
        raise ValueError(
            f"norm band at alpha={alpha} needs at least {math.ceil(2.0 / alpha - 1.0 - _RANK_EPS)} held-out rows, got {n}"
        )
    low, high = float(v[lo_rank - 1]) / margin, float(v[hi_rank - 1]) * margin
    if low <= 0.0:
        raise ValueError("held-out data contains all-zero feature rows; the norm band would accept them")
    return NormBand(
        low=low, high=high, alpha=alpha, n=n,
        empirical_rate=float(np.mean((v < low) | (v > high))), margin=float(margin),
    )
