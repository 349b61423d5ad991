"""`dualloop recover IN OUT`: a log cut short (a server killed, a full disk) rewritten as a complete MCAP.

A cut file has no summary section and no footer, and its last chunk may be half-written: dualloop's
own reader reads it front to back up to the cut, but the standard MCAP readers (`mcap` Python's
make_reader, the `mcap` CLI, Foxglove) need the end of the file and refuse it. Recovery streams the
readable records (schemas, channels, messages, every topic, plots too) into a new file that is
finished properly, with its index and statistics; the input is never written to.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mcap.records import Channel, Footer, Message, Schema
from mcap.stream_reader import StreamReader
from mcap.writer import CompressionType
from mcap.writer import Writer as McapWriter

from dualloop.controller.logs.format import LIBRARY, PROFILE
from dualloop.controller.logs.logfile import MCAP_READ_ERRORS, LogFileError, no_sessions_error

_RECORD_SIZE_LIMIT = 256 * 1024 * 1024  # as the reader's: a corrupt length never allocates gigabytes
_READ_ERRORS = MCAP_READ_ERRORS


@dataclass
class Recovered:
    messages: int
    channels: int
    complete: bool  # the input had its footer: nothing was cut
    cut: str  # why reading stopped, when it was cut


def recover_log(source: Path, out: Path) -> Recovered:
    """Every record of `source` readable up to its cut, written to `out` as a complete MCAP file."""
    if out.resolve() == source.resolve():
        raise LogFileError(f"{out}: the recovered log must be a new file, not the input")
    schemas: dict[int, int] = {}
    channels: dict[int, int] = {}
    messages, complete, cut = 0, False, ""
    with open(source, "rb") as stream, open(out, "xb") as sink:
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
                elif isinstance(record, Message) and record.channel_id in channels:
                    writer.add_message(
                        channels[record.channel_id], record.log_time, record.data, record.publish_time, record.sequence
                    )
                    messages += 1
                elif isinstance(record, Footer):
                    complete = True
        except _READ_ERRORS as err:
            if messages == 0 and "magic" in str(err).lower():
                sink.close()
                out.unlink()
                raise LogFileError(f"{source}: not an MCAP file ({err})") from None
            cut = f"{type(err).__name__}: {err}"
        writer.finish()
    if messages == 0 and not complete:  # empty, a stray file, or cut before its first message: nothing to keep
        out.unlink()
        raise no_sessions_error(source)
    if not complete and not cut:
        cut = "the file ends without its footer"
    return Recovered(messages, len(channels), complete, cut)
