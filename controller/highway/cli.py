"""`dualloop highway`: highway-env's ego in closed loop with dualloop over gRPC (extra `highway`)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from dualloop.controller.console import console
from dualloop.controller.contract.errors import ConfigError
from dualloop.controller.highway.adapter import SUITE
from dualloop.controller.highway.suite import print_suite, run_suite
from dualloop.controller.server_process import require_files
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "highway",
        help="highway-env's ego driven by dualloop over gRPC, with and without the gate, next to highway-env's IDM ego",
    )
    p.add_argument("--envs", default=",".join(SUITE), help=f"comma-separated, from {', '.join(SUITE)} (default: all)")
    p.add_argument("--seeds", type=int, default=3, help="episodes per env, seeds 1000.. (default 3)")
    p.add_argument("--no-gate", action="store_true", help="skip the run with the OOD gate")
    p.add_argument("--model", type=Path, help="default: models/base.onnx")
    p.add_argument("--gate", type=Path, action="append", help="gate files (default: the base model's two)")
    p.add_argument(
        "--max-seconds",
        type=float,
        help="cap each episode, seconds > 0 (default: the env's duration, merge 60 s)",
    )
    p.add_argument(
        "--policy-hz",
        type=int,
        help="override the envs' policy_frequency (default: their own, 1 Hz); must divide their simulation frequency",
    )
    p.set_defaults(fn=_highway)


def _highway(args: argparse.Namespace) -> int:
    model = args.model or BASE_MODEL_PATH
    gates = args.gate or ([g for g in DEFAULT_GATES if g.is_file()] if model == BASE_MODEL_PATH else [])
    envs = check_args(args, model, gates)
    try:
        rows = run_suite(
            model,
            gates,
            envs,
            args.seeds,
            with_gate=not args.no_gate,
            max_seconds=args.max_seconds,
            policy_hz=args.policy_hz,
        )
    except ValueError as err:
        raise ConfigError(str(err)) from None
    print_suite(rows, model, console, args.policy_hz)
    return 0


def check_args(args: argparse.Namespace, model: Path, gates: list[Path]) -> list[str]:
    """The envs to run, every argument checked before a server starts (a ConfigError: one line, exit 2)."""
    if args.seeds < 1:
        raise ConfigError(f"--seeds {args.seeds}: must be at least 1")
    # 0 or less ran 1 s episodes (highway-env's floor), nan or inf never ended: nothing the table could mean
    if args.max_seconds is not None and not (math.isfinite(args.max_seconds) and args.max_seconds > 0):
        raise ConfigError(f"--max-seconds {args.max_seconds}: must be a finite number of seconds > 0")
    envs = list(dict.fromkeys(e.strip() for e in args.envs.split(",") if e.strip()))  # each once
    if not envs:
        raise ConfigError(f"--envs {args.envs!r}: names no env; choose from {', '.join(SUITE)}")
    unknown = [e for e in envs if e not in SUITE]
    if unknown:
        raise ConfigError(f"--envs: unknown {', '.join(unknown)}; choose from {', '.join(SUITE)}")
    require_files(model, gates if not args.no_gate else [])
    return envs
