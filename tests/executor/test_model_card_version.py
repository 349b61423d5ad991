"""A model whose graph changed under its old card (a weight scaled, the card kept) is refused
wherever a model is loaded to serve: the shared loader (DecisionModel), `dualloop card check`,
`dualloop info` and a server; the shipped models, whose cards match their graphs, load."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from dualloop.controller.cli import main
from dualloop.controller.serve.config import ServerConfig
from dualloop.controller.serve.lifecycle import ServerThread
from dualloop.executor.model_card import ModelFileError
from dualloop.executor.model_runner import DecisionModel
from dualloop.models import BASE_MODEL_PATH, MODELS_DIR, TEST_MODEL_PATH


def tampered(path: Path) -> Path:
    """models/test_model.onnx with one weight scaled by 1.01, its card left as it was."""
    model = onnx.load(str(TEST_MODEL_PATH))
    w = model.graph.initializer[0]
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) * np.float32(1.01), w.name))
    onnx.save(model, str(path))
    return path


def _refusal(path: Path, version: str) -> str:
    return f"{path}: its card says version '{version}' but its graph and card hash to "


@pytest.fixture(scope="module")
def tampered_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tampered(tmp_path_factory.mktemp("tampered") / "tampered.onnx")


@pytest.mark.parametrize("path", [BASE_MODEL_PATH, MODELS_DIR / "base.int8.onnx", TEST_MODEL_PATH])
def test_the_shipped_models_cards_match_their_graphs(path: Path) -> None:
    assert DecisionModel(path, warmup_batches=()).card.version


def test_the_loader_refuses_a_graph_changed_under_its_card(tampered_path: Path) -> None:
    version = DecisionModel(TEST_MODEL_PATH, warmup_batches=()).card.version
    with pytest.raises(ModelFileError) as err:
        DecisionModel(tampered_path, warmup_batches=())
    message = str(err.value)
    assert message.startswith(_refusal(tampered_path, version)) and "\n" not in message
    assert "dualloop card attach" in message and "gates" in message


def test_card_check_and_info_refuse_it(tampered_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    version = DecisionModel(TEST_MODEL_PATH, warmup_batches=()).card.version
    for command in (["card", "check", str(tampered_path)], ["info", str(tampered_path)]):
        assert main(command) == 2, command
        captured = capsys.readouterr()
        assert _refusal(tampered_path, version) in " ".join(captured.err.split()), command
        assert "ok" not in captured.out


def test_a_server_refuses_to_serve_it(tampered_path: Path) -> None:
    try:
        srv = ServerThread(ServerConfig(model=tampered_path, port=0))  # type: ignore[call-arg]
    except ModelFileError as err:
        assert "its card says version" in str(err)
        return
    srv.start().stop()  # the old code served it: stop what it started, then fail
    pytest.fail(f"a server was built on {tampered_path}")
