"""What a server refuses at start says so once, and says what to do: another model's gate, a record_dir
the process may not write to."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from dualloop.controller.contract.errors import ConfigError
from dualloop.controller.serve.config import ServerConfig
from dualloop.controller.serve.lifecycle import ServerLifecycle
from tests.paths import REPO_ROOT

NOBODY = 65534


def test_another_models_gate_names_its_file_once(test_model_path: Path) -> None:
    gate = REPO_ROOT / "models" / "base.gate.npz"  # fitted on the shipped model, not the test model
    with pytest.raises(ConfigError) as refused:
        ServerLifecycle(ServerConfig(model=test_model_path, gates=[gate], port=0))
    message = str(refused.value)
    assert message.startswith(f"gate file {gate}: fitted on model dualloop-base"), message
    assert message.count(str(gate)) == 1, message  # was "gate P: gate file P: ..."


# Root writes anywhere, so the probe drops to `nobody` after its imports (the interpreter lives under
# /root, mode 0700: a child started as nobody could not import its standard library).
_PROBE = """
import os, sys
from pathlib import Path
from dualloop.controller.serve.lifecycle import _check_writable
if os.geteuid() == 0:
    os.setuid({uid})
try:
    _check_writable(Path(sys.argv[1]))
    print("writable")
except Exception as err:
    print(err)
"""


def test_a_record_dir_it_may_not_write_names_the_uid_and_the_remedy() -> None:
    uid = NOBODY if os.geteuid() == 0 else os.geteuid()
    folder = Path(tempfile.mkdtemp(prefix="dualloop-records-"))
    try:
        folder.chmod(0o555)  # readable, not writable (by root's children: root is dropped below)
        proc = subprocess.run(
            [sys.executable, "-c", _PROBE.format(uid=uid), str(folder)], capture_output=True, text=True, timeout=120
        )
    finally:
        folder.chmod(0o755)
        shutil.rmtree(folder)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (
        f"record_dir (--record-dir) {folder}: cannot write there: Permission denied; this process runs as "
        f"uid {uid}: give it the folder (chown {uid} {folder}) or mount a volume it owns"
    )
