"""`dualloop replay A B ...` (a fleet) as a user runs it: logs of one name each keep their replay,
SIGTERM and Ctrl-C stop the pool at once, and a recording's sessions and the one-log flags
(--session, --foxglove, --allow-truncated) do in a fleet what they do for one log."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mcap.reader import make_reader

from dualloop.controller.cli import main
from dualloop.controller.logs.logfile import read_log
from dualloop.controller.logs.plot import plot_topic
from dualloop.controller.logs.synthetic import REAL_DRIVE, slice_log
from dualloop.controller.replay.lockstep import session_file_name
from dualloop.models import TEST_MODEL_PATH
from tests.controller.replay.recordings import write_recording
from tests.paths import REPO_ROOT

MODEL = ["--model", str(TEST_MODEL_PATH), "--no-gate"]


def _replay(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["replay", *argv, *MODEL])
    printed = capsys.readouterr()
    return code, printed.out + printed.err


def _replayed_from(path: Path) -> str:
    return read_log(path).header.source_details["replay_of"]


def test_logs_of_one_name_each_keep_their_replay(tmp_path, capsys):
    """QA: day1/drive.mcap and day2/drive.mcap both went to OUT/drive.replayed.mcap, one lost, exit 0."""
    one = slice_log(tmp_path / "day1" / "drive.mcap", 0, 300, "a")
    two = slice_log(tmp_path / "day2" / "drive.mcap", 400, 300, "b")
    other = slice_log(tmp_path / "day2" / "other.mcap", 800, 300, "c")
    out = tmp_path / "coll"
    code, printed = _replay(capsys, str(one), str(two), str(other), "--out", str(out), "--workers", "2")
    assert code == 0, printed
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.mcap"))
    # a log of a name no other has keeps its name; the others go in the folder that tells them apart
    assert written == ["day1/drive.replayed.mcap", "day2/drive.replayed.mcap", "other.replayed.mcap"]
    assert _replayed_from(out / "day1" / "drive.replayed.mcap") == str(one)
    assert _replayed_from(out / "day2" / "drive.replayed.mcap") == str(two)
    assert _replayed_from(out / "other.replayed.mcap") == str(other)


def test_a_log_given_twice_is_refused_naming_it(tmp_path, capsys):
    log = slice_log(tmp_path / "drive.mcap", 0, 300, "a")
    again = tmp_path / "sub" / ".." / "drive.mcap"
    code, printed = _replay(capsys, str(log), str(again), "--out", str(tmp_path / "out"), "--workers", "2")
    assert code == 2 and f"{again}: the same log as {log}: give it once" in printed
    assert not (tmp_path / "out").exists()


def test_folders_of_one_name_are_told_apart_by_the_shortest_end_of_their_paths(tmp_path):
    from dualloop.controller.replay.fleet import output_paths

    (tmp_path / "x").mkdir()
    (tmp_path / "latest.mcap").symlink_to(tmp_path / "x" / "e.mcap")  # named as given, not as its target
    logs = [tmp_path / "a" / "x" / "d.mcap", tmp_path / "b" / "x" / "d.mcap", tmp_path / "latest.mcap"]
    assert output_paths(logs, tmp_path / "o") == [
        tmp_path / "o" / "a" / "x" / "d.replayed.mcap",
        tmp_path / "o" / "b" / "x" / "d.replayed.mcap",
        tmp_path / "o" / "latest.replayed.mcap",
    ]


def _copies(folder: Path, n: int) -> list[str]:
    folder.mkdir(parents=True)
    logs = []
    for i in range(n):
        shutil.copy(REAL_DRIVE, folder / f"d{i:03d}.mcap")
        logs.append(str(folder / f"d{i:03d}.mcap"))
    return logs


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_a_fleet_at_once_leaving_only_finished_logs(tmp_path, sig):
    """QA: SIGTERM or Ctrl-C ended the command only once every queued log was replayed (31 s, 168
    logs). The signal comes once the first new log is written; the rest are not replayed."""
    n = 120
    logs = _copies(tmp_path / "in", n)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "dualloop.controller.cli", "replay", *logs, *MODEL, "--workers", "2"]
    proc = subprocess.Popen(
        [*cmd, "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
        env=dict(os.environ, COLUMNS="400"),
        start_new_session=True,  # a group of its own: Ctrl-C reaches the whole group, workers included
    )
    try:
        deadline = time.monotonic() + 120
        while not list(out.glob("*.replayed.mcap")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)  # as a terminal's Ctrl-C
        else:
            proc.send_signal(sig)  # as `kill` or a CI cancel: the parent only
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + sig, err
    finished = sorted(out.iterdir())
    assert len(finished) < n  # not every queued log
    said = re.search(r"stopped by (\S+).* after (\d+) of (\d+) logs", err)
    assert said and said.group(1) == ("SIGTERM" if sig == signal.SIGTERM else "SIGINT") and said.group(3) == str(n)
    assert len(finished) == int(said.group(2))  # the logs it says finished, and no partial file
    for path in finished:
        assert path.name.endswith(".replayed.mcap") and not read_log(path).truncated


def _recording(path: Path, sessions: list[str], count: int = 300) -> Path:
    """A log of several sessions, their records interleaved, as a server's recording holds them."""
    return write_recording(path, sessions, count, stagger=200)


def test_a_recording_in_a_fleet_replays_each_session_as_one_log_replay_does(tmp_path, capsys):
    rec = _recording(tmp_path / "rec.mcap", ["car-1", "car-3"])
    other = slice_log(tmp_path / "other.mcap", 900, 300, "car-3")
    code, printed = _replay(capsys, str(rec), "--out", str(tmp_path / "alone"))
    assert code == 0, printed
    code, printed = _replay(capsys, str(rec), str(other), "--out", str(tmp_path / "fleet"), "--workers", "2")
    assert code == 0, printed
    for index, sid in enumerate(["car-1", "car-3"]):
        name = session_file_name("rec", index, sid)
        assert (tmp_path / "fleet" / name).read_bytes() == (tmp_path / "alone" / name).read_bytes()
    assert _replayed_from(tmp_path / "fleet" / "other.replayed.mcap") == str(other)
    assert "replayed 3 logs" in printed and "car-3" in printed  # a row per session

    # --session: that session of each log (was "rec.mcap: 2 sessions (...); name one")
    code, printed = _replay(capsys, str(rec), str(other), "--session", "car-3", "--out", str(tmp_path / "s"))
    assert code == 0, printed
    assert read_log(tmp_path / "s" / "rec.replayed.mcap").session_id == "car-3"
    code, printed = _replay(capsys, str(rec), str(other), "--session", "car-1", "--out", str(tmp_path / "s1"))
    assert code == 1 and f"{other}: no session 'car-1' (sessions: 'car-3')" in printed
    # several: numbered by their place in the recording, as one-log replay numbers them
    code, printed = _replay(capsys, str(rec), "--session", "car-3", "--session", "car-1", "--out", str(tmp_path / "a2"))
    assert code == 0, printed
    code, printed = _replay(
        capsys, str(rec), str(other), "--session", "car-3", "--session", "car-1", "--out", str(tmp_path / "f2")
    )
    assert code == 1 and f"{other}: no session 'car-1' (sessions: 'car-3')" in printed
    for index, sid in enumerate(["car-1", "car-3"]):
        name = session_file_name("rec", index, sid)
        assert (tmp_path / "f2" / name).read_bytes() == (tmp_path / "a2" / name).read_bytes()


def _topics(path: Path) -> set[str]:
    with open(path, "rb") as f:
        summary = make_reader(f).get_summary()
    assert summary is not None
    return {c.topic for c in summary.channels.values()}


def test_foxglove_in_a_fleet_adds_the_plot_topic_to_each_new_log(tmp_path, capsys):
    logs = [slice_log(tmp_path / f"d{i}.mcap", i * 300, 300, f"s{i}") for i in range(2)]
    code, printed = _replay(capsys, *map(str, logs), "--foxglove", "--out", str(tmp_path / "out"), "--workers", "2")
    assert code == 0, printed
    for i in range(2):
        assert plot_topic(f"s{i}") in _topics(tmp_path / "out" / f"d{i}.replayed.mcap")


def test_allow_truncated_in_a_fleet_replays_the_complete_part(tmp_path, capsys):
    whole = slice_log(tmp_path / "whole.mcap", 0, 600, "w")
    cut = tmp_path / "cut.mcap"
    cut.write_bytes(REAL_DRIVE.read_bytes()[:200_000])  # a recorder killed mid-drive: its first chunks
    code, printed = _replay(capsys, str(cut), "--allow-truncated", "--out", str(tmp_path / "alone.mcap"))
    assert code == 0, printed
    code, printed = _replay(
        capsys, str(whole), str(cut), "--allow-truncated", "--out", str(tmp_path / "out"), "--workers", "2"
    )
    assert code == 0, printed  # was: "... replay its complete part with --allow-truncated", exit 1
    replayed = tmp_path / "out" / "cut.replayed.mcap"
    assert replayed.read_bytes() == (tmp_path / "alone.mcap").read_bytes()
    assert 0 < len(read_log(replayed).observations) < len(read_log(REAL_DRIVE).observations)
    # without the flag, refused as one-log replay refuses it
    code, printed = _replay(capsys, str(whole), str(cut), "--out", str(tmp_path / "refused"), "--workers", "2")
    assert code == 1 and "replay its complete part with --allow-truncated" in printed


def test_more_workers_than_cores_are_the_cores_with_a_warning(tmp_path, capsys, monkeypatch):
    """QA: `--workers 100000` started one process per log, each holding a model."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    logs = [str(slice_log(tmp_path / f"d{i}.mcap", 300 * i, 300, f"s{i}")) for i in range(3)]
    report = tmp_path / "fleet.json"
    code, printed = _replay(capsys, *logs, "--no-write", "--workers", "100000", "--report", str(report))
    assert code == 0, printed
    assert "--workers 100000" in printed and "using 2" in printed
    assert '"workers": 2' in report.read_text()


def test_no_gate_with_gate_files_is_refused_naming_both(tmp_path, capsys):
    """The gate files were dropped silently: a replay the user thought gated ran ungated."""
    log = slice_log(tmp_path / "d.mcap", 0, 300, "a")
    code = main(["replay", str(log), "--model", str(TEST_MODEL_PATH), "--no-gate", "--gate", "g.npz", "--no-write"])
    printed = capsys.readouterr()
    assert code == 2 and "--no-gate and --gate g.npz" in printed.err
