"""The Node client in clients/node (built only from proto/) against a live server.

Skips without node or without clients/node/node_modules (`npm ci --prefix clients/node`), unless
DUALLOOP_REQUIRE_NODE=1 (CI sets it): then a missing Node is a failure, not a skip.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dualloop.controller.serve.config import ServerConfig
from dualloop.controller.serve.lifecycle import ServerThread
from dualloop.controller.serve.security import AuthConfig
from dualloop.executor.model_runner import DecisionModel
from dualloop.executor.snapshot import WALL_CLOCK_FIELDS
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES
from tests.paths import REPO_ROOT

NODE_CLIENT = REPO_ROOT / "clients" / "node"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def node() -> str:
    path = shutil.which("node")
    missing = (
        "node is not on PATH"
        if path is None
        else "clients/node/node_modules is missing: run `npm ci --prefix clients/node`"
        if not (NODE_CLIENT / "node_modules" / "@grpc" / "grpc-js").is_dir()
        else None
    )
    if missing is not None:
        if os.environ.get("DUALLOOP_REQUIRE_NODE") == "1":
            pytest.fail(f"DUALLOOP_REQUIRE_NODE=1 but {missing}")
        pytest.skip(missing)
    assert path is not None
    return path


def run_node(node: str, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [node, str(NODE_CLIENT / script), *args], capture_output=True, text=True, timeout=180, cwd=NODE_CLIENT
    )


def summary_of(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """check.mjs ends with one JSON line."""
    lines = result.stdout.strip().splitlines()
    assert lines, f"no output; stderr: {result.stderr}"
    summary: dict[str, Any] = json.loads(lines[-1])
    return summary


def test_node_client_checks_a_live_server(node: str, shipped_server: ServerThread) -> None:
    # The wall-clock fields come from the server's own list, so a new one is excluded here too.
    result = run_node(node, "check.mjs", shipped_server.address, "--wall-clock-fields", ",".join(WALL_CLOCK_FIELDS))
    assert result.returncode == 0, result.stdout + result.stderr
    summary = summary_of(result)
    assert summary["ok"] and summary["failures"] == []
    lockstep = summary["lockstep"]
    # 3 s of sensor time at 10 Hz on 5 ms ticks: 29 * 20 + 1 snapshots, identical in both sessions
    assert lockstep["identical"] and lockstep["snapshots"] == 581
    # the out-of-distribution stretch and the stale plan take the safe-state machine through its states
    states = set(lockstep["safety_states"])
    assert {"SAFETY_STATE_NOMINAL", "SAFETY_STATE_VETO_HOLD"} <= states and len(states) >= 3, states
    realtime = summary["realtime"]
    assert realtime["window_bytes"] == 8192 and realtime["snapshots"] > 0
    for stall in ("paused_reader", "busy_event_loop"):
        assert realtime[stall]["backlog"] < realtime[stall]["ticks"] / 2
    assert summary["bad_inputs"] == {
        "wrong feature count": "INVALID_ARGUMENT",
        "first message not open": "INVALID_ARGUMENT",
        "unknown clock": "INVALID_ARGUMENT",
        "unknown provided feature": "INVALID_ARGUMENT",
        "seq not increasing": "INVALID_ARGUMENT",
        "LOCKSTEP time going back": "INVALID_ARGUMENT",
        "schema hash mismatch": "FAILED_PRECONDITION",
        "session id already open": "ALREADY_EXISTS",
    }


def test_node_determinism_check_sees_wall_clock_fields(node: str, shipped_server: ServerThread) -> None:
    """The byte comparison bites: with `timings` not excluded, two identical runs differ."""
    fields = "emit_time_ns,lateness_us"
    result = run_node(node, "check.mjs", shipped_server.address, "--only", "lockstep", "--wall-clock-fields", fields)
    summary = summary_of(result)
    assert result.returncode == 1 and not summary["lockstep"]["identical"]
    assert summary["failures"] == [
        "LOCKSTEP byte-identical apart from wall-clock fields: first difference at snapshot 0"
    ]


def test_node_example_runs(node: str, shipped_server: ServerThread) -> None:
    """The minimal example docs/contract.md quotes."""
    result = run_node(node, "example.mjs", shipped_server.address)
    assert result.returncode == 0, result.stdout + result.stderr
    last = result.stdout.strip().splitlines()[-1]
    actions = shipped_server.server.executor.card.actions
    assert last.startswith("last: ") and last.split()[1] in actions, result.stdout
    # a steady cruise: a first-time user sees it driven, not vetoed into a fallback
    assert last.endswith("SAFETY_STATE_NOMINAL") and "OOD_VETO" not in result.stdout, result.stdout


@pytest.fixture(scope="module")
def token_server(base_model: DecisionModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """A server that wants a token, which the examples do not send."""
    tokens: Path = tmp_path_factory.mktemp("auth") / "tokens"
    tokens.write_text("client-token-0123456789abcdef\n")
    auth = AuthConfig(tokens_file=tokens, tokens_env=None)
    config = ServerConfig(model=BASE_MODEL_PATH, gates=list(DEFAULT_GATES), port=0, auth=auth)
    with ServerThread(config, base_model) as srv:
        yield srv


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """A failure said in one line on stderr, not a stack trace (grpc-js's errors carry a 20-line one)."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "    at " not in result.stderr, result.stderr
    return lines[0]


@pytest.mark.parametrize("args", [(), ("",)], ids=["no argument", "empty address"])
def test_node_example_without_an_address_prints_its_usage(node: str, args: tuple[str, ...]) -> None:
    result = run_node(node, "example.mjs", *args)
    assert result.returncode == 2 and one_line(result).startswith("usage: ") and "HOST:PORT" in result.stderr


def test_node_example_reports_an_unreachable_server(node: str) -> None:
    result = run_node(node, "example.mjs", "127.0.0.1:1")
    assert result.returncode == 1 and one_line(result).startswith("UNAVAILABLE: "), result.stderr


def test_node_example_reports_a_refusal(node: str, token_server: ServerThread) -> None:
    """GetModelInfo refused: the status and the server's message, which says what it requires."""
    result = run_node(node, "example.mjs", token_server.address)
    line = one_line(result)
    assert result.returncode == 1 and line.startswith("UNAUTHENTICATED: ") and "token" in line, result.stderr


def test_node_check_names_the_status_of_a_refusal(node: str, token_server: ServerThread) -> None:
    result = run_node(node, "check.mjs", token_server.address)
    assert result.returncode == 1
    [failure] = summary_of(result)["failures"]
    assert failure.startswith("no unexpected error: UNAUTHENTICATED: ") and "    at " not in failure, failure
