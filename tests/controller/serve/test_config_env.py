"""DUALLOOP_* environment variables: nested by "__", between the config file and the flags, errors name them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dualloop.controller.contract.config_files import env_name
from dualloop.controller.contract.errors import ConfigError
from dualloop.controller.serve.config import load_server_config


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    # the developer's or CI's own DUALLOOP_* settings must not leak into these tests
    import os

    for name in list(os.environ):
        if name.startswith("DUALLOOP_"):
            monkeypatch.delenv(name)


def test_env_sets_top_level_and_nested_fields(monkeypatch, test_model_path):
    monkeypatch.setenv("DUALLOOP_MODEL", str(test_model_path))
    monkeypatch.setenv("DUALLOOP_PORT", "6123")
    monkeypatch.setenv("DUALLOOP_EXECUTOR__MAX_OBSERVATION_AGE_MS", "21.5")
    monkeypatch.setenv("dualloop_planner__period_ms", "150")  # case-insensitive, as on Windows
    monkeypatch.setenv("DUALLOOP_GATES", '["a.gate.npz", "b.gate.npz"]')
    config = load_server_config()
    assert config.model == test_model_path and config.port == 6123
    assert config.executor.max_observation_age_ms == 21.5
    assert config.executor.min_margin == 0.05  # a sibling of the nested field keeps its default
    assert config.planner.period_ms == 150.0
    assert [p.name for p in config.gates] == ["a.gate.npz", "b.gate.npz"]
    assert load_server_config(use_env=False, model=test_model_path).port == 50151


def test_precedence_flag_over_env_over_file_over_default(monkeypatch, tmp_path, test_model_path):
    path = tmp_path / "server.toml"
    path.write_text(
        f'model = "{test_model_path}"\nport = 6001\nhost = "::1"\n'
        "[executor]\nmin_margin = 0.2\nmax_observation_age_ms = 30\n"
    )
    monkeypatch.setenv("DUALLOOP_PORT", "6002")
    monkeypatch.setenv("DUALLOOP_EXECUTOR__MIN_MARGIN", "0.3")
    config = load_server_config(path, port=6003)
    assert config.port == 6003  # flag > env > file
    assert config.executor.min_margin == 0.3  # env > file, one nested field ...
    assert config.executor.max_observation_age_ms == 30.0  # ... the file's other fields stay
    assert config.host == "::1"  # file > default
    assert config.executor.tick_period_ms == 5.0  # default
    assert load_server_config(path).port == 6002  # env > file without the flag


def test_invalid_env_value_names_the_variable(monkeypatch, test_model_path):
    monkeypatch.setenv("DUALLOOP_EXECUTOR__MAX_OBSERVATION_AGE_MS", "soon")
    with pytest.raises(ConfigError) as err:
        load_server_config(model=test_model_path)
    assert "DUALLOOP_EXECUTOR__MAX_OBSERVATION_AGE_MS (executor.max_observation_age_ms)" in str(err.value)
    assert "valid number" in str(err.value)
    monkeypatch.delenv("DUALLOOP_EXECUTOR__MAX_OBSERVATION_AGE_MS")
    monkeypatch.setenv("DUALLOOP_EXECUTOR__TICK_PERIOD", "5")  # a typo in a nested name is refused
    with pytest.raises(ConfigError, match=r"DUALLOOP_EXECUTOR__TICK_PERIOD \(executor.tick_period\): Extra inputs"):
        load_server_config(model=test_model_path)
    monkeypatch.delenv("DUALLOOP_EXECUTOR__TICK_PERIOD")
    monkeypatch.setenv("DUALLOOP_GATES", "[not json")
    with pytest.raises(ConfigError, match="DUALLOOP_GATES cannot be parsed.*JSON"):
        load_server_config(model=test_model_path)


def test_flag_and_missing_field_errors_say_where(monkeypatch):
    with pytest.raises(ConfigError, match=r"model \(in the config file, or DUALLOOP_MODEL, or a flag\)"):
        load_server_config()
    monkeypatch.setenv("DUALLOOP_MODEL", "m.onnx")
    with pytest.raises(ConfigError, match=r"--port \(port\): Input should be less than or equal to 65535"):
        load_server_config(port=70000)


def test_env_name_of_a_field_path():
    assert env_name(("executor", "safety", "hold_ms")) == "DUALLOOP_EXECUTOR__SAFETY__HOLD_MS"
    assert env_name(("gates", 1)) == "DUALLOOP_GATES"


def test_cli_reads_env_and_reports_bad_variable(monkeypatch, test_model_path):
    # the serve command end to end: the non-loopback host comes from the environment and is refused
    env = {"DUALLOOP_MODEL": str(test_model_path), "DUALLOOP_HOST": "203.0.113.5", "PATH": ""}
    proc = subprocess.run(
        [sys.executable, "-m", "dualloop", "serve"], capture_output=True, text=True, timeout=60, env=env
    )
    assert proc.returncode == 2, proc.stderr
    assert "not a loopback address" in proc.stdout + proc.stderr
    env["DUALLOOP_PORT"] = "many"
    proc = subprocess.run(
        [sys.executable, "-m", "dualloop", "serve"], capture_output=True, text=True, timeout=60, env=env
    )
    assert proc.returncode == 2, proc.stderr
    assert "DUALLOOP_PORT (port): Input should be a valid integer" in proc.stdout + proc.stderr
