"""Import a CSV drive log (any source that can write a table) as a dualloop log.

Columns (header row required, names exact, order free; docs/importers.md has examples):
  time                 seconds, finite, strictly increasing (kept as given: not shifted to 0). Required.
  <feature names>      any of sim.schema.FEATURE_NAMES; ego_speed is required. The feature columns of
                       the header are the sensor profile (SessionHeader.measured_features): the
                       others are written as NaN, never filled. A present feature's cells must be numbers.
  <plan names>         optional, all of sim.schema.PLAN_NAMES or none: the plan in effect at each row
                       (Observation.plan; its plan_id changes when the values change, and its
                       valid_for_ns covers its rows and one interval beyond).
  actual_action        optional: what the driver/stack did, an action name (brake_hard, brake, keep,
                       accelerate) or its index 0-3; -1 or empty = unknown for that row.
  actual_accel         optional: the actual acceleration (m/s^2); empty = unknown for that row. Without
                       actual_action (or where it is empty) the action is its band.
  actual_steer         optional, only with actual_accel: front-wheel angle (rad, + = left); NaN when absent.
Without actual_action and actual_accel, the human's action is `action_labels.lookahead_labels` of
ego_speed and the look-ahead acceleration goes into controls[accel] (steer NaN).
Without ego_accel, it is `action_labels.backward_accel` of ego_speed (causal) and counts as present
(a causal estimate from a measured signal; source_details says so); rows where it cannot be computed
(the first, and after a hole over 1 s) are left out.

Units: each column is in its feature's sim.schema unit unless declared, by a `name[unit]` header
suffix or `units={"ego_speed": "km/h"}` (CLI `--units ego_speed=km/h`); see UNITS. A speed column in
m/s whose median exceeds 45 or whose maximum exceeds 70 is refused as "looks like km/h".

Ranges: a flag other than 0 or 1, a negative gap and a speed below -0.5 m/s are imported as they are
(a real log's faults are for the checks to judge) with a warning naming the first line.

Rate: `rate_hz` declares the sensor's rate (refused when it is more than twice as fast or slow as the
rows); otherwise the period is the median interval of `time`, with a warning when the rows are
irregular. The header gets it as observation_period_ns; the executor ticks every 5 ms (tick_period_ns)
regardless.

Any other column is an error (a misspelt optional column would otherwise vanish silently), unless
`allow_extra_columns=True` (CLI `--allow-extra-columns`), which ignores them with a warning. Every
error names the file, the line (1 = the header) and the column.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from dualloop.controller.logs.csv_text import csv_rows
from dualloop.controller.logs.following import imported_header, timestamps_ns
from dualloop.controller.logs.format import ACTUAL_CONTROLS_DETAIL
from dualloop.controller.logs.import_report import ImportReport, count_labels
from dualloop.controller.logs.logfile import write_log
from dualloop.controller.logs.outputs import refuse_overwriting_inputs
from dualloop.controller.logs.plausibility import RATE_MISMATCH, implausible_speed, out_of_range
from dualloop.executor.action_labels import ACCEL_WINDOW_S, LOOKAHEAD_S, backward_accel, lookahead_labels
from dualloop.sim.schema import (
    ACTION_INDEX,
    ACTIONS,
    FEATURE_INDEX,
    FEATURE_NAMES,
    FEATURES,
    N_FEATURES,
    PLAN,
    PLAN_NAMES,
    label_from_accel,
)
from dualloop.v2 import controller_pb2 as pb

TIME_COLUMN = "time"
ACTION_COLUMN = "actual_action"
ACCEL_COLUMN = "actual_accel"
STEER_COLUMN = "actual_steer"
CONTROL_COLUMNS = (ACCEL_COLUMN, STEER_COLUMN)
REQUIRED_COLUMNS = (TIME_COLUMN, "ego_speed")
OPTIONAL_COLUMNS = (ACTION_COLUMN, *CONTROL_COLUMNS)
EXTRA_COLUMNS_FLAG = "--allow-extra-columns"

# unit -> (the schema unit it converts to, factor). Aliases are the spellings people write.
UNITS: dict[str, tuple[str, float]] = {
    "s": ("s", 1.0),
    "m/s": ("m/s", 1.0),
    "km/h": ("m/s", 1 / 3.6),
    "kph": ("m/s", 1 / 3.6),
    "mph": ("m/s", 0.44704),
    "m": ("m", 1.0),
    "ft": ("m", 0.3048),
    "m/s^2": ("m/s^2", 1.0),
    "m/s2": ("m/s^2", 1.0),
    "g": ("m/s^2", 9.80665),
    "rad": ("rad", 1.0),
    "deg": ("rad", math.pi / 180),
    "rad/s": ("rad/s", 1.0),
    "deg/s": ("rad/s", math.pi / 180),
    "1/m": ("1/m", 1.0),
    "bool": ("bool", 1.0),
}
# The unit each column is stored in (the schema's); actual_* follow sim.schema.CONTROLS.
COLUMN_UNITS: dict[str, str] = {
    TIME_COLUMN: "s",
    **{f.name: f.unit for f in FEATURES},
    **{f.name: f.unit for f in PLAN},
    ACCEL_COLUMN: "m/s^2",
    STEER_COLUMN: "rad",
}
# Rows are irregular when more than this share of intervals differ from the median by more than 10%.
IRREGULAR_SHARE = 0.05
_HEADER_NAME = re.compile(r"^\s*([^\[\]]+?)\s*(?:\[\s*([^\]]*?)\s*\])?\s*$")


class CsvImportError(ValueError):
    pass


@dataclass
class _Columns:
    index: dict[str, int]  # known column name -> position in the row
    units: dict[str, str]  # known column name -> declared unit (only where one was declared)
    extra: list[str]
    features: list[str]  # feature columns present, in FEATURE_NAMES order
    plan: bool


@dataclass
class CsvData:
    """The parsed file: values in the schema's units, NaN where a feature is missing or a cell empty."""

    lines: npt.NDArray[np.int64]  # the file line of each row
    time_s: npt.NDArray[np.float64]
    features: npt.NDArray[np.float64]  # (rows, N_FEATURES)
    plans: npt.NDArray[np.float64] | None  # (rows, N_PLAN)
    action: npt.NDArray[np.int64]  # -1: unknown (or no column)
    controls: npt.NDArray[np.float64]  # (rows, 2); NaN unknown
    columns: _Columns
    warnings: list[str] = field(default_factory=list)


def parse_units(text: str) -> dict[str, str]:
    """`ego_speed=km/h,lead_distance=ft` -> {"ego_speed": "km/h", "lead_distance": "ft"}."""
    units: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, unit = item.partition("=")
        if not sep or not name.strip() or not unit.strip():
            raise CsvImportError(f"--units: {item!r} is not NAME=UNIT (e.g. ego_speed=km/h,lead_distance=ft)")
        units[name.strip()] = unit.strip()
    return units


def _unit_error(path: Path, name: str, unit: str) -> CsvImportError:
    target = COLUMN_UNITS[name]
    choices = [u for u, (base, _) in UNITS.items() if base == target]
    return CsvImportError(
        f"{path}: line 1 (header), column '{name}': unit {unit!r} is not one this column can be converted from "
        f"(stored in {target}; accepted: {', '.join(choices)})"
    )


def _read_header(path: Path, header: list[str], allow_extra_columns: bool, units: Mapping[str, str]) -> _Columns:
    names: list[str] = []
    declared: dict[str, str] = {}
    for cell in header:
        found = _HEADER_NAME.match(cell)
        name = found.group(1) if found else cell.strip()
        names.append(name)
        if found and found.group(2) is not None:
            declared[name] = found.group(2)
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise CsvImportError(f"{path}: line 1 (header): column '{name}' appears twice")
        seen.add(name)
    missing = [name for name in REQUIRED_COLUMNS if name not in seen]
    if missing:
        raise CsvImportError(
            f"{path}: line 1 (header): missing column{'s' if len(missing) > 1 else ''} "
            f"{', '.join(repr(m) for m in missing)} (required: 'time' and 'ego_speed'; the other features, "
            f"the plan ({', '.join(PLAN_NAMES)}) and {', '.join(OPTIONAL_COLUMNS)} are optional)"
        )
    plan_present = [name for name in PLAN_NAMES if name in seen]
    if plan_present and len(plan_present) != len(PLAN_NAMES):
        absent = [name for name in PLAN_NAMES if name not in seen]
        raise CsvImportError(
            f"{path}: line 1 (header): plan column{'s' if len(absent) > 1 else ''} "
            f"{', '.join(repr(a) for a in absent)} missing: the plan columns come all together "
            f"({', '.join(PLAN_NAMES)}) or not at all"
        )
    if STEER_COLUMN in seen and ACCEL_COLUMN not in seen:
        raise CsvImportError(
            f"{path}: line 1 (header): missing column '{ACCEL_COLUMN}' ('{STEER_COLUMN}' needs '{ACCEL_COLUMN}'; "
            f"'{ACCEL_COLUMN}' alone is fine)"
        )
    extra = [name for name in names if name not in COLUMN_UNITS and name not in OPTIONAL_COLUMNS]
    if extra and not allow_extra_columns:
        raise CsvImportError(
            f"{path}: line 1 (header): unknown column{'s' if len(extra) > 1 else ''} "
            f"{', '.join(repr(e) for e in extra)} "
            f"(expected 'time', feature names, plan names and optionally {', '.join(OPTIONAL_COLUMNS)}; "
            f"{EXTRA_COLUMNS_FLAG} ignores unknown columns)"
        )
    for name, unit in units.items():
        if name not in seen:
            raise CsvImportError(f"{path}: line 1 (header): --units names column '{name}', which is not in the header")
        if name in declared and declared[name] != unit:
            raise CsvImportError(
                f"{path}: line 1 (header), column '{name}': the header says [{declared[name]}], --units says {unit}"
            )
    merged = {**declared, **units}
    for name, unit in merged.items():
        if name not in COLUMN_UNITS:
            if name in OPTIONAL_COLUMNS or not allow_extra_columns:
                raise CsvImportError(f"{path}: line 1 (header), column '{name}': has no unit to declare")
            continue
        if unit not in UNITS or UNITS[unit][0] != COLUMN_UNITS[name]:
            raise _unit_error(path, name, unit)
    index = {name: i for i, name in enumerate(names) if name not in extra}
    return _Columns(
        index,
        {n: u for n, u in merged.items() if n in index},
        extra,
        [n for n in FEATURE_NAMES if n in index],
        bool(plan_present),
    )


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


def _rows(path: Path, allow_extra_columns: bool, units: Mapping[str, str]) -> Iterator[tuple[int, list[str], _Columns]]:
    rows = csv_rows(path, CsvImportError)
    header = next(rows, (0, None))[1]
    while header is not None and not any(cell.strip() for cell in header):
        header = next(rows, (0, None))[1]
    if header is None:
        raise CsvImportError(f"{path}: empty file: expected a header row with 'time', 'ego_speed' and more")
    columns = _read_header(path, header, allow_extra_columns, units)
    for line, row in rows:
        if not any(cell.strip() for cell in row):
            continue  # blank lines (often a trailing one) carry nothing
        if len(row) != len(header):
            raise CsvImportError(f"{path}: line {line}: {len(row)} cells, the header has {len(header)}")
        yield line, row, columns


def read_csv(file: str | Path, allow_extra_columns: bool = False, units: Mapping[str, str] | None = None) -> CsvData:
    """Parse and validate the whole file into schema units."""
    path = Path(file)
    if not path.is_file():
        raise CsvImportError(f"{path}: no such file")
    lines: list[int] = []
    times: list[float] = []
    features: list[list[float]] = []
    plans: list[list[float]] = []
    actions: list[int] = []
    controls: list[tuple[float, float]] = []
    columns: _Columns | None = None
    missing: dict[str, list[int]] = {}  # column -> lines of its empty or NaN cells
    for line, row, columns in _rows(path, allow_extra_columns, units or {}):
        cells = {name: row[i].strip() for name, i in columns.index.items()}
        seconds = _number(path, line, TIME_COLUMN, cells[TIME_COLUMN])
        if times and seconds <= times[-1]:
            raise CsvImportError(
                f"{path}: line {line}, column 'time': {seconds!r} s is not after {times[-1]!r} s "
                f"(line {lines[-1]}); time must strictly increase"
            )
        values = _feature_values(path, line, cells, columns.features, missing)
        if columns.plan:
            plans.append([_number(path, line, name, cells[name]) for name in PLAN_NAMES])
        action = _action(path, line, cells[ACTION_COLUMN]) if cells.get(ACTION_COLUMN) else -1
        accel = _number(path, line, ACCEL_COLUMN, cells[ACCEL_COLUMN]) if cells.get(ACCEL_COLUMN) else math.nan
        steer = math.nan
        if cells.get(STEER_COLUMN):
            if math.isnan(accel):
                raise CsvImportError(
                    f"{path}: line {line}, column '{ACCEL_COLUMN}': empty while '{STEER_COLUMN}' is given"
                )
            steer = _number(path, line, STEER_COLUMN, cells[STEER_COLUMN])
        lines.append(line)
        times.append(seconds)
        features.append(values)
        actions.append(action)
        controls.append((accel, steer))
    if columns is None or not times:
        raise CsvImportError(f"{path}: no data rows after the header")
    data = CsvData(
        np.array(lines, dtype=np.int64),
        np.array(times),
        np.array(features, dtype=np.float64),
        np.array(plans, dtype=np.float64) if columns.plan else None,
        np.array(actions, dtype=np.int64),
        np.array(controls, dtype=np.float64).reshape(-1, 2),
        columns,
    )
    _convert_units(path, data)
    data.warnings.extend(_range_warnings(data))
    data.warnings.extend(
        f"column '{name}': {len(at)} empty or NaN cell(s), from line {at[0]}, imported as missing readings "
        f"(NaN): the controller takes a missing reading as invalid input at its tick, as it would live"
        for name, at in missing.items()
    )
    return data


_MISSING_CELLS = frozenset({"", "nan", "na", "n/a"})


def _feature_values(
    path: Path, line: int, cells: Mapping[str, str], features: Sequence[str], missing: dict[str, list[int]]
) -> list[float]:
    """A row's features in the schema's order (NaN: not a column). An empty or NaN cell is a sensor
    dropout, kept as a missing reading (its line noted in `missing`), except in ego_speed: every row's
    labels and a derived ego_accel come from it."""
    values = [math.nan] * N_FEATURES
    for name in features:
        cell = cells[name]
        if cell.lower() in _MISSING_CELLS:
            if name == "ego_speed":
                raise CsvImportError(
                    f"{path}: line {line}, column 'ego_speed': {cell or 'empty'}; every row needs ego_speed (the "
                    f"labels and a derived ego_accel come from it): fill it or drop the row"
                )
            missing.setdefault(name, []).append(line)
            continue
        values[FEATURE_INDEX[name]] = _number(path, line, name, cell)
    return values


def _convert_units(path: Path, data: CsvData) -> None:
    columns = data.columns
    for name in columns.features:
        unit = columns.units.get(name, COLUMN_UNITS[name])
        values = data.features[:, FEATURE_INDEX[name]]
        if name == "ego_speed" and unit == "m/s":
            _check_speed_plausible(path, name, values, data.lines)
        values *= UNITS[unit][1]
    if data.plans is not None:
        for k, name in enumerate(PLAN_NAMES):
            data.plans[:, k] *= UNITS[columns.units.get(name, COLUMN_UNITS[name])][1]
    for k, name in enumerate(CONTROL_COLUMNS):
        data.controls[:, k] *= UNITS[columns.units.get(name, COLUMN_UNITS[name])][1]


def _check_speed_plausible(
    path: Path, name: str, values: npt.NDArray[np.float64], lines: npt.NDArray[np.int64]
) -> None:
    wrong = implausible_speed(values)
    if wrong is not None:
        peak, what = wrong
        raise CsvImportError(
            f"{path}: line {int(lines[peak])}, column '{name}': {what}; "
            f"declare --units {name}=km/h (or a '{name}[km/h]' header)"
        )


def _range_warnings(data: CsvData) -> list[str]:
    """Values no sensor of that kind reports: kept (a real log's faults are what the checks are for, and
    replay judges them), but said at import, where a column's convention is still easy to fix."""
    out = []
    for name in data.columns.features:
        bad = out_of_range(name, data.features[:, FEATURE_INDEX[name]])
        if bad is not None:
            out.append(bad.text(f"column '{name}'", "row(s)", f"line {int(data.lines[bad.first])}"))
    return out


def _irregular_warning(times: npt.NDArray[np.float64], lines: npt.NDArray[np.int64]) -> str | None:
    intervals = np.diff(times)
    if len(intervals) < 2:
        return None
    median = float(np.median(intervals))
    off = np.abs(intervals - median) > 0.1 * median
    if np.mean(off) <= IRREGULAR_SHARE:
        return None
    first = int(np.flatnonzero(off)[0])
    return (
        f"irregular rows: {np.count_nonzero(off)} of {len(intervals)} intervals differ from the median "
        f"{median * 1e3:.1f} ms by more than 10% (first at line {int(lines[first + 1])}: "
        f"{intervals[first] * 1e3:.1f} ms); declare the sensor's rate with --rate-hz if it has one"
    )


def _source_details(path: Path, columns: _Columns, dataset: str | None) -> dict[str, str]:
    """The header's first details: the file, its ignored columns, the drive's site and declared units."""
    details = {"file": str(path), "ignored_columns": ",".join(columns.extra)}
    if dataset is not None:
        if not dataset.strip() or any(c in dataset for c in "(,"):
            raise CsvImportError(f"--dataset {dataset!r}: a name without '(' or ',' (it names the drive's site)")
        details["dataset"] = dataset.strip()
    if columns.units:
        details["units"] = ",".join(f"{n}={u}" for n, u in columns.units.items())
    return details


def _actual_actions(
    data: CsvData, t: npt.NDArray[np.float64], speed: npt.NDArray[np.float64], details: dict[str, str]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], bool]:
    """The action per row, its controls and whether the accel control is known; notes how in `details`.

    The file's action, else the band of the file's accel, else the look-ahead label of the speed.
    """
    columns = data.columns
    actions, controls = data.action.copy(), data.controls.copy()
    if ACTION_COLUMN in columns.index or ACCEL_COLUMN in columns.index:
        from_accel = (actions < 0) & np.isfinite(controls[:, 0])
        actions[from_accel] = label_from_accel(controls[from_accel, 0])
        given = [f"the file's {ACTION_COLUMN}"] if ACTION_COLUMN in columns.index else []
        given += [f"the band of {ACCEL_COLUMN}"] if ACCEL_COLUMN in columns.index else []
        details["actual_action"] = ", else ".join(given)
        return actions, controls, ACCEL_COLUMN in columns.index
    actions, controls[:, 0] = lookahead_labels(t, speed)
    details["actual_action"] = (
        f"lookahead_labels of ego_speed: band of (v(t + {LOOKAHEAD_S} s) - v(t)) / {LOOKAHEAD_S} s; "
        "controls[accel] = that look-ahead acceleration, steer NaN"
    )
    details[ACTUAL_CONTROLS_DETAIL] = "look-ahead acceleration label made from the speed profile, not a command"
    return actions, controls, True


def _derive_ego_accel(
    path: Path, data: CsvData, speed: npt.NDArray[np.float64], details: dict[str, str], warnings: list[str]
) -> npt.NDArray[np.bool_]:
    """Fill ego_accel from the speed where the file has none; the rows to keep (those where it could be derived)."""
    t, features = data.time_s, data.features
    features[:, FEATURE_INDEX["ego_accel"]] = backward_accel(t, speed)
    details["ego_accel"] = f"backward slope of ego_speed over {ACCEL_WINDOW_S} s (action_labels.backward_accel)"
    keep = np.isfinite(features[:, FEATURE_INDEX["ego_accel"]])
    if not keep.all():
        warnings.append(
            f"left out {np.count_nonzero(~keep)} row(s) where ego_accel has no past to be derived from "
            f"(the first row, rows after a hole over 1 s), from line {int(data.lines[np.argmin(keep)])}"
        )
    if not keep.any():
        raise CsvImportError(f"{path}: line {int(data.lines[0])}: too few rows to derive ego_accel from ego_speed")
    return keep


def _period_ns(path: Path, rate_hz: float | None, data: CsvData, details: dict[str, str], warnings: list[str]) -> int:
    """The observation period: the declared rate's, else the median interval of the time column."""
    t = data.time_s
    period_ns = int(np.median(np.diff(timestamps_ns(t)))) if len(t) > 1 else 0
    if rate_hz is not None:
        declared = round(1e9 / rate_hz)
        if period_ns and not 1 / RATE_MISMATCH <= declared / period_ns <= RATE_MISMATCH:
            raise CsvImportError(
                f"{path}: --rate-hz {rate_hz:g} declares a reading every {declared * 1e-6:g} ms, but the rows' "
                f"median interval is {period_ns * 1e-6:g} ms ({1e9 / period_ns:g} Hz): declare the rate of "
                f"the sensor that wrote these rows, or leave --rate-hz out to use the rows' own"
            )
        details["rate"] = f"{rate_hz:g} Hz, declared"
        return declared
    details["rate"] = "median interval of the time column"
    irregular = _irregular_warning(t, data.lines)
    if irregular:
        warnings.append(irregular)
    return period_ns


def _observations(
    data: CsvData,
    rows: npt.NDArray[np.intp],
    period_ns: int,
    actions: npt.NDArray[np.int64],
    controls: npt.NDArray[np.float64],
    known_controls: bool,
) -> Iterator[pb.Observation]:
    stamps = timestamps_ns(data.time_s)
    feats32 = data.features.astype(np.float32)
    plan_ids = _plan_ids(data.plans) if data.plans is not None else None
    valid_for = _plan_validity(plan_ids, rows, stamps, period_ns) if plan_ids is not None else None
    for seq, i in enumerate(rows, start=1):
        obs = pb.Observation(seq=seq, timestamp_ns=int(stamps[i]), features=feats32[i].tolist())
        if actions[i] >= 0 or (known_controls and np.isfinite(controls[i, 0])):
            obs.actual.CopyFrom(
                pb.ActualAction(
                    action_index=int(actions[i]),
                    controls=[float(c) for c in controls[i]] if np.isfinite(controls[i, 0]) else [],
                )
            )
        if data.plans is not None and plan_ids is not None and valid_for is not None:
            obs.plan.CopyFrom(
                pb.PlanUpdate(plan_id=plan_ids[i], values=data.plans[i].tolist(), valid_for_ns=valid_for[int(i)])
            )
        yield obs


def import_csv(
    file: str | Path,
    out_path: str | Path,
    *,
    session_id: str | None = None,
    allow_extra_columns: bool = False,
    units: Mapping[str, str] | None = None,
    rate_hz: float | None = None,
    start_time_unix_ns: int | None = None,
    dataset: str | None = None,
) -> ImportReport:
    """Convert a CSV drive log (columns above) into a dualloop log at `out_path`; `dataset`: the site or
    fleet it comes from (the header's `dataset` detail, which per-dataset reports and site calibration read)."""
    path, out_path = Path(file), Path(out_path)
    refuse_overwriting_inputs([out_path], [path], CsvImportError)
    if rate_hz is not None and not (math.isfinite(rate_hz) and rate_hz > 0):
        raise CsvImportError(f"--rate-hz must be a positive number of Hz, not {rate_hz}")
    data = read_csv(path, allow_extra_columns, units)
    columns, warnings = data.columns, list(data.warnings)
    t, speed = data.time_s, data.features[:, FEATURE_INDEX["ego_speed"]]
    details = _source_details(path, columns, dataset)
    actions, controls, known_controls = _actual_actions(data, t, speed, details)
    keep, present = np.ones(len(t), dtype=bool), list(columns.features)
    if "ego_accel" not in columns.features:
        keep = _derive_ego_accel(path, data, speed, details, warnings)
        present.append("ego_accel")
    period_ns = _period_ns(path, rate_hz, data, details, warnings)
    if warnings:
        details["warnings"] = "; ".join(warnings)

    measured = [n for n in FEATURE_NAMES if n in present]
    header = imported_header(
        session_id=session_id or f"csv-{path.stem}",
        source=f"csv import of {path}",
        measured=measured,
        observation_period_ns=period_ns,
        start_time_unix_ns=start_time_unix_ns,
        details=details,
    )
    rows = np.flatnonzero(keep)
    write_log(out_path, header, _observations(data, rows, period_ns, actions, controls, known_controls))
    lead = data.features[rows, FEATURE_INDEX["lead_present"]]
    kept_t = t[rows]
    return ImportReport(
        source=header.source,
        out_path=out_path,
        observations=len(rows),
        duration_s=float(kept_t[-1] - kept_t[0]),
        rate_hz=1e9 / period_ns if period_ns else 0.0,
        lead_present_fraction=float(np.mean(lead >= 0.5)) if "lead_present" in measured else 0.0,
        label_counts=count_labels(actions[rows]),
        measured_features=measured,
        filled_features=[],
        warnings=(
            [f"ignored unknown column{'s' if len(columns.extra) > 1 else ''} {', '.join(columns.extra)}"]
            if columns.extra
            else []
        )
        + warnings,
        session_id=header.session_id,
    )


def _plan_validity(
    plan_ids: list[str], rows: npt.NDArray[np.intp], stamps: npt.NDArray[np.int64], period_ns: int
) -> dict[int, int]:
    """Row -> valid_for_ns: a plan is in effect over the rows of its run and one interval beyond (a
    repeated id does not extend a plan, docs/contract.md#plans, so the first row must say how long)."""
    out: dict[int, int] = {}
    start = 0
    for k in range(1, len(rows) + 1):
        if k == len(rows) or plan_ids[rows[k]] != plan_ids[rows[start]]:
            span = int(stamps[rows[k - 1]] - stamps[rows[start]]) + max(period_ns, 1)
            out.update((int(r), span) for r in rows[start:k])
            start = k
    return out


def _plan_ids(plans: npt.NDArray[np.float64]) -> list[str]:
    """plan-1, plan-2, ...: a new id wherever the values change (the executor ignores a repeated id)."""
    changed = np.concatenate(([True], np.any(plans[1:] != plans[:-1], axis=1)))
    return [f"plan-{n}" for n in np.cumsum(changed)]
