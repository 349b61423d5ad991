"""`dualloop eval-logs` and `dualloop stream` on logs that are empty, cut or corrupt, as `replay` is:
refused naming the file and why (exit 2), the complete part used only with --allow-truncated; and
`stream` to an address where no server answers: one line naming it, no traceback.

The damaged logs are copies of a real recorded drive (tests/fixtures/comma2k19-example1.mcap)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from dualloop.controller.cli import main
from dualloop.models import TEST_MODEL_PATH
from tests.paths import FIXTURES

REAL = FIXTURES / "comma2k19-example1.mcap"


@pytest.fixture
def logs(tmp_path: Path) -> dict[str, Path]:
    """The real log; 0 bytes; its first 200,000 bytes; 400 bytes inside a chunk set to 0xAB."""
    whole = REAL.read_bytes()
    corrupt = bytearray(whole)
    corrupt[150_000:150_400] = b"\xab" * 400
    files = {"good": whole, "empty": b"", "cut": whole[:200_000], "corrupt": bytes(corrupt)}
    for name, data in files.items():
        (tmp_path / f"{name}.mcap").write_bytes(data)
    return {name: tmp_path / f"{name}.mcap" for name in files}


def _closed_port() -> str:
    """A loopback address nothing listens on (the port was free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("corrupt", "broken record after 1910 messages (CRCValidationError"),
        ("cut", "broken record after"),
        ("empty", "empty file, not an MCAP log"),
    ],
)
def test_eval_logs_refuses_a_damaged_log(
    logs: dict[str, Path], capsys: pytest.CaptureFixture[str], name: str, why: str
) -> None:
    """The corrupt copy's readable third was scored ("targets met", exit 0), and so was the cut one;
    the empty one was a ValueError traceback naming no file."""
    code, printed = _run(capsys, "eval-logs", str(logs[name]), "--model", str(TEST_MODEL_PATH))
    assert code == 2, printed
    assert f"error: {logs[name]}: {why}" in printed, printed
    assert "Traceback" not in printed and "targets" not in printed
    if name != "empty":
        assert "score its complete part with --allow-truncated" in printed


def test_eval_logs_scores_a_cut_logs_complete_part_when_asked(
    logs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, printed = _run(capsys, "eval-logs", str(logs["cut"]), "--model", str(TEST_MODEL_PATH), "--allow-truncated")
    assert code == 0 and "1 sessions" in printed, printed


@pytest.mark.parametrize(("name", "why"), [("corrupt", "broken record after 1910 messages"), ("cut", "broken record")])
def test_stream_refuses_a_damaged_log(
    logs: dict[str, Path], capsys: pytest.CaptureFixture[str], name: str, why: str
) -> None:
    """The corrupt copy's readable part was streamed and the command exited 0: refused before any
    server is started or called."""
    code, printed = _run(capsys, "stream", str(logs[name]), "--address", _closed_port(), "--speed", "100")
    assert code == 2, printed
    assert f"error: {logs[name]}: {why}" in printed and "stream its complete part with --allow-truncated" in printed
    assert "streaming" not in printed


def test_stream_to_an_address_without_a_server_says_so(
    logs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Was an AioRpcError traceback: one line naming the address and the failure, exit 1 as `admin`'s."""
    address = _closed_port()
    with_cut = _run(capsys, "stream", str(logs["cut"]), "--address", address, "--allow-truncated", "--speed", "100")
    for code, printed in (_run(capsys, "stream", str(logs["good"]), "--address", address, "--speed", "100"), with_cut):
        assert code == 1, printed
        assert f"error: stream to {address}: UNAVAILABLE: " in printed, printed
        assert "Traceback" not in printed
