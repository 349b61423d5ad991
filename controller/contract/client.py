"""A small synchronous Python client for one Drive session (tests, demos, the closed-loop runner).

Any gRPC language can do the same from proto/ alone; this is a convenience, not the contract.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator, Sequence
from typing import cast

import grpc

from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc

_END = object()
# HTTP/2 receive window of realtime_channel, and the server's advice (ServerConfig.client_window_bytes)
DEFAULT_CLIENT_WINDOW_BYTES = 8192


def realtime_channel(address: str, window_bytes: int = DEFAULT_CLIENT_WINDOW_BYTES) -> grpc.Channel:
    """A channel for REALTIME sessions that want the newest snapshot, not a backlog.

    By default HTTP/2 flow control (with BDP probing) lets a client's receive window grow to
    megabytes, so a client that falls behind reads seconds-old snapshots from its own gRPC buffer
    before the server ever sees backpressure. A small fixed window keeps that backlog to a few
    snapshots and lets the server's latest-wins outbox do the conflation (and count the drops).
    The server advises a window in SessionOpened.limits.recommended_client_window_bytes.
    """
    return grpc.insecure_channel(
        address, options=[("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", window_bytes)]
    )


class DriveSession:
    def __init__(
        self,
        channel: grpc.Channel,
        session_id: str = "",
        clock: int = pb.CLOCK_MODE_REALTIME,
        shadow: bool = False,
        include_decision_vector: bool = False,
        expected_schema_hash: str = "",
        max_pending: int = 1024,
        observation_period_ns: int = 0,
        provided_features: Sequence[str] = (),
        require_plan: bool = False,
        actual_controls_are_commands: bool = False,
    ):
        # Bounded: a producer faster than the network blocks here instead of growing memory.
        self._requests: queue.Queue = queue.Queue(maxsize=max_pending)
        self._requests.put(
            pb.DriveRequest(
                open=pb.OpenSession(
                    session_id=session_id,
                    clock=cast("pb.ClockMode", clock),  # a ClockMode number; the stubs type it as the enum class
                    shadow=shadow,
                    include_decision_vector=include_decision_vector,
                    expected_schema_hash=expected_schema_hash,
                    observation_period_ns=observation_period_ns,
                    provided_features=provided_features,
                    require_plan=require_plan,
                    actual_controls_are_commands=actual_controls_are_commands,
                )
            )
        )
        self._call = pb_grpc.ControllerServiceStub(channel).Drive(self._iterate())
        first = next(self._call)
        self.opened: pb.SessionOpened = first.opened
        self.session_id = self.opened.session_id

    def _iterate(self) -> Iterator[pb.DriveRequest]:
        while (item := self._requests.get()) is not _END:
            yield item

    def send(
        self,
        seq: int,
        timestamp_ns: int,
        features: Sequence[float],
        actual_index: int | None = None,
        actual_controls: Sequence[float] = (),
        plan_id: str = "",
        plan: Sequence[float] | None = None,
        sent_time_ns: int = 0,
        plan_valid_for_ns: int = 0,
        plan_created_ns: int = 0,
        release_standstill: bool = False,
    ) -> None:
        """sent_time_ns: this host's wall clock (time.time_ns()) at sending, so that the server can
        report the transport delay; 0: not given. `plan_valid_for_ns`, `plan_created_ns`: 0 for the
        defaults (docs/contract.md#plans). `release_standstill`: end a STANDSTILL_HOLD
        (docs/contract.md#safety)."""
        obs = pb.Observation(
            seq=seq,
            timestamp_ns=timestamp_ns,
            features=features,
            sent_time_ns=sent_time_ns,
            release_standstill=release_standstill,
        )
        if plan is not None:
            obs.plan.plan_id = plan_id
            obs.plan.values.extend(plan)
            obs.plan.valid_for_ns = plan_valid_for_ns
            obs.plan.created_ns = plan_created_ns
        if actual_index is not None:
            obs.actual.action_index = actual_index
            obs.actual.controls.extend(actual_controls)
        self._requests.put(pb.DriveRequest(observation=obs))

    def send_raw(self, request: pb.DriveRequest) -> None:
        self._requests.put(request)

    def recv(self) -> pb.DecisionSnapshot:
        """The next snapshot; raises grpc.RpcError with the server's status on error."""
        return next(self._call).snapshot

    def snapshots(self) -> Iterator[pb.DecisionSnapshot]:
        for msg in self._call:
            yield msg.snapshot

    def close(self) -> None:
        """Half-close: no more observations; the server ends the session."""
        self._requests.put(_END)

    def cancel(self) -> None:
        self._call.cancel()
