"""A Foxglove layout for dualloop recordings: one tab per session, plots of its plot topic (plot.py).

Foxglove message paths name a topic, so a layout is made for given sessions; `make demo` writes one
beside its report for its sessions, and docs/foxglove/dualloop-layout.json is this layout for the
demo's sessions at its default seed (a test keeps the two equal, and checks every path against a
recording). Panel ids are derived from the session and the panel, so the file is reproducible.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mcap.exceptions import EndOfFile
from mcap.records import Channel
from mcap.stream_reader import StreamReader

from dualloop.controller.logs.bulk import MAGIC
from dualloop.controller.logs.logfile import MCAP_READ_ERRORS, LogFileError, resolve_log_paths
from dualloop.controller.logs.outputs import prepare_output_file, refuse_overwriting_inputs
from dualloop.controller.logs.plot import is_plot_topic, plot_topic

# (title, [(field path, label)]) per plot panel, from the plot message's fields
PLOTS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("speed m/s, accel m/s^2", (("speed", "speed"), ("accel", "measured accel"))),
    ("accel command: proposed vs applied", (("proposed.accel", "proposed"), ("applied.accel", "applied"))),
    ("lead gap m, TTC s", (("gap", "gap"), ("ttc_s", "TTC"))),
    (
        "gate: score vs threshold",
        (
            ("gate_score", "score"),
            ("gate_threshold", "threshold"),
            ("checks.input_density.score", "input density"),
            ("checks.input_density.threshold", "input density threshold"),
        ),
    ),
)
STATES: tuple[tuple[str, str], ...] = (
    ("safety_state", "safety state"),
    ("proposed_action", "proposed"),
    ("applied_action", "applied"),
    ("reasons.OOD_VETO", "OOD veto"),
    ("reasons.LOW_MARGIN", "low margin"),
    ("reasons.STALE_OBSERVATION", "stale observation"),
    ("reasons.FALLBACK", "fallback"),
)


def _id(kind: str, session_id: str, name: str) -> str:
    return f"{kind}!{hashlib.sha256(f'{session_id}/{name}'.encode()).hexdigest()[:8]}"


def _split(first: Any, second: Any, direction: str, percent: float = 50.0) -> dict[str, Any]:
    return {"first": first, "second": second, "direction": direction, "splitPercentage": percent}


def _session(config: dict[str, Any], session_id: str) -> dict[str, Any]:
    """The panels of one session, added to `config`; returns the tab's layout tree."""
    topic = plot_topic(session_id)
    plots = []
    for title, paths in PLOTS:
        panel = _id("Plot", session_id, title)
        config[panel] = {
            "title": title,
            "paths": [
                {"value": f"{topic}.{path}", "label": label, "enabled": True, "timestampMethod": "receiveTime"}
                for path, label in paths
            ],
            "showLegend": True,
            "legendDisplay": "floating",
            "showXAxisLabels": True,
            "showYAxisLabels": True,
            "isSynced": True,
            "xAxisVal": "timestamp",
        }
        plots.append(panel)
    states = _id("StateTransitions", session_id, "states")
    config[states] = {
        "paths": [
            {"value": f"{topic}.{path}", "label": label, "timestampMethod": "receiveTime"} for path, label in STATES
        ],
        "isSynced": True,
    }
    raw = _id("RawMessages", session_id, "raw")
    config[raw] = {"topicPath": topic, "diffEnabled": False, "expansion": "all"}
    left = _split(_split(plots[0], plots[1], "column"), _split(plots[2], plots[3], "column"), "column")
    right = _split(states, raw, "column", 40.0)
    return _split(left, right, "row", 65.0)


def layout(session_ids: Sequence[str]) -> dict[str, Any]:
    """A Foxglove layout (File > Import layout) with a tab per session."""
    if not session_ids:
        raise ValueError("a layout needs at least one session")
    config: dict[str, Any] = {}
    tabs = [{"title": session_id, "layout": _session(config, session_id)} for session_id in session_ids]
    tab_panel = _id("Tab", "", "sessions")
    config[tab_panel] = {"activeTabIdx": 0, "tabs": tabs}
    return {
        "configById": config,
        "globalVariables": {},
        "userNodes": {},
        "playbackConfig": {"speed": 1},
        "layout": tab_panel,
    }


def layout_paths(data: dict[str, Any]) -> list[str]:
    """Every message path (and raw-message topic) the layout's panels read."""
    out: list[str] = []
    for panel in data["configById"].values():
        out += [p["value"] for p in panel.get("paths", [])]
        if "topicPath" in panel:
            out.append(panel["topicPath"])
    return out


def recording_files(paths: Sequence[Path]) -> list[Path]:
    """The files of these recordings: a file as given, or the base name of a rotated recording as its
    parts (resolve_log_paths, as replay and diff take it). LogFileError naming a path that is neither."""
    files: list[Path] = []
    for path in paths:
        if path.exists():  # a folder too: plot_sessions names why it cannot be read
            files.append(path)
            continue
        try:
            files += resolve_log_paths(path)
        except FileNotFoundError:
            raise LogFileError(f"{path}: recording not found (nor rotated parts of it)") from None
    return files


def check_layout_out(out: Path, recordings: Sequence[Path], flag: str = "-o") -> None:
    """Refuse a layout path that is a recording given, or any MCAP file (by name or content): the
    JSON would replace a log that cannot be made again. Make its folder when missing (as replay
    --json), and refuse, naming `flag`, a path the layout cannot be written to (a folder in its place,
    a file in place of a folder above it, a folder that cannot be made or written). A LogFileError,
    one line naming the path."""
    refuse_overwriting_inputs([out], recordings, LogFileError)
    if out.suffix.lower() == ".mcap" or _starts_with_mcap_magic(out):
        raise LogFileError(
            f"{out}: an MCAP log (by name or content), not a layout: give a .json name, e.g. layout.json"
        )
    prepare_output_file(out, flag, LogFileError)


def _starts_with_mcap_magic(path: Path) -> bool:
    try:
        with open(path, "rb") as stream:
            return stream.read(len(MAGIC)) == MAGIC
    except OSError:  # missing, a folder: not a log to protect (writing reports its own error)
        return False


def plot_sessions(paths: Sequence[Path]) -> list[str]:
    """The sessions with a plot topic in these recordings (files, or rotated ones' base names), in order
    of first appearance (read up to where a file ends, so a recording still being written or cut short
    works too). LogFileError (a ValueError) naming the file when it is missing, or unreadable before any
    plot topic."""
    sessions: dict[str, None] = {}
    for path in recording_files(paths):
        try:
            stream = open(path, "rb")
        except FileNotFoundError:
            raise LogFileError(f"{path}: recording not found") from None
        except OSError as err:  # a folder, no permission: the reason without the [Errno N] prefix
            raise LogFileError(f"{path}: cannot read the recording: {err.strerror or err}") from None
        with stream:
            try:
                for record in StreamReader(stream, skip_magic=False).records:
                    if isinstance(record, Channel) and is_plot_topic(record.topic):
                        sessions.setdefault(record.metadata.get("session_id", record.topic.split("/")[2]), None)
            except MCAP_READ_ERRORS as err:  # struct.error too: a file cut inside a record's fields
                if not sessions:
                    raise LogFileError(_unreadable(path, err)) from err
    return list(sessions)


def _unreadable(path: Path, err: Exception) -> str:
    """Why a recording gave no plot topic before it broke: empty, not MCAP, or cut short."""
    if path.stat().st_size == 0:
        return f"{path}: empty file, not an MCAP log"
    if isinstance(err, (EndOfFile, EOFError, struct.error)):
        return f"{path}: truncated log: it ends inside a record before any plot topic (cut short, or still written)"
    return f"{path}: not a readable MCAP file ({type(err).__name__}: {err})"
