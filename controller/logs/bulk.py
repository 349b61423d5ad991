"""Write a whole session's already-serialised messages as one MCAP file, at the cost of the bytes.

`LogFileWriter` hands the mcap library one message at a time (a Message object, an index entry,
six small writes: ~15 us each in Python), which made writing a replay's 12,000 snapshots slower
than the replay. Here the message records of a group are packed by numpy in one go (a group given
as PackedMessages joins its messages with their records' heads itself, in one copy), and chunks
are slices of them; schemas, channels, chunks, message indexes and the summary are the same
records, in the same order, with the same chunking and zstd compression as `LogFileWriter` writes
them (the mcap library's own record classes write the structural records). For the same messages
the file is byte-identical to `write_log`'s, which tests check.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import zstandard
from mcap.data_stream import RecordBuilder
from mcap.opcode import Opcode
from mcap.records import Channel, Chunk, ChunkIndex, DataEnd, Footer, Header, Schema, Statistics, SummaryOffset
from mcap_protobuf.schema import build_file_descriptor_set

from dualloop.controller.logs.format import DEFAULT_CHUNK_BYTES, LIBRARY, PROFILE, TOPIC_TYPES

MAGIC = b"\x89MCAP0\r\n"
_MESSAGE_HEAD = np.dtype(
    [("op", "u1"), ("length", "<u8"), ("channel", "<u2"), ("sequence", "<u4"), ("log", "<u8"), ("publish", "<u8")]
)
_HEAD_SIZE = _MESSAGE_HEAD.itemsize  # 31: opcode, record length, then the Message fields before data


class PackedMessages(Protocol):
    """Messages' bytes not yet joined (replay/wire_batch.PackedRows): their sizes, and joined,
    each after a head when `heads` (uint8, one row per message) is given."""

    sizes: np.ndarray

    def joined(self, heads: np.ndarray | None = None) -> np.ndarray: ...


@dataclass
class TopicMessages:
    """One topic's messages, serialised, with their log times (ns; publish time = log time): a list
    of bytes, or `packed`: every message's bytes one after the other and their sizes, or
    PackedMessages (joined with their records' heads in one copy)."""

    topic: str
    data: Sequence[bytes]
    log_time_ns: np.ndarray
    packed: tuple[np.ndarray, np.ndarray] | PackedMessages | None = None  # tuple: (uint8 bytes, int64 sizes)
    # a topic outside format.TOPIC_TYPES (the plot channel): its schema (name, FileDescriptorSet
    # bytes) and channel metadata (default: the session id)
    schema: tuple[str, bytes] | None = None
    metadata: dict[str, str] | None = None

    def messages(self) -> tuple[Sequence[bytes | memoryview], np.ndarray]:
        """Each message's bytes (no copy), and their sizes."""
        if self.packed is None:
            return self.data, np.fromiter(map(len, self.data), np.int64, len(self.data))
        payload, sizes = self.packed if isinstance(self.packed, tuple) else (self.packed.joined(), self.packed.sizes)
        view, ends = payload.data, np.cumsum(sizes).tolist()
        return [view[a:b] for a, b in zip([0, *ends[:-1]], ends)], sizes

    def __len__(self) -> int:
        if self.packed is None:
            return len(self.data)
        return len(self.packed[1]) if isinstance(self.packed, tuple) else len(self.packed.sizes)


@dataclass
class _Chunk:
    parts: list[bytes | memoryview] = field(default_factory=list)
    size: int = 0
    messages: int = 0
    start: int = 0
    end: int = 0
    # channel -> [(log_time array, offset array)], in the order channels first appear in the chunk
    index: dict[int, list[tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)

    def add(self, data: bytes | memoryview) -> None:
        self.parts.append(data)
        self.size += len(data)

    def data(self) -> bytes | memoryview:
        # a chunk inside one group's records is one slice of them: no copy
        return self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)


def write_messages(
    path: str | Path, session_id: str, groups: Sequence[TopicMessages], chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> Path:
    """One file holding `groups` in order, as `LogFileWriter.write` called message by message
    (channel metadata session_id; a sequence per channel from 0) and then `finish` would write it."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = _Writer(session_id, chunk_bytes)
    for group in groups:
        if len(group):
            writer.add(group)
    out.write_bytes(writer.finish())
    return out


class _Writer:
    """The file being written: its bytes so far, the open chunk, and what the summary will list."""

    def __init__(self, session_id: str, chunk_bytes: int) -> None:
        self.session_id, self.chunk_bytes = session_id, chunk_bytes
        self.file = bytearray(MAGIC)
        builder = RecordBuilder()
        Header(PROFILE, LIBRARY).write(builder)
        self.file += builder.end()
        self.schemas: dict[str, Schema] = {}
        self.channels: dict[str, Channel] = {}
        self.counts: dict[int, int] = {}
        self.chunk_indexes: list[ChunkIndex] = []
        self.chunk = _Chunk()
        # one context for every chunk: `zstandard.compress` (what the mcap writer calls) makes one per
        # call at the same level, so the bytes are the same
        self.compressor = zstandard.ZstdCompressor(level=3)
        self.first_time: int | None = None
        self.last_time = 0

    def add(self, group: TopicMessages) -> None:
        """A group's messages (at least one), chunked as the mcap writer chunks them."""
        n = len(group)
        channel_id = self._channel_id(group)
        times = np.maximum(np.asarray(group.log_time_ns, np.int64), 0).astype(np.uint64)  # as mcap_time
        packed = None if isinstance(group.packed, tuple) else group.packed
        if packed is not None:
            sizes = packed.sizes
        else:
            messages, sizes = group.messages()
        heads = np.empty(n, _MESSAGE_HEAD)
        heads["op"] = Opcode.MESSAGE
        heads["length"] = sizes + (_HEAD_SIZE - 9)
        heads["channel"] = channel_id
        sequence0 = self.counts.get(channel_id, 0)
        heads["sequence"] = np.arange(sequence0, sequence0 + n)
        heads["log"] = heads["publish"] = times
        self.counts[channel_id] = sequence0 + n
        record_sizes = sizes + _HEAD_SIZE
        ends = np.cumsum(record_sizes)
        if packed is not None:
            record_bytes = packed.joined(heads.view(np.uint8).reshape(n, _HEAD_SIZE)).data
        else:
            record_bytes = memoryview(_interleave(heads.tobytes(), messages))
        first = int(times.min())
        self.first_time = first if self.first_time is None else min(self.first_time, first)
        self.last_time = max(self.last_time, int(times.max()))
        chunk_bytes = self.chunk_bytes
        i = 0
        while i < n:
            chunk = self.chunk
            # the message after which the chunk grows past chunk_bytes closes it (as the mcap writer)
            base = int(ends[i - 1]) if i else 0
            stop = int(np.searchsorted(ends, chunk_bytes - chunk.size + base, side="right")) + 1
            stop = min(max(stop, i + 1), n)
            offsets = chunk.size + (ends[i:stop] - record_sizes[i:stop] - base)
            chunk.index.setdefault(channel_id, []).append((times[i:stop], offsets.astype(np.uint64)))
            chunk.start = (
                int(times[i:stop].min()) if chunk.messages == 0 else min(chunk.start, int(times[i:stop].min()))
            )
            chunk.end = max(chunk.end, int(times[i:stop].max()))
            chunk.messages += stop - i
            chunk.add(record_bytes[base : int(ends[stop - 1])])
            if chunk.size > chunk_bytes:
                self._close_chunk()
            i = stop

    def _channel_id(self, group: TopicMessages) -> int:
        """The group's channel, its schema and channel records written into the chunk on first use."""
        if group.topic not in self.channels:
            if group.schema is not None:
                name, data = group.schema
            else:
                message_type = TOPIC_TYPES[group.topic]
                name, data = message_type.DESCRIPTOR.full_name, b""
            schemas = self.schemas
            if name not in schemas:
                data = data or build_file_descriptor_set(message_type).SerializeToString()
                schemas[name] = Schema(id=len(schemas) + 1, name=name, encoding="protobuf", data=data)
                self._in_chunk(schemas[name])
            channel = Channel(
                id=len(self.channels) + 1,
                schema_id=schemas[name].id,
                topic=group.topic,
                message_encoding="protobuf",
                metadata=group.metadata or {"session_id": self.session_id},
            )
            self.channels[group.topic] = channel
            self._in_chunk(channel)
        return self.channels[group.topic].id

    def _in_chunk(self, record: Schema | Channel) -> None:
        b = RecordBuilder()
        record.write(b)
        self.chunk.add(b.end())
        if self.chunk.size > self.chunk_bytes:
            self._close_chunk()

    def _close_chunk(self) -> None:
        """The open chunk (if it holds any message) compressed into the file, then its message indexes."""
        chunk, file = self.chunk, self.file
        if chunk.messages == 0:
            return
        data = chunk.data()
        compressed = self.compressor.compress(data)
        record = Chunk(
            message_start_time=chunk.start,
            message_end_time=chunk.end,
            uncompressed_size=len(data),
            uncompressed_crc=zlib.crc32(data),
            compression="zstd",
            data=compressed,
        )
        b = RecordBuilder()
        record.write(b)
        chunk_start = len(file)
        file.extend(b.end())
        index = ChunkIndex(
            message_start_time=chunk.start,
            message_end_time=chunk.end,
            chunk_start_offset=chunk_start,
            chunk_length=len(file) - chunk_start,
            message_index_offsets={},
            message_index_length=0,
            compression="zstd",
            compressed_size=len(compressed),
            uncompressed_size=len(data),
        )
        index_start = len(file)
        for channel_id, pieces in chunk.index.items():
            index.message_index_offsets[channel_id] = len(file)
            times = np.concatenate([t for t, _ in pieces])
            offsets = np.concatenate([o for _, o in pieces])
            entries = np.empty((len(times), 2), "<u8")
            entries[:, 0], entries[:, 1] = times, offsets
            body = entries.tobytes()
            file.extend(struct.pack("<BQHI", Opcode.MESSAGE_INDEX, 2 + 4 + len(body), channel_id, len(body)))
            file.extend(body)
        index.message_index_length = len(file) - index_start
        self.chunk_indexes.append(index)
        self.chunk = _Chunk()

    def finish(self) -> bytearray:
        """The whole file: the last chunk, the data end, the summary and its offsets, the footer."""
        self._close_chunk()
        file = self.file
        b = RecordBuilder()
        DataEnd(0).write(b)
        file.extend(b.end())
        summary_start = len(file)
        summary = RecordBuilder()
        offsets: list[SummaryOffset] = []

        def group_of(opcode: Opcode, records: Sequence[Schema | Channel | Statistics | ChunkIndex]) -> None:
            start = summary.count
            for r in records:
                r.write(summary)
            offsets.append(
                SummaryOffset(
                    group_opcode=opcode, group_start=summary_start + start, group_length=summary.count - start
                )
            )

        group_of(Opcode.SCHEMA, list(self.schemas.values()))
        group_of(Opcode.CHANNEL, list(self.channels.values()))
        stats = Statistics(
            message_count=sum(self.counts.values()),
            schema_count=len(self.schemas),
            channel_count=len(self.channels),
            attachment_count=0,
            metadata_count=0,
            chunk_count=len(self.chunk_indexes),
            message_start_time=self.first_time or 0,
            message_end_time=self.last_time,
            channel_message_counts=dict(self.counts),
        )
        group_of(Opcode.STATISTICS, [stats])
        group_of(Opcode.CHUNK_INDEX, self.chunk_indexes)
        group_of(Opcode.ATTACHMENT_INDEX, [])
        group_of(Opcode.METADATA_INDEX, [])
        summary_offset_start = summary_start + summary.count
        for o in offsets:
            o.write(summary)
        summary_data = summary.end()
        crc = zlib.crc32(summary_data)
        crc = zlib.crc32(struct.pack("<BQQQ", Opcode.FOOTER, 20, summary_start, summary_offset_start), crc)
        file.extend(summary_data)
        b = RecordBuilder()
        Footer(summary_start=summary_start, summary_offset_start=summary_offset_start, summary_crc=crc).write(b)
        file.extend(b.end())
        file.extend(MAGIC)
        return file


def _interleave(heads: bytes, messages: Sequence[bytes | memoryview]) -> bytes:
    """Each message's head (`heads`: one after the other) then its bytes, message after message:
    one join of views (7x cheaper than scattering the bytes with numpy, whose index arrays are 8
    bytes per byte moved)."""
    view = memoryview(heads)
    parts: list[bytes | memoryview] = [view] * (2 * len(messages))
    parts[0::2] = [view[i : i + _HEAD_SIZE] for i in range(0, len(heads), _HEAD_SIZE)]
    parts[1::2] = messages
    return b"".join(parts)


# a corrupt size field must not make the reader allocate gigabytes (LogReader's limit too)
_CHUNK_LIMIT = 256 * 1024 * 1024


class NotFast(Exception):
    """The file is not a complete, clean MCAP: read it with LogReader (which reports how far it got)."""


def _string(buf: bytes, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<I", buf, pos)
    return bytes(buf[pos + 4 : pos + 4 + n]).decode(), pos + 4 + n


def _channel(buf: bytes, pos: int) -> tuple[int, str, str]:
    channel_id = struct.unpack_from("<H", buf, pos)[0]
    topic, p = _string(buf, pos + 4)  # after the schema id
    _, p = _string(buf, p)  # message encoding
    (size,) = struct.unpack_from("<I", buf, p)
    p, end, metadata = p + 4, p + 4 + size, {}
    while p < end:
        key, p = _string(buf, p)
        metadata[key], p = _string(buf, p)
    return channel_id, topic, metadata.get("session_id", "")


_MESSAGE = struct.Struct("<BQHIQQ")  # opcode, record length, channel, sequence, log time, publish time


def _records(
    buf: bytes, start: int, end: int, channels: dict[int, tuple[str, str]], out: list[tuple[int, int, bytes]]
) -> int:
    """Walk records in buf[start:end]: channels into `channels`, messages into `out` (channel,
    log time, data) in file order, chunks recursively. Returns the opcode of the last record."""
    pos, op = start, 0
    unpack = _MESSAGE.unpack_from
    while pos < end:
        op = buf[pos]
        if op == Opcode.MESSAGE:
            _, length, channel_id, _, log_time, _ = unpack(buf, pos)
            body_end = pos + 9 + length
            if length < 22 or body_end > end:
                raise NotFast("message record past the end")
            out.append((channel_id, log_time, buf[pos + 31 : body_end]))
            pos = body_end
            continue
        (length,) = struct.unpack_from("<Q", buf, pos + 1)
        body, pos = pos + 9, pos + 9 + length
        if pos > end:
            raise NotFast("record past the end")
        if op == Opcode.CHANNEL:
            channel_id, topic, session = _channel(buf, body)
            channels[channel_id] = (topic, session)
        elif op == Opcode.CHUNK:
            _, _, size, crc = struct.unpack_from("<QQQI", buf, body)
            compression, p = _string(buf, body + 28)
            (n,) = struct.unpack_from("<Q", buf, p)
            data = buf[p + 8 : p + 8 + n]
            if size > _CHUNK_LIMIT or p + 8 + n > pos:
                raise NotFast("chunk size")
            if compression == "zstd":
                data = zstandard.ZstdDecompressor().decompress(data, max_output_size=size)
            elif compression:
                raise NotFast(f"compression {compression!r}")
            if len(data) != size or (crc and zlib.crc32(data) != crc):
                raise NotFast("chunk size or CRC")
            _records(data, 0, len(data), channels, out)
        elif op == Opcode.DATA_END:
            return op
    return op


def read_messages(path: Path) -> tuple[dict[int, tuple[str, str]], list[tuple[int, int, bytes]]]:
    """(channel id -> (topic, session id), [(channel id, log time, data)] in file order) of a
    complete MCAP file; NotFast when it is anything else (no footer, a broken record or CRC)."""
    buf = path.read_bytes()
    if len(buf) < 2 * len(MAGIC) + 29 or buf[:8] != MAGIC or buf[-8:] != MAGIC or buf[-37] != Opcode.FOOTER:
        raise NotFast("not a complete MCAP file")
    channels: dict[int, tuple[str, str]] = {}
    out: list[tuple[int, int, bytes]] = []
    try:
        if _records(buf, 8, len(buf) - 8, channels, out) != Opcode.DATA_END:
            raise NotFast("no data end record")
    except (struct.error, IndexError, ValueError, OverflowError, MemoryError, zstandard.ZstdError) as err:
        raise NotFast(str(err)) from err
    return channels, out
