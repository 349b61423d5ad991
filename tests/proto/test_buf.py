"""The wire contract passes `buf lint` (STANDARD rules) and `buf breaking` (FILE rules) against the
released image proto/released/dualloop.binpb: changes within dualloop.v2 stay additive."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.paths import REPO_ROOT

BUF = REPO_ROOT / "tools" / "buf" / "node_modules" / ".bin" / "buf"
PROTO = REPO_ROOT / "proto"
RELEASED = PROTO / "released" / "dualloop.binpb"

if not BUF.exists():
    reason = "buf is not installed: run `npm ci --prefix tools/buf` (make test does when npm exists)"
    if os.environ.get("DUALLOOP_REQUIRE_NODE") == "1":
        raise RuntimeError(reason)  # CI installs it: a missing buf there is a broken build, not a skip
    pytest.skip(reason, allow_module_level=True)


def buf(*args: str, cwd: Path = PROTO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BUF), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_buf_lint_passes():
    result = buf("lint")
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_breaking_change_against_the_released_contract():
    result = buf("breaking", "--against", str(RELEASED))
    assert result.returncode == 0, result.stdout + result.stderr


def _copy_proto(tmp_path: Path) -> Path:
    copy = tmp_path / "proto"
    shutil.copytree(PROTO, copy, ignore=shutil.ignore_patterns("*.py", "*.pyi", "__pycache__", "released"))
    return copy


def test_a_removed_field_is_caught(tmp_path):
    """The check can fail: dropping a released field (the snapshot's safety state) is breaking."""
    copy = _copy_proto(tmp_path)
    controller = copy / "dualloop" / "v2" / "controller.proto"
    text = controller.read_text()
    assert "  SafetyState safety_state = 14;\n" in text
    controller.write_text(text.replace("  SafetyState safety_state = 14;\n", "  reserved 14;\n"))
    result = buf("breaking", "--against", str(RELEASED), cwd=copy)
    assert result.returncode != 0 and "safety_state" in result.stdout, result.stdout + result.stderr


def test_an_unprefixed_enum_value_fails_lint(tmp_path):
    copy = _copy_proto(tmp_path)
    controller = copy / "dualloop" / "v2" / "controller.proto"
    controller.write_text(controller.read_text().replace("CLOCK_MODE_LOCKSTEP = 2;", "LOCKSTEP = 2;"))
    result = buf("lint", cwd=copy)
    assert result.returncode != 0 and "LOCKSTEP" in result.stdout, result.stdout + result.stderr
