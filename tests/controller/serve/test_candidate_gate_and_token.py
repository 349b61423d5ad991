"""LoadCandidate with a damaged gate file answers INVALID_ARGUMENT (docs/contract.md: a gate file
that cannot be read), and `dualloop admin` refused for want of a token says where it reads one."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from dualloop.controller.serve.config import ServerConfig
from dualloop.controller.serve.lifecycle import ServerThread
from dualloop.controller.serve.security import AuthConfig
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc

ADMIN = "admin-token-0123456789abcdef"
ADMIN_MD = (("authorization", f"Bearer {ADMIN}"),)


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[ServerThread]:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"admin:{ADMIN}\n")
    auth = AuthConfig(tokens_file=tokens, tokens_env=None)
    srv = ServerThread(ServerConfig(model=BASE_MODEL_PATH, gates=list(DEFAULT_GATES), port=0, auth=auth)).start()  # type: ignore[call-arg]
    yield srv
    srv.stop()


def test_a_damaged_gate_file_is_invalid_argument(server: ServerThread, tmp_path: Path) -> None:
    data = bytearray(DEFAULT_GATES[0].read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    flipped = tmp_path / "flip.gate.npz"
    flipped.write_bytes(bytes(data))
    request = pb.LoadCandidateRequest(model_path=str(BASE_MODEL_PATH), gate_paths=[str(flipped), str(DEFAULT_GATES[1])])
    with grpc.insecure_channel(server.address) as channel:
        with pytest.raises(grpc.RpcError) as err:
            pb_grpc.ControllerServiceStub(channel).LoadCandidate(request, metadata=ADMIN_MD, timeout=120)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert str(flipped) in (err.value.details() or "")
    assert server.server.executor.candidate is None


def test_admin_without_a_token_names_the_variable_it_reads(server: ServerThread) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DUALLOOP_ADMIN_TOKEN"}
    cmd = [sys.executable, "-m", "dualloop.controller.cli", "admin", "promote", "--address", server.address]
    refused = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    out = " ".join(refused.stdout.split())
    assert refused.returncode == 1 and "UNAUTHENTICATED" in out, out + refused.stderr
    assert "$DUALLOOP_ADMIN_TOKEN is unset or empty" in out and "--token-env" in out, out
    # a token that was sent (and is wrong) is not said to be missing
    env["DUALLOOP_ADMIN_TOKEN"] = "wrong-token-0123456789abcdef"
    wrong = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 1 and "UNAUTHENTICATED" in wrong.stdout and "unset" not in wrong.stdout
