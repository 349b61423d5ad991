"""The processes of `dualloop bench tick`, each started as `python -m dualloop.controller.bench.procs ROLE SPEC`.

- server: the real controller, measuring itself while the clients are connected; no UI in this
  process, so nothing but serving competes with the tick loop;
- clients: N REALTIME sessions over gRPC, each sending an observation every period (a sensor at the
  tick rate) and reading every snapshot it is given;
- bare: the bare ticker baseline.
SPEC is the role's run specification (ServerSpec, ClientSpec, BareSpec) as JSON. Each prints one
JSON line on stdout at the end (the server prints its port first).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import grpc
import numpy as np

from dualloop.controller.bench.drives import sensor_readings, start_places
from dualloop.controller.bench.results import ServerResult, SessionRow
from dualloop.controller.bench.secure import TOKEN_ENV
from dualloop.controller.bench.stall_trace import TRACE_ENV, StallTracer
from dualloop.controller.serve import board as wb
from dualloop.controller.serve.config import ServerConfig
from dualloop.controller.serve.gc_clock import GC
from dualloop.controller.serve.lifecycle import ServerLifecycle, new_event_loop
from dualloop.controller.serve.runtime import LATENESS_BUCKETS_US, SessionRuntime
from dualloop.controller.serve.ticker import LatenessLog, percentiles_us, run_bare_ticker, settle_collector
from dualloop.executor.config import DEFAULT_TICKER_GUARD_MS
from dualloop.executor.core import ExecutorStats
from dualloop.executor.snapshot import Reason
from dualloop.sim import schema
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc


@dataclass(frozen=True)
class ServerSpec:
    """What a bench server process serves, and where it saves its raw lateness (ns, .npy).
    board: one of `workers` server processes on `port` (bench tick --workers), in `slot`."""

    model: str
    sessions: int
    save: str
    guard_ms: float = DEFAULT_TICKER_GUARD_MS
    realtime_priority: int | None = None
    cpu_wake_latency_us: int | None = None
    planner: str = "none"
    alternate_s: float | None = None  # the planner paused and resumed in turns; lateness per turn
    metrics: bool = False  # serve Prometheus metrics (metrics_port 0)
    tls_cert: str | None = None
    tls_key: str | None = None
    tokens_file: str | None = None  # require a bearer token from this file on every RPC
    gates: tuple[str, ...] = ()
    port: int = 0
    board: str | None = None
    workers: int = 1
    slot: int = 0
    cpus: tuple[int, ...] | None = None
    candidate: str | None = None  # a candidate model beside the live one (never applied)
    candidate_gates: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClientSpec:
    """Sessions first .. first + sessions - 1 against address; TLS trusting ca_file when given (the
    token from $DUALLOOP_BENCH_TOKEN); channel_per_session: a connection each (for several workers)."""

    address: str
    sessions: int = 8
    duration_s: float = 10.0
    period_s: float = 0.005
    seed: int = 0
    ca_file: str | None = None
    first: int = 0
    channel_per_session: bool = False
    cpus: tuple[int, ...] | None = None
    drives_file: str | None = None  # .npy of (drives, ticks, features) (bench.drives); None: near the card's means


@dataclass(frozen=True)
class BareSpec:
    """The bare ticker, scheduled as the server it is compared with."""

    duration_s: float = 10.0
    period_ms: float = 5.0
    guard_ms: float = DEFAULT_TICKER_GUARD_MS
    save: str | None = None
    realtime_priority: int | None = None
    cpu_wake_latency_us: int | None = None
    cpus: tuple[int, ...] | None = None


async def _session(
    stub: pb_grpc.ControllerServiceStub, index: int, info: pb.ModelInfo, spec: ClientSpec, all_open: asyncio.Barrier
) -> SessionRow:
    rng = np.random.default_rng(spec.seed + index)
    drives, noise = bench_inputs(info, spec.drives_file)
    drive = drives[index % len(drives)]
    offset = int(start_places(rng, 1, len(drive), spec.period_s)[0])
    # a client plan every 200 ms (as synthetic logs carry) unless the server plans
    plan = PLAN if len(info.plan) == len(PLAN) and not info.planner else None
    call = stub.Drive()
    await call.write(pb.DriveRequest(open=pb.OpenSession(session_id=f"bench-{index}", clock=pb.CLOCK_MODE_REALTIME)))
    opened = await call.read()
    assert opened.WhichOneof("msg") == "opened"
    # every session streams for the same duration_s from the moment all are open (the server measures
    # from then): on a loaded machine a late opener must not shorten the window the others share
    await all_open.wait()
    stop_at = time.monotonic() + spec.duration_s

    async def send() -> int:
        seq = 0
        async for seq, slot, ts in sensor_readings(spec.period_s, stop_at):
            x = drive[(offset + slot) % len(drive)]  # wraps only past the simulated road's end
            if noise is not None:
                x = x + noise * rng.standard_normal(noise.size).astype(np.float32)
            obs = pb.Observation(seq=seq, timestamp_ns=ts, features=x.tolist())
            if plan is not None and seq % 40 == 1:
                obs.plan.plan_id = f"p{seq}"
                obs.plan.values.extend(plan)
            await call.write(pb.DriveRequest(observation=obs))
        await call.done_writing()
        return seq

    sender = asyncio.create_task(send())
    ticks: list[int] = []
    dropped = 0
    reasons: dict[int, int] = {}
    while True:
        msg = await call.read()
        if msg is grpc.aio.EOF:
            break
        snap = msg.snapshot
        ticks.append(snap.tick)
        dropped = snap.snapshots_dropped
        for r in snap.reasons:
            reasons[r] = reasons.get(r, 0) + 1
    sent = await sender
    t = np.asarray(ticks, dtype=np.int64)
    gaps = int((np.diff(t) != 1).sum()) if t.size > 1 else 0
    return SessionRow(
        session=index,
        observations_sent=sent,
        snapshots_received=len(ticks),
        snapshots_dropped=dropped,
        tick_gaps=gaps,
        tick_span=int(t[-1] - t[0] + 1) if t.size else 0,
        reasons={Reason(k).name: v for k, v in reasons.items()},
    )


PLAN = schema.make_plan(25.0, 0.0, schema.BEHAVIOURS.index("keep")).tolist()


def bench_inputs(info: pb.ModelInfo, drives_file: str | None) -> tuple[np.ndarray, np.ndarray | None]:
    """What a bench's sessions send: (drives (drives, ticks, features) float32, noise to add per reading
    or None). The simulated nominal drives in `drives_file` (bench.drives), or for a model that does
    not read the simulator's features, one reading at its card's normalisation means with noise of a
    tenth of each feature's spread (a repeated vector would read as a frozen sensor). Inputs the gates
    reject would measure the fallback path instead of the one served."""
    if drives_file is not None:
        return np.load(drives_file).astype(np.float32), None
    mean = np.array([f.mean for f in info.features], np.float32)
    std = np.array([f.std for f in info.features], np.float32)
    return mean[None, None, :], (0.1 * std).astype(np.float32)


def open_channel(address: str, ca_file: str | None, token: str | None, private: bool = False) -> grpc.aio.Channel:
    """Plaintext, or TLS trusting ca_file with the token sent as 'authorization: Bearer' on every call.
    private: a connection of its own (channels with equal arguments otherwise share one)."""
    options = [("grpc.use_local_subchannel_pool", 1)] if private else None
    if ca_file is None:
        return grpc.aio.insecure_channel(address, options)
    with open(ca_file, "rb") as f:
        creds = grpc.ssl_channel_credentials(f.read())
    if token:
        creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(token))
    return grpc.aio.secure_channel(address, creds, options)


async def run_clients(spec: ClientSpec) -> list[SessionRow]:
    """spec.channel_per_session: a connection each (a server with several workers gets connections,
    not streams, spread over its processes); else one for all."""
    token = os.environ.get(TOKEN_ENV)
    sessions = spec.sessions
    n_channels = sessions if spec.channel_per_session else 1
    channels = [open_channel(spec.address, spec.ca_file, token, spec.channel_per_session) for _ in range(n_channels)]
    try:
        stubs = [pb_grpc.ControllerServiceStub(c) for c in channels]
        info = (await stubs[0].GetModelInfo(pb.GetModelInfoRequest())).model
        all_open = asyncio.Barrier(sessions)
        cpu0 = time.process_time()
        results = list(
            await asyncio.gather(
                *(_session(stubs[i % n_channels], spec.first + i, info, spec, all_open) for i in range(sessions))
            )
        )
        cpu = time.process_time() - cpu0
        for r in results:  # the whole process's CPU, on every row (the bench reads it once)
            r["client_process_cpu_s"] = cpu
        return results
    finally:
        for c in channels:
            await c.close()


PLANNER_FIGURES = (
    "plan_time_us_p50",
    "plan_time_us_p99",
    "batch_time_us_p50",
    "batch_time_us_p99",
    "batch_cpu_us_p50",
    "batch_cpu_us_p99",
    "batch_size_p50",
    "latency_us_p50",
    "latency_us_p99",
    "source",
    "worker_idle_priority",
)
PLANNER_COUNTS = (
    "requests",
    "overruns",
    "plans",
    "errors",
    "timeouts",
    "restarts",
    "batches",
    "starved_batches",
    "priority_raises",
)


def pin_threads(cpus: set[int], pid: int | None = None) -> None:
    """Every thread of this process (or of process pid) onto cpus (threads started later inherit it
    from their creator). The server is pinned once started, so that its planner worker process,
    started first, keeps every CPU: pinned beside the tick loop it would wait behind it (it runs
    under SCHED_IDLE)."""
    task_dir = f"/proc/{pid if pid is not None else 'self'}/task"
    tasks = [int(t) for t in os.listdir(task_dir)] if os.path.isdir(task_dir) else [pid or 0]
    for tid in tasks:
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(tid, cpus)


def _alternate(
    runtime: SessionRuntime, phase_s: float, settle_s: float
) -> tuple[list[tuple[bool, LatenessLog]], asyncio.Task]:
    """Planner paused (idle) and planning (busy) in turns of phase_s, starting idle; each turn's
    first settle_s is left out, and an idle turn's ticks count only once the batch asked for before
    the pause has been planned and applied.
    Returns one (busy, lateness) per turn, filled as the run goes."""
    turns: list[tuple[bool, LatenessLog]] = []
    assert runtime.planning is not None  # run_server alternates only with a planner
    realtime = runtime.planning.realtime

    async def alternate() -> None:
        busy = False
        while True:
            realtime.paused = not busy
            runtime.stats.lateness = LatenessLog(1024)  # settling: not counted
            started = time.monotonic()
            await asyncio.sleep(settle_s)
            # an idle turn is counted from when the worker has finished what it was given
            while not busy and not realtime.scheduler.quiet and time.monotonic() - started < phase_s:
                await asyncio.sleep(0.005)
            turns.append((busy, LatenessLog(int(phase_s * 1e9 / runtime.executor.period_ns) + 64)))
            runtime.stats.lateness = turns[-1][1]
            await asyncio.sleep(max(0.0, phase_s - (time.monotonic() - started)))
            busy = not busy

    return turns, asyncio.ensure_future(alternate())


def _server_config(spec: ServerSpec) -> ServerConfig:
    executor_cfg: dict[str, object] = {"max_sessions": max(spec.sessions, 1), "ticker_guard_ms": spec.guard_ms}
    if spec.alternate_s:
        # The paused phases must not put sessions in STALE_PLAN fallback (a different tick path);
        # plan ages are reported from the scheduler's request -> plan latency instead.
        executor_cfg["max_plan_age_ms"] = 3_600_000.0
    # a private server for the bench's own clients: tokens only from tokens_file, never the environment
    auth: dict[str, object] = {"tokens_env": None, "tokens_file": spec.tokens_file}
    return ServerConfig(
        model=spec.model,
        gates=list(spec.gates),
        candidate=spec.candidate,
        candidate_gates=list(spec.candidate_gates),
        port=spec.port,
        realtime_priority=spec.realtime_priority,
        cpu_wake_latency_us=spec.cpu_wake_latency_us,
        executor=executor_cfg,
        planner={"source": spec.planner},
        auth=auth,
        tls={"cert_file": spec.tls_cert, "key_file": spec.tls_key} if spec.tls_cert else None,
        metrics_port=0 if spec.metrics else None,  # the bench scrapes it from its own process
    )


def _announce(server: ServerLifecycle, port: int, spec: ServerSpec) -> None:
    """The first line on stdout: where the server listens and what it serves."""
    card, executor = server.executor.card, server.executor
    gates = [{"path": str(path), "version": gate.version_hash[:16]} for path, gate in zip(spec.gates, executor.gates)]
    candidate = None
    if executor.candidate is not None:
        candidate = {
            "path": spec.candidate,
            "version": executor.candidate.version,
            "gates": spec.candidate_gates or None,
        }
    model = {"name": card.name, "version": card.version, "path": str(spec.model)}
    first = {"port": port, "metrics_port": server.metrics_port, "model": model, "gates": gates, "candidate": candidate}
    print(json.dumps(first), flush=True)


class _Window:
    """The measured window: from the moment every session is open (over all workers, on a board)
    until the first one closes."""

    def __init__(self, server: ServerLifecycle, spec: ServerSpec, board: wb.Board | None) -> None:
        self.server, self.spec, self.board = server, spec, board
        self.runtime = server.runtime

    def opened(self) -> int:
        return self.board.totals().sessions_opened if self.board is not None else self.runtime.stats.sessions_opened

    def open_now(self) -> int:
        if self.board is not None:
            return self.board.totals().sessions_open
        return self.spec.sessions - self.runtime.stats.sessions_closed

    async def measure(self) -> ServerResult:
        runtime, executor, spec = self.runtime, self.server.executor, self.spec
        while self.opened() < spec.sessions:  # measure only while all sessions are connected
            await asyncio.sleep(0.005)
        runtime.stats.reset()
        executor.stats = ExecutorStats()
        self.missed0 = runtime.ticker.missed
        self.window_ns = time.monotonic_ns()
        planning = runtime.planning
        self.plan0 = planning.scheduler.counts() if planning is not None else {}  # no percentiles on the loop
        turns, task = None, None
        if spec.alternate_s and planning is not None:
            turns, task = _alternate(runtime, spec.alternate_s, min(0.5, spec.alternate_s / 4))
        cpu0, t0 = time.process_time(), time.monotonic()
        self.sessions_here = len(executor.sessions)
        # every 20 ms, not every tick: reading the board costs ~0.1 ms on the loop being measured
        while runtime.stats.sessions_closed == 0 and self.open_now() >= spec.sessions:
            await asyncio.sleep(0.02)
        if task is not None:
            task.cancel()
        self.cpu_s, self.wall_s = time.process_time() - cpu0, time.monotonic() - t0
        return self._result(self._lateness(turns))

    def _lateness(self, turns: list[tuple[bool, LatenessLog]] | None) -> np.ndarray:
        """The window's lateness, saved raw; with turns, rows (turn, busy, lateness ns) for bench
        planner to compare the turns, and the busy turns' lateness returned."""
        if turns is None:
            lateness = self.runtime.stats.lateness.values()
            np.save(self.spec.save, lateness)
            return lateness
        rows = [
            np.column_stack([np.full(len(log), k), np.full(len(log), busy), log.values()])
            for k, (busy, log) in enumerate(turns)
        ]
        np.save(self.spec.save, np.concatenate(rows).astype(np.int64))
        return np.concatenate([log.values() for busy, log in turns if busy])

    def _cpu_split(self) -> dict[str, float]:
        stats, executor = self.runtime.stats, self.server.executor
        ticks = max(stats.ticks, 1)
        stage_us = executor.stats.stage_ns / ticks / 1e3
        split = {
            "model": float(stage_us[0] + stage_us[1]),
            "rules": float(stage_us[3]),
            "gate": float(stage_us[2]),
            "streaming": stats.stream_ns / ticks / 1e3,
            "candidate": executor.stats.candidate_ns / ticks / 1e3,  # 0 without a candidate
        }
        split["other (gRPC I/O, event loop, precise wait)"] = self.cpu_s / ticks * 1e6 - sum(split.values())
        return split

    def _planner(self) -> dict[str, object] | None:
        """Counts over the window; plan times over the last plans (a rolling history)."""
        planning = self.runtime.planning
        if planning is None:
            return None
        now = planning.scheduler.stats()
        # the counters are ints (stats() also holds times, a source name and None)
        planner_stats: dict[str, object] = {k: int(cast(int, now[k])) - self.plan0[k] for k in PLANNER_COUNTS}
        planner_stats.update({k: now[k] for k in PLANNER_FIGURES})
        planner_stats["applied"] = planning.realtime.applied
        return planner_stats

    def _result(self, lateness: np.ndarray) -> ServerResult:
        runtime, stats, config = self.runtime, self.runtime.stats, self.server.config
        stalls = [s for s in runtime.ticker.stalls if s.missed and s.at_ns >= self.window_ns]
        return {
            "planner": self._planner(),
            "ticks": stats.ticks,
            "missed_deadlines": runtime.ticker.missed - self.missed0,
            # when (monotonic ns, the machine's clock) each run of missed deadlines began
            "missed_at_ns": [s.at_ns for s in stalls],
            "missed_causes": [s.record() for s in stalls],
            "gc": GC.summary(),  # the whole process life, warm-up included
            "wall_s": self.wall_s,
            "lateness_us": percentiles_us(lateness),
            "tick_work_us": percentiles_us(stats.tick_work_ns.values()),
            "decision_latency_us": percentiles_us(stats.decision_latency.values()),
            "cpu_per_tick_us": self._cpu_split(),
            "cpu_fraction": self.cpu_s / self.wall_s,
            "snapshots_sent": stats.snapshots_sent,
            "sessions_here": self.sessions_here,
            "cpus": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "planner_worker_cpus": "all (started before the server pinned itself)"
            if runtime.planning is not None
            else None,
            "scheduling": self.server.scheduling,
            # what the server ran with, from its own configuration (the result shows a secure run was one)
            "security": {
                "tls": config.tls is not None,
                "mutual_tls": config.tls is not None and config.tls.mutual,
                "bearer_tokens": config.auth.tokens_file is not None,
                "metrics": config.metrics_port is not None,
            },
        }

    async def drain(self) -> None:
        """The window ended with the first session; the others end within a few ticks. Stopping now
        would drain them (UNAVAILABLE) and fail the clients process, so wait for them."""
        give_up = time.monotonic() + 10.0
        while time.monotonic() < give_up and (
            self.open_now() > 0 if self.board is not None else self.runtime.stats.sessions_closed < self.spec.sessions
        ):
            await asyncio.sleep(0.005)


async def run_server(spec: ServerSpec) -> ServerResult:
    """Serve, announce the port, measure the window while every session is open, report it."""
    board = wb.Board.attach(Path(spec.board), spec.workers, LATENESS_BUCKETS_US) if spec.board else None
    server = ServerLifecycle(_server_config(spec), worker=(board, spec.slot) if board is not None else None)
    port = await server.start()
    settle_collector()  # as `dualloop serve` does
    if spec.cpus:
        pin_threads(set(spec.cpus))
    _announce(server, port, spec)
    tracer = None
    if os.environ.get(TRACE_ENV):
        tracer = StallTracer(open(os.environ[TRACE_ENV], "a"))  # noqa: SIM115 - open for the whole run
        server.runtime.ticker.watchdog = tracer
    window = _Window(server, spec, board)
    result = await window.measure()
    if tracer is not None:
        server.runtime.ticker.watchdog = None
        tracer.close()
    await window.drain()
    await server.stop()
    return result


async def _run_role(role: str, spec_json: str) -> Any:
    fields = json.loads(spec_json)
    if role == "server":
        return await run_server(ServerSpec(**fields))
    if role == "clients":
        return await run_clients(ClientSpec(**fields))
    bare = BareSpec(**fields)
    return await run_bare_ticker(
        int(bare.period_ms * 1e6),
        bare.duration_s,
        int(bare.guard_ms * 1e6),
        save=bare.save,
        realtime_priority=bare.realtime_priority,
        cpu_wake_latency_us=bare.cpu_wake_latency_us,
    )


def main(argv: list[str] | None = None) -> None:
    role, spec_json = argv if argv is not None else sys.argv[1:]
    cpus = json.loads(spec_json).get("cpus")
    if cpus and role != "server":  # before anything starts a thread: threads inherit the mask
        os.sched_setaffinity(0, set(cpus))
    result = new_event_loop().run_until_complete(_run_role(role, spec_json))
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
