"""`dualloop bench soak`: a real `dualloop serve` under N REALTIME sessions for minutes, watched from outside.

What users run by default is what is soaked: the shipped model with its two gates and the built-in
behaviour planner (its worker process), served by the `dualloop serve` command in its own process,
under the scheduling the rated session count was measured with by `bench tick` (SCHED_FIFO 50 from
the command line; `--realtime-priority 0`: normal scheduling, the bare ticker's too).
The clients (`bench.procs clients`) and a bare ticker (`bench.procs bare`, the machine's floor) run
in two more processes for the same window. Every SAMPLE_S this process reads the server's RSS,
threads and open fds from /proc and its open sessions from GetStats; at the end, once every client
has gone, it checks that nothing leaked: no session open, threads and fds back to the baseline
taken after a probe session (gRPC and the loop create some of their threads on first use).

Verdicts are absolute: memory slope after warm-up below SLOPE_BOUND_MB_PER_MIN and growth below
GROWTH_BOUND of the RSS at warm-up; missed deadlines no more than the bare ticker's in the same run.

"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from rich.console import Console
from rich.table import Table

from dualloop.controller.bench.drives import nominal_drives, sensor_readings
from dualloop.controller.bench.harness import (
    CpuPlan,
    Result,
    cpu_plan,
    machine_cpus,
    progress,
    start_module,
    start_role,
    store_result,
)
from dualloop.controller.bench.procs import BareSpec, pin_threads
from dualloop.controller.serve.lifecycle import new_event_loop
from dualloop.controller.server_process import ProcSample, ServerProcess, probe_session, serve_shipped, wait_until
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc

# The rated session count of `dualloop serve` as users run it (with the planner) on this 2-core VM,
# shared with the clients: 16 kept every deadline for 10 minutes (0 missed, as the bare ticker). At
# 32, where `bench tick` keeps time without the planner, the soak missed 6 against the bare
# ticker's 2 (docs/measurements.md). --sessions overrides.
SOAK_SESSIONS = 16
SOAK_DURATION_S = 600.0
SAMPLE_S = 5.0
SLOPE_BOUND_MB_PER_MIN = 1.0  # absolute, after warm-up
GROWTH_BOUND = 0.05  # RSS growth over the window after warm-up, as a fraction of the RSS at warm-up
WARMUP_S = 60.0  # at most; a short run leaves out its first quarter instead
SETTLE_S = 30.0  # how long the end check waits for sessions, threads and fds to come back
STATS_TIMEOUT_S = 30.0  # GetStats while sampling; a sample without it records the error


def memory_verdict(times_s: Sequence[float], rss_mb: Sequence[float], duration_s: float) -> dict[str, Any]:
    """Least-squares RSS slope after warm-up (min(WARMUP_S, a quarter of the run)), and the growth it
    implies over that span relative to the RSS at warm-up; both against absolute bounds."""
    warmup = min(WARMUP_S, duration_s / 4)
    t = np.asarray(times_s, dtype=np.float64)
    m = np.asarray(rss_mb, dtype=np.float64)
    keep = t >= warmup
    if keep.sum() < 3:
        why = "fewer than 3 samples after warm-up"
        return {"warmup_s": warmup, "samples": int(keep.sum()), "met": None, "why": why}
    tk, mk = t[keep], m[keep]
    slope_per_s, intercept = np.polyfit(tk, mk, 1)
    start_mb = float(intercept + slope_per_s * tk[0])
    growth = float(slope_per_s * (tk[-1] - tk[0]) / start_mb)
    slope = float(slope_per_s * 60.0)
    return {
        "warmup_s": warmup,
        "samples": int(keep.sum()),
        "rss_at_warmup_mb": start_mb,
        "rss_max_mb": float(mk.max()),
        "slope_mb_per_min": slope,
        "growth_fraction": growth,
        "bounds": {"slope_mb_per_min": SLOPE_BOUND_MB_PER_MIN, "growth_fraction": GROWTH_BOUND},
        "met": slope < SLOPE_BOUND_MB_PER_MIN and growth < GROWTH_BOUND,
    }


EPISODE_S = 30.0  # one client session per simulated drive: a soak also opens and closes sessions
SOAK_DRIVES = 8  # drives the client slots share, each slot from its own offset


@dataclass
class SlotCounts:
    """What the clients saw: sessions driven one after another per slot, each a simulated drive."""

    sessions: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # status name -> opens refused
    failed: dict[str, int] = field(default_factory=dict)  # status name -> sessions ended by an error
    observations_sent: int = 0
    snapshots_received: int = 0
    snapshots_dropped: int = 0  # the server's count, from each session's last snapshot
    tick_gaps: int = 0
    states: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, int] = field(default_factory=dict)


def _count(book: dict[str, int], key: str) -> None:
    book[key] = book.get(key, 0) + 1


async def _drive_one(
    stub: pb_grpc.ControllerServiceStub, name: str, rows: np.ndarray, stop_at: float, counts: SlotCounts
) -> None:
    call = stub.Drive()
    try:
        await call.write(pb.DriveRequest(open=pb.OpenSession(session_id=name, clock=pb.CLOCK_MODE_REALTIME)))
        first = await call.read()
    except grpc.aio.AioRpcError as err:
        _count(counts.refused, err.code().name)
        return
    counts.sessions += 1
    period_s = first.opened.tick_period_ns / 1e9

    async def send() -> None:
        async for seq, slot, ts in sensor_readings(period_s, stop_at):
            if slot >= len(rows):  # the drive has ended: so does the session
                break
            obs = pb.Observation(seq=seq, timestamp_ns=ts, features=rows[slot].tolist())
            await call.write(pb.DriveRequest(observation=obs))
            counts.observations_sent += 1
        await call.done_writing()

    sender = asyncio.ensure_future(send())
    last_tick, dropped = -1, 0
    try:
        while (msg := await call.read()) is not grpc.aio.EOF:
            snap = msg.snapshot
            counts.snapshots_received += 1
            if last_tick >= 0 and snap.tick != last_tick + 1:
                counts.tick_gaps += 1
            last_tick, dropped = snap.tick, snap.snapshots_dropped
            _count(counts.states, pb.SafetyState.Name(snap.safety_state).removeprefix("SAFETY_STATE_"))
            for r in snap.reasons:
                _count(counts.reasons, pb.ReasonCode.Name(r).removeprefix("REASON_CODE_"))
        await sender
    except grpc.aio.AioRpcError as err:  # the session ended by an error: counted, the slot goes on
        _count(counts.failed, err.code().name)
        await asyncio.gather(sender, return_exceptions=True)
    counts.snapshots_dropped += dropped


async def run_soak_clients(address: str, sessions: int, duration_s: float, drives: np.ndarray) -> dict[str, Any]:
    """`sessions` slots for duration_s, each driving one of `drives` per session, back to back."""
    stop_at = time.monotonic() + duration_s
    counts = SlotCounts()  # one event loop: the slots share it without a lock

    async def slot(k: int, stub: pb_grpc.ControllerServiceStub) -> None:
        n = 0
        while time.monotonic() < stop_at:
            drive = drives[(k + n) % len(drives)]
            start = (k * 397) % max(1, len(drive) // 2) if n == 0 else 0  # stagger the slots' session ends
            await _drive_one(stub, f"soak-{k}-{n}", drive[start:], stop_at, counts)
            n += 1

    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.ControllerServiceStub(channel)
        await asyncio.gather(*(slot(k, stub) for k in range(sessions)))
    return asdict(counts)


@dataclass(frozen=True)
class SoakRun:
    """realtime_priority: the server's SCHED_FIFO priority (as `bench tick` runs it; the rated
    session count was measured so), and the bare ticker's, for fairness; None: normal scheduling.
    cpu_wake_latency_us: the server's PM QoS request (serve's cpu_wake_latency_us), which holds for
    the whole machine, the bare ticker's CPUs included; None: idle states left alone.
    pin: where the machine has a CPU to spare, the server on its own CPU and the clients and the bare
    ticker on the others, as `bench tick` runs them (cpu_plan)."""

    sessions: int = SOAK_SESSIONS
    duration_s: float = SOAK_DURATION_S
    sample_s: float = SAMPLE_S
    realtime_priority: int | None = None
    cpu_wake_latency_us: int | None = None
    pin: bool = True


async def _soak(
    server: ServerProcess, run: SoakRun, drives_file: Path, console: Console, client_cpus: list[int] | None
) -> dict[str, Any]:
    sessions, duration_s, sample_s = run.sessions, run.duration_s, run.sample_s
    realtime_priority, cpu_wake_latency_us = run.realtime_priority, run.cpu_wake_latency_us
    loop = asyncio.get_running_loop()
    pinned = ("--cpus", ",".join(map(str, client_cpus))) if client_cpus else ()
    args = ("--address", server.address, "--sessions", str(sessions), "--duration", str(duration_s))
    clients = await start_module(
        "dualloop.controller.bench.soak", "clients", *args, "--drives", str(drives_file), *pinned
    )
    cpus = tuple(client_cpus) if client_cpus else None
    # the server's scheduling
    bare = await start_role(
        "bare",
        BareSpec(
            duration_s, realtime_priority=realtime_priority or None, cpu_wake_latency_us=cpu_wake_latency_us, cpus=cpus
        ),
    )
    samples: list[dict[str, Any]] = []
    t0 = time.monotonic()
    first = await loop.run_in_executor(None, server.stats, STATS_TIMEOUT_S)
    with progress("bench soak", console, described=True) as bar:
        task = bar.add_task("", total=duration_s)
        while clients.returncode is None:
            proc = server.sample()
            sample: dict[str, Any] = {"t_s": time.monotonic() - t0, **asdict(proc)}
            try:  # a server too starved to answer within STATS_TIMEOUT_S is a finding, not the end of the run
                stats = await loop.run_in_executor(None, server.stats, STATS_TIMEOUT_S)
            except grpc.RpcError as err:
                sample["stats_error"] = err.code().name if isinstance(err, grpc.Call) else str(err)
                stats = None
            if stats is not None:
                sample.update(
                    sessions_open=stats.sessions_open,
                    missed_deadlines_total=stats.missed_deadlines_total,
                    ticks_total=stats.ticks_total,
                    snapshots_sent_total=stats.snapshots_sent_total,
                )
            samples.append(sample)
            missed = stats.missed_deadlines_total - first.missed_deadlines_total if stats is not None else "?"
            bar.update(
                task,
                completed=min(duration_s, time.monotonic() - t0),
                description=f"RSS {proc.rss_mb:.1f} MB, {proc.threads} threads, {proc.fds} fds, "
                f"{stats.sessions_open if stats is not None else '?'} sessions, {missed} missed",
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(clients.wait(), sample_s)
    client_out, _ = await clients.communicate()
    bare_out, _ = await bare.communicate()
    if clients.returncode or bare.returncode:
        raise RuntimeError(f"a bench process failed (clients exit {clients.returncode}, bare exit {bare.returncode})")
    end_stats = await loop.run_in_executor(None, server.stats, STATS_TIMEOUT_S)
    return {
        "samples": samples,
        "missed_deadlines": end_stats.missed_deadlines_total - first.missed_deadlines_total,
        "ticks": end_stats.ticks_total - first.ticks_total,
        "clients": json.loads(client_out),
        "bare": json.loads(bare_out),
    }


def _leaks(server: ServerProcess, baseline: ProcSample) -> dict[str, Any]:
    """Once every client has gone: wait up to SETTLE_S for sessions, threads and fds to come back."""
    end: dict[str, Any] = {}

    def settled() -> bool:
        proc = server.sample()
        try:
            sessions_open: int | None = server.stats(STATS_TIMEOUT_S).sessions_open
        except grpc.RpcError:
            sessions_open = None
        end.update(sessions_open=sessions_open, threads=proc.threads, fds=proc.fds, rss_mb=proc.rss_mb)
        return end["sessions_open"] == 0 and proc.threads <= baseline.threads and proc.fds <= baseline.fds

    ok = wait_until(settled, SETTLE_S, 0.5)
    return {
        "baseline": asdict(baseline),
        "end": end,
        "leaked_sessions": end["sessions_open"],
        "leaked_threads": max(0, end["threads"] - baseline.threads),
        "leaked_fds": max(0, end["fds"] - baseline.fds),
        "met": ok,
    }


def _serve_and_soak(run: SoakRun, plan: CpuPlan, console: Console) -> dict[str, Any]:
    """`dualloop serve` (the shipped model, gates and planner) under the clients for the whole run;
    what the run measured, the leak check once the clients have gone and how the server ended."""
    config: dict[str, Any] = {"planner": {"source": "behaviour"}, "executor": {"max_sessions": max(64, run.sessions)}}
    if run.realtime_priority:
        config["realtime_priority"] = run.realtime_priority
    if run.cpu_wake_latency_us is not None:
        config["cpu_wake_latency_us"] = run.cpu_wake_latency_us
    with tempfile.TemporaryDirectory() as tmp:
        count = min(SOAK_DRIVES, run.sessions)
        with console.status(f"simulating {count} drives of {EPISODE_S:g} s for the clients"):
            drives = nominal_drives(count, 0, EPISODE_S)
        drives_file = Path(tmp) / "drives.npy"
        np.save(drives_file, drives)
        with serve_shipped(Path(tmp), config) as server:
            probe_session(server.address, drives[0])  # lazily made threads belong to the baseline
            wait_until(lambda: server.stats().sessions_open == 0, SETTLE_S)
            baseline = server.sample()
            scheduling = server.stats().scheduling  # what the server got: SCHED_FIFO may be refused
            if plan.servers[0] is not None:
                pin_threads(set(plan.servers[0]), server.pid)
            measured = asyncio.run(_soak(server, run, drives_file, console, plan.clients))
            leaks = _leaks(server, baseline)
            healthy = server.health()
            exit_code = server.stop()
            errors = [line for line in server.stderr_text().splitlines() if "ERROR" in line or "Traceback" in line]
    after = {"health": healthy, "exit_code": exit_code, "error_lines": errors[:20]}
    return {**measured, "scheduling": scheduling, "leaks": leaks, "server_after": after, "errors": errors}


def bench_soak(run: SoakRun = SoakRun(), out_dir: Path = Path("runs/bench"), console: Console | None = None) -> Result:
    """A soak of `dualloop serve` as users run it; prints and stores the verdicts."""
    console = console or Console()
    load_start = list(os.getloadavg())
    plan = cpu_plan(machine_cpus(), 1, run.pin)
    console.print(
        f"bench soak: `dualloop serve` with {BASE_MODEL_PATH.name}, gates "
        f"{', '.join(g.name for g in DEFAULT_GATES)}, planner behaviour; {run.sessions} REALTIME sessions "
        f"(200 Hz observations) in a separate process for {run.duration_s:g} s; a bare ticker beside it; "
        f"{plan.note}",
        highlight=False,
    )
    measured = _serve_and_soak(run, plan, console)
    samples = measured["samples"]
    busy = [s for s in samples if s.get("sessions_open", 1) > 0] or samples
    memory = memory_verdict([s["t_s"] for s in busy], [s["rss_mb"] for s in busy], run.duration_s)
    bare = measured["bare"]
    deadlines = {
        "server_missed": measured["missed_deadlines"],
        "server_ticks": measured["ticks"],
        "bare_missed": bare["missed"],
        "bare_ticks": bare["ticks"],
        "bare_lateness_us": bare["lateness_us"],
        "met": measured["missed_deadlines"] <= bare["missed"],
    }
    clients, leaks, after = measured["clients"], measured["leaks"], measured["server_after"]
    what = {
        "command": "bench soak",
        "server": "dualloop serve (its own process)",
        "model": str(BASE_MODEL_PATH),
        "gates": [str(g) for g in DEFAULT_GATES],
        "planner": "behaviour",
        "scheduling": measured["scheduling"],
        "pinning": plan.note,
        "sessions": run.sessions,
        "duration_s": run.duration_s,
        "sample_s": run.sample_s,
        "cpus": os.cpu_count(),
        "load_average_start": load_start,
        "load_average_end": list(os.getloadavg()),
        "when": datetime.now().isoformat(timespec="seconds"),
    }
    result = {"what": what, "memory": memory, "deadlines": deadlines, "leaks": leaks, "clients": clients}
    result |= {"server_after": after, "samples": samples}
    unanswered = sum(1 for s in samples if "stats_error" in s)
    result["stats_unanswered"] = unanswered
    served = not clients["refused"] and not clients["failed"] and not measured["errors"] and after["exit_code"] == 0
    result["met"] = bool(memory["met"]) and deadlines["met"] and leaks["met"] and served and not unanswered
    path = store_result(out_dir, "soak", result)
    print_soak_report(result, console)
    console.print(f"results: {path}")
    return result


def print_soak_report(result: dict[str, Any], console: Console) -> None:
    w, mem, dl, lk = result["what"], result["memory"], result["deadlines"], result["leaks"]
    table = Table(
        title=f"bench soak: {w['sessions']} sessions, {w['duration_s']:g} s, {w.get('scheduling', '?')}, "
        f"load {w['load_average_end']}"
    )
    table.add_column("check")
    table.add_column("measured", justify="right")
    table.add_column("bound")
    table.add_column("")

    def verdict(ok: bool | None) -> str:
        return "[green]met[/]" if ok else "[yellow]n/a[/]" if ok is None else "[red]not met[/]"

    if mem.get("slope_mb_per_min") is not None:
        table.add_row(
            "RSS slope after warm-up",
            f"{mem['slope_mb_per_min']:+.3f} MB/min",
            f"< {SLOPE_BOUND_MB_PER_MIN:g} MB/min",
            verdict(mem["slope_mb_per_min"] < SLOPE_BOUND_MB_PER_MIN),
        )
        table.add_row(
            "RSS growth after warm-up",
            f"{mem['growth_fraction'] * 100:+.2f}% of {mem['rss_at_warmup_mb']:.1f} MB",
            f"< {GROWTH_BOUND * 100:g}%",
            verdict(mem["growth_fraction"] < GROWTH_BOUND),
        )
    else:
        table.add_row("RSS slope after warm-up", "-", mem.get("why", ""), verdict(None))
    table.add_row(
        "missed deadlines",
        f"{dl['server_missed']} of {dl['server_ticks']} ticks",
        f"<= bare ticker's {dl['bare_missed']} of {dl['bare_ticks']}",
        verdict(dl["met"]),
    )
    end, base = lk["end"], lk["baseline"]
    table.add_row("sessions open at the end", str(lk["leaked_sessions"]), "0", verdict(lk["leaked_sessions"] == 0))
    for what, key in (("threads", "threads"), ("open fds", "fds")):
        table.add_row(f"{what} at the end", str(end[key]), f"<= baseline {base[key]}", verdict(not lk[f"leaked_{key}"]))
    table.add_row(
        "GetStats unanswered",
        f"{result['stats_unanswered']} of {len(result['samples'])} samples",
        f"0 (within {STATS_TIMEOUT_S:g} s)",
        verdict(result["stats_unanswered"] == 0),
    )
    after = result["server_after"]
    table.add_row(
        "server after", f"{after['health']}, exit {after['exit_code']}, {len(after['error_lines'])} error lines", "", ""
    )
    console.print(table)
    c = result["clients"]
    received = max(1, c["snapshots_received"])
    console.print(
        f"clients: {c['sessions']} sessions driven (refused {c['refused'] or 'none'}, ended by an error "
        f"{c['failed'] or 'none'}), {c['snapshots_received']} snapshots "
        f"received, {c['snapshots_dropped']} dropped for slow reading, {c['tick_gaps']} tick gaps; states "
        + ", ".join(f"{k} {v / received:.1%}" for k, v in sorted(c["states"].items()))
        + "; reasons "
        + (", ".join(f"{k} {v / received:.1%}" for k, v in sorted(c["reasons"].items())) or "none")
        + f"; verdict: {'[green]met[/]' if result['met'] else '[red]not met[/]'}",
        highlight=False,
    )


def main(argv: list[str] | None = None) -> None:
    """`python -m dualloop.controller.bench.soak clients ...`: the soak's clients, one JSON line on stdout."""
    parser = argparse.ArgumentParser(prog="python -m dualloop.controller.bench.soak")
    sub = parser.add_subparsers(dest="what", required=True)
    c = sub.add_parser("clients")
    c.add_argument("--address", required=True)
    c.add_argument("--sessions", type=int, default=SOAK_SESSIONS)
    c.add_argument("--duration", type=float, default=60.0)
    c.add_argument("--drives", type=Path, required=True, help=".npy of (drives, ticks, features) (nominal_drives)")
    c.add_argument("--cpus", help="pin this process to these CPUs (comma-separated)")
    args = parser.parse_args(argv)
    if args.cpus:  # before anything starts a thread: threads inherit the mask
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    drives = np.load(args.drives)
    loop = new_event_loop()
    try:
        result = loop.run_until_complete(run_soak_clients(args.address, args.sessions, args.duration, drives))
    finally:
        loop.close()
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
