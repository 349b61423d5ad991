"""`dualloop train` refuses bad arguments before it builds any data: a number out of its range, a
log or model file that is missing or is not one, each said in one line naming the option or file."""

from __future__ import annotations

from pathlib import Path

import pytest

from dualloop.controller.cli import main


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("bad")
    (folder / "empty.mcap").write_bytes(b"")
    (folder / "notes.mcap").write_text("time,ego_speed\n0,1\n")
    (folder / "garbage.onnx").write_bytes(bytes(range(256)) * 4)
    (folder / "no-logs").mkdir()
    return folder


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--log-share", "-1"], "--log-share must be in [0, 1)"),
        (["--log-share", "nan"], "--log-share must be in [0, 1)"),
        (["--dagger", "-2"], "--dagger must be 0 or more rounds"),
        (["--ece-tolerance", "nan"], "--ece-tolerance and --nll-tolerance must be >= 0"),
        (["--logs", "{bad}/missing"], "missing: no such log file or folder"),
        (["--logs", "{bad}/no-logs"], "--logs: no .mcap log in"),
        (["--logs", "{bad}/empty.mcap"], "empty.mcap is not an MCAP log"),
        (["--logs", "{bad}/notes.mcap"], "notes.mcap is not an MCAP log"),
        (["--check", "{bad}/missing.onnx"], "--check: {bad}/missing.onnx: no such model file"),
        (["--check", "{bad}/garbage.onnx"], "garbage.onnx: onnxruntime cannot load it"),
        (["--calibration-reference", "{bad}/garbage.onnx"], "garbage.onnx: onnxruntime cannot load it"),
    ],
)
def test_bad_arguments_are_refused_before_any_work(
    args: list[str], message: str, bad_files: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["train", "--quick", "--out", str(tmp_path / "out"), *(a.format(bad=bad_files) for a in args)]
    assert main(argv) == 2
    captured = capsys.readouterr()
    said = " ".join((captured.out + captured.err).split())
    assert message.format(bad=bad_files) in said, said
    assert not (tmp_path / "out").exists()  # nothing was built
