"""The clients process of `dualloop bench agents`, started as `python -m
dualloop.controller.bench.agents_clients SPEC`: DriveAgents streams of REALTIME agents, each stream
sending one request per tick period holding every agent's observation (a sensor at the tick rate:
the simulated nominal drives of `bench.drives`, each agent at its own place in one, moving on with
the clock so that a late request carries the reading of its time) and reading every response.
Prints one JSON line: an AgentsStreamRow per stream."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass

import grpc
import numpy as np

from dualloop.controller.bench.drives import sensor_readings, start_places
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
    drives_file: str | None = None  # .npy of (drives, ticks, features) (bench.drives); None: near the card's means
    seed: int = 0


_NOMINAL = pb.SAFETY_STATE_NOMINAL


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
    drives, noise = bench_inputs(info, spec.drives_file)
    rng = np.random.default_rng([spec.seed, index])
    ids = [f"s{index}-a{i}" for i in range(spec.agents)]
    which = np.arange(spec.agents) % len(drives)
    length = drives.shape[1]
    offsets = start_places(rng, spec.agents, length, spec.period_s)
    call = stub.DriveAgents()
    await _open(call, ids, spec.columns)
    stop_at = time.monotonic() + spec.duration_s

    async def send() -> tuple[int, float]:
        seq, t0 = 0, time.monotonic()
        async for seq, slot, ts in sensor_readings(spec.period_s, stop_at):
            rows = drives[which, (offsets + slot) % length]  # wraps only past the simulated road's end
            if noise is not None:
                rows = rows + noise * rng.standard_normal(rows.shape).astype(np.float32)
            req = pb.DriveAgentsRequest(snapshot_columns=spec.columns)
            if spec.columns:
                req.observation_columns.CopyFrom(columns_of_arrays(ids, seq, ts, rows))
            else:
                for sid, x in zip(ids, rows.tolist()):
                    obs = req.observations.add(session_id=sid).observation
                    obs.seq, obs.timestamp_ns = seq, ts
                    obs.features.extend(x)
            await call.write(req)
        await call.done_writing()
        return seq, time.monotonic() - t0

    sender = asyncio.create_task(send())
    responses = received = dropped = gaps = errors = nominal = 0
    last_tick = None
    while (response := await call.read()) is not grpc.aio.EOF:
        responses += 1
        errors += len(response.errors)
        states = response.columns.safety_state if spec.columns else [s.safety_state for s in response.snapshots]
        if states:
            received += len(states)
            nominal += sum(state == _NOMINAL for state in states)
            dropped = response.agent_snapshots_dropped
            if last_tick is not None and response.tick != last_tick + 1:
                gaps += 1
            last_tick = response.tick
    sent, sending_s = await sender
    return AgentsStreamRow(
        stream=index,
        agents=spec.agents,
        requests_sent=sent,
        responses=responses,
        agent_snapshots_received=received,
        agent_snapshots_dropped=dropped,
        agent_snapshots_nominal=nominal,
        tick_gaps=gaps,
        agent_errors=errors,
        send_rate_hz=sent / max(sending_s, 1e-9),
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
