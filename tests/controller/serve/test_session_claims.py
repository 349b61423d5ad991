"""Session claims across processes (session_claims.py): one holder per id, freed when its holder
releases it or dies. The other holder is a real second process, as a worker is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dualloop.controller.serve.session_claims import SessionClaims
from dualloop.executor.sessions import SessionAlreadyOpen

_HOLD = """
import sys, time
from pathlib import Path
from dualloop.controller.serve.session_claims import SessionClaims
claims = SessionClaims(Path(sys.argv[1]))
claims.claim(sys.argv[2])
print("held", flush=True)
sys.stdin.readline()  # until told to release (a line) or killed
claims.release(sys.argv[2])
print("released", flush=True)
sys.stdin.readline()
"""


def _holder(folder: Path, session_id: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(folder), session_id], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def test_an_id_held_by_another_process_is_refused_until_it_releases_it(tmp_path: Path) -> None:
    other = _holder(tmp_path, "car/7")
    try:
        claims = SessionClaims(tmp_path)
        with pytest.raises(SessionAlreadyOpen, match="'car/7' is already open on this server"):
            claims.claim("car/7")
        claims.claim("car/8")  # another id is free
        assert other.stdin is not None and other.stdout is not None
        other.stdin.write("\n")
        other.stdin.flush()
        assert other.stdout.readline() == "released\n"
        claims.claim("car/7")
        assert claims.holds("car/7")
        claims.release_all()
        assert list(tmp_path.iterdir()) == []  # a release leaves no file behind
    finally:
        other.kill()
        other.wait(10)


def test_a_killed_holders_ids_are_free_at_once(tmp_path: Path) -> None:
    other = _holder(tmp_path, "x")
    other.kill()  # SIGKILL: no release ran; the kernel dropped its lock
    other.wait(10)
    claims = SessionClaims(tmp_path)
    claims.claim("x")
    assert claims.holds("x")


def test_one_process_cannot_claim_an_id_twice(tmp_path: Path) -> None:
    claims = SessionClaims(tmp_path)
    claims.claim("a")
    with pytest.raises(SessionAlreadyOpen):
        SessionClaims(tmp_path).claim("a")  # a lock is its open file's: a second open of it conflicts
    claims.release("a")
    claims.release("a")  # twice, or an id never held: nothing
    claims.release("never")


def test_a_claim_in_a_folder_gone_with_its_parent_holds_nothing(tmp_path: Path) -> None:
    claims = SessionClaims(tmp_path / "gone")
    claims.claim("a")  # a draining worker whose parent died: its opens are refused upstream
    assert not claims.holds("a")
