"""The recorder's disk fills up during a run (RLIMIT_FSIZE on the server process: writes past the
limit fail with EFBIG, as ENOSPC would on a full disk, and need no root or tmpfs).

The server keeps serving and logs the recorder's error once; sessions go on; what was flushed
before the failure stays readable, in order and without a gap; recording stops (counted as dropped).
"""

from __future__ import annotations

import resource
import signal
from pathlib import Path

import numpy as np
import pytest

from dualloop.controller.logs.logfile import read_log
from dualloop.controller.server_process import ServerProcess, serve_shipped, wait_until
from tests.controller.chaos.helpers import TIMEOUT_S, Driver, assert_still_serving

pytestmark = pytest.mark.slow

LIMIT_BYTES = 256 * 1024  # a few seconds of one session's records


def _small_disk() -> None:
    """In the server process, before exec: files can grow to LIMIT_BYTES; the write past it fails
    (EFBIG) instead of killing the process (SIGXFSZ ignored, which survives exec)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT_BYTES, LIMIT_BYTES))


def test_recorder_disk_full(tmp_path: Path, drive_rows: np.ndarray) -> None:
    record_dir = tmp_path / "rec"
    config = {"record_dir": str(record_dir)}
    with serve_shipped(tmp_path / "server", config, preexec_fn=_small_disk, log_format="json") as server:
        driver = Driver(server.address, drive_rows, session_id="recorded")
        driver.wait_for(lambda s: s.state == "NOMINAL")
        assert wait_until(lambda: bool(server.events("recorder.error") or _errors(server)), TIMEOUT_S), (
            "the recorder never failed: is the limit above what was written?"
        )
        # the session goes on after the failure: more snapshots, tick after tick
        n = len(driver.snaps)
        driver.wait_for(lambda s: s.tick >= driver.snaps[n - 1].tick + 400, n)
        assert server.stats().records_dropped_total > 0  # the drops are visible while they happen
        assert driver.stop().name == "OK"
        assert_still_serving(server, drive_rows)
        files = sorted(record_dir.glob("*.mcap"))
    assert len(_errors(server)) == 1, _errors(server)
    # and logged: the recorder's warning counts them (at most every 10 s, and when it closes)
    assert [line for line in server.stderr_text().splitlines() if "records dropped since the last report" in line]
    assert len(files) == 1 and 0 < files[0].stat().st_size <= LIMIT_BYTES
    data = read_log(files[0], "recorded")  # a log cut short: read up to the cut, and says so
    assert data.truncated, data.truncation
    assert len(data.snapshots) > 100, "nothing of what was flushed before the failure is readable"
    # every snapshot the client was sent within the recorded span is in the log (the recorder takes
    # every snapshot; ticks the server missed are in neither), and every observation up to the cut
    recorded = {s.tick for s in data.snapshots}
    first, last = min(recorded), max(recorded)
    sent = [s.tick for s in driver.snaps if first <= s.tick <= last]
    assert len(sent) > 100 and set(sent) <= recorded, sorted(set(sent) - recorded)[:10]
    seqs = np.array([o.seq for o in data.observations])
    assert seqs.size > 100 and seqs[0] == 1 and (np.diff(seqs) == 1).all(), "an observation lost before the cut"


def _errors(server: ServerProcess) -> list[str]:
    return [line for line in server.stderr_text().splitlines() if "recorder" in line and "ERROR" in line]
