"""Recorded drives as training and evaluation rows.

One row per observation: its features in the highway schema's order (a feature the log does not
have, or does not measure, is NaN and missing), the log's sensor profile as the mask the executor
would use (controller.logs.format.sensor_profile: a log that filled its missing features with values
is replayed with all present, so it is read that way too), the label the importer stored
(ActualAction.action_index: the look-ahead band) and the look-ahead acceleration
(ActualAction.controls[accel]). Rows without a label, or with NaN in a measured feature (the
executor would refuse them), are not training rows.

Recorded drives come without a plan; they are trained with the plan the executor gives a session
without one (schema.no_plan_rows: the card's plan_default, its target speed raised to the measured speed).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from dualloop.controller.logs.bulk import MAGIC
from dualloop.controller.logs.format import rotated_groups, sensor_profile
from dualloop.controller.logs.logfile import LogData, LogFileError, read_sessions
from dualloop.controller.training.data import Split, make_split
from dualloop.executor.action_labels import backward_accel
from dualloop.executor.history import HistoryDeriver
from dualloop.sim import schema

F32 = npt.NDArray[np.float32]
# How a stack may supply ego_accel (LogRows.with_ego_accel): as the log has it, derived from speed, or not at all.
EGO_ACCEL_SUPPLIES = ("logged", "derived", "absent")
_SPEED, _ACCEL = schema.FEATURE_NAMES.index("ego_speed"), schema.FEATURE_NAMES.index("ego_accel")
# One stretch of VAL_CHUNK_S of the training drives in VAL_EVERY validates (early stopping,
# temperature, tuning), picked by a hash of its session and index: by stretch rather than by session,
# so a dataset with one or two long drives validates too.
VAL_EVERY = 5
VAL_CHUNK_S = 60.0


@dataclass(frozen=True)
class LogRows:
    """Every observation of a set of logs, flat (N, ...), in file and session order."""

    features: F32  # (N, N_FEATURES), NaN where missing
    present: npt.NDArray[np.bool_]  # (N, N_FEATURES): the sensor profile
    label: npt.NDArray[np.int64]  # -1: none
    accel: npt.NDArray[np.float64]  # the look-ahead acceleration, NaN when unknown
    session: npt.NDArray[np.int64]  # index into sessions
    t_s: npt.NDArray[np.float64]  # observation time since the session's first, s
    sessions: tuple[str, ...]
    datasets: tuple[str, ...]  # per session
    files: tuple[str, ...]  # per session
    t_ns: npt.NDArray[np.int64] | None = None  # the observations' sensor timestamps, ns
    paths: tuple[str, ...] = ()  # per session: the file as given (files holds its name only)

    def __len__(self) -> int:
        return int(self.label.shape[0])

    @property
    def dataset(self) -> npt.NDArray[np.str_]:
        return np.array(self.datasets, dtype=str)[self.session] if len(self.datasets) else np.zeros(0, str)

    def subset(self, rows: npt.NDArray[np.bool_]) -> LogRows:
        """These rows, with only the sessions they belong to (renumbered)."""
        kept = np.unique(self.session[rows])
        new_index = np.full(len(self.sessions), -1, np.int64)
        new_index[kept] = np.arange(len(kept))
        return LogRows(
            self.features[rows],
            self.present[rows],
            self.label[rows],
            self.accel[rows],
            new_index[self.session[rows]],
            self.t_s[rows],
            tuple(self.sessions[i] for i in kept),
            tuple(self.datasets[i] for i in kept),
            tuple(self.files[i] for i in kept),
            None if self.t_ns is None else self.t_ns[rows],
            tuple(self.paths[i] for i in kept) if self.paths else (),
        )

    def history(self, deriver: HistoryDeriver) -> F32:
        """(N, H) each row's history features from its session's rows as one observation stream
        (whole sessions: a subset's stream lacks what it left out)."""
        if self.t_ns is None:
            raise ValueError("these rows have no timestamps (LogRows.t_ns) to derive history features from")
        return deriver.sessions(self.t_ns, self.features, self.session)

    @property
    def validation(self) -> npt.NDArray[np.bool_]:
        """Rows in validation stretches (VAL_EVERY, VAL_CHUNK_S)."""
        chunk = (self.t_s // VAL_CHUNK_S).astype(np.int64)
        out = np.zeros(len(self), bool)
        for s, c in set(zip(self.session.tolist(), chunk.tolist())):
            key = f"{self.sessions[s]}#{c}".encode()
            if int(hashlib.sha256(key).hexdigest(), 16) % VAL_EVERY == 0:
                out[(self.session == s) & (chunk == c)] = True
        return out

    def with_ego_accel(self, supply: str) -> LogRows:
        """These rows as a stack supplying ego_accel another way (EGO_ACCEL_SUPPLIES): "logged" as
        recorded; "derived" the causal slope of the measured speed over the previous 0.5 s, as a stack
        without an accelerometer gives it (executor.action_labels.backward_accel); "absent" not measured."""
        if supply not in EGO_ACCEL_SUPPLIES:
            raise ValueError(f"ego_accel supply {supply!r}: one of {', '.join(EGO_ACCEL_SUPPLIES)}")
        if supply == "logged":
            return self
        features, present = self.features.copy(), self.present.copy()
        if supply == "absent":
            features[:, _ACCEL] = np.nan
            present[:, _ACCEL] = False
        else:
            for s in range(len(self.sessions)):
                mine = np.flatnonzero(self.session == s)
                speed = features[mine, _SPEED].astype(np.float64)
                ok = np.isfinite(speed)
                derived = np.full(len(mine), np.nan)
                if ok.sum() >= 2:
                    derived[ok] = backward_accel(self.t_s[mine][ok], speed[ok])
                features[mine, _ACCEL] = derived
                present[mine, _ACCEL] = present[mine, _SPEED]
        return dataclasses.replace(self, features=features, present=present)

    @property
    def valid(self) -> npt.NDArray[np.bool_]:
        """Rows the executor would score: no NaN in a measured feature."""
        return np.asarray((np.isfinite(self.features) | ~self.present).all(axis=1), bool)


def dataset_name(log: LogData) -> str:
    """Which dataset a log comes from, for per-dataset reports: the importer's `dataset` detail up to
    its first "(" or "," ("OpenACC AstaZero (JRC), ..." -> "openacc-astazero"), else the first word
    of the header's source."""
    detail = log.header.source_details.get("dataset", "")
    name = re.split(r"[(,]", detail)[0].strip() or (log.header.source.split() or ["unknown"])[0]
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


def log_paths(paths: Iterable[str | Path]) -> list[Path]:
    """Files and folders (every *.mcap in them, sorted) as a sorted list of files."""
    out: set[Path] = set()
    for p in map(Path, paths):
        if p.is_dir():
            out |= set(p.rglob("*.mcap"))
        elif p.is_file():
            out.add(p)
        else:
            raise FileNotFoundError(f"{p}: no such log file or folder")
    return sorted(out)


def recorded_drives_problem(paths: Sequence[str | Path], flag: str) -> str | None:
    """What makes recorded drives unusable, said before the minutes of work that read them at the end
    (None: nothing): a path that is not there, no .mcap in a folder, a file that is no MCAP log, or logs
    that are valid but hold no session (read_log_rows refused those only after the whole run). Stops at
    the first log with a session, so a large fleet costs one file's read."""
    missing = [str(p) for p in paths if not Path(p).exists()]
    if missing:
        return f"{flag} {', '.join(missing)}: no such log file or folder"
    files = log_paths(paths)
    if not files:
        return f"{flag}: no .mcap log in {', '.join(map(str, paths))}"
    for f in files:
        with open(f, "rb") as head:
            if head.read(len(MAGIC)) != MAGIC:
                return f"{flag}: {f} is not an MCAP log (empty, or another format)"
    if not any(read_sessions(f) for f in files):
        named = ", ".join(map(str, files))
        return f"{flag}: no sessions in {named} (valid logs without a recorded drive); give logs of drives"
    return None


def _session_rows(
    log: LogData,
) -> tuple[
    F32,
    npt.NDArray[np.bool_],
    npt.NDArray[np.int64],
    npt.NDArray[np.float64],
    npt.NDArray[np.float64],
    npt.NDArray[np.int64],
]:
    names = list(log.header.feature_names) or list(schema.FEATURE_NAMES)
    column = {n: i for i, n in enumerate(names)}
    profile = sensor_profile(log.header)
    measured = set(names) if profile is None else set(profile)
    n = len(log.observations)
    x = np.full((n, schema.N_FEATURES), np.nan, np.float32)
    raw = np.array([list(o.features) for o in log.observations], np.float32).reshape(n, -1)
    present = np.zeros(schema.N_FEATURES, bool)
    for j, name in enumerate(schema.FEATURE_NAMES):
        if name in column and name in measured and column[name] < raw.shape[1]:
            x[:, j] = raw[:, column[name]]
            present[j] = True
    actions = list(log.header.action_names) or list(schema.ACTIONS)
    if actions != list(schema.ACTIONS):
        raise ValueError(f"session {log.session_id}: actions {actions}, expected {list(schema.ACTIONS)}")
    controls = list(log.header.control_names) or list(schema.CONTROL_NAMES)
    accel_at = controls.index("accel") if "accel" in controls else None
    label = np.array([o.actual.action_index if o.HasField("actual") else -1 for o in log.observations], np.int64)
    accel = np.array(
        [
            o.actual.controls[accel_at]
            if o.HasField("actual") and accel_at is not None and len(o.actual.controls) > accel_at
            else np.nan
            for o in log.observations
        ],
        np.float64,
    )
    t_ns = np.array([o.timestamp_ns for o in log.observations], np.int64)
    t_s = (t_ns - (t_ns[0] if n else 0)) / 1e9
    return x, np.broadcast_to(present, x.shape).copy(), label, accel, t_s, t_ns


def read_log_rows(paths: Iterable[str | Path]) -> LogRows:
    parts = []
    sessions: list[str] = []
    datasets: list[str] = []
    files: list[str] = []
    given: list[str] = []
    found = log_paths(paths)
    for group in rotated_groups(found):  # a rotated recording's parts read as one log
        path = group[0]
        for log in read_sessions(group).values():
            x, present, label, accel, t_s, t_ns = _session_rows(log)
            parts.append((x, present, label, accel, np.full(len(label), len(sessions), np.int64), t_s, t_ns))
            sessions.append(log.session_id)
            datasets.append(dataset_name(log))
            files.append(path.name)
            given.append(str(path))
    if not parts:  # a user's files: said in one line, naming them
        named = ", ".join(map(str, found)) or "no .mcap files"
        raise LogFileError(f"no sessions in the recorded drives given: {named}")
    cat = [np.concatenate([p[i] for p in parts]) for i in range(7)]
    return LogRows(
        cat[0],
        cat[1],
        cat[2],
        cat[3],
        cat[4],
        cat[5],
        tuple(sessions),
        tuple(datasets),
        tuple(files),
        cat[6],
        tuple(given),
    )


def training_splits(rows: LogRows, history: HistoryDeriver | None = None) -> dict[str, dict[str, Split]]:
    """{"train": {dataset: rows}, "val": {dataset: rows}}: labelled, valid rows, split by stretch
    (LogRows.validation); with `history`, each row's history features from its whole session."""
    hist = None if history is None else rows.history(history)
    usable = (rows.label >= 0) & rows.valid
    validation = rows.validation
    dataset = rows.dataset
    out: dict[str, dict[str, Split]] = {"train": {}, "val": {}}
    for split, in_val in (("train", False), ("val", True)):
        for name in sorted(set(rows.datasets)):
            keep = usable & (dataset == name) & (validation == in_val)
            if not keep.any():
                continue
            controls = np.full((int(keep.sum()), 2), np.nan, np.float32)
            controls[:, 0] = rows.accel[keep]  # what the driver did; the steering is unknown
            out[split][name] = make_split(
                rows.features[keep],
                rows.present[keep],
                schema.no_plan_rows(rows.features[keep], rows.present[keep]),
                rows.label[keep],
                controls,
                source=0,
                history=None if hist is None else hist[keep],
            )
    return out


def file_facts(paths: Sequence[Path], rows: LogRows) -> dict[str, str]:
    """What a card records about the recorded drives it was trained on (a retrain must use the same):
    a digest of the rows read (sessions, features, profiles, labels; not the files' bytes, which
    hold the wall-clock time of the import), the number of files, and the labelled rows per dataset."""
    digest = hashlib.sha256()
    for name in rows.sessions:
        digest.update(name.encode() + b"\0")
    for a in (rows.features, rows.present, rows.label, rows.accel, rows.session, rows.t_s):
        digest.update(np.ascontiguousarray(a).tobytes())
    per = {n: int(((rows.dataset == n) & (rows.label >= 0)).sum()) for n in sorted(set(rows.datasets))}
    return {
        "logs_rows_sha256": digest.hexdigest()[:16],
        "logs_files": str(len(paths)),
        "logs_labelled_rows": ", ".join(f"{n} {k}" for n, k in per.items()),
    }
