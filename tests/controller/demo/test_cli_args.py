"""demo-traffic and demo-safety: a bad argument refused in one line (exit 2) before any run; --json
strict JSON, written into a folder made for it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dualloop.sim.scenarios import SCENARIOS
from tests.paths import REPO_ROOT


def refused(*args: str) -> str:
    """The one stderr line of `dualloop ARGS`, which must exit 2 at once (the timeout: an upper
    bound for the old runs a bad value started, not a timing)."""
    out = subprocess.run(
        [sys.executable, "-m", "dualloop", *args], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT
    )
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), out.stderr + out.stdout
    return lines[0]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--duration", "0"), "--duration 0.0"),  # ran the scenario's whole 25 s
        (("--duration", "-1"), "--duration -1.0"),  # ran nothing, exit 0
        (("--duration", "nan"), "--duration nan"),  # a traceback
        (("--seeds", "-5"), "--seeds '-5'"),  # a traceback from numpy
        (("--seeds", "1,x"), "--seeds '1,x'"),
        # an empty $SEEDS ran the three held-out seeds (here, with --duration, a short run and exit 0)
        (("--seeds", "", "--duration", "0.01"), "--seeds '': empty; give comma-separated integers"),
        (("--model", "/nonexistent.onnx"), "--model /nonexistent.onnx: no such file"),  # "did not start within 120 s"
        (("--gate", "/nonexistent.npz"), "--gate /nonexistent.npz: no such file"),
    ],
)
def test_demo_traffic_refuses_a_bad_argument_in_one_line(args: tuple[str, ...], named: str) -> None:
    assert named in refused("demo-traffic", "--seeds", "1", *args)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--seeds", "0"), "--seeds 0: must be at least 1"),  # an IndexError
        (("--seeds", "-1"), "--seeds -1: must be at least 1"),  # ran 7 seeds
        (("--scenarios", "foo"), "unknown foo"),  # a KeyError traceback
        (("--scenarios", ","), "names no scenario"),
        (("--gate", "/nonexistent.npz"), "--gate /nonexistent.npz: no such file"),
    ],
)
def test_demo_safety_refuses_a_bad_argument_in_one_line(args: tuple[str, ...], named: str) -> None:
    line = refused("demo-safety", *args)
    assert named in line
    if "--scenarios" in args:
        assert all(name in line for name in SCENARIOS)  # the valid names, to pick from


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--scenarios", "foo"), "--scenarios 'foo': unknown foo"),  # a KeyError traceback
        (("--duration", "0"), "--duration 0.0"),  # ran the scenarios' whole durations
        (("--model", "/nonexistent.onnx"), "--model /nonexistent.onnx: no such file"),
    ],
)
def test_demo_refuses_a_bad_argument_in_one_line(tmp_path: Path, args: tuple[str, ...], named: str) -> None:
    assert named in refused("demo", "--scenarios", "nominal_cruise", "--out", str(tmp_path), *args)


@pytest.mark.parametrize(
    "command",
    [
        ("demo-traffic", "--seeds", "1", "--duration", "0.01"),
        ("demo-safety", "--seeds", "1", "--scenarios", "sensor_dropout"),
    ],
)
def test_a_json_path_that_cannot_be_written_is_refused_naming_json(tmp_path: Path, command: tuple[str, ...]) -> None:
    """Each was a bare "[Errno N] ..." naming no flag."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    under_a_file = blocker / "rows.json"
    line = refused(*command, "--json", str(under_a_file))
    assert line == f"error: --json {under_a_file}: {blocker} is a file, not a folder; give a path in a folder"
    assert f"error: --json {tmp_path}: is a folder" in refused(*command, "--json", str(tmp_path))
    if Path("/proc/self").is_dir():  # Linux: a folder no one can make, whatever the user
        assert "error: --json /proc/x/rows.json: cannot make the folder /proc/x (" in refused(
            *command, "--json", "/proc/x/rows.json"
        )


def strict(text: str) -> object:
    def no_constant(name: str) -> None:
        raise AssertionError(f"{name} is not JSON")

    return json.loads(text, parse_constant=no_constant)


@pytest.mark.slow
def test_demo_traffic_json_is_strict_and_its_folder_is_made(tmp_path: Path) -> None:
    """A LOCKSTEP row has no snapshot lateness: null, not NaN (JSON.parse refuses NaN); the file's
    folder did not exist (the whole run, then an error). Nor has it the server's deadline figures
    (they read 0, as if every tick was on time); its server ticks are its snapshots' (they read 0:
    GetStats counts REALTIME ticks only)."""
    out = tmp_path / "new" / "folder" / "rows.json"
    args = ["demo-traffic", "--seeds", "1", "--duration", "0.5", "--no-gate", "--json", str(out)]
    run = subprocess.run([sys.executable, "-m", "dualloop", *args], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    rows = strict(out.read_text())
    assert isinstance(rows, list) and rows[0]["clock"] == "lockstep" and rows[0]["snapshot_lateness_p99_us"] is None
    row = rows[0]
    assert row["ticks"] == 100 and row["server_ticks"] == 100
    for name in ("missed_deadlines", "server_lateness_p99_us", "server_lateness_max_us", "client_behind"):
        assert row[name] is None, name
    table = [[c.strip() for c in line.split("│")] for line in run.stdout.splitlines()]
    cells = next(c for c in table if c[1:3] == ["1", "lockstep"])
    assert cells[10:15] == ["-"] * 5, run.stdout  # missed, late p99, late max, snap late p99, client behind


@pytest.mark.slow
def test_demo_safety_json_is_strict_its_folder_made_and_its_table_has_no_none(tmp_path: Path) -> None:
    """sensor_dropout is no forced-veto run: it has no least lead gap, a dash in the table (was None)."""
    out = tmp_path / "new" / "figures.json"
    args = ["demo-safety", "--seeds", "1", "--scenarios", "sensor_dropout", "--json", str(out)]
    run = subprocess.run([sys.executable, "-m", "dualloop", *args], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    row = next(line for line in run.stdout.splitlines() if "sensor_dro" in line)  # the name may be cut short
    assert "None" not in run.stdout and row.split("│")[-2].strip() == "-", run.stdout
    figures = strict(out.read_text())
    assert isinstance(figures, dict) and figures["summary"][0]["min_lead_gap_m"] is None
