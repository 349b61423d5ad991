"""The log file format (proto/dualloop/v2/log.proto): topics, message types, and one MCAP file writer.

Shared by the background recorder (controller/logs/recorder.py) and the synchronous writer and reader
(controller/logs/logfile.py), so both agree on topic names, schemas and channel layout by construction.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from google.protobuf.message import Message
from mcap.writer import CompressionType
from mcap.writer import Writer as McapWriter
from mcap_protobuf.schema import build_file_descriptor_set

from dualloop.controller.logs.plot import PlotSchema, plot_topic
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import log_pb2

FORMAT_VERSION = 1
PROFILE = ""  # MCAP's "protobuf" well-known profile is not defined; an empty profile is the norm.
LIBRARY = "dualloop"

TOPIC_HEADER = "/dualloop/header"
TOPIC_OBSERVATION = "/dualloop/observation"
TOPIC_SNAPSHOT = "/dualloop/snapshot"
TOPIC_PLAN = "/dualloop/plan"
TOPIC_SUMMARY = "/dualloop/summary"

# SessionHeader.source_details key saying what the observations' ActualAction.controls are. With the
# value ACTUAL_IS_COMMAND they are the command the vehicle was executing when each observation was
# taken (controller.proto's contract for live clients), and a replay runs the gate's actuation check
# on them; anything else, or no entry (an import whose "actual" action is a label made from the
# drive's own speed profile), and the check gives no verdict.
ACTUAL_CONTROLS_DETAIL = "actual_controls"
ACTUAL_IS_COMMAND = "command in effect at the observation"
# SessionHeader.source_details key, "true" when the session required plans (OpenSession.require_plan):
# a replay judges its plans by the same rule. Absent (older logs): plans were optional.
REQUIRE_PLAN_DETAIL = "require_plan"


# SessionHeader.source_details key, "true" when the server's own planner planned the session: an expired
# plan was STALE_PLAN there (executor.sessions.Session.expired_plan_is_stale), and so it is in a replay.
EXPIRED_PLAN_IS_STALE_DETAIL = "expired_plan_is_stale"


def require_plan(header: log_pb2.SessionHeader) -> bool:
    return header.source_details.get(REQUIRE_PLAN_DETAIL, "") == "true"


def expired_plan_is_stale(header: log_pb2.SessionHeader) -> bool:
    return header.source_details.get(EXPIRED_PLAN_IS_STALE_DETAIL, "") == "true"


# What a live session records when its client did not declare OpenSession.actual_controls_are_commands
# (logs recorded before that field existed say ACTUAL_IS_COMMAND: their sessions ran the check).
ACTUAL_NOT_DECLARED = "not declared the command in effect (OpenSession.actual_controls_are_commands false)"


def actual_is_command(header: log_pb2.SessionHeader) -> bool:
    return header.source_details.get(ACTUAL_CONTROLS_DETAIL, "") == ACTUAL_IS_COMMAND


def sensor_profile(header: log_pb2.SessionHeader) -> list[str] | None:
    """The features a log's sensors measured; None for all. Logs that filled the rest with values
    (filled_features, before the sensor-profile contract) are replayed as they were: all present."""
    if header.filled_features or not header.measured_features:
        return None
    return list(header.measured_features)


# Each topic carries exactly one message type; the reader decodes with these generated classes
# rather than with dynamic descriptors (faster, and the log cannot smuggle in another type).
TOPIC_TYPES: dict[str, type[Message]] = {
    TOPIC_HEADER: log_pb2.SessionHeader,
    TOPIC_OBSERVATION: pb.Observation,
    TOPIC_SNAPSHOT: pb.DecisionSnapshot,
    TOPIC_PLAN: log_pb2.PlanRecord,
    TOPIC_SUMMARY: log_pb2.SessionSummary,
}

# Chunks are small so that a flush (which closes the chunk in progress) loses little compression,
# and a crash loses at most one chunk's worth of records.
DEFAULT_CHUNK_BYTES = 256 * 1024

_ROTATED_RE = re.compile(r"-(\d{4})\.mcap$")


def rotated_path(stem: Path, part: int) -> Path:
    """`runs/x.mcap` (or `runs/x`) and part 3 -> `runs/x-0003.mcap`."""
    base = stem.with_suffix("") if stem.suffix == ".mcap" else stem
    return base.with_name(f"{base.name}-{part:04d}.mcap")


def rotated_files(stem: Path) -> list[Path]:
    """The parts of a rotated log in order; empty when there are none."""
    first = rotated_path(stem, 0)
    prefix = first.name[: -len("0000.mcap")]
    parts = [p for p in first.parent.glob(f"{glob_escape(prefix)}[0-9][0-9][0-9][0-9].mcap")]
    return sorted(parts, key=lambda p: int(_ROTATED_RE.search(p.name).group(1)))  # type: ignore[union-attr]


def rotated_groups(files: Sequence[Path]) -> list[list[Path]]:
    """`files` with each rotated recording's parts (`x-0000.mcap`, `x-0001.mcap`, ...: a series that
    has its part 0 among them) as one group, in part order; every other file a group of its own. The
    order is the files' (a group where its first part was). Read one at a time, a part is a piece of
    each session: a two-session recording in three parts read as six sessions."""
    series: dict[tuple[Path, str], list[Path]] = {}
    for f in files:
        m = _ROTATED_RE.search(f.name)
        if m is not None:
            series.setdefault((f.parent, f.name[: m.start()]), []).append(f)
    out: list[list[Path]] = []
    placed: set[Path] = set()
    for f in files:
        if f in placed:
            continue
        m = _ROTATED_RE.search(f.name)
        parts = series.get((f.parent, f.name[: m.start()]), []) if m is not None else []
        if not any(_ROTATED_RE.search(p.name).group(1) == "0000" for p in parts):  # type: ignore[union-attr]
            out.append([f])
            placed.add(f)
            continue
        group = sorted(parts, key=lambda p: int(_ROTATED_RE.search(p.name).group(1)))  # type: ignore[union-attr]
        out.append(group)
        placed.update(group)
    return out


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def mcap_time(ns: int) -> int:
    """MCAP times are unsigned: an event before the clock's epoch is logged at 0 (its own fields
    still carry the exact value)."""
    return ns if ns > 0 else 0


class LogFileWriter:
    """One MCAP file: registers a schema per message type and a channel per (topic, session) lazily,
    and knows its size so the recorder can rotate. Not thread-safe: one writer thread owns it."""

    def __init__(
        self, path: Path, chunk_bytes: int = DEFAULT_CHUNK_BYTES, compress: bool = True, exclusive: bool = False
    ) -> None:
        """exclusive: create the file, FileExistsError if it exists (a recorder never overwrites a log)."""
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._stream: BinaryIO = open(path, "xb" if exclusive else "wb")
        self._writer = McapWriter(
            self._stream,
            chunk_size=chunk_bytes,
            compression=CompressionType.ZSTD if compress else CompressionType.NONE,
        )
        self._writer.start(profile=PROFILE, library=LIBRARY)
        self._schemas: dict[str, int] = {}
        self._channels: dict[tuple[str, str], int] = {}
        self._sequence: dict[int, int] = {}
        self._unflushed_bytes = 0
        self.messages = 0
        self.headers_written: set[str] = set()
        self.opened_monotonic_s = time.monotonic()

    def _channel(self, topic: str, session_id: str) -> int:
        key = (topic, session_id)
        channel = self._channels.get(key)
        if channel is None:
            message_type = TOPIC_TYPES[topic]
            name = message_type.DESCRIPTOR.full_name
            schema = self._schemas.get(name)
            if schema is None:
                schema = self._writer.register_schema(
                    name=name, encoding="protobuf", data=build_file_descriptor_set(message_type).SerializeToString()
                )
                self._schemas[name] = schema
            channel = self._writer.register_channel(
                topic=topic, message_encoding="protobuf", schema_id=schema, metadata={"session_id": session_id}
            )
            self._channels[key] = channel
            self._sequence[channel] = 0
        return channel

    def write_plot(
        self,
        schema: PlotSchema,
        metadata: dict[str, str],
        data: bytes,
        log_time_ns: int,
        publish_time_ns: int | None = None,
    ) -> None:
        """One serialised plot message on `/dualloop/<session>/plot` (plot.py), whose channel and
        schema are registered in this file on first use; metadata names the session."""
        session_id = metadata["session_id"]
        topic = plot_topic(session_id)
        key = (topic, session_id)
        channel = self._channels.get(key)
        if channel is None:
            schema_id = self._schemas.get(schema.name)
            if schema_id is None:
                schema_id = self._writer.register_schema(name=schema.name, encoding="protobuf", data=schema.data)
                self._schemas[schema.name] = schema_id
            channel = self._writer.register_channel(
                topic=topic, message_encoding="protobuf", schema_id=schema_id, metadata=metadata
            )
            self._channels[key] = channel
            self._sequence[channel] = 0
        self._add(channel, data, log_time_ns, publish_time_ns)

    def write(
        self, topic: str, session_id: str, message: Message, log_time_ns: int, publish_time_ns: int | None = None
    ) -> None:
        data = message.SerializeToString(deterministic=True)  # map order fixed: reproducible files
        self._add(self._channel(topic, session_id), data, log_time_ns, publish_time_ns)
        if topic == TOPIC_HEADER:
            self.headers_written.add(session_id)

    def _add(self, channel: int, data: bytes, log_time_ns: int, publish_time_ns: int | None) -> None:
        sequence = self._sequence[channel]
        self._sequence[channel] = sequence + 1
        log_time = mcap_time(log_time_ns)
        self._writer.add_message(
            channel_id=channel,
            log_time=log_time,
            data=data,
            publish_time=log_time if publish_time_ns is None else mcap_time(publish_time_ns),
            sequence=sequence,
        )
        self._unflushed_bytes += len(data) + 31  # record overhead: opcode, lengths, times, sequence
        self.messages += 1

    @property
    def size_bytes(self) -> int:
        """Bytes on disk plus an estimate of what is still buffered (uncompressed, so an overestimate)."""
        return self._stream.tell() + self._unflushed_bytes

    def flush(self) -> None:
        """Close the chunk in progress and hand everything to the OS: it survives a killed process."""
        self._writer.flush()
        self._unflushed_bytes = 0

    def finish(self) -> None:
        """Write the index and footer (a finished file opens instantly in Foxglove) and close."""
        try:
            self._writer.finish()
        finally:
            self._stream.close()

    def abandon(self) -> None:
        """Close the file as it is, after a write error (no index, no footer): what was flushed
        stays, and reads up to where it ends. Errors closing it (the buffered rest) are ignored."""
        with contextlib.suppress(OSError, ValueError):
            self._stream.close()
