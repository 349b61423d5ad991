"""Revocation fails closed: a real `dualloop serve` whose tokens file is rotated, broken, deleted
and emptied mid-run refuses every token until a good file is read, and says so (log, metrics)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc
from tests.controller.serve.test_metrics import scrape, value
from tests.paths import REPO_ROOT

TOKEN_A = "tok-a-0123456789abcdef"  # leaked: the rotation removes it
TOKEN_B = "tok-b-fedcba9876543210"
WAIT_S = 60.0  # the file is checked every second; a loaded CI machine may take much longer to answer


class Server:
    def __init__(self, proc: subprocess.Popen, address: str, metrics_port: int, stderr: Path) -> None:
        self.proc, self.address, self.metrics_port, self.stderr = proc, address, metrics_port, stderr

    def code(self, token: str) -> grpc.StatusCode:
        """GetModelInfo with this token on a fresh channel: OK or the refusal's code."""
        with grpc.insecure_channel(self.address) as channel:
            try:
                pb_grpc.ControllerServiceStub(channel).GetModelInfo(
                    pb.GetModelInfoRequest(), timeout=20, metadata=(("authorization", f"Bearer {token}"),)
                )
            except grpc.RpcError as err:
                return err.code()
        return grpc.StatusCode.OK

    def tokens_metrics(self) -> tuple[float, float]:
        samples, _ = scrape(self.metrics_port)
        return value(samples, "dualloop_tokens_file_broken"), value(samples, "dualloop_tokens_reload_failures_total")


def wait_for(what: str, condition: Callable[[], bool]) -> None:
    end = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > end:
            pytest.fail(f"not within {WAIT_S:.0f} s: {what}")
        time.sleep(0.1)


def replace(path: Path, text: str) -> None:
    """The rotation the docs ask for: a new file renamed over the old one."""
    new = path.with_name(path.name + ".new")
    new.write_text(text)
    new.replace(path)


@pytest.fixture()
def serve(test_model_path: Path, tmp_path: Path) -> Iterator[tuple[Server, Path]]:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN_A}\n{TOKEN_B}\n")
    stderr = tmp_path / "serve.err"
    cmd = [sys.executable, "-m", "dualloop.controller.cli", "serve", "--model", str(test_model_path), "--port", "0"]
    cmd += ["--tokens-file", str(tokens), "--metrics-port", "0"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUALLOOP_")} | {"COLUMNS": "300"}
    with open(stderr, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, cwd=REPO_ROOT, env=env)
    try:
        assert proc.stdout is not None
        start, metrics = proc.stdout.readline(), proc.stdout.readline()
        port = re.search(r" on 127\.0\.0\.1:(\d+)", start)
        mport = re.search(r"metrics: http://127\.0\.0\.1:(\d+)/metrics", metrics)
        assert port and mport, (start, metrics, stderr.read_text())
        yield Server(proc, f"127.0.0.1:{port.group(1)}", int(mport.group(1)), stderr), tokens
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, stderr.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


OK, REFUSED = grpc.StatusCode.OK, grpc.StatusCode.UNAUTHENTICATED


def test_a_broken_rotation_refuses_every_token_until_a_good_file_is_read(serve):
    srv, tokens = serve
    assert srv.code(TOKEN_A) == OK and srv.code(TOKEN_B) == OK
    assert srv.tokens_metrics() == (0, 0)

    # the edit that removes the leaked token A also has a bad line: A must not stay valid (nor B)
    replace(tokens, f"{TOKEN_B}\nshort\n")
    wait_for("token A refused after a broken rotation", lambda: srv.code(TOKEN_A) == REFUSED)
    assert srv.code(TOKEN_B) == REFUSED
    assert srv.tokens_metrics() == (1, 1)
    log = srv.stderr.read_text()
    assert re.search(r"ERROR.*line 2: token shorter than 16.*refusing every token", log), log

    replace(tokens, f"{TOKEN_B}\n")  # fixed: B admitted again, A stays revoked
    wait_for("token B admitted once the file is fixed", lambda: srv.code(TOKEN_B) == OK)
    assert srv.code(TOKEN_A) == REFUSED
    assert srv.tokens_metrics() == (0, 1)

    tokens.unlink()  # deleted: nobody until it is back
    wait_for("every token refused once the file is deleted", lambda: srv.code(TOKEN_B) == REFUSED)
    assert srv.tokens_metrics() == (1, 2)
    replace(tokens, f"{TOKEN_B}\n")  # the same content as before the deletion is read again
    wait_for("token B admitted once the file is back", lambda: srv.code(TOKEN_B) == OK)

    replace(tokens, "# nobody for now\n")  # empty: nobody, the documented meaning at start too
    wait_for("every token refused by an empty file", lambda: srv.code(TOKEN_B) == REFUSED)
    assert srv.tokens_metrics() == (1, 3)
    assert "no token in it; refusing every token" in srv.stderr.read_text()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_an_unreadable_tokens_file_refuses_every_token(serve):
    srv, tokens = serve
    assert srv.code(TOKEN_B) == OK
    new = tokens.with_name("tokens.new")
    new.write_text(f"{TOKEN_B}\n")
    new.chmod(0)  # before it is in place: the server never sees it readable
    new.replace(tokens)
    wait_for("every token refused once the file is unreadable", lambda: srv.code(TOKEN_B) == REFUSED)
    assert srv.tokens_metrics()[0] == 1
    assert re.search(r"ERROR.*cannot read.*refusing every token", srv.stderr.read_text())
    tokens.chmod(0o600)
    os.utime(tokens)  # a chmod alone does not change what the server watches (mtime, size)
    wait_for("token B admitted once the file is readable", lambda: srv.code(TOKEN_B) == OK)
