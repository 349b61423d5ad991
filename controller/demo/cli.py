"""`dualloop demo`: the main job, the scenario suite in closed loop over gRPC."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from dualloop.controller.cli_types import whole_number
from dualloop.controller.console import console
from dualloop.controller.contract.errors import ConfigError
from dualloop.controller.demo import traffic_demo, transitions
from dualloop.controller.demo.suite import run_demo
from dualloop.controller.server_process import require_files
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES, TEST_MODEL_PATH
from dualloop.sim.scenarios import SCENARIOS


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="the main job: the scenario suite in closed loop over gRPC, with a report")
    p.add_argument("--model", type=Path, help="default: models/base.onnx")
    p.add_argument("--scenarios", help="comma-separated subset (default: all)")
    p.add_argument("--gate", type=Path, action="append", help="gate files (default: the base model's two)")
    p.add_argument("--no-gate", action="store_true", help="drive without the OOD gate")
    p.add_argument(
        "--planner",
        choices=["auto", "none", "behaviour"],
        default="auto",
        help="auto: the server's built-in planner plans the nominal scenarios, the simulator the "
        "out-of-distribution ones; none: the simulator plans all; behaviour: the built-in planner "
        "plans all",
    )
    p.add_argument("--duration", type=float, help="seconds of sim time per scenario (default: the scenario's own)")
    p.add_argument(
        "--seed",
        type=whole_number(0),
        help="the episode seed of every scenario (default: 900001, held out from training)",
    )
    p.add_argument("--out", type=Path, default=Path("runs"))
    p.set_defaults(fn=_demo)
    transitions.register(sub)
    traffic_demo.register(sub)


def _demo(args: argparse.Namespace) -> int:
    model = args.model or (BASE_MODEL_PATH if BASE_MODEL_PATH.is_file() else TEST_MODEL_PATH)
    if model == TEST_MODEL_PATH:
        console.print("[yellow]no trained model found (models/base.onnx): driving with the untrained test model[/]")
    gates = (
        args.gate
        if args.gate
        else ([g for g in DEFAULT_GATES if g.is_file()] if model == BASE_MODEL_PATH and not args.no_gate else [])
    )
    scenarios = _check_args(args, model, gates)
    seed = {} if args.seed is None else {"seed": args.seed}
    run_demo(
        model, args.out, scenarios, **seed, duration_s=args.duration, console=console, gates=gates, planner=args.planner
    )
    return 0


def _check_args(args: argparse.Namespace, model: Path, gates: list[Path]) -> list[str] | None:
    """The scenarios (None: all), every argument checked before the server starts (a ConfigError: one
    line, exit 2): an unknown name was a KeyError, a duration of 0 the scenario's whole one."""
    if args.duration is not None and not (math.isfinite(args.duration) and args.duration > 0):
        raise ConfigError(f"--duration {args.duration}: must be a finite number of seconds > 0")
    scenarios = None
    if args.scenarios is not None:
        scenarios = list(dict.fromkeys(s.strip() for s in args.scenarios.split(",") if s.strip()))
        unknown = [s for s in scenarios if s not in SCENARIOS]
        if unknown or not scenarios:
            what = f"unknown {', '.join(unknown)}" if unknown else "names no scenario"
            raise ConfigError(f"--scenarios {args.scenarios!r}: {what}; choose from {', '.join(SCENARIOS)}")
    require_files(model, gates)
    return scenarios
