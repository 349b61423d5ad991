"""`dualloop serve` and `dualloop info`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc

from dualloop.controller.cli_types import positive_int, positive_number
from dualloop.controller.console import console, print_error
from dualloop.controller.contract.addresses import host_port
from dualloop.controller.contract.server_env import private_server_env
from dualloop.controller.logs.logfile import LogData, check_sessions, read_sessions
from dualloop.controller.serve.config import gates_summary, load_server_config
from dualloop.controller.serve.events import LOG_LEVELS, configure_logging
from dualloop.controller.serve.lifecycle import ServerLifecycle, new_event_loop
from dualloop.controller.serve.log_stream import stream_logs
from dualloop.controller.serve.security_cli import add_security_arguments, security_overrides, security_summary
from dualloop.controller.serve.ticker import settle_collector
from dualloop.controller.serve.workers import serve_workers, stop_when_parent_gone, worker_count
from dualloop.executor.model_runner import DecisionModel
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES
from dualloop.planner.tls import TLSFileError, check_ca, read_pem
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc

ADMIN_TOKEN_ENV = "DUALLOOP_ADMIN_TOKEN"
STREAM_TOKEN_ENV = "DUALLOOP_STREAM_TOKEN"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _register_serve(sub)
    _register_stream(sub)
    _register_admin(sub)
    p = sub.add_parser("info", help="print a model's card (schema, actions, version)")
    p.add_argument("model", type=Path)
    p.set_defaults(fn=info)


def _register_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="serve a model over gRPC (loopback by default)")
    p.add_argument("--model", type=Path, help="ONNX decision model with a dualloop model card")
    p.add_argument(
        "--gate",
        type=Path,
        action="append",
        help="OOD gate file fitted for this model (dualloop gate fit); repeat for several",
    )
    p.add_argument(
        "--candidate",
        type=Path,
        help="a candidate model decided beside the live one on every tick, never applied (GetShadowStats "
        "compares them); SIGHUP promotes it to live (docs/operations.md#a-candidate-model-and-hot-swap)",
    )
    p.add_argument(
        "--candidate-gate", type=Path, action="append", help="gate file fitted on --candidate; repeat for several"
    )
    p.add_argument(
        "--config",
        type=Path,
        default=os.environ.get("DUALLOOP_CONFIG"),
        help="server configuration (.toml or .yaml; default $DUALLOOP_CONFIG); DUALLOOP_* variables override it",
    )
    p.add_argument("--host", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 50151; 0 picks a free one)")
    p.add_argument(
        "--allow-non-loopback", action="store_true", help="deprecated: a non-loopback --host needs --tls-cert now"
    )
    add_security_arguments(p)
    p.add_argument(
        "--realtime-priority",
        type=int,
        help="SCHED_FIFO priority (1-99) for the tick loop (the other threads: one below); 0: normal scheduling",
    )
    p.add_argument(
        "--cpu-wake-latency-us",
        type=int,
        help="keep idle CPUs this quick to wake while serving (/dev/cpu_dma_latency; 0: they poll, never halt)",
    )
    # a string, not a Path: Path("") is ".", and the configuration refuses an empty value naming the flag
    p.add_argument("--record-dir", help="record every session to MCAP in this folder")
    # a server a dualloop command starts for itself (server_process.py): stop when that command is gone
    p.add_argument("--exit-with-parent", type=int, metavar="PID", help=argparse.SUPPRESS)
    p.add_argument("--log-format", choices=("human", "json"), help="server log on stderr (default human)")
    p.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, help="default INFO")
    p.add_argument("--drain-grace", type=float, help="seconds open streams get to end on SIGTERM (default 5)")
    p.add_argument(
        "--reflection",
        action=argparse.BooleanOptionalAction,
        help="gRPC server reflection (default: on when bound to loopback)",
    )
    p.add_argument(
        "--metrics-port", type=int, help="serve Prometheus metrics over HTTP on this port (0: a free one; default: off)"
    )
    p.add_argument("--metrics-host", help="bind address for the metrics (default 127.0.0.1)")
    p.add_argument(
        "--workers",
        type=worker_count,
        default=1,
        help="server processes sharing the port (SO_REUSEPORT), each a full executor; 'auto': one per CPU "
        "(default 1); a session stays on the process that accepted it (docs/operations.md#workers-every-core)",
    )
    p.set_defaults(fn=serve)


def _register_stream(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "stream",
        help="shadow mode with recorded drives: stream logs to a server in REALTIME at their own pace",
    )
    p.add_argument("logs", nargs="+", type=Path, help="log files or folders of .mcap logs")
    p.add_argument("--address", help="a running server (host:port); default: start one on loopback")
    _add_credential_arguments(p, STREAM_TOKEN_ENV, "the token for --address (a shadow: token is enough)")
    p.add_argument("--model", type=Path, help="for the server started here (default: the shipped model and its gates)")
    p.add_argument("--gate", type=Path, action="append", help="for the server started here (repeat for several)")
    p.add_argument("--sessions", type=positive_int, default=1, help="concurrent sessions per log (default 1)")
    p.add_argument("--every", type=positive_int, default=1, help="send every k-th observation (a slower sensor)")
    p.add_argument(
        "--speed",
        type=positive_number,
        default=1.0,
        help="time scale (2: twice real time); the drive's time runs that much faster, so the checks of "
        "change per second judge another drive: load a server with it, judge decisions with `replay`",
    )
    p.add_argument("--json", type=Path, help="also write the counts as JSON")
    p.add_argument(
        "--allow-truncated",
        action="store_true",
        help="stream the complete part of each session of a log whose end is missing or broken (a killed recorder's)",
    )
    p.set_defaults(fn=stream)


def _register_admin(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("admin", help="load a candidate model beside the live one, or promote it, on a running server")
    p.add_argument("action", choices=("load-candidate", "promote"))
    p.add_argument("model", nargs="?", type=Path, help="load-candidate: the candidate model (a path on the server)")
    p.add_argument("--gate", type=Path, action="append", help="load-candidate: its gate file (repeat for several)")
    p.add_argument("--promote", action="store_true", help="load-candidate: promote it at once")
    p.add_argument("--expected-version", default="", help="promote: only if the loaded candidate has this version")
    p.add_argument("--address", default="127.0.0.1:50151", help="the server (default 127.0.0.1:50151)")
    _add_credential_arguments(p, ADMIN_TOKEN_ENV, "the admin token")
    p.set_defaults(fn=admin)


def _add_credential_arguments(p: argparse.ArgumentParser, token_env: str, token: str) -> None:
    """--ca-file, --cert-file/--key-file and --token-env: how `admin` and `stream` reach a server with
    TLS, client certificates (mutual TLS) and tokens."""
    p.add_argument("--ca-file", type=Path, help="PEM CA bundle: connect with TLS")
    p.add_argument(
        "--cert-file",
        type=Path,
        help="PEM client certificate chain, with --key-file: mutual TLS (no --ca-file: the system's trusted roots)",
    )
    p.add_argument("--key-file", type=Path, help="PEM private key (unencrypted) of --cert-file's certificate")
    p.add_argument(
        "--token-env",
        default=token_env,
        help=f"environment variable holding {token} (default {token_env}; never on the command line)",
    )


@dataclass(frozen=True)
class ClientCredentials:
    """What `admin` and `stream` present: TLS trusting --ca-file, with the client certificate of
    --cert-file/--key-file when given (None: plaintext), and the token read from --token-env's
    variable ("" when it is unset or empty: then nothing is sent)."""

    tls: grpc.ChannelCredentials | None
    token: str
    token_env: str
    client_certificate: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ClientCredentials:
        """Raises TLSFileError naming the option and its file when a file cannot be read or used, and
        naming both when only one of --cert-file and --key-file is given."""
        if (args.cert_file is None) != (args.key_file is None):
            raise TLSFileError("--cert-file and --key-file go together: give both (a client certificate needs its key)")
        tls = None
        if args.ca_file is not None or args.cert_file is not None:
            ca = None
            if args.ca_file is not None:
                check_ca(args.ca_file, "--ca-file")
                ca = read_pem(args.ca_file, "--ca-file")
            key, chain = _client_certificate(args.cert_file, args.key_file) if args.cert_file else (None, None)
            tls = grpc.ssl_channel_credentials(ca, key, chain)
        return cls(tls, os.environ.get(args.token_env, ""), args.token_env, args.cert_file is not None)

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def no_token_hint(self, code: grpc.StatusCode | None, token: str) -> str:
        """Why an UNAUTHENTICATED call carried no token (`token`: what the command calls it): the
        server's message cannot know where this command reads it from, and an unset variable is the
        usual cause."""
        if code != grpc.StatusCode.UNAUTHENTICATED or self.token:
            return ""
        return (
            f" (this command sent no token: ${self.token_env} is unset or empty; export {token} in it, "
            f"or name another variable with --token-env)"
        )

    def transport_hint(self, code: grpc.StatusCode | None) -> str:
        """A TLS server closes a plaintext client's connection, and a mutual-TLS one that of a client
        without a certificate (UNAVAILABLE, never UNAUTHENTICATED): nothing in the status says that
        TLS or the certificate was the matter."""
        if code != grpc.StatusCode.UNAVAILABLE or self.client_certificate:
            return ""
        if self.tls is None:
            return " (plaintext: if the server uses TLS, give its CA with --ca-file)"
        return (
            " (no client certificate: if the server requires one (mutual TLS), give it with --cert-file and --key-file)"
        )


def _client_certificate(cert_file: Path, key_file: Path) -> tuple[bytes, bytes]:
    """The client's private key and certificate chain (PEM), checked to belong together: a wrong file
    fails here, named, not as a handshake the server closes."""
    chain, key = read_pem(cert_file, "--cert-file"), read_pem(key_file, "--key-file")

    def encrypted() -> bytes:  # instead of OpenSSL's prompt: gRPC cannot use an encrypted key anyway
        raise TLSFileError(f"--key-file {key_file}: the key is encrypted; gRPC needs an unencrypted key")

    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert_file, key_file, password=encrypted)
    except ssl.SSLError as err:
        raise TLSFileError(
            f"--cert-file {cert_file} and --key-file {key_file} cannot be used together: {err.reason or err}"
        ) from None
    return key, chain


def serve(args: argparse.Namespace) -> int:
    config = load_server_config(
        args.config,
        model=args.model,
        gates=args.gate,
        candidate=args.candidate,
        candidate_gates=args.candidate_gate,
        host=args.host,
        port=args.port,
        allow_non_loopback=True if args.allow_non_loopback else None,
        **security_overrides(args),
        realtime_priority=args.realtime_priority,
        cpu_wake_latency_us=args.cpu_wake_latency_us,
        record_dir=args.record_dir,
        log_format=args.log_format,
        log_level=args.log_level,
        drain_grace_s=args.drain_grace,
        reflection=args.reflection,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
    )
    configure_logging(config.log_level, config.log_format)
    if args.workers > 1:
        # soft_wrap: the start line whole on one line however long (scripts read the port from it)
        return serve_workers(
            config,
            args.workers,
            lambda line: console.print(line, highlight=False, markup=False, soft_wrap=True),
            args.exit_with_parent,
        )
    server = ServerLifecycle(config)

    async def run() -> None:
        port = await server.start()
        settle_collector()
        card = server.executor.card
        console.print(
            f"dualloop serving model {card.name} {card.version} (schema {card.schema_hash()}) on "
            f"{host_port(config.host, port)}, tick {config.executor.tick_period_ms} ms, {server.scheduling}, "
            f"{gates_summary(config)}, {security_summary(config, server.auth.enabled)}. Ctrl-C stops.",
            soft_wrap=True,
        )
        if server.metrics_port is not None:
            console.print(f"metrics: http://{host_port(config.metrics_host, server.metrics_port)}/metrics")
        server.log_start()  # after the lines above: scripts read the port from the first ones
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        # on the loop, so between two ticks
        loop.add_signal_handler(signal.SIGHUP, server.runtime.promote_on_signal)
        watch = None
        if args.exit_with_parent is not None:
            watch = asyncio.ensure_future(stop_when_parent_gone(args.exit_with_parent, stop))
        await stop.wait()
        if watch is not None:
            watch.cancel()
        await server.stop()
        console.print(stop_line(server))

    loop = new_event_loop()
    loop.run_until_complete(run())
    return 0


def stop_line(server: ServerLifecycle) -> str:
    """The exit line: totals since start, one kind of count throughout (GetStats resets only its window)."""
    s = server.runtime.stats
    uptime_s = (time.monotonic_ns() - s.started_ns) / 1e9
    return (
        f"stopped after {uptime_s:.1f} s; since start: {s.ticks_total} ticks with REALTIME sessions open, "
        f"{server.runtime.ticker.missed} missed deadlines, {s.snapshots_sent_total} snapshots sent"
    )


def _free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _server_process(args: argparse.Namespace) -> Iterator[str]:
    """`dualloop serve` in its own process (its tick loop must not share this client's GIL)."""
    port = _free_loopback_port()
    cmd = [sys.executable, "-m", "dualloop.controller.cli", "serve", "--port", str(port)]
    cmd += ["--model", str(args.model or BASE_MODEL_PATH), "--log-level", "WARNING"]  # the summary is ours
    for gate in args.gate if args.gate is not None else ([] if args.model else DEFAULT_GATES):
        cmd += ["--gate", str(gate)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env=private_server_env())
    address = f"127.0.0.1:{port}"
    try:
        with grpc.insecure_channel(address) as channel:
            deadline = time.monotonic() + 60
            while True:
                try:
                    grpc.channel_ready_future(channel).result(timeout=1)
                    break
                except grpc.FutureTimeoutError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit(f"the server did not start (exit code {proc.poll()})") from None
        yield address
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def stream(args: argparse.Namespace) -> int:
    if args.speed != 1.0:  # REALTIME is the server's clock: a faster stream is a faster drive
        console.print(
            f"[yellow]--speed {args.speed:g}: the drive's time runs {args.speed:g}x as fast as recorded, so the "
            f"checks that judge change per second (the signal and actuation checks) see another drive and veto "
            f"more; `dualloop replay` runs a drive faster than real time on its own clock (LOCKSTEP)[/yellow]",
            soft_wrap=True,
        )
    # the server started here is plaintext and has no authentication: credentials are for --address
    credentials = ClientCredentials(None, "", args.token_env)
    if args.address:
        try:
            credentials = ClientCredentials.from_args(args)
        except TLSFileError as err:
            print_error(err)
            return 2
    elif given := [f"--{f}-file" for f in ("ca", "cert", "key") if getattr(args, f"{f}_file") is not None]:
        goes = "goes" if len(given) == 1 else "go"
        print_error(f"{' and '.join(given)} {goes} with --address: the server started here is plaintext on loopback")
        return 2
    logs: list[LogData] = []
    for path in args.logs:
        files = sorted(path.glob("*.mcap")) if path.is_dir() else [path]
        for file in files:
            sessions = read_sessions(file).values()
            check_sessions(file, sessions, args.allow_truncated, "stream")  # as replay: never a cut drive as whole
            logs += (d for d in sessions if d.observations)
    if not logs:
        print_error(f"no observations in {', '.join(map(str, args.logs))}")
        return 2
    with contextlib.ExitStack() as stack:
        address = args.address or stack.enter_context(_server_process(args))
        total_s = max((d.observations[-1].timestamp_ns - d.observations[0].timestamp_ns) / 1e9 for d in logs)
        console.print(
            f"streaming {len(logs)} session(s) x {args.sessions} to {address}, every {args.every} observation(s), "
            f"about {total_s / args.speed:.0f} s"
        )
        try:
            result = asyncio.run(
                stream_logs(address, logs, args.sessions, args.every, args.speed, credentials.tls, credentials.metadata)
            )
        except grpc.aio.AioRpcError as err:  # as `admin`: the server unreachable or refusing, in one line
            hint = credentials.no_token_hint(err.code(), "a token")
            hint += credentials.transport_hint(err.code()) if args.address else ""
            print_error(f"stream to {address}: {err.code().name}: {err.details()}{hint}")
            return 1
    summary = result.as_dict()
    periods = ", ".join(f"{p / 1e6:g} ms" for p in result.periods_ns)
    console.print(
        f"{result.sessions} session(s), {result.observations_sent} observations sent, {result.snapshots} snapshots; "
        f"observation period {periods}; held ticks {summary['held_fraction']:.1%}"
    )
    for state, count in result.states.most_common():
        console.print(f"  {state:<16} {count / result.snapshots:7.2%}")
    for reason, count in result.reasons.most_common():
        console.print(f"  reason {reason:<16} {count / result.snapshots:7.2%} of ticks")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


def admin(args: argparse.Namespace) -> int:
    """One admin RPC; its refusal is printed with the server's message (exit code 1)."""
    if args.action == "load-candidate" and args.model is None:
        print_error("admin load-candidate needs the candidate model's path")
        return 2
    try:
        credentials = ClientCredentials.from_args(args)
    except TLSFileError as err:
        print_error(err)
        return 2
    metadata = credentials.metadata
    channel = (
        grpc.secure_channel(args.address, credentials.tls)
        if credentials.tls is not None
        else grpc.insecure_channel(args.address)
    )
    with channel:
        stub = pb_grpc.ControllerServiceStub(channel)
        try:
            if args.action == "load-candidate":
                loaded = stub.LoadCandidate(
                    pb.LoadCandidateRequest(
                        model_path=str(args.model.resolve()),
                        gate_paths=[str(g.resolve()) for g in args.gate or ()],
                        promote=args.promote,
                    ),
                    metadata=metadata,
                    timeout=120,
                )
                console.print(
                    f"candidate {loaded.candidate_version} loaded beside live model {loaded.live_version} "
                    f"({loaded.sessions_open} sessions open, worker pid {loaded.worker_pid})"
                    + ("; promoted: it is the live model now" if loaded.promoted else ""),
                    highlight=False,
                )
            else:
                done = stub.PromoteCandidate(
                    pb.PromoteCandidateRequest(expected_version=args.expected_version), metadata=metadata, timeout=30
                )
                console.print(
                    f"promoted {done.model_version} (was {done.previous_version}); {done.sessions_kept} sessions "
                    f"kept, worker pid {done.worker_pid}",
                    highlight=False,
                )
        except grpc.RpcError as err:
            hint = credentials.no_token_hint(err.code(), "the admin token") + credentials.transport_hint(err.code())
            console.print(f"[red]error:[/] {err.code().name}: {err.details()}{hint}", highlight=False)
            return 1
    return 0


def info(args: argparse.Namespace) -> int:
    card = DecisionModel(args.model, warmup_batches=()).card
    console.print_json(card.to_json())
    console.print(f"schema hash: {card.schema_hash()}")
    return 0
