"""Runs a PlanSource off the executor's path: request() and poll() cost microseconds, always.

    sched = PlanScheduler(BehaviourPlanner)           # a factory, called inside the worker
    # or PlanScheduler(factory, SchedulerConfig(period_s=0.1, mode="thread")): the knobs
    sched.start()
    # in the tick loop:
    sched.request("car-1", features, now_ns)          # latest wins per session
    for plan in sched.poll(): ...                      # plans finished since the last poll

How it stays cheap: there is no scheduler thread in the caller's process (a dispatcher thread
competes with the tick loop for the GIL, and CPython's 5 ms switch interval turns that into 5 ms
stalls of request(): docs/design-notes/planner.md). request() only notes the request, and poll()
does the rest with non-blocking pipe operations (a select with zero timeout, short reads and one
write of serialised planner.proto messages, never a pickle).

Requests are planned in batches: poll() sends everything requested since the last batch (up to
max_batch sessions, oldest first so no session starves) as one message (with hold=True, only after
release(): a caller that spreads its requests over a few ticks still sends one batch), and the worker plans the
batch in one call when its source has plan_many() (the behaviour planner rolls all sessions out
together: a batch of 32 costs about what one session used to). One batch is in flight at a time,
so the pipe never fills and a write never blocks; requests made meanwhile wait for the next batch
(a newer request for a session replaces its older one). Every request of a batch is answered on
its own (a plan, an error, a timeout, or "not attempted, ask again" from a per-request source that
ran out of time), so one bad request never fails the others.

The worker (a child process by default, reniced, so the planner's numpy work never holds this
process's GIL; a thread on request) builds the source and plans. Where the kernel lets this
process raise it again, the worker process waits and plans under SCHED_IDLE, so that it never delays
anything else on the machine, and a batch still waiting for a CPU after raise_after_s (a quarter of
the deadline by default) is raised to SCHED_BATCH at its nice level until it is answered
(planner.priority); elsewhere it runs SCHED_BATCH throughout. A batch still unanswered at the
deadline is killed with its worker (a signal, microseconds), every session in it counts as a
timeout, and the replacement is spawned by a short-lived helper thread, so even a restart never
blocks the caller. A worker short of CPU at the deadline is not hung (Linux: ready to run now, or
waiting on a run queue for half the time since the last look, from /proc): it gets until it could
have used a deadline's worth of CPU, up to starved_limit_s. On a busy machine the niced
worker waits first, and killing it would only start a fresh one, cold, on the same busy machine.

A request is encoded when it is made and a plan decoded when poll() hands it out, at most poll's
limit a call: a batch of 32 plans decoded in the tick that received it cost that tick ~0.3 ms.

Call request(), poll(), forget() and stats() from one thread (the tick loop's).

Counters (stats()): requests; plans; errors; timeouts (a session's plan abandoned at a deadline:
its own source's, or the batch's); overruns (a session's previous request not answered when the
next came: a missed planning cycle); replaced (a pending request replaced by a newer one);
requeued (skipped by a per-request source short of time, asked again); batches; starved_batches
(batches whose deadline was moved on because the worker waited for a CPU); restarts.
"""

from __future__ import annotations

import bisect
import itertools
import multiprocessing as mp
import select
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from dualloop.planner import priority
from dualloop.planner.plan import Plan, PlanError
from dualloop.planner.wire import plan_from_pb, request_bytes
from dualloop.planner.worker import (
    BATCH,
    FATAL,
    LATE,
    PLAN,
    READY,
    REQUEST,
    SKIP,
    STOP_MESSAGE,
    SourceFactory,
    decode,
    pack_frames,
    run_worker,
    unpack_frames,
)
from dualloop.sim.schema import N_FEATURES
from dualloop.v2 import planner_pb2 as pb

WorkerMode = Literal["process", "thread"]

# Upper bounds (seconds) of the request -> plan latency histogram (a Prometheus histogram's buckets;
# counted per plan at no more cost than the rolling history beside it).
LATENCY_BUCKETS_S = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class PlannerStartError(RuntimeError):
    """PlanScheduler.start: the worker could not build its source (the message is the source's own
    error, e.g. the planner model file it could not load) or could not be started."""


@dataclass
class _Pending:
    encoded: bytes  # the serialised PlanRequest, made when requested (the send then only joins bytes)
    now_ns: int
    queued: float  # time.monotonic() when requested, for the latency statistic


@dataclass
class _Finished:
    """A PLAN reply, kept as the bytes it came in until poll() hands it out (decoding 32 plans in
    the tick that received them cost that tick ~0.3 ms)."""

    session_id: str  # the session it answers
    data: bytes  # a serialised PlanResponse


@dataclass
class _Sent:
    """One session's request in the batch in flight."""

    session_id: str
    request: _Pending  # kept so that a request the worker skipped can be asked again
    discard: bool = False  # forget() was called while it was being planned


@dataclass
class _InFlight:
    """The batch being planned; its replies may come in several messages, in request order."""

    items: list[_Sent]
    sent: float  # time.monotonic()
    deadline: float  # time.monotonic(); moved on while the worker waits for a CPU
    cpu0: float | None  # the worker's CPU time when the batch was sent
    # when the worker was last looked at (time.monotonic()) and its run-queue wait then (schedstat)
    looked: tuple[float, float] | None = None
    answered: int = 0
    skipped: list[_Sent] = field(default_factory=list)
    starved: bool = False  # its deadline was moved on because the worker waited for a CPU
    raise_check: float = float("inf")  # time.monotonic() from which to look whether it waits for a CPU
    raised: bool = False  # the worker was raised out of SCHED_IDLE for it (or that was refused)

    @property
    def unanswered(self) -> list[_Sent]:
        return self.items[self.answered :]


def _look(now: float, worker: _Worker) -> tuple[float, float] | None:
    """(now, the worker's run-queue wait so far) for _InFlight.looked; None where the kernel does not say."""
    times = worker.schedstat()
    return None if times is None else (now, times[1])


class _Worker:
    """One worker (process or thread) and the scheduler's end of its pipe."""

    def __init__(
        self, factory: SourceFactory, mode: WorkerMode, nice: int | None, budget_s: float, idle: bool = False
    ) -> None:
        # spawn, not fork: the server process has gRPC threads, and forking a threaded process
        # can deadlock the child on a lock some other thread held.
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe(duplex=True)
        self.mode = mode
        self.idle = idle  # SCHED_IDLE between raises (the scheduler asks for it in process mode only)
        self.started = time.monotonic()
        self.ready = False
        self.name = ""
        self.cpu_reported_s: float | None = None  # the worker's CPU time in its latest message
        self._process: mp.process.BaseProcess | None = None
        self._thread: threading.Thread | None = None
        if mode == "process":
            self._process = ctx.Process(
                target=run_worker,
                args=(child, factory, nice, budget_s, self.idle),
                daemon=True,
                name="dualloop-planner",
            )
            self._process.start()
            child.close()  # only the child holds its end, so its death reads as EOF here
        else:
            self._thread = threading.Thread(
                target=run_worker, args=(child, factory, None, budget_s), daemon=True, name="dualloop-planner"
            )
            self._thread.start()
        # Connection.poll(0) builds a selector on every call (~3 us); this is one poll() syscall.
        self._poller = select.poll()
        self._poller.register(self.conn.fileno(), select.POLLIN)
        # What the kernel knows about the thread that plans (Linux): its state and CPU time.
        task = (
            f"{self._process.pid}"
            if self._process is not None
            else f"self/task/{self._thread.native_id if self._thread is not None else 0}"
        )
        self._proc = f"/proc/{task}"

    def cpu_s(self) -> float | None:
        """CPU time the planning thread has used (schedstat); None where the kernel does not say
        (not Linux)."""
        times = self.schedstat()
        return None if times is None else times[0]

    def schedstat(self) -> tuple[float, float] | None:
        """The planning thread's CPU time and its time spent waiting on a run queue, in seconds
        (Linux schedstat; None elsewhere). A /proc read, a few microseconds."""
        try:
            with open(f"{self._proc}/schedstat", "rb") as f:
                fields = f.read().split()
            return int(fields[0]) / 1e9, int(fields[1]) / 1e9
        except (OSError, ValueError, IndexError):
            return None

    def runnable(self) -> bool:
        """Running or ready to run (state R), as opposed to sleeping or blocked."""
        try:
            with open(f"{self._proc}/stat", "rb") as f:
                stat = f.read()
            return stat[stat.rindex(b")") + 2 :].startswith(b"R")  # the name may hold spaces and ')'
        except (OSError, ValueError):
            return False

    def readable(self) -> bool:
        """A message (or EOF: the worker died) is waiting; never blocks."""
        return bool(self._poller.poll(0))

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def alive(self) -> bool:
        if self._process is not None:
            return self._process.is_alive()
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout_s: float) -> None:
        """Ask politely, then kill. A hung thread cannot be killed: it is abandoned (daemon)."""
        if self.idle and self._process is not None and self._process.pid is not None:
            # On a busy machine a SCHED_IDLE worker gets no CPU, not even to exit (measured under
            # two CPU hogs: still running 4 s after the stop, SIGKILL pending): raise it first.
            priority.raise_to_batch(self._process.pid)
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
            # SIGKILL cannot be refused: the process is gone as soon as it gets a CPU to exit on,
            # which a busy machine may take a while to give it (the bound only guards against a
            # process stuck in the kernel).
            self._process.join(30.0)
        try:
            self.conn.close()  # a thread worker blocked in recv sees EOF and exits
        except OSError:
            pass


@dataclass(frozen=True)
class SchedulerConfig:
    """How a PlanScheduler plans (the module docstring tells the why of each).

    period_s: the planning period; deadline_s: how long a batch may take (None: the period).
    mode: the worker is a child process (niced by `nice`) or a thread.
    startup_timeout_s / restart_backoff_s: building a worker's source; waiting before the next restart.
    max_ready: plans kept for poll() at the most; max_batch: sessions per batch at the most.
    starved_limit_s: how long a worker waiting for a CPU is not hung (None: three deadlines).
    history: batches kept for stats(). hold: requests wait for release().
    idle_priority: SCHED_IDLE between raises (None: where it can be raised again).
    raise_after_s: when a waiting batch is raised to SCHED_BATCH (None: a quarter of the deadline)."""

    period_s: float = 0.2
    deadline_s: float | None = None
    mode: WorkerMode = "process"
    nice: int = 10
    startup_timeout_s: float = 60.0
    restart_backoff_s: float = 0.2
    max_ready: int = 4096
    max_batch: int = 256
    starved_limit_s: float | None = None
    history: int = 2048
    hold: bool = False
    idle_priority: bool | None = None
    raise_after_s: float | None = None


class PlanScheduler:
    """Latest-wins plan requests per session, planned in batches in a supervised worker."""

    def __init__(self, source_factory: SourceFactory, config: SchedulerConfig | None = None) -> None:
        c = config or SchedulerConfig()
        period_s, deadline_s, mode, nice = c.period_s, c.deadline_s, c.mode, c.nice
        if mode not in ("process", "thread"):
            raise ValueError(f"mode must be 'process' or 'thread', got {mode!r}")
        if c.max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {c.max_batch}")
        self.period_s = period_s
        self.deadline_s = period_s if deadline_s is None else deadline_s
        # A source planned request by request stops starting new ones after a third of the deadline:
        # one more call that then takes its own full deadline (a remote source's is at most 2/3 of
        # ours, controller.serve.planning.worker_deadline_s) still answers before the batch is killed.
        self.budget_s = self.deadline_s / 3.0
        # A worker waiting for a CPU is not hung: its deadline moves on, up to this long after the
        # batch was sent (killing it would only start a fresh worker, cold, on the same busy
        # machine; the worker is niced, so it is the first to wait).
        self.starved_limit_s = 3.0 * self.deadline_s if c.starved_limit_s is None else c.starved_limit_s
        self.mode: WorkerMode = mode
        self.max_batch = c.max_batch
        self._factory = source_factory
        self._nice = nice if mode == "process" else None
        # SCHED_IDLE only where the worker can be raised out of it again (None: find out)
        self._idle_priority = mode == "process" and (
            priority.can_raise_from_idle(nice) if c.idle_priority is None else c.idle_priority
        )
        self.raise_after_s = self.deadline_s / 4.0 if c.raise_after_s is None else c.raise_after_s
        self._startup_timeout_s = c.startup_timeout_s
        self._restart_backoff_s = c.restart_backoff_s
        self._backoff = c.restart_backoff_s

        self._pending: dict[str, _Pending] = {}  # insertion order = age: the oldest go first
        self._outstanding: set[str] = set()  # requested, no plan/error/timeout back yet
        self._previous: dict[str, bytes] = {}  # the last plan's PlanResponse bytes, per session
        self._ready: deque[_Finished] = deque()
        # hold: requests wait for release() (a caller that spreads its requests over several ticks
        # still sends them as one batch); otherwise every poll() may send
        self._hold = c.hold
        self._released = not c.hold
        self._max_ready = c.max_ready
        self._in_flight: _InFlight | None = None
        self._init_records(c.history)

        self._worker: _Worker | None = None
        self._starter: threading.Thread | None = None  # spawning a replacement worker
        self._started_worker: _Worker | None = None  # handed over by the starter thread
        self._dying: list[_Worker] = []  # killed, not yet reaped
        self._next_start = 0.0
        self._running = False

    def _init_records(self, history: int) -> None:
        """The scheduler's records: the last `history` batches' timings and sizes, the latency histogram
        and the event counts since start."""
        self._plan_us: deque[float] = deque(maxlen=history)  # batch time / requests attempted
        self._batch_us: deque[float] = deque(maxlen=history)
        self._batch_cpu_us: deque[float] = deque(maxlen=history)  # the worker's CPU time per batch
        self._batch_size: deque[int] = deque(maxlen=history)
        self._latency_us: deque[float] = deque(maxlen=history)
        # since start, never rolled: counts per LATENCY_BUCKETS_S bucket (the last one: above all) and the sum
        self.latency_buckets = [0] * (len(LATENCY_BUCKETS_S) + 1)
        self.latency_sum_s = 0.0
        self._counts = dict.fromkeys(
            (
                "requests",
                "replaced",
                "overruns",
                "plans",
                "errors",
                "timeouts",
                "requeued",
                "batches",
                "starved_batches",
                "priority_raises",
                "restarts",
                "startup_failures",
                "dropped_unpolled",
            ),
            0,
        )
        self._last_error = ""

    # ---- lifecycle (not on the tick path: these may block) ---------------------------------
    def start(self, wait_ready: bool = True, timeout_s: float | None = None) -> None:
        """Start the worker; by default wait until its source is built (PlannerStartError when it cannot
        be, with the source's own error; TimeoutError when it is not ready within timeout_s)."""
        if self._running:
            raise RuntimeError("PlanScheduler already started")
        self._running = True
        self._worker = self._new_worker()
        if not wait_ready:
            return
        give_up = time.monotonic() + (self._startup_timeout_s if timeout_s is None else timeout_s)
        while not (self._worker is not None and self._worker.ready):
            if self._counts["startup_failures"]:
                self.stop()
                raise PlannerStartError(f"planner worker failed to start: {self._last_error}")
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

    def __enter__(self) -> PlanScheduler:
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
        """Ask for a plan for this session; a newer request replaces one not yet sent. Requests go
        to the worker with the next poll(), all together as one batch."""
        if np.shape(features) != (N_FEATURES,):
            raise ValueError(f"features must have shape ({N_FEATURES},), got {np.shape(features)}")
        counts = self._counts
        counts["requests"] += 1
        if session_id in self._outstanding:
            counts["overruns"] += 1  # the previous request's plan was not ready in time
        if session_id in self._pending:
            counts["replaced"] += 1
        encoded = request_bytes(
            session_id, np.asarray(features, np.float32), now_ns, self._previous.get(session_id, b"")
        )
        self._pending[session_id] = _Pending(encoded, now_ns, time.monotonic())
        self._outstanding.add(session_id)

    def release(self) -> None:
        """With hold=True: send what has been requested, as one batch, at the next poll()."""
        self._released = True

    def poll(self, limit: int | None = None) -> list[Plan]:
        """Plans finished since the last poll (oldest first), at most ``limit`` of them (the rest
        wait for the next poll: decoding is spread over the polls that hand plans out). Also moves
        the work along: reads the worker's replies, enforces the deadline and sends the next batch."""
        self._pump()
        ready = self._ready
        plans: list[Plan] = []
        while ready and (limit is None or len(plans) < limit):
            done = ready.popleft()
            try:
                plan = plan_from_pb(pb.PlanResponse.FromString(done.data))
                if plan.session_id != done.session_id:
                    raise PlanError(f"plan for session {plan.session_id!r} answers a request for {done.session_id!r}")
            except Exception as err:  # noqa: BLE001 - a malformed plan is the source's error
                self._counts["errors"] += 1
                self._last_error = f"invalid plan: {err}"
                continue
            self._counts["plans"] += 1
            self._previous[done.session_id] = done.data
            plans.append(plan)
        return plans

    def forget(self, session_id: str) -> None:
        """Drop everything about a session (closed): its pending request, in-flight result, history."""
        self._pending.pop(session_id, None)
        self._outstanding.discard(session_id)
        self._previous.pop(session_id, None)
        if any(done.session_id == session_id for done in self._ready):  # a new session may reuse the id
            self._ready = deque(done for done in self._ready if done.session_id != session_id)
        if self._in_flight is not None:
            for item in self._in_flight.items:
                if item.session_id == session_id:
                    item.discard = True

    @property
    def quiet(self) -> bool:
        """Nothing asked for is still waiting, being planned or waiting to be handed out."""
        return not self._pending and not self._ready and (self._in_flight is None or not self._in_flight.unanswered)

    def counts(self) -> dict[str, int]:
        """The counters of stats() alone (cheap: no percentiles), since start."""
        return dict(self._counts)

    def stats(self) -> dict[str, float | int | str | None]:
        out: dict[str, float | int | str | None] = dict(self._counts)
        out["pending"] = len(self._pending)
        out["ready"] = len(self._ready)  # answered, not yet handed out by poll()
        out["in_flight"] = len(self._in_flight.unanswered) if self._in_flight is not None else 0
        out["last_error"] = self._last_error
        for key, history in (
            ("plan_time_us", self._plan_us),
            ("batch_time_us", self._batch_us),
            ("batch_cpu_us", self._batch_cpu_us),
            ("latency_us", self._latency_us),
        ):
            values = np.asarray(history)
            out[f"{key}_p50"] = float(np.percentile(values, 50)) if values.size else float("nan")
            out[f"{key}_p99"] = float(np.percentile(values, 99)) if values.size else float("nan")
        sizes = np.asarray(self._batch_size)
        out["batch_size_p50"] = float(np.percentile(sizes, 50)) if sizes.size else float("nan")
        out["batch_size_max"] = int(sizes.max()) if sizes.size else 0
        worker = self._worker
        out["worker_pid"] = worker.pid if worker is not None else None
        out["worker_idle_priority"] = worker.idle if worker is not None else self._idle_priority
        out["source"] = worker.name if worker is not None else ""
        return out

    # ---- moving the work along (runs inside poll: non-blocking only) -----------------------
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
        while worker is self._worker and worker.readable():
            self._receive(worker)
        worker = self._worker
        if worker is None:
            return
        flight = self._in_flight
        if flight is not None and not flight.raised and now >= flight.raise_check:
            self._raise_if_waiting(worker, flight, now)
        if flight is not None and now > flight.deadline and not self._starved(worker, flight, now):
            self._last_error = (
                f"{len(flight.unanswered)} plan(s) not answered within "
                f"{(now - flight.sent) * 1e3:.0f} ms: worker replaced"
            )
            self._retire(worker, count_timeout=True)
            self._next_start = now  # a hang is the source's fault, not a reason to wait
        elif not worker.ready and now > worker.started + self._startup_timeout_s:
            self._counts["startup_failures"] += 1
            self._last_error = f"worker not ready within {self._startup_timeout_s:.0f} s"
            self._retire(worker, count_timeout=False)
            self._schedule_backoff(now)
        elif worker.ready and flight is None and self._pending and self._released:
            self._send_batch(worker)
            self._released = not self._hold

    def _starved(self, worker: _Worker, flight: _InFlight, now: float) -> bool:
        """At the deadline: is the worker short of CPU rather than hung? Then it gets until it
        could have used a deadline's worth of CPU (up to starved_limit_s after the batch was sent).
        Short of CPU: ready to run now, or it spent at least half the time since it was last looked
        at waiting on a run queue. Its state alone is not enough: a worker starved for CPU also
        blocks now and then (a page fault on a cold file, a write), and must not be killed for being
        caught there. (The run-queue wait is counted only once the task runs again, so a worker that
        has not run at all shows only in its state.) A hung source sleeps or blocks without waiting
        for a CPU, or uses the whole deadline on one: it is killed."""
        if flight.cpu0 is None:
            return False
        times = worker.schedstat()
        if times is None:
            return False
        cpu, waited = times
        before, flight.looked = flight.looked, (now, waited)
        waiting = worker.runnable() or (before is not None and waited - before[1] >= 0.5 * (now - before[0]))
        used = cpu - flight.cpu0
        deadline = min(now + self.deadline_s - used, flight.sent + self.starved_limit_s)
        if not waiting or used >= self.deadline_s or now >= deadline:
            return False
        if not flight.starved:
            flight.starved = True
            self._counts["starved_batches"] += 1
        flight.deadline = deadline
        return True

    def _raise_if_waiting(self, worker: _Worker, flight: _InFlight, now: float) -> None:
        """A SCHED_IDLE worker whose batch has had less than half the CPU time since it was sent
        and is ready to run (not sleeping on, say, a remote planner) is waiting for a CPU: raised to
        SCHED_BATCH until it answers. Two /proc reads, only for a batch outstanding this long."""
        cpu = worker.cpu_s()
        if flight.cpu0 is None or cpu is None or worker.pid is None:
            flight.raised = True  # nothing to go by (not Linux): leave it be
            return
        if not worker.runnable() or cpu - flight.cpu0 >= 0.5 * (now - flight.sent):
            flight.raise_check = now + self.raise_after_s / 4.0  # look again a little later
            return
        flight.raised = True
        if priority.raise_to_batch(worker.pid):
            self._counts["priority_raises"] += 1
            return
        # Refused after all (limits changed, a sandbox): later workers run SCHED_BATCH throughout;
        # this batch is left to the deadline and its CPU-starvation allowance.
        self._idle_priority = False
        self._last_error = "cannot raise the planner worker out of SCHED_IDLE: later workers run SCHED_BATCH"

    def _new_worker(self) -> _Worker:
        return _Worker(self._factory, self.mode, self._nice, self.budget_s, self._idle_priority)

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
            self._started_worker = self._new_worker()
        except Exception as err:  # noqa: BLE001 - e.g. an unpicklable factory: report, retry later
            self._counts["startup_failures"] += 1
            self._last_error = f"cannot start the planner worker: {type(err).__name__}: {err}"
            self._schedule_backoff(time.monotonic())

    def _schedule_backoff(self, now: float) -> None:
        self._next_start = now + self._backoff
        self._backoff = min(self._backoff * 2.0, 5.0)

    def _retire(self, worker: _Worker, count_timeout: bool) -> None:
        """Kill the worker; the batch it was planning is lost (each of its sessions is a timeout
        when the batch hung)."""
        worker.kill_nowait()
        if worker.pid is not None:  # a hung thread cannot be reaped; it is simply abandoned
            self._dying.append(worker)
        self._worker = None
        self._counts["restarts"] += 1
        lost = self._abandon_batch()
        if count_timeout:
            self._counts["timeouts"] += len(lost)

    def _abandon_batch(self) -> list[_Sent]:
        """Close the books on the batch in flight; returns its unanswered requests."""
        flight, self._in_flight = self._in_flight, None
        if flight is None:
            return []
        lost = flight.unanswered + flight.skipped
        for item in lost:
            if item.session_id not in self._pending:
                self._outstanding.discard(item.session_id)
        return flight.unanswered

    def _send_batch(self, worker: _Worker) -> None:
        session_ids = list(itertools.islice(self._pending, self.max_batch))  # oldest first
        items = [_Sent(session_id, self._pending.pop(session_id)) for session_id in session_ids]
        frames = [(REQUEST, item.request.encoded) for item in items]
        now = time.monotonic()
        # The worker's CPU time at its latest message: it has been idle since, waiting for this batch.
        self._in_flight = _InFlight(
            items,
            now,
            now + self.deadline_s,
            worker.cpu_reported_s,
            raise_check=now + self.raise_after_s if worker.idle else float("inf"),
            looked=_look(now, worker),
        )
        self._counts["batches"] += 1
        try:
            worker.conn.send_bytes(pack_frames(frames))
        except (OSError, ValueError):
            pass  # the worker died: its EOF (or the deadline) replaces it

    def _receive(self, worker: _Worker) -> None:
        now = time.monotonic()
        try:
            envelope = decode(worker.conn.recv_bytes())
        except (EOFError, OSError, ValueError):
            # The worker is gone; a source that kills its interpreter is an error, not a hang.
            if self._in_flight is not None:
                self._counts["errors"] += len(self._in_flight.unanswered)
            self._last_error = "planner worker exited"
            self._retire(worker, count_timeout=False)
            self._schedule_backoff(now)
            return
        kind, payload = envelope.kind, envelope.payload
        worker.cpu_reported_s = envelope.cpu_total_ns / 1e9
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
        flight = self._in_flight
        if flight is None:
            return  # an answer to nothing (cannot happen with one batch in flight)
        try:
            if kind != BATCH:
                raise ValueError(payload.decode("utf-8", "replace"))
            frames = unpack_frames(payload)
            if len(frames) > len(flight.unanswered):
                raise ValueError(f"{len(frames)} replies for {len(flight.unanswered)} requests")
        except ValueError as err:  # the batch message itself was garbled: every request in it failed
            self._counts["errors"] += len(flight.unanswered)
            self._last_error = f"planner batch failed: {err}"
            self._abandon_batch()
            return
        for frame_kind, data in frames:
            item = flight.items[flight.answered]
            flight.answered += 1
            self._answer(item, frame_kind, data, now, flight)
        if not flight.unanswered:
            self._finish_batch(flight, envelope.wall_ns, envelope.cpu_ns)

    def _answer(self, item: _Sent, kind: bytes, data: bytes, now: float, flight: _InFlight) -> None:
        session_id = item.session_id
        if kind == SKIP:
            flight.skipped.append(item)  # asked again once the batch is complete
            return
        if session_id not in self._pending:
            self._outstanding.discard(session_id)
        if kind != PLAN:
            self._counts["timeouts" if kind == LATE else "errors"] += 1
            self._last_error = data.decode("utf-8", "replace")
            return
        latency_s = now - item.request.queued
        self._latency_us.append(latency_s * 1e6)
        self.latency_buckets[bisect.bisect_left(LATENCY_BUCKETS_S, latency_s)] += 1
        self.latency_sum_s += latency_s
        if item.discard:
            return
        if len(self._ready) >= self._max_ready:
            self._ready.popleft()
            self._counts["dropped_unpolled"] += 1
        self._ready.append(_Finished(session_id, data))  # decoded (and checked) when polled

    def _finish_batch(self, flight: _InFlight, wall_ns: int, cpu_ns: int) -> None:
        self._in_flight = None
        attempted = len(flight.items) - len(flight.skipped)
        self._batch_us.append(wall_ns / 1e3)
        self._batch_cpu_us.append(cpu_ns / 1e3)
        self._batch_size.append(len(flight.items))
        self._plan_us.append(wall_ns / 1e3 / max(attempted, 1))
        # Skipped requests go first in the next batch (they have waited longest), unless the session
        # was forgotten or has asked again since (the newer request wins).
        again = {
            item.session_id: item.request
            for item in flight.skipped
            if not item.discard and item.session_id not in self._pending
        }
        if again:
            self._counts["requeued"] += len(again)
            self._pending = {**again, **self._pending}
            self._released = True  # asked again at once, not at the caller's next release()
