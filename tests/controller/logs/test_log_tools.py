"""QA findings in the log tools other than replay: `foxglove-layout`, `recover`, `import shared-data`.
(`diff`: tests/controller/replay/test_diff_inputs.py.)"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dualloop.controller.cli import main
from dualloop.controller.logs.format import TOPIC_HEADER, TOPIC_OBSERVATION, TOPIC_SUMMARY, LogFileWriter
from dualloop.controller.logs.foxglove import layout
from dualloop.controller.logs.logfile import check_log_file, read_log, read_sessions
from dualloop.controller.logs.shared_data import import_shared_data
from dualloop.controller.logs.synthetic import REAL_DRIVE, synthetic_log
from dualloop.controller.replay.lockstep import ReplayOptions, replay_log
from dualloop.models import TEST_MODEL_PATH
from dualloop.v2 import log_pb2
from tests.paths import FIXTURES, REPO_ROOT

REAL_FIXTURES = FIXTURES / "real-drives"


@pytest.fixture(scope="module")
def plotted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short replay with the plot topic of its one session, "synthetic"."""
    tmp = tmp_path_factory.mktemp("plotted")
    log = synthetic_log(tmp / "in.mcap", seconds=0.5, rate_hz=50.0)
    return replay_log(log, TEST_MODEL_PATH, out_path=tmp / "rec.mcap", options=ReplayOptions(plots=True)).out_path


def test_foxglove_layout_never_writes_over_a_recording(plotted: Path, tmp_path: Path, capsys) -> None:
    """`foxglove-layout fxin.mcap -o fxin.mcap` exited 0 and the recording was JSON: an output that is an
    input, named .mcap or holding an MCAP log is refused in one line naming it, exit 2, nothing written."""
    rec = tmp_path / "fxin.mcap"
    shutil.copyfile(plotted, rec)
    other = tmp_path / "other.bin"  # a log under another name: its content says what it is
    shutil.copyfile(plotted, other)
    original = rec.read_bytes()
    for out, why in (
        (rec, "the output would overwrite the input"),
        (tmp_path / "new.mcap", "an MCAP log"),
        (other, "an MCAP log"),
    ):
        assert main(["foxglove-layout", str(rec), "-o", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"error: {out}: {why}" in err and len(err.strip().splitlines()) == 1, err
    assert rec.read_bytes() == original and other.read_bytes() == original
    assert not (tmp_path / "new.mcap").exists()
    assert main(["foxglove-layout", str(rec), "-o", str(tmp_path / "layout.json")]) == 0


def test_foxglove_layout_takes_a_rotated_recordings_base_name(plotted: Path, tmp_path: Path, capsys) -> None:
    """Replay and diff take the base name of a rotated recording (BASE-0000.mcap, BASE-0001.mcap, ...);
    foxglove-layout said "recording not found"."""
    for part in range(2):
        shutil.copyfile(plotted, tmp_path / f"rec-{part:04d}.mcap")
    out = tmp_path / "layout.json"
    assert main(["foxglove-layout", str(tmp_path / "rec.mcap"), "-o", str(out)]) == 0, capsys.readouterr().err
    assert json.loads(out.read_text()) == layout(["synthetic"])
    assert main(["foxglove-layout", str(tmp_path / "none.mcap"), "-o", str(out)]) == 2
    assert f"error: {tmp_path / 'none.mcap'}: recording not found" in capsys.readouterr().err


def _killed_recording(path: Path) -> Path:
    """A recording as a SIGKILLed server leaves it: session "done" ended (its summary written), session
    "open" not, and no footer (the file's end, summary section included, never written)."""
    source = read_log(REAL_DRIVE)
    whole = path.with_name("whole.mcap")
    file = LogFileWriter(whole, chunk_bytes=4096)
    for sid, observations, ended in (
        ("done", source.observations[:100], True),
        ("open", source.observations[100:500], False),
    ):
        header = log_pb2.SessionHeader()
        header.CopyFrom(source.header)
        header.session_id = sid
        file.write(TOPIC_HEADER, sid, header, observations[0].timestamp_ns)
        for obs in observations:
            file.write(TOPIC_OBSERVATION, sid, obs, obs.timestamp_ns)
        if ended:
            summary = log_pb2.SessionSummary(session_id=sid, observations_written=len(observations))
            file.write(TOPIC_SUMMARY, sid, summary, observations[-1].timestamp_ns)
    file.finish()
    data = whole.read_bytes()
    path.write_bytes(data[: len(data) * 7 // 10])
    assert all(d.truncated for d in read_sessions(path).values())
    return path


def test_a_recovered_log_keeps_its_cut_sessions_cut(tmp_path: Path, capsys) -> None:
    """`recover killed.mcap k.mcap` then `replay k.mcap` replayed the cut session as a whole drive: the
    recovered file is complete, so nothing said the session was cut. recover names the cut sessions,
    marks them in the file, and the reader marks them cut: replay refuses them unless --allow-truncated."""
    killed = _killed_recording(tmp_path / "killed.mcap")
    recovered = tmp_path / "k.mcap"
    assert main(["recover", str(killed), str(recovered)]) == 0
    printed = capsys.readouterr().out
    assert "sessions cut (no end recorded): open;" in printed and "done" not in printed.split("sessions cut")[1]
    sessions = read_sessions(recovered)
    assert not sessions["done"].truncated and sessions["open"].truncated
    assert "recovered by `dualloop recover`" in sessions["open"].truncation
    with pytest.raises(ValueError, match="session 'open' was cut"):
        check_log_file(recovered, allow_truncated=False, verb="score")
    replay = ["replay", str(recovered), "--model", str(TEST_MODEL_PATH), "--no-gate"]
    assert main([*replay, "--out", str(tmp_path / "a")]) == 2
    assert "session 'open' was cut there; the drive may be cut short" in capsys.readouterr().err
    assert main([*replay, "--out", str(tmp_path / "b"), "--allow-truncated"]) == 0
    capsys.readouterr()
    # recovered again, the mark stays: the cut session never turns whole
    assert main(["recover", str(recovered), str(tmp_path / "again.mcap")]) == 0
    assert "open" in capsys.readouterr().out and read_sessions(tmp_path / "again.mcap")["open"].truncated


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_an_interrupted_recover_leaves_no_output(tmp_path: Path, sig: signal.Signals) -> None:
    """SIGTERM left 33 bytes under OUT, Ctrl-C 5 MB: a retry said "already exists". The input is a pipe
    that stops mid-log, so the signal comes while recover is writing; OUT is then absent, no partial file
    is left, and the retry works."""
    fifo = tmp_path / "cut.mcap"
    os.mkfifo(fifo)
    out = tmp_path / "out" / "k.mcap"
    out.parent.mkdir()
    cmd = [sys.executable, "-m", "dualloop.controller.cli", "recover", str(fifo), str(out)]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with open(fifo, "wb") as pipe:
            pipe.write(REAL_DRIVE.read_bytes()[:150_000])
            pipe.flush()
            deadline = time.monotonic() + 60
            while not any(out.parent.iterdir()) and time.monotonic() < deadline:  # it has started writing
                time.sleep(0.05)
            time.sleep(0.2)  # and is reading the pipe again
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + sig, err
    assert list(out.parent.iterdir()) == [], err
    cut = tmp_path / "cut-file.mcap"
    cut.write_bytes(REAL_DRIVE.read_bytes()[:150_000])
    assert main(["recover", str(cut), str(out)]) == 0 and out.is_file()


def test_an_interrupted_shared_data_import_leaves_the_previous_one(tmp_path: Path) -> None:
    """SIGTERM 1.5 s into `import shared-data -o real` over an earlier import left 8 sessions beside the
    old manifest listing 223 (the old .mcap files were deleted first), and eval-logs scored those 8. An
    import interrupted mid-way (Ctrl-C, as main turns SIGTERM into, after its first drive) leaves the
    earlier import whole; a finished one replaces it."""
    out = tmp_path / "real"
    first = import_shared_data(REAL_FIXTURES, out, start_time_unix_ns=1)
    assert first.reports["train"] and first.reports["train"][0].out_path.parent == out / "train"
    before = {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}

    def interrupt(line: str) -> None:
        if line.startswith("[2/"):  # one drive written
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        import_shared_data(REAL_FIXTURES, out, progress=interrupt, start_time_unix_ns=2)
    after = {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    assert after == before  # nothing deleted, added or half-replaced; no hidden folder left
    assert sorted(p.name for p in out.iterdir()) == ["heldout", "manifest.json", "train"]
    import_shared_data(REAL_FIXTURES, out, start_time_unix_ns=2)
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(s["file"] for s in manifest["sessions"]) == sorted(
        str(p.relative_to(out)) for p in out.glob("*/*.mcap")
    )
