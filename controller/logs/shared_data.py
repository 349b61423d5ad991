"""`dualloop import shared-data`: every shared real drive into <out>/train and <out>/heldout.

The split is controller/logs/datasets.py's. Each session is one file, <out>/<split>/<session id>.mcap;
<out>/manifest.json lists every session with its split and every pair left out with the reason, so
the trainer and the replay read the same split.

The import is built in a hidden folder inside <out> and moved into place at the end, the manifest
last: an interrupted import (Ctrl-C, SIGTERM) leaves the previous import as it was, never a few new
sessions beside a manifest that lists the old ones.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dualloop.controller.logs.datasets import COMMA2K19, DROPPED, SPLITS, Drive, list_drives
from dualloop.controller.logs.following import TICK_PERIOD_NS
from dualloop.controller.logs.import_comma2k19 import import_comma2k19
from dualloop.controller.logs.import_ngsim import import_ngsim
from dualloop.controller.logs.import_openacc import import_openacc
from dualloop.controller.logs.import_report import ImportReport
from dualloop.sim.schema import ACTIONS

LABELS = (*ACTIONS, "unknown")


@dataclass
class SplitTotals:
    drives: int = 0
    sessions: int = 0
    seconds: float = 0.0
    observations: int = 0
    ticks: int = 0  # executor ticks a LOCKSTEP replay runs: one per 5 ms of drive
    labels: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LABELS, 0))
    left_out: dict[str, int] = field(default_factory=dict)  # pairs left out, by reason

    def add(self, report: ImportReport) -> None:
        self.sessions += 1
        self.seconds += report.duration_s
        self.observations += report.observations
        self.ticks += int(round(report.duration_s * 1e9)) // TICK_PERIOD_NS + 1
        for name, count in report.label_counts.items():
            self.labels[name] = self.labels.get(name, 0) + count


@dataclass
class SharedDataResult:
    out: Path
    drives: list[Drive]
    reports: dict[str, list[ImportReport]]  # split -> reports
    totals: dict[tuple[str, str], SplitTotals]  # (dataset, split) -> totals

    def summary(self) -> str:
        lines = [
            f"{'dataset':<18} {'split':<8} {'drives':>6} {'sessions':>8} {'minutes':>8} {'observ.':>8} {'ticks':>9}  "
            f"labels (share of labelled observations: {', '.join(ACTIONS)}; unlabelled)"
        ]
        for (dataset, split), t in sorted(self.totals.items()):
            labelled = sum(t.labels[a] for a in ACTIONS) or 1
            shares = " ".join(f"{100 * t.labels[a] / labelled:4.1f}%" for a in ACTIONS)
            lines.append(
                f"{dataset:<18} {split:<8} {t.drives:>6} {t.sessions:>8} {t.seconds / 60:>8.1f} {t.observations:>8} "
                f"{t.ticks:>9}  "
                f"{shares}; {t.labels['unknown']} unlabelled"
                + "".join(f"; {n} pairs left out: {why}" for why, n in t.left_out.items())
            )
        for split in SPLITS:
            chosen = [t for (_, s), t in self.totals.items() if s == split]
            lines.append(
                f"{'all':<18} {split:<8} {sum(t.drives for t in chosen):>6} {sum(t.sessions for t in chosen):>8} "
                f"{sum(t.seconds for t in chosen) / 60:>8.1f} {sum(t.observations for t in chosen):>8} "
                f"{sum(t.ticks for t in chosen):>9}"
            )
        dropped = [d for d in self.drives if d.split == DROPPED]
        if dropped:
            lines.append(f"dropped drives: {', '.join(f'{d.path.name} ({d.why})' for d in dropped)}")
        lines.append(f"manifest: {self.out / 'manifest.json'}")
        return "\n".join(lines)


def import_shared_data(
    data_dir: Path,
    out: Path,
    progress: Callable[[str], None] = lambda _: None,
    start_time_unix_ns: int | None = None,
) -> SharedDataResult:
    """Import every drive of data_dir into out/train and out/heldout (replacing the .mcap files there)."""
    drives = list_drives(data_dir)
    if not drives:
        raise FileNotFoundError(f"{data_dir}: none of the shared data sets is there (see controller/logs/datasets.py)")
    staging = out / f".importing-{os.getpid()}"
    try:
        result = _import_drives(data_dir, drives, staging, progress, start_time_unix_ns)
        _move_into_place(staging, out)
    finally:  # done, failed or interrupted: the hidden folder goes; `out` is the old import or the new one
        shutil.rmtree(staging, ignore_errors=True)
    for made in result.reports.values():
        for report in made:
            report.out_path = out / report.out_path.relative_to(staging)
    result.out = out
    return result


def _move_into_place(staging: Path, out: Path) -> None:
    """The staged import into `out`: the old manifest removed first and the new one moved in last, so
    the folder never has a manifest that does not list its files (a move is a rename: milliseconds)."""
    (out / "manifest.json").unlink(missing_ok=True)
    for split in SPLITS:
        folder = out / split
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob("*.mcap"):  # this command owns these folders: no leftovers of an older split
            stale.unlink()
        for new in (staging / split).glob("*.mcap"):
            new.rename(folder / new.name)
    (staging / "manifest.json").rename(out / "manifest.json")


def _import_drives(
    data_dir: Path,
    drives: list[Drive],
    out: Path,
    progress: Callable[[str], None],
    start_time_unix_ns: int | None,
) -> SharedDataResult:
    """Every drive into out/train and out/heldout (new folders), with out/manifest.json."""
    for split in SPLITS:
        (out / split).mkdir(parents=True)
    reports: dict[str, list[ImportReport]] = {split: [] for split in SPLITS}
    totals: dict[tuple[str, str], SplitTotals] = {}
    sessions: list[dict[str, str]] = []
    left_out: list[dict[str, str]] = []
    for n, drive in enumerate(drives, start=1):
        if drive.split != DROPPED:
            totals.setdefault((drive.dataset, drive.split), SplitTotals())
        key = (drive.dataset, drive.split if drive.split != DROPPED else "train")
        for pair, reason, why in drive.skipped:
            left = totals.setdefault(key, SplitTotals()).left_out
            left[reason] = left.get(reason, 0) + 1
            left_out.append({"file": drive.path.name, "session": pair.session_id, "reason": reason, "details": why})
        if drive.split == DROPPED or (drive.source.pairs and not drive.pairs):
            progress(f"[{n}/{len(drives)}] {drive.split:<7} {drive.dataset:<17} {drive.path.name}: nothing to import")
            continue
        folder = out / drive.split
        only = {p.session_id for p in drive.pairs}
        if drive.source.importer == "openacc":
            made = import_openacc(drive.path, folder, only=only, start_time_unix_ns=start_time_unix_ns)
        elif drive.source.importer == "ngsim":
            made = import_ngsim(drive.path, folder, only=only, start_time_unix_ns=start_time_unix_ns)
        elif drive.dataset == COMMA2K19:
            made = [
                import_comma2k19(
                    drive.path, folder / f"comma2k19-{drive.path.name}.mcap", start_time_unix_ns=start_time_unix_ns
                )
            ]
        else:
            raise ValueError(f"{drive.path}: no importer {drive.source.importer!r}")
        totals[(drive.dataset, drive.split)].drives += 1
        for report in made:
            totals[(drive.dataset, drive.split)].add(report)
            sessions.append(
                {
                    "split": drive.split,
                    "dataset": drive.dataset,
                    "session": report.session_id or report.out_path.stem,
                    "file": str(report.out_path.relative_to(out)),
                    "source": drive.path.name,
                    "rule": drive.why,
                }
            )
        reports[drive.split] += made
        minutes = sum(r.duration_s for r in made) / 60
        progress(
            f"[{n}/{len(drives)}] {drive.split:<7} {drive.dataset:<17} {drive.path.name}: "
            f"{len(made)} session{'s' if len(made) != 1 else ''}, {minutes:.1f} min"
        )
    manifest = {"data_dir": str(data_dir), "sessions": sessions, "left_out": left_out}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return SharedDataResult(out, drives, reports, totals)
