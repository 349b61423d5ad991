"""The container's health probe: grpc.health.v1.Health/Check on the local server; exit 0 only when SERVING.

Plain grpcio (no grpcio-health-checking needed): the request and reply are two tiny protobuf messages,
encoded by hand below. The port is the server's own: `--port` on its command line, else
DUALLOOP_PORT, else `port` in its configuration file (`--config`, else DUALLOOP_CONFIG), else 50151
(the server's order: a flag outranks a variable, which outranks the file). Settings from the
environment (all optional):
  DUALLOOP_PROBE_PORT            the port to probe, whatever the server was told
  DUALLOOP_PROBE_SERVICE         the service to ask about ("" = the whole server; or dualloop.v2.ControllerService)
  DUALLOOP_PROBE_CA              a CA certificate (PEM): probe over TLS instead of plaintext
  DUALLOOP_PROBE_SERVER_NAME     the name the server's certificate is for (TLS; default: as connected)
  DUALLOOP_PROBE_TOKEN_FILE      a bearer token file, when the server requires one for health checks too
"""

from __future__ import annotations

import json
import os
import sys
import tomllib
from collections.abc import Mapping
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


def _flag(argv: list[str], name: str) -> str | None:
    """The value of `--name V` or `--name=V` in argv (the last one, as argparse takes it)."""
    value = None
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(name + "="):
            value = arg[len(name) + 1 :]
    return value


def server_process(proc: Path = Path("/proc")) -> tuple[list[str], Path]:
    """The command line and working folder of the container's `dualloop serve` (PID 1, or the lowest pid
    running it: under `docker run --init` PID 1 is the init); ([], /) when none is found."""
    pids = sorted(int(p.name) for p in proc.iterdir() if p.name.isdigit())
    for pid in pids:
        try:
            argv = (proc / str(pid) / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "serve" in argv and any(Path(a).name == "dualloop" or a.endswith("dualloop.controller.cli") for a in argv):
            try:
                return argv, (proc / str(pid) / "cwd").resolve()
            except OSError:
                return argv, Path("/")
    return [], Path("/")


def _file_port(path: Path) -> str | None:
    """`port` in a configuration file (TOML, JSON or YAML, as the server reads them); None if absent."""
    try:
        text = path.read_text()
    except OSError:
        return None
    if path.suffix == ".toml":
        data = tomllib.loads(text)
    elif path.suffix == ".json":
        data = json.loads(text)
    else:
        import yaml  # the server's own dependency

        data = yaml.safe_load(text) or {}
    port = data.get("port") if isinstance(data, dict) else None
    return None if port is None else str(port)


def server_port(environ: Mapping[str, str], argv: list[str], cwd: Path = Path("/")) -> str:
    """The port to probe (see the module's docstring); a relative --config is the server's, from its
    working folder `cwd`."""
    for found in (environ.get("DUALLOOP_PROBE_PORT"), _flag(argv, "--port"), environ.get("DUALLOOP_PORT")):
        if found:
            return found
    config = _flag(argv, "--config") or environ.get("DUALLOOP_CONFIG")
    return (_file_port(cwd / config) if config else None) or "50151"


def main() -> int:
    address = f"127.0.0.1:{server_port(os.environ, *server_process())}"
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
