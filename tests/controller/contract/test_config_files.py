"""Configuration files as the commands read them: one that is not UTF-8 is refused naming the file and
where its first bad byte is (a UnicodeDecodeError traceback before), by every command that reads one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from dualloop.controller.cli import main
from dualloop.models import BASE_MODEL_PATH, TEST_MODEL_PATH

NOT_UTF8 = b"\xff\xfe garbage"


@pytest.mark.parametrize(
    "command",
    [
        lambda path: ["serve", "--model", str(TEST_MODEL_PATH), "--config", str(path)],
        lambda path: ["qualify", str(BASE_MODEL_PATH), "--criteria", str(path), "--out", str(path.parent / "q")],
    ],
    ids=["serve --config", "qualify --criteria"],
)
@pytest.mark.parametrize("suffix", [".toml", ".yaml"])
def test_a_config_file_that_is_not_utf8_names_the_file_and_the_byte(
    command: Callable[[Path], list[str]], suffix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / f"bin{suffix}"
    path.write_bytes(NOT_UTF8)
    assert main(command(path)) == 2
    text = "".join(capsys.readouterr())
    assert f"error: {path}: the configuration file is not UTF-8 text: byte 0xff at offset 0 (line 1, column 1)" in text


def test_the_bad_byte_is_placed_by_line_and_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes('[executor]\nname = "caf\xe9"\n'.encode("latin-1"))
    assert main(["qualify", str(BASE_MODEL_PATH), "--criteria", str(path), "--out", str(tmp_path / "q")]) == 2
    assert "byte 0xe9 at offset 22 (line 2, column 12)" in "".join(capsys.readouterr())
