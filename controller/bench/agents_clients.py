"""The clients process of `dualloop bench agents`, started as `python -m
dualloop.controller.bench.agents_clients SPEC`: DriveAgents streams of REALTIME agents, each stream
sending one request per tick period holding every agent's observation (a sensor at the tick rate,
the real drive with the simulator's sensor noise, each agent at its own place in it) and reading
every response. Prints one JSON line: an AgentsStreamRow per stream."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass

import grpc
import numpy as np

from dualloop.controller.bench.procs import bench_inputs
from dualloop.controller.bench.results import AgentsStreamRow
from dualloop.controller.contract.observation_columns import columns_of_arrays
from dualloop.controller.serve.lifecycle import new_event_loop
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc


@dataclass(frozen=True)
class AgentsClientSpec:
    """Streams first .. first + streams - 1 of `agents` agents each, streaming for duration_s once open."""

    address: str
    streams: int = 1
    agents: int = 32
    duration_s: float = 10.0
    first: int = 0
    period_s: float = 0.005
    cpus: tuple[int, ...] | None = None
    columns: bool = True  # observations as ObservationColumns, answered as SnapshotColumns


async def _open(call: grpc.aio.StreamStreamCall, ids: list[str], columns: bool) -> None:
    """Every agent joined, or the refusal of the first that was not."""
    first = await call.read()
    assert first.limits.max_agents_per_stream >= len(ids), first.limits
    join = [pb.OpenSession(session_id=s, clock=pb.CLOCK_MODE_REALTIME) for s in ids]
    await call.write(pb.DriveAgentsRequest(join=join, snapshot_columns=columns))
    opened = 0
    while opened < len(ids):
        response = await call.read()
        if response is grpc.aio.EOF:
            raise RuntimeError("the server ended the stream while agents joined")
        if response.errors:
            raise RuntimeError(f"agent refused: {response.errors[0].message}")
        opened += len(response.opened)


async def _stream(stub: pb_grpc.ControllerServiceStub, index: int, spec: AgentsClientSpec) -> AgentsStreamRow:
    info = (await stub.GetModelInfo(pb.GetModelInfoRequest())).model
    drive, noise = bench_inputs(info)
    rng = np.random.default_rng(index)
    ids = [f"s{index}-a{i}" for i in range(spec.agents)]
    offsets = np.arange(spec.agents) * 997 % len(drive)
    call = stub.DriveAgents()
    await _open(call, ids, spec.columns)
    stop_at = time.monotonic() + spec.duration_s

    async def send() -> int:
        seq, next_t = 0, time.monotonic()
        while time.monotonic() < stop_at:
            seq += 1
            rows = drive[(offsets + seq // 2) % len(drive)] + noise * rng.standard_normal((spec.agents, noise.size))
            ts = time.monotonic_ns()
            req = pb.DriveAgentsRequest(snapshot_columns=spec.columns)
            if spec.columns:
                req.observation_columns.CopyFrom(columns_of_arrays(ids, seq, ts, rows.astype(np.float32)))
            else:
                for sid, x in zip(ids, rows.astype(np.float32).tolist()):
                    obs = req.observations.add(session_id=sid).observation
                    obs.seq, obs.timestamp_ns = seq, ts
                    obs.features.extend(x)
            await call.write(req)
            next_t += spec.period_s
            await asyncio.sleep(max(0.0, next_t - time.monotonic()))
        await call.done_writing()
        return seq

    t0 = time.monotonic()
    sender = asyncio.create_task(send())
    responses = received = dropped = gaps = errors = 0
    last_tick = None
    while (response := await call.read()) is not grpc.aio.EOF:
        responses += 1
        errors += len(response.errors)
        count = len(response.columns.session_id) if spec.columns else len(response.snapshots)
        if count:
            received += count
            dropped = response.agent_snapshots_dropped
            if last_tick is not None and response.tick != last_tick + 1:
                gaps += 1
            last_tick = response.tick
    sent = await sender
    return AgentsStreamRow(
        stream=index,
        agents=spec.agents,
        requests_sent=sent,
        responses=responses,
        agent_snapshots_received=received,
        agent_snapshots_dropped=dropped,
        tick_gaps=gaps,
        agent_errors=errors,
        send_rate_hz=sent / max(time.monotonic() - t0, 1e-9),
        client_process_cpu_s=0.0,
    )


async def run_agents_clients(spec: AgentsClientSpec) -> list[AgentsStreamRow]:
    async with grpc.aio.insecure_channel(spec.address) as channel:
        stub = pb_grpc.ControllerServiceStub(channel)
        cpu0 = time.process_time()
        rows = list(await asyncio.gather(*(_stream(stub, spec.first + k, spec) for k in range(spec.streams))))
        cpu = time.process_time() - cpu0
    for row in rows:  # the whole process's CPU, on every row
        row["client_process_cpu_s"] = cpu
    return rows


def main(argv: list[str] | None = None) -> None:
    (spec_json,) = argv if argv is not None else sys.argv[1:]
    spec = AgentsClientSpec(**json.loads(spec_json))
    if spec.cpus:
        os.sched_setaffinity(0, set(spec.cpus))
    json.dump(new_event_loop().run_until_complete(run_agents_clients(spec)), sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
