"""A single-process server (`dualloop serve` without --workers) replaces a hung planner worker with one
that plans with the planner the server started with, whatever has happened to its ONNX file on disk
since (another planner, then garbage): as `serve --workers` does for a restarted worker
(test_workers_restart.py). And a planner that cannot start ends a start in one line naming its file.

A real server on loopback, its planner in real worker processes. The hang is a SIGSTOP: the scheduler
tells a stopped worker (not runnable, not waiting for a CPU) from one short of CPU, kills it at its
batch's deadline and starts another, which loads the planner model again.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from dualloop.controller.contract.client import DriveSession, realtime_channel
from dualloop.controller.contract.errors import ConfigError
from dualloop.controller.serve.config import PlannerConfig, ServerConfig
from dualloop.controller.serve.file_copies import snapshot_files
from dualloop.controller.serve.lifecycle import ServerLifecycle, ServerThread
from dualloop.v2 import controller_pb2 as pb
from tests.controller.serve.inputs import sensor
from tests.controller.serve.test_workers_restart import _planner, _replace
from tests.paths import REPO_ROOT

TIMEOUT_S = 120.0  # a bound for what a loaded machine may take, never a measurement


def _scheduler_stats(srv: ServerThread) -> dict:
    """The planner scheduler's counters, read on the server's loop (the scheduler's one thread)."""
    planning = srv.server.runtime.planning
    assert planning is not None
    return srv.call(planning.scheduler.stats)


def _produce(session: DriveSession, stop: threading.Event) -> None:
    seq = 0
    while not stop.is_set():
        seq += 1
        session.send(seq, time.monotonic_ns(), sensor(seq))
        time.sleep(0.005)


def _read_until(srv: ServerThread, session: DriveSession, count: str, at_least: int, what: str) -> dict[str, str]:
    """Read snapshots until the scheduler's `count` is `at_least` (looked at every 20 snapshots); {plan
    id: its source} of the server planner's plans they carried."""
    plans: dict[str, str] = {}
    give_up = time.monotonic() + TIMEOUT_S
    for k in itertools.count(1):
        snap = session.recv()
        if snap.plan_id and snap.plan.source:
            plans[snap.plan_id] = snap.plan.source
        if k % 20 == 0 and _scheduler_stats(srv)[count] >= at_least:
            break
        assert time.monotonic() < give_up, f"{what}: {_scheduler_stats(srv)}"
    return plans


def test_a_hung_planner_worker_is_replaced_by_the_planner_the_server_started_with(
    test_model_path: Path, tmp_path: Path
) -> None:
    """Found in review: the single-process server's replacement worker loaded planner.path as it was
    on disk then: another planner from then on (a session planned by a planner the server never said
    it serves), or, the file damaged, no planner at all (every replacement failed to start)."""
    planner = _planner(tmp_path / "planner.onnx", "planner-a", seed=1)
    other = _planner(tmp_path / "other.onnx", "planner-b", seed=2).read_bytes()
    config = ServerConfig(model=test_model_path, port=0, planner={"source": "onnx", "path": planner})  # type: ignore[arg-type]
    with ServerThread(config) as srv, realtime_channel(srv.address) as channel:
        assert srv.server.runtime.planning is not None
        started = srv.server.runtime.planning.name
        assert started.startswith("onnx:planner-a@"), started
        session = DriveSession(channel, "hung-planner", pb.CLOCK_MODE_REALTIME)
        stop = threading.Event()
        producer = threading.Thread(target=_produce, args=(session, stop), daemon=True)
        producer.start()
        try:
            seen = _read_until(srv, session, "plans", 2, "no plan before the hang")
            assert set(seen.values()) == {started}, seen
            for replacement in (other, b"not a planner any more"):
                _replace(planner, replacement)  # what the replacement would find on disk
                before = _scheduler_stats(srv)
                os.kill(before["worker_pid"], signal.SIGSTOP)  # hung: killed at its batch's deadline
                seen.update(_read_until(srv, session, "restarts", before["restarts"] + 1, "not replaced"))
                # the replacement's plans: new plan ids (the stopped worker answers nothing more)
                replaced = _scheduler_stats(srv)
                plans = _read_until(srv, session, "plans", replaced["plans"] + 3, "the replacement planned nothing")
                new = {plan_id: source for plan_id, source in plans.items() if plan_id not in seen}
                assert new and set(new.values()) == {started}, new
                seen.update(plans)
                after = _scheduler_stats(srv)
                assert after["source"] == started and after["worker_pid"] != before["worker_pid"], after
        finally:
            stop.set()
            producer.join(10)
            session.cancel()
        stats = _scheduler_stats(srv)
    assert stats["restarts"] >= 2 and stats["timeouts"] >= 2, stats  # the two hangs, each a killed batch
    assert stats["startup_failures"] == 0 and stats["errors"] == 0, stats


def test_one_process_copies_its_planner_model_alone_and_removes_the_copy_when_it_stops(
    test_model_path: Path, tmp_path: Path
) -> None:
    planner = _planner(tmp_path / "planner.onnx", "planner-a", seed=1)
    gate = REPO_ROOT / "models" / "base.gate.npz"
    config = ServerConfig(
        model=test_model_path, gates=[gate], port=0, planner={"source": "onnx", "path": planner, "worker": "thread"}
    )  # type: ignore[arg-type]
    assert list(snapshot_files(config, tmp_path / "files", workers=False)) == [planner]  # the model is loaded once
    assert (
        snapshot_files(config.model_copy(update={"planner": PlannerConfig()}), tmp_path / "none", workers=False) == {}
    )
    with ServerThread(config.model_copy(update={"gates": []})) as srv:  # the shipped gate: not this model's
        planning = srv.server.runtime.planning
        assert planning is not None and planning.cfg.path is not None
        copy = planning.cfg.path  # what a replaced planner worker loads
        assert copy != planner and copy.read_bytes() == planner.read_bytes() and copy.stat().st_mode & 0o777 == 0o400
    assert not copy.exists() and not copy.parent.parent.exists()


def test_no_writable_temporary_folder_for_the_planner_copy_is_said_with_the_way_out(
    monkeypatch: pytest.MonkeyPatch, test_model_path: Path, tmp_path: Path
) -> None:
    planner = _planner(tmp_path / "planner.onnx", "planner-a", seed=1)
    config = ServerConfig(model=test_model_path, port=0, planner={"source": "onnx", "path": planner})  # type: ignore[arg-type]
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "read-only"))  # what gettempdir found: nothing
    with pytest.raises(ConfigError, match=r"^the server needs a writable temporary folder for a copy of its planner"):
        ServerLifecycle(config)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_a_planner_that_cannot_start_ends_the_start_in_one_line_naming_its_file(
    test_model_path: Path, tmp_path: Path, workers: int
) -> None:
    """Found in review: the planner worker that could not build its source (a planner model onnxruntime
    cannot load) made PlanScheduler.start raise RuntimeError, which neither `serve` nor a worker of
    `serve --workers` caught: a traceback each, and the workers' named the copy in the parent's
    temporary folder instead of the configured file."""
    bad = tmp_path / "planner.onnx"
    bad.write_bytes(b"not a planner")
    config = tmp_path / "server.toml"
    config.write_text(f'model = "{test_model_path}"\n[planner]\nsource = "onnx"\npath = "{bad}"\n')
    cmd = [sys.executable, "-m", "dualloop.controller.cli", "serve", "--config", str(config), "--port", "0"]
    cmd += ["--workers", str(workers), "--log-format", "json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    output = done.stdout + done.stderr
    assert "Traceback" not in output, output
    assert output.count("planner.onnx") == output.count(str(bad)), output  # never a copy's path
    said = f"{bad}: onnxruntime cannot load it"
    if workers == 1:  # print_error's one line, as for a model file
        assert done.returncode == 2, done
        (line,) = [line for line in done.stderr.splitlines() if said in line]
        assert line.startswith("error: planner"), line
        return
    assert done.returncode == 1, done
    failed = [line for line in done.stderr.splitlines() if '"server.worker_failed"' in line]
    assert failed and all(said in line for line in failed), done.stderr
    assert "exited with code 2 while starting" in output
