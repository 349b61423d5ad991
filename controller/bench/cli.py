"""`dualloop bench tick | sim | gate | planner | replay`: numbers, never timed unit tests."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.markup import escape

from dualloop.controller.bench.gate import SESSION_COUNTS, bench_gate_table
from dualloop.controller.bench.plan_cost import bench_plan_cost
from dualloop.controller.bench.planner import PHASE_S, bench_planner
from dualloop.controller.bench.replay import bench_replay
from dualloop.controller.bench.secure import MissingExtraError, require_cryptography
from dualloop.controller.bench.sim import bench_sim
from dualloop.controller.bench.soak import SOAK_DURATION_S, SOAK_SESSIONS, bench_soak
from dualloop.controller.bench.tick import bench_tick
from dualloop.controller.console import console
from dualloop.controller.serve.config import ConfigError
from dualloop.controller.serve.gate_files import load_gate_for_model
from dualloop.executor.model_runner import DecisionModel
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES, TEST_MODEL_PATH

_BENCH_DURATION_S = {"tick": 60.0, "planner": 600.0, "sim": 3.0, "replay": 60.0, "gate": 0.0, "soak": SOAK_DURATION_S}
_BENCH_SESSIONS = {"planner": 32, "soak": SOAK_SESSIONS}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("bench", help="benchmarks that print numbers")
    p.add_argument(
        "what",
        choices=["tick", "sim", "gate", "planner", "replay", "soak"],
        help="tick: executor timing under gRPC load; sim: simulator steps per second next to highway-env; "
        "gate: gate cost next to the forward pass; planner: tick lateness with the behaviour planner busy "
        "on 32 sessions vs idle; replay: 60 s logs replayed, x real time on one core vs the per-tick path; "
        "soak: `dualloop serve` (shipped model, gates, planner) under 16 sessions for 10 minutes: memory slope, "
        "missed deadlines vs a bare ticker, leaked sessions/threads/fds",
    )
    p.add_argument(
        "--gate",
        type=Path,
        action="append",
        help="gate file (bench gate; default: models/base.onnx with its two gates); repeat for several",
    )
    p.add_argument("--model", type=Path, default=TEST_MODEL_PATH)
    p.add_argument(
        "--compare-pure",
        action="store_true",
        help="bench gate: also run the gates' pure-Python path, interleaved tick by tick, and print the "
        "ratio; bench planner: first the planner's CPU per batch on its compiled and numpy paths, interleaved",
    )
    p.add_argument(
        "--sessions",
        type=int,
        help="REALTIME sessions (tick: 8, planner: 32, soak: 16); gate: a count added to its table",
    )
    p.add_argument(
        "--duration", type=float, help="seconds (tick: 60, planner: 600, soak: 600, sim: 3, replay: 60 at most)"
    )
    p.add_argument("--out", type=Path, default=Path("runs/bench"))
    p.add_argument(
        "--guard-ms",
        type=float,
        default=2.0,
        help="how long before each deadline the loop timer hands over to the busy wait",
    )
    p.add_argument(
        "--realtime-priority",
        type=int,
        default=50,
        help="SCHED_FIFO priority for the executor process and, for fairness, the bare ticker "
        "(0: normal scheduling; refused without CAP_SYS_NICE, which the report shows)",
    )
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
    p.set_defaults(fn=_bench)


def _bench(args: argparse.Namespace) -> int:
    # what each bench runs unless told: the planner's busy/idle p99 ratio needs many turns of each
    # (docs/measurements.md)
    duration = args.duration if args.duration is not None else _BENCH_DURATION_S[args.what]
    sessions = args.sessions if args.sessions is not None else _BENCH_SESSIONS.get(args.what, 8)
    if args.what == "sim":
        console.print(bench_sim(seconds=duration))
        return 0
    if args.what == "soak":
        if sessions < 1 or duration <= 0:
            console.print("[red]error:[/] bench soak needs --sessions >= 1 and --duration > 0", highlight=False)
            return 2
        return 0 if bench_soak(sessions, duration, args.out, console=console)["met"] else 1
    if args.what == "planner":
        if duration < 4 * PHASE_S:
            console.print(
                f"[red]error:[/] bench planner --duration {duration:g}: too short, the planner is "
                f"idle and busy in turns of {PHASE_S:g} s and each needs two turns (at least "
                f"{4 * PHASE_S:g} s)",
                highlight=False,
            )
            return 2
        if args.compare_pure:
            bench_plan_cost(args.out, console)
        bench_planner(
            args.model,
            sessions,
            duration,
            args.out,
            args.guard_ms,
            args.realtime_priority or None,
            planner="behaviour",
            console=console,
        )
        return 0
    if args.what == "replay":
        model = BASE_MODEL_PATH if args.model == TEST_MODEL_PATH else args.model
        bench_replay(
            model,
            tuple(args.gate) if args.gate else DEFAULT_GATES,
            out_dir=args.out,
            seconds=min(duration, 60.0),
            console=console,
        )
        return 0
    if args.what == "gate":
        model_path, gate_paths = args.model, args.gate
        if not gate_paths:  # the shipped model with its two gates, as `serve` runs them by default
            if args.model != TEST_MODEL_PATH:
                raise ConfigError("bench gate needs --gate FILE for a model other than models/base.onnx")
            model_path, gate_paths = BASE_MODEL_PATH, list(DEFAULT_GATES)
        model = DecisionModel(model_path)
        gates = [load_gate_for_model(g, model) for g in gate_paths]
        counts = sorted(set(SESSION_COUNTS) | ({args.sessions} if args.sessions else set()))  # plus --sessions
        bench_gate_table(
            model,
            gates,
            counts,
            out_dir=args.out,
            console=console,
            model_path=str(model_path),
            gate_paths=[str(g) for g in gate_paths],
            compare_pure=args.compare_pure,
        )
        return 0
    if args.what == "tick":
        if args.secure != "off":
            if args.metrics != "off":
                console.print(
                    f"[red]error:[/] bench tick --secure {args.secure} turns metrics on in its secure runs and "
                    f"off in its plain ones; drop --metrics {args.metrics}",
                    highlight=False,
                )
                return 2
            try:
                require_cryptography()
            except MissingExtraError as err:
                console.print(f"[red]error:[/] {escape(str(err))}", highlight=False)  # keeps '[bench]'
                return 2
        result = bench_tick(
            args.model,
            sessions,
            duration,
            args.out,
            args.guard_ms,
            args.realtime_priority or None,
            metrics=args.metrics,
            secure=args.secure,
        )
        if args.metrics == "both" or args.secure == "both":
            return 0
        ok = (
            result["executor"]["missed_deadlines"] == 0
            and result["p99_ratio_executor_over_bare"] <= 1.5
            and result["executor"]["lateness_us"]["p99"] < 500
        )
        console.print(
            "targets (0 missed, p99 <= 1.5x bare and < 500 us): "
            + ("[green]met[/]" if ok else "[yellow]not met in this run[/]")
        )
    return 0
