"""`dualloop alpasim`: serve dualloop as an alpasim driver (egodriver.EgodriverService), extra `alpasim`."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

from dualloop.controller.alpasim.driver import HORIZON_S, MAX_HORIZON_S, DualloopDriver, build_server
from dualloop.controller.console import console
from dualloop.controller.contract.addresses import host_port
from dualloop.controller.contract.errors import ConfigError
from dualloop.controller.contract.gate_files import load_gate_for_model
from dualloop.executor.core import Executor
from dualloop.executor.model_runner import DecisionModel
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES

DEFAULT_PORT = 50051  # alpasim's and carla-driver-interface's driver port


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "alpasim",
        help="serve dualloop as an alpasim driver (egodriver.EgodriverService, loopback); docs/alpasim.md",
    )
    p.add_argument("--host", default="127.0.0.1", help="loopback address or unix:PATH (default 127.0.0.1)")
    p.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"0..65535 (default {DEFAULT_PORT}); 0 picks a free one"
    )
    p.add_argument("--model", type=Path, help="default: models/base.onnx")
    p.add_argument("--gate", type=Path, action="append", help="gate files (default: the base model's two)")
    p.add_argument("--no-gate", action="store_true", help="serve without the OOD gate")
    p.add_argument(
        "--horizon",
        type=float,
        default=HORIZON_S,
        help=f"seconds of plan per answer, > 0 and at most {MAX_HORIZON_S:g} (default {HORIZON_S}): the last "
        "decision held, which the runtime replaces at its next step; longer says nothing more and costs each answer",
    )
    p.set_defaults(fn=_alpasim)


def _alpasim(args: argparse.Namespace) -> int:
    # before the model loads; nan and inf fail both comparisons
    if not 0 < args.horizon <= MAX_HORIZON_S:
        raise ConfigError(f"--horizon {args.horizon}: must be > 0 and at most {MAX_HORIZON_S:g} seconds")
    if not (args.host.startswith(("unix:", "unix-abstract:")) or 0 <= args.port <= 65535):
        raise ConfigError(f"--port {args.port}: must be 0..65535 (0: a free port)")
    if args.no_gate and args.gate:  # which one was meant is the user's call, not a silent pick
        given = " ".join(f"--gate {g}" for g in args.gate)
        raise ConfigError(f"--no-gate and {given}: give the gate files or --no-gate, not both")
    model_path = args.model or BASE_MODEL_PATH
    model = DecisionModel(model_path)
    gate_paths: list[Path] = []
    if not args.no_gate:
        gate_paths = args.gate or ([g for g in DEFAULT_GATES if g.is_file()] if model_path == BASE_MODEL_PATH else [])
    gates = [load_gate_for_model(g, model) for g in gate_paths]
    driver = DualloopDriver(Executor(model, None, gates or None), horizon_s=args.horizon)
    try:
        server, port = build_server(driver, args.host, args.port)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server.start()
    where = args.host if port == 0 else host_port(args.host, port)
    # the first line names the address (tests and scripts read it)
    console.print(
        f"serving egodriver.EgodriverService on {where}: model {model.card.name} {model.card.version}, "
        f"{len(gates)} gate(s), plan horizon {args.horizon} s",
        highlight=False,
    )
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    server.stop(grace=1.0).wait()
    return 0
