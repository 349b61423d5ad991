"""Import a CSV drive log (any source that can write a table) as a dualloop log.

Columns (header row required, names exact, order free):
  time                 seconds, finite, strictly increasing (kept as given: not shifted to 0)
  <feature names>      every name in sim.schema.FEATURE_NAMES, in that feature's unit
  actual_action        optional: what the driver/stack did, an action name (brake_hard, brake, keep,
                       accelerate) or its index 0-3; -1 or empty = unknown for that row
  actual_accel,        optional, together: the actual controls (m/s^2, front-wheel rad + = left);
  actual_steer         empty in both = unknown for that row. When actual_action is missing or empty
                       and actual_accel is given, the action is label_from_accel(actual_accel).
Any other column is an error (a misspelt optional column would otherwise vanish silently), unless
`allow_extra_columns=True`, which ignores them with a warning in the report. Every error names the
file, the line (1 = the header) and the column.
"""

from __future__ import annotations

import csv
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dualloop.controller.logs.format import FORMAT_VERSION
from dualloop.controller.logs.import_report import ImportReport, count_labels
from dualloop.controller.logs.logfile import write_log
from dualloop.sim.schema import ACTION_INDEX, ACTIONS, CONTROL_NAMES, FEATURE_INDEX, FEATURE_NAMES, label_from_accel
from dualloop.v1 import controller_pb2 as pb
from dualloop.v1 import log_pb2

TIME_COLUMN = "time"
ACTION_COLUMN = "actual_action"
CONTROL_COLUMNS = ("actual_accel", "actual_steer")
REQUIRED_COLUMNS = (TIME_COLUMN, *FEATURE_NAMES)
OPTIONAL_COLUMNS = (ACTION_COLUMN, *CONTROL_COLUMNS)


class CsvImportError(ValueError):
    pass


@dataclass
class _Columns:
    index: dict[str, int]
    extra: list[str]


def _read_header(path: Path, header: list[str], allow_extra_columns: bool) -> _Columns:
    names = [name.strip() for name in header]
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise CsvImportError(f"{path}: line 1 (header): column '{name}' appears twice")
        seen.add(name)
    missing = [name for name in REQUIRED_COLUMNS if name not in seen]
    if missing:
        raise CsvImportError(
            f"{path}: line 1 (header): missing column{'s' if len(missing) > 1 else ''} "
            f"{', '.join(repr(m) for m in missing)} (required: 'time' and every feature of sim.schema.FEATURE_NAMES)"
        )
    if (CONTROL_COLUMNS[0] in seen) != (CONTROL_COLUMNS[1] in seen):
        absent = CONTROL_COLUMNS[1] if CONTROL_COLUMNS[0] in seen else CONTROL_COLUMNS[0]
        raise CsvImportError(
            f"{path}: line 1 (header): missing column '{absent}' ('actual_accel' and 'actual_steer' come together)"
        )
    extra = [name for name in names if name not in REQUIRED_COLUMNS and name not in OPTIONAL_COLUMNS]
    if extra and not allow_extra_columns:
        raise CsvImportError(
            f"{path}: line 1 (header): unknown column{'s' if len(extra) > 1 else ''} "
            f"{', '.join(repr(e) for e in extra)} "
            f"(expected 'time', the features, and optionally {', '.join(OPTIONAL_COLUMNS)}; "
            "allow_extra_columns=True ignores unknown columns)"
        )
    return _Columns({name: i for i, name in enumerate(names)}, extra)


def _number(path: Path, line: int, column: str, cell: str) -> float:
    try:
        value = float(cell)
    except ValueError:
        raise CsvImportError(f"{path}: line {line}, column '{column}': {cell.strip()!r} is not a number") from None
    if not math.isfinite(value):
        raise CsvImportError(f"{path}: line {line}, column '{column}': {cell.strip()!r} is not a finite number")
    return value


def _action(path: Path, line: int, cell: str) -> int:
    text = cell.strip()
    if text in ACTION_INDEX:
        return ACTION_INDEX[text]
    try:
        index = int(text)
    except ValueError:
        index = len(ACTIONS)  # falls through to the error below
    if -1 <= index < len(ACTIONS):
        return index
    raise CsvImportError(
        f"{path}: line {line}, column '{ACTION_COLUMN}': {text!r} is not an action "
        f"(one of {', '.join(ACTIONS)}, an index 0-{len(ACTIONS) - 1}, or -1/empty for unknown)"
    )


def _actual(path: Path, line: int, row: list[str], columns: _Columns) -> pb.ActualAction | None:
    index = -1
    if ACTION_COLUMN in columns.index and row[columns.index[ACTION_COLUMN]].strip():
        index = _action(path, line, row[columns.index[ACTION_COLUMN]])
    controls: list[float] = []
    if CONTROL_COLUMNS[0] in columns.index:
        cells = [row[columns.index[name]].strip() for name in CONTROL_COLUMNS]
        if any(cells) and not all(cells):
            empty = CONTROL_COLUMNS[cells.index("")]
            raise CsvImportError(
                f"{path}: line {line}, column '{empty}': empty while "
                f"'{CONTROL_COLUMNS[1 - CONTROL_COLUMNS.index(empty)]}' is given"
            )
        if all(cells):
            controls = [_number(path, line, name, cell) for name, cell in zip(CONTROL_COLUMNS, cells)]
            if index < 0:
                index = int(label_from_accel(controls[0]))
    if index < 0 and not controls:
        return None
    return pb.ActualAction(action_index=index, controls=controls)


def read_csv_observations(path: Path, allow_extra_columns: bool = False) -> tuple[list[pb.Observation], list[str]]:
    """Parse and validate the whole file; returns the observations and the ignored column names."""
    observations: list[pb.Observation] = []
    with open(path, newline="", encoding="utf-8-sig") as stream:  # -sig: spreadsheets write a BOM
        reader = csv.reader(stream)
        header = next(reader, None)
        while header is not None and not any(cell.strip() for cell in header):
            header = next(reader, None)
        if header is None:
            raise CsvImportError(f"{path}: empty file: expected a header row with 'time' and the feature names")
        columns = _read_header(path, header, allow_extra_columns)
        feature_columns = [columns.index[name] for name in FEATURE_NAMES]
        previous_ns: int | None = None
        previous_line = 0
        for row in reader:
            line = reader.line_num
            if not any(cell.strip() for cell in row):
                continue  # blank lines (often a trailing one) carry nothing
            if len(row) != len(header):
                raise CsvImportError(f"{path}: line {line}: {len(row)} cells, the header has {len(header)}")
            seconds = _number(path, line, TIME_COLUMN, row[columns.index[TIME_COLUMN]])
            timestamp_ns = round(seconds * 1e9)
            if previous_ns is not None and timestamp_ns <= previous_ns:
                raise CsvImportError(
                    f"{path}: line {line}, column 'time': {seconds!r} s is not after {previous_ns / 1e9!r} s "
                    f"(line {previous_line}); time must strictly increase"
                )
            features = [_number(path, line, FEATURE_NAMES[k], row[c]) for k, c in enumerate(feature_columns)]
            observations.append(pb.Observation(seq=len(observations) + 1, timestamp_ns=timestamp_ns, features=features))
            actual = _actual(path, line, row, columns)
            if actual is not None:
                observations[-1].actual.CopyFrom(actual)
            previous_ns, previous_line = timestamp_ns, line
    if not observations:
        raise CsvImportError(f"{path}: no data rows after the header")
    return observations, columns.extra


def import_csv(
    file: str | Path,
    out_path: str | Path,
    *,
    session_id: str | None = None,
    allow_extra_columns: bool = False,
    start_time_unix_ns: int | None = None,
) -> ImportReport:
    """Convert a CSV drive log (columns above) into a dualloop log at `out_path`."""
    path, out_path = Path(file), Path(out_path)
    if not path.is_file():
        raise CsvImportError(f"{path}: no such file")
    observations, extra = read_csv_observations(path, allow_extra_columns)
    times = np.array([o.timestamp_ns for o in observations], dtype=np.int64)
    period_ns = int(np.median(np.diff(times))) if len(times) > 1 else 0
    header = log_pb2.SessionHeader(
        session_id=session_id or f"csv-{path.stem}",
        clock=pb.LOCKSTEP,
        shadow=True,
        config_json="{}",
        source=f"csv import of {path}",
        format_version=FORMAT_VERSION,
        start_time_unix_ns=time.time_ns() if start_time_unix_ns is None else start_time_unix_ns,
        feature_names=FEATURE_NAMES,
        measured_features=FEATURE_NAMES,
        action_names=ACTIONS,
        control_names=CONTROL_NAMES,
        tick_period_ns=period_ns,
        source_details={"file": str(path), "ignored_columns": ",".join(extra)},
    )
    write_log(out_path, header, observations)
    actions = np.array([o.actual.action_index if o.HasField("actual") else -1 for o in observations], dtype=np.int64)
    lead = np.array([o.features[FEATURE_INDEX["lead_present"]] for o in observations])
    return ImportReport(
        source=header.source,
        out_path=out_path,
        observations=len(observations),
        duration_s=float(times[-1] - times[0]) / 1e9,
        rate_hz=1e9 / period_ns if period_ns else 0.0,
        lead_present_fraction=float(np.mean(lead >= 0.5)),
        label_counts=count_labels(actions),
        measured_features=list(FEATURE_NAMES),
        filled_features=[],
        warnings=[f"ignored unknown column{'s' if len(extra) > 1 else ''} {', '.join(extra)}"] if extra else [],
    )
