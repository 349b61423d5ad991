"""`dualloop alpasim`'s port and plan horizon: out-of-range values refused in one line (exit 2)
before serving; a port in use is not shared."""

from __future__ import annotations

import subprocess
import sys

import pytest

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
