"""Runs a PlanSource off the executor's path: request() and poll() cost microseconds, always.

    sched = PlanScheduler(BehaviourPlanner)           # a factory, called inside the worker
    sched.start()
    # in the tick loop:
    sched.request("car-1", features, now_ns)          # latest wins per session
    for plan in sched.poll(): ...                      # plans finished since the last poll

How it stays cheap: there is no scheduler thread in the caller's process. An earlier version had a
dispatcher thread; every time it woke it competed for the GIL with the tick loop, and CPython's 5 ms
switch interval turned that into 5 ms stalls of request() (measured p99 ~5 ms). Now request() and
poll() do the bookkeeping themselves with non-blocking pipe operations (a select with zero timeout,
one short read or write of a serialised planner.proto message, never a pickle): one request is in
flight at a time, so the pipe never fills and a write never blocks. The worker (a child process by
default, reniced, so the planner's numpy work never holds this process's GIL; a thread on request)
builds the source and plans. A worker that misses the deadline is killed (a signal, microseconds)
and its replacement is spawned by a short-lived helper thread, so even a restart never blocks the
caller. Call request(), poll(), forget() and stats() from one thread (the tick loop's).
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from dualloop.v1 import planner_pb2 as pb
from planner.plan import Plan, PlanError, PlanRequest
from planner.wire import plan_from_pb, request_to_pb
from planner.worker import FATAL, LATE, PLAN, READY, STOP_MESSAGE, SourceFactory, decode, run_worker

WorkerMode = Literal["process", "thread"]


@dataclass
class _Pending:
    features: npt.NDArray[np.float32]
    now_ns: int
    queued: float  # time.monotonic() when requested, for the latency statistic


@dataclass
class _InFlight:
    session_id: str
    sent: float  # time.monotonic()
    queued: float
    discard: bool = False  # forget() was called while it was being planned


class _Worker:
    """One worker (process or thread) and the scheduler's end of its pipe."""

    def __init__(self, factory: SourceFactory, mode: WorkerMode, nice: int | None) -> None:
        # spawn, not fork: the server process has gRPC threads, and forking a threaded process
        # can deadlock the child on a lock some other thread held.
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe(duplex=True)
        self.mode = mode
        self.started = time.monotonic()
        self.ready = False
        self.name = ""
        self._process: mp.process.BaseProcess | None = None
        self._thread: threading.Thread | None = None
        if mode == "process":
            self._process = ctx.Process(target=run_worker, args=(child, factory, nice), daemon=True,
                                        name="dualloop-planner")
            self._process.start()
            child.close()  # only the child holds its end, so its death reads as EOF here
        else:
            self._thread = threading.Thread(target=run_worker, args=(child, factory, None), daemon=True,
                                            name="dualloop-planner")
            self._thread.start()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def alive(self) -> bool:
        if self._process is not None:
            return self._process.is_alive()
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout_s: float) -> None:
        """Ask politely, then kill. A hung thread cannot be killed: it is abandoned (daemon)."""
        try:
            self.conn.send_bytes(STOP_MESSAGE)
        except (OSError, ValueError):
            pass
        if self._process is not None:
            self._process.join(timeout_s)
        self.kill()

    def kill_nowait(self) -> None:
        """SIGKILL (a thread is abandoned) and close our end; reaping is left to alive() later."""
        if self._process is not None and self._process.is_alive():
            self._process.kill()
        try:
            self.conn.close()
        except OSError:
            pass

    def kill(self) -> None:
        if self._process is not None:
            if self._process.is_alive():
                self._process.kill()
            self._process.join(2.0)
        try:
            self.conn.close()  # a thread worker blocked in recv sees EOF and exits
        except OSError:
            pass


class PlanScheduler:
    """Latest-wins plan requests per session, planned in a supervised worker."""

    def __init__(
        self,
        source_factory: SourceFactory,
        *,
        period_s: float = 0.2,
        deadline_s: float | None = None,
        mode: WorkerMode = "process",
        nice: int = 10,
        startup_timeout_s: float = 60.0,
        restart_backoff_s: float = 0.2,
        max_ready: int = 4096,
        history: int = 2048,
    ) -> None:
        if mode not in ("process", "thread"):
            raise ValueError(f"mode must be 'process' or 'thread', got {mode!r}")
        self.period_s = period_s
        self.deadline_s = period_s if deadline_s is None else deadline_s
        self.mode: WorkerMode = mode
        self._factory = source_factory
        self._nice = nice if mode == "process" else None
        self._startup_timeout_s = startup_timeout_s
        self._restart_backoff_s = restart_backoff_s
        self._backoff = restart_backoff_s

        self._pending: dict[str, _Pending] = {}
        self._outstanding: set[str] = set()  # requested, no plan/error/timeout back yet
        self._previous: dict[str, Plan] = {}
        self._ready: deque[Plan] = deque()
        self._max_ready = max_ready
        self._in_flight: _InFlight | None = None
        self._plan_us: deque[float] = deque(maxlen=history)
        self._latency_us: deque[float] = deque(maxlen=history)
        self._counts = dict.fromkeys(
            ("requests", "replaced", "overruns", "plans", "errors", "timeouts", "restarts",
             "startup_failures", "dropped_unpolled"), 0)
        self._last_error = ""

        self._worker: _Worker | None = None
        self._starter: threading.Thread | None = None  # spawning a replacement worker
        self._started_worker: _Worker | None = None  # handed over by the starter thread
        self._dying: list[_Worker] = []  # killed, not yet reaped
        self._next_start = 0.0
        self._running = False

    # ---- lifecycle (not on the tick path: these may block) ---------------------------------
    def start(self, wait_ready: bool = True, timeout_s: float | None = None) -> None:
        """Start the worker; by default wait until its source is built (errors are raised here)."""
        if self._running:
            raise RuntimeError("PlanScheduler already started")
        self._running = True
        self._worker = _Worker(self._factory, self.mode, self._nice)
        if not wait_ready:
            return
        give_up = time.monotonic() + (self._startup_timeout_s if timeout_s is None else timeout_s)
        while not (self._worker is not None and self._worker.ready):
            if self._counts["startup_failures"]:
                self.stop()
                raise RuntimeError(f"planner worker failed to start: {self._last_error}")
            if time.monotonic() > give_up:
                self.stop()
                raise TimeoutError("planner worker not ready within the startup timeout")
            if self._worker is not None:
                self._worker.conn.poll(0.01)
            else:
                time.sleep(0.01)
            self._pump()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the worker(s); no process started here outlives this call."""
        if not self._running:
            return
        self._running = False
        if self._starter is not None:
            self._starter.join(self._startup_timeout_s)
            self._starter = None
        for worker in (self._worker, self._started_worker):
            if worker is not None:
                worker.stop(timeout_s)
        self._worker = self._started_worker = None
        for worker in self._dying:
            worker.kill()
        self._dying.clear()

    def __enter__(self) -> "PlanScheduler":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def replace_source(self, source_factory: SourceFactory) -> None:
        """Use another source from now on: the current worker is retired (killed if busy)."""
        self._factory = source_factory
        if self._worker is not None:
            self._retire(self._worker, count_timeout=False)
        self._next_start = time.monotonic()
        self._pump()

    # ---- the tick loop's side: cheap and non-blocking ---------------------------------------
    def request(self, session_id: str, features: npt.NDArray[np.float32], now_ns: int) -> None:
        """Ask for a plan for this session; a newer request replaces one not yet started."""
        counts = self._counts
        counts["requests"] += 1
        if session_id in self._outstanding:
            counts["overruns"] += 1  # the previous request's plan was not ready in time
        if session_id in self._pending:
            counts["replaced"] += 1
        self._pending[session_id] = _Pending(np.array(features, dtype=np.float32, copy=True), now_ns,
                                             time.monotonic())
        self._outstanding.add(session_id)
        worker = self._worker
        if worker is not None and worker.ready and self._in_flight is None:
            self._send_next(worker)

    def poll(self) -> list[Plan]:
        """Plans finished since the last poll (oldest first). Also moves the work along."""
        self._pump()
        if not self._ready:
            return []
        plans = list(self._ready)
        self._ready.clear()
        return plans

    def forget(self, session_id: str) -> None:
        """Drop everything about a session (closed): its pending request, in-flight result, history."""
        self._pending.pop(session_id, None)
        self._outstanding.discard(session_id)
        self._previous.pop(session_id, None)
        if self._in_flight is not None and self._in_flight.session_id == session_id:
            self._in_flight.discard = True

    def stats(self) -> dict[str, float | int | str | None]:
        out: dict[str, float | int | str | None] = dict(self._counts)
        out["pending"] = len(self._pending)
        out["in_flight"] = int(self._in_flight is not None)
        out["last_error"] = self._last_error
        for key, history in (("plan_time_us", self._plan_us), ("latency_us", self._latency_us)):
            values = np.asarray(history)
            out[f"{key}_p50"] = float(np.percentile(values, 50)) if values.size else float("nan")
            out[f"{key}_p99"] = float(np.percentile(values, 99)) if values.size else float("nan")
        worker = self._worker
        out["worker_pid"] = worker.pid if worker is not None else None
        out["source"] = worker.name if worker is not None else ""
        return out

    # ---- moving the work along (runs inside request/poll: non-blocking only) ---------------
    def _pump(self) -> None:
        if not self._running:
            return
        now = time.monotonic()
        if self._dying:
            self._dying = [w for w in self._dying if w.alive()]  # reaps exited children (WNOHANG)
        worker = self._worker
        if worker is None:
            self._adopt_or_spawn(now)
            return
        while worker is self._worker and worker.conn.poll(0):
            self._receive(worker)
        worker = self._worker
        if worker is None:
            return
        flight = self._in_flight
        if flight is not None and now > flight.sent + self.deadline_s:
            self._last_error = f"no plan within {self.deadline_s * 1e3:.0f} ms: worker replaced"
            self._retire(worker, count_timeout=True)
            self._next_start = now  # a hang is the source's fault, not a reason to wait
        elif not worker.ready and now > worker.started + self._startup_timeout_s:
            self._counts["startup_failures"] += 1
            self._last_error = f"worker not ready within {self._startup_timeout_s:.0f} s"
            self._retire(worker, count_timeout=False)
            self._schedule_backoff(now)
        elif worker.ready and flight is None and self._pending:
            self._send_next(worker)

    def _adopt_or_spawn(self, now: float) -> None:
        if self._starter is not None:
            if self._starter.is_alive():
                return
            self._starter = None
            self._worker, self._started_worker = self._started_worker, None
            return
        if now >= self._next_start:
            # Spawning takes milliseconds (fork + exec): a helper thread does it, off the tick path.
            self._starter = threading.Thread(target=self._spawn, name="dualloop-planner-start", daemon=True)
            self._starter.start()

    def _spawn(self) -> None:
        try:
            self._started_worker = _Worker(self._factory, self.mode, self._nice)
        except Exception as err:  # noqa: BLE001 - e.g. an unpicklable factory: report, retry later
            self._counts["startup_failures"] += 1
            self._last_error = f"cannot start the planner worker: {type(err).__name__}: {err}"
            self._schedule_backoff(time.monotonic())

    def _schedule_backoff(self, now: float) -> None:
        self._next_start = now + self._backoff
        self._backoff = min(self._backoff * 2.0, 5.0)

    def _retire(self, worker: _Worker, count_timeout: bool) -> None:
        worker.kill_nowait()
        if worker.pid is not None:  # a hung thread cannot be reaped; it is simply abandoned
            self._dying.append(worker)
        self._worker = None
        self._counts["restarts"] += 1
        if count_timeout:
            self._counts["timeouts"] += 1
        flight, self._in_flight = self._in_flight, None
        if flight is not None and flight.session_id not in self._pending:
            self._outstanding.discard(flight.session_id)

    def _send_next(self, worker: _Worker) -> None:
        session_id = next(iter(self._pending))  # oldest first: no session starves
        pending = self._pending.pop(session_id)
        request = PlanRequest(session_id, pending.features, pending.now_ns, self._previous.get(session_id))
        self._in_flight = _InFlight(session_id, time.monotonic(), pending.queued)
        try:
            worker.conn.send_bytes(request_to_pb(request).SerializeToString())
        except (OSError, ValueError):
            pass  # the worker died: its EOF (or the deadline) replaces it

    def _receive(self, worker: _Worker) -> None:
        now = time.monotonic()
        try:
            kind, elapsed_ns, payload = decode(worker.conn.recv_bytes())
        except (EOFError, OSError, ValueError):
            # The worker is gone; a source that kills its interpreter is an error, not a hang.
            if self._in_flight is not None:
                self._counts["errors"] += 1
            self._last_error = "planner worker exited"
            self._retire(worker, count_timeout=False)
            self._schedule_backoff(now)
            return
        if kind == READY:
            worker.ready, worker.name = True, payload.decode("utf-8", "replace")
            self._backoff = self._restart_backoff_s
            return
        if kind == FATAL:
            self._counts["startup_failures"] += 1
            self._last_error = f"cannot build the plan source: {payload.decode('utf-8', 'replace')}"
            self._retire(worker, count_timeout=False)
            self._schedule_backoff(now)
            return
        flight, self._in_flight = self._in_flight, None
        if flight is None:
            return  # an answer to nothing (cannot happen with one request in flight)
        if flight.session_id not in self._pending:
            self._outstanding.discard(flight.session_id)
        if kind != PLAN:
            self._counts["timeouts" if kind == LATE else "errors"] += 1
            self._last_error = payload.decode("utf-8", "replace")
            return
        try:
            plan = plan_from_pb(pb.PlanResponse.FromString(payload))
            if plan.session_id != flight.session_id:
                raise PlanError(f"plan for session {plan.session_id!r} answers a request for {flight.session_id!r}")
        except Exception as err:  # noqa: BLE001 - a malformed plan is the source's error
            self._counts["errors"] += 1
            self._last_error = f"invalid plan: {err}"
            return
        self._plan_us.append(elapsed_ns / 1e3)
        self._latency_us.append((now - flight.queued) * 1e6)
        if flight.discard:
            return
        self._counts["plans"] += 1
        self._previous[flight.session_id] = plan
        if len(self._ready) >= self._max_ready:
            self._ready.popleft()
            self._counts["dropped_unpolled"] += 1
        self._ready.append(plan)
