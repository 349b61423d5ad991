"""The workers' board: each server process of `dualloop serve --workers N` publishes its counters here.

One small file in shared memory (/dev/shm when there is one), mapped by every worker as a numpy
array: a header row, then one row per worker slot. A worker writes only its own row (every
PUBLISH_EVERY ticks, and when it answers GetStats); any worker reads every row to answer GetStats for
the whole server. Plain float64 numbers, no pickle and no socket: a worker that hangs or dies cannot
block the others' answers, and what it published last stays readable.

Rows are written under a sequence lock (odd while being written): a reader retries a row it caught
mid-write. The header is changed only under an exclusive flock of the file (a worker that ended
retired into it by the parent, a GetStats reset by a worker) and read under a shared one, so a
reader never sees a retired row both in the header and in its slot.

One GetStats window for the whole server: its start is on the header (the board's creation, then
each reset), a row's window counts are summed only when published in the current window (its epoch),
and a worker that ends leaves its window counts in the header as it leaves its totals: a restart
changes neither the window's start nor its counts.

Tick lateness is published as a histogram over fine log-spaced bins (2% wide, so merged
percentiles are within 2% of the exact ones; a bin's upper edge is reported, never less than the
truth) that contains GetStats' own bucket bounds, so the coarse buckets add up exactly.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

PUBLISH_EVERY = 20  # ticks: 100 ms at 5 ms, how stale another worker's figures can be in GetStats

# header fields (row 0)
H_WORKERS, H_RESET_EPOCH, H_STARTED_NS, H_RESTARTS = 0, 1, 2, 3
H_RETIRED_TICKS, H_RETIRED_MISSED, H_RETIRED_SENT = 4, 5, 6  # totals of worker processes that ended
H_RETIRED_DROPPED = 7
# the window: its start (monotonic ns), and the window counts of the worker processes that ended in it;
# the header row's histogram part holds their lateness histogram
H_WINDOW_START_NS, H_WINDOW_TICKS, H_WINDOW_MISSED, H_WINDOW_SENT, H_WINDOW_OPENED, H_WINDOW_MAX_US = range(8, 14)

# worker row fields
(
    SEQ,
    PID,
    READY,
    TICKS,
    TICKS_TOTAL,
    MISSED,
    MISSED_TOTAL,
    SESSIONS_OPEN,
    SESSIONS_OPENED,
    SNAPSHOTS_SENT,
    SNAPSHOTS_SENT_TOTAL,
    LATENESS_MAX_US,
    LATENESS_COUNT,
    METRICS_PORT,
    PUBLISHED_NS,
    DRAINING,
    RECORDS_DROPPED,
    RECORDER_QUEUE_BYTES,
    EPOCH,  # the reset epoch of the window the row's window counts belong to (stamped by write)
) = range(19)
N_FIELDS = 19


def fine_edges(coarse_us: Sequence[float]) -> npt.NDArray[np.float64]:
    """Upper bounds (us) of the fine lateness bins: 2% steps from 0.1 us to 1 s, plus the coarse bounds."""
    grid = 0.1 * 1.02 ** np.arange(int(np.log(1e7) / np.log(1.02)) + 2)
    return np.unique(np.concatenate([grid, np.asarray(coarse_us, np.float64)]))


@dataclass
class Totals:
    """The whole server's figures, summed over the workers' rows (GetStats)."""

    ticks: int
    ticks_total: int
    missed: int
    missed_total: int
    sessions_open: int
    sessions_opened: int
    snapshots_sent: int
    snapshots_sent_total: int
    lateness_max_us: float
    histogram: npt.NDArray[np.int64]  # over fine_edges, the last bin above every edge
    workers: int
    workers_ready: int
    started_ns: int
    opened_per_worker: list[int]
    records_dropped: int = 0  # recording: since the server started, and the queues' bytes now
    recorder_queue_bytes: int = 0
    window_start_ns: int = 0  # the window's start, shared by every worker (monotonic clock)


class Board:
    """The mapped file. create() in the parent; attach() in each worker."""

    def __init__(self, path: Path, workers: int, coarse_us: Sequence[float], owner: bool) -> None:
        self.path = path
        self.edges = fine_edges(coarse_us)
        self.coarse_index = np.searchsorted(self.edges, np.asarray(coarse_us, np.float64))
        self.row_size = N_FIELDS + self.edges.size + 1
        self.workers = workers
        size = (workers + 1) * self.row_size * 8
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if owner else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if owner:
                os.ftruncate(fd, size)
            elif os.fstat(fd).st_size != size:
                raise ValueError(f"worker board {path}: {os.fstat(fd).st_size} bytes, expected {size}")
            self._mmap = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd  # kept for flock: the header's lock (still valid once the file is unlinked)
        self.array = np.frombuffer(self._mmap, dtype=np.float64).reshape(workers + 1, self.row_size)
        self.owner = owner
        # the session ids open on any worker (session_claims.py), made and removed with the board
        self.sessions_folder = path.with_name(path.name + ".sessions")
        if owner:
            self.sessions_folder.mkdir(mode=0o700)

    @classmethod
    def create(cls, workers: int, coarse_us: Sequence[float]) -> Board:
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        path = Path(folder) / f"dualloop-board-{os.getpid()}-{time.monotonic_ns()}"
        board = cls(path, workers, coarse_us, owner=True)
        board.array[0, H_WORKERS] = workers
        board.array[0, H_STARTED_NS] = board.array[0, H_WINDOW_START_NS] = time.monotonic_ns()
        return board

    @classmethod
    def attach(cls, path: Path, workers: int, coarse_us: Sequence[float]) -> Board:
        return cls(path, workers, coarse_us, owner=False)

    def close(self) -> None:
        self.array = np.zeros((0, 0))  # drop the view before the map it points into
        self._mmap.close()
        os.close(self._fd)
        if self.owner:
            self.path.unlink(missing_ok=True)
            shutil.rmtree(self.sessions_folder, ignore_errors=True)

    @contextmanager
    def _locked(self, exclusive: bool) -> Iterator[None]:
        """The header's lock, across processes (microseconds: held only to add up or change numbers)."""
        fcntl.flock(self._fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def row(self, slot: int) -> npt.NDArray[np.float64]:
        return self.array[slot + 1]

    def write(self, slot: int, fields: dict[int, float], histogram: npt.NDArray[np.int64] | None) -> None:
        """Publish a worker's figures (only that worker writes its row)."""
        row = self.row(slot)
        row[SEQ] += 1  # odd: being written
        for k, v in fields.items():
            row[k] = v
        # the caller (SessionRuntime.publish) has just started a new window if a reset asked for one
        row[EPOCH] = self.array[0, H_RESET_EPOCH]
        if histogram is not None:
            row[N_FIELDS:] = histogram
        row[SEQ] += 1

    def read_row(self, slot: int) -> npt.NDArray[np.float64]:
        row = self.row(slot)
        for _ in range(1000):
            seq = row[SEQ]
            copy = row.copy()
            if seq % 2 == 0 and row[SEQ] == seq:
                return copy
            time.sleep(0)
        return row.copy()  # a writer that died mid-write: its last numbers, as they are

    def retire(self, slot: int) -> None:
        """The worker in slot ended (the parent calls this before starting another in its place):
        its totals move to the header, so that the server's totals since start keep them, and so do
        its window counts if they are of the current window (GetStats' window goes on across it)."""
        with self._locked(exclusive=True):
            row = self.read_row(slot)
            h = self.array[0]
            h[H_RETIRED_TICKS] += row[TICKS_TOTAL]
            h[H_RETIRED_MISSED] += row[MISSED_TOTAL]
            h[H_RETIRED_SENT] += row[SNAPSHOTS_SENT_TOTAL]
            h[H_RETIRED_DROPPED] += row[RECORDS_DROPPED]
            if row[EPOCH] == h[H_RESET_EPOCH]:
                h[H_WINDOW_TICKS] += row[TICKS]
                h[H_WINDOW_MISSED] += row[MISSED]
                h[H_WINDOW_SENT] += row[SNAPSHOTS_SENT]
                h[H_WINDOW_OPENED] += row[SESSIONS_OPENED]
                h[H_WINDOW_MAX_US] = max(h[H_WINDOW_MAX_US], row[LATENESS_MAX_US])
                h[N_FIELDS:] += row[N_FIELDS:]
            self.row(slot)[:] = 0

    @property
    def reset_epoch(self) -> int:
        return int(self.array[0, H_RESET_EPOCH])

    def request_reset(self) -> int:
        """GetStats(reset=True) on any worker resets every worker's window (each at its next publish;
        until then its row counts nothing in the window): the new epoch."""
        with self._locked(exclusive=True):
            h = self.array[0]
            h[H_RESET_EPOCH] += 1
            h[H_WINDOW_START_NS] = time.monotonic_ns()
            h[H_WINDOW_TICKS : H_WINDOW_MAX_US + 1] = 0
            h[N_FIELDS:] = 0
            return self.reset_epoch

    def totals(self) -> Totals:
        with self._locked(exclusive=False):
            rows = np.stack([self.read_row(s) for s in range(self.workers)])
            h = self.array[0].copy()
        window = rows * (rows[:, EPOCH] == h[H_RESET_EPOCH])[:, None]  # rows published before a reset: 0

        def total(k: int, of: npt.NDArray[np.float64] = rows) -> int:
            return int(of[:, k].sum())

        return Totals(
            ticks=total(TICKS, window) + int(h[H_WINDOW_TICKS]),
            ticks_total=total(TICKS_TOTAL) + int(h[H_RETIRED_TICKS]),
            missed=total(MISSED, window) + int(h[H_WINDOW_MISSED]),
            missed_total=total(MISSED_TOTAL) + int(h[H_RETIRED_MISSED]),
            sessions_open=total(SESSIONS_OPEN),
            sessions_opened=total(SESSIONS_OPENED, window) + int(h[H_WINDOW_OPENED]),
            snapshots_sent=total(SNAPSHOTS_SENT, window) + int(h[H_WINDOW_SENT]),
            snapshots_sent_total=total(SNAPSHOTS_SENT_TOTAL) + int(h[H_RETIRED_SENT]),
            lateness_max_us=float(max(window[:, LATENESS_MAX_US].max(initial=0.0), h[H_WINDOW_MAX_US])),
            histogram=(window[:, N_FIELDS:].sum(axis=0) + h[N_FIELDS:]).astype(np.int64),
            workers=self.workers,
            workers_ready=int((rows[:, READY] > 0).sum()),
            started_ns=int(h[H_STARTED_NS]),
            opened_per_worker=[int(v) for v in window[:, SESSIONS_OPENED]],
            records_dropped=total(RECORDS_DROPPED) + int(h[H_RETIRED_DROPPED]),
            recorder_queue_bytes=total(RECORDER_QUEUE_BYTES),
            window_start_ns=int(h[H_WINDOW_START_NS]),
        )

    def percentiles_us(
        self, histogram: npt.NDArray[np.int64], qs: Sequence[float], max_us: float | None = None
    ) -> list[float]:
        """Percentiles (0-100) of a fine histogram: the upper edge of the bin holding each rank, but
        never above max_us, the exact largest value when known (every value in the first bin, under
        its 0.1 us edge, would otherwise report a p99 above the max)."""
        n = int(histogram.sum())
        if n == 0:
            return [0.0] * len(qs)
        cum = np.cumsum(histogram)
        upper = np.append(self.edges, self.edges[-1])  # the overflow bin: at least the last edge
        out = []
        for q in qs:
            rank = max(1, int(np.ceil(q / 100 * n)))
            edge = float(upper[int(np.searchsorted(cum, rank, side="left"))])
            out.append(edge if max_us is None else min(edge, max_us))
        return out

    def coarse(self, histogram: npt.NDArray[np.int64]) -> list[int]:
        """GetStats' buckets (value <= bound; the last above every bound) from a fine histogram."""
        cum = np.concatenate([[0], np.cumsum(histogram)])
        ends = np.append(self.coarse_index + 1, histogram.size)
        starts = np.concatenate([[0], ends[:-1]])
        return [int(cum[e] - cum[s]) for s, e in zip(starts, ends)]


class LatenessHistogram:
    """A worker's lateness window as fine-bin counts, fed from its LatenessLog between publishes."""

    def __init__(self, edges: npt.NDArray[np.float64]) -> None:
        self.edges = edges
        self.counts = np.zeros(edges.size + 1, np.int64)
        self.max_us = 0.0
        self.n = 0

    def add(self, lateness_ns: npt.NDArray[np.int64]) -> None:
        if lateness_ns.size == 0:
            return
        us = lateness_ns.astype(np.float64) / 1e3
        self.counts += np.bincount(np.searchsorted(self.edges, us, side="left"), minlength=self.counts.size)
        self.max_us = max(self.max_us, float(us.max()))
        self.n += int(us.size)
