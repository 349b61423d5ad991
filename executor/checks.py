"""Each check a tick runs, with its own score, threshold and verdict (DecisionSnapshot.checks).

The gates combine into one veto (`GateWiring.step`); this module says which check said what. The live
tick and the vectorised replay hand `CheckBoard.assemble` the same per-check values (per-gate density
scores and filter verdicts, the freeze counts, the actuation scores, the rows themselves) and it
makes one (rows, checks) array of `CHECK_DTYPE`: one function for both paths, so their verdicts,
statuses and thresholds agree exactly, and their scores as far as the model's and the gates' products
do between a batch of one and a whole replay (as for the combined gate score). Scores are finite by
construction: a score that could not be computed is 0 with status NOT_SCORED or NOT_APPLICABLE
(docs/contract.md#checks).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from dualloop.executor.snapshot import CHECK_DTYPE, Check, CheckStatus
from dualloop.executor.stuck_lead import LeadDoubt
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
    Check.SIGNAL_STUCK: "signal_stuck",
    Check.SPEED_ACCEL: "speed_accel",
    Check.GAP_RATE: "gap_rate",
    Check.LEAD_FLICKER: "lead_flicker",
    Check.SPEED_REPEAT: "speed_repeat",
    Check.GAP_REPEAT: "gap_repeat",
    Check.GAP_STEP: "gap_step",
    Check.REL_ACCEL: "rel_accel",
    Check.REL_UNIT: "rel_unit",
    Check.REL_SIGN: "rel_sign",
}
# the per-signal checks (ood/signals.py), in the order of their scores
SIGNAL_KINDS = (
    Check.SIGNAL_STUCK,
    Check.SPEED_ACCEL,
    Check.GAP_RATE,
    Check.LEAD_FLICKER,
    Check.SPEED_REPEAT,
    Check.GAP_REPEAT,
    Check.GAP_STEP,
    Check.REL_ACCEL,
    Check.REL_UNIT,
    Check.REL_SIGN,
)
# the per-signal checks that read only the lead's readings (flag, gap, relative speed): their veto
# doubts those readings. The stuck check also reads the ego speed and doubts none of them alone.
LEAD_CHECKS = (
    Check.GAP_RATE,
    Check.LEAD_FLICKER,
    Check.GAP_REPEAT,
    Check.GAP_STEP,
    Check.REL_ACCEL,
    Check.REL_UNIT,
    Check.REL_SIGN,
)
# of those, the ones a fault of one of gap and relative speed explains alone: the gap's repeat check
# and its rate against the relative speed (one of the two stuck), and the checks of the relative speed
# alone (its sign against the gap's trend, its unit, its rate of change). With nothing else among the
# vetoes the threat assessor reads the healthy one of the two (executor/stuck_lead.py): the gap where a
# check of the relative speed vetoes, else whichever has not stuck.
REL_CHECKS = (Check.REL_SIGN, Check.REL_UNIT, Check.REL_ACCEL)
ONE_READING_CHECKS = (Check.GAP_REPEAT, Check.GAP_RATE, *REL_CHECKS)
# a range score's floor (the centre of a range is -0.5; an open limit would be -inf) and cap (a
# float32 value far outside a narrow range would overflow float64 division)
_RANGE_FLOOR, _RANGE_CAP = -0.5, 1e30
_SCORED, _NOT_APPLICABLE, _NOT_SCORED = (int(s) for s in CheckStatus)
_NAN = float("nan")


class RangeFamily:
    """The range checks (values, changes, plan) of every gate, judged in one vectorised pass over a
    batch's rows: the features of all of them side by side, so a tick pays the same dozen numpy calls
    for one session or many. The excursion of a value v outside [low, high] is
    max((low - v) * inv, (v - high) * inv) with inv = 1 / (high - low) (1 where that span is not a
    positive finite number); a check's score is its largest excursion over the features it reads
    (NaN ones skipped), and it vetoes where that is > 0: a value below low or above high."""

    def __init__(self, parts: list[tuple[str, tuple[np.ndarray, np.ndarray]]]) -> None:
        """`parts`: per check, in column order, its source ("values", "changes" or "plan") and limits."""
        self.sources = [src for src, _ in parts]
        low = np.concatenate([np.asarray(lim[0], np.float64) for _, lim in parts]) if parts else np.zeros(0)
        high = np.concatenate([np.asarray(lim[1], np.float64) for _, lim in parts]) if parts else np.zeros(0)
        with np.errstate(invalid="ignore", over="ignore"):
            span = high - low
            self.inv = 1.0 / np.where(np.isfinite(span) & (span > 0), span, 1.0)
        self.low, self.high = low, high
        self.starts = np.cumsum([0] + [len(lim[0]) for _, lim in parts[:-1]]).astype(np.intp)

    def judge(
        self,
        x: np.ndarray,
        changes: np.ndarray | None,
        plans: np.ndarray,
        present: BoolArray | None,
        applies: BoolArray,
    ) -> np.ndarray:
        """The worst excursion (rows, checks), > 0 where the check vetoes: NaN where a row has no value
        to judge (rows where `applies` is False, non-finite input; no change known yet). `present` (rows, features):
        the features each row's session measures (None: all)."""
        blocks: list[np.ndarray] = []
        for src in self.sources:
            if src == "values":
                blocks.append(x)
            elif src == "plan":
                blocks.append(plans)
            else:
                blocks.append(np.full(x.shape, np.nan) if changes is None else changes)
        v = np.concatenate(blocks, axis=1, dtype=np.float64)
        if not applies.all():
            v[~applies] = np.nan  # nothing is judged on non-finite input
        if present is not None:  # features a session does not measure are not judged
            for b, src in zip(np.split(v, self.starts[1:], axis=1), self.sources):
                if src != "plan":
                    b[~present] = np.nan
        low, high, inv = self.low, self.high, self.inv
        # no errstate (it costs as much as the arithmetic): v is finite or NaN here, and a float32
        # value or rate times inv stays far inside float64's range
        e = np.fmax((low - v) * inv, (v - high) * inv)
        # > 0 exactly where v < low or v > high: a difference of distinct floats is never 0, and inv
        # (at least 1 / span) keeps it from underflowing
        worst: np.ndarray = np.fmax.reduceat(e, self.starts, axis=1)
        return worst


@dataclass(frozen=True)
class Column:
    kind: Check
    name: str
    gate: int  # the gate it belongs to (density, range, change, plan); -1 for the others


_RANGE_KINDS = {Check.INPUT_RANGE: "values", Check.INPUT_CHANGE: "changes", Check.PLAN_RANGE: "plan"}


class CheckValues(NamedTuple):
    """A batch of rows' values that `CheckBoard.assemble` judges. Per-row values may be arrays or
    lists. A NamedTuple, not a frozen dataclass: a live tick builds one, and a frozen dataclass's
    __init__ costs several times as much."""

    finite: BoolArray  # the row's measured features are finite
    scored: BoolArray  # finite and the model worked
    density: (
        list[tuple[Any, Any, Any]] | None
    )  # [g]: gate g's (score, threshold, veto) per row; score +inf/NaN: not scored
    x: np.ndarray
    plans: np.ndarray
    changes: np.ndarray | None  # each feature's change per second since the previous observation (NaN unknown)
    present: BoolArray | None  # (rows, features) what each row's session measures (None: all)
    freeze_count: Any  # consecutive repeats
    frozen: Any
    actuation: tuple[Any, Any] | None  # (score, alarm), score NaN where it gave no verdict
    margin: Any
    min_margin: float
    # the range checks' verdicts per row (`judge_ranges`) when the caller has them (a replay judges
    # each observation once for all the ticks that hold it); x, plans, changes and present are then not read
    ranged: np.ndarray | None = None
    # per row, the per-signal checks' scores (`SIGNAL_KINDS` order, NaN: no verdict); None: they do not run
    signals: Any = None


class CheckBoard:
    """The checks an executor runs, in `Check` order, and how a tick's values become their results."""

    def __init__(
        self,
        gates: list[Gate],
        sources: list[str],
        freeze_repeats: int,
        actuation_threshold: float | None,
        signal_thresholds: Sequence[float] | None = None,
    ) -> None:
        """`signal_thresholds`: the per-signal checks' thresholds (`SIGNAL_KINDS` order); None: not run."""
        columns: list[Column] = []
        ranges: dict[Column, tuple[np.ndarray, np.ndarray]] = {}
        for g, (gate, source) in enumerate(zip(gates, sources)):
            dens = Check.DECISION_VECTOR_DENSITY if source == "decision_vector" else Check.INPUT_DENSITY
            columns.append(Column(dens, NAMES[dens], g))
            rng = gate.feature_range
            if rng is None or source != "input_features":
                continue
            for kind, pair in zip((Check.INPUT_RANGE, Check.INPUT_CHANGE, Check.PLAN_RANGE), rng.limits()):
                if pair is not None:
                    column = Column(kind, NAMES[kind], g)
                    columns.append(column)
                    ranges[column] = pair
        if freeze_repeats > 0:
            columns.append(Column(Check.FREEZE, NAMES[Check.FREEZE], -1))
        if actuation_threshold is not None:
            columns.append(Column(Check.ACTUATION, NAMES[Check.ACTUATION], -1))
        columns.append(Column(Check.MARGIN, NAMES[Check.MARGIN], -1))
        if signal_thresholds is not None:
            columns += [Column(k, NAMES[k], -1) for k in SIGNAL_KINDS]
        self.signal_thresholds = [] if signal_thresholds is None else [float(t) for t in signal_thresholds]
        columns.sort(key=lambda c: c.kind)  # stable: gates of one kind in their order
        self.columns = columns
        self.kinds = tuple(c.kind for c in columns)
        ranged = [c for c in columns if c in ranges]
        self.ranges = RangeFamily([(_RANGE_KINDS[c.kind], ranges[c]) for c in ranged])
        self._range_at = {c: k for k, c in enumerate(ranged)}  # column -> its place in the family
        self.freeze_repeats = float(freeze_repeats)
        # the actuation check doubts the vehicle's response, not the inputs (executor/safety.py)
        self._actuation_at = self.kinds.index(Check.ACTUATION) if Check.ACTUATION in self.kinds else None
        self._input_checks = [k for k, c in enumerate(self.kinds) if c not in (Check.ACTUATION, Check.MARGIN)]
        self._lead_checks = [k for k, c in enumerate(self.kinds) if c in LEAD_CHECKS]
        self._other_lead_checks = [
            k for k, c in enumerate(self.kinds) if c in LEAD_CHECKS and c not in ONE_READING_CHECKS
        ]
        self._gap_repeat_at = self.kinds.index(Check.GAP_REPEAT) if Check.GAP_REPEAT in self.kinds else None
        self._rel_checks = [k for k, c in enumerate(self.kinds) if c in REL_CHECKS]
        self._rel_sign_at = self.kinds.index(Check.REL_SIGN) if Check.REL_SIGN in self.kinds else None
        self.actuation_threshold = 0.0 if actuation_threshold is None else float(actuation_threshold)
        self._families = _Families.of(columns)

    def lead_doubt(self, table: np.ndarray) -> npt.NDArray[np.int8]:
        """Per row of a (rows, checks) table, a LeadDoubt: what the per-signal checks of the lead's
        readings (the flag, the gap, the relative speed) leave the threat assessor to brake on."""
        doubt = np.zeros(len(table), np.int8)
        if not self._lead_checks:
            return doubt
        veto = table["veto"]
        doubt[veto[:, self._lead_checks].any(axis=1)] = LeadDoubt.ALL
        others = veto[:, self._other_lead_checks].any(axis=1)
        if self._gap_repeat_at is not None:
            doubt[veto[:, self._gap_repeat_at] & ~others] = LeadDoubt.ONE_STUCK
        if self._rel_checks:  # the relative speed doubted, stuck or not: the gap stands in
            doubt[veto[:, self._rel_checks].any(axis=1) & ~others] = LeadDoubt.REL_DOUBTED
        if self._rel_sign_at is not None:  # found late, by the gap's trend (the threat assessor says why)
            doubt[veto[:, self._rel_sign_at] & ~others] = LeadDoubt.REL_AGAINST_TREND
        return doubt

    def actuation_only(self, table: np.ndarray) -> BoolArray:
        """Per row of a (rows, checks) table: the actuation check vetoed and no check of the inputs did."""
        if self._actuation_at is None:
            return np.zeros(len(table), bool)
        veto = table["veto"]
        only: BoolArray = veto[:, self._actuation_at] & ~veto[:, self._input_checks].any(axis=1)
        return only

    def assemble(self, cv: CheckValues, vectorised: bool | None = None) -> np.ndarray:
        """The (rows, checks) CHECK_DTYPE results of a batch of rows (a live tick's, a replay's ticks).
        A tick of a few rows is judged in Python (a numpy call per check would cost more than the
        check), more (a busy live tick, a replay) with numpy over the whole table (`vectorised`; None:
        by the number of rows): the same rules on the same float64 values, so the same bytes
        (tests/executor/test_checks.py)."""
        ranged = cv.ranged
        if ranged is None and self._range_at:
            ranged = self.ranges.judge(cv.x, cv.changes, cv.plans, cv.present, cv.finite)
        if vectorised or (vectorised is None and len(cv.finite) > _VECTORISED_FROM):
            return self._vectorised(cv, ranged)
        return self._in_python(cv, ranged)

    def _in_python(self, cv: CheckValues, ranged: np.ndarray | None) -> np.ndarray:
        """`assemble`'s rules row by row over plain Python floats."""
        n = len(cv.finite)
        density, freeze_count, frozen, actuation = cv.density, cv.freeze_count, cv.frozen, cv.actuation
        margin, min_margin, signals = cv.margin, cv.min_margin, cv.signals
        worst = [] if ranged is None else ranged.tolist()
        ok, sc = cv.finite.tolist(), cv.scored.tolist()
        not_scored = [_NOT_APPLICABLE if o else _NOT_SCORED for o in ok]  # a check with no value to judge
        cols: list[list[tuple[float, float, bool, int]]] = []  # per check, its entry per row
        for c in self.columns:
            kind = c.kind
            if kind is Check.DECISION_VECTOR_DENSITY or kind is Check.INPUT_DENSITY:
                if density is None:
                    cols.append([(0.0, 0.0, False, _NOT_SCORED)] * n)
                    continue
                s, t, v = (_floats(a) for a in density[c.gate])
                cols.append(
                    [(d, ti, vi, _SCORED) if d - d == 0.0 else (0.0, ti, vi, _NOT_SCORED) for d, ti, vi in zip(s, t, v)]
                )
            elif kind in _RANGE_KINDS:
                k = self._range_at[c]
                cols.append(
                    [
                        (min(max(w, _RANGE_FLOOR), _RANGE_CAP), 0.0, w > 0.0, _SCORED)
                        if w == w
                        else (0.0, 0.0, False, u)
                        for w, u in zip([r[k] for r in worst], not_scored)
                    ]
                )
            elif kind is Check.FREEZE:
                repeats = self.freeze_repeats
                counts = [0.0] * n if freeze_count is None else _floats(freeze_count)
                cols.append([(float(k), repeats, f, _SCORED) for k, f in zip(counts, _floats(frozen))])
            elif kind is Check.ACTUATION:
                limit = self.actuation_threshold
                if actuation is None:
                    cols.append([(0.0, limit, False, _NOT_APPLICABLE)] * n)
                    continue
                cols.append(
                    [
                        (min(max(a, -_RANGE_CAP), _RANGE_CAP), limit, alarm, _SCORED)
                        if a == a
                        else (0.0, limit, alarm, u)
                        for a, alarm, u in zip(_floats(actuation[0]), _floats(actuation[1]), not_scored)
                    ]
                )
            elif kind is Check.MARGIN:  # as ReasonRules.flags judges LOW_MARGIN (in float64)
                cols.append(
                    [
                        (m, min_margin, m < min_margin, _SCORED) if scored_i else (0.0, min_margin, False, _NOT_SCORED)
                        for m, scored_i in zip(_floats(margin), sc)
                    ]
                )
            else:  # a per-signal check: vetoes above its threshold
                k = SIGNAL_KINDS.index(kind)
                limit = self.signal_thresholds[k]
                values = [_NAN] * n if signals is None else [float(r[k]) for r in signals]
                cols.append(
                    [
                        (v, limit, v > limit, _SCORED) if v == v else (0.0, limit, False, u)
                        for v, u in zip(values, not_scored)
                    ]
                )
        return _table(list(chain.from_iterable(zip(*cols))), n, len(self.columns))

    def judge_ranges(
        self, x: np.ndarray, changes: np.ndarray | None, plans: np.ndarray, present: BoolArray | None, finite: BoolArray
    ) -> np.ndarray | None:
        """The range checks' worst excursion per row (`RangeFamily.judge`); None without range checks."""
        return self.ranges.judge(x, changes, plans, present, finite) if self._range_at else None

    def _vectorised(self, cv: CheckValues, worst: np.ndarray | None) -> np.ndarray:
        """`assemble`'s rules as numpy operations over the whole (checks, rows) table at once: each
        check's raw value, threshold and veto in its row, then one rule per family of checks."""
        finite, scored, density, actuation, signals = cv.finite, cv.scored, cv.density, cv.actuation, cv.signals
        n, c = len(finite), len(self.columns)
        raw = np.full((c, n), np.nan)  # NaN: no value (density: +inf too)
        threshold = np.zeros((c, n))
        veto = np.zeros((c, n), bool)
        # the per-signal checks' scores (rows, 9), once for all their columns
        signal_scores = None if signals is None else np.asarray(signals, np.float64)
        for j, col in enumerate(self.columns):
            kind = col.kind
            if kind is Check.DECISION_VECTOR_DENSITY or kind is Check.INPUT_DENSITY:
                if density is not None:
                    raw[j], threshold[j], veto[j] = density[col.gate]
            elif kind in _RANGE_KINDS:
                assert worst is not None  # a range column: the family judged it
                raw[j] = worst[:, self._range_at[col]]
                veto[j] = raw[j] > 0.0  # NaN: no verdict
            elif kind is Check.FREEZE:
                raw[j] = 0.0 if cv.freeze_count is None else cv.freeze_count
                threshold[j], veto[j] = self.freeze_repeats, cv.frozen
            elif kind is Check.ACTUATION:
                threshold[j] = self.actuation_threshold
                if actuation is not None:
                    raw[j], veto[j] = actuation
            elif kind is Check.MARGIN:  # as ReasonRules.flags judges LOW_MARGIN (in float64)
                raw[j], threshold[j] = cv.margin, cv.min_margin
                veto[j] = scored & (raw[j] < cv.min_margin)
            else:  # a per-signal check
                k = SIGNAL_KINDS.index(kind)
                threshold[j] = self.signal_thresholds[k]
                if signal_scores is not None:
                    raw[j] = signal_scores[:, k]
                    veto[j] = raw[j] > threshold[j]  # NaN: no verdict
        fam = self._families
        no_value = np.where(finite, _NOT_APPLICABLE, _NOT_SCORED)
        # density: scored where finite; range and actuation: where known, else no value to judge;
        # freeze: always; margin: on rows the model scored
        has = np.where(fam.density, np.isfinite(raw), np.where(fam.margin, scored, ~np.isnan(raw)))
        status = np.where(has, _SCORED, np.where(fam.density | fam.margin, _NOT_SCORED, no_value))
        if actuation is None and fam.actuation is not None:
            status[fam.actuation] = _NOT_APPLICABLE
        out = np.zeros((n, c), CHECK_DTYPE)
        out["score"] = np.where(has, np.clip(raw, fam.low, fam.high), 0.0).T
        out["threshold"] = threshold.T
        out["veto"] = veto.T
        out["status"] = status.T
        return out


@dataclass(frozen=True)
class _Families:
    """Which of a board's columns follow which rule (`CheckBoard._vectorised`), as (checks, 1) masks,
    and each column's clip (ranges from their floor, actuation both ways, the others none)."""

    density: BoolArray
    margin: BoolArray
    low: FloatArray
    high: FloatArray
    actuation: int | None

    @classmethod
    def of(cls, columns: list[Column]) -> _Families:
        kinds = [c.kind for c in columns]
        density = [k in (Check.DECISION_VECTOR_DENSITY, Check.INPUT_DENSITY) for k in kinds]
        low = [_RANGE_FLOOR if k in _RANGE_KINDS else -_RANGE_CAP if k is Check.ACTUATION else -np.inf for k in kinds]
        high = [_RANGE_CAP if k in _RANGE_KINDS or k is Check.ACTUATION else np.inf for k in kinds]
        return cls(
            np.array(density)[:, None],
            np.array([k is Check.MARGIN for k in kinds])[:, None],
            np.array(low)[:, None],
            np.array(high)[:, None],
            kinds.index(Check.ACTUATION) if Check.ACTUATION in kinds else None,
        )


_VECTORISED_FROM = 8  # rows; up to it the Python pass over plain floats costs less (32 rows: 53 us numpy, 90 us Python)
_PACKERS: dict[int, struct.Struct] = {}


def _table(entries: list[tuple[float, float, bool, int]], n: int, c: int) -> np.ndarray:
    """The (n, c) CHECK_DTYPE array of row-major entries, packed in one call (numpy's conversion of
    a list of tuples to a structured array costs several times more at a tick's size)."""
    packer = _PACKERS.get(len(entries))
    if packer is None:
        packer = _PACKERS[len(entries)] = struct.Struct("<" + "dd?b" * len(entries))
    return np.frombuffer(bytearray(packer.pack(*chain.from_iterable(entries))), CHECK_DTYPE).reshape(n, c)


def _floats(a: Any) -> list[Any]:
    """Per-row values as a Python list (an array's floats as Python floats, float32 exactly)."""
    out: list[Any] = a.tolist() if isinstance(a, np.ndarray) else a
    return out
