"""Read dualloop logs (one MCAP file or a rotated series) and write whole logs synchronously.

The reader walks the file front to back (it never needs the index at the end), so a log whose
writer was killed reads up to its last complete chunk: `truncated` says the end was missing or
broken, `messages_read` how many records were recovered. Records come back in file order, which is
the order the recorder saw them (log_time can mix clocks in REALTIME sessions, see log.proto).
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import zstandard
from google.protobuf.message import DecodeError, Message
from mcap.exceptions import EndOfFile, McapError
from mcap.reader import make_reader
from mcap.records import Channel, Footer, Schema
from mcap.records import Message as McapMessage
from mcap.stream_reader import StreamReader

from dualloop.controller.logs.bulk import MAGIC, NotFast, read_messages
from dualloop.controller.logs.format import (
    FORMAT_VERSION,
    TOPIC_HEADER,
    TOPIC_OBSERVATION,
    TOPIC_PLAN,
    TOPIC_SNAPSHOT,
    TOPIC_SUMMARY,
    TOPIC_TYPES,
    LogFileWriter,
    rotated_files,
)
from dualloop.controller.logs.plot import PlotSchema, channel_metadata, log_time_offset_ns
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import log_pb2

# A corrupt length field must not make the reader try to allocate gigabytes.
_RECORD_SIZE_LIMIT = 256 * 1024 * 1024
# What reading a damaged MCAP file raises (a corrupt length beyond what an index holds: OverflowError)
MCAP_READ_ERRORS = (
    McapError,
    EOFError,
    ValueError,
    struct.error,
    zlib.error,
    zstandard.ZstdError,
    MemoryError,
    OverflowError,
)


class LogFileError(ValueError):
    """The file is not a dualloop log at all (wrong magic, unknown format version, no sessions)."""


# The MCAP metadata record `dualloop recover` writes when its input was cut: the file it writes is
# complete (footer, index), so without it the sessions that were open at the cut would read as whole
# drives. Keys: "source" (the cut file's name), "cut" (why reading stopped), "cut_sessions" (a JSON
# list of session keys, as read_sessions names them, that had not ended).
RECOVERED_METADATA = "dualloop.recovered"


def recovered_cuts(file: Path) -> dict[str, str]:
    """Session key -> why it is cut, for a file `dualloop recover` wrote from a cut log; {} for any
    other file. Read through the file's summary (a few records at its end); a file without one (cut
    itself) gives {}: its own truncation already marks every session."""
    try:
        with open(file, "rb") as stream:
            stream.seek(-len(MAGIC), 2)
            if stream.read(len(MAGIC)) != MAGIC:
                return {}
            stream.seek(0)
            reader = make_reader(stream, validate_crcs=True)
            summary = reader.get_summary()
            if summary is None or not any(m.name == RECOVERED_METADATA for m in summary.metadata_indexes):
                return {}
            marks = [m.metadata for m in reader.iter_metadata() if m.name == RECOVERED_METADATA]
    except (OSError, *MCAP_READ_ERRORS):
        return {}
    out: dict[str, str] = {}
    for mark in marks:
        why = (
            f"{file}: recovered by `dualloop recover` from {mark.get('source', 'a log')} cut short ({mark.get('cut')})"
        )
        for key in json.loads(mark.get("cut_sessions", "[]")):
            out[key] = f"{why}: session {key!r} was cut there"
    return out


def cut_log_error(truncation: str, verb: str) -> LogFileError:
    """Why a command refuses a log whose end is missing or broken (`truncation`: LogReader's, naming the
    file), and the flag that uses its complete part anyway: a cut drive read as if whole would report
    a third of a drive as the drive. `verb`: what the command does with it ("replay", "score", ...)."""
    return LogFileError(f"{truncation}; the drive may be cut short: {verb} its complete part with --allow-truncated")


def no_sessions_error(file: Path) -> LogFileError:
    """A log file that gave no session: said as what it is (empty, not MCAP, or an MCAP file without
    a dualloop session), since a command that went on would report nothing and succeed."""
    with open(file, "rb") as stream:
        start = stream.read(len(MAGIC))
    if not start:
        return LogFileError(f"{file}: empty file, not an MCAP log")
    if start != MAGIC:
        return LogFileError(f"{file}: not an MCAP log")
    return LogFileError(f"{file}: no sessions in it")


def check_sessions(file: Path, sessions: Iterable[LogData], allow_truncated: bool, verb: str) -> None:
    """The check of a command that reads `file` as whole drives (replay, eval-logs, stream): it has
    sessions, and it is complete unless `allow_truncated`."""
    sessions = list(sessions)
    if not sessions:
        raise no_sessions_error(file)
    cut = next((d.truncation for d in sessions if d.truncated), "")
    if cut and not allow_truncated:
        raise cut_log_error(cut, verb)


def check_log_file(file: Path, allow_truncated: bool, verb: str) -> None:
    """check_sessions for a command that reads the file elsewhere (eval-logs' rows): one pass over the
    bytes of a complete, clean file (bulk.read_messages: CRCs checked, nothing decoded, ~10% of
    reading its sessions); a damaged one is read by LogReader, which says where it broke."""
    try:
        channels, messages = read_messages(file)
    except NotFast:
        reader = LogReader([file])
        if not sum(1 for _ in reader):
            raise no_sessions_error(file) from None
        if reader.truncated and not allow_truncated:
            raise cut_log_error(reader.truncation, verb) from None
        return
    ours = {channel_id for channel_id, (topic, _) in channels.items() if topic in TOPIC_TYPES}
    if not any(channel_id in ours for channel_id, _, _ in messages):
        raise no_sessions_error(file)
    cut = recovered_cuts(file)  # complete, but recovered from a cut log: its open sessions were cut
    if cut and not allow_truncated:
        raise cut_log_error(next(iter(cut.values())), verb)


@dataclass(frozen=True, slots=True)
class LogRecord:
    topic: str
    session_id: str
    log_time_ns: int
    message: Message
    file: Path


@dataclass
class LogData:
    """One session of a log, in file order."""

    header: log_pb2.SessionHeader
    observations: list[pb.Observation] = field(default_factory=list)
    snapshots: list[pb.DecisionSnapshot] = field(default_factory=list)
    plans: list[log_pb2.PlanRecord] = field(default_factory=list)
    summary: log_pb2.SessionSummary | None = None
    files: list[Path] = field(default_factory=list)
    # True when a file of the log ended without its footer (writer killed) or in a broken record.
    truncated: bool = False
    truncation: str = ""  # which file and why, for people
    messages_read: int = 0  # records recovered across the whole log, all sessions
    instance: int = 1  # 2, 3, ...: the id opened again after its earlier sessions closed

    @property
    def session_id(self) -> str:
        return self.header.session_id

    @property
    def name(self) -> str:
        """The session's key in its log (read_sessions): its id, or `id#2`, ... for an id opened again."""
        return self.session_id if self.instance == 1 else f"{self.session_id}#{self.instance}"


def resolve_log_paths(path: str | Path | Iterable[str | Path]) -> list[Path]:
    """A file, a list of files, or the stem of a rotated series (`runs/x.mcap` -> x-0000.mcap ...)."""
    if isinstance(path, (str, Path)):
        single = Path(path)
        if single.is_file():
            return [single]
        parts = rotated_files(single)
        if parts:
            return parts
        raise FileNotFoundError(f"{single}: no such log (nor rotated parts {single.stem}-NNNN.mcap)")
    paths = [Path(p) for p in path]
    if not paths:
        raise FileNotFoundError("no log files given")
    return paths


class LogReader:
    """Iterate the records of a log; after (or during) iteration, `truncated`, `truncation` and
    `messages_read` say how much was recovered."""

    def __init__(self, path: str | Path | Iterable[str | Path]) -> None:
        self.files = resolve_log_paths(path)
        self.truncated = False
        self.truncation = ""
        self.messages_read = 0
        self.skipped_topics: dict[str, int] = {}

    def __iter__(self) -> Iterator[LogRecord]:
        for file in self.files:
            yield from self._read_file(file)

    def _read_file(self, file: Path) -> Iterator[LogRecord]:
        channels: dict[int, tuple[str, str]] = {}
        saw_footer = False
        with open(file, "rb") as stream:
            records = StreamReader(stream, validate_crcs=True, record_size_limit=_RECORD_SIZE_LIMIT).records
            try:
                for record in records:
                    if isinstance(record, Channel):
                        channels[record.id] = (record.topic, record.metadata.get("session_id", ""))
                    elif isinstance(record, McapMessage):
                        decoded = self._decode(file, channels, record)
                        if decoded is not None:
                            self.messages_read += 1
                            yield decoded
                    elif isinstance(record, Footer):
                        saw_footer = True
                    elif isinstance(record, Schema):
                        continue
            except (DecodeError, *MCAP_READ_ERRORS) as exc:
                if self.messages_read == 0 and _is_not_mcap(exc):
                    raise LogFileError(f"{file}: not an MCAP file ({exc})") from exc
                if isinstance(exc, EndOfFile):  # mid-record or between records: the tail is missing
                    self._mark_truncated(
                        file,
                        f"file ends without its footer after {self.messages_read} messages "
                        "(the writer did not finish: killed or still running)",
                    )
                else:
                    self._mark_truncated(
                        file, f"broken record after {self.messages_read} messages ({type(exc).__name__}: {exc})"
                    )
                return
        if not saw_footer:
            self._mark_truncated(
                file,
                f"file ends without its footer after {self.messages_read} messages "
                "(the writer did not finish: killed or still running)",
            )

    def _mark_truncated(self, file: Path, why: str) -> None:
        self.truncated = True
        self.truncation += ("; " if self.truncation else "") + f"{file}: {why}"

    def _decode(self, file: Path, channels: dict[int, tuple[str, str]], record: McapMessage) -> LogRecord | None:
        topic, session_id = channels.get(record.channel_id, ("", ""))
        message_type = TOPIC_TYPES.get(topic)
        if message_type is None:  # someone else's topic in the same file: not ours to interpret
            self.skipped_topics[topic] = self.skipped_topics.get(topic, 0) + 1
            return None
        message = message_type()
        message.ParseFromString(record.data)
        return LogRecord(topic, session_id, record.log_time, message, file)


def _is_not_mcap(exc: Exception) -> bool:
    return "magic" in str(exc).lower()


# (topic, session id, message, file): what read_sessions takes of a record
_Entry = tuple[str, str, Message, Path]


def _fast_records(files: list[Path]) -> list[_Entry] | None:
    """The records of one complete, clean file, read in one pass over its bytes (bulk.read_messages:
    ~10x less Python per message than the mcap StreamReader), as plain tuples (a LogRecord per
    message cost as much as parsing it); None for anything else (several files, a missing footer,
    a broken record), which LogReader then reads and reports on."""
    if len(files) != 1:
        return None
    file = files[0]
    try:
        channels, messages = read_messages(file)
        # per channel once: its topic, session and parser; someone else's topic: not ours to interpret
        parsers = {
            channel_id: (topic, session_id, TOPIC_TYPES[topic].FromString)
            for channel_id, (topic, session_id) in channels.items()
            if topic in TOPIC_TYPES
        }
        records = []
        for channel_id, _, data in messages:
            known = parsers.get(channel_id)
            if known is not None:
                records.append((known[0], known[1], known[2](data), file))
        return records
    except (NotFast, DecodeError, OSError):
        return None


def read_sessions(path: str | Path | Iterable[str | Path]) -> dict[str, LogData]:
    """Every session in the log, in order of first appearance. An id a client opened again after
    closing it is another session, keyed `id#2`, `id#3`, ... (its header's session_id is the id)."""
    files = resolve_log_paths(path)
    fast = _fast_records(files)
    reader = LogReader(files)
    sessions: dict[str, LogData] = {}
    entries = fast if fast is not None else ((r.topic, r.session_id, r.message, r.file) for r in reader)
    instances: dict[str, str] = {}  # session id -> the key of its latest instance
    for topic, session_id, message, file in entries:
        key = instances.get(session_id, session_id)
        data = sessions.get(key)
        instance = 1 if data is None else data.instance
        if data is not None and data.summary is not None and topic in (TOPIC_HEADER, TOPIC_OBSERVATION):
            # after its summary an id is a session opened again (seq from 1, perhaps other settings);
            # a snapshot there is the closed one's last (older recordings of a DriveAgents leave)
            instance += 1
            key = instances[session_id] = f"{session_id}#{instance}"
            if topic != TOPIC_HEADER:  # a recorder before this one wrote no header for it: the first's
                data = sessions[key] = LogData(header=data.header, instance=instance)
            else:
                data = None
        if data is None:
            if topic != TOPIC_HEADER:
                header = log_pb2.SessionHeader(session_id=session_id, source="unknown (no header)")
            else:
                header = cast(log_pb2.SessionHeader, message)  # the topic says which message it is
                if header.format_version > FORMAT_VERSION:
                    raise LogFileError(
                        f"{file}: log format version {header.format_version} is newer "
                        f"than this dualloop reads ({FORMAT_VERSION})"
                    )
            data = sessions[key] = LogData(header=header, instance=instance)
        if file not in data.files:
            data.files.append(file)
        if topic == TOPIC_OBSERVATION:
            data.observations.append(cast(pb.Observation, message))
        elif topic == TOPIC_SNAPSHOT:
            data.snapshots.append(cast(pb.DecisionSnapshot, message))
        elif topic == TOPIC_PLAN:
            data.plans.append(cast(log_pb2.PlanRecord, message))
        elif topic == TOPIC_SUMMARY:
            data.summary = cast(log_pb2.SessionSummary, message)
        # repeated headers (one per rotated file) carry only a different `part`: the first one stands
    read = len(fast) if fast is not None else reader.messages_read
    cuts = {key: why for file in files for key, why in recovered_cuts(file).items()}
    for key, data in sessions.items():
        data.truncated, data.truncation, data.messages_read = reader.truncated, reader.truncation, read
        if not data.truncated and key in cuts:  # a recovered log: whole as a file, this session cut
            data.truncated, data.truncation = True, cuts[key]
    return sessions


def read_log(path: str | Path | Iterable[str | Path], session_id: str | None = None) -> LogData:
    """The one session of a log (or the named one, when the log holds several)."""
    files = resolve_log_paths(path)
    sessions = read_sessions(files)
    where = ", ".join(str(p) for p in files)
    if session_id is not None:
        if session_id not in sessions:
            raise LogFileError(f"{where}: no session {session_id!r} (sessions: {', '.join(sessions) or 'none'})")
        return sessions[session_id]
    if not sessions and len(files) == 1:
        raise no_sessions_error(Path(files[0]))
    if len(sessions) != 1:
        raise LogFileError(f"{where}: {len(sessions)} sessions ({', '.join(sessions) or 'none'}); name one")
    return next(iter(sessions.values()))


def write_log(
    path: str | Path,
    header: log_pb2.SessionHeader,
    observations: Iterable[pb.Observation],
    snapshots: Iterable[pb.DecisionSnapshot] = (),
    plans: Iterable[log_pb2.PlanRecord] = (),
    plots: bool = False,
) -> Path:
    """Write one session as a finished log file: header, then observations, snapshots and plans,
    each group in the order given, then (plots) a plot message per snapshot on the session's plot
    topic (plot.py). For importers and tests; live sessions use the Recorder."""
    out = Path(path)
    session_id = header.session_id
    if not header.format_version:
        header.format_version = FORMAT_VERSION
    file = LogFileWriter(out)
    try:
        observations = iter(observations)
        first = next(observations, None)
        file.write(TOPIC_HEADER, session_id, header, first.timestamp_ns if first is not None else 0)
        observations_kept: dict[int, pb.Observation] = {}
        kept: list[pb.DecisionSnapshot] = []
        if first is not None:
            file.write(TOPIC_OBSERVATION, session_id, first, first.timestamp_ns)
            observations_kept[first.seq] = first
        for obs in observations:
            file.write(TOPIC_OBSERVATION, session_id, obs, obs.timestamp_ns)
            if plots:
                observations_kept[obs.seq] = obs
        for snap in snapshots:
            file.write(TOPIC_SNAPSHOT, session_id, snap, snap.scheduled_time_ns)
            if plots:
                kept.append(snap)
        for plan in plans:
            file.write(TOPIC_PLAN, session_id, plan, plan.created_time_ns)
        if plots and kept:
            _write_plots(file, header, observations_kept, kept)
    finally:
        file.finish()
    return out


def _write_plots(
    file: LogFileWriter,
    header: log_pb2.SessionHeader,
    observations: dict[int, pb.Observation],
    snapshots: list[pb.DecisionSnapshot],
) -> None:
    """The plot topic of a LOCKSTEP session written whole: log_time = tick time + offset (plot.py)."""
    schema = PlotSchema.for_header(header)
    offset = log_time_offset_ns(header, snapshots[0].scheduled_time_ns)
    metadata = channel_metadata(header, offset)
    for snap in snapshots:
        data = schema.from_snapshot(snap, observations.get(snap.observation_seq)).SerializeToString()
        file.write_plot(schema, metadata, data, snap.scheduled_time_ns + offset)
