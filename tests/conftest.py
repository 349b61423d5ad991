from __future__ import annotations

import shutil
import sysconfig
from pathlib import Path

import grpc
import pytest

from dualloop.controller.contract.gate_files import load_gate_for_model
from dualloop.controller.serve.config import ServerConfig
from dualloop.controller.serve.lifecycle import ServerThread
from dualloop.executor.model_runner import DecisionModel
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES, TEST_MODEL_PATH


@pytest.fixture(scope="session")
def test_model_path() -> Path:
    assert TEST_MODEL_PATH.is_file(), "models/test_model.onnx is missing: run `dualloop make-test-model`"
    return TEST_MODEL_PATH


@pytest.fixture(scope="session")
def test_model(test_model_path: Path) -> DecisionModel:
    return DecisionModel(test_model_path)


@pytest.fixture(scope="session")
def base_model() -> DecisionModel:
    """The shipped model, as users run it."""
    return DecisionModel(BASE_MODEL_PATH)


@pytest.fixture(scope="session")
def base_gates(base_model: DecisionModel) -> list:
    """The shipped gates, loaded for the shipped model."""
    return [load_gate_for_model(g, base_model) for g in DEFAULT_GATES]


@pytest.fixture()
def server(test_model_path: Path):
    with ServerThread(ServerConfig(model=test_model_path, port=0)) as srv:
        yield srv


@pytest.fixture()
def channel(server):
    with grpc.insecure_channel(server.address) as ch:
        yield ch


@pytest.fixture(scope="session")
def c_compiler() -> str | None:
    """The C compiler pip would build the optional extensions with, or None: where one exists, the
    compiled-path tests insist that the extensions built and are in use."""
    return shutil.which((sysconfig.get_config_var("CC") or "cc").split()[0])
