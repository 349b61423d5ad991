"""Import an OpenACC car-following file (JRC; AstaZero, ZalaZone, Vicolungo and Cherasco campaigns) as dualloop
sessions.

Two layouts are recognised from the first row:

- AstaZero `_new` (lightly derived files, header on line 1): Time, Speed1, E1, N1, Speed2, E2, N2,
  IVS1, A1, A2. Vehicle 2, a human driver, follows vehicle 1 (the lead car, under ACC);
- JRC original (ZalaZone, Vicolungo, Cherasco, and AstaZero before derivation): 5 metadata rows (Date, Vehicle_order,
  Number_of_vehicles, ACC, Distance_setting), then the header Time, Speed{k}, E{k}, ..., IVS{k}
  (the gap between vehicle k and vehicle k+1 behind it), optionally Driver{k} ("Human"/"ACC").

Every pair (k, k+1) with Speed{k}, Speed{k+1} and IVS{k} columns becomes one or more sessions
`<file stem>-v{k+1}-follows-v{k}` (controller/logs/following.py: features, labels, pieces). Only
human followers: a file whose metadata says ACC,1 (the whole run under ACC) is refused, and rows whose
Driver{k+1} is not "Human" are not usable. A_k (the AstaZero files' unsmoothed finite differences)
are not used: ego_accel is the causal backward slope of the follower's speed, as for every import.
"""

from __future__ import annotations

import csv
import itertools
import math
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dualloop.controller.logs.csv_text import csv_rows
from dualloop.controller.logs.following import FollowingPair, output_path, pair_sessions, write_pairs
from dualloop.controller.logs.import_report import ImportReport
from dualloop.controller.logs.outputs import refuse_overwriting_inputs

OBSERVATION_PERIOD_NS = 100_000_000  # JRC downsampled every campaign to 10 Hz
OPENACC_URL = "http://data.europa.eu/89h/9702c950-c80f-4d2f-982f-44d06ea0009f"
# The attribution lines the datasets' READMEs ask to keep with any derivative (CC BY 4.0).
ATTRIBUTION_JRC = (
    f"Contains data from the OpenACC database, (c) European Union / European Commission, Joint Research Centre "
    f"(JRC), {OPENACC_URL}, licensed under CC BY 4.0 (https://creativecommons.org/licenses/by/4.0/). "
    "Makridis et al., Transp. Res. Part C 125 (2021) 103047."
)
ATTRIBUTION_ASTAZERO_NEW = (
    f"Contains data derived from the OpenACC database, (c) European Union / European Commission, Joint Research "
    f"Centre (JRC), {OPENACC_URL}, CC BY 4.0. Changes: column subset and finite-difference accelerations "
    "(by K. Long, github.com/Keke-Long/PERL_planning)."
)
CHANGES = (
    "converted to dualloop logs: per follower pair, gap and speeds kept, ego_accel and look-ahead labels "
    "derived from the follower's speed, other features NaN"
)
METADATA_ROWS = 5
ASTAZERO_NEW_COLUMNS = ("Time", "Speed1", "Speed2", "IVS1")


class OpenAccError(ValueError):
    pass


@dataclass
class OpenAccFile:
    path: Path
    layout: str  # "astazero-new" or "jrc"
    campaign: str  # "AstaZero", "ZalaZone", "Vicolungo", "Cherasco" or "unknown"
    vehicles: dict[int, str]  # vehicle number -> name from Vehicle_order (empty for astazero-new)
    pairs: list[FollowingPair]


def _cell(path: Path, line: int, column: str, text: str) -> float:
    text = text.strip()
    if not text:
        return math.nan  # no valid fix at that instant
    try:
        value = float(text)
    except ValueError:
        raise OpenAccError(f"{path}: line {line}, column '{column}': {text!r} is not a number") from None
    if not math.isfinite(value):
        raise OpenAccError(f"{path}: line {line}, column '{column}': {text!r} is not a finite number")
    return value


def _campaign(path: Path) -> str:
    name = path.name.lower()
    if name.startswith("asta"):
        return "AstaZero"
    if name.startswith("handling") or "zala" in name:
        return "ZalaZone"
    # JRC's own names: JRC-VC_<date>... (Vicolungo), JRC-Cher_<date>... or Cher-JRC_... (Cherasco)
    if re.match(r"(jrc-)?vc[-_]", name) or "vicolungo" in name:
        return "Vicolungo"
    if re.match(r"(jrc-)?cher[-_]", name) or "cherasco" in name:
        return "Cherasco"
    return "unknown"


def _layout(path: Path, rows: list[list[str]]) -> tuple[str, int, dict[str, list[str]]]:
    """(layout, line of the header row, metadata) from the first rows of a file."""
    if not rows:
        raise OpenAccError(f"{path}: empty file")
    first = [c.strip() for c in rows[0]]
    if first and first[0] == "Time":
        missing = [c for c in ASTAZERO_NEW_COLUMNS if c not in first]
        if missing:
            raise OpenAccError(
                f"{path}: line 1 (header): missing column{'s' if len(missing) > 1 else ''} "
                f"{', '.join(repr(m) for m in missing)} (an AstaZero _new file has {', '.join(ASTAZERO_NEW_COLUMNS)})"
            )
        return "astazero-new", 1, {}
    if first and first[0] == "Date":
        meta = {r[0].strip(): [c.strip() for c in r[1:] if c.strip()] for r in rows[:METADATA_ROWS] if r}
        if len(rows) <= METADATA_ROWS or not rows[METADATA_ROWS] or rows[METADATA_ROWS][0].strip() != "Time":
            raise OpenAccError(
                f"{path}: line {METADATA_ROWS + 1}: expected the header row starting with 'Time' after "
                f"{METADATA_ROWS} metadata rows (Date, Vehicle_order, Number_of_vehicles, ACC, Distance_setting)"
            )
        if meta.get("ACC") == ["1"]:
            raise OpenAccError(
                f"{path}: line 4, column 2: ACC,1 says the whole run was driven with ACC: no human follower to import"
            )
        return "jrc", METADATA_ROWS + 1, meta
    raise OpenAccError(
        f"{path}: line 1, column 1: {first[0] if first else ''!r}: not an OpenACC file (expected 'Time' for an "
        f"AstaZero _new file, or 'Date' and {METADATA_ROWS} metadata rows for a JRC file)"
    )


def _pair_numbers(header: list[str]) -> list[tuple[int, int]]:
    """(leader k, follower k+1) for every IVS{k} whose two vehicles have a Speed column."""
    speeds = {int(m.group(1)) for name in header if (m := re.fullmatch(r"Speed(\d+)", name))}
    gaps = sorted(int(m.group(1)) for name in header if (m := re.fullmatch(r"IVS(\d+)", name)))
    return [(k, k + 1) for k in gaps if k in speeds and k + 1 in speeds]


def pair_session_id(stem: str, leader: int, follower: int) -> str:
    return f"{stem}-v{follower}-follows-v{leader}"


@dataclass(frozen=True)
class OpenAccPair:
    session_id: str
    leader: str  # the vehicle's name in Vehicle_order, or "v<k>" when the file does not name it
    follower: str


def describe_openacc(file: str | Path) -> list[OpenAccPair]:
    """The follower pairs of a file from its first rows only (for the train/held-out split)."""
    path = Path(file)
    try:  # the first rows only: a file can be large
        with open(path, newline="", encoding="utf-8-sig") as stream:
            rows = list(itertools.islice(csv.reader(stream), METADATA_ROWS + 1))
    except (UnicodeDecodeError, csv.Error) as err:
        raise OpenAccError(f"{path}: not a UTF-8 CSV file ({err})") from None
    layout, header_line, meta = _layout(path, rows)
    header = [c.strip() for c in rows[header_line - 1]]
    order = meta.get("Vehicle_order", [])

    def name(k: int) -> str:
        return order[k - 1] if k <= len(order) else f"v{k}"

    return [OpenAccPair(pair_session_id(path.stem, k, j), name(k), name(j)) for k, j in _pair_numbers(header)]


def read_openacc(file: str | Path) -> OpenAccFile:
    """Parse an OpenACC CSV into its follower pairs (NaN where a cell is empty)."""
    path = Path(file)
    if not path.is_file():
        raise OpenAccError(f"{path}: no such file")
    rows = [row for _, row in csv_rows(path, OpenAccError)]
    layout, header_line, meta = _layout(path, rows)
    header = [c.strip() for c in rows[header_line - 1]]
    data = rows[header_line:]
    for r, row in enumerate(data):  # a cut or padded row is a damaged file, not empty cells (as import csv)
        if len(row) != len(header):
            raise OpenAccError(f"{path}: line {header_line + 1 + r}: {len(row)} cells, the header has {len(header)}")
    index = {name: i for i, name in enumerate(header)}

    def column(name: str) -> np.ndarray:
        i = index[name]
        return np.array(
            [_cell(path, header_line + 1 + r, name, row[i] if i < len(row) else "") for r, row in enumerate(data)],
            dtype=np.float64,
        )

    t = column("Time")
    if len(t) < 2:
        raise OpenAccError(f"{path}: fewer than two data rows")
    bad = np.flatnonzero(~(np.diff(t) > 0))  # NaN compares false: an empty time cell lands here too
    if len(bad):
        r = int(bad[0]) + 1
        raise OpenAccError(
            f"{path}: line {header_line + 1 + r}, column 'Time': {data[r][0]!r} is not after the previous row's "
            f"{data[r - 1][0]!r}; time must strictly increase"
        )
    order = meta.get("Vehicle_order", [])
    vehicles = {k + 1: name for k, name in enumerate(order)}
    pairs: list[FollowingPair] = []
    for k, j in _pair_numbers(header):  # a gap without both speeds gives no relative speed
        ego = column(f"Speed{j}")
        driver = f"Driver{j}"
        if driver in index:
            human = np.array([(row[index[driver]] if index[driver] < len(row) else "").strip() for row in data])
            ego[human != "Human"] = np.nan
        pairs.append(
            FollowingPair(
                session_id=pair_session_id(path.stem, k, j),
                t_s=t,
                ego_speed=ego,
                lead_speed=column(f"Speed{k}"),
                gap=column(f"IVS{k}"),
                details={
                    "pair": f"vehicle {j} ({vehicles.get(j, 'human driver')}) follows vehicle {k} "
                    f"({vehicles.get(k, 'lead car under ACC' if layout == 'astazero-new' else 'unknown')})",
                    "ego_speed": f"Speed{j}: GNSS Doppler speed of the follower (m/s)",
                    "lead_distance": f"IVS{k}: bumper-to-bumper gap from differential GNSS (JRC), m",
                },
            )
        )
    if not pairs:
        raise OpenAccError(
            f"{path}: line {header_line} (header): no follower pair with Speed{{k}}, Speed{{k+1}}, IVS{{k}}"
        )
    return OpenAccFile(path, layout, _campaign(path), vehicles, pairs)


def pair_outputs(
    pairs: Iterable[FollowingPair], out: Path | None, stem: str, only: Collection[str] | None
) -> list[Path]:
    """The files write_pairs will write for these pairs (its pieces, its names), known before any is
    written, so that an output landing on the input is refused before anything is lost."""
    ids = [sid for pair in pairs if only is None or pair.session_id in only for sid, _ in pair_sessions(pair)]
    return [output_path(out, sid, stem, len(ids)) for sid in ids]


def import_openacc(
    file: str | Path,
    out: str | Path | None = None,
    *,
    only: Collection[str] | None = None,
    start_time_unix_ns: int | None = None,
) -> list[ImportReport]:
    """Import every human follower pair of an OpenACC file (or the pairs whose session id, before any
    piece suffix, is in `only`); `out` as in following.output_path. One report per written session."""
    parsed = read_openacc(file)
    out_path = Path(out) if out is not None else None
    planned = pair_outputs(parsed.pairs, out_path, parsed.path.stem, only)
    refuse_overwriting_inputs(planned, [parsed.path], OpenAccError)
    attribution = ATTRIBUTION_ASTAZERO_NEW if parsed.layout == "astazero-new" else ATTRIBUTION_JRC
    details = {
        "dataset": f"OpenACC {parsed.campaign} (JRC), human car-following, {parsed.layout} layout",
        "licence": f"CC BY 4.0. {attribution} Changes: {CHANGES}.",
        "file": parsed.path.name,
    }
    if parsed.vehicles:
        details["vehicle_order"] = ",".join(parsed.vehicles.values())
    return write_pairs(
        parsed.pairs,
        out_path,
        parsed.path.stem,
        only=only,
        source=lambda pair: f"openacc import of {parsed.path} ({pair.session_id.removeprefix(parsed.path.stem + '-')})",
        details=details,
        observation_period_ns=OBSERVATION_PERIOD_NS,
        start_time_unix_ns=start_time_unix_ns,
    )
