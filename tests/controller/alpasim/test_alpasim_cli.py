"""`dualloop alpasim`'s port, host, gates and plan horizon: out-of-range or contradictory values
refused in one line (exit 2) before serving; a port or unix socket in use is not shared."""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from carla_driver_interface.protocol import DriveSessionRequest, EgodriverServiceStub, channel_options

from dualloop.controller.alpasim.driver import MAX_HORIZON_S, DualloopDriver, build_server
from dualloop.controller.server_process import ServerProcess
from dualloop.executor.core import Executor
from tests.paths import REPO_ROOT


def alpasim(*args: str) -> subprocess.CompletedProcess[str]:
    # the timeout: an upper bound, for the old code, which served on (a wrapped port, a huge horizon)
    return subprocess.run(
        [sys.executable, "-m", "dualloop", "alpasim", *args], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT
    )


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--port", "70000"), "--port 70000: must be 0..65535"),  # served on 4464
        (("--port", "-1"), "--port -1: must be 0..65535"),  # served on 65535
        (("--port", "0", "--horizon", "inf"), "--horizon inf"),  # every drive failed UNKNOWN
        (("--port", "0", "--horizon", "100000"), "--horizon 100000.0"),  # drives past the runtime's deadline
        (("--port", "0", "--horizon", f"{MAX_HORIZON_S + 0.5}"), f"at most {MAX_HORIZON_S:g} seconds"),
        (("--port", "0", "--horizon", "0"), "--horizon 0.0"),
        # served without the gate the user named
        (("--port", "0", "--no-gate", "--gate", "g.npz"), "--no-gate and --gate g.npz: give the gate files or"),
    ],
)
def test_an_out_of_range_port_or_horizon_is_refused_in_one_line(args: tuple[str, ...], named: str) -> None:
    out = alpasim(*args)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and named in lines[0], out.stderr + out.stdout
    assert "serving" not in out.stdout


def test_the_driver_refuses_a_horizon_past_the_bound(base_model) -> None:
    executor = Executor(base_model, None, None)
    DualloopDriver(executor, horizon_s=MAX_HORIZON_S)
    with pytest.raises(ValueError, match="at most"):
        DualloopDriver(executor, horizon_s=MAX_HORIZON_S * 2)


def test_a_second_driver_cannot_bind_a_port_in_use(base_model) -> None:
    """No SO_REUSEPORT: the kernel would split the runtime's connections between the two servers."""
    driver = DualloopDriver(Executor(base_model, None, None))
    first, port = build_server(driver, "127.0.0.1", 0)
    first.start()
    try:
        with pytest.raises(OSError, match=f"--port {port}: could not bind"):
            second, _ = build_server(driver, "127.0.0.1", port)
            second.stop(None)
    finally:
        first.stop(grace=None).wait()


@pytest.mark.slow
def test_the_command_on_a_port_in_use_says_so_in_one_line() -> None:
    server = ServerProcess(command="alpasim")
    try:
        out = alpasim("--port", str(server.port), "--no-gate")
        assert out.returncode == 2 and "serving" not in out.stdout, out.stdout + out.stderr
        assert out.stderr.strip().splitlines() == [
            f"error: --port {server.port}: could not bind the egodriver service to 127.0.0.1:{server.port} "
            "(in use by another server)"
        ]
    finally:
        server.stop()


@pytest.fixture()
def socket_dir() -> Iterator[Path]:
    # a short folder: a unix socket's path is at most 107 bytes, which pytest's tmp_path can exceed
    with tempfile.TemporaryDirectory(prefix="dualloop-") as folder:
        yield Path(folder)


def _serves(host: str) -> bool:
    with grpc.insecure_channel(host, options=channel_options()) as channel:
        EgodriverServiceStub(channel).start_session(DriveSessionRequest(session_uuid=str(uuid.uuid4())), timeout=10)
    return True


@pytest.mark.parametrize("abstract", [False, True])
def test_a_second_driver_cannot_take_a_unix_socket_in_use(base_model, socket_dir: Path, abstract: bool) -> None:
    """gRPC unlinks a socket file before binding its path: the second driver took every new
    connection while the first served on, unreachable. Refused now, in one line naming --host."""
    host = f"unix-abstract:dualloop-{uuid.uuid4().hex}" if abstract else f"unix:{socket_dir / 'd.sock'}"
    driver = DualloopDriver(Executor(base_model, None, None))
    first, _ = build_server(driver, host)
    first.start()
    try:
        with pytest.raises(OSError, match=f"^--host {host}: .*another server listens on it"):
            second, _ = build_server(driver, host)
            second.stop(None)
        assert _serves(host)  # the first still has the socket
    finally:
        first.stop(grace=None).wait()


def test_a_stale_unix_socket_file_is_replaced(base_model, socket_dir: Path) -> None:
    """A socket file nobody listens on (its server died without removing it) is not in use."""
    path = socket_dir / "d.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(path))
    server, _ = build_server(DualloopDriver(Executor(base_model, None, None)), f"unix:{path}")
    server.start()
    try:
        assert _serves(f"unix:{path}")
    finally:
        server.stop(grace=None).wait()


def test_a_unix_socket_that_cannot_be_made_names_host_and_why(base_model, socket_dir: Path) -> None:
    driver = DualloopDriver(Executor(base_model, None, None))
    missing = socket_dir / "no-such-folder" / "d.sock"
    with pytest.raises(OSError, match=rf"^--host unix:{missing}: .*the folder {missing.parent} does not exist"):
        build_server(driver, f"unix:{missing}")
    regular = socket_dir / "file"
    regular.write_text("")
    with pytest.raises(OSError, match=rf"^--host unix:{regular}: .*exists and is not a socket"):
        build_server(driver, f"unix:{regular}")
    assert regular.read_text() == ""


@pytest.mark.slow
def test_the_command_on_a_unix_socket_in_use_says_so_in_one_line(base_model, socket_dir: Path) -> None:
    host = f"unix:{socket_dir / 'd.sock'}"
    first, _ = build_server(DualloopDriver(Executor(base_model, None, None)), host)
    first.start()
    try:
        out = alpasim("--host", host, "--no-gate")
        assert out.returncode == 2 and "serving" not in out.stdout, out.stdout + out.stderr
        assert out.stderr.strip().splitlines() == [
            f"error: --host {host}: could not bind the egodriver service (another server listens on it; "
            "stop it or choose another path)"
        ]
        assert _serves(host)
    finally:
        first.stop(grace=None).wait()
