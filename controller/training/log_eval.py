"""A model's proposals on recorded drives against the human's look-ahead labels, beside the trivial
baselines, per dataset: the quick offline form of `dualloop replay`'s evaluation, for training.

One row per labelled observation (the replay also takes one tick per observation). The model sees
what the executor feeds it: the features normalised with the log's sensor profile as the mask and
the card's default plan (recorded drives have no plan: executor.default_plan). A row with NaN in a
measured feature is one the executor refuses (INVALID_INPUT): a disagreement. A baseline that needs
an unmeasured feature is n/a on that row and scored on its other rows, the model beside it on the
same rows.

The baselines are the replay's (controller.replay.baselines: keep, the band of the measured
ego_accel, a constant time-gap law), on the same rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from dualloop.controller.replay import baselines as bl
from dualloop.controller.replay import evaluation
from dualloop.controller.training.recorded import LogRows
from dualloop.executor.default_plan import DefaultPlan
from dualloop.executor.model_card import Normalisation
from dualloop.executor.model_runner import DecisionModel, ModelOutputs
from dualloop.sim import schema

BASELINES = bl.BASELINES
DISAGREEMENT_TARGET = evaluation.DISAGREEMENT_TARGET  # at most this fraction of the best baseline's
# the disagreement ratio's interval resamples blocks of this many seconds of each drive: neighbouring
# observations of one drive are not independent draws, and a block this long holds most of a manoeuvre
RATIO_BLOCK_S = 10.0
RATIO_DRAWS = 2000

IntArray = npt.NDArray[np.int64]


def baseline_actions(rows: LogRows) -> dict[str, IntArray]:
    """Each baseline's action per row, -1 where a feature it needs is not measured."""
    measured = np.where(rows.present, rows.features, np.nan)
    accels = bl.baseline_accels(measured, schema.FEATURE_NAMES, (schema.ACCEL_MIN, schema.ACCEL_MAX))
    return bl.baseline_actions(accels)


def model_actions(
    model: DecisionModel | Path, rows: LogRows, batch: int = 4096, on: npt.NDArray[np.bool_] | None = None
) -> IntArray:
    """The model's top-1 proposal per row, -1 where the executor would refuse the input. A model
    with history features gets them from each row's session as the executor derives them; `on`
    (rows,) bool: score only these (-1 elsewhere), the history still from whole sessions."""
    out = np.full(len(rows), -1, np.int64)
    for sl, output, finite in forward_log_rows(model, rows, batch, on):
        out[sl] = np.where(finite, output.logits.argmax(axis=1), -1)
    if on is not None:
        out[~on] = -1
    return out


def decision_vectors(model: DecisionModel | Path, rows: LogRows, on: npt.NDArray[np.bool_]) -> npt.NDArray[np.float32]:
    """The model's decision vectors of the rows `on` (each a row the executor would score), as the
    executor computes them for the session: (on.sum(), dim)."""
    parts = []
    for sl, output, _ in forward_log_rows(model, rows, on=on):
        parts.append(output.decision_vector[on[sl]])
    return np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)


def forward_log_rows(
    model: DecisionModel | Path, rows: LogRows, batch: int = 4096, on: npt.NDArray[np.bool_] | None = None
) -> Iterator[tuple[slice, ModelOutputs, npt.NDArray[np.bool_]]]:
    """The model's forward pass over the rows in batches, each as the executor feeds it (normalised with
    the row's sensor profile as the mask, the card's default plan, history features from the row's whole
    session): (the batch's slice, the outputs, which rows were finite); batches with no row `on` skipped."""
    model = model if isinstance(model, DecisionModel) else DecisionModel(model, warmup_batches=())
    norm = Normalisation.of(model.card)
    default_plan = DefaultPlan.of(model.card)
    history = None if model.history is None else rows.history(model.history)
    for start in range(0, len(rows), batch):
        sl = slice(start, start + batch)
        if on is not None and not on[sl].any():
            continue
        present = rows.present[sl]
        x = rows.features[sl].astype(np.float32)
        if history is not None:
            x = np.concatenate([x, history[sl]], axis=1)
            present = np.concatenate([present, model.history.present(present)], axis=1)  # type: ignore[union-attr]
        plan = default_plan.rows(rows.features[sl], rows.present[sl])
        xn, pn, finite = norm.apply(x, plan, present=present)
        yield sl, model.forward(xn, pn, present), finite


@dataclass(frozen=True)
class Score:
    rows: int
    agreement: float
    balanced_accuracy: float


def score(pred: IntArray, label: IntArray) -> Score:
    """On the given rows (all labelled): agreement and mean per-class recall over the label classes
    present; a prediction of -1 is wrong."""
    if len(label) == 0:
        return Score(0, float("nan"), float("nan"))
    recalls = [float((pred[label == c] == c).mean()) for c in np.unique(label)]
    return Score(len(label), float((pred == label).mean()), float(np.mean(recalls)))


def ratio_interval(
    model_wrong: npt.NDArray[np.bool_], baseline_wrong: npt.NDArray[np.bool_], blocks: IntArray, level: float = 0.95
) -> tuple[float, float]:
    """A block-bootstrap interval of the disagreement ratio (the model's errors over the baseline's) on
    these rows, `blocks` (rows,) naming each row's block (RATIO_BLOCK_S of one drive): whole blocks are
    drawn with replacement, RATIO_DRAWS times, seeded. (NaN, NaN) without rows."""
    if len(blocks) == 0:
        return (float("nan"), float("nan"))
    _, block = np.unique(blocks, return_inverse=True)
    model_errors = np.bincount(block, model_wrong.astype(np.float64))
    baseline_errors = np.bincount(block, baseline_wrong.astype(np.float64))
    draws = np.random.default_rng(0).integers(0, len(model_errors), (RATIO_DRAWS, len(model_errors)))
    ratios = model_errors[draws].sum(axis=1) / np.maximum(baseline_errors[draws].sum(axis=1), 1e-12)
    tail = 100.0 * (1.0 - level) / 2.0
    low, high = np.percentile(ratios, [tail, 100.0 - tail])
    return (float(low), float(high))


def ratio_text(ratio: float, interval: tuple[float, float]) -> str:
    """A disagreement ratio with its interval where known: "0.88x [0.70-1.07]"."""
    low, high = interval
    return f"{ratio:.2f}x" + ("" if low != low else f" [{low:.2f}-{high:.2f}]")


@dataclass(frozen=True)
class DatasetReport:
    dataset: str
    sessions: int
    model: Score
    baselines: dict[str, Score]  # each on its own rows (where it is not n/a)
    model_on: dict[str, Score]  # the model on each baseline's rows
    # per baseline: the 95% block-bootstrap interval of the model's disagreement over it (`ratio_interval`)
    intervals: dict[str, tuple[float, float]]

    @property
    def best_baseline(self) -> str:
        return max(self.baselines, key=lambda b: self.baselines[b].agreement if self.baselines[b].rows else -1.0)

    @property
    def disagreement_ratio(self) -> float:
        """Model's disagreement over the best baseline's, on the best baseline's rows."""
        b = self.best_baseline
        return (1.0 - self.model_on[b].agreement) / max(1.0 - self.baselines[b].agreement, 1e-12)

    @property
    def disagreement_interval(self) -> tuple[float, float]:
        """The 95% interval of `disagreement_ratio` (whole blocks of each drive resampled)."""
        return self.intervals[self.best_baseline]

    @property
    def meets_targets(self) -> bool:
        beats_balanced = all(
            self.model_on[b].balanced_accuracy > s.balanced_accuracy for b, s in self.baselines.items() if s.rows
        )
        return self.disagreement_ratio <= DISAGREEMENT_TARGET and beats_balanced


def evaluate(
    model: DecisionModel | Path, rows: LogRows, on: npt.NDArray[np.bool_] | None = None
) -> list[DatasetReport]:
    """Per dataset of the rows, then all of them pooled ("all"); `on`: only these rows (the
    history features still from whole sessions)."""
    pred = model_actions(model, rows, on=on)
    base = baseline_actions(rows)
    labelled = rows.label >= 0
    if on is not None:
        labelled = labelled & on
    dataset = rows.dataset
    blocks = rows.session * (1 << 32) + (rows.t_s // RATIO_BLOCK_S).astype(np.int64)
    reports = []
    for name in [*sorted(set(rows.datasets)), "all"]:
        on = labelled & ((dataset == name) if name != "all" else True)
        if not on.any():
            continue
        sessions = len(set(rows.session[on].tolist()))
        baselines, model_on, intervals = {}, {}, {}
        for b, act in base.items():
            rows_b = on & (act >= 0)
            label = rows.label[rows_b]
            baselines[b] = score(act[rows_b], label)
            model_on[b] = score(pred[rows_b], label)
            intervals[b] = ratio_interval(pred[rows_b] != label, act[rows_b] != label, blocks[rows_b])
        overall = score(pred[on], rows.label[on])
        reports.append(DatasetReport(name, sessions, overall, baselines, model_on, intervals))
    return reports


def report_metrics(reports: list[DatasetReport], prefix: str) -> dict[str, float | str]:
    """Flat card metrics: <prefix>_<dataset>_{agreement, balanced_accuracy, best_baseline, ...}."""
    out: dict[str, float | str] = {}
    for r in reports:
        key = f"{prefix}_{r.dataset}"
        b = r.best_baseline
        out |= {
            f"{key}_rows": float(r.model.rows),
            f"{key}_agreement": r.model.agreement,
            f"{key}_balanced_accuracy": r.model.balanced_accuracy,
            f"{key}_best_baseline": b,
            f"{key}_best_baseline_agreement": r.baselines[b].agreement,
            f"{key}_disagreement_ratio": r.disagreement_ratio,
            f"{key}_best_baseline_balanced_accuracy": max(s.balanced_accuracy for s in r.baselines.values() if s.rows),
        }
    return out
