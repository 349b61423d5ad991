"""A planner on the other end of a gRPC channel (planner.proto), and a reference server for one.

RemotePlanner is a PlanSource like any other, so the PlanScheduler runs it in its worker: a slow
or dead remote costs a timeout count, never an executor tick.
"""

from __future__ import annotations

import ipaddress
import threading
from concurrent import futures

import grpc

from dualloop.planner.plan import Plan, PlanError, PlanRequest, PlanSource
from dualloop.planner.tls import ClientTLS, ServerTLS
from dualloop.planner.wire import plan_from_pb, plan_to_pb, request_from_pb, request_to_pb
from dualloop.v2 import planner_pb2 as pb
from dualloop.v2 import planner_pb2_grpc as pb_grpc


class PlanTimeout(TimeoutError):
    """The plan did not come back within its deadline (the scheduler counts these as timeouts)."""


class RemotePlannerError(RuntimeError):
    """The remote planner answered with an error or an invalid plan."""


class RemotePlanner:
    """PlanSource calling a `dualloop.v2.PlannerService` service with a per-call deadline."""

    def __init__(
        self, address: str, deadline_s: float = 0.1, name: str | None = None, tls: ClientTLS | None = None
    ) -> None:
        self.address = address
        self.tls = tls  # None: plaintext (a planner on this machine)
        self.deadline_s = deadline_s
        self.name = name or f"remote:{address}"
        # Created on first use: a channel must be made in the process that uses it (the scheduler's
        # worker), never inherited across a fork.
        self._channel: grpc.Channel | None = None
        self._stub: pb_grpc.PlannerServiceStub | None = None

    def _connect(self) -> pb_grpc.PlannerServiceStub:
        if self._stub is None:
            self._channel = grpc.insecure_channel(self.address) if self.tls is None else self.tls.channel(self.address)
            self._stub = pb_grpc.PlannerServiceStub(self._channel)
        return self._stub

    def plan(self, request: PlanRequest) -> Plan:
        stub = self._connect()
        try:
            reply = stub.Plan(request_to_pb(request), timeout=self.deadline_s)
        except grpc.RpcError as err:
            code = err.code() if hasattr(err, "code") else None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise PlanTimeout(
                    f"remote planner {self.address} did not answer within "
                    f"{self.deadline_s * 1e3:.0f} ms (session {request.session_id!r})"
                ) from None
            details = err.details() if hasattr(err, "details") else str(err)
            raise RemotePlannerError(f"remote planner {self.address}: {code}: {details}") from None
        try:
            return plan_from_pb(reply)
        except PlanError as err:
            raise RemotePlannerError(f"remote planner {self.address} sent an invalid plan: {err}") from None

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel, self._stub = None, None


class _PlannerServicer(pb_grpc.PlannerServiceServicer):
    def __init__(self, source: PlanSource) -> None:
        self._source = source

    def Plan(self, request: pb.PlanRequest, context: grpc.ServicerContext) -> pb.PlanResponse:
        try:
            plan_request = request_from_pb(request)
        except ValueError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        try:
            return plan_to_pb(self._source.plan(plan_request))
        except Exception as err:  # the source's failure is the caller's error, not the server's death
            context.abort(grpc.StatusCode.INTERNAL, f"{type(err).__name__}: {err}")
        raise AssertionError("unreachable")  # context.abort raises


class PlannerServer:
    """A running reference server; stop() it (or use it as a context manager)."""

    def __init__(self, server: grpc.Server, host: str, port: int) -> None:
        self._server = server
        self.host, self.port = host, port
        self._stopped = threading.Event()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self, grace_s: float | None = 0.0) -> None:
        if not self._stopped.is_set():
            self._stopped.set()
            self._server.stop(grace_s).wait()

    def __enter__(self) -> PlannerServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_planner(
    source: PlanSource,
    port: int = 0,
    host: str = "127.0.0.1",
    allow_non_loopback: bool = False,
    max_workers: int = 4,
    tls: ServerTLS | None = None,
) -> PlannerServer:
    """Expose any PlanSource as a `dualloop.v2.PlannerService` service; port 0 picks a free port.
    With tls, only TLS (mutual TLS with tls.client_ca_file) is served; plaintext beyond loopback is refused."""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback and not allow_non_loopback:
        raise ValueError(f"refusing to serve the planner on {host!r}: only loopback unless allow_non_loopback=True")
    if not loopback and tls is None:
        raise ValueError(f"refusing to serve the planner on {host!r} in plaintext: give tls (a ServerTLS)")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="planner-rpc"))
    pb_grpc.add_PlannerServiceServicer_to_server(_PlannerServicer(source), server)
    address = f"{host}:{port}"
    bound = server.add_insecure_port(address) if tls is None else server.add_secure_port(address, tls.credentials())
    if bound == 0:
        raise OSError(f"cannot bind the planner server to {host}:{port}")
    server.start()
    return PlannerServer(server, host, bound)
