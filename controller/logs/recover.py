"""`dualloop recover IN OUT`: a log cut short (a server killed, a full disk) rewritten as a complete MCAP.

A cut file has no summary section and no footer, and its last chunk may be half-written: dualloop's
own reader reads it front to back up to the cut, but the standard MCAP readers (`mcap` Python's
make_reader, the `mcap` CLI, Foxglove) need the end of the file and refuse it. Recovery streams the
readable records (schemas, channels, messages, every topic, plots too) into a new file that is
finished properly, with its index and statistics; the input is never written to.

The new file is whole, but the sessions that had not ended at the cut are not: a metadata record
(logfile.RECOVERED_METADATA) names them, and the reader marks them cut, so replay refuses them
without --allow-truncated as it refuses the cut file. The file is written under a temporary name in
the output's folder and renamed at the end: an interrupted recovery leaves nothing under OUT.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from mcap.records import Channel, Footer, Message, Metadata, Schema
from mcap.stream_reader import StreamReader
from mcap.writer import CompressionType
from mcap.writer import Writer as McapWriter

from dualloop.controller.logs.format import LIBRARY, PROFILE, TOPIC_HEADER, TOPIC_OBSERVATION, TOPIC_SUMMARY
from dualloop.controller.logs.logfile import (
    MCAP_READ_ERRORS,
    RECOVERED_METADATA,
    LogFileError,
    no_sessions_error,
)

_RECORD_SIZE_LIMIT = 256 * 1024 * 1024  # as the reader's: a corrupt length never allocates gigabytes
_READ_ERRORS = MCAP_READ_ERRORS


@dataclass
class Recovered:
    messages: int
    channels: int
    complete: bool  # the input had its footer: nothing was cut
    cut: str  # why reading stopped, when it was cut
    cut_sessions: list[str] = field(default_factory=list)  # sessions (read_sessions' keys) that had not ended


class _Sessions:
    """Which sessions have ended (their summary written), keyed as read_sessions keys them: an id
    seen again after its summary is another session, `id#2`, `id#3`, ..."""

    def __init__(self) -> None:
        self.state: dict[str, tuple[int, bool]] = {}  # id -> (instance, ended)

    def see(self, topic: str, session_id: str) -> None:
        instance, ended = self.state.get(session_id, (0, True))
        if topic in (TOPIC_HEADER, TOPIC_OBSERVATION) and ended:
            self.state[session_id] = (instance + 1, False)
        elif topic == TOPIC_SUMMARY and instance:
            self.state[session_id] = (instance, True)

    def open(self) -> list[str]:
        return [sid if n == 1 else f"{sid}#{n}" for sid, (n, ended) in self.state.items() if not ended]


def recover_log(source: Path, out: Path) -> Recovered:
    """Every record of `source` readable up to its cut, written to `out` as a complete MCAP file."""
    if out.resolve() == source.resolve():
        raise LogFileError(f"{out}: the recovered log must be a new file, not the input")
    partial = out.with_name(f".{out.name}.{os.getpid()}.partial")
    try:
        with open(source, "rb") as stream, open(partial, "xb") as sink:
            done = _copy(source, stream, sink)
        if done.messages == 0 and not done.complete:  # empty, a stray file, or cut before its first message
            raise no_sessions_error(source)
        if out.exists():  # made while this ran: never overwritten
            raise LogFileError(f"{out}: already exists; the recovered log must be a new file")
        partial.rename(out)
    finally:  # an error, Ctrl-C or SIGTERM (main's KeyboardInterrupt): no partial file left behind
        partial.unlink(missing_ok=True)
    return done


def _copy(source: Path, stream: BinaryIO, sink: BinaryIO) -> Recovered:
    """The readable records of `stream` into `sink`, finished; the sessions open at a cut named in a
    RECOVERED_METADATA record (merged with the input's own, when it was itself recovered)."""
    schemas: dict[int, int] = {}
    channels: dict[int, int] = {}
    topics: dict[int, tuple[str, str]] = {}  # input channel id -> (topic, session id)
    sessions = _Sessions()
    earlier: list[str] = []  # sessions an earlier recovery marked cut
    marks: list[dict[str, str]] = []
    messages, complete, cut = 0, False, ""
    writer = McapWriter(sink, compression=CompressionType.ZSTD)
    writer.start(profile=PROFILE, library=LIBRARY)
    try:
        for record in StreamReader(stream, validate_crcs=True, record_size_limit=_RECORD_SIZE_LIMIT).records:
            if isinstance(record, Schema) and record.id not in schemas:
                schemas[record.id] = writer.register_schema(record.name, record.encoding, record.data)
            elif isinstance(record, Channel) and record.id not in channels:
                channels[record.id] = writer.register_channel(
                    record.topic, record.message_encoding, schemas.get(record.schema_id, 0), dict(record.metadata)
                )
                topics[record.id] = (record.topic, record.metadata.get("session_id", ""))
            elif isinstance(record, Message) and record.channel_id in channels:
                writer.add_message(
                    channels[record.channel_id], record.log_time, record.data, record.publish_time, record.sequence
                )
                sessions.see(*topics[record.channel_id])
                messages += 1
            elif isinstance(record, Metadata) and record.name == RECOVERED_METADATA:
                earlier += json.loads(record.metadata.get("cut_sessions", "[]"))
                marks.append(dict(record.metadata))
            elif isinstance(record, Footer):
                complete = True
    except _READ_ERRORS as err:
        if messages == 0 and "magic" in str(err).lower():
            raise LogFileError(f"{source}: not an MCAP file ({err})") from None
        cut = f"{type(err).__name__}: {err}"
    if not complete and not cut:
        cut = "the file ends without its footer"
    opened = sessions.open() if not complete else []
    for mark in marks:  # a recovered file recovered again: its cut sessions stay cut
        writer.add_metadata(RECOVERED_METADATA, mark)
    if opened:
        what = {"source": source.name, "cut": cut, "cut_sessions": json.dumps(opened)}
        writer.add_metadata(RECOVERED_METADATA, what)
    writer.finish()
    cut_sessions = list(dict.fromkeys(earlier + opened))
    return Recovered(messages, len(channels), complete, cut, cut_sessions)
