"""`dualloop serve --workers 2`: what a restarted worker serves, and a worker that cannot start.

Real worker processes on one loopback port. A worker restarted after a crash serves the model the
server started with (or the candidate SIGHUP promoted), whatever happened to the files on disk
since; a worker that cannot start says so in one line and is retried after a growing delay while
the other worker keeps serving (it stopped the whole server after four deaths in a minute).
"""

from __future__ import annotations

import collections
import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from dualloop.controller.contract.client import DriveSession
from dualloop.controller.contract.errors import ConfigError
from dualloop.controller.serve.config import ServerConfig
from dualloop.controller.serve.file_copies import as_configured, snapshot_files
from dualloop.controller.serve.lifecycle import ServerLifecycle, new_event_loop
from dualloop.controller.serve.workers import MAX_RESTARTS, RESTART_BACKOFF_MAX_S, restart_delay
from dualloop.controller.training.driving_card import driving_card
from dualloop.executor.model_runner import DecisionModel
from dualloop.executor.onnx_export import export_mlp, random_mlp
from dualloop.models import BASE_MODEL_PATH
from dualloop.planner.onnx_planner import export_planner_mlp, random_planner_weights
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc
from tests.controller.serve.test_candidate import log_events
from tests.controller.serve.test_operations import lockstep_steps
from tests.controller.serve.test_workers import Workers, _scheduling, _serve_workers, _wait_for
from tests.paths import REPO_ROOT


def _events(workers: Workers, name: str) -> list[dict]:
    return log_events(workers.stderr, name)


def _versions_served(workers: Workers, connections: int = 12, field: str = "model_version") -> collections.Counter[str]:
    """The live model's version (or another ModelInfo field), asked on connections of their own (each to
    the worker the kernel picks)."""
    seen: collections.Counter[str] = collections.Counter()
    for _ in range(connections):
        with grpc.insecure_channel(workers.address, [("grpc.use_local_subchannel_pool", 1)]) as channel:
            stub = pb_grpc.ControllerServiceStub(channel)
            seen[getattr(stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).model, field)] += 1
    return seen


def _kill_and_wait_for_the_restart(workers: Workers, pid: int) -> None:
    subprocess.run(["kill", "-KILL", str(pid)], check=True)
    _wait_for(lambda: pid not in workers.children() and len(workers.children()) == 2, "no restart", 60)
    _wait_for(lambda: "(2 serving)" in _scheduling(workers), "the restarted worker never served", 120)


def _replace(path: Path, data: bytes) -> None:
    """As a deployment replaces a file: written beside it, renamed over it."""
    tmp = path.with_suffix(".new")
    tmp.write_bytes(data)
    tmp.replace(path)


@pytest.mark.slow
def test_a_restarted_worker_serves_the_model_the_server_started_with(test_model_path: Path, tmp_path: Path) -> None:
    """Found by QA: the model file replaced on disk, then one worker crash. Garbage in the file made the
    restarted worker fail three times and the parent stop the whole server; another valid model (same
    schema) made the port answer from two models, chosen by the kernel's connection hash."""
    live = tmp_path / "live.onnx"
    shutil.copyfile(test_model_path, live)
    started = DecisionModel(test_model_path, warmup_batches=()).card.version
    with _serve_workers(live, tmp_path) as workers:
        for replacement in (b"not a model any more", BASE_MODEL_PATH.read_bytes()):
            _replace(live, replacement)
            _kill_and_wait_for_the_restart(workers, workers.children()[0])
        assert _versions_served(workers) == {started: 12}
        starts = _events(workers, "server.start")
        assert [s["model_version"] for s in starts] == [started] * 4, starts  # two workers, two restarts
        assert not _events(workers, "server.worker_failed")
        assert "Traceback" not in workers.stderr.read_text()


def _planner(path: Path, name: str, seed: int) -> Path:
    export_planner_mlp(path, random_planner_weights((16,), seed=seed), name=name)
    return path


@pytest.mark.slow
def test_a_restarted_worker_plans_with_the_planner_the_server_started_with(
    test_model_path: Path, tmp_path: Path
) -> None:
    """As the model: the server planner's ONNX file replaced on disk (another planner, then garbage),
    then a worker crash. The file was not among the copies, so the restarted worker planned with
    another planner than the other worker, then could not start."""
    planner = _planner(tmp_path / "planner.onnx", "planner-a", seed=1)
    config = tmp_path / "server.toml"
    config.write_text(f'model = "{test_model_path}"\n[planner]\nsource = "onnx"\npath = "{planner}"\n')
    with _serve_workers(test_model_path, tmp_path, ["--config", str(config)]) as workers:
        (started,) = _versions_served(workers, field="planner")
        assert started.startswith("onnx:planner-a@"), started
        other = _planner(tmp_path / "other.onnx", "planner-b", seed=2).read_bytes()
        for replacement in (other, b"not a planner any more"):
            _replace(planner, replacement)
            _kill_and_wait_for_the_restart(workers, workers.children()[0])
        assert _versions_served(workers, field="planner") == {started: 12}
        assert not _events(workers, "server.worker_failed")
        assert "Traceback" not in workers.stderr.read_text()


@pytest.mark.slow
def test_a_worker_that_cannot_start_leaves_the_others_serving(test_model_path: Path, tmp_path: Path) -> None:
    """A slot whose worker cannot start (here: its record_dir became a file) is retried after a growing
    delay, each failure said in one line, while the other worker serves new sessions; once the cause
    is gone the slot serves again. It used to count as a crash loop and stop the whole server."""
    rec = tmp_path / "rec"
    with _serve_workers(test_model_path, tmp_path, ["--record-dir", str(rec)]) as workers:
        shutil.rmtree(rec)
        rec.write_text("")  # a worker starting now cannot record there

        def failed_often() -> bool:
            assert workers.proc.poll() is None, workers.stderr.read_text()[-3000:]  # the server stopped
            return len(_events(workers, "server.worker_exit")) > MAX_RESTARTS + 1  # the old limit, and one more

        subprocess.run(["kill", "-KILL", str(workers.children()[0])], check=True)
        _wait_for(failed_often, "the slot was not retried", 180)
        with grpc.insecure_channel(workers.address, [("grpc.use_local_subchannel_pool", 1)]) as channel:
            session = DriveSession(channel, "meanwhile", pb.CLOCK_MODE_LOCKSTEP)
            assert len(lockstep_steps(session, 1, 5)) == 5  # the other worker (the only one listening)
            session.close()
        failures = _events(workers, "server.worker_failed")
        assert failures and all(f["error"].startswith(f"record_dir (--record-dir) {rec}") for f in failures), failures
        delayed = _events(workers, "server.worker_restart_delayed")
        assert delayed and delayed[0]["delay_s"] == restart_delay(MAX_RESTARTS + 1), delayed
        assert "Traceback" not in workers.stderr.read_text()
        rec.unlink()
        rec.mkdir()
        _wait_for(lambda: "(2 serving)" in _scheduling(workers), "the slot never served again", 120)
        workers.proc.send_signal(signal.SIGTERM)
        assert workers.proc.wait(60) == 0


def _candidate(path: Path) -> Path:
    """The test model's schema, other (seeded random) weights: as tests/controller/serve/test_candidate.py's."""
    export_mlp(random_mlp(25, (32, 48), 4, 2, seed=3), driving_card("candidate", "test", 48), path)
    return path


@pytest.mark.slow
def test_a_worker_restarted_after_sighup_serves_the_promoted_candidate(test_model_path: Path, tmp_path: Path) -> None:
    """SIGHUP promoted the candidate in every worker; a worker restarted later took the configured model
    again, beside the promoted one. And a worker still starting when SIGHUP came was killed by it."""
    candidate = _candidate(tmp_path / "candidate.onnx")
    promoted = DecisionModel(candidate, warmup_batches=()).card.version
    with _serve_workers(test_model_path, tmp_path, ["--candidate", str(candidate)]) as workers:
        first, second = workers.children()
        subprocess.run(["kill", "-KILL", str(first)], check=True)
        _wait_for(lambda: len(set(workers.children()) - {first, second}) == 1, "no restart", 60)
        workers.proc.send_signal(signal.SIGHUP)  # the new worker is still loading its model
        _wait_for(lambda: "(2 serving)" in _scheduling(workers), "the restarted worker never served", 120)
        _wait_for(lambda: _versions_served(workers) == {promoted: 12}, "not every worker serves the candidate", 30)
        _kill_and_wait_for_the_restart(workers, second)  # a worker that promoted: its replacement too
        assert _versions_served(workers) == {promoted: 12}
        assert len(_events(workers, "server.worker_exit")) == 2  # the two kills: SIGHUP killed no worker
        # the loading worker promoted once loaded; the last one started with the candidate as its model
        assert len(_events(workers, "server.promoted")) == 2 and not _events(workers, "server.promote_refused")
        assert _events(workers, "server.workers_promote")[0]["model"] == str(candidate)


def test_the_restart_delay_grows_and_is_bounded() -> None:
    assert [restart_delay(n) for n in range(1, MAX_RESTARTS + 1)] == [0.0] * MAX_RESTARTS
    assert [restart_delay(MAX_RESTARTS + k) for k in (1, 2, 3)] == [1.0, 2.0, 4.0]
    assert restart_delay(100) == RESTART_BACKOFF_MAX_S


def test_the_snapshot_copies_each_file_once_read_only_and_names_what_it_cannot_read(
    test_model_path: Path, tmp_path: Path
) -> None:
    gate = REPO_ROOT / "models" / "base.gate.npz"
    config = ServerConfig(model=test_model_path, gates=[gate], candidate=test_model_path, candidate_gates=[gate])
    copies = snapshot_files(config, tmp_path / "files")
    assert list(copies) == [test_model_path, gate]  # the candidate's files are the live ones here: once
    for path, copy in copies.items():
        assert copy.read_bytes() == path.read_bytes() and copy.name == path.name
        assert copy.stat().st_mode & 0o777 == 0o400
    message = f"{copies[gate]}: fitted on another model; refit it --out {copies[gate].with_suffix('.x')}"
    assert as_configured(message, copies) == f"{gate}: fitted on another model; refit it --out {gate.with_suffix('.x')}"
    relative = {Path(test_model_path.name): copies[test_model_path]}  # given relative to the working folder
    assert as_configured(f"{copies[test_model_path]}: bad", relative) == f"{test_model_path.name}: bad"
    missing = ServerConfig(model=test_model_path, gates=[tmp_path / "nowhere.gate.npz"])
    with pytest.raises(ConfigError, match=r"^gate \(--gate\) .*nowhere.gate.npz: file not found$"):
        snapshot_files(missing, tmp_path / "other")
    with pytest.raises(ConfigError, match=r"^model \(--model\) .*: cannot read it \(Is a directory\)$"):
        snapshot_files(ServerConfig(model=tmp_path), tmp_path / "third")


def test_the_snapshot_copies_the_planner_model_and_a_worker_plans_from_the_copy(
    test_model_path: Path, tmp_path: Path
) -> None:
    planner = _planner(tmp_path / "planner.onnx", "planner-a", seed=1)
    config = ServerConfig(
        model=test_model_path, port=0, planner={"source": "onnx", "path": planner, "worker": "thread"}
    )  # type: ignore[arg-type]
    copies = snapshot_files(config, tmp_path / "files")
    assert list(copies) == [test_model_path, planner]
    assert copies[planner].read_bytes() == planner.read_bytes() and copies[planner].stat().st_mode & 0o777 == 0o400
    _replace(planner, b"not a planner any more")  # what a worker restarted now finds on disk
    server = ServerLifecycle(config, read_from=copies)
    loop = new_event_loop()
    try:
        loop.run_until_complete(server.start())
        assert server.runtime.planning is not None and server.runtime.planning.name.startswith("onnx:planner-a@")
        loop.run_until_complete(server.stop())
    finally:
        loop.close()


@pytest.mark.slow
def test_a_model_that_cannot_load_is_said_in_one_line_naming_the_configured_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"garbage")
    cmd = [sys.executable, "-m", "dualloop.controller.cli", "serve", "--model", str(bad), "--port", "0"]
    done = subprocess.run(
        [*cmd, "--workers", "2", "--log-format", "json"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr, done.stderr
    failed = [json.loads(line) for line in done.stderr.splitlines() if '"server.worker_failed"' in line]
    assert failed and failed[0]["error"].startswith(f"{bad}: onnxruntime cannot load it"), done.stderr
    assert "exited with code 2 while starting" in done.stdout + done.stderr
