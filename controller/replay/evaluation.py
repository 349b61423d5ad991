"""How a replayed model compares with the human's labels and with trivial baselines: an
agreement figure means little until it stands beside what a trivial rule gets on the same ticks.

The contract is docs/design-notes/real-sensors.md ("Labels", "Evaluation"); docs/operations.md
("Evaluating a model on recorded drives") explains how to read the output.

Which ticks count. A LOCKSTEP replay ticks every 5 ms on the newest observation, so a 10 Hz sensor
would have each of its decisions counted twenty times. The evaluation takes one tick per
observation: the first tick that uses it (the tick at its timestamp, or the next grid tick when
the timestamp is off the grid). Observations replaced before any tick used them (faster than the
tick) are not evaluated and are counted (`observations - ticked`). Of those ticks, only the ones
whose observation has a label (ActualAction.action_index >= 0) are scored.

What is scored, per predictor: agreement (fraction of labelled ticks whose action equals the
label), balanced accuracy (mean per-class recall over the label classes present) and accel MAE
(|predicted accel - the label's look-ahead accel|, on the ticks where both are finite). Predictors:
the model's top-1 proposal, the applied action (after gates and the safe-state machine), and the
baselines of `baselines.py`. A tick where the model could not propose (INVALID_INPUT, MODEL_ERROR)
counts as a disagreement; a tick where a baseline is n/a (a feature it needs is not measured) is
left out of that baseline's scores, and the model is also scored on exactly the baseline's ticks
(`proposed_on`) so the two are compared on the same ticks.

Everything is kept as sums (confusion counts, absolute errors), so pooling logs is adding them:
the pooled row is pooled over ticks; the macro row is the mean of the per-log values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt

from dualloop.controller.plotting import pyplot
from dualloop.controller.replay import baselines as bl
from dualloop.executor.action_labels import ACTIONS
from dualloop.executor.columns import as_columns

# The executor's modules (~0.25 s CPU to import) are imported by the functions that score ticks:
# a fleet's parent process only pools and prints the workers' evaluations (from_replay_reports).
if TYPE_CHECKING:
    from dualloop.executor.lockstep_batch import TickTable
    from dualloop.executor.model_card import ModelCard
    from dualloop.executor.snapshot import Observation, Snapshot
    from dualloop.v2 import log_pb2

SCHEMA: Final = "dualloop.evaluation/1"
TICKS_NOTE: Final = (
    "one tick per observation (the first 5 ms tick that uses it); held ticks repeat the same "
    "decision on the same input and are not counted; only observations with a label are scored"
)
METRICS: Final = ("agreement", "balanced_accuracy", "accel_mae")
MODEL_PREDICTORS: Final = ("proposed", "applied")
PREDICTORS: Final = (*MODEL_PREDICTORS, *bl.BASELINES)
STATES: Final = ("nominal", "ood_veto", "stale_observation")
# The evaluation's target: the model's disagreement with the human at most this fraction of the best
# baseline's.
DISAGREEMENT_TARGET: Final = 0.75

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


class EvaluationUnavailable(ValueError):
    """The model's actions are not the label bands of executor/action_labels.py: no comparison."""


def _nan_to_none(x: float) -> float | None:
    return None if x is None or not np.isfinite(x) else float(x)


@dataclass
class Scores:
    """One predictor against the labels, as sums that pool by addition.

    confusion[i, j]: labelled ticks with label i on which the predictor chose action j.
    no_action[i]: labelled ticks with label i on which it chose nothing. For the model (a missing
    proposal) they count as wrong; for a baseline (n/a) they are left out of every score."""

    confusion: IntArray
    no_action: IntArray
    no_action_is_wrong: bool
    accel_abs_err: float = 0.0
    accel_ticks: int = 0

    @classmethod
    def empty(cls, n_actions: int, no_action_is_wrong: bool) -> Scores:
        return cls(np.zeros((n_actions, n_actions), np.int64), np.zeros(n_actions, np.int64), no_action_is_wrong)

    @classmethod
    def of(
        cls,
        n_actions: int,
        labels: npt.ArrayLike,
        predicted: npt.ArrayLike,
        label_accel: npt.ArrayLike,
        predicted_accel: npt.ArrayLike,
        no_action_is_wrong: bool,
    ) -> Scores:
        """Scores of `predicted` (action index per tick, -1 none) against `labels` (index, -1 none:
        the tick is not scored), with accelerations (NaN: that tick has no accel error)."""
        y = np.asarray(labels, np.int64)
        p = np.asarray(predicted, np.int64)
        ya = np.asarray(label_accel, np.float64)
        pa = np.asarray(predicted_accel, np.float64)
        if not (y.shape == p.shape == ya.shape == pa.shape and y.ndim == 1):
            raise ValueError(f"labels, predictions and accels must be 1-d and alike: {y.shape} {p.shape}")
        labelled = (y >= 0) & (y < n_actions)
        out = cls.empty(n_actions, no_action_is_wrong)
        chose = labelled & (p >= 0) & (p < n_actions)
        np.add.at(out.confusion, (y[chose], p[chose]), 1)
        np.add.at(out.no_action, y[labelled & ~chose], 1)
        # a baseline's n/a tick has no accel either; the model's missing proposal has no controls
        err = np.abs(pa - ya)[labelled & np.isfinite(pa) & np.isfinite(ya)]
        out.accel_abs_err = float(err.sum())
        out.accel_ticks = int(err.size)
        return out

    def __add__(self, other: Scores) -> Scores:
        if self.confusion.shape != other.confusion.shape or self.no_action_is_wrong != other.no_action_is_wrong:
            raise ValueError("cannot pool scores of different action sets or kinds")
        return Scores(
            self.confusion + other.confusion,
            self.no_action + other.no_action,
            self.no_action_is_wrong,
            self.accel_abs_err + other.accel_abs_err,
            self.accel_ticks + other.accel_ticks,
        )

    @property
    def per_label(self) -> IntArray:
        """Scored ticks per label class."""
        return self.confusion.sum(axis=1) + (self.no_action if self.no_action_is_wrong else 0)

    @property
    def ticks(self) -> int:
        return int(self.per_label.sum())

    @property
    def na_ticks(self) -> int:
        """Labelled ticks left out because the predictor was n/a (baselines only)."""
        return 0 if self.no_action_is_wrong else int(self.no_action.sum())

    @property
    def agreement(self) -> float:
        return float(np.trace(self.confusion) / self.ticks) if self.ticks else float("nan")

    @property
    def recall(self) -> FloatArray:
        """Per label class; NaN for a class absent from the scored labels."""
        n = self.per_label
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n > 0, np.diag(self.confusion) / np.maximum(n, 1), np.nan)

    @property
    def balanced_accuracy(self) -> float:
        r = self.recall
        return float(np.nanmean(r)) if np.isfinite(r).any() else float("nan")

    @property
    def accel_mae(self) -> float:
        return self.accel_abs_err / self.accel_ticks if self.accel_ticks else float("nan")

    def metric(self, name: str) -> float:
        return float(getattr(self, name))

    def as_dict(self) -> dict[str, Any]:
        return {
            "ticks": self.ticks,
            "na_ticks": self.na_ticks,
            "agreement": _nan_to_none(self.agreement),
            "balanced_accuracy": _nan_to_none(self.balanced_accuracy),
            "accel_mae": _nan_to_none(self.accel_mae),
            "recall": [_nan_to_none(r) for r in self.recall],
            "confusion": self.confusion.tolist(),
            "no_action": self.no_action.tolist(),
            "no_action_is_wrong": self.no_action_is_wrong,
            "accel_abs_err": self.accel_abs_err,
            "accel_ticks": self.accel_ticks,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Scores:
        """From `as_dict` (the sums; the rates are recomputed from them)."""
        return cls(
            np.array(d["confusion"], np.int64),
            np.array(d["no_action"], np.int64),
            bool(d["no_action_is_wrong"]),
            float(d["accel_abs_err"]),
            int(d["accel_ticks"]),
        )


@dataclass
class LogEvaluation:
    """The evaluation of one log (or of several pooled over their ticks)."""

    source: str
    model: str
    actions: list[str]
    observations: int = 0  # in the log
    ticked: int = 0  # observations some tick used: the evaluated ticks
    labelled: int = 0  # evaluated ticks with a label: the scored ticks
    scores: dict[str, Scores] = field(default_factory=dict)  # predictor -> scores (PREDICTORS)
    proposed_on: dict[str, Scores] = field(default_factory=dict)  # baseline -> the model's proposal on its ticks
    states: dict[str, int] = field(default_factory=dict)  # scored ticks per STATES
    all_ticks: int = 0  # every 5 ms tick of the replay
    all_states: dict[str, int] = field(default_factory=dict)  # every tick per STATES
    logs: int = 1  # how many logs this row pools

    def fraction(self, state: str, every_tick: bool = False) -> float:
        n, counts = (self.all_ticks, self.all_states) if every_tick else (self.labelled, self.states)
        return counts.get(state, 0) / n if n else float("nan")

    def best_baseline(self, metric: str) -> str | None:
        """The baseline with the best value of `metric` (highest agreement / balanced accuracy,
        lowest accel MAE), among those scored on at least one tick."""
        values = {b: self.scores[b].metric(metric) for b in bl.BASELINES if b in self.scores}
        values = {b: v for b, v in values.items() if np.isfinite(v)}
        if not values:
            return None
        pick = min if metric == "accel_mae" else max
        return pick(values, key=values.__getitem__)

    def disagreement_ratio(self, predictor: str = "proposed") -> tuple[float, str | None]:
        """(1 - model agreement) / (1 - best baseline agreement), both on the best baseline's ticks
        (the evaluation's target: at most DISAGREEMENT_TARGET); NaN when there is no baseline or it agrees
        on every tick."""
        best = self.best_baseline("agreement")
        if best is None:
            return float("nan"), None
        base = self.scores[best].agreement
        if predictor == "proposed":
            model = self.proposed_on[best].agreement
        elif self.scores[best].na_ticks == 0:  # applied has no per-baseline copy: same ticks only if full
            model = self.scores[predictor].agreement
        else:
            return float("nan"), best
        return ((1.0 - model) / (1.0 - base) if base < 1.0 else float("nan")), best

    def __add__(self, other: LogEvaluation) -> LogEvaluation:
        if self.actions != other.actions:
            raise ValueError(f"cannot pool logs with different actions: {self.actions} vs {other.actions}")
        return LogEvaluation(
            source="pooled",
            model=self.model if self.model == other.model else f"{self.model} + {other.model}",
            actions=self.actions,
            observations=self.observations + other.observations,
            ticked=self.ticked + other.ticked,
            labelled=self.labelled + other.labelled,
            scores={k: self.scores[k] + other.scores[k] for k in self.scores},
            proposed_on={k: self.proposed_on[k] + other.proposed_on[k] for k in self.proposed_on},
            states={k: self.states.get(k, 0) + other.states.get(k, 0) for k in STATES},
            all_ticks=self.all_ticks + other.all_ticks,
            all_states={k: self.all_states.get(k, 0) + other.all_states.get(k, 0) for k in STATES},
            logs=self.logs + other.logs,
        )

    def as_dict(self) -> dict[str, Any]:
        ratio, against = self.disagreement_ratio()
        applied_ratio, _ = self.disagreement_ratio("applied")
        return {
            "source": self.source,
            "model": self.model,
            "actions": list(self.actions),
            "logs": self.logs,
            "observations": self.observations,
            "ticked": self.ticked,
            "labelled": self.labelled,
            "scores": {k: s.as_dict() for k, s in self.scores.items()},
            "proposed_on": {k: s.as_dict() for k, s in self.proposed_on.items()},
            "states": dict(self.states),
            "state_fractions": {k: _nan_to_none(self.fraction(k)) for k in STATES},
            "all_ticks": self.all_ticks,
            "all_states": dict(self.all_states),
            "all_state_fractions": {k: _nan_to_none(self.fraction(k, every_tick=True)) for k in STATES},
            "best_baseline": {m: self.best_baseline(m) for m in METRICS},
            "disagreement_ratio": _nan_to_none(ratio),
            "disagreement_ratio_applied": _nan_to_none(applied_ratio),
            "disagreement_ratio_against": against,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LogEvaluation:
        return cls(
            source=d["source"],
            model=d["model"],
            actions=list(d["actions"]),
            observations=int(d["observations"]),
            ticked=int(d["ticked"]),
            labelled=int(d["labelled"]),
            scores={k: Scores.from_dict(v) for k, v in d["scores"].items()},
            proposed_on={k: Scores.from_dict(v) for k, v in d["proposed_on"].items()},
            states={k: int(v) for k, v in d["states"].items()},
            all_ticks=int(d["all_ticks"]),
            all_states={k: int(v) for k, v in d["all_states"].items()},
            logs=int(d.get("logs", 1)),
        )


def unmeasured_features(header: log_pb2.SessionHeader, feature_names: Sequence[str]) -> set[str]:
    """Features the log's sensors do not measure: outside a non-empty `measured_features`, or
    among `filled_features` (neutral values an older import filled in)."""
    out = set(header.filled_features)
    if header.measured_features:
        out |= set(feature_names) - set(header.measured_features)
    return out


@dataclass
class _Ticks:
    """What the evaluation reads of each tick: from Snapshots or from the fast path's TickTable."""

    seq: IntArray
    proposed: IntArray  # -1: none
    proposed_accel: FloatArray  # NaN: none
    applied: IntArray
    applied_accel: FloatArray
    nominal: npt.NDArray[np.bool_]
    ood_veto: npt.NDArray[np.bool_]
    stale: npt.NDArray[np.bool_]

    @classmethod
    def of_snapshots(cls, snaps: Sequence[Snapshot], k: int | None, n_ctl: int) -> _Ticks:
        from dualloop.executor.snapshot import Reason, SafetyState

        n = len(snaps)
        return cls(
            seq=np.fromiter((s.observation_seq for s in snaps), np.int64, n),
            proposed=np.fromiter((s.proposed_index for s in snaps), np.int64, n),
            proposed_accel=np.array([_accel_of(s.proposed_controls, k, n_ctl) for s in snaps], np.float64),
            applied=np.fromiter((s.applied.index for s in snaps), np.int64, n),
            applied_accel=np.array([_accel_of(s.applied.controls, k, n_ctl) for s in snaps], np.float64),
            nominal=np.fromiter((s.safety_state == SafetyState.NOMINAL for s in snaps), bool, n),
            ood_veto=np.fromiter((Reason.OOD_VETO in s.reasons for s in snaps), bool, n),
            stale=np.fromiter((Reason.STALE_OBSERVATION in s.reasons for s in snaps), bool, n),
        )

    @classmethod
    def of_table(cls, table: TickTable, k: int | None) -> _Ticks:
        from dualloop.executor.snapshot import Reason, SafetyState

        obs, n = table.observations, len(table)
        cols = as_columns(obs)
        scored = table.scored.astype(bool)
        nan = np.full(n, np.nan)
        # per distinct reason-set object: ticks share them, so they are told apart by identity in
        # numpy and each is looked into once (not a Python step per tick)
        veto, stale = int(Reason.OOD_VETO), int(Reason.STALE_OBSERVATION)
        objects = {id(rs): rs for rs in table.reasons}
        ids = np.fromiter(map(id, table.reasons), np.int64, n)
        distinct, inverse = np.unique(ids, return_inverse=True)
        codes = [tuple(map(int, objects[i])) for i in distinct.tolist()]
        flags = np.array([(veto in rs, stale in rs) for rs in codes], bool).reshape(-1, 2)[inverse.reshape(-1)]
        return cls(
            seq=(cols.seq if cols is not None else np.fromiter((o.seq for o in obs), np.int64, len(obs)))[
                table.obs_index
            ],
            proposed=np.where(scored, table.proposed, -1).astype(np.int64),
            proposed_accel=nan
            if k is None
            else np.where(scored, table.proposed_controls[:, k], np.nan).astype(np.float64),
            applied=table.applied.astype(np.int64),
            applied_accel=nan if k is None else table.applied_controls[:, k].astype(np.float64),
            nominal=table.safety_state == int(SafetyState.NOMINAL),
            ood_veto=flags[:, 0],
            stale=flags[:, 1],
        )

    def state_counts(self, rows: npt.NDArray[np.int64] | None = None) -> dict[str, int]:
        pick = (lambda a: a) if rows is None else (lambda a: a[rows])
        return {
            "nominal": int(np.count_nonzero(pick(self.nominal))),
            "ood_veto": int(np.count_nonzero(pick(self.ood_veto))),
            "stale_observation": int(np.count_nonzero(pick(self.stale))),
        }


def _accel_of(controls: np.ndarray | None, k: int | None, n: int) -> float:
    if k is None or controls is None or np.size(controls) != n:
        return float("nan")
    return float(controls[k])


def evaluate_replay(
    snaps: Sequence[Snapshot] | TickTable,
    observations: Sequence[Observation],
    card: ModelCard,
    source: str | Path = "",
    unmeasured: set[str] | frozenset[str] = frozenset(),
) -> LogEvaluation:
    """Score one LOCKSTEP session's snapshots (made from `observations`; or the fast path's
    TickTable, the same numbers without Snapshots) against the labels the observations carry,
    beside the baselines. Raises EvaluationUnavailable when the card's actions are not the label
    bands."""
    from dualloop.executor.lockstep_batch import TickTable

    actions = list(card.actions)
    if actions != list(ACTIONS):
        raise EvaluationUnavailable(
            f"the model's actions {actions} are not the label bands {list(ACTIONS)} (executor/action_labels.py)"
        )
    n_act, n_ctl = len(actions), len(card.controls)
    names = [c.name for c in card.controls]
    k = names.index("accel") if "accel" in names else None
    accel_range = (card.controls[k].min, card.controls[k].max) if k is not None else (-np.inf, np.inf)
    t = _Ticks.of_table(snaps, k) if isinstance(snaps, TickTable) else _Ticks.of_snapshots(snaps, k, n_ctl)

    seq = t.seq
    first = np.flatnonzero(np.concatenate([[True], seq[1:] != seq[:-1]])) if len(seq) else np.zeros(0, np.int64)
    cols = as_columns(observations)
    if cols is not None:  # the same columns, by row (seq strictly increases: run_lockstep checked it)
        rows = np.searchsorted(cols.seq, seq[first])
        labels = cols.actual_index[rows].copy()
        label_accel = np.full(len(rows), np.nan) if k is None else cols.actual_controls_or_nan(n_ctl)[rows, k]
        features = cols.features[rows].astype(np.float64)
    else:
        row_of = {o.seq: i for i, o in enumerate(observations)}
        obs = [observations[row_of[q]] for q in seq[first].tolist()]
        labels = np.fromiter((o.actual_index for o in obs), np.int64, len(obs))
        label_accel = np.array([_accel_of(o.actual_controls, k, n_ctl) for o in obs], np.float64)
        features = (
            np.stack([np.asarray(o.features, np.float64) for o in obs])
            if obs
            else np.zeros((0, len(card.features)), np.float64)
        )
    labels[(labels < 0) | (labels >= n_act)] = -1
    proposed = t.proposed[first]
    proposed_accel = t.proposed_accel[first]
    applied = t.applied[first]
    applied_accel = t.applied_accel[first]
    base_accel = bl.baseline_accels(features, card.feature_names, accel_range, unmeasured)
    base_action = bl.baseline_actions(base_accel)

    scores = {
        "proposed": Scores.of(n_act, labels, proposed, label_accel, proposed_accel, no_action_is_wrong=True),
        "applied": Scores.of(n_act, labels, applied, label_accel, applied_accel, no_action_is_wrong=True),
    }
    proposed_on = {}
    for name in bl.BASELINES:
        scores[name] = Scores.of(n_act, labels, base_action[name], label_accel, base_accel[name], False)
        on = np.where(base_action[name] >= 0, labels, -1)  # the model on exactly the baseline's ticks
        proposed_on[name] = Scores.of(n_act, on, proposed, label_accel, proposed_accel, no_action_is_wrong=True)
    scored_rows = first[labels >= 0]
    return LogEvaluation(
        source=str(source),
        model=f"{card.name} {card.version}",
        actions=actions,
        observations=len(observations),
        ticked=len(first),
        labelled=len(scored_rows),
        scores=scores,
        proposed_on=proposed_on,
        states=t.state_counts(scored_rows),
        all_ticks=len(seq),
        all_states=t.state_counts(),
    )


@dataclass
class EvaluationReport:
    """Per log, pooled over ticks, and the macro mean over logs."""

    logs: list[LogEvaluation]

    @property
    def pooled(self) -> LogEvaluation | None:
        if not self.logs:
            return None
        out = self.logs[0]
        for e in self.logs[1:]:
            out = out + e
        if len(self.logs) == 1:  # a copy named as the pooled row
            out = LogEvaluation.from_dict({**out.as_dict(), "source": "pooled"})
        return out

    def macro(self) -> dict[str, dict[str, float]]:
        """predictor -> metric -> mean of the per-log values over the logs where it is defined;
        plus "model" -> disagreement_ratio."""
        out: dict[str, dict[str, float]] = {}
        for p in PREDICTORS:
            out[p] = {m: _nanmean([e.scores[p].metric(m) for e in self.logs if p in e.scores]) for m in METRICS}
        out["model"] = {"disagreement_ratio": _nanmean([e.disagreement_ratio()[0] for e in self.logs])}
        return out

    def as_dict(self) -> dict[str, Any]:
        pooled = self.pooled
        return {
            "schema": SCHEMA,
            "ticks": TICKS_NOTE,
            "disagreement_target": DISAGREEMENT_TARGET,
            "time_gap_rule": {
                "accel": "K_GAP * (lead_distance - (STANDSTILL_GAP_M + TIME_GAP_S * ego_speed)) "
                "+ K_DV * lead_rel_speed, clipped to the accel control range; no lead: 0",
                "TIME_GAP_S": bl.TIME_GAP_S,
                "STANDSTILL_GAP_M": bl.STANDSTILL_GAP_M,
                "K_GAP": bl.K_GAP,
                "K_DV": bl.K_DV,
            },
            "logs": [e.as_dict() for e in self.logs],
            "pooled": pooled.as_dict() if pooled is not None else None,
            "macro": {p: {m: _nan_to_none(v) for m, v in ms.items()} for p, ms in self.macro().items()},
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EvaluationReport:
        if d.get("schema") != SCHEMA:
            raise ValueError(f"not an evaluation report of schema {SCHEMA!r}: {d.get('schema')!r}")
        return cls([LogEvaluation.from_dict(e) for e in d["logs"]])


def from_replay_reports(reports: Sequence[dict[str, Any]]) -> tuple[EvaluationReport, dict[str, str]]:
    """The evaluation of replays from their `ReplayReport.as_dict()`s; and the logs whose evaluation
    was skipped (source -> why)."""
    logs, skipped = [], {}
    for r in reports:
        ev = r.get("evaluation") or {"skipped": "the replay report has no evaluation"}
        if "skipped" in ev:
            skipped[str(r.get("source", ""))] = str(ev["skipped"])
        else:
            logs.append(LogEvaluation.from_dict(ev))
    return EvaluationReport(logs), skipped


def _nanmean(values: Sequence[float]) -> float:
    finite = [v for v in values if np.isfinite(v)]
    return float(np.mean(finite)) if finite else float("nan")


# --- the terminal table -------------------------------------------------------------------------

_LABELS: Final = {"proposed": "model (top-1)", "applied": "applied", **{b: f"baseline {b}" for b in bl.BASELINES}}


def _pct(x: float) -> str:
    return f"{100 * x:6.1f}%" if np.isfinite(x) else "    n/a"


def _mae(x: float) -> str:
    return f"{x:9.3f}" if np.isfinite(x) else "      n/a"


def _rows(name: str, e: LogEvaluation) -> list[str]:
    lines = []
    for i, p in enumerate(PREDICTORS):
        s = e.scores[p]
        na = f"  n/a on {s.na_ticks}" if s.na_ticks else ""
        lines.append(
            f"{(name if i == 0 else ''):32.32s} {_LABELS[p]:19s} {s.ticks:7d} {_pct(s.agreement)} "
            f"{_pct(s.balanced_accuracy)} {_mae(s.accel_mae)}{na}"
        )
    best = {m: e.best_baseline(m) or "-" for m in METRICS}
    ratio, against = e.disagreement_ratio()
    verdict = "" if not np.isfinite(ratio) else (" (meets" if ratio <= DISAGREEMENT_TARGET else " (misses")
    states = ", ".join(
        f"{k.upper()} {_pct(e.fraction(k)).strip()} ({e.states.get(k, 0)})"
        for k in ("nominal", "ood_veto", "stale_observation")
    )
    lines.append(f"{'':32s} {states} of the scored ticks")
    lines.append(
        f"{'':32s} best baseline: agreement {best['agreement']}, balanced {best['balanced_accuracy']}, "
        f"MAE {best['accel_mae']}; disagreement ratio "
        + (f"{ratio:.3f} vs {against}{verdict} the target {DISAGREEMENT_TARGET})" if np.isfinite(ratio) else "n/a")
    )
    return lines


def format_evaluation(report: EvaluationReport) -> str:
    if not report.logs:
        return "evaluation: no logs"
    header = f"{'log':32s} {'predictor':19s} {'ticks':>7s} {'agree':>7s} {'bal.acc':>7s} {'MAE m/s2':>9s}"
    lines = [
        "evaluation against the human's labels (look-ahead bands, executor/action_labels.py)",
        f"  ticks: {TICKS_NOTE}",
        header,
        "-" * len(header),
    ]
    stems = [Path(e.source).stem for e in report.logs]
    for e, stem in zip(report.logs, stems):
        name = stem if stems.count(stem) == 1 else e.source
        lines += _rows(name, e)
        lines.append(
            f"{'':32s} {e.ticked} of {e.observations} observations ticked, {e.labelled} labelled; "
            f"{e.all_ticks} ticks in all"
        )
    pooled = report.pooled
    assert pooled is not None  # report.logs is not empty
    lines.append("-" * len(header))
    n = len(report.logs)
    lines += _rows(f"pooled over ticks ({n} log{'s' if n > 1 else ''})", pooled)
    macro = report.macro()
    for i, p in enumerate(PREDICTORS):
        m = macro[p]
        lines.append(
            f"{('macro mean over logs' if i == 0 else ''):32s} {_LABELS[p]:19s} {'':7s} {_pct(m['agreement'])} "
            f"{_pct(m['balanced_accuracy'])} {_mae(m['accel_mae'])}"
        )
    r = macro["model"]["disagreement_ratio"]
    lines.append(f"{'':32s} disagreement ratio {r:.3f}" if np.isfinite(r) else f"{'':32s} disagreement ratio n/a")
    for p in MODEL_PREDICTORS:
        lines.append(f"pooled confusion, label \\ {p}:")
        lines.append("  " + format_confusion_table(pooled.actions, pooled.scores[p]).replace("\n", "\n  "))
    return "\n".join(lines)


def format_confusion_table(actions: Sequence[str], s: Scores) -> str:
    width = max(10, *(len(a) + 2 for a in actions))
    cols = [*actions, "none"]
    lines = ["label".ljust(width) + "".join(c.rjust(width) for c in cols)]
    for name, row, none in zip(actions, s.confusion, s.no_action):
        lines.append(name.ljust(width) + "".join(str(v).rjust(width) for v in [*row, none]))
    return "\n".join(lines)


# --- the plot -----------------------------------------------------------------------------------


def plot_evaluation(report: EvaluationReport, path: str | Path) -> Path:
    """The pooled confusion matrices (proposed, applied; rows normalised, counts printed) and each
    log's agreement beside the baselines' (and the pooled one)."""
    pooled = report.pooled
    if pooled is None:
        raise ValueError("nothing to plot: no logs")
    plt = pyplot()
    fig = plt.figure(figsize=(15, 4.8), layout="constrained")
    grid = fig.add_gridspec(1, 3, width_ratios=[1, 1, 1.6])
    cols = [*pooled.actions, "none"]
    for i, p in enumerate(MODEL_PREDICTORS):
        ax = fig.add_subplot(grid[0, i])
        s = pooled.scores[p]
        counts = np.column_stack([s.confusion, s.no_action])
        rows = np.maximum(counts.sum(axis=1, keepdims=True), 1)
        ax.imshow(counts / rows, vmin=0.0, vmax=1.0, cmap="Blues")
        for (r, c), v in np.ndenumerate(counts):
            ax.text(c, r, str(v), ha="center", va="center", fontsize=8, color="black" if v / rows[r, 0] < 0.6 else "w")
        ax.set_xticks(range(len(cols)), cols, rotation=30)
        ax.set_yticks(range(len(pooled.actions)), pooled.actions)
        ax.set_xlabel(f"{_LABELS[p]} action")
        ax.set_ylabel("label (human)")
        ax.set_title(f"{_LABELS[p]}: {_pct(s.agreement).strip()} agree, {s.ticks} ticks")
    ax = fig.add_subplot(grid[0, 2])
    rows_eval = [*report.logs, pooled] if len(report.logs) > 1 else report.logs
    names = [Path(e.source).stem for e in report.logs] + (["pooled"] if len(report.logs) > 1 else [])
    width = 0.8 / len(PREDICTORS)
    x = np.arange(len(rows_eval))
    for j, p in enumerate(PREDICTORS):
        values = [e.scores[p].agreement for e in rows_eval]
        ax.bar(x + (j - (len(PREDICTORS) - 1) / 2) * width, np.nan_to_num(values), width, label=_LABELS[p])
    ax.set_xticks(x, names, rotation=20, ha="right")
    ax.set_ylim(0, 1.2)
    ax.set_yticks(np.linspace(0, 1, 6))
    ax.set_ylabel("agreement with the label")
    ax.set_title("agreement per log: model vs baselines")
    ax.legend(fontsize=8, loc="upper center", ncol=3)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
