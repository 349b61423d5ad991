"""A gate or model file the process may not read is said so, with its uid and the chmod that fixes it
(a gate said "not an .npz archive", a model onnxruntime's "system error number 13")."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.paths import REPO_ROOT

NOBODY = 65534

# Root reads a file whatever its mode, so the probe drops to `nobody` itself, after its imports: the
# interpreter here lives under /root (mode 0700), so a child started as nobody (preexec_fn) cannot even
# import its standard library.
_PROBE = """
import os, sys
from pathlib import Path
from dualloop.controller.contract.gate_files import read_gate
from dualloop.executor.model_runner import DecisionModel
if os.geteuid() == 0:
    os.setuid({uid})
for load in (lambda: read_gate(Path("base.gate.npz")), lambda: DecisionModel("base.onnx", warmup_batches=())):
    try:
        load()
        print("loaded")
    except Exception as err:
        print(err)
"""


@pytest.fixture
def unreadable() -> Iterator[Path]:
    # not pytest's tmp_path: its parents are 0700, so nobody could not reach the files at all
    folder = Path(tempfile.mkdtemp(prefix="dualloop-unreadable-"))
    try:
        folder.chmod(0o755)
        for name in ("base.gate.npz", "base.onnx"):
            shutil.copy(REPO_ROOT / "models" / name, folder / name)
            (folder / name).chmod(0)  # unreadable to all but root
        yield folder
    finally:
        shutil.rmtree(folder)


def test_an_unreadable_gate_and_model_name_the_uid_and_the_chmod(unreadable: Path) -> None:
    uid = NOBODY if os.geteuid() == 0 else os.geteuid()
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE.format(uid=uid)],
        cwd=unreadable,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    gate, model = proc.stdout.splitlines()
    assert gate == (
        f"gate file base.gate.npz: cannot read it (Permission denied); this process runs as uid {uid}: "
        "make it readable (chmod a+r base.gate.npz)"
    )
    assert model == (
        f"base.onnx: cannot read it (Permission denied); this process runs as uid {uid}: "
        "make it readable (chmod a+r base.onnx)"
    )
