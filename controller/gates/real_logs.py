"""The real drives a fault benchmark runs on: a folder of dualloop logs, or a shared data set's folder
imported with the project's own importers (controller/logs/, docs/importers.md) into a scratch folder.

Recognised folders: any folder holding `.mcap` logs (searched recursively); a comma2k19 segment (a
`processed_log` folder); a folder of leader-follower pair CSVs in `pairs/` (the OpenACC Vicolungo and
Cherasco campaigns: time, ego_speed, ego_accel, lead_present, lead_distance, lead_rel_speed and columns
the importer ignores; rows with an empty feature cell, the first row's ego_accel, are left out); the
OpenACC AstaZero and ZalaZone and the NGSIM folders of controller/logs/datasets.py (every pair of
both splits, each once).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from dualloop.controller.logs.datasets import COMMA2K19, FOLDERS, list_drives
from dualloop.controller.logs.import_comma2k19 import import_comma2k19
from dualloop.controller.logs.import_csv import import_csv
from dualloop.controller.logs.import_ngsim import import_ngsim
from dualloop.controller.logs.import_openacc import import_openacc
from dualloop.sim.schema import FEATURE_NAMES

# fixed start time: an import is then byte-identical run to run
START_TIME_UNIX_NS = 0


class RealDataError(ValueError):
    """A folder the benchmark cannot read as real drives; the message names it."""


@dataclass(frozen=True)
class RealDataset:
    name: str
    source: Path
    logs: tuple[Path, ...]  # sorted


def load_real_dir(folder: Path, scratch: Path) -> RealDataset:
    """The logs of one folder given to --real, importing a shared data set into `scratch` first."""
    folder = Path(folder)
    if not folder.is_dir():
        raise RealDataError(f"{folder}: not a folder (--real takes folders of .mcap logs or shared data sets)")
    name = folder.name
    logs = sorted(folder.rglob("*.mcap"))
    if logs:
        return RealDataset(name, folder, tuple(logs))
    out = scratch / name
    out.mkdir(parents=True, exist_ok=True)
    if (folder / "processed_log").is_dir():
        report = import_comma2k19(folder, out / f"{name}.mcap", start_time_unix_ns=START_TIME_UNIX_NS)
        return RealDataset(name, folder, (report.out_path,))
    pairs = sorted((folder / "pairs").glob("*.csv"))
    if pairs:
        made = [_import_pair_csv(p, out) for p in pairs]
        return RealDataset(name, folder, tuple(sorted(made)))
    dataset = next((d for d, f in FOLDERS.items() if f == name and d != COMMA2K19), None)
    if dataset is None:
        raise RealDataError(
            f"{folder}: no .mcap logs and not a shared data set this benchmark imports (a comma2k19 segment with "
            f"processed_log/, OpenACC pairs/*.csv, or one of {', '.join(sorted(FOLDERS.values()))})"
        )
    made_paths: list[Path] = []
    for drive in list_drives(folder.parent):
        if drive.dataset != dataset or not drive.source.pairs:
            continue
        only = {p.session_id for p in (*drive.pairs, *(s[0] for s in drive.skipped if s[1] != "duplicate"))}
        importer = import_openacc if drive.source.importer == "openacc" else import_ngsim
        made_paths += [r.out_path for r in importer(drive.path, out, only=only, start_time_unix_ns=START_TIME_UNIX_NS)]
    if not made_paths:
        raise RealDataError(f"{folder}: no drives found to import")
    return RealDataset(name, folder, tuple(sorted(made_paths)))


def _import_pair_csv(path: Path, out: Path) -> Path:
    """A pair CSV's feature columns, its rows with every feature present, imported with `import csv`."""
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    if not rows or "time" not in rows[0] or "ego_speed" not in rows[0]:
        raise RealDataError(f"{path}: a pair CSV needs a header with time and ego_speed")
    columns = ["time", *(c for c in FEATURE_NAMES if c in rows[0])]
    kept = [r for r in rows if all((r[c] or "").strip() for c in columns)]
    clean = out / f"{path.stem}.features.csv"
    with clean.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(columns)
        writer.writerows([r[c] for c in columns] for r in kept)
    target = out / f"{path.stem}.mcap"
    import_csv(clean, target, session_id=path.stem, start_time_unix_ns=START_TIME_UNIX_NS)
    return target
