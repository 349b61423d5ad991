"""Values that parse but mean nothing: an empty path (an unset ${VAR} in a compose or systemd file),
and nan or infinity in a number. Both are refused, naming the flag, the variable or the file's field."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dualloop.controller.contract.errors import ConfigError
from dualloop.controller.serve.config import load_server_config


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # the developer's or CI's own DUALLOOP_* settings must not leak into these tests
    for name in list(os.environ):
        if name.startswith("DUALLOOP_"):
            monkeypatch.delenv(name)


EMPTY = "is empty: give a path, or leave the setting out"


def test_an_empty_record_dir_is_refused_not_taken_as_the_working_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, test_model_path: Path
) -> None:
    """Found by QA: DUALLOOP_RECORD_DIR= (or --record-dir "") recorded into the working folder."""
    monkeypatch.setenv("DUALLOOP_RECORD_DIR", "")
    with pytest.raises(ConfigError, match=rf"DUALLOOP_RECORD_DIR \(record_dir\): {EMPTY}"):
        load_server_config(model=test_model_path)
    monkeypatch.delenv("DUALLOOP_RECORD_DIR")
    with pytest.raises(ConfigError, match=rf"--record-dir \(record_dir\): {EMPTY}"):
        load_server_config(model=test_model_path, record_dir="")
    file = tmp_path / "server.toml"
    file.write_text(f'model = "{test_model_path}"\nrecord_dir = ""\n')
    with pytest.raises(ConfigError, match=rf"server.toml: invalid configuration\n  record_dir: {EMPTY}"):
        load_server_config(file)
    monkeypatch.setenv("DUALLOOP_MODEL", "")  # the report's other case: it said only ".: model file not found"
    with pytest.raises(ConfigError, match=rf"DUALLOOP_MODEL \(model\): {EMPTY}"):
        load_server_config()
    monkeypatch.setenv("DUALLOOP_GATES", '["g.gate.npz", ""]')
    with pytest.raises(ConfigError, match=rf"DUALLOOP_GATES \(gates.1\): {EMPTY}"):
        load_server_config(model=test_model_path)


def test_the_record_dir_flag_given_empty_is_refused_before_anything_is_recorded(
    tmp_path: Path, test_model_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUALLOOP_")}
    cmd = [sys.executable, "-m", "dualloop.controller.cli", "serve", "--model", str(test_model_path), "--port", "0"]
    for args, extra_env, named in (
        (["--record-dir", ""], {}, "--record-dir (record_dir)"),
        ([], {"DUALLOOP_RECORD_DIR": ""}, "DUALLOOP_RECORD_DIR (record_dir)"),
    ):
        done = subprocess.run(
            [*cmd, *args], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env | extra_env
        )
        assert done.returncode == 2, done
        assert f"{named}: {EMPTY}" in done.stderr, done.stderr
        assert list(tmp_path.iterdir()) == []  # nothing recorded into the working folder


def test_nan_and_infinity_are_refused_as_not_finite_everywhere_in_the_configuration(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, test_model_path: Path
) -> None:
    """Found by QA: DUALLOOP_EXECUTOR__TICK_PERIOD_MS=nan said "less than or equal to 1000"; inf passed
    every bound (a keepalive, a drain grace, a safety limit of forever)."""
    finite = "Input should be a finite number"
    monkeypatch.setenv("DUALLOOP_EXECUTOR__TICK_PERIOD_MS", "nan")
    with pytest.raises(ConfigError, match=rf"DUALLOOP_EXECUTOR__TICK_PERIOD_MS \(executor.tick_period_ms\): {finite}"):
        load_server_config(model=test_model_path)
    monkeypatch.setenv("DUALLOOP_EXECUTOR__TICK_PERIOD_MS", "5")
    monkeypatch.setenv("DUALLOOP_KEEPALIVE_S", "inf")
    with pytest.raises(ConfigError, match=rf"DUALLOOP_KEEPALIVE_S \(keepalive_s\): {finite}"):
        load_server_config(model=test_model_path)
    monkeypatch.delenv("DUALLOOP_KEEPALIVE_S")
    with pytest.raises(ConfigError, match=rf"--drain-grace \(drain_grace_s\): {finite}"):
        load_server_config(model=test_model_path, drain_grace_s=float("-inf"))
    file = tmp_path / "server.toml"
    file.write_text(
        f'model = "{test_model_path}"\n[planner]\nperiod_ms = nan\n'
        "[executor.safety.threat]\nmax_decel = inf\n[executor.safety.lane_keeping]\ngain = -inf\n"
    )
    with pytest.raises(ConfigError) as err:
        load_server_config(file)
    assert sorted(str(err.value).splitlines()[1:]) == [
        f"  executor.safety.lane_keeping.gain: {finite}",
        f"  executor.safety.threat.max_decel: {finite}",
        f"  planner.period_ms: {finite}",
    ], str(err.value)
    yaml_file = tmp_path / "server.yaml"
    yaml_file.write_text(f"model: {test_model_path}\nopen_timeout_s: .inf\n")
    with pytest.raises(ConfigError, match=rf"open_timeout_s: {finite}"):
        load_server_config(yaml_file)
    # finite values and the other kinds of setting are as they were
    config = load_server_config(model=test_model_path, drain_grace_s=2.5, host="127.0.0.1")
    assert config.drain_grace_s == 2.5 and config.executor.tick_period_ms == 5.0
