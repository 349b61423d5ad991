"""Step (a) of `dualloop qualify`: both models replayed on the same recorded drives.

The replay, the evaluation against the human's labels and the trivial baselines (per log, pooled,
macro), and the migration matrix are the ones `dualloop replay` and `dualloop diff` print
(controller/replay/); this module only runs them for two models and turns them into checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dualloop.controller.logs.logfile import LogFileError
from dualloop.controller.qualify.checks import Check, at_most, no_worse
from dualloop.controller.qualify.criteria import ReplayCriteria
from dualloop.controller.replay.diff import FIELDS, diff_logs
from dualloop.controller.replay.evaluation import EvaluationReport, from_replay_reports
from dualloop.controller.replay.fleet import replay_many

STEP = "replay"


@dataclass
class ModelRun:
    """One model as qualify runs it: the file and the gate files beside it."""

    path: Path
    gates: tuple[Path, ...]


@dataclass
class ReplayStep:
    candidate: EvaluationReport
    baseline: EvaluationReport
    actions: list[str]
    migration: np.ndarray  # baseline applied action (rows) x candidate applied action (cols), ticks
    changed: dict[str, int] = field(default_factory=dict)  # diff field -> ticks that changed
    ticks: int = 0  # aligned ticks of the diff
    skipped: dict[str, str] = field(default_factory=dict)  # log -> why it was not evaluated

    @property
    def migration_share(self) -> float:
        moved = int(self.migration.sum() - np.trace(self.migration))
        return moved / self.ticks if self.ticks else float("nan")

    def checks(self, c: ReplayCriteria) -> list[Check]:
        cand, base = self.candidate.pooled, self.baseline.pooled
        if cand is None or base is None:
            return [Check(STEP, "logs evaluated", 0.0, None, None, False, "no log could be evaluated")]
        out = [
            no_worse(
                STEP,
                "pooled agreement (model top-1 vs human)",
                cand.scores["proposed"].agreement,
                base.scores["proposed"].agreement,
                c.agreement_drop,
                higher_is_better=True,
            ),
            no_worse(
                STEP,
                "pooled balanced accuracy",
                cand.scores["proposed"].balanced_accuracy,
                base.scores["proposed"].balanced_accuracy,
                c.balanced_accuracy_drop,
                higher_is_better=True,
            ),
            no_worse(
                STEP,
                "pooled accel MAE (m/s^2)",
                cand.scores["proposed"].accel_mae,
                base.scores["proposed"].accel_mae,
                c.accel_mae_rise,
                higher_is_better=False,
            ),
        ]
        if c.max_disagreement_ratio is not None:
            out.append(
                at_most(
                    STEP,
                    "pooled disagreement ratio vs best trivial baseline",
                    cand.disagreement_ratio()[0],
                    c.max_disagreement_ratio,
                )
            )
        if c.max_migration is not None:
            out.append(
                at_most(STEP, "share of ticks whose applied action moved", self.migration_share, c.max_migration)
            )
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "candidate": self.candidate.as_dict(),
            "baseline": self.baseline.as_dict(),
            "migration": {
                "actions": self.actions,
                "rows": "baseline applied action",
                "cols": "candidate applied action",
                "matrix": self.migration.tolist(),
                "ticks": self.ticks,
                "changed": dict(self.changed),
                "share_moved": None if not np.isfinite(self.migration_share) else self.migration_share,
            },
            "skipped": dict(self.skipped),
        }


def _evaluate(
    paths: Sequence[Path], model: ModelRun, out_dir: Path, workers: int | None
) -> tuple[EvaluationReport, dict[str, str]]:
    fleet = replay_many(paths, model.path, model.gates, workers=workers, out_dir=out_dir, progress=False)
    if fleet.errors:
        path, why = next(iter(fleet.errors.items()))
        # a log neither model can read is the user's input to fix (exit 2), not a verdict
        raise LogFileError(f"{path}: cannot be replayed with {model.path}: {why}")
    evaluation, skipped = from_replay_reports([fleet.reports[str(p)] for p in paths])
    return evaluation, skipped


def run_replay_step(
    logs: Sequence[Path], candidate: ModelRun, baseline: ModelRun, work_dir: Path, workers: int | None = None
) -> ReplayStep:
    """Replay every log with both models (written under work_dir), evaluate both against the labels
    and the trivial baselines, and diff the two replays of each log for the migration matrix."""
    paths = [Path(p) for p in logs]
    stems = [p.stem for p in paths]
    if len(set(stems)) != len(stems):
        dup = sorted({s for s in stems if stems.count(s) > 1})
        raise LogFileError(f"--logs: give logs with distinct file names (the replays are named by them): {dup}")
    cand_dir, base_dir = work_dir / "candidate", work_dir / "baseline"
    cand_eval, skipped = _evaluate(paths, candidate, cand_dir, workers)
    base_eval, base_skipped = _evaluate(paths, baseline, base_dir, workers)
    skipped |= base_skipped
    actions = list(cand_eval.logs[0].actions) if cand_eval.logs else []
    step = ReplayStep(cand_eval, base_eval, actions, np.zeros((len(actions), len(actions)), np.int64), skipped=skipped)
    step.changed = {f: 0 for f in FIELDS}
    for p in paths:
        name = f"{p.stem}.replayed.mcap"
        d = diff_logs(base_dir / name, cand_dir / name, actions=actions or None)
        if d.decisions.shape == step.migration.shape:
            step.migration += d.decisions
        step.ticks += d.ticks
        for f, n in d.changed.items():
            step.changed[f] += n
    return step
