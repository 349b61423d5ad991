"""`dualloop train` and `make-test-model` refuse an output they cannot write, and `train` recorded drives
without a session, before any work: a file where --out's folder goes failed with a bare [Errno 17]
after the whole run, and a valid but empty log after 56 s of building data. Each test pairs the
refusal with a bad --check model, the old code's quick refusal (checked after these), so it is quick
on either code."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dualloop.controller.cli import main
from dualloop.controller.logs.format import LogFileWriter


def _said(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    return " ".join((captured.out + captured.err).split())


def test_train_refuses_a_file_as_its_out_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    existing = tmp_path / "existing.onnx"
    existing.write_bytes(b"a model")
    argv = ["train", "--quick", "--out", str(existing), "--check", str(tmp_path / "missing.onnx")]
    assert main(argv) == 2
    said = _said(capsys)
    assert f"--out {existing}: {existing} is a file, not a folder" in said, said
    assert existing.read_bytes() == b"a model"


def test_train_refuses_logs_without_a_session(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tiny = tmp_path / "tiny.mcap"
    writer = LogFileWriter(tiny)  # a valid MCAP log with no session in it
    writer.finish()
    out = tmp_path / "out"
    argv = ["train", "--quick", "--out", str(out), "--logs", str(tiny), "--check", str(tmp_path / "missing.onnx")]
    assert main(argv) == 2
    said = _said(capsys)
    assert f"--logs: no sessions in {tiny}" in said, said
    assert not out.exists()


def test_train_makes_a_missing_out_folder_only_once_all_is_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "new" / "models"
    assert main(["train", "--quick", "--out", str(out), "--check", str(tmp_path / "missing.onnx")]) == 2
    assert not out.exists()


def test_make_test_model_says_a_file_is_in_the_way(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It said "[Errno 17] File exists: 'tm.onnx'"."""
    (tmp_path / "tm.onnx").write_bytes(b"")
    assert main(["make-test-model", "--out", str(tmp_path / "tm.onnx" / "x.onnx")]) == 2
    assert f"{tmp_path / 'tm.onnx'} is a file, not a folder" in _said(capsys)


def test_make_test_model_makes_a_missing_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "a" / "b" / "tm.onnx"
    assert main(["make-test-model", "--out", str(out)]) == 0
    assert out.is_file() and [p.name for p in out.parent.iterdir()] == ["tm.onnx"]  # no temp file left


def test_a_model_is_replaced_by_rename(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """write_bytes rewrote the file in place: a server reading it meanwhile saw half a model. A reader
    holding the old file (a hard link here) keeps it whole."""
    out, held = tmp_path / "tm.onnx", tmp_path / "held.onnx"
    out.write_bytes(b"the old model")
    os.link(out, held)
    assert main(["make-test-model", "--out", str(out)]) == 0
    assert held.read_bytes() == b"the old model" and out.read_bytes() != b"the old model"
