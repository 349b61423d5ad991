"""The client side of `dualloop bench tick`, run in its own process: N REALTIME sessions over gRPC.

Each session sends an observation every period (like a sensor at the tick rate) and reads every
snapshot it is given; at the end one JSON line goes to stdout with what each session saw.
Also `python -m controller.bench_clients bare ...`: the bare ticker baseline process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import grpc
import numpy as np

from controller.server import new_event_loop
from controller.ticker import run_bare_ticker
from dualloop.v1 import controller_pb2 as pb
from dualloop.v1 import controller_pb2_grpc as pb_grpc


async def _session(stub: pb_grpc.ControllerStub, index: int, n_features: int, duration_s: float,
                   period_s: float, seed: int) -> dict[str, object]:
    rng = np.random.default_rng(seed + index)
    features = rng.normal(0, 1, n_features).astype(np.float32)
    features[0] = 25.0
    stop_at = time.monotonic() + duration_s
    call = stub.Drive()
    await call.write(pb.DriveRequest(open=pb.OpenSession(session_id=f"bench-{index}", clock=pb.REALTIME)))
    opened = await call.read()
    assert opened.WhichOneof("msg") == "opened"

    async def send() -> int:
        seq = 0
        next_t = time.monotonic()
        while time.monotonic() < stop_at:
            seq += 1
            features[1] = np.float32(seq % 100) / 100  # vary the input a little
            await call.write(pb.DriveRequest(observation=pb.Observation(
                seq=seq, timestamp_ns=time.monotonic_ns(), features=features.tolist())))
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
    return {"session": index, "observations_sent": sent, "snapshots_received": len(ticks),
            "snapshots_dropped": dropped, "tick_gaps": gaps,
            "tick_span": int(t[-1] - t[0] + 1) if t.size else 0,
            "reasons": {pb.ReasonCode.Name(k): v for k, v in reasons.items()}}


async def run_clients(address: str, sessions: int, duration_s: float, period_s: float, seed: int) -> list[dict]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.ControllerStub(channel)
        info = await stub.GetModelInfo(pb.GetModelInfoRequest())
        return list(await asyncio.gather(*(
            _session(stub, i, len(info.features), duration_s, period_s, seed) for i in range(sessions))))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m controller.bench_clients")
    sub = parser.add_subparsers(dest="what", required=True)
    c = sub.add_parser("clients")
    c.add_argument("--address", required=True)
    c.add_argument("--sessions", type=int, default=8)
    c.add_argument("--duration", type=float, default=10.0)
    c.add_argument("--period-ms", type=float, default=5.0)
    c.add_argument("--seed", type=int, default=0)
    b = sub.add_parser("bare")
    b.add_argument("--duration", type=float, default=10.0)
    b.add_argument("--period-ms", type=float, default=5.0)
    b.add_argument("--guard-ms", type=float, default=1.0)
    b.add_argument("--save", help="write the raw lateness values (ns) to this .npy file")
    args = parser.parse_args(argv)
    loop = new_event_loop()
    if args.what == "clients":
        result = loop.run_until_complete(
            run_clients(args.address, args.sessions, args.duration, args.period_ms / 1e3, args.seed))
    else:
        result = loop.run_until_complete(run_bare_ticker(int(args.period_ms * 1e6), args.duration,
                                                         int(args.guard_ms * 1e6), save=args.save))
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
