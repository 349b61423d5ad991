"""The one launcher of server processes: the announced address, what it watches, a refused start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dualloop.controller.server_process import ServerProcess, ServerStartError, serve_shipped, wait_until
from dualloop.v2 import controller_pb2 as pb
from tests.paths import REPO_ROOT


def test_serve_answers_on_the_announced_address_and_stops_cleanly(test_model_path: Path, tmp_path: Path):
    with ServerProcess(["--model", str(test_model_path), "--log-format", "json"], tmp_path) as server:
        assert server.address.startswith("127.0.0.1:") and server.port > 0
        assert server.health() == "SERVING"
        info = server.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=30).model
        assert len(info.features) > 0
        assert server.stats().sessions_open == 0
        assert server.sample().threads > 1
        assert server.stop(timeout_s=30, sig=signal.SIGTERM) == 0 and server.stopped_in_time
    assert "stopped after" in server.stdout_text()  # stdout read to the end, kept in its file
    assert server.events("server.stop"), server.stderr_text()[-2000:]


def test_the_shipped_configuration_is_written_as_a_file(tmp_path: Path):
    with serve_shipped(tmp_path, {"executor": {"max_sessions": 3}}) as server:
        assert (tmp_path / "serve-config.yaml").is_file()
        assert server.config is not None and server.config["executor"] == {"max_sessions": 3}
        assert server.health() == "SERVING"
    assert server.proc.returncode == 0


def test_a_server_that_cannot_start_raises_with_its_error(tmp_path: Path):
    """An early exit is said as one (not "did not start within 120 s"), with the child's own line."""
    missing = tmp_path / "missing.onnx"
    with pytest.raises(ServerStartError) as failed:
        ServerProcess(["--model", str(missing)], tmp_path)
    said = str(failed.value)
    assert said.startswith("the `dualloop serve` server exited with code 2: "), said
    assert f"error: {missing}: model file not found" in said and "within" not in said and "\n" not in said


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_a_server_whose_command_was_killed_stops_by_itself(test_model_path: Path, tmp_path: Path, workers: int):
    """SIGKILL to the command that started a server (a CI runner killing a job) cannot stop that
    server: it watches for its parent and drains on its own (found by QA: it served on, orphaned)."""
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from dualloop.controller.server_process import ServerProcess
        server = ServerProcess(["--model", {str(test_model_path)!r}, "--workers", "{workers}"], Path({str(tmp_path)!r}))
        print(server.pid, flush=True)
        time.sleep(600)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert os.path.exists(f"/proc/{child}")
        parent.kill()
        parent.wait()
        # an upper bound for a hang, not a timing: the watch looks every 0.5 s, the drain takes 5 s at most
        assert wait_until(lambda: not _alive(child), 60), f"the server {child} outlived its command"
    finally:
        if parent.poll() is None:
            parent.kill()
    assert "parent_gone" in (tmp_path / "serve-stderr.log").read_text()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"  # a zombie has exited (its reaper is init)
    except FileNotFoundError:
        return False
