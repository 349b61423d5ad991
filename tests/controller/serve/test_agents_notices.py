"""DriveAgents REALTIME: the notices (`opened`, `errors`, `left`) ride on the response of the next tick,
so every response carries its tick and no two carry the same one (docs/contract.md#agents); a slow
reader's conflation never loses a notice. A real server on loopback, real gRPC clients."""

from __future__ import annotations

import time
from collections import Counter

import grpc

from dualloop.controller.contract.agents_client import AgentsStream, agent_open, observation
from dualloop.controller.contract.client import realtime_channel
from dualloop.controller.serve.lifecycle import ServerThread
from dualloop.v2 import controller_pb2 as pb
from tests.controller.serve.inputs import sensor

REALTIME = pb.CLOCK_MODE_REALTIME


def _observations(ids: list[str], seq: int, bad: str = "") -> dict[str, pb.Observation]:
    """One observation per agent; `bad`'s has too few features (which closes that agent)."""
    return {sid: observation(seq, time.monotonic_ns(), sensor(seq)[: 5 if sid == bad else None]) for sid in ids}


def _notices(responses: list[pb.DriveAgentsResponse]) -> tuple[Counter, Counter, Counter]:
    opened = Counter(o.session_id for r in responses for o in r.opened)
    errors = Counter(e.session_id for r in responses for e in r.errors)
    left = Counter(sid for r in responses for sid in r.left)
    return opened, errors, left


def _assert_one_response_per_tick(responses: list[pb.DriveAgentsResponse]) -> None:
    ticks = [r.tick for r in responses]
    assert all(b > a for a, b in zip(ticks, ticks[1:])), ticks  # never 0, never back, never twice
    for r in responses:
        assert all(s.tick == r.tick for s in r.snapshots), r


def _drive(group: AgentsStream, pause_s: float) -> None:
    """Two agents and a third refused at its join; one agent closed by a bad observation; one leaves;
    one joins late; then the stream half-closes right after a leave."""
    group.send(join=[agent_open("n-0", REALTIME), agent_open("n-1", REALTIME), agent_open("n-0", REALTIME)])
    ids = ["n-0", "n-1"]
    for seq in range(1, 41):
        join, leave, bad = [], [], ""
        if seq == 10:
            bad = "n-1"
        if seq == 11:
            ids.remove("n-1")
        if seq == 20:
            join = [agent_open("n-2", REALTIME), agent_open("n-3", REALTIME)]
        if seq == 21:
            ids += ["n-2", "n-3"]
        if seq == 30:
            leave = ["n-2"]
        group.send(join=join, observations=_observations(ids, seq, bad), leave=leave)
        if seq == 30:
            ids.remove("n-2")
        time.sleep(pause_s)
    group.send(leave=["n-3"])
    group.close()


def _expect_every_notice_once(responses: list[pb.DriveAgentsResponse]) -> None:
    opened, errors, left = _notices(responses)
    assert opened == Counter({"n-0": 1, "n-1": 1, "n-2": 1, "n-3": 1}), opened
    # n-0's second join (ALREADY_EXISTS), n-1's short observation (INVALID_ARGUMENT)
    assert errors == Counter({"n-0": 1, "n-1": 1}), errors
    assert left == Counter({"n-2": 1, "n-3": 1}), left


def test_notices_ride_on_the_next_ticks_response(shipped_server: ServerThread) -> None:
    with grpc.insecure_channel(shipped_server.address) as channel:
        group = AgentsStream(channel)
        _drive(group, pause_s=0.01)
        responses = list(group.responses())  # to the end: OK, after the half-close's leave was answered
    _assert_one_response_per_tick(responses)
    _expect_every_notice_once(responses)
    assert responses[0].opened  # the join's, on the first tick after it
    # the refusal of n-0's second join comes on the first tick's response, with the openings
    assert [e.code for e in responses[0].errors] == [grpc.StatusCode.ALREADY_EXISTS.value[0]]


def test_a_slow_readers_conflation_keeps_every_notice(shipped_server: ServerThread) -> None:
    """A client that reads nothing while the stream goes on (a small HTTP/2 window: the server sees it
    soon): the server conflates ticks, and the notices of the replaced ticks come with the newest."""
    with realtime_channel(shipped_server.address) as channel:
        group = AgentsStream(channel)
        _drive(group, pause_s=0.025)  # about a second without reading
        responses = list(group.responses())
    _assert_one_response_per_tick(responses)
    _expect_every_notice_once(responses)
    assert responses[-1].agent_snapshots_dropped > 0  # conflated: ticks were replaced
