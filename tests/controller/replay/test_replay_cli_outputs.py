"""What one-log `dualloop replay` writes, and where (found by QA): no two outputs on one file, the
plot's format and output paths checked before the replay, --no-write writing no log, a recording's
sessions named apart in the evaluation, selected sessions' files numbered by their position."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dualloop.controller.cli import main
from dualloop.controller.logs.logfile import read_log
from dualloop.controller.logs.synthetic import slice_log
from dualloop.controller.replay.lockstep import session_file_name
from dualloop.controller.replay.report import ReplayReport, format_report
from dualloop.models import TEST_MODEL_PATH
from tests.controller.replay.recordings import write_recording

SESSIONS = ("car-1", "car-2", "car-3")


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A server's recording as the recorder writes one: three sessions' headers, then their
    observations interleaved (the first 120 of the real drive each)."""
    return write_recording(tmp_path_factory.mktemp("recording") / "rec.mcap", SESSIONS, 120)


@pytest.fixture(scope="module")
def solo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return slice_log(tmp_path_factory.mktemp("solo") / "solo.mcap", 0, 120, "solo")


def _replay(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str]:
    code = main(["replay", *map(str, argv), "--model", str(TEST_MODEL_PATH), "--no-gate"])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _one_line_error(code: int, printed: str, *says: str) -> None:
    assert code == 2 and printed.startswith("error: ") and printed.count("\n") == 1, printed
    assert "Errno" not in printed and all(s in printed for s in says), printed


def test_an_out_that_is_its_own_report_is_refused(
    tmp_path: Path, solo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--out foo.json` printed "new log: foo.json  report: foo.json": the report written over the log."""
    code, printed = _replay(capsys, solo, "--out", tmp_path / "foo.json")
    _one_line_error(code, printed, "foo.json", "would be written to this one file", "give --out another path")
    code, printed = _replay(capsys, solo, "--out", tmp_path / "x.mcap", "--json", tmp_path / "x.json")
    _one_line_error(code, printed, "x.json", "give --json another path")
    assert list(tmp_path.iterdir()) == []


def test_the_plot_format_is_checked_before_the_replay(
    tmp_path: Path, solo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--plot plot.txt` was a traceback after the replay; `--plot myplot` said "plot: myplot" and
    wrote myplot.png."""
    code, printed = _replay(capsys, solo, "--out", tmp_path / "x.mcap", "--plot", tmp_path / "plot.txt")
    _one_line_error(code, printed, "plot.txt", "cannot write .txt", ".png", ".pdf", ".svg")
    assert list(tmp_path.iterdir()) == []
    code, printed = _replay(capsys, solo, "--no-write", "--plot", tmp_path / "myplot")
    assert code == 0 and f"plot: {tmp_path / 'myplot.png'}\n" in printed, printed
    assert [p.name for p in tmp_path.iterdir()] == ["myplot.png"]


def test_no_write_writes_no_log(
    tmp_path: Path, recording: Path, solo: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """One log with --no-write still wrote runs/replay/<name>... under the current folder."""
    monkeypatch.chdir(tmp_path)
    before = sorted(recording.parent.iterdir())
    code, printed = _replay(capsys, recording, "--no-write")
    assert code == 0 and "replayed 3 of the 3 sessions of" in printed and "new log" not in printed, printed
    code, printed = _replay(capsys, solo, "--no-write")
    assert code == 0 and "new log" not in printed, printed
    assert list(tmp_path.iterdir()) == [] and sorted(recording.parent.iterdir()) == before


def test_the_sessions_of_a_recording_are_named_apart(
    tmp_path: Path, recording: Path, solo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The table, --json's logs[].source and the --plot bars named every session "rec"/"rec.mcap";
    a log of one session keeps its name."""
    evaluation, plot = tmp_path / "e.json", tmp_path / "p.svg"
    code, printed = _replay(capsys, recording, "--no-write", "--json", evaluation, "--plot", plot)
    assert code == 0, printed
    labels = [f"rec.mcap {s}" for s in SESSIONS]
    assert [e["source"] for e in json.loads(evaluation.read_text())["logs"]] == labels
    table = printed[printed.index("evaluation against") :]
    assert all(f"\n{label} " in table for label in labels), table
    drawn = plot.read_text()  # matplotlib's SVG keeps each text as a comment beside its glyphs
    assert all(f"<!-- {label} -->" in drawn for label in labels)
    code, printed = _replay(capsys, solo, "--no-write", "--json", evaluation)
    assert code == 0 and [e["source"] for e in json.loads(evaluation.read_text())["logs"]] == [str(solo)]
    assert "\nsolo " in printed


def test_output_path_errors_are_one_line_before_the_replay(
    tmp_path: Path, recording: Path, solo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each was a raw errno line ("[Errno 17] File exists", "[Errno 21] Is a directory", "[Errno 2]"),
    a bad --json path failed only after the replay, and a folder as the log was "no such log"."""
    a_file = tmp_path / "text.mcap"
    a_file.write_bytes(b"")
    code, printed = _replay(capsys, recording, "--out", a_file)
    _one_line_error(code, printed, f"{a_file}: a file, not a folder", "give --out a folder")
    code, printed = _replay(capsys, solo, "--out", a_file / "sub.mcap")
    _one_line_error(code, printed, f"{a_file} is a file, not a folder", "give --out a path in a folder")
    code, printed = _replay(capsys, solo, "--out", "/proc/nope/x.mcap")
    _one_line_error(code, printed, "cannot make the folder /proc/nope", "give --out a path in a folder")
    code, printed = _replay(capsys, solo, "--out", tmp_path / "y.mcap", "--json", a_file / "e.json")
    _one_line_error(code, printed, f"{a_file} is a file, not a folder", "give --json a path in a folder")
    code, printed = _replay(capsys, solo, "--out", tmp_path / "y.mcap", "--json", tmp_path)
    _one_line_error(code, printed, f"{tmp_path}: a folder", "give --json a file path")
    code, printed = _replay(capsys, tmp_path)
    _one_line_error(code, printed, f"{tmp_path}: a folder, not a log", f"{tmp_path}/*.mcap")
    assert list(tmp_path.iterdir()) == [a_file]
    # an existing folder as --out of a one-session log takes the new log, as a recording's folder does
    folder = tmp_path / "out"
    folder.mkdir()
    code, printed = _replay(capsys, solo, "--out", folder)
    assert code == 0 and f"new log: {folder / 'solo.replayed.mcap'}" in printed, printed
    assert sorted(p.name for p in folder.iterdir()) == ["solo.replayed.json", "solo.replayed.mcap"]


def test_selected_sessions_are_numbered_by_their_position_in_the_recording(
    tmp_path: Path, recording: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--session car-3 --session car-1` named them 000 and 001, by the order asked; docs/operations.md
    says NNN is the position in the recording, the number a replay of every session gives."""
    code, printed = _replay(capsys, recording, "--session", "car-3", "--session", "car-1", "--out", tmp_path)
    assert code == 0, printed
    expected = [session_file_name("rec", 0, "car-1"), session_file_name("rec", 2, "car-3")]
    assert sorted(p.name for p in tmp_path.glob("*.mcap")) == expected
    assert read_log(tmp_path / expected[1]).session_id == "car-3"


def test_the_real_time_figure_is_meaningful() -> None:
    """A replay of a drive too short to time printed "0x real time"; below 1x it printed 0x too."""
    assert "real time" not in format_report(ReplayReport(speedup=0.0))
    assert ": 0.42x real time (" in format_report(ReplayReport(speedup=0.42))
    assert ": 1234x real time (" in format_report(ReplayReport(speedup=1234.4))


def test_a_model_replayed_without_gates_is_warned_about(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Found by QA: another model (the int8 one too) replayed ungated, said only by a "gates none" in
    the report; the shipped gates fit only the shipped model, so its replay takes them."""
    log = slice_log(tmp_path / "drive.mcap", 0, 200, "s")
    assert main(["replay", str(log), "--model", str(TEST_MODEL_PATH), "--no-write"]) == 0
    assert "replayed with no OOD gate" in capsys.readouterr().err
    assert main(["replay", str(log), "--model", str(TEST_MODEL_PATH), "--no-write", "--no-gate"]) == 0
    assert main(["replay", str(log), "--no-write"]) == 0  # the shipped model with its gates
    assert "no OOD gate" not in capsys.readouterr().err


def test_a_recordings_base_name_keeps_its_whole_name(tmp_path: Path) -> None:
    """Found by QA: a rotated recording's base name given without `.mcap` was cut at its last dot
    (`dualloop-20261207-030754.000123-77-a1b2c3` -> `dualloop-20261207-030754`), so the replays of two
    recordings of one second took one file name."""
    base = "dualloop-20261207-030754.000123-77-a1b2c3"
    slice_log(tmp_path / f"{base}-0000.mcap", 0, 200, "s")  # part 0 of a rotated recording
    out = tmp_path / "out"
    out.mkdir()
    assert main(["replay", str(tmp_path / base), "--out", str(out)]) == 0
    assert [p.name for p in out.glob("*.mcap")] == [f"{base}.replayed.mcap"]
    other = tmp_path / "other"
    other.mkdir()
    twin = slice_log(other / f"{base}.mcap", 0, 200, "s")  # given with .mcap: the same name, as before
    fleet_out = tmp_path / "fleet"
    assert main(["replay", str(twin), str(tmp_path / f"{base}-0000.mcap"), "--out", str(fleet_out)]) == 0
    assert sorted(p.name for p in fleet_out.glob("*.mcap")) == [f"{base}-0000.replayed.mcap", f"{base}.replayed.mcap"]
