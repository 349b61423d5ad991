"""Record sessions to an MCAP log without ever slowing down the caller.

The caller (the gRPC handlers, the tick loop) only appends a reference to a bounded queue: no
serialisation, no I/O, no lock the writer could hold. The queue is bounded twice: in records
(`queue_size`) and in bytes (`queue_bytes`, each record's serialised size: ByteSize, about 0.5 us a
snapshot), since a count alone lets large records (long ids, decision vectors) take gigabytes. When
either bound is reached the record is dropped and counted, like every other buffer in dualloop; the
writer thread logs a warning at most every `DROP_LOG_INTERVAL_S` while records are being dropped.
A background thread serialises, writes, flushes to the OS every `flush_interval_s` (so a killed
process loses at most that much plus the queue), and rotates files by size or duration; every file
starts with the header of each session it holds, so each rotated part reads on its own.

Messages handed to the recorder must not be mutated afterwards: the queue holds the object itself.

MCAP log_time of each record is the event's own time (see proto/dualloop/v2/log.proto);
publish_time is the wall clock (Unix ns) when the caller handed the record over. Each snapshot also
gets a decoded plot message on `/dualloop/<session>/plot` (plot.py: named fields for Foxglove, with
wall-clock log_time in REALTIME and an offset one in LOCKSTEP), made on the writer thread.
"""

from __future__ import annotations

import collections
import enum
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf.message import Message

from dualloop.controller.logs.format import (
    FORMAT_VERSION,
    TOPIC_HEADER,
    TOPIC_OBSERVATION,
    TOPIC_PLAN,
    TOPIC_SNAPSHOT,
    TOPIC_SUMMARY,
    LogFileWriter,
    rotated_path,
)
from dualloop.controller.logs.plot import PlotSchema, channel_metadata, log_time_offset_ns
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import log_pb2

log = logging.getLogger(__name__)

DEFAULT_QUEUE_BYTES = 8 * 1024 * 1024  # serialised bytes waiting; in memory a record takes ~2-3x (measured)
DROP_LOG_INTERVAL_S = 10.0


def unique_log_path(folder: Path, prefix: str = "dualloop", suffix: str = "") -> Path:
    """`<prefix>-YYYYmmdd-HHMMSS.ffffff-<pid>-<random>.mcap`: servers sharing a folder (in one second,
    or on hosts whose process ids coincide) never pick the same name; the recorder also creates the
    file exclusively, so a collision would fail loudly rather than overwrite."""
    now = time.time()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    micros = int(now % 1 * 1e6)
    return folder / f"{prefix}-{stamp}.{micros:06d}-{os.getpid()}-{secrets.token_hex(3)}{suffix}.mcap"


class _Kind(enum.IntEnum):
    OBSERVATION = 0
    SNAPSHOT = 1
    PLAN = 2
    OPEN = 3
    CLOSE = 4
    STOP = 5


_DATA_TOPICS = {_Kind.OBSERVATION: TOPIC_OBSERVATION, _Kind.SNAPSHOT: TOPIC_SNAPSHOT, _Kind.PLAN: TOPIC_PLAN}


@dataclass
class RecorderStats:
    written: dict[str, int] = field(default_factory=lambda: {"observation": 0, "snapshot": 0, "plan": 0})
    dropped: dict[str, int] = field(default_factory=lambda: {"observation": 0, "snapshot": 0, "plan": 0})
    files: list[Path] = field(default_factory=list)
    max_queue_depth: int = 0
    max_queue_bytes: int = 0
    dropped_queue_full: int = 0  # of the drops: the queue was at its record or byte bound
    error: str = ""  # the first write error; the recorder keeps draining (and dropping) after it

    @property
    def total_dropped(self) -> int:
        return sum(self.dropped.values())


@dataclass
class _SessionCounts:
    written: list[int] = field(default_factory=lambda: [0, 0, 0])
    dropped: list[int] = field(default_factory=lambda: [0, 0, 0])
    last_log_time_ns: int = 0


@dataclass
class _PlotState:
    """A session's plot channel: its schema, metadata (set at the first snapshot, with the LOCKSTEP
    offset), and the newest observations by seq: a snapshot plots the features of the one it used
    (in LOCKSTEP the ticks just before an observation's time, recorded after it, used the one before)."""

    schema: PlotSchema
    header: log_pb2.SessionHeader
    realtime: bool
    offset_ns: int | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    observations: dict[int, pb.Observation] = field(default_factory=dict)

    def remember(self, observation: pb.Observation) -> None:
        self.observations[observation.seq] = observation
        if len(self.observations) > 4:
            del self.observations[next(iter(self.observations))]  # the oldest (insertion order)


class Recorder:
    """Background MCAP recorder for any number of sessions.

    `path` is the file to write; with rotation (`rotate_bytes` and/or `rotate_seconds`) it is the
    stem of `<stem>-0000.mcap`, `<stem>-0001.mcap`, ... With `exclusive` every file is created, never
    overwritten (an existing one fails the recording, logged and counted as drops).

    What stays in memory per session once it has closed: its channels in the current file's index
    (five, each naming the session) until the file rotates; nothing else.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        queue_size: int = 16384,
        queue_bytes: int = DEFAULT_QUEUE_BYTES,
        rotate_bytes: int | None = None,
        rotate_seconds: float | None = None,
        flush_interval_s: float = 0.25,
        compress: bool = True,
        plots: bool = True,
        exclusive: bool = False,
        drop_log_interval_s: float = DROP_LOG_INTERVAL_S,
    ) -> None:
        if queue_size < 1 or queue_bytes < 1:
            raise ValueError("queue_size and queue_bytes must be at least 1")
        self.path = Path(path)
        self.queue_size = queue_size
        self.queue_bytes_limit = queue_bytes
        self.exclusive = exclusive
        self.drop_log_interval_s = drop_log_interval_s
        self.rotate_bytes = rotate_bytes
        self.rotate_seconds = rotate_seconds
        self.flush_interval_s = flush_interval_s
        self.compress = compress
        self.plots = plots
        self.stats = RecorderStats()
        # deque.append/popleft are atomic under the GIL: producers and the writer never wait on
        # each other. Several producer threads may overshoot the bound by at most one item each.
        self._queue: collections.deque[tuple[_Kind, str, Message | None, int, int]] = collections.deque()
        # Bytes queued = bytes in (producers, under _offer_lock: they never wait on the writer) minus
        # bytes out (the writer thread only): each counter has one writer at a time, so no update is lost.
        self._bytes_in = 0
        self._bytes_out = 0
        self._offer_lock = threading.Lock()
        self._sessions: dict[str, _SessionCounts] = collections.defaultdict(_SessionCounts)
        self._headers: dict[str, log_pb2.SessionHeader] = {}
        self._plots: dict[str, _PlotState] = {}
        self._plot_schemas: dict[tuple[tuple[str, ...], ...], PlotSchema] = {}
        self._file: LogFileWriter | None = None
        self._part = 0
        self._closed = False
        self._failed = False  # a write failed: recording stopped (see _fail)
        self._thread = threading.Thread(target=self._run, name="dualloop-recorder", daemon=True)
        self._thread.start()

    # ---- caller side: constant time, never blocks ----

    def _offer(self, kind: _Kind, session_id: str, message: Message) -> bool:
        size = message.ByteSize()
        with self._offer_lock:
            full = len(self._queue) >= self.queue_size or self.queue_bytes + size > self.queue_bytes_limit
            if self._closed or full:
                self._sessions[session_id].dropped[kind] += 1
                self.stats.dropped[_KIND_NAMES[kind]] += 1
                self.stats.dropped_queue_full += full
                return False
            self._bytes_in += size
            self._queue.append((kind, session_id, message, time.time_ns(), size))
        return True

    def _control(self, kind: _Kind, session_id: str, message: Message | None) -> None:
        """Control records bypass both bounds (one or two per session); their bytes still count."""
        size = message.ByteSize() if message is not None else 0
        with self._offer_lock:
            self._bytes_in += size
            self._queue.append((kind, session_id, message, 0, size))

    def write_observation(self, session_id: str, observation: pb.Observation) -> bool:
        """Queue an observation (with its actual action and client plan); False when dropped."""
        return self._offer(_Kind.OBSERVATION, session_id, observation)

    def write_snapshot(self, snapshot: pb.DecisionSnapshot) -> bool:
        return self._offer(_Kind.SNAPSHOT, snapshot.session_id, snapshot)

    def write_plan(self, record: log_pb2.PlanRecord) -> bool:
        return self._offer(_Kind.PLAN, record.session_id, record)

    def open_session(self, header: log_pb2.SessionHeader) -> None:
        """Declare a session. Control records bypass the bound (they are rare, one per session)."""
        if not header.format_version:
            header.format_version = FORMAT_VERSION
        if not header.start_time_unix_ns:
            header.start_time_unix_ns = time.time_ns()
        self._control(_Kind.OPEN, header.session_id, header)

    def close_session(self, session_id: str) -> None:
        """Write the session's summary (counts, drops); it is not repeated in later rotated files."""
        self._control(_Kind.CLOSE, session_id, None)

    def close(self, timeout_s: float = 30.0) -> RecorderStats:
        """Write what is queued, summaries of sessions still open, the index and footer."""
        if not self._closed:
            self._closed = True
            self._control(_Kind.STOP, "", None)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise TimeoutError(f"recorder did not finish writing {self.path} within {timeout_s} s")
        return self.stats

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def queue_bytes(self) -> int:
        """Serialised bytes of the records waiting to be written."""
        return self._bytes_in - self._bytes_out

    # ---- writer thread ----

    def _run(self) -> None:
        queue = self._queue
        last_flush = time.monotonic()
        last_drop_log, dropped_logged = last_flush, 0
        while True:
            drained = 0
            # Bounded batches, so the flush deadline is honoured under a sustained stream too.
            while queue and drained < 1024:
                depth = len(queue)
                if depth > self.stats.max_queue_depth:
                    self.stats.max_queue_depth = depth
                queued = self.queue_bytes
                if queued > self.stats.max_queue_bytes:
                    self.stats.max_queue_bytes = queued
                kind, session_id, message, publish_ns, size = queue.popleft()
                self._bytes_out += size
                drained += 1
                if kind is _Kind.STOP:
                    self._finish_all()
                    self._log_drops(dropped_logged)
                    return
                self._handle(kind, session_id, message, publish_ns)
            now = time.monotonic()
            if self._file is not None and now - last_flush >= self.flush_interval_s:
                self._guarded(self._file.flush)
                last_flush = now
            if now - last_drop_log >= self.drop_log_interval_s:
                last_drop_log = now
                dropped_logged = self._log_drops(dropped_logged)
            if not drained:
                time.sleep(0.005)

    def _log_drops(self, dropped_logged: int) -> int:
        """A warning when records were dropped since the last one (from the writer thread, never the caller's)."""
        dropped = self.stats.total_dropped
        if dropped > dropped_logged:
            # after a write error every record is dropped: that error is the cause, not a slow disk
            why = (
                f"recording stopped at a write error ({self.stats.error})"
                if self._failed
                else "the disk or the writer is slower than the sessions' records"
            )
            log.warning(
                "recorder: %d records dropped since the last report (%d in all, %d with the queue at its "
                "bound of %d records / %d bytes); %s",
                dropped - dropped_logged,
                dropped,
                self.stats.dropped_queue_full,
                self.queue_size,
                self.queue_bytes_limit,
                why,
            )
        return dropped

    def _guarded(self, action: object, *args: object) -> bool:
        if self._failed:
            return False
        try:
            action(*args)  # type: ignore[operator]
            return True
        except Exception as exc:  # disk full, permissions: keep draining so callers never block
            self._fail(exc)
            return False

    def _fail(self, exc: Exception) -> None:
        """Stop recording at the first write error: every later record is dropped and counted.
        Writing on would keep the MCAP writer's index of every record it could not write (memory
        growing for as long as the disk stays full), and reopening the file would truncate what
        was flushed before the error; so the file is closed as it is, a log cut short that readers
        read up to the cut."""
        self._failed = True
        self.stats.error = f"{type(exc).__name__}: {exc}"
        log.error("recorder: writing %s failed, recording stopped (later records are dropped): %s", self.path, exc)
        if self._file is not None:
            self._file.abandon()
            self._file = None

    def _handle(self, kind: _Kind, session_id: str, message: Message | None, publish_ns: int) -> None:
        if kind is _Kind.OPEN:
            assert isinstance(message, log_pb2.SessionHeader)
            self._headers[session_id] = message
            if self._file is not None:  # an id opened again is a new session: its own header first
                self._file.headers_written.discard(session_id)
            if self.plots:
                self._plots[session_id] = self._plot_state(message)
            return
        if kind is _Kind.CLOSE:
            self._guarded(self._write_summary, session_id)
            self._headers.pop(session_id, None)
            self._plots.pop(session_id, None)
            self._sessions.pop(session_id, None)  # its counts are in the summary: nothing kept per closed session
            return
        log_time = _event_time(kind, message)
        if not self._guarded(self._write_data, kind, session_id, message, log_time, publish_ns):
            self._sessions[session_id].dropped[kind] += 1
            self.stats.dropped[_KIND_NAMES[kind]] += 1

    def _current_file(self) -> LogFileWriter:
        if self._file is not None:
            too_big = self.rotate_bytes is not None and self._file.size_bytes >= self.rotate_bytes
            too_old = (
                self.rotate_seconds is not None
                and time.monotonic() - self._file.opened_monotonic_s >= self.rotate_seconds
            )
            if not (too_big or too_old):
                return self._file
            self._file.finish()
            self._file = None
            self._part += 1
        rotating = self.rotate_bytes is not None or self.rotate_seconds is not None
        path = rotated_path(self.path, self._part) if rotating else self.path
        self._file = LogFileWriter(path, compress=self.compress, exclusive=self.exclusive)
        self.stats.files.append(path)
        return self._file

    def _ensure_header(self, file: LogFileWriter, session_id: str, log_time_ns: int) -> None:
        if session_id in file.headers_written:
            return
        header = log_pb2.SessionHeader()
        known = self._headers.get(session_id)
        if known is not None:
            header.CopyFrom(known)
        else:  # data before open_session: still self-describing, and says so
            header.session_id = session_id
            header.source = "unknown (no session header was given to the recorder)"
            header.format_version = FORMAT_VERSION
        header.part = self._part
        file.write(TOPIC_HEADER, session_id, header, log_time_ns)

    def _write_data(self, kind: _Kind, session_id: str, message: Message, log_time_ns: int, publish_ns: int) -> None:
        file = self._current_file()
        self._ensure_header(file, session_id, log_time_ns)
        file.write(_DATA_TOPICS[kind], session_id, message, log_time_ns, publish_ns)
        plot = self._plots.get(session_id)  # None: not recording plots, or data before open_session
        if plot is not None and kind is _Kind.OBSERVATION:
            plot.remember(message)
        elif plot is not None and kind is _Kind.SNAPSHOT:
            self._write_plot(file, plot, message, log_time_ns, publish_ns)
        # counted once its plot is written too: a write error there counts the record dropped, never both
        counts = self._sessions[session_id]
        counts.written[kind] += 1
        counts.last_log_time_ns = log_time_ns
        self.stats.written[_KIND_NAMES[kind]] += 1

    def _plot_state(self, header: log_pb2.SessionHeader) -> _PlotState:
        key = (tuple(header.feature_names), tuple(header.control_names), tuple(header.action_names))
        schema = self._plot_schemas.get(key)
        if schema is None:
            schema = self._plot_schemas[key] = PlotSchema(*key)
        return _PlotState(schema, header, header.clock == pb.CLOCK_MODE_REALTIME)

    def _write_plot(
        self, file: LogFileWriter, plot: _PlotState, snap: pb.DecisionSnapshot, tick_ns: int, publish_ns: int
    ) -> None:
        if plot.offset_ns is None:
            plot.offset_ns = log_time_offset_ns(plot.header, tick_ns)
            plot.metadata = channel_metadata(plot.header, plot.offset_ns)
        log_time = publish_ns if plot.realtime else tick_ns + plot.offset_ns
        try:
            data = plot.schema.from_snapshot(snap, plot.observations.get(snap.observation_seq)).SerializeToString()
        except (ValueError, TypeError) as exc:
            # a view of the data, never worth the recording: the session's plots stop, the data topics go on
            log.warning("recorder: no more plot messages for session %r: %s", snap.session_id, exc)
            self._plots.pop(snap.session_id, None)
            return
        file.write_plot(plot.schema, plot.metadata, data, log_time, publish_ns)

    def _write_summary(self, session_id: str) -> None:
        counts = self._sessions[session_id]
        file = self._current_file()
        self._ensure_header(file, session_id, counts.last_log_time_ns)
        summary = log_pb2.SessionSummary(
            session_id=session_id,
            end_time_unix_ns=time.time_ns(),
            observations_written=counts.written[_Kind.OBSERVATION],
            snapshots_written=counts.written[_Kind.SNAPSHOT],
            plans_written=counts.written[_Kind.PLAN],
            observations_dropped=counts.dropped[_Kind.OBSERVATION],
            snapshots_dropped=counts.dropped[_Kind.SNAPSHOT],
            plans_dropped=counts.dropped[_Kind.PLAN],
        )
        file.write(TOPIC_SUMMARY, session_id, summary, counts.last_log_time_ns)

    def _finish_all(self) -> None:
        for session_id in list(self._headers):
            self._guarded(self._write_summary, session_id)
        self._headers.clear()
        self._plots.clear()
        if self._file is None and not self.stats.files:  # nothing was ever recorded: still leave a valid, empty log
            self._guarded(self._current_file)
        if self._file is not None:
            self._guarded(self._file.finish)
            self._file = None


_KIND_NAMES = {_Kind.OBSERVATION: "observation", _Kind.SNAPSHOT: "snapshot", _Kind.PLAN: "plan"}


def _event_time(kind: _Kind, message: Message | None) -> int:
    if kind is _Kind.OBSERVATION:
        return message.timestamp_ns  # type: ignore[union-attr]
    if kind is _Kind.SNAPSHOT:
        return message.scheduled_time_ns  # type: ignore[union-attr]
    return message.created_time_ns  # type: ignore[union-attr]
