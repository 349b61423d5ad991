"""Plots and a Markdown report for closed-loop runs (matplotlib, headless)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dualloop.controller.demo.closed_loop import ClosedLoopRun
from dualloop.controller.plotting import pyplot
from dualloop.sim.schema import ACTIONS
from dualloop.v2 import controller_pb2 as pb

_STATE_COLOURS = {
    pb.SAFETY_STATE_VETO_HOLD: "#f4a261",
    pb.SAFETY_STATE_FALLBACK_ACTIVE: "#e63946",
    pb.SAFETY_STATE_RECOVERING: "#a8dadc",
}


def _shade_states(ax, t: np.ndarray, state: np.ndarray) -> None:
    """Shade the periods the executor was not NOMINAL, one colour per state."""
    for value, colour in _STATE_COLOURS.items():
        on = np.concatenate([[False], state == value, [False]]).astype(np.int8)
        starts, ends = np.flatnonzero(np.diff(on) == 1), np.flatnonzero(np.diff(on) == -1)
        for a, b in zip(starts, ends):
            ax.axvspan(t[a], t[min(int(b), len(t) - 1)], color=colour, alpha=0.3, lw=0)


def plot_run(run: ClosedLoopRun, out_dir: Path) -> Path:
    plt = pyplot()
    s = run.metrics.series
    fig, axes = plt.subplots(3, 1, figsize=(9, 7), sharex=True)
    axes[0].plot(s.t, s.ego_speed, color="#1d3557")
    axes[0].set_ylabel("ego speed (m/s)")
    axes[1].plot(s.t, s.lead_gap, color="#457b9d")
    axes[1].set_ylabel("lead gap (m)")
    axes[2].plot(run.t, run.applied_accel, color="#2a9d8f", label="applied accel")
    axes[2].set_ylabel("accel (m/s^2)")
    twin = axes[2].twinx()
    twin.step(run.t, run.applied_index, where="post", color="#6d6875", lw=0.8, label="decision")
    twin.set_yticks(range(len(ACTIONS)), ACTIONS, fontsize=7)
    for ax in axes:
        _shade_states(ax, run.t, run.safety_state)
        if np.isfinite(run.ood_onset_s):
            ax.axvline(run.ood_onset_s, color="#e63946", ls="--", lw=1)
        ax.grid(alpha=0.3)
    axes[2].set_xlabel("time (s)")
    verdict = f"{run.metrics.collisions} collisions" + (", off road" if run.metrics.off_road else "")
    axes[0].set_title(
        f"{run.scenario} (seed {run.seed}): {verdict}; shaded: hold / fallback / recovering; dashed: fault onset",
        fontsize=9,
    )
    fig.tight_layout()
    path = out_dir / f"{run.scenario}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_tick_work(runs: Sequence[ClosedLoopRun], path: Path) -> Path:
    """How long the executor worked on each tick (its own stage timings), all scenarios together.
    REALTIME lateness against the wall clock is `dualloop bench tick`'s job."""
    plt = pyplot()
    work = np.concatenate([r.tick_work_us[np.isfinite(r.tick_work_us)] for r in runs]) if runs else np.zeros(0)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    if work.size:
        bins = np.logspace(0, np.log10(max(work.max(), 10.0)), 60)
        ax.hist(np.maximum(work, 1.0), bins=bins, color="#457b9d")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(
            f"executor work per tick over the demo: {work.size} ticks, p50 {np.median(work):.0f} us, "
            f"p99 {np.percentile(work, 99):.0f} us (5 ms budget)",
            fontsize=9,
        )
    ax.set_xlabel("preprocess + forward + gate + postprocess (us)")
    ax.set_ylabel("ticks")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_report(
    out_dir: Path, model: Path, version: str, rows: Sequence[Any], plots: Sequence[Path], lateness_plot: Path
) -> Path:
    lines = [
        "# dualloop closed-loop report",
        "",
        f"Model `{model}` version `{version}`; scenarios driven over gRPC "
        f"in LOCKSTEP on held-out seeds. The servers' recordings (MCAP, one file per plan source, "
        f"a plot topic per scenario) are in `logs/`; open them in Foxglove with `foxglove-layout.json` "
        f"(docs/foxglove.md).",
        "",
        "| scenario | OOD | collisions | rear-end | min TTC s | min rear TTC s | phantom braking s | min gap m | "
        "hard brakes | max jerk | vetoes | fallback s | max transition step m/s^2 | time to standstill s | "
        "drive-offs | tick work p99 us | plan updates | plan changes | speed changes | plan source |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        standstill = getattr(r, "time_to_standstill_s", float("nan"))
        lines.append(
            f"| {r.scenario} | {'yes' if r.ood else ''} | {r.collisions}{' off-road' if r.off_road else ''} | "
            f"{getattr(r, 'rear_end_collisions', '')} | {r.min_ttc_s:.1f} | "
            f"{getattr(r, 'min_rear_ttc_s', float('inf')):.1f} | {getattr(r, 'phantom_braking_s', 0.0):.2f} | "
            f"{r.min_gap_m:.1f} | {r.hard_brakes} | {r.max_jerk:.1f} | {r.gate_vetoes} | "
            f"{r.fallback_s:.2f} | {getattr(r, 'max_transition_step', 0.0):.2f} | "
            f"{'-' if np.isnan(standstill) else f'{standstill:.2f}'} | {getattr(r, 'drive_offs', '')} | "
            f"{r.tick_work_p99_us:.0f} | {r.plan_updates} | "
            f"{getattr(r, 'plan_changes', '')} | {getattr(r, 'speed_changes', '')} | "
            f"{getattr(r, 'plan_source', '')} |"
        )
    lines += [
        "",
        "Rear-end: collisions (counted in collisions too) where a car behind ran into the ego; min rear "
        "TTC: of the car behind the ego in its lane; phantom braking: seconds braking beyond 2 m/s^2 while "
        "the simulator's ground truth ahead needed less than 2 m/s^2 and no car closed within 3 s (in the "
        "last second); max transition step: the largest applied-command step in one 5 ms tick at or next "
        "to a non-NOMINAL state; time to standstill: from the first non-NOMINAL tick; drive-offs: moving "
        "again after a standstill in a non-NOMINAL state without a release. Definitions: docs/demo.md.",
    ]
    lines += ["", f"![tick work]({lateness_plot.name})", ""]
    lines += [f"## {p.stem}\n\n![{p.stem}]({p.name})\n" for p in plots]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines))
    return path
