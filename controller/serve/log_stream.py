"""Shadow mode with a recorded drive: stream a log's observations to a server in REALTIME, at the
pace of their own timestamps, as a robot stack beside the controller would, and count what came
back (`dualloop stream`).

Each session declares the log's sensor rate and sensor profile when it opens, as an integrator's
client should (OpenSession.observation_period_ns, provided_features). The observations' timestamps
are the log's sensor times moved onto the client's monotonic clock, as a live stack stamps its
samples (not their send times: a rate of change over a send-time interval measures the event
loop). `every` keeps one observation in k (a 100 Hz log streamed as a 20 Hz sensor). An import's
actual controls are a label made from the drive's own speed, not the command in effect, so only its
action index is sent.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import grpc
import numpy as np

from dualloop.controller.logs.format import actual_is_command, sensor_profile
from dualloop.controller.logs.logfile import LogData
from dualloop.executor.snapshot import Reason, SafetyState
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc

# as controller.contract.client.realtime_channel: a small receive window, so a slow reader sees the
# server's conflation instead of seconds of buffered snapshots
_CHANNEL_OPTIONS = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 8192)]
# the first call also connects (TLS handshake included): generous on a loaded machine
_FIRST_CALL_TIMEOUT_S = 30.0


@dataclass
class StreamResult:
    """What the sessions received, summed over them."""

    sessions: int = 0
    observations_sent: int = 0
    snapshots: int = 0
    states: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    held: int = 0
    periods_ns: set[int] = field(default_factory=set)
    duration_s: float = 0.0

    def fraction(self, state: str) -> float:
        return self.states[state] / self.snapshots if self.snapshots else 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "sessions": self.sessions,
            "observations_sent": self.observations_sent,
            "snapshots": self.snapshots,
            "nominal_fraction": self.fraction("NOMINAL"),
            "states": dict(self.states),
            "reasons": dict(self.reasons),
            "held_fraction": self.held / self.snapshots if self.snapshots else 0.0,
            "observation_periods_ns": sorted(self.periods_ns),
            "duration_s": self.duration_s,
        }


def decimated(data: LogData, every: int) -> tuple[list[pb.Observation], int]:
    """Every k-th observation, and the observation period they have (0 when the log does not say)."""
    if every < 1:
        raise ValueError(f"every must be >= 1, got {every}")
    period = data.header.observation_period_ns
    if not period and len(data.observations) > 1:
        period = int(np.median(np.diff([o.timestamp_ns for o in data.observations])))
    return list(data.observations[::every]), period * every


async def _session(
    stub: pb_grpc.ControllerServiceStub,
    session_id: str,
    observations: list[pb.Observation],
    period_ns: int,
    provided: list[str] | None,
    commands: bool,
    speed: float,
    result: StreamResult,
    metadata: Sequence[tuple[str, str]],
) -> None:
    call = stub.Drive(metadata=metadata)
    await call.write(
        pb.DriveRequest(
            open=pb.OpenSession(
                session_id=session_id,
                clock=pb.CLOCK_MODE_REALTIME,
                shadow=True,
                observation_period_ns=int(period_ns / speed),
                provided_features=provided or [],
                # a log's actual controls are judged by the actuation check only when it declares them commands
                actual_controls_are_commands=commands,
            )
        )
    )
    first = await call.read()
    if first == grpc.aio.EOF or first.WhichOneof("msg") != "opened":
        raise RuntimeError(f"session {session_id}: the server did not open it")

    async def send() -> None:
        t0_log = observations[0].timestamp_ns
        t0 = time.monotonic_ns()
        for k, obs in enumerate(observations):
            due = t0 + int((obs.timestamp_ns - t0_log) / speed)
            delay = (due - time.monotonic_ns()) / 1e9
            if delay > 0:
                await asyncio.sleep(delay)
            if call.done():
                return  # the server ended the call: its status is the receiver's to raise, not a write error
            msg = pb.Observation()
            msg.CopyFrom(obs)
            msg.seq = k + 1
            msg.timestamp_ns = due  # sensor time on this client's clock: when the sample was taken, not sent
            await call.write(pb.DriveRequest(observation=msg))
            result.observations_sent += 1
        await call.done_writing()

    async def receive() -> None:
        while (response := await call.read()) != grpc.aio.EOF:
            snap = cast("pb.DriveResponse", response).snapshot
            result.snapshots += 1
            result.states[SafetyState(snap.safety_state).name] += 1
            for reason in snap.reasons:
                result.reasons[Reason(reason).name] += 1
            result.held += snap.observation_held
            result.periods_ns.add(snap.observation_period_ns)

    await _all_or_first_error([asyncio.create_task(send()), asyncio.create_task(receive())])


async def _all_or_first_error(tasks: list[asyncio.Task[None]]) -> None:
    """Wait for every task; the first to fail cancels the others and its error is raised once they have
    stopped. A task left running past its caller would write on a call its closed channel has ended,
    and asyncio would print its error ("Task exception was never retrieved") at exit."""
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()  # no-op on those already done
        await asyncio.gather(*tasks, return_exceptions=True)  # collects the others' errors: the first is raised


async def stream_logs(
    address: str,
    logs: list[LogData],
    sessions_per_log: int = 1,
    every: int = 1,
    speed: float = 1.0,
    credentials: grpc.ChannelCredentials | None = None,
    metadata: Sequence[tuple[str, str]] = (),
) -> StreamResult:
    """Stream every log (each `sessions_per_log` times, concurrently) to the server at `address`: over
    TLS with `credentials` (else plaintext), sending `metadata` (the token) on every call. The first
    session to fail (refused, the server gone) stops the others, and its error is raised."""
    result = StreamResult()
    t0 = time.monotonic()
    channel = (
        grpc.aio.secure_channel(address, credentials, options=_CHANNEL_OPTIONS)
        if credentials is not None
        else grpc.aio.insecure_channel(address, options=_CHANNEL_OPTIONS)
    )
    async with channel:
        stub = pb_grpc.ControllerServiceStub(channel)
        # The server refuses a caller (no token, a wrong one) before it reads a request, and a Drive call
        # refused so can fail its first write with gRPC's own "INTERNAL: Internal error from Core" in place
        # of the server's status. A unary call cannot: its refusal comes back as the server said it.
        await stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=metadata, timeout=_FIRST_CALL_TIMEOUT_S)
        tasks = []
        for i, data in enumerate(logs):
            observations, period = decimated(data, every)
            provided = sensor_profile(data.header)
            commands = actual_is_command(data.header)
            for k in range(sessions_per_log):
                sid = f"stream-{i}-{k}-{data.session_id}"[:120]
                session = _session(stub, sid, observations, period, provided, commands, speed, result, metadata)
                tasks.append(asyncio.create_task(session))
        result.sessions = len(tasks)
        await _all_or_first_error(tasks)
    result.duration_s = time.monotonic() - t0
    return result
