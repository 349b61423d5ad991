"""`dualloop highway`: arguments that would make nothing real run are refused in one line, exit 2,
before a server starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.paths import REPO_ROOT


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--max-seconds", "0"), "--max-seconds 0.0"),  # ran 1 s episodes
        (("--max-seconds", "-3"), "--max-seconds -3.0"),
        (("--max-seconds", "inf"), "--max-seconds inf"),
        (("--envs", ""), "--envs '': names no env"),  # an empty table, exit 0
        (("--envs", "nope"), "--envs: unknown nope"),
        (("--seeds", "0"), "--seeds 0"),
        (("--model", "/nonexistent.onnx"), "--model /nonexistent.onnx: no such file"),  # "within 120 s"
        (("--gate", "/nonexistent.npz"), "--gate /nonexistent.npz: no such file"),
    ],
)
def test_highway_refuses_a_bad_argument_in_one_line(args: tuple[str, ...], named: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "dualloop", "highway", "--envs", "highway", "--seeds", "1", *args],
        capture_output=True,
        text=True,
        timeout=120,  # an upper bound: the old code ran the episodes
        cwd=REPO_ROOT,
    )
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and named in lines[0], out.stderr
