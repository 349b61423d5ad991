"""The one launcher of server processes: the announced address, what it watches, a refused start."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from dualloop.controller.server_process import ServerProcess, ServerStartError, serve_shipped
from dualloop.v2 import controller_pb2 as pb


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
