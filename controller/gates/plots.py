"""Plots of a gate evaluation: scores over time, score histograms, a 2-D view of decision vectors."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dualloop.controller.gates.scores import ScenarioScores, fault_active
from dualloop.controller.plotting import pyplot
from dualloop.sim.scenarios import NOMINAL_SCENARIOS, OOD_SCENARIOS
from dualloop.sim.schema import ACTIONS


def _finite(x: np.ndarray, cap: float) -> np.ndarray:
    return np.minimum(np.nan_to_num(x, nan=cap, posinf=cap), cap)


def plot_scores_over_time(scores: dict[str, ScenarioScores], threshold: float, path: Path) -> Path:
    plt = pyplot()
    names = list(OOD_SCENARIOS)
    cols = 2
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(11, 2.6 * rows), squeeze=False)
    cap = threshold * 1e3
    for ax, name in zip(axes.ravel(), names):
        s = scores[name]
        ax.plot(s.t, _finite(s.score[0], cap), lw=0.7, color="#1d3557")
        ax.axhline(threshold, color="#e63946", lw=1, label="threshold")
        veto = s.alarm[0]
        on = np.concatenate([[0], veto.astype(np.int8), [0]])
        for a, b in zip(np.flatnonzero(np.diff(on) == 1), np.flatnonzero(np.diff(on) == -1)):
            ax.axvspan(s.t[a], s.t[min(int(b), len(s.t) - 1)], color="#f4a261", alpha=0.35, lw=0)
        if s.onset_tick[0] < len(s.t):
            ax.axvline(s.t[s.onset_tick[0]], color="black", ls="--", lw=1)
        ax.set_yscale("log")
        ax.set_title(f"{name} (dashed: onset, shaded: vetoed)", fontsize=9)
        ax.grid(alpha=0.3)
    for ax in axes.ravel()[len(names) :]:
        ax.axis("off")
    fig.supxlabel("time (s)")
    fig.supylabel("Mahalanobis score" if threshold != 1.0 else "score / threshold (largest over gates)")
    fig.tight_layout()
    fig.savefig(path, dpi=95)
    plt.close(fig)
    return path


def plot_histograms(scores: dict[str, ScenarioScores], threshold: float, path: Path) -> Path:
    plt = pyplot()
    cap = threshold * 1e3
    nominal = np.concatenate([scores[n].score[scores[n].valid] for n in NOMINAL_SCENARIOS])
    bins = np.logspace(np.log10(max(_finite(nominal, cap).min(), 1e-3)), np.log10(cap), 80)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    ax.hist(_finite(nominal, cap), bins=bins, density=True, alpha=0.5, color="grey", label="nominal")
    for name in OOD_SCENARIOS:
        s = scores[name]
        after = fault_active(s)
        ax.hist(_finite(s.score[after], cap), bins=bins, density=True, histtype="step", lw=1.3, label=name)
    ax.axvline(threshold, color="#e63946", lw=1.2, label="threshold")
    ax.set_xscale("log")
    ax.set_xlabel("Mahalanobis score (non-finite inputs shown at the right edge)")
    ax.set_ylabel("density")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=95)
    plt.close(fig)
    return path


def plot_projection(scores: dict[str, ScenarioScores], path: Path, per_scenario: int = 600, seed: int = 0) -> Path:
    """PCA of decision vectors fitted on nominal ticks: where do the OOD ticks fall?"""
    plt = pyplot()
    rng = np.random.default_rng(seed)

    def sample(s: ScenarioScores, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        idx = np.argwhere(mask & np.isfinite(s.decision).all(axis=2))
        idx = idx[rng.choice(len(idx), min(per_scenario, len(idx)), replace=False)] if len(idx) else idx
        return s.decision[idx[:, 0], idx[:, 1]], s.action[idx[:, 0], idx[:, 1]], s.alarm[idx[:, 0], idx[:, 1]]

    nominal = [sample(scores[n], scores[n].valid) for n in NOMINAL_SCENARIOS]
    x_nom = np.concatenate([n[0] for n in nominal])
    mean = x_nom.mean(axis=0)
    _, _, vt = np.linalg.svd(x_nom - mean, full_matrices=False)
    project = lambda x: (x - mean) @ vt[:2].T  # noqa: E731
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5))
    p_nom = project(x_nom)
    actions = np.concatenate([n[1] for n in nominal])
    for a, name in enumerate(ACTIONS):
        sel = actions == a
        left.scatter(p_nom[sel, 0], p_nom[sel, 1], s=4, alpha=0.5, label=name)
    left.set_title("nominal decision vectors by the model's action", fontsize=9)
    left.legend(fontsize=8, markerscale=3)
    right.scatter(p_nom[:, 0], p_nom[:, 1], s=3, color="lightgrey", label="nominal")
    vetoed_nom = np.concatenate([n[2] for n in nominal])
    right.scatter(p_nom[vetoed_nom, 0], p_nom[vetoed_nom, 1], s=12, color="black", marker="x", label="nominal, vetoed")
    for name in OOD_SCENARIOS:
        s = scores[name]
        x, _, alarm = sample(s, fault_active(s))
        if len(x):
            p = project(x)
            right.scatter(p[:, 0], p[:, 1], s=5, alpha=0.6, label=f"{name} ({alarm.mean() * 100:.0f}% vetoed)")
    right.set_title("OOD ticks after onset against nominal (PCA fitted on nominal)", fontsize=9)
    right.legend(fontsize=7, markerscale=3)
    for ax in (left, right):
        ax.set_xlabel("PC 1")
        ax.set_ylabel("PC 2")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=95)
    plt.close(fig)
    return path


def plot_evaluation(scores: dict[str, ScenarioScores], threshold: float, out_dir: Path) -> list[Path]:
    """threshold: the gate's, or 1.0 when the scores are score/threshold ratios of several gates."""
    return [
        plot_scores_over_time(scores, threshold, out_dir / "gate_scores_over_time.png"),
        plot_histograms(scores, threshold, out_dir / "gate_score_histograms.png"),
        plot_projection(scores, out_dir / "gate_projection.png"),
    ]
