"""The container's health probe: grpc.health.v1.Health/Check on the local server; exit 0 only when SERVING.

Plain grpcio (no grpcio-health-checking needed): the request and reply are two tiny protobuf messages,
encoded by hand below. Settings from the environment (all optional):
  DUALLOOP_PORT                  the server's port (default 50151)
  DUALLOOP_PROBE_SERVICE         the service to ask about ("" = the whole server; or dualloop.v2.ControllerService)
  DUALLOOP_PROBE_CA              a CA certificate (PEM): probe over TLS instead of plaintext
  DUALLOOP_PROBE_SERVER_NAME     the name the server's certificate is for (TLS; default: as connected)
  DUALLOOP_PROBE_TOKEN_FILE      a bearer token file, when the server requires one for health checks too
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import grpc

SERVING = 1  # grpc.health.v1.HealthCheckResponse.ServingStatus.SERVING


def encode_request(service: str) -> bytes:
    """HealthCheckRequest{service}: field 1, length-delimited (empty message for the whole server)."""
    data = service.encode()
    if len(data) >= 128:
        raise ValueError("service name too long for this probe")
    return b"\x0a" + bytes([len(data)]) + data if data else b""


def decode_status(reply: bytes) -> int:
    """HealthCheckResponse.status: field 1, varint; absent = 0 (UNKNOWN)."""
    return reply[1] if len(reply) >= 2 and reply[0] == 0x08 else 0


def check(address: str, service: str = "", timeout_s: float = 3.0) -> int:
    """The serving status the server reports for service (raises grpc.RpcError when it does not answer)."""
    ca = os.environ.get("DUALLOOP_PROBE_CA")
    if ca:
        options = []
        if name := os.environ.get("DUALLOOP_PROBE_SERVER_NAME"):
            options.append(("grpc.ssl_target_name_override", name))
        creds = grpc.ssl_channel_credentials(Path(ca).read_bytes())
        channel = grpc.secure_channel(address, creds, options=options)
    else:
        channel = grpc.insecure_channel(address)
    metadata = []
    if token_file := os.environ.get("DUALLOOP_PROBE_TOKEN_FILE"):
        metadata.append(("authorization", "Bearer " + Path(token_file).read_text().strip()))
    with channel:
        call = channel.unary_unary("/grpc.health.v1.Health/Check")
        reply = call(encode_request(service), timeout=timeout_s, metadata=metadata)
    return decode_status(reply)


def main() -> int:
    address = f"127.0.0.1:{os.environ.get('DUALLOOP_PORT', '50151')}"
    service = os.environ.get("DUALLOOP_PROBE_SERVICE", "")
    try:
        status = check(address, service)
    except grpc.RpcError as err:
        print(f"unhealthy: {address} health check failed: {err.code().name} {err.details()}")
        return 1
    if status != SERVING:
        print(f"unhealthy: {address} reports status {status} for service {service!r} (1 = SERVING)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
