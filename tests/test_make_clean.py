"""`make clean` removes what make and the tests made and keeps runs/ (a user's reports and recordings);
`make clean-runs` removes runs/ and says so. Read from make's dry run: nothing is deleted here."""

from __future__ import annotations

import shlex
import shutil
import subprocess

import pytest

from tests.paths import REPO_ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make")


def _dry_run(target: str) -> list[list[str]]:
    out = subprocess.run(
        ["make", "-n", "-C", str(REPO_ROOT), "--no-print-directory", target],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return [shlex.split(line) for line in out.replace("\\\n", " ").splitlines() if line.strip()]


def test_clean_removes_the_caches_and_keeps_runs() -> None:
    commands = _dry_run("clean")
    removed = {word for words in commands if words[:2] == ["rm", "-rf"] for word in words[2:]}
    assert "runs" not in removed and not any(word.startswith("runs") for word in removed)
    for made in (".venv", "build", ".pytest_cache", ".hypothesis", ".mypy_cache", ".ruff_cache"):
        assert made in removed, made
    assert {"clients/node/node_modules", "tools/buf/node_modules"} <= removed
    assert any("__pycache__" in words for words in commands)


def test_clean_runs_removes_runs_and_says_so() -> None:
    commands = _dry_run("clean-runs")
    assert ["rm", "-rf", "runs"] in commands
    assert any(words[0] == "echo" and "runs/" in " ".join(words) for words in commands)
