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

import dataclasses
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
            low=float(d["low"]),
            high=float(d["high"]),
            alpha=float(d["alpha"]),
            n=int(d["n"]),
            empirical_rate=float(d["empirical_rate"]),
            margin=float(d["margin"]),
        )


def check_alpha(alpha: float, name: str = "alpha") -> float:
    """``alpha`` as a float, or ValueError naming it (``name``: how the caller calls it, e.g. a
    command's --alpha) when it is not a rate in (0, 1); NaN compares False and is refused too."""
    alpha = float(alpha)
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"{name} must be a rate in (0, 1), got {alpha}")
    return alpha


def conformal_rank(n: int, alpha: float) -> int:
    """1-based rank of the order statistic used as the (1 - alpha) conformal threshold."""
    return math.ceil((n + 1) * (1.0 - alpha) - _RANK_EPS)


def calibrate_threshold(scores: np.ndarray, alpha: float, data_description: str) -> ThresholdCalibration:
    """Threshold on held-out in-distribution scores at per-tick false-veto rate ``alpha``."""
    alpha = check_alpha(alpha)
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
    alpha = check_alpha(alpha)
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
            f"norm band at alpha={alpha} needs at least {math.ceil(2.0 / alpha - 1.0 - _RANK_EPS)} held-out rows, "
            f"got {n}"
        )
    low, high = float(v[lo_rank - 1]) / margin, float(v[hi_rank - 1]) * margin
    if low <= 0.0:
        raise ValueError("held-out data contains all-zero feature rows; the norm band would accept them")
    return NormBand(
        low=low,
        high=high,
        alpha=alpha,
        n=n,
        empirical_rate=float(np.mean((v < low) | (v > high))),
        margin=float(margin),
    )


@dataclass(frozen=True, eq=False)
class FeatureRange:
    """Plausibility limits per raw feature: a value outside its range, a change since the previous
    observation outside its change range, or a context value (what else conditions the model, e.g.
    its plan) outside its range vetoes at once.

    The Mahalanobis score sees L2-normalised rows, which hides a feature's magnitude when others
    dominate the norm (a speed of 50 m/s beside gaps of 150 m looks like one of 30); it sees one
    observation at a time, so a sensor whose values jump about plausibly (a noise burst) passes it;
    and it does not see a plan that asks for what the model never trained on (a 57 m/s target).
    Each range is the training data's [min, max] widened by ``margin`` times its span on each side:
    a fixed, inspectable envelope, like the operating limits a safety case states; where a simulator's
    training range is narrower than what real sensors read (a human's 6 m/s^2 with noise), the value
    limits are widened to a stated physical envelope (``envelope_note``). Changes are rates
    in the feature's unit per second (``ood.ChangeTracker``: the change between two fresh observations
    divided by the time between their timestamps), so one limit holds at any observation rate;
    ``change_note`` says what they were measured on.
    """

    low: tuple[float, ...]
    high: tuple[float, ...]
    margin: float  # fraction of each range's training span added on both sides
    n: int  # training rows it was measured on
    calibration_rate: float  # fraction of held-out rows outside some limit
    change_low: tuple[float, ...] = ()  # empty: no change limits
    change_high: tuple[float, ...] = ()
    change_note: str = ""
    context_names: tuple[str, ...] = ()  # empty: no context limits
    context_low: tuple[float, ...] = ()
    context_high: tuple[float, ...] = ()
    # what widened the value limits beyond the training data's (physically plausible readings), if anything
    envelope_note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "low": list(self.low),
            "high": list(self.high),
            "margin": float(self.margin),
            "n": int(self.n),
            "calibration_rate": float(self.calibration_rate),
            "change_low": list(self.change_low),
            "change_high": list(self.change_high),
            "change_note": self.change_note,
            "context_names": list(self.context_names),
            "context_low": list(self.context_low),
            "context_high": list(self.context_high),
            "envelope_note": self.envelope_note,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> FeatureRange:
        def floats(key: str) -> tuple[float, ...]:
            return tuple(float(v) for v in d.get(key, ()))

        rng = FeatureRange(
            floats("low"),
            floats("high"),
            float(d["margin"]),
            int(d["n"]),
            float(d["calibration_rate"]),
            floats("change_low"),
            floats("change_high"),
            str(d.get("change_note", "")),
            tuple(str(v) for v in d.get("context_names", ())),
            floats("context_low"),
            floats("context_high"),
            str(d.get("envelope_note", "")),
        )
        if (
            len(rng.low) != len(rng.high)
            or len(rng.change_low) != len(rng.change_high)
            or (rng.change_low and len(rng.change_low) != len(rng.low))
            or not len(rng.context_names) == len(rng.context_low) == len(rng.context_high)
        ):
            raise ValueError(
                f"feature range lengths differ: {len(rng.low)} lows, {len(rng.high)} highs, "
                f"{len(rng.change_low)} change lows, {len(rng.change_high)} change highs, "
                f"{len(rng.context_names)} context names, {len(rng.context_low)} lows, "
                f"{len(rng.context_high)} highs"
            )
        return rng

    def limits(self) -> list[tuple[np.ndarray, np.ndarray] | None]:
        """(low, high) arrays of the values, the changes and the context (None where there are none)."""
        pairs = ((self.low, self.high), (self.change_low, self.change_high), (self.context_low, self.context_high))
        return [(np.array(lo), np.array(hi)) if lo else None for lo, hi in pairs]

    def outside(
        self, x: np.ndarray, changes: np.ndarray | None = None, context: np.ndarray | None = None
    ) -> np.ndarray:
        """(n,) bool: rows with a value (or a change, or a context value, where given and limited)
        outside its limits. NaN compares False: a non-finite row is not out of range, it is non-finite."""
        out = np.zeros(len(x), bool)
        for rows, lim in zip((x, changes, context), self.limits()):
            if rows is not None and lim is not None:
                r = np.asarray(rows)
                out |= ((r < lim[0]) | (r > lim[1])).any(axis=1)
        return out


def _widened(x: np.ndarray, margin: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
    lo, hi = np.nanmin(x, axis=0), np.nanmax(x, axis=0)
    span = hi - lo
    return tuple((lo - margin * span).tolist()), tuple((hi + margin * span).tolist())


@dataclass(frozen=True, eq=False)  # holds numpy arrays: == would be ambiguous
class FeatureRows:
    """Rows a gate is fitted or calibrated on: the gate's features and, where the range guard limits
    them, each row's change since the previous observation (NaN where unknown; ``ChangeTracker``) and
    its context (what else conditions the model, e.g. its plan). None: not limited."""

    values: np.ndarray
    changes: np.ndarray | None = None
    context: np.ndarray | None = None


@dataclass(frozen=True)
class RangeSettings:
    """How a ``FeatureRange`` is fitted, as whoever fits the gate states it (checked by ``fit_feature_range``)."""

    margin: float  # fraction of each range's training span added on both sides
    change_note: str = ""  # at what rate the changes were measured
    context_names: tuple[str, ...] = ()  # the context columns' names
    # per feature, (low, high) of physically plausible readings the value limits are widened to include,
    # or None; None: the training data's limits alone
    envelope: tuple[tuple[float, float] | None, ...] | None = None
    envelope_note: str = ""  # what the envelope is
    # (context column, feature column): a context value the model may be given as at least that feature
    # (a card's no-plan default raised to it, executor.default_plan); its high limit covers the feature's
    context_at_least: tuple[tuple[int, int], ...] = ()


def _within_envelope(
    low: tuple[float, ...],
    high: tuple[float, ...],
    values: np.ndarray,
    envelope: tuple[tuple[float, float] | None, ...],
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Value limits widened to each feature's envelope, and the margin cut back to it: a margin past
    what physics allows admits readings no sensor gives (a gap of -35 m, a speed of -7 m/s passed
    every check and the model braked on them); the training rows' own extremes stay inside."""
    lo_data, hi_data = np.nanmin(values, axis=0).tolist(), np.nanmax(values, axis=0).tolist()
    new_low, new_high = [], []
    for lo, hi, d_lo, d_hi, e in zip(low, high, lo_data, hi_data, envelope):
        if e is not None:
            e_lo, e_hi = float(e[0]), float(e[1])
            lo, hi = min(e_lo, max(lo, min(e_lo, d_lo))), max(e_hi, min(hi, max(e_hi, d_hi)))
        new_low.append(lo)
        new_high.append(hi)
    return tuple(new_low), tuple(new_high)


def fit_feature_range(train: FeatureRows, calib: FeatureRows, settings: RangeSettings) -> FeatureRange:
    """Limits from the training rows (values, changes where given, context where given): [min -
    margin*span, max + margin*span] per column; the fraction of calibration rows outside them is recorded.
    ``settings.envelope`` (per feature, (low, high) or None) sets a feature's value limits to that range,
    or to the training rows' extremes where they lie beyond it: the margin never reaches past the
    envelope (`_within_envelope`); ``settings.context_at_least`` raises a
    context column's high limit to its feature's (the value a default raised to that feature can take)."""
    margin, envelope, context_names = settings.margin, settings.envelope, settings.context_names
    if not (margin >= 0.0 and np.isfinite(margin)):
        raise ValueError(f"range margin must be a finite fraction >= 0, got {margin}")
    if (train.changes is None) != (calib.changes is None) or (train.context is None) != (calib.context is None):
        raise ValueError("change and context limits need rows for both the training and the calibration data")
    if train.context is not None and len(context_names) != np.shape(train.context)[1]:
        raise ValueError(f"{len(context_names)} context names for {np.shape(train.context)[1]} context columns")
    values = np.asarray(train.values, np.float64)
    low, high = _widened(values, margin)
    if envelope is not None:
        if len(envelope) != len(low):
            raise ValueError(f"an envelope of {len(envelope)} features for {len(low)} feature columns")
        low, high = _within_envelope(low, high, values, envelope)
    change_low, change_high = (
        ((), ()) if train.changes is None else _widened(np.asarray(train.changes, np.float64), margin)
    )
    context_low, context_high = (
        ((), ()) if train.context is None else _widened(np.asarray(train.context, np.float64), margin)
    )
    if context_high:
        raised = list(context_high)
        for c, f in settings.context_at_least:
            raised[c] = max(raised[c], high[f])
        context_high = tuple(raised)
    rng = FeatureRange(
        low,
        high,
        float(margin),
        int(len(train.values)),
        0.0,
        change_low,
        change_high,
        settings.change_note,
        tuple(context_names) if train.context is not None else (),
        context_low,
        context_high,
        settings.envelope_note if envelope is not None else "",
    )
    rate = float(rng.outside(np.asarray(calib.values, np.float64), calib.changes, calib.context).mean())
    return dataclasses.replace(rng, calibration_rate=rate)
