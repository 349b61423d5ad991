"""The minimal Python client docs/contract.md quotes, run against a live server."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dualloop.controller.serve.lifecycle import ServerThread
from tests.paths import REPO_ROOT


@pytest.mark.slow
def test_python_example_runs(shipped_server: ServerThread) -> None:
    example = REPO_ROOT / "clients" / "python" / "example.py"
    result = subprocess.run(
        [sys.executable, str(example), shipped_server.address], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    actions = shipped_server.server.executor.card.actions
    assert lines[0].startswith("session ") and lines[-1].startswith("last: ") and lines[-1].split()[1] in actions
    # a steady cruise: a first-time user sees it driven, not vetoed into a fallback
    assert lines[-1].endswith("SAFETY_STATE_NOMINAL") and "OOD_VETO" not in result.stdout, result.stdout


def test_python_example_reports_an_unreachable_server() -> None:
    """No server: the example exits non-zero with the gRPC status, not a traceback."""
    example = REPO_ROOT / "clients" / "python" / "example.py"
    result = subprocess.run([sys.executable, str(example), "127.0.0.1:1"], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "UNAVAILABLE" in result.stderr and "Traceback" not in result.stderr


def test_python_example_without_an_address_prints_its_usage() -> None:
    example = REPO_ROOT / "clients" / "python" / "example.py"
    result = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and result.stderr.startswith("usage: "), result.stderr
    assert "Traceback" not in result.stderr and "HOST:PORT" in result.stderr


@pytest.mark.parametrize("example", ["clients/python/example.py", "clients/node/example.mjs"])
def test_contract_guide_quotes_the_examples_verbatim(example: str) -> None:
    """docs/contract.md shows the files the tests run, not a copy that drifts."""
    guide = (REPO_ROOT / "docs" / "contract.md").read_text()
    code = (REPO_ROOT / example).read_text()
    assert f"\n{code}```\n" in guide
