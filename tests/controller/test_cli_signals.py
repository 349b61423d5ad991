"""SIGTERM and Ctrl-C to a command that runs a server child: the child stopped, its folder removed,
one line and 128 + the signal, as a shell reports it (timeout and CI cancels send SIGTERM)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dualloop.controller.server_process import child_pids, cmdline, wait_until
from dualloop.models import BASE_MODEL_PATH
from tests.paths import REPO_ROOT


def _serving_child(parent: int) -> int | None:
    kids = [p for p in child_pids(parent) if " serve " in cmdline(p)]
    return kids[0] if kids else None


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "code", "said"), [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "SIGINT (Ctrl-C)")]
)
def test_a_signal_to_demo_traffic_stops_its_server_and_removes_its_folder(
    tmp_path: Path, sig: signal.Signals, code: int, said: str
) -> None:
    # TMPDIR: the server child's folder (tempfile's) is made here, where the test can see it go
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    cmd = [sys.executable, "-m", "dualloop", "demo-traffic", "--seeds", "1", "--duration", "60", "--no-gate"]
    proc = subprocess.Popen(cmd, env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # the server up and the run under way: its stdout announced the address, sessions opened
        assert wait_until(lambda: _serving_child(proc.pid) is not None, 120), proc.stderr
        child = _serving_child(proc.pid)
        assert child is not None
        folders = list(tmp_path.glob("dualloop-server-*"))
        assert len(folders) == 1
        log = folders[0] / "serve-stderr.log"
        assert wait_until(lambda: log.is_file() and "session.open" in log.read_text(), 120)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=90)  # an upper bound for a hang, not a timing
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code, err
    assert err.strip() == f"error: dualloop demo-traffic: stopped by {said}", err  # one line, no traceback
    assert not os.path.exists(f"/proc/{child}"), "the server child outlived its command"
    assert not list(tmp_path.glob("dualloop-server-*")), "the server child's folder was left behind"


@pytest.mark.slow
def test_sigterm_to_highway_stops_its_server_and_removes_its_config_folder(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    cmd = [sys.executable, "-m", "dualloop", "highway", "--envs", "highway", "--seeds", "3", "--no-gate"]
    cmd += ["--model", str(BASE_MODEL_PATH)]
    proc = subprocess.Popen(cmd, env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: _serving_child(proc.pid) is not None, 120)
        child = _serving_child(proc.pid)
        assert child is not None
        assert wait_until(
            lambda: "127.0.0.1:" in "".join(p.read_text() for p in tmp_path.glob("*/serve-stdout.log")), 120
        )
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143 and err.strip() == "error: dualloop highway: stopped by SIGTERM", err
    assert not os.path.exists(f"/proc/{child}")
    assert not list(tmp_path.glob("*/server.toml")), "the server's config folder was left behind"


def test_a_forked_child_of_a_command_still_dies_of_sigterm() -> None:
    """A fork-context pool's worker inherits the handler: terminate() must still end it (not raise in
    it), as before the handler; the process that installed it gets the exception."""
    script = textwrap.dedent(
        """
        import multiprocessing, os, signal, time
        from dualloop.controller.cli import _on_sigterm
        from dualloop.controller.interrupts import Terminated
        signal.signal(signal.SIGTERM, _on_sigterm(os.getpid()))
        child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
        child.start()
        time.sleep(0.5)
        child.terminate()
        child.join(30)
        print("child", child.exitcode)
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
        except Terminated:
            print("parent Terminated")
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert out.stdout.split("\n")[:2] == [f"child {-signal.SIGTERM}", "parent Terminated"], out.stdout + out.stderr


def _agents_clients(parent: int) -> list[int]:
    return [p for p in child_pids(parent) if "agents_clients" in cmdline(p)]


@pytest.mark.slow
def test_sigterm_to_bench_agents_stops_its_clients_at_once(tmp_path: Path) -> None:
    """Found by QA: the clients streamed on for their whole run, and stopping the server waited for
    them (about a minute); now the run's clients are killed on the way out."""
    cmd = [sys.executable, "-m", "dualloop", "bench", "agents", "--agents", "4", "--streams", "1", "--duration", "120"]
    cmd += ["--realtime-priority", "0", "--no-pin", "--out", str(tmp_path)]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: bool(_agents_clients(proc.pid)), 120), proc.stderr
        clients = _agents_clients(proc.pid)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=25)  # an upper bound: the clients ran 120 s, the server's stop 30 s
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143 and err.strip().endswith("error: dualloop bench: stopped by SIGTERM"), err
    assert not any(os.path.exists(f"/proc/{c}") for c in clients), "a clients process outlived the bench"
