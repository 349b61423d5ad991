"""The planner worker: builds a PlanSource and answers batches of plan requests over a multiprocessing pipe.

Runs as a child process (default) or a thread. Messages are bytes only, never pickles. A batch is a
run of frames, each a struct header (kind, payload length) followed by its payload:
  scheduler -> worker: one message per batch, a REQUEST frame per session, each a serialised
    planner.proto PlanRequest; b"" asks the worker to exit.
  worker -> scheduler: an envelope header (kind; planning wall time and CPU time, and the worker's
  CPU time so far, in ns) followed by
    READY  + the source's name (utf-8), once the source is built;
    BATCH  + one frame per request of the batch, in request order (a long batch is answered in
             several BATCH messages, see below); the times are the whole batch's (wall time much
             longer than CPU time means the niced worker waited for a CPU);
    ERROR  + a message (utf-8): the batch message itself could not be read (a bug, not a source
             fault): every request still unanswered in it failed;
    FATAL  + a message: the source could not be built, the worker exits.
  A reply frame's kind says what became of that one request, so one bad request never fails the
  others:
    PLAN   + a serialised planner.proto PlanResponse;
    ERROR  + a message: the source raised for this request (or its features were not finite);
    LATE   + a message: the source itself gave up on a deadline (e.g. RemotePlanner's PlanTimeout);
    SKIP   + a message: not attempted (see below); the scheduler asks again with the next batch.

A source with plan_many(requests) (BehaviourPlanner) plans the whole batch in one call. Any other
source (RemotePlanner, OnnxPlanner, user sources) is called once per request, and so that a slow one
cannot run a long batch into the scheduler's deadline (and get the worker killed, a restart costing
a second of CPU), the worker stops starting new requests once the batch has used `budget_s`, or once
the source said LATE (a remote that timed out once will time out for the next session too: one
deadline per batch, not one per session). The rest are answered SKIP.

Replies are cut into messages of at most MAX_REPLY_BYTES: multiprocessing writes a message that
small in one system call, so the scheduler's non-blocking poll never finds half a message and waits
for the rest while this niced process is descheduled.
"""

from __future__ import annotations

import math
import signal
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import cast

from dualloop.planner import priority
from dualloop.planner.plan import Plan, PlanRequest, PlanSource

# grpc comes with it (~0.2 s): imported with this module, before READY, never inside a batch's deadline
from dualloop.planner.remote import PlanTimeout
from dualloop.planner.wire import plan_to_pb, request_from_pb
from dualloop.v2 import planner_pb2 as pb

READY, BATCH, FATAL = b"R", b"B", b"F"  # envelope kinds (ERROR too)
REQUEST, PLAN, ERROR, LATE, SKIP = b"Q", b"P", b"E", b"L", b"S"  # frame kinds
_HEADER = struct.Struct("<cqqq")  # envelope: kind, planning wall and CPU time, CPU time so far (ns)
_FRAME = struct.Struct("<cI")  # frame: kind, payload length
STOP_MESSAGE = b""
MAX_REPLY_BYTES = 16 * 1024  # multiprocessing.Connection sends up to 16 KiB in a single write
_MAX_ERROR_BYTES = 1024

SourceFactory = Callable[[], PlanSource]
Reply = tuple[bytes, bytes]  # (frame kind, payload)
_SKIPPED = object()  # a request _plan_each did not attempt


@dataclass(frozen=True)
class Envelope:
    kind: bytes
    wall_ns: int  # time spent planning the batch
    cpu_ns: int  # CPU time the worker used for it
    cpu_total_ns: int  # the planning thread's CPU time so far (the clock of /proc/.../schedstat)
    payload: bytes


def encode(kind: bytes, payload: bytes, wall_ns: int = 0, cpu_ns: int = 0) -> bytes:
    return _HEADER.pack(kind, wall_ns, cpu_ns, time.thread_time_ns()) + payload


def decode(message: bytes) -> Envelope:
    if len(message) < _HEADER.size:
        raise ValueError(f"planner worker sent a {len(message)}-byte message, shorter than its header")
    kind, wall_ns, cpu_ns, cpu_total_ns = _HEADER.unpack_from(message)
    return Envelope(kind, wall_ns, cpu_ns, cpu_total_ns, message[_HEADER.size :])


def pack_frames(frames: Sequence[Reply]) -> bytes:
    return b"".join(_FRAME.pack(kind, len(payload)) + payload for kind, payload in frames)


def unpack_frames(data: bytes) -> list[Reply]:
    """Raises ValueError for a truncated frame."""
    frames: list[Reply] = []
    view = memoryview(data)
    at = 0
    while at < len(data):
        if at + _FRAME.size > len(data):
            raise ValueError(f"truncated frame header at byte {at} of {len(data)}")
        kind, n = _FRAME.unpack_from(data, at)
        at += _FRAME.size
        if at + n > len(data):
            raise ValueError(f"frame of {n} bytes at byte {at} runs past the end ({len(data)})")
        frames.append((kind, bytes(view[at : at + n])))
        at += n
    return frames


def _describe(err: BaseException) -> bytes:
    return f"{type(err).__name__}: {err}".encode("utf-8", "replace")[:_MAX_ERROR_BYTES]


def run_worker(
    conn: Connection, factory: SourceFactory, nice: int | None = None, budget_s: float = math.inf, idle: bool = False
) -> None:
    """Worker main loop; returns when the scheduler closes the pipe or sends STOP_MESSAGE.
    idle: run SCHED_IDLE between batches (the scheduler raises it while a batch waits for a CPU,
    planner.priority)."""
    if nice is not None:  # process mode only: a thread cannot be reniced on its own portably
        # The scheduler (not Ctrl-C) decides when the worker ends.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        priority.lower(nice, idle)
    idle = idle and nice is not None
    try:
        source = factory()
        name = str(getattr(source, "name", type(source).__name__))
    except BaseException as err:  # noqa: BLE001 - any failure to build is reported, then we exit
        _send(conn, encode(FATAL, _describe(err)))
        return
    if not _send(conn, encode(READY, name.encode())):
        return
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return  # the scheduler is gone or replaced us
        if data == STOP_MESSAGE:
            return
        t0, cpu0 = time.perf_counter_ns(), time.thread_time_ns()
        try:
            frames = unpack_frames(data)
        except ValueError as err:
            if not _send(conn, encode(ERROR, _describe(err))):
                return
            continue
        replies = answer_batch(source, [payload for _, payload in frames], budget_s)
        timing = (time.perf_counter_ns() - t0, time.thread_time_ns() - cpu0)
        for message in _reply_messages(replies, *timing):
            if not _send(conn, message):
                return
        if idle:  # the scheduler may have raised us while the batch waited for a CPU
            priority.to_idle()


def answer_batch(source: PlanSource, payloads: Sequence[bytes], budget_s: float = math.inf) -> list[Reply]:
    """One reply frame per serialised PlanRequest, in order."""
    replies: list[Reply | None] = [None] * len(payloads)
    requests: list[PlanRequest] = []
    slots: list[int] = []
    for i, payload in enumerate(payloads):
        try:
            requests.append(request_from_pb(pb.PlanRequest.FromString(payload)))
            slots.append(i)
        except Exception as err:  # noqa: BLE001 - a request we cannot read fails alone
            replies[i] = (ERROR, _describe(err))
    for i, result in zip(slots, _plan(source, requests, budget_s)):
        replies[i] = _reply(result)
    return cast("list[Reply]", replies)  # every slot was filled above


def _plan(source: PlanSource, requests: Sequence[PlanRequest], budget_s: float) -> list[object]:
    """A Plan, an exception or _SKIPPED per request."""
    if not requests:
        return []
    plan_many = getattr(source, "plan_many", None)
    if not callable(plan_many):
        return _plan_each(source, requests, budget_s)
    try:
        results = list(plan_many(requests))
    except Exception as err:  # noqa: BLE001 - the whole call failed: every request failed with it
        return [err] * len(requests)
    if len(results) != len(requests):
        mismatch = RuntimeError(
            f"{type(source).__name__}.plan_many returned {len(results)} results for {len(requests)} requests"
        )
        return [mismatch] * len(requests)
    return results


def _plan_each(source: PlanSource, requests: Sequence[PlanRequest], budget_s: float) -> list[object]:
    results: list[object] = []
    start = time.monotonic()
    gave_up = False
    for request in requests:
        if results and (gave_up or time.monotonic() - start > budget_s):
            results.append(_SKIPPED)
            continue
        try:
            results.append(source.plan(request))
        except Exception as err:  # noqa: BLE001 - a raising source is counted, not fatal
            results.append(err)
            gave_up = isinstance(err, PlanTimeout)
    return results


def _reply(result: object) -> Reply:
    if result is _SKIPPED:
        return SKIP, b"not attempted: the batch ran out of time"
    if isinstance(result, PlanTimeout):
        return LATE, _describe(result)
    if isinstance(result, BaseException):
        return ERROR, _describe(result)
    if not isinstance(result, Plan):
        return ERROR, f"the source returned {type(result).__name__}, not a Plan".encode()
    try:
        return PLAN, plan_to_pb(result).SerializeToString()
    except Exception as err:  # noqa: BLE001 - a plan that cannot be put on the wire is the source's error
        return ERROR, _describe(err)


def _reply_messages(replies: Sequence[Reply], wall_ns: int, cpu_ns: int) -> Iterator[bytes]:
    """BATCH messages of at most MAX_REPLY_BYTES each (one frame per message if a frame is bigger)."""
    chunk: list[Reply] = []
    size = _HEADER.size
    for reply in replies:
        frame_size = _FRAME.size + len(reply[1])
        if chunk and size + frame_size > MAX_REPLY_BYTES:
            yield encode(BATCH, pack_frames(chunk), wall_ns, cpu_ns)
            chunk, size = [], _HEADER.size
        chunk.append(reply)
        size += frame_size
    if chunk or not replies:
        yield encode(BATCH, pack_frames(chunk), wall_ns, cpu_ns)


def _send(conn: Connection, message: bytes) -> bool:
    try:
        conn.send_bytes(message)
        return True
    except (OSError, EOFError, ValueError):  # pipe closed by the scheduler: we were replaced
        return False
