"""`dualloop recover` of files with nothing to recover: refused naming the file, no log written.
(A killed server's recording recovered whole: tests/controller/replay/test_recording_replay.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from dualloop.controller.cli import main
from tests.paths import FIXTURES

REAL = FIXTURES / "comma2k19-example1.mcap"


def test_nothing_to_recover_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An empty file exited 0 with a 0-message "recovered" log: a stray file taken for a cut log. It,
    and a file cut before its first message, are refused naming the file; a cut log still recovers."""
    out = tmp_path / "out.mcap"
    for content, message in ((b"", "empty file, not an MCAP log"), (REAL.read_bytes()[:20], "no sessions in it")):
        source = tmp_path / "in.mcap"
        source.write_bytes(content)
        assert main(["recover", str(source), str(out)]) == 2
        printed = "".join(capsys.readouterr())
        assert f"error: {source}: {message}" in printed, printed
        assert not out.exists() and source.read_bytes() == content
    source.write_bytes(REAL.read_bytes()[:200_000])
    assert main(["recover", str(source), str(out)]) == 0
    assert "was cut" in "".join(capsys.readouterr()) and out.is_file()


def test_an_existing_output_is_refused_before_the_source_is_read(tmp_path: Path, capsys) -> None:
    """Found by QA: a bare `error: [Errno 17] File exists: ...`."""
    out = tmp_path / "out.mcap"
    out.write_bytes(b"kept")
    assert main(["recover", str(REAL), str(out)]) == 2
    assert f"error: {out}: already exists; the recovered log must be a new file" in capsys.readouterr().err
    assert out.read_bytes() == b"kept"
