"""Configuration errors name the file and field; the CLI serves on loopback and stops cleanly."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from dualloop.controller.serve.config import ConfigError, ServerConfig, gates_summary, load_server_config
from dualloop.controller.serve.lifecycle import ServerThread
from dualloop.controller.serve.realtime_threads import set_realtime_priority
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc


def test_defaults_bind_loopback(test_model_path):
    config = load_server_config(model=test_model_path)
    assert config.host == "127.0.0.1" and config.executor.tick_period_ms == 5.0


def test_non_loopback_needs_explicit_permission(test_model_path):
    with pytest.raises(ConfigError, match="not a loopback address"):
        load_server_config(model=test_model_path, host="192.0.2.10")
    # plaintext beyond loopback needs the loud flag (TLS needs none: tests/controller/serve/test_security.py)
    config = load_server_config(model=test_model_path, host="192.0.2.10", allow_insecure_non_loopback=True)
    assert config.host == "192.0.2.10"
    assert load_server_config(model=test_model_path, host="::1").host == "::1"


def test_toml_error_names_file_and_field(tmp_path, test_model_path):
    path = tmp_path / "server.toml"
    path.write_text(f'model = "{test_model_path}"\n[executor]\nmin_margin = 2.0\ntick_period_ms = 5\n')
    with pytest.raises(ConfigError) as err:
        load_server_config(path)
    assert str(path) in str(err.value) and "executor.min_margin" in str(err.value)
    path.write_text(f'model = "{test_model_path}"\n[executor]\ntick_perod_ms = 5\n')
    with pytest.raises(ConfigError, match="executor.tick_perod_ms: Extra inputs are not permitted"):
        load_server_config(path)


def test_yaml_config_and_overrides(tmp_path, test_model_path):
    path = tmp_path / "server.yaml"
    path.write_text(f"model: {test_model_path}\nport: 6000\nexecutor:\n  min_margin: 0.1\n")
    config = load_server_config(path, port=6001)
    assert config.port == 6001 and config.executor.min_margin == 0.1
    path.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="cannot parse"):
        load_server_config(path)


def test_settings_that_would_be_ignored_or_doubled_are_refused(tmp_path, test_model_path):
    """Candidate gates without a candidate, a gate file named twice, a recording folder that is a
    file: each a mistake the server would have served through silently."""
    gate = tmp_path / "a.gate.npz"
    with pytest.raises(ConfigError, match=r"candidate_gates \(--candidate-gate\) are given without candidate") as err:
        load_server_config(model=test_model_path, candidate_gates=[gate])
    # a rule across settings reads as its own words (was "(top level): Value error, candidate_gates ...")
    assert str(err.value).splitlines()[1].startswith("  candidate_gates (--candidate-gate)")
    with pytest.raises(ConfigError, match="gates names .*a.gate.npz more than once"):
        load_server_config(model=test_model_path, gates=[gate, gate])
    afile = tmp_path / "notes.txt"
    afile.write_text("")
    with pytest.raises(ConfigError, match=r"record_dir \(--record-dir\) .*notes.txt is a file, not a folder"):
        load_server_config(model=test_model_path, record_dir=afile)
    assert load_server_config(model=test_model_path, record_dir=tmp_path / "new").record_dir == tmp_path / "new"


def test_relative_paths_in_a_file_are_its_folder_s(tmp_path, test_model_path, monkeypatch):
    """A file names its neighbours wherever the server starts (a service's working directory is often
    /): relative paths in it are taken from its folder, nested tables too; a flag's, from the working
    directory."""
    folder = tmp_path / "etc"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(test_model_path.read_bytes())
    path = folder / "server.toml"
    path.write_text('model = "model.onnx"\ngates = ["a.gate.npz"]\nrecord_dir = "logs"\n[auth]\ntokens_file = "t"\n')
    monkeypatch.chdir(tmp_path)
    config = load_server_config(path)
    assert config.model == folder / "model.onnx" and config.gates == [folder / "a.gate.npz"]
    assert config.record_dir == folder / "logs" and config.auth.tokens_file == folder / "t"
    assert load_server_config(path, record_dir=Path("here")).record_dir == Path("here")


def test_cli_refuses_bad_host_with_message(test_model_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dualloop.controller.cli",
            "serve",
            "--model",
            str(test_model_path),
            "--host",
            "203.0.113.5",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "not a loopback address" in proc.stdout + proc.stderr
    assert "--insecure-plaintext-on-network" in proc.stdout + proc.stderr  # the flag that would allow it


def test_cli_serve_answers_and_stops_on_sigterm(test_model_path):
    env = dict(os.environ, COLUMNS="200")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dualloop.controller.cli", "serve", "--model", str(test_model_path), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        line = proc.stdout.readline()
        match = re.search(r"on 127\.0\.0\.1:(\d+)", line)
        assert match, line
        assert "no OOD gate [WARNING: --gate adds one], plaintext" in line  # served ungated, and says so
        with grpc.insecure_channel(f"127.0.0.1:{match.group(1)}") as channel:
            info = pb_grpc.ControllerServiceStub(channel).GetModelInfo(pb.GetModelInfoRequest(), timeout=10).model
        assert len(info.features) == 19
        # a second server on the same port: one line, exit 2 (was a RuntimeError traceback from grpc)
        cmd = [sys.executable, "-m", "dualloop.controller.cli", "serve", "--model", str(test_model_path)]
        second = subprocess.run([*cmd, "--port", match.group(1)], capture_output=True, text=True, timeout=60)
        assert second.returncode == 2 and "Traceback" not in second.stderr
        assert f"error: cannot bind 127.0.0.1:{match.group(1)}: is the port in use" in second.stderr
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=20)
        assert proc.returncode == 0
        assert "stopped after" in rest
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_start_line_names_the_gates(tmp_path, test_model_path):
    from_two = load_server_config(model=test_model_path, gates=[tmp_path / "a.gate.npz", tmp_path / "b.gate.npz"])
    assert gates_summary(from_two) == "gates a.gate.npz, b.gate.npz"
    assert (
        gates_summary(load_server_config(model=test_model_path, gates=[tmp_path / "a.gate.npz"])) == "gate a.gate.npz"
    )


def test_settings_that_do_nothing_without_their_counterpart_are_refused(tmp_path, test_model_path):
    """Found by QA: both were accepted silently (nothing_ignored reported similar cases)."""
    with pytest.raises(ConfigError, match=r"record_rotate_mb and record_rotate_s .* need record_dir"):
        load_server_config(model=test_model_path, record_rotate_s=60.0)
    with pytest.raises(ConfigError, match=r"metrics_host \(--metrics-host\) is given without metrics_port"):
        load_server_config(model=test_model_path, metrics_host="::1")
    assert load_server_config(model=test_model_path, metrics_host="::1", metrics_port=0).metrics_host == "::1"
    # a whole configuration written out and read back (a worker's) names the default host: not refused
    whole = load_server_config(model=test_model_path).model_dump(mode="json")
    assert load_server_config(**whole).metrics_port is None


def test_realtime_priority_0_is_normal_scheduling(tmp_path, test_model_path, monkeypatch):
    """A file's priority undone by a variable or a flag (found by QA: 0 was refused, so nothing could)."""
    config = tmp_path / "server.toml"
    config.write_text(f'model = "{test_model_path}"\nrealtime_priority = 50\n')
    assert load_server_config(config).realtime_priority == 50
    monkeypatch.setenv("DUALLOOP_REALTIME_PRIORITY", "0")
    assert load_server_config(config).realtime_priority == 0
    assert set_realtime_priority(0) == "normal scheduling"


def test_an_unwritable_record_dir_is_refused_at_start(tmp_path, test_model_path):
    """Found by QA: the server started and said it was recording; the first error came at the first
    session (every record dropped) or at shutdown. A read-only mount is refused the same way."""
    afile = tmp_path / "notes.txt"
    afile.write_text("")
    config = ServerConfig(model=test_model_path, port=0, record_dir=afile / "rec")
    with pytest.raises(ConfigError, match=r"record_dir \(--record-dir\) .*notes.txt/rec: cannot write there"):
        with ServerThread(config):
            pass
