"""`dualloop stream`'s arguments: numbers checked while parsing, and a --speed other than 1 said to
change what the checks judge (found by QA: NGSIM at --speed 10 was 6% NOMINAL, 99.6% at 1)."""

from __future__ import annotations

import socket

import pytest

from dualloop.controller.cli import main
from dualloop.controller.logs.synthetic import REAL_DRIVE


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize(
    ("flag", "value"), [("--speed", "0"), ("--speed", "nan"), ("--every", "0"), ("--sessions", "-1")]
)
def test_numbers_out_of_range_are_refused_while_parsing(
    capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["stream", str(REAL_DRIVE), flag, value])
    assert stopped.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err


def test_a_faster_stream_says_it_is_another_drive(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["stream", str(REAL_DRIVE), "--address", _closed_port(), "--speed", "10"])
    printed = capsys.readouterr()
    assert code == 1  # nothing listens: said in one line
    assert "--speed 10: the drive's time runs 10x as fast as recorded" in printed.out
    assert "`dualloop replay`" in printed.out
    assert main(["stream", str(REAL_DRIVE), "--address", _closed_port()]) == 1
    assert "as fast as recorded" not in capsys.readouterr().out
