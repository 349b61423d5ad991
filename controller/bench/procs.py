"""The processes of `dualloop bench tick`, each started as `python -m dualloop.controller.bench.procs ROLE`.

- server: the real controller, measuring itself while the clients are connected; no UI in this
  process, so nothing but serving competes with the tick loop;
- clients: N REALTIME sessions over gRPC, each sending an observation every period (a sensor at the
  tick rate) and reading every snapshot it is given;
- bare: the bare ticker baseline.
Each prints one JSON line on stdout at the end (the server prints its port first).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import cast

import grpc
import numpy as np

from dualloop.controller.bench.secure import TOKEN_ENV
from dualloop.controller.bench.stall_trace import TRACE_ENV, StallTracer
from dualloop.controller.logs.logfile import read_log
from dualloop.controller.logs.synthetic import REAL_DRIVE
from dualloop.controller.serve import board as wb
from dualloop.controller.serve.config import ServerConfig
from dualloop.controller.serve.gc_clock import GC
from dualloop.controller.serve.lifecycle import ServerLifecycle, new_event_loop
from dualloop.controller.serve.runtime import LATENESS_BUCKETS_US, SessionRuntime
from dualloop.controller.serve.ticker import LatenessLog, freeze_startup_heap, percentiles_us, run_bare_ticker
from dualloop.executor.config import DEFAULT_TICKER_GUARD_MS
from dualloop.executor.core import ExecutorStats
from dualloop.executor.snapshot import Reason
from dualloop.sim import schema
from dualloop.sim.sensors import NOMINAL_SIGMA
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc


async def _session(
    stub: pb_grpc.ControllerServiceStub,
    index: int,
    info: pb.ModelInfo,
    duration_s: float,
    period_s: float,
    seed: int,
    all_open: asyncio.Barrier,
) -> dict[str, object]:
    rng = np.random.default_rng(seed + index)
    drive, noise = bench_inputs(info)
    offset = index * 997 % len(drive)  # sessions at different places of the drive
    # a client plan every 200 ms (as synthetic logs carry) unless the server plans
    plan = PLAN if len(info.plan) == len(PLAN) and not info.planner else None
    call = stub.Drive()
    await call.write(pb.DriveRequest(open=pb.OpenSession(session_id=f"bench-{index}", clock=pb.CLOCK_MODE_REALTIME)))
    opened = await call.read()
    assert opened.WhichOneof("msg") == "opened"
    # every session streams for the same duration_s from the moment all are open (the server measures
    # from then): on a loaded machine a late opener must not shorten the window the others share
    await all_open.wait()
    stop_at = time.monotonic() + duration_s

    async def send() -> int:
        seq = 0
        next_t = time.monotonic()
        while time.monotonic() < stop_at:
            seq += 1
            x = drive[(offset + seq // 2) % len(drive)] + noise * rng.standard_normal(noise.size).astype(np.float32)
            obs = pb.Observation(seq=seq, timestamp_ns=time.monotonic_ns(), features=x.tolist())
            if plan is not None and seq % 40 == 1:
                obs.plan.plan_id = f"p{seq}"
                obs.plan.values.extend(plan)
            await call.write(pb.DriveRequest(observation=obs))
            next_t += period_s
            await asyncio.sleep(max(0.0, next_t - time.monotonic()))
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
    return {
        "session": index,
        "observations_sent": sent,
        "snapshots_received": len(ticks),
        "snapshots_dropped": dropped,
        "tick_gaps": gaps,
        "tick_span": int(t[-1] - t[0] + 1) if t.size else 0,
        "reasons": {Reason(k).name: v for k, v in reasons.items()},
    }


PLAN = schema.make_plan(25.0, 0.0, schema.BEHAVIOURS.index("keep")).tolist()


def bench_inputs(info: pb.ModelInfo) -> tuple[np.ndarray, np.ndarray]:
    """Observations as users send them: the real drive that ships with the tests (10 Hz, held over
    two ticks each) with the simulator's sensor noise, when it fits the model; else draws near the
    card's normalisation means. Inputs the gates reject on every tick would measure the fallback
    path instead of the one served."""
    n = len(info.features)
    if REAL_DRIVE.exists():
        drive = np.array([list(o.features) for o in read_log(REAL_DRIVE).observations], np.float32)
        if drive.shape[1] == n and NOMINAL_SIGMA.size == n:
            return drive, NOMINAL_SIGMA.astype(np.float32)
    mean = np.array([f.mean for f in info.features], np.float32)
    std = np.array([f.std for f in info.features], np.float32)
    return mean[None, :], (0.1 * std).astype(np.float32)


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


async def run_clients(
    address: str,
    sessions: int,
    duration_s: float,
    period_s: float,
    seed: int,
    ca_file: str | None = None,
    first: int = 0,
    channel_per_session: bool = False,
) -> list[dict]:
    """Sessions first .. first + sessions - 1. channel_per_session: a connection each (a server with
    several workers gets connections, not streams, spread over its processes); else one for all."""
    token = os.environ.get(TOKEN_ENV)
    n_channels = sessions if channel_per_session else 1
    channels = [open_channel(address, ca_file, token, private=channel_per_session) for _ in range(n_channels)]
    try:
        stubs = [pb_grpc.ControllerServiceStub(c) for c in channels]
        info = (await stubs[0].GetModelInfo(pb.GetModelInfoRequest())).model
        all_open = asyncio.Barrier(sessions)
        cpu0 = time.process_time()
        results = list(
            await asyncio.gather(
                *(
                    _session(stubs[i % n_channels], first + i, info, duration_s, period_s, seed, all_open)
                    for i in range(sessions)
                )
            )
        )
        cpu = time.process_time() - cpu0
        for r in results:  # the whole process's CPU, on every row (the bench reads it once)
            r["client_process_cpu_s"] = cpu
        return results
    finally:
        for c in channels:
            await c.close()


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


async def run_server(
    model: str,
    sessions: int,
    guard_ms: float,
    rt_priority: int | None,
    save: str,
    planner: str = "none",
    alternate_s: float | None = None,
    metrics: bool = False,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    tokens_file: str | None = None,
    gates: list[str] | None = None,
    port: int = 0,
    board: wb.Board | None = None,
    slot: int = 0,
    cpus: set[int] | None = None,
    candidate: str | None = None,
    candidate_gates: list[str] | None = None,
    cpu_wake_latency_us: int | None = None,
) -> dict:
    """board: one of several workers on `port` (the bench's --workers); the window opens when the
    workers together have every session open and closes when any session of any worker closes."""
    executor_cfg: dict[str, object] = {"max_sessions": max(sessions, 1), "ticker_guard_ms": guard_ms}
    if alternate_s:
        # The paused phases must not put sessions in STALE_PLAN fallback (a different tick path);
        # plan ages are reported from the scheduler's request -> plan latency instead.
        executor_cfg["max_plan_age_ms"] = 3_600_000.0
    # a private server for the bench's own clients: tokens only from --tokens-file, never the environment
    auth: dict[str, object] = {"tokens_env": None, "tokens_file": tokens_file}
    config = ServerConfig(
        model=model,
        gates=gates or [],
        candidate=candidate,
        candidate_gates=candidate_gates or [],
        port=port,
        realtime_priority=rt_priority,
        cpu_wake_latency_us=cpu_wake_latency_us,
        executor=executor_cfg,
        planner={"source": planner},
        auth=auth,
        tls={"cert_file": tls_cert, "key_file": tls_key} if tls_cert else None,
        metrics_port=0 if metrics else None,  # the bench scrapes it from its own process
    )
    server = ServerLifecycle(config, worker=(board, slot) if board is not None else None)
    port = await server.start()
    freeze_startup_heap()  # as `dualloop serve` does
    if cpus:
        pin_threads(cpus)
    card = server.executor.card
    print(
        json.dumps(
            {
                "port": port,
                "metrics_port": server.metrics_port,
                "model": {"name": card.name, "version": card.version, "path": str(model)},
                "gates": [
                    {"path": str(path), "version": gate.version_hash[:16]}
                    for path, gate in zip(config.gates, server.executor.gates)
                ],
                "candidate": None
                if server.executor.candidate is None
                else {"path": candidate, "version": server.executor.candidate.version, "gates": candidate_gates},
            }
        ),
        flush=True,
    )
    runtime, executor = server.runtime, server.executor
    tracer = None
    if os.environ.get(TRACE_ENV):
        tracer = StallTracer(open(os.environ[TRACE_ENV], "a"))  # noqa: SIM115 - open for the whole run
        runtime.ticker.watchdog = tracer

    def opened() -> int:
        return board.totals().sessions_opened if board is not None else runtime.stats.sessions_opened

    def open_now() -> int:
        return board.totals().sessions_open if board is not None else sessions - runtime.stats.sessions_closed

    while opened() < sessions:  # measure only while all sessions are connected
        await asyncio.sleep(0.005)
    runtime.stats.reset()
    executor.stats = ExecutorStats()
    missed0 = runtime.ticker.missed
    window_ns = time.monotonic_ns()
    planning = runtime.planning
    plan0 = planning.scheduler.counts() if planning is not None else {}  # no percentiles on the loop
    turns, alternating = (
        _alternate(runtime, alternate_s, min(0.5, alternate_s / 4))
        if alternate_s and planning is not None
        else (None, None)
    )
    cpu0, t0 = time.process_time(), time.monotonic()
    sessions_here = len(executor.sessions)
    # every 20 ms, not every tick: reading the board costs ~0.1 ms on the loop being measured
    while runtime.stats.sessions_closed == 0 and open_now() >= sessions:
        await asyncio.sleep(0.02)
    if alternating is not None:
        alternating.cancel()
    if tracer is not None:
        runtime.ticker.watchdog = None
        tracer.close()
    cpu_s, wall_s = time.process_time() - cpu0, time.monotonic() - t0
    stats = runtime.stats
    ticks = max(stats.ticks, 1)
    stage_us = executor.stats.stage_ns / ticks / 1e3
    split = {
        "model": float(stage_us[0] + stage_us[1]),
        "rules": float(stage_us[3]),
        "gate": float(stage_us[2]),
        "streaming": stats.stream_ns / ticks / 1e3,
        "candidate": executor.stats.candidate_ns / ticks / 1e3,  # 0 without a candidate
    }
    split["other (gRPC I/O, event loop, precise wait)"] = cpu_s / ticks * 1e6 - sum(split.values())
    if turns is not None:  # rows (turn, busy, lateness ns): bench planner compares the turns
        np.save(
            save,
            np.concatenate(
                [
                    np.column_stack([np.full(len(log), k), np.full(len(log), busy), log.values()])
                    for k, (busy, log) in enumerate(turns)
                ]
            ).astype(np.int64),
        )
        lateness = np.concatenate([log.values() for busy, log in turns if busy])
    else:
        lateness = stats.lateness.values()
        np.save(save, lateness)
    planner_stats: dict[str, object] | None = None
    if planning is not None:  # counts over the window; plan times over the last plans (a rolling history)
        now = planning.scheduler.stats()
        # the counters are ints (stats() also holds times, a source name and None)
        planner_stats = {k: int(cast(int, now[k])) - plan0[k] for k in PLANNER_COUNTS}
        planner_stats.update(
            {
                k: now[k]
                for k in (
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
            }
        )
        planner_stats["applied"] = planning.realtime.applied
    result = {
        "planner": planner_stats,
        "ticks": stats.ticks,
        "missed_deadlines": runtime.ticker.missed - missed0,
        # when (monotonic ns, the machine's clock) each run of missed deadlines began
        "missed_at_ns": [s.at_ns for s in runtime.ticker.stalls if s.missed and s.at_ns >= window_ns],
        "missed_causes": [s.record() for s in runtime.ticker.stalls if s.missed and s.at_ns >= window_ns],
        "gc": GC.summary(),  # the whole process life, warm-up included
        "wall_s": wall_s,
        "lateness_us": percentiles_us(lateness),
        "tick_work_us": percentiles_us(stats.tick_work_ns.values()),
        "decision_latency_us": percentiles_us(stats.decision_latency.values()),
        "cpu_per_tick_us": split,
        "cpu_fraction": cpu_s / wall_s,
        "snapshots_sent": stats.snapshots_sent,
        "sessions_here": sessions_here,
        "cpus": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "planner_worker_cpus": "all (started before the server pinned itself)" if planning is not None else None,
        "scheduling": server.scheduling,
        # what the server ran with, from its own configuration (the result shows a secure run was one)
        "security": {
            "tls": config.tls is not None,
            "mutual_tls": config.tls is not None and config.tls.mutual,
            "bearer_tokens": config.auth.tokens_file is not None,
            "metrics": config.metrics_port is not None,
        },
    }
    # The window ended with the first session; the others end within a few ticks. Stopping now would
    # drain them (UNAVAILABLE) and fail the clients process, so wait for them (counted above already).
    give_up = time.monotonic() + 10.0
    while time.monotonic() < give_up and (
        open_now() > 0 if board is not None else runtime.stats.sessions_closed < sessions
    ):
        await asyncio.sleep(0.005)
    await server.stop()
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m dualloop.controller.bench.procs")
    sub = parser.add_subparsers(dest="what", required=True)
    c = sub.add_parser("clients")
    c.add_argument("--address", required=True)
    c.add_argument("--sessions", type=int, default=8)
    c.add_argument("--duration", type=float, default=10.0)
    c.add_argument("--period-ms", type=float, default=5.0)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--ca-file", help=f"connect with TLS trusting this CA; the token is read from ${TOKEN_ENV}")
    c.add_argument("--first", type=int, default=0, help="index of this process's first session")
    c.add_argument("--channel-per-session", action="store_true", help="a connection per session (workers)")
    c.add_argument("--cpus", help="pin this process to these CPUs (comma-separated)")
    srv = sub.add_parser("server")
    srv.add_argument("--model", required=True)
    srv.add_argument("--sessions", type=int, default=8)
    srv.add_argument("--guard-ms", type=float, default=DEFAULT_TICKER_GUARD_MS)
    srv.add_argument("--realtime-priority", type=int, default=None)
    srv.add_argument("--cpu-wake-latency-us", type=int, default=None, help="hold /dev/cpu_dma_latency at this")
    srv.add_argument("--save", required=True, help="write the raw lateness values (ns) to this .npy file")
    srv.add_argument(
        "--planner", default="none", help="the server's planner source (controller.serve.config.PlannerConfig)"
    )
    srv.add_argument(
        "--alternate-s",
        type=float,
        default=None,
        help="pause and resume the planner in turns of this many seconds; lateness per phase",
    )
    srv.add_argument("--metrics", action="store_true", help="serve Prometheus metrics (metrics_port 0)")
    srv.add_argument("--tls-cert", help="serve TLS with this certificate (and --tls-key)")
    srv.add_argument("--tls-key")
    srv.add_argument("--tokens-file", help="require a bearer token from this file on every RPC")
    srv.add_argument("--gate", action="append", help="gate file (repeat)")
    srv.add_argument("--port", type=int, default=0)
    srv.add_argument("--board", help="worker board file (bench tick --workers)")
    srv.add_argument("--workers", type=int, default=1)
    srv.add_argument("--slot", type=int, default=0)
    srv.add_argument("--cpus", help="pin this process to these CPUs (comma-separated)")
    srv.add_argument("--candidate", help="a candidate model beside the live one (never applied)")
    srv.add_argument("--candidate-gate", action="append", help="the candidate's gate file (repeat)")
    b = sub.add_parser("bare")
    b.add_argument("--duration", type=float, default=10.0)
    b.add_argument("--period-ms", type=float, default=5.0)
    b.add_argument("--guard-ms", type=float, default=DEFAULT_TICKER_GUARD_MS)
    b.add_argument("--save", help="write the raw lateness values (ns) to this .npy file")
    b.add_argument("--realtime-priority", type=int, default=None)
    b.add_argument("--cpu-wake-latency-us", type=int, default=None, help="hold /dev/cpu_dma_latency at this")
    b.add_argument("--cpus", help="pin this process to these CPUs (comma-separated)")
    args = parser.parse_args(argv)
    cpus = {int(c) for c in args.cpus.split(",")} if args.cpus else None
    if cpus and args.what != "server":  # before anything starts a thread: threads inherit the mask
        os.sched_setaffinity(0, cpus)
    loop = new_event_loop()
    result: object
    if args.what == "clients":
        result = loop.run_until_complete(
            run_clients(
                args.address,
                args.sessions,
                args.duration,
                args.period_ms / 1e3,
                args.seed,
                args.ca_file,
                args.first,
                args.channel_per_session,
            )
        )
    elif args.what == "server":
        result = loop.run_until_complete(
            run_server(
                args.model,
                args.sessions,
                args.guard_ms,
                args.realtime_priority,
                args.save,
                args.planner,
                args.alternate_s,
                args.metrics,
                args.tls_cert,
                args.tls_key,
                args.tokens_file,
                args.gate,
                args.port,
                wb.Board.attach(Path(args.board), args.workers, LATENESS_BUCKETS_US) if args.board else None,
                args.slot,
                cpus,
                args.candidate,
                args.candidate_gate,
                args.cpu_wake_latency_us,
            )
        )
    else:
        result = loop.run_until_complete(
            run_bare_ticker(
                int(args.period_ms * 1e6),
                args.duration,
                int(args.guard_ms * 1e6),
                save=args.save,
                realtime_priority=args.realtime_priority,
                cpu_wake_latency_us=args.cpu_wake_latency_us,
            )
        )
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
