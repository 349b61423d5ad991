"""Each check a tick runs, with its own score, threshold and verdict (DecisionSnapshot.checks).

The gates combine into one veto (`GateWiring.step`); this module says which check said what. The live
tick and the vectorised replay hand `CheckBoard.assemble` the same per-check values (per-gate density
scores and filter verdicts, the freeze counts, the actuation scores, the rows themselves) as arrays,
and it makes one (rows, checks) array of `CHECK_DTYPE`: one function for both paths, so a replay's
checks are the live path's byte for byte. Scores are finite by construction: a score that could not
be computed is 0 with status NOT_SCORED or NOT_APPLICABLE (docs/contract.md#checks).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dualloop.executor.snapshot import CHECK_DTYPE, Check, CheckStatus
from dualloop.ood import Gate

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

NAMES = {
    Check.DECISION_VECTOR_DENSITY: "decision_vector_density",
    Check.INPUT_DENSITY: "input_density",
    Check.INPUT_RANGE: "input_range",
    Check.INPUT_CHANGE: "input_change",
    Check.PLAN_RANGE: "plan_range",
    Check.FREEZE: "freeze",
    Check.ACTUATION: "actuation",
    Check.MARGIN: "margin",
}
# a range score's floor (the centre of a range is -0.5; an open limit would be -inf) and cap (a
# float32 value far outside a narrow range would overflow float64 division)
_RANGE_FLOOR, _RANGE_CAP = -0.5, 1e30
_SCORED, _NOT_APPLICABLE, _NOT_SCORED = (int(s) for s in CheckStatus)


@dataclass(frozen=True)
class Limits:
    """One range check's limits (a FeatureRange's values, changes or context) and the span its score
    is measured in (high - low, 1 where that is not a positive finite number)."""

    low: FloatArray
    high: FloatArray
    span: FloatArray

    @staticmethod
    def of(pair: tuple[np.ndarray, np.ndarray]) -> Limits:
        low, high = (np.asarray(a, np.float64) for a in pair)
        with np.errstate(invalid="ignore", over="ignore"):
            span = high - low
        return Limits(low, high, np.where(np.isfinite(span) & (span > 0), span, 1.0))

    def judge(
        self, v: np.ndarray, present: BoolArray | None, out: np.ndarray, applies: BoolArray
    ) -> None:
        """Score rows `v` (rows, features) into `out` (a CHECK_DTYPE column) where `applies`: the
        largest excursion outside the limits over the measured features, as a fraction of the span;
        veto where a value is below low or above high (the gate's own comparisons; NaN compares
        False). Rows whose measured values are all NaN are NOT_APPLICABLE (no change known yet)."""
        v = np.asarray(v, np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            below, above = v < self.low, v > self.high
            e = np.fmax(self.low - v, v - self.high) / self.span
        if present is not None:
            e = np.where(present, e, np.nan)
            below &= present
            above &= present
        worst = np.fmax.reduce(e, axis=1) if e.shape[1] else np.full(len(e), np.nan)
        known = ~np.isnan(worst)
        ok = applies & known
        out["score"] = np.where(ok, np.clip(np.nan_to_num(worst, nan=0.0), _RANGE_FLOOR, _RANGE_CAP), 0.0)
        out["veto"] = ok & (below.any(axis=1) | above.any(axis=1))
        out["status"] = np.where(ok, _SCORED, np.where(applies, _NOT_APPLICABLE, _NOT_SCORED))


@dataclass(frozen=True)
class Column:
    kind: Check
    name: str
    gate: int  # the gate it belongs to (density, range, change, plan); -1 for the others


class CheckBoard:
    """The checks an executor runs, in `Check` order, and how a tick's values become their results."""

    def __init__(self, gates: list[Gate], sources: list[str], freeze_repeats: int, actuation_threshold: float | None):
        columns: list[Column] = []
        self.limits: dict[tuple[Check, int], Limits] = {}
        for g, (gate, source) in enumerate(zip(gates, sources)):
            dens = Check.DECISION_VECTOR_DENSITY if source == "decision_vector" else Check.INPUT_DENSITY
            columns.append(Column(dens, NAMES[dens], g))
            rng = gate.feature_range
            if rng is None or source != "input_features":
                continue
            for kind, pair in zip((Check.INPUT_RANGE, Check.INPUT_CHANGE, Check.PLAN_RANGE), rng.limits()):
                if pair is not None:
                    columns.append(Column(kind, NAMES[kind], g))
                    self.limits[(kind, g)] = Limits.of(pair)
        if freeze_repeats > 0:
            columns.append(Column(Check.FREEZE, NAMES[Check.FREEZE], -1))
        if actuation_threshold is not None:
            columns.append(Column(Check.ACTUATION, NAMES[Check.ACTUATION], -1))
        columns.append(Column(Check.MARGIN, NAMES[Check.MARGIN], -1))
        columns.sort(key=lambda c: c.kind)  # stable: gates of one kind in their order
        self.columns = columns
        self.kinds = tuple(c.kind for c in columns)
        self.names = tuple(c.name for c in columns)
        self.freeze_repeats = float(freeze_repeats)
        self.actuation_threshold = 0.0 if actuation_threshold is None else float(actuation_threshold)

    def assemble(
        self,
        n: int,
        finite: BoolArray,
        scored: BoolArray,
        density: list[tuple[FloatArray, FloatArray, BoolArray]] | None,
        x: np.ndarray,
        plans: np.ndarray,
        changes: np.ndarray | None,
        present: BoolArray | None,
        freeze_count: np.ndarray | None,
        frozen: BoolArray,
        actuation: tuple[FloatArray, BoolArray] | None,
        margin: np.ndarray,
        min_margin: float,
    ) -> np.ndarray:
        """The (n, checks) CHECK_DTYPE results of n rows. `finite`: the row's measured features are
        finite; `scored`: finite and the model worked; `density[g]`: gate g's (score, threshold,
        veto) per row, score +inf/NaN where it could not score; `changes`: each feature's change per
        second since the previous observation (NaN unknown); `freeze_count`: consecutive repeats;
        `actuation`: (score, alarm), score NaN without a command in effect."""
        out = np.zeros((n, len(self.columns)), CHECK_DTYPE)
        for j, c in enumerate(self.columns):
            col = out[:, j]
            kind = c.kind
            if kind is Check.DECISION_VECTOR_DENSITY or kind is Check.INPUT_DENSITY:
                if density is None:
                    continue
                score, threshold, veto = density[c.gate]
                ok = np.isfinite(score)
                col["score"] = np.where(ok, score, 0.0)
                col["threshold"] = threshold
                col["veto"] = veto
                col["status"] = np.where(ok, _SCORED, _NOT_SCORED)
            elif kind is Check.INPUT_RANGE:
                self.limits[(kind, c.gate)].judge(x, present, col, finite)
            elif kind is Check.PLAN_RANGE:
                self.limits[(kind, c.gate)].judge(plans, None, col, finite)
            elif kind is Check.INPUT_CHANGE:
                if changes is None:
                    col["status"] = np.where(finite, _NOT_APPLICABLE, _NOT_SCORED)
                else:
                    self.limits[(kind, c.gate)].judge(changes, present, col, finite)
            elif kind is Check.FREEZE:
                col["score"] = 0.0 if freeze_count is None else freeze_count
                col["threshold"] = self.freeze_repeats
                col["veto"] = frozen
                col["status"] = _SCORED
            elif kind is Check.ACTUATION:
                col["threshold"] = self.actuation_threshold
                if actuation is None:
                    col["status"] = _NOT_APPLICABLE
                    continue
                score, alarm = actuation
                ok = ~np.isnan(score)
                col["score"] = np.where(ok, np.nan_to_num(score, nan=0.0, posinf=_RANGE_CAP, neginf=-_RANGE_CAP), 0.0)
                col["veto"] = alarm
                col["status"] = np.where(ok, _SCORED, np.where(finite, _NOT_APPLICABLE, _NOT_SCORED))
            else:  # MARGIN, as ReasonRules.flags judges LOW_MARGIN (in float64)
                m = np.asarray(margin, np.float64)
                col["score"] = np.where(scored, m, 0.0)
                col["threshold"] = min_margin
                col["veto"] = scored & (m < min_margin)
                col["status"] = np.where(scored, _SCORED, _NOT_SCORED)
        return out
