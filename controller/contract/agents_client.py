"""A small synchronous Python client for a DriveAgents stream: one stream drives a group of agents,
one request per tick holding every agent's observation, one response per tick holding every agent's
snapshot (docs/contract.md#agents). A convenience, as client.DriveSession is; the contract is the proto.

    group = AgentsStream(channel)
    group.send(join=[agent_open("car-1", pb.CLOCK_MODE_LOCKSTEP), agent_open("car-2", pb.CLOCK_MODE_LOCKSTEP)])
    group.recv()  # opened: car-1, car-2
    group.send(observations={"car-1": observation(1, t_ns, x1), "car-2": observation(1, t_ns, x2)})
    snapshots = group.recv().snapshots  # one per agent (LOCKSTEP: every tick the observations completed)

With `AgentsStream(channel, columns=True)` the server answers each tick's snapshots as one
SnapshotColumns message (`response.columns`), which costs it per response rather than per agent;
`group.snapshots(response)` gives the per-agent messages either way.
"""

from __future__ import annotations

import queue
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import cast

import grpc

from dualloop.controller.contract.snapshot_columns import snapshots_from_columns
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc

_END = object()


def agent_open(session_id: str, clock: int = pb.CLOCK_MODE_LOCKSTEP, **fields: object) -> pb.OpenSession:
    """An agent's OpenSession; `fields`: the other OpenSession fields (provided_features, ...)."""
    return pb.OpenSession(session_id=session_id, clock=cast("pb.ClockMode", clock), **fields)  # type: ignore[arg-type]


def observation(
    seq: int,
    timestamp_ns: int,
    features: Sequence[float],
    plan_id: str = "",
    plan: Sequence[float] | None = None,
    sent_time_ns: int = 0,
) -> pb.Observation:
    """One agent's observation (the fields a Drive client's DriveSession.send sets most)."""
    obs = pb.Observation(seq=seq, timestamp_ns=timestamp_ns, features=features, sent_time_ns=sent_time_ns)
    if plan is not None:
        obs.plan.plan_id = plan_id
        obs.plan.values.extend(plan)
    return obs


class AgentsStream:
    """One DriveAgents stream. The server's first response (model, limits, tick period) is read here."""

    def __init__(self, channel: grpc.Channel, max_pending: int = 64, columns: bool = False) -> None:
        self.columns = columns  # every request asks for SnapshotColumns (DriveAgentsRequest.snapshot_columns)
        # Bounded: a producer faster than the network blocks here instead of growing memory.
        self._requests: queue.Queue = queue.Queue(maxsize=max_pending)
        self._call = pb_grpc.ControllerServiceStub(channel).DriveAgents(self._iterate())
        first = next(self._call)
        self.model: pb.ModelInfo = first.model
        self.limits: pb.SessionLimits = first.limits
        self.tick_period_ns: int = first.tick_period_ns

    def _iterate(self) -> Iterator[pb.DriveAgentsRequest]:
        while (item := self._requests.get()) is not _END:
            yield item

    def send(
        self,
        join: Iterable[pb.OpenSession] = (),
        observations: Mapping[str, pb.Observation] = {},  # noqa: B006 (never mutated)
        leave: Iterable[str] = (),
        observation_columns: pb.ObservationColumns | None = None,
    ) -> None:
        """One request: agents joining, one observation per agent (by session id, or as columns:
        `observation_columns.columns_of_arrays`), agents leaving."""
        req = pb.DriveAgentsRequest(join=join, leave=leave, snapshot_columns=self.columns)
        for session_id, obs in observations.items():
            item = req.observations.add(session_id=session_id)
            item.observation.CopyFrom(obs)
        if observation_columns is not None:
            req.observation_columns.CopyFrom(observation_columns)
        self._requests.put(req)

    def send_raw(self, request: pb.DriveAgentsRequest) -> None:
        self._requests.put(request)

    def recv(self) -> pb.DriveAgentsResponse:
        """The next response; raises grpc.RpcError with the server's status when the stream fails."""
        return next(self._call)

    def snapshots(self, response: pb.DriveAgentsResponse) -> list[pb.DecisionSnapshot]:
        """A response's snapshots as per-agent messages, whichever layout the stream asked for."""
        if response.HasField("columns"):
            return snapshots_from_columns(response.columns)
        return list(response.snapshots)

    def responses(self) -> Iterator[pb.DriveAgentsResponse]:
        yield from self._call

    def close(self) -> None:
        """Half-close: no more requests; the server closes every agent and ends the stream."""
        self._requests.put(_END)

    def cancel(self) -> None:
        self._call.cancel()
