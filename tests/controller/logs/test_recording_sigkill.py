"""A recording process killed with SIGKILL leaves a log that reads back up to ~1 s before the kill."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dualloop.controller.logs.logfile import read_log
from tests.paths import REPO_ROOT

# The child records one observation and one snapshot every 5 ms, stamped with the wall clock, so the
# parent can tell by timestamps which records were older than one second at the moment of the kill.
CHILD = r"""
import sys, time
from dualloop.controller.logs.recorder import Recorder
from dualloop.v2 import controller_pb2 as pb, log_pb2

rec = Recorder(sys.argv[1], flush_interval_s=0.25)
rec.open_session(log_pb2.SessionHeader(session_id="killed", source="sigkill test"))
period = 0.005
next_t = time.monotonic()
i = 0
while True:
    now_ns = time.time_ns()
    rec.write_observation("killed", pb.Observation(seq=i, timestamp_ns=now_ns, features=[float(i)] * 19))
    rec.write_snapshot(pb.DecisionSnapshot(session_id="killed", tick=i, scheduled_time_ns=now_ns, observation_seq=i))
    if i == 100:
        print("recording", flush=True)
    i += 1
    next_t += period
    time.sleep(max(0.0, next_t - time.monotonic()))
"""


@pytest.mark.slow
def test_sigkill_mid_recording_keeps_everything_older_than_a_second(tmp_path: Path) -> None:
    path = tmp_path / "killed.mcap"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "recording"
        time.sleep(2.5)
        kill_ns = time.time_ns()
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    assert child.returncode == -signal.SIGKILL

    data = read_log(path)
    assert data.truncated and "without its footer" in data.truncation
    assert data.header.session_id == "killed" and data.header.source == "sigkill test"
    seqs = [o.seq for o in data.observations]
    assert seqs == list(range(len(seqs))), "recovered observations must be a gap-free prefix"
    assert [s.tick for s in data.snapshots] == list(range(len(data.snapshots)))
    # Every record stamped more than 1 s before the kill is there: the newest recovered one is
    # younger than that, and there are no gaps before it.
    assert data.observations[-1].timestamp_ns >= kill_ns - 1_000_000_000
    assert data.snapshots[-1].scheduled_time_ns >= kill_ns - 1_000_000_000
    assert len(seqs) >= 350  # ~2.5 s at 200 Hz, minus at most ~1 s
