"""README's client snippet, run as written against a live server: it reads the stream to its end, so
the server ends the session OK (it ended on `session.close()`, and the server logged every normal
drive as code=CANCELLED once the script exited)."""

from __future__ import annotations

import re

import grpc

from dualloop.controller.serve.lifecycle import ServerThread
from tests.paths import REPO_ROOT


def _snippet() -> str:
    readme = (REPO_ROOT / "README.md").read_text()
    (code,) = [block for block in re.findall(r"```python\n(.*?)```", readme, re.S) if "DriveSession(" in block]
    return str(code)


def test_the_readme_client_reads_its_session_to_the_end(shipped_server: ServerThread, capsys) -> None:
    features = shipped_server.server.executor.card.features
    drive = [[f.mean for f in features] for _ in range(10)]  # 50 ms of a steady, typical reading
    code = _snippet().replace("127.0.0.1:50151", shipped_server.address)
    namespace: dict[str, object] = {"drive": drive}
    exec(compile(code, "README.md", "exec"), namespace)
    assert len(capsys.readouterr().out.splitlines()) == 1 + len(drive)  # the features, then a line a tick
    call = namespace["session"]._call  # type: ignore[attr-defined]
    # where the script ends, the stream has ended, with the server's OK: exiting cancels nothing
    assert call.done() and call.code() == grpc.StatusCode.OK
    namespace["channel"].close()  # type: ignore[attr-defined]
