"""`dualloop serve` and `dualloop info`."""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

from dualloop.controller.console import console
from dualloop.controller.serve.config import load_server_config
from dualloop.controller.serve.server import ControllerServer, new_event_loop
from dualloop.executor.model_runner import DecisionModel


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="serve a model over gRPC (loopback by default)")
    p.add_argument("--model", type=Path, help="ONNX decision model with a dualloop model card")
    p.add_argument(
        "--gate",
        type=Path,
        action="append",
        help="OOD gate file fitted for this model (dualloop gate fit); repeat for several",
    )
    p.add_argument("--config", type=Path, help="server configuration (.toml or .yaml)")
    p.add_argument("--host", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 50151; 0 picks a free one)")
    p.add_argument("--allow-non-loopback", action="store_true", help="permit binding beyond loopback")
    p.add_argument("--realtime-priority", type=int, help="SCHED_FIFO priority (1-99) for the tick loop")
    p.add_argument("--record-dir", type=Path, help="record every session to MCAP in this folder")
    p.set_defaults(fn=serve)

    p = sub.add_parser("info", help="print a model's card (schema, actions, version)")
    p.add_argument("model", type=Path)
    p.set_defaults(fn=info)


def serve(args: argparse.Namespace) -> int:
    config = load_server_config(
        args.config,
        model=args.model,
        gates=args.gate,
        host=args.host,
        port=args.port,
        allow_non_loopback=True if args.allow_non_loopback else None,
        realtime_priority=args.realtime_priority,
        record_dir=args.record_dir,
    )
    server = ControllerServer(config)

    async def run() -> None:
        port = await server.start()
        card = server.executor.card
        console.print(
            f"dualloop serving model {card.name} {card.version} (schema {card.schema_hash()}) on "
            f"{config.host}:{port}, tick {config.executor.tick_period_ms} ms, {server.scheduling}. "
            f"Ctrl-C stops."
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await server.stop()
        s = server.runtime.stats
        console.print(
            f"stopped after {s.ticks} ticks, {server.runtime.ticker.missed} missed deadlines, "
            f"{s.snapshots_sent} snapshots sent"
        )

    loop = new_event_loop()
    loop.run_until_complete(run())
    return 0


def info(args: argparse.Namespace) -> int:
    card = DecisionModel(args.model, warmup_batches=()).card
    console.print_json(card.to_json())
    console.print(f"schema hash: {card.schema_hash()}")
    return 0
