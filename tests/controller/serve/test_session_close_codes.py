"""The session.close event's `code` is the status the client got (docs/operations.md#logs): a stream
the client cancels mid-stream is logged CANCELLED, never OK, and one it half-closes OK, for Drive
(REALTIME and LOCKSTEP) and DriveAgents. A real server on loopback, real gRPC clients.

gRPC's asyncio server ends a cancelled call's request stream as if the client had half-closed, and
cancels the handler a moment later: a handler that ended in between logged OK (9 to 13 of these 250
streams on the code before the fix, up to a third of them on a busier machine)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from dualloop.controller.contract.agents_client import AgentsStream, agent_open, observation
from dualloop.controller.contract.client import DriveSession
from dualloop.controller.server_process import ServerProcess, serve_shipped
from dualloop.v2 import controller_pb2 as pb
from tests.controller.serve.inputs import MS, sensor

LOCKSTEP, REALTIME = pb.CLOCK_MODE_LOCKSTEP, pb.CLOCK_MODE_REALTIME
ROUNDS = 50


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """`dualloop serve` in a process of its own (in this process the race is rarer: about 1 in 100)."""
    with serve_shipped(tmp_path_factory.mktemp("close-codes"), log_level="INFO", log_format="json") as srv:
        yield srv


def closes(server: ServerProcess, prefix: str, n: int) -> dict[str, str]:
    """session id -> code of the session.close events of the sessions whose id starts with `prefix`,
    once there are n of them (the server logs each as its handler ends)."""
    deadline = time.monotonic() + 30
    while True:
        found = {
            e["session_id"]: e["code"] for e in server.events("session.close") if e["session_id"].startswith(prefix)
        }
        if len(found) >= n or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def _drive(channel: grpc.Channel, session_id: str, clock: int, observations: int = 3) -> DriveSession:
    """A Drive session `observations` observations in, each answered."""
    session = DriveSession(channel, session_id, clock)
    for seq in range(1, observations + 1):
        session.send(seq, time.monotonic_ns() if clock == REALTIME else seq * 5 * MS, sensor(seq))
        session.recv()
    return session


def _agents(channel: grpc.Channel, session_id: str, clock: int) -> AgentsStream:
    """A DriveAgents stream of one agent, with an observation answered."""
    group = AgentsStream(channel)
    group.send(join=[agent_open(session_id, clock)])
    ts = time.monotonic_ns() if clock == REALTIME else 0
    group.send(observations={session_id: observation(1, ts, sensor(1))})
    while not group.recv().snapshots:  # REALTIME: the join's response may come first
        pass
    return group


KINDS = {
    "drive-opened": lambda ch, sid: _drive(ch, sid, REALTIME, 0),
    "drive-rt": lambda ch, sid: _drive(ch, sid, REALTIME),
    "drive-ls": lambda ch, sid: _drive(ch, sid, LOCKSTEP),
    "agents-rt": lambda ch, sid: _agents(ch, sid, REALTIME),
    "agents-ls": lambda ch, sid: _agents(ch, sid, LOCKSTEP),
}


def _read_to_the_end(stream: DriveSession | AgentsStream) -> grpc.StatusCode:
    try:
        for _ in stream.snapshots() if isinstance(stream, DriveSession) else stream.responses():
            pass
    except grpc.RpcError as err:
        return err.code()
    return grpc.StatusCode.OK


def test_streams_cancelled_mid_stream_are_logged_cancelled(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.address) as channel:
        for k in range(ROUNDS):
            for kind, start in KINDS.items():
                stream = start(channel, f"cancel-{kind}-{k}")
                stream.cancel()
                assert _read_to_the_end(stream) == grpc.StatusCode.CANCELLED
    logged = closes(server, "cancel-", ROUNDS * len(KINDS))
    assert len(logged) == ROUNDS * len(KINDS)
    not_cancelled = {sid: code for sid, code in logged.items() if code != "CANCELLED"}
    assert not not_cancelled, (
        f"{len(not_cancelled)} of {len(logged)} cancelled streams logged otherwise: {not_cancelled}"
    )


def test_streams_half_closed_are_logged_ok(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.address) as channel:
        for k in range(3):
            for kind, start in KINDS.items():
                stream = start(channel, f"done-{kind}-{k}")
                stream.close()
                assert _read_to_the_end(stream) == grpc.StatusCode.OK
    logged = closes(server, "done-", 3 * len(KINDS))
    assert len(logged) == 3 * len(KINDS) and set(logged.values()) == {"OK"}, logged
