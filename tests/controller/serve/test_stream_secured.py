"""`dualloop stream --address` to a server with TLS and tokens, as docs/operations.md deploys a shadow
stack: --ca-file and --token-env as `dualloop admin` takes them (the same code), and a refusal that
says which option is missing (found by QA: stream had no such options and answered a bare
UNAUTHENTICATED)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from dualloop.controller.cli import main
from dualloop.controller.logs.logfile import read_sessions
from dualloop.controller.logs.synthetic import REAL_DRIVE
from dualloop.controller.serve.lifecycle import ServerThread
from dualloop.controller.serve.log_stream import stream_logs
from dualloop.controller.serve.security import AuthConfig
from dualloop.planner.tls import ServerTLS
from tests.controller.serve.servers import shipped
from tests.controller.serve.tls_certs import TestCA

SHADOW_TOKEN = "shadow-token-0123456789abcdef"
ADMIN_TOKEN = "admin-token-0123456789abcdef"


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(tmp_path_factory.mktemp("pki"), "ca")


@pytest.fixture(scope="module")
def secured(ca: TestCA, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    tokens = tmp_path_factory.mktemp("auth") / "tokens"
    tokens.write_text(f"shadow:{SHADOW_TOKEN}\nadmin:{ADMIN_TOKEN}\n")
    server = ca.server_cert()
    tls = ServerTLS(cert_file=server.cert_file, key_file=server.key_file)
    with shipped(tls=tls, auth=AuthConfig(tokens_file=tokens, tokens_env=None)) as srv:
        yield srv


@pytest.fixture(scope="module")
def tokens_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """QA's server: tokens on plaintext loopback."""
    tokens = tmp_path_factory.mktemp("auth") / "tokens"
    tokens.write_text(f"shadow:{SHADOW_TOKEN}\n")
    with shipped(auth=AuthConfig(tokens_file=tokens, tokens_env=None)) as srv:
        yield srv


def stream(server: ServerThread, *flags: str, token_env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """The command in its own process, as a shadow stack runs it: its exit code, stdout and stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUALLOOP_")} | (token_env or {})
    # every 10th observation at 20x: a few hundred observations in 3 s, enough to see them decided
    cmd = [sys.executable, "-m", "dualloop.controller.cli", "stream", str(REAL_DRIVE), "--address", server.address]
    done = subprocess.run(
        [*cmd, "--every", "10", "--speed", "20", *flags], env=env, capture_output=True, text=True, timeout=120
    )
    return done.returncode, done.stdout, done.stderr


def test_a_shadow_token_over_tls_streams(secured: ServerThread, ca: TestCA) -> None:
    flags = ("--ca-file", str(ca.cert_file), "--token-env", "SHADOW_STACK_TOKEN")
    code, out, err = stream(secured, *flags, token_env={"SHADOW_STACK_TOKEN": SHADOW_TOKEN})
    assert code == 0, out + err
    summary = next(line for line in out.splitlines() if " snapshots; " in line)
    sent, snapshots = (int(summary.split(f" {what}")[0].split()[-1]) for what in ("observations sent", "snapshots;"))
    assert sent > 100 and snapshots > 0, summary


def test_no_token_names_the_variable_and_the_option(secured: ServerThread, ca: TestCA) -> None:
    code, out, err = stream(secured, "--ca-file", str(ca.cert_file))
    lines = err.splitlines()
    assert code == 1 and len(lines) == 1 and "UNAUTHENTICATED" in lines[0], out + err
    assert "$DUALLOOP_STREAM_TOKEN is unset or empty" in lines[0] and "--token-env" in lines[0], lines


def test_a_plaintext_token_server_says_which_option(tokens_only: ServerThread) -> None:
    code, out, err = stream(tokens_only)
    assert code == 1 and "UNAUTHENTICATED" in err and "--token-env" in err, out + err
    code, out, err = stream(tokens_only, token_env={"DUALLOOP_STREAM_TOKEN": SHADOW_TOKEN})
    assert code == 0, out + err


def test_a_refused_caller_gets_the_servers_status_not_internal(tokens_only: ServerThread) -> None:
    """A Drive call refused before the server reads it could fail its first write with gRPC's own
    "INTERNAL: Internal error from Core" (half the time with 16 sessions): the refusal must be the
    server's UNAUTHENTICATED every time."""
    drive = [d for d in read_sessions(REAL_DRIVE).values() if d.observations]

    async def refusals() -> list[str]:
        codes = []
        for _ in range(10):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stream_logs(tokens_only.address, drive, sessions_per_log=16)
            codes.append(f"{refused.value.code().name}: {refused.value.details()}")
        return codes

    codes = asyncio.run(refusals())
    assert all(c.startswith("UNAUTHENTICATED: ") for c in codes), codes


def test_a_wrong_token_is_not_said_to_be_missing(secured: ServerThread, ca: TestCA) -> None:
    wrong = {"DUALLOOP_STREAM_TOKEN": "wrong-token-0123456789abcdef"}
    code, out, err = stream(secured, "--ca-file", str(ca.cert_file), token_env=wrong)
    assert code == 1 and "UNAUTHENTICATED" in err and "unset" not in err, out + err


def test_plaintext_to_a_tls_server_names_ca_file(secured: ServerThread) -> None:
    # a plaintext client never gets as far as UNAUTHENTICATED: the TLS server closes the connection
    code, out, err = stream(secured, token_env={"DUALLOOP_STREAM_TOKEN": SHADOW_TOKEN})
    lines = err.splitlines()
    assert code == 1 and len(lines) == 1 and "UNAVAILABLE" in lines[0] and "--ca-file" in lines[0], out + err


@pytest.mark.parametrize("content", [None, "not a certificate\n"])
def test_an_unusable_ca_file_is_named(
    secured: ServerThread, tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None
) -> None:
    ca_file = tmp_path / "ca.pem"
    if content is not None:
        ca_file.write_text(content)
    assert main(["stream", str(REAL_DRIVE), "--address", secured.address, "--ca-file", str(ca_file)]) == 2
    assert f"--ca-file {ca_file}: " in capsys.readouterr().err


def test_ca_file_without_address_is_refused(ca: TestCA, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stream", str(REAL_DRIVE), "--ca-file", str(ca.cert_file)]) == 2
    assert "--ca-file goes with --address" in capsys.readouterr().err


def test_admin_over_tls_through_the_same_options(secured: ServerThread, ca: TestCA) -> None:
    """admin's --ca-file and --token-env, now shared with stream, still reach the server: authenticated,
    it gets as far as the admin RPC's own refusal."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUALLOOP_")}
    env["DUALLOOP_ADMIN_TOKEN"] = ADMIN_TOKEN
    cmd = [sys.executable, "-m", "dualloop.controller.cli", "admin", "promote", "--address", secured.address]
    done = subprocess.run([*cmd, "--ca-file", str(ca.cert_file)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "FAILED_PRECONDITION: no candidate loaded" in done.stdout, done.stdout + done.stderr
