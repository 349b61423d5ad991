"""The planner worker: builds a PlanSource and answers plan requests over a multiprocessing pipe.

Runs as a child process (default) or a thread. Messages are bytes only, never pickles:
  scheduler -> worker: a serialised planner.proto PlanRequest; b"" asks the worker to exit.
  worker -> scheduler: an envelope header (kind, planning time in ns) followed by
    READY  + the source's name (utf-8), once the source is built;
    PLAN   + a serialised planner.proto PlanResponse;
    ERROR  + a message (utf-8): the source raised, the request is answered, the worker carries on;
    LATE   + a message: the source itself gave up on a deadline (e.g. RemotePlanner's PlanTimeout);
    FATAL  + a message: the source could not be built, the worker exits.
"""

from __future__ import annotations

import os
import signal
import struct
import time
from multiprocessing.connection import Connection
from typing import Callable

from dualloop.v1 import planner_pb2 as pb
from planner.plan import PlanSource
from planner.wire import plan_to_pb, request_from_pb

READY, PLAN, ERROR, LATE, FATAL = b"R", b"P", b"E", b"L", b"F"
_HEADER = struct.Struct("<cq")  # kind, planning time in ns
STOP_MESSAGE = b""

SourceFactory = Callable[[], PlanSource]


def encode(kind: bytes, elapsed_ns: int, payload: bytes) -> bytes:
    return _HEADER.pack(kind, elapsed_ns) + payload


def decode(message: bytes) -> tuple[bytes, int, bytes]:
    if len(message) < _HEADER.size:
        raise ValueError(f"planner worker sent a {len(message)}-byte message, shorter than its header")
    kind, elapsed_ns = _HEADER.unpack_from(message)
    return kind, elapsed_ns, message[_HEADER.size:]


def _describe(err: BaseException) -> bytes:
    return f"{type(err).__name__}: {err}".encode("utf-8", "replace")[:4096]


def run_worker(conn: Connection, factory: SourceFactory, nice: int | None = None) -> None:
    """Worker main loop; returns when the scheduler closes the pipe or sends STOP_MESSAGE."""
    if nice is not None:  # process mode only: a thread cannot be reniced on its own portably
        # The scheduler (not Ctrl-C) decides when the worker ends.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            os.nice(nice)  # the executor's ticks outrank planning on a 2-core machine
        except OSError:
            pass
    from planner.remote import PlanTimeout  # imported here: keeps grpc out of the module's import cost

    try:
        source = factory()
        name = str(getattr(source, "name", type(source).__name__))
    except BaseException as err:  # noqa: BLE001 - any failure to build is reported, then we exit
        _send(conn, encode(FATAL, 0, _describe(err)))
        return
    if not _send(conn, encode(READY, 0, name.encode())):
        return
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return  # the scheduler is gone or replaced us
        if data == STOP_MESSAGE:
            return
        t0 = time.perf_counter_ns()
        try:
            request = request_from_pb(pb.PlanRequest.FromString(data))
            plan = source.plan(request)
            reply = encode(PLAN, time.perf_counter_ns() - t0, plan_to_pb(plan).SerializeToString())
        except PlanTimeout as err:
            reply = encode(LATE, time.perf_counter_ns() - t0, _describe(err))
        except Exception as err:  # noqa: BLE001 - a raising source is counted, not fatal
            reply = encode(ERROR, time.perf_counter_ns() - t0, _describe(err))
        if not _send(conn, reply):
            return


def _send(conn: Connection, message: bytes) -> bool:
    try:
        conn.send_bytes(message)
        return True
    except (OSError, EOFError, ValueError):  # pipe closed by the scheduler: we were replaced
        return False
