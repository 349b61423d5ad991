"""The plots of a qualification that no other command draws: the migration matrix, the reliability
diagrams (nominal vs stressed, candidate vs baseline), confidence and accuracy per stress scenario,
and the gate's AUROC per OOD scenario. The replay's and the gate's own plots come from
controller/replay/evaluation.py and controller/gates/plots.py."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dualloop.controller.plotting import pyplot
from dualloop.controller.qualify.stress import Calibration, StressResult
from dualloop.controller.replay.evaluation import EvaluationReport


def _save(fig: object, path: Path) -> Path:
    plt = pyplot()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)  # type: ignore[attr-defined]
    plt.close(fig)
    return path


def plot_migration(actions: Sequence[str], matrix: np.ndarray, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4.6), layout="constrained")
    m = np.asarray(matrix, np.float64)
    rows = np.maximum(m.sum(axis=1, keepdims=True), 1)
    ax.imshow(m / rows, vmin=0, vmax=1, cmap="Blues")
    for (r, c), v in np.ndenumerate(m.astype(np.int64)):
        ax.text(c, r, str(v), ha="center", va="center", fontsize=8, color="w" if v / rows[r, 0] > 0.6 else "black")
    ax.set_xticks(range(len(actions)), actions, rotation=30)
    ax.set_yticks(range(len(actions)), actions)
    ax.set_xlabel("candidate (applied)")
    ax.set_ylabel("baseline (applied)")
    moved = int(m.sum() - np.trace(m))
    ax.set_title(f"migration: {moved} of {int(m.sum())} ticks moved")
    return _save(fig, path)


def _reliability(ax: object, cal: Calibration, label: str, color: str, style: str) -> None:
    conf = [c for c in cal.bin_confidence]
    acc = [a for a in cal.bin_accuracy]
    pts = [(c, a) for c, a in zip(conf, acc) if c is not None and a is not None]
    if pts:
        xs, ys = zip(*pts)
        ax.plot(xs, ys, style, color=color, label=f"{label}: ECE {cal.ece:.3f}, acc {cal.accuracy:.2f}")  # type: ignore[attr-defined]


def plot_reliability(cand: StressResult, base: StressResult, path: Path) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), layout="constrained", sharey=True)
    for ax, which in zip(axes, ("nominal", "stressed")):
        ax.plot([0, 1], [0, 1], ":", color="grey", lw=1)
        _reliability(ax, getattr(cand, which), "candidate", "#e63946", "o-")
        _reliability(ax, getattr(base, which), "baseline", "#1d3557", "s--")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("confidence (top-1 probability)")
        ax.set_title(f"reliability, {which} ticks")
        ax.legend(fontsize=8, loc="upper left")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("accuracy vs the expert")
    return _save(fig, path)


def plot_stress_confidence(cand: StressResult, base: StressResult, path: Path) -> Path:
    """Accuracy and mean confidence on nominal and on each stress scenario, both models."""
    plt = pyplot()
    names = ["nominal", *cand.per_scenario]
    fig, ax = plt.subplots(figsize=(11, 4.2), layout="constrained")
    x = np.arange(len(names))
    for j, (res, tag) in enumerate(((cand, "candidate"), (base, "baseline"))):
        cals = [res.nominal, *(res.per_scenario.get(n) for n in names[1:])]
        acc = [np.nan if c is None else c.accuracy for c in cals]
        conf = [np.nan if c is None else c.confidence for c in cals]
        off = (j - 0.5) * 0.4
        ax.bar(x + off - 0.1, np.nan_to_num(acc), 0.2, label=f"{tag} accuracy", color=("#e63946", "#1d3557")[j])
        ax.bar(x + off + 0.1, np.nan_to_num(conf), 0.2, label=f"{tag} confidence", color=("#f4a261", "#a8dadc")[j])
    ax.set_xticks(x, names, rotation=20, ha="right")
    ax.set_ylim(0, 1.15)
    ax.set_ylabel("share / probability")
    ax.set_title("accuracy vs the expert and mean confidence: confidence should fall where accuracy does")
    ax.legend(fontsize=8, ncol=4, loc="upper center")
    return _save(fig, path)


def plot_gate_detection(cand: StressResult, base: StressResult, path: Path) -> Path:
    plt = pyplot()
    names = list(cand.gate)
    fig, ax = plt.subplots(figsize=(9, 3.8), layout="constrained")
    x = np.arange(len(names))
    for j, (res, tag) in enumerate(((cand, "candidate"), (base, "baseline"))):
        v = [res.gate.get(n, {}).get("auroc_judged", np.nan) for n in names]
        ax.bar(x + (j - 0.5) * 0.4, np.nan_to_num(v), 0.4, label=tag, color=("#e63946", "#1d3557")[j])
    ax.set_xticks(x, names, rotation=20, ha="right")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("gate AUROC (where observable)")
    ax.set_title("the gate's detection per OOD scenario")
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_per_log(cand: EvaluationReport, base: EvaluationReport, path: Path) -> Path:
    """Each log's agreement with the human: candidate against baseline (one dot per log; below the
    diagonal: the candidate is worse on that log), and the best trivial baseline's beside it."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.2, 5.4), layout="constrained")
    by_source = {e.source: e for e in base.logs}
    pairs = [(by_source[e.source], e) for e in cand.logs if e.source in by_source]
    x = np.array([b.scores["proposed"].agreement for b, _ in pairs])
    y = np.array([c.scores["proposed"].agreement for _, c in pairs])
    best = []
    for b, _ in pairs:
        name = b.best_baseline("agreement")
        best.append(b.scores[name].agreement if name else np.nan)
    ax.plot([0, 1], [0, 1], ":", color="grey", lw=1)
    ax.scatter(x, best, s=14, marker="x", color="#999999", label="best trivial baseline (y) on the log")
    ax.scatter(x, y, s=18, color="#e63946", label="candidate (y)")
    lo = float(np.nanmin([*x, *y, *best, 1.0])) if len(x) else 0.0
    ax.set_xlim(max(0.0, lo - 0.05), 1.0)
    ax.set_ylim(max(0.0, lo - 0.05), 1.0)
    ax.set_xlabel("baseline model's agreement with the human")
    ax.set_ylabel("agreement with the human")
    worse = int(np.sum(y < x - 1e-12))
    ax.set_title(f"per log ({len(pairs)} logs): candidate below the baseline on {worse}")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    return _save(fig, path)
