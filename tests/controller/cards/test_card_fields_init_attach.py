"""Card files as users write them: a number given as a string or as inf is refused naming the
field TOML-style; `card init` on a model with a card starts from that card (and warns first about
an input dualloop cannot feed); `card attach` without --out replaces the model by a rename."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dualloop.controller.cards import toml_text
from dualloop.controller.cards.cards import CardError, attach, check, template
from dualloop.controller.cli import main
from dualloop.executor.model_runner import DecisionModel
from dualloop.models import TEST_MODEL_PATH
from tests.controller.cards.test_cards import build_foreign_model, complete


@pytest.fixture(scope="module")
def foreign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("foreign") / "foreign.onnx"
    build_foreign_model(path)
    return path


@pytest.mark.parametrize(
    ("mean", "message"),
    [
        ('"25"', "features[0].mean: Input should be a valid number"),
        ("inf", "features[0].mean: Input should be a finite"),
    ],
)
def test_a_mean_that_is_not_a_finite_number_is_refused(foreign: Path, tmp_path: Path, mean: str, message: str) -> None:
    text = toml_text.dumps(complete(template(foreign)[0]))
    first = text.index("mean = ", text.index("[[features]]"))
    card = tmp_path / "card.toml"
    card.write_text(text[:first] + f"mean = {mean}" + text[text.index("\n", first) :])
    with pytest.raises(CardError) as err:
        check(foreign, card)
    assert message in str(err.value) and str(card) in str(err.value), err.value


def test_init_starts_from_the_embedded_card(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(TEST_MODEL_PATH.read_bytes())
    card = DecisionModel(model, warmup_batches=()).card
    assert main(["card", "init", str(model)]) == 0
    out = model.with_suffix(".card.toml")
    assert "from the card embedded" in capsys.readouterr().out
    text = out.read_text()
    assert "TODO" not in text
    doc = tomllib.loads(text)
    assert doc["name"] == card.name and doc["features"][0]["mean"] == card.features[0].mean
    # attached again unchanged, it is the same model: the same bytes, the same version
    assert attach(model, out, tmp_path / "again.onnx").version == card.version
    assert (tmp_path / "again.onnx").read_bytes() == TEST_MODEL_PATH.read_bytes()


def _float64_model(path: Path) -> None:
    def vi(name: str, width: int) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.DOUBLE, ["N", width])

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.normal(size=s), n) for n, s in (("W1", (5, 4)), ("W2", (4, 2)))]
    nodes = [
        helper.make_node("Concat", ["obs", "goal"], ["z"], axis=1),
        helper.make_node("MatMul", ["z", "W1"], ["h"]),
        helper.make_node("MatMul", ["h", "W2"], ["logits"]),
        helper.make_node("Tanh", ["logits"], ["cmd"]),
    ]
    graph = helper.make_graph(
        nodes, "f64", [vi("obs", 3), vi("goal", 2)], [vi("logits", 2), vi("cmd", 2), vi("h", 4)], weights
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))


def test_init_warns_about_a_float64_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "f64.onnx"
    _float64_model(model)
    assert main(["card", "init", str(model)]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "input 'obs' is double, but dualloop feeds float32" in err, err
    assert "WARNING: input 'obs' is double" in model.with_suffix(".card.toml").read_text()


def test_attach_in_place_replaces_the_file_by_a_rename(foreign: Path, tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(foreign.read_bytes())
    before = model.read_bytes()
    reader = tmp_path / "held.onnx"  # a second name for the old file, as a reader holding it open has
    os.link(model, reader)
    card = tmp_path / "card.toml"
    card.write_text(toml_text.dumps(complete(template(model)[0])))
    assert main(["card", "attach", str(model), str(card)]) == 0
    assert reader.read_bytes() == before  # not rewritten in place
    assert DecisionModel(model, warmup_batches=()).card.name == "foreign"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["card.toml", "held.onnx", "m.onnx"]
