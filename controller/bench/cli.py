"""`dualloop bench tick | sim | gate | planner | replay`: numbers, never timed unit tests."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.markup import escape

from dualloop.controller.bench.agents import (
    AGENTS_SWEEP,
    QUICK_AGENTS,
    QUICK_DURATION_S,
    QUICK_STREAMS,
    STREAMS_SWEEP,
    AgentsRun,
    bench_agents,
)
from dualloop.controller.bench.gate import SESSION_COUNTS, bench_gate_table
from dualloop.controller.bench.harness import TickRun
from dualloop.controller.bench.overrun import bench_overrun
from dualloop.controller.bench.plan_cost import bench_plan_cost
from dualloop.controller.bench.planner import PHASE_S, bench_planner
from dualloop.controller.bench.replay import bench_replay
from dualloop.controller.bench.rules import SESSION_COUNTS as RULES_SESSION_COUNTS
from dualloop.controller.bench.rules import bench_rules_table
from dualloop.controller.bench.secure import MissingExtraError, require_cryptography
from dualloop.controller.bench.sim import bench_sim
from dualloop.controller.bench.soak import SOAK_DURATION_S, SOAK_SESSIONS, SoakRun, bench_soak
from dualloop.controller.bench.tick import SWEEP, bench_sweep, bench_tick
from dualloop.controller.cli_types import non_negative_number, positive_int, positive_number, whole_number
from dualloop.controller.console import console, print_error
from dualloop.controller.contract.errors import ConfigError
from dualloop.controller.contract.gate_files import load_gate_for_model
from dualloop.controller.serve.realtime_threads import one_blas_thread
from dualloop.controller.serve.workers import worker_count
from dualloop.executor.config import DEFAULT_TICKER_GUARD_MS
from dualloop.executor.model_runner import DecisionModel
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES

_BENCH_DURATION_S = {
    "tick": 60.0,
    "planner": 600.0,
    "sim": 3.0,
    "replay": 60.0,
    "gate": 0.0,
    "rules": 10.0,
    "soak": SOAK_DURATION_S,
    "overrun": 0.0,
    "agents": 10.0,
}
_BENCH_SESSIONS = {"planner": 32, "soak": SOAK_SESSIONS}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("bench", help="benchmarks that print numbers")
    p.add_argument(
        "what",
        choices=["tick", "sim", "gate", "planner", "replay", "rules", "soak", "overrun", "agents"],
        help="tick: executor timing under gRPC load; sim: simulator steps per second next to highway-env; "
        "gate: gate cost next to the forward pass; planner: tick lateness with the behaviour planner busy "
        "on 32 sessions vs idle; replay: 60 s logs replayed, x real time on one core vs the per-tick path; "
        "rules: the server's CPU per REALTIME tick in process (read, model, rules, stream) at 8-64 sessions; "
        "soak: `dualloop serve` (shipped model, gates, planner) under 16 sessions for 10 minutes: memory slope, "
        "missed deadlines vs a bare ticker, leaked sessions/threads/fds; overrun: health, GetStats and a "
        "session's open while every tick overruns (a ~15 ms model built for the run, on a 5 ms tick); agents: "
        "DriveAgents streams of REALTIME agents swept (agents per stream x streams) beside a bare ticker: "
        "server CPU per agent-tick, missed deadlines, lateness, dropped agent-snapshots",
    )
    p.add_argument(
        "--gate",
        type=Path,
        action="append",
        help="gate file; repeat for several (default: without --model, the shipped model's two gates)",
    )
    p.add_argument(
        "--model",
        type=Path,
        help="ONNX model (default: models/base.onnx with its two gates, as served; another model runs with the "
        "--gate files given, none if none)",
    )
    p.add_argument(
        "--compare-pure",
        action="store_true",
        help="bench planner: first the planner's CPU per batch on its compiled and numpy paths, interleaved; "
        "bench rules: first the whole tick with the per-signal checks in C and in Python, alternated",
    )
    p.add_argument(
        "--sessions",
        type=positive_int,
        help="REALTIME sessions (tick: 8, planner: 32, soak: 16); gate: a count added to its table",
    )
    p.add_argument(
        "--duration",
        type=positive_number,
        help="seconds (tick: 60, planner: 600, sim: 3, replay: 60 at most; rules: 10 of ticks per count; soak: 600)",
    )
    p.add_argument("--out", type=Path, default=Path("runs/bench"))
    p.add_argument(
        "--logs", type=whole_number(0), help="replay: how many 60 s logs the whole-command fleet replays (100; 0: none)"
    )
    p.add_argument(
        "--fleet-workers", type=worker_count, help="replay: the fleet's process pool ('auto', the default: the cores)"
    )
    p.add_argument(
        "--guard-ms",
        type=non_negative_number,
        default=DEFAULT_TICKER_GUARD_MS,
        help="how long before each deadline the ticker stops serving gRPC and waits in its thread "
        f"(default {DEFAULT_TICKER_GUARD_MS:g}, as serve's executor.ticker_guard_ms)",
    )
    p.add_argument(
        "--realtime-priority",
        type=whole_number(0, 99),
        default=50,
        help="SCHED_FIFO priority for the executor process and, for fairness, the bare ticker "
        "(0: normal scheduling; refused without CAP_SYS_NICE, which the report shows)",
    )
    p.add_argument(
        "--cpu-wake-latency-us",
        type=whole_number(-1),
        default=-1,
        help="tick, planner, soak: the server keeps idle CPUs this quick to wake (/dev/cpu_dma_latency, "
        "for the whole machine; 0: they poll, never halt); default -1: idle states left alone, as serve",
    )
    _add_tick_options(p)
    _add_agents_options(p)
    p.set_defaults(fn=_bench)


def _add_agents_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--agents",
        help=f"bench agents: agents per stream, swept (default {','.join(map(str, AGENTS_SWEEP))})",
    )
    p.add_argument(
        "--streams",
        help=f"bench agents: streams per server, swept (default {','.join(map(str, STREAMS_SWEEP))})",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"bench agents: a short run ({','.join(map(str, QUICK_AGENTS))} agents, "
        f"{','.join(map(str, QUICK_STREAMS))} stream, {QUICK_DURATION_S:g} s each) unless told otherwise",
    )
    p.add_argument(
        "--per-agent-messages",
        action="store_true",
        help="bench agents: an Observation and a DecisionSnapshot message per agent (default: "
        "ObservationColumns and SnapshotColumns)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="bench agents: exit 1 naming each target missed (512 agents at 200 Hz keeping time, <= 5 us of server "
        "CPU per agent-tick there)",
    )


def _add_tick_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--metrics",
        choices=["off", "on", "both"],
        default="off",
        help="bench tick: the server serves Prometheus metrics, scraped every second (on), or runs "
        "without and with them in turns (off, on, off, on; each --duration), compared side by side (both)",
    )
    p.add_argument(
        "--secure",
        choices=["off", "on", "both"],
        default="off",
        help="bench tick: what a network deployment turns on (TLS with a certificate made for the run, a "
        "bearer token checked on every RPC, metrics scraped every second; on), or plain and secure runs in "
        "turns (plain, secure, plain, secure; each --duration) with a verdict in us (both)",
    )
    # bench tick: what makes a figure honest (worker processes, a bare-ticker control, secure turns)
    p.add_argument(
        "--workers",
        type=worker_count,
        default=1,
        help="bench tick, planner: server processes sharing the port ('auto')",
    )
    p.add_argument(
        "--sweep",
        nargs="?",
        const=",".join(map(str, SWEEP)),
        help="bench tick: session counts in turn (default %(const)s), stopping at the first that does not keep "
        "time; prints the largest that did",
    )
    p.add_argument(
        "--client-procs", type=positive_int, help="bench tick: client processes (default one per 16 sessions)"
    )
    p.add_argument(
        "--no-pin",
        action="store_true",
        help="bench tick, soak: do not pin the server apart from clients and bare ticker",
    )
    p.add_argument(
        "--planner",
        choices=["none", "behaviour"],
        default="none",
        help="bench tick: the server's planner (default none, as `dualloop serve` runs by default)",
    )
    p.add_argument(
        "--candidate",
        type=Path,
        help="bench tick: a candidate model decided beside the live one on every tick (never applied)",
    )
    p.add_argument("--candidate-gate", type=Path, action="append", help="bench tick: the candidate's gate file")
    p.add_argument(
        "--candidate-runs",
        choices=["on", "both"],
        default="both",
        help="bench tick --candidate: with the candidate only (on), or without, with, without, with in one "
        "command (both, the default; each --duration)",
    )
    p.add_argument("--calls", type=positive_int, default=200, help="bench overrun: each call this many times")


def _wake_latency(args: argparse.Namespace) -> int | None:
    return None if args.cpu_wake_latency_us < 0 else int(args.cpu_wake_latency_us)


def _error(text: str) -> int:
    print_error(text)
    return 2


def _tick_run(args: argparse.Namespace, **kw: Any) -> TickRun:
    """The run the flags ask for: what users run (the shipped model with its gates) unless told."""
    duration = args.duration if args.duration is not None else _BENCH_DURATION_S[args.what]
    return TickRun(
        model=args.model or BASE_MODEL_PATH,
        sessions=args.sessions if args.sessions is not None else _BENCH_SESSIONS.get(args.what, 8),
        duration_s=duration,
        guard_ms=args.guard_ms,
        rt_priority=args.realtime_priority or None,
        cpu_wake_latency_us=_wake_latency(args),
        gates=_gate_paths(args),
        workers=args.workers,
        **kw,
    )


def _gate_paths(args: argparse.Namespace) -> tuple[Path, ...]:
    return tuple(args.gate) if args.gate else (() if args.model else DEFAULT_GATES)


def _overrun(args: argparse.Namespace) -> int:
    result = bench_overrun(args.out / "overrun", args.calls)
    console.print(json.dumps(result, indent=2), highlight=False, markup=False)
    return 0


def _sim(args: argparse.Namespace) -> int:
    console.print(bench_sim(seconds=args.duration if args.duration is not None else _BENCH_DURATION_S["sim"]))
    return 0


def _soak(args: argparse.Namespace) -> int:
    run = _tick_run(args)
    if run.sessions < 1 or run.duration_s <= 0:
        return _error("bench soak needs --sessions >= 1 and --duration > 0")
    soak = SoakRun(run.sessions, run.duration_s, realtime_priority=run.rt_priority, pin=not args.no_pin)
    return 0 if bench_soak(replace(soak, cpu_wake_latency_us=run.cpu_wake_latency_us), args.out, console)["met"] else 1


def _planner(args: argparse.Namespace) -> int:
    # the planner's busy/idle p99 ratio needs many turns of each (docs/measurements.md)
    run = _tick_run(args, planner="behaviour")
    if run.duration_s < 4 * PHASE_S:
        return _error(
            f"bench planner --duration {run.duration_s:g}: too short, the planner is idle and busy in turns of "
            f"{PHASE_S:g} s and each needs two turns (at least {4 * PHASE_S:g} s)"
        )
    if args.compare_pure:
        bench_plan_cost(args.out, console)
    bench_planner(run, args.out, console)
    return 0


def _replay(args: argparse.Namespace) -> int:
    run = _tick_run(args)
    bench_replay(
        run.model,
        tuple(args.gate) if args.gate else DEFAULT_GATES,
        out_dir=args.out,
        seconds=min(run.duration_s, 60.0),
        console=console,
        logs=100 if args.logs is None else args.logs,
        workers=args.fleet_workers,
    )
    return 0


def _rules(args: argparse.Namespace) -> int:
    run = _tick_run(args)
    bench_rules_table(
        run.model,
        list(run.gates),
        (args.sessions,) if args.sessions else RULES_SESSION_COUNTS,
        ticks=max(20, int(run.duration_s * 200)),  # seconds of 5 ms ticks per session count
        out_dir=args.out,
        console=console,
        compare_pure=args.compare_pure,
    )
    return 0


def _gate(args: argparse.Namespace) -> int:
    run = _tick_run(args)
    if not run.gates:  # the shipped model with its two gates, as `serve` runs them by default
        raise ConfigError("bench gate needs --gate FILE for a model other than models/base.onnx")
    model = DecisionModel(run.model)
    gates = [load_gate_for_model(g, model) for g in run.gates]
    counts = sorted(set(SESSION_COUNTS) | ({args.sessions} if args.sessions else set()))  # plus --sessions
    bench_gate_table(
        model,
        gates,
        counts,
        out_dir=args.out,
        console=console,
        model_path=str(run.model),
        gate_paths=[str(g) for g in run.gates],
    )
    return 0


def _tick(args: argparse.Namespace) -> int:
    if args.secure != "off":
        if args.metrics != "off":
            return _error(
                f"bench tick --secure {args.secure} turns metrics on in its secure runs and off in its plain ones; "
                f"drop --metrics {args.metrics}"
            )
        try:
            require_cryptography()
        except MissingExtraError as err:
            return _error(str(err))
    if args.workers > 1 and (args.secure != "off" or args.metrics != "off"):
        return _error("bench tick --workers runs without --secure and --metrics")
    run = _tick_run(args, client_procs=args.client_procs, pin=not args.no_pin, planner=args.planner)
    if args.sweep:
        try:
            counts = [int(c) for c in args.sweep.split(",")]
        except ValueError:
            return _error(f"--sweep {args.sweep}: session counts like 8,16,32")
        bench_sweep(run, counts, args.out, console)
        return 0
    candidate = {"candidate": args.candidate, "candidate_gates": tuple(args.candidate_gate or ())}
    run = replace(run, **candidate)
    bench_tick(run, args.out, console, args.metrics, args.secure, args.candidate_runs)
    return 0


def _counts(text: str | None, default: tuple[int, ...], flag: str) -> tuple[int, ...]:
    if text is None:
        return default
    try:
        counts = tuple(int(c) for c in text.split(","))
    except ValueError:
        raise ConfigError(f"{flag} {text}: counts like 32,128,512") from None
    if not counts or min(counts) < 1:
        raise ConfigError(f"{flag} {text}: counts must be >= 1")
    return counts


def _agents(args: argparse.Namespace) -> int:
    duration = args.duration or (QUICK_DURATION_S if args.quick else _BENCH_DURATION_S["agents"])
    run = AgentsRun(
        agents=_counts(args.agents, QUICK_AGENTS if args.quick else AGENTS_SWEEP, "--agents"),
        streams=_counts(args.streams, QUICK_STREAMS if args.quick else STREAMS_SWEEP, "--streams"),
        duration_s=duration,
        model=args.model or BASE_MODEL_PATH,
        gates=_gate_paths(args),
        realtime_priority=args.realtime_priority or None,
        pin=not args.no_pin,
        columns=not args.per_agent_messages,
    )
    result = bench_agents(run, args.out, console)
    if args.check and result["targets_missed"]:
        for missed in result["targets_missed"]:
            console.print(f"[red]target missed:[/] {escape(missed)}", highlight=False)
        return 1
    return 0


_BENCHES = {
    "agents": _agents,
    "tick": _tick,
    "sim": _sim,
    "gate": _gate,
    "planner": _planner,
    "replay": _replay,
    "rules": _rules,
    "soak": _soak,
    "overrun": _overrun,
}


def _bench(args: argparse.Namespace) -> int:
    one_blas_thread()  # what the in-process benches time is what a server runs (its servers set their own)
    return _BENCHES[args.what](args)
