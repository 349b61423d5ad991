"""A model built with onnx's helper API (not dualloop's exporter), with its own input and output
names and a decision vector pooled from two layers: `dualloop card init` drafts its card, the
completed card is attached, checked against the graph, and the model serves over real gRPC."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dualloop.controller.cards import toml_text
from dualloop.controller.cards.cards import CardError, attach, check, template
from dualloop.controller.cli import main
from dualloop.controller.contract.client import DriveSession
from dualloop.controller.serve.config import ServerConfig
from dualloop.controller.serve.lifecycle import ServerThread
from dualloop.executor.gating import decision_vector_names
from dualloop.executor.model_card import METADATA_KEY, Normalisation
from dualloop.executor.model_runner import DecisionModel
from dualloop.models import BASE_MODEL_PATH, TEST_MODEL_PATH
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc

N_OBS, N_GOAL, N_ACT, N_CMD, H1, H2 = 4, 2, 3, 2, 5, 3


def _weights(seed: int = 7) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = {"W1": (N_OBS + N_GOAL, H1), "W2": (H1, H2), "W3": (H2, N_ACT), "W4": (H1, N_CMD)}
    return {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}


def build_foreign_model(path: Path, seed: int = 7) -> dict[str, np.ndarray]:
    """obs, goal -> action_scores, cmd; the hidden layers h1 and h2 are outputs too."""
    w = _weights(seed)
    nodes = [
        helper.make_node("Concat", ["obs", "goal"], ["z"], axis=1),
        helper.make_node("MatMul", ["z", "W1"], ["a1"]),
        helper.make_node("Tanh", ["a1"], ["h1"]),
        helper.make_node("MatMul", ["h1", "W2"], ["a2"]),
        helper.make_node("Relu", ["a2"], ["h2"]),
        helper.make_node("MatMul", ["h2", "W3"], ["action_scores"]),
        helper.make_node("MatMul", ["h1", "W4"], ["a4"]),
        helper.make_node("Tanh", ["a4"], ["cmd"]),
    ]

    def vi(name: str, width: int) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", width])

    graph = helper.make_graph(
        nodes,
        "foreign",
        [vi("obs", N_OBS), vi("goal", N_GOAL)],
        [vi("action_scores", N_ACT), vi("cmd", N_CMD), vi("h1", H1), vi("h2", H2)],
        initializer=[numpy_helper.from_array(a, k) for k, a in w.items()],
    )
    model = helper.make_model(graph, producer_name="not-dualloop", opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())
    return w


def reference(w: dict[str, np.ndarray], obs: np.ndarray, goal: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(action scores, decision vector [h1, h2]) computed without onnxruntime."""
    h1 = np.tanh(np.concatenate([obs, goal], axis=1) @ w["W1"])
    h2 = np.maximum(h1 @ w["W2"], 0.0)
    return h2 @ w["W3"], np.concatenate([h1, h2], axis=1)


def complete(doc: dict[str, Any]) -> dict[str, Any]:
    """What a user fills in where the template says TODO."""
    doc = {**doc, "name": "foreign", "actions": ["left", "keep", "right"]}
    doc["features"] = [
        {"name": f"obs_{i}", "unit": "m", "mean": 0.5 * i, "std": 2.0} for i in range(len(doc["features"]))
    ]
    doc["plan"] = [{"name": f"goal_{i}", "unit": "m/s", "mean": 0.0, "std": 1.0} for i in range(len(doc["plan"]))]
    doc["controls"] = [{"name": f"cmd_{i}", "unit": "1", "min": -1.0, "max": 1.0} for i in range(len(doc["controls"]))]
    doc["safe_action"] = {"action": "keep", "controls": [0.0] * len(doc["controls"])}
    return doc


@pytest.fixture(scope="module")
def foreign(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path_factory.mktemp("foreign") / "foreign.onnx"
    return path, build_foreign_model(path)


def test_template_reads_the_graph_and_marks_what_it_cannot_tell(foreign, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path, _ = foreign
    out = tmp_path / "card.toml"
    assert main(["card", "init", str(path), "--out", str(out)]) == 0
    doc = tomllib.loads(out.read_text())
    assert doc["io"] == {"features": "obs", "plan": "goal", "logits": "action_scores", "controls": "cmd"}
    assert doc["decision_vector_outputs"] == [{"output": "h1", "size": H1}, {"output": "h2", "size": H2}]
    assert doc["decision_vector_size"] == H1 + H2
    assert len(doc["features"]) == N_OBS and len(doc["plan"]) == N_GOAL and len(doc["actions"]) == N_ACT
    assert len(doc["controls"]) == N_CMD and "TODO" in out.read_text()
    # attaching the template as it is names what is left to fill in
    assert main(["card", "attach", str(path), str(out), "--out", str(tmp_path / "x.onnx")]) == 2
    with pytest.raises(CardError, match=r"still TODO: name, actions\[0\]"):
        attach(path, out, tmp_path / "x.onnx")
    assert not (tmp_path / "x.onnx").exists()
    assert main(["card", "init", str(path), "--out", str(out)]) == 2  # no silent overwrite


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["features"][1].update(std=0.0), r"features\[1\]\.std: Input should be greater than 0"),
        (lambda d: d["decision_vector_outputs"][1].update(size=4), r"decision_vector_outputs sizes sum to 9"),
        (
            lambda d: d.update(decision_vector_outputs=[{"output": "h3", "size": 8}]),
            r"names output 'h3' but the graph has",
        ),
        (lambda d: d["io"].update(features="x"), r"names input 'x' but the graph has \['goal', 'obs'\]"),
        (lambda d: d["features"].pop(), r"input 'obs' has shape \['N', 4\]; the card implies \[batch, 3\]"),
        (lambda d: d.update(colour="red"), r"colour: Extra inputs are not permitted"),
        (lambda d: d["safe_action"].update(action="stop"), r"safe_action.action 'stop' is not one of"),
    ],
)
def test_a_wrong_card_is_refused_naming_the_field(foreign, tmp_path: Path, edit, message: str) -> None:  # type: ignore[no-untyped-def]
    path, _ = foreign
    doc = complete(template(path)[0])
    edit(doc)
    card = tmp_path / "card.toml"
    card.write_text(toml_text.dumps(doc))
    with pytest.raises(CardError, match=message) as err:
        check(path, card)
    assert str(card) in str(err.value)
    assert main(["card", "check", str(path), str(card)]) == 2


def test_bad_toml_names_the_line(foreign, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    card = tmp_path / "card.toml"
    card.write_text('name = "a"\nsize_class = = 3\n')
    with pytest.raises(CardError, match=r"not valid TOML: .*line 2"):
        check(foreign[0], card)


def test_a_card_that_is_not_utf8_or_missing_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A UnicodeDecodeError traceback and a bare [Errno 2] before: now the card file, the bad byte's
    offset and line, or that the card file is missing; exit 2."""
    card = tmp_path / "bin.toml"
    card.write_bytes(b'name = "a"\n\xff\xfe garbage')
    assert main(["card", "check", str(TEST_MODEL_PATH), str(card)]) == 2
    text = "".join(capsys.readouterr())
    assert f"error: {card}: the card file is not UTF-8 text: byte 0xff at offset 11 (line 2, column 1)" in text
    absent = tmp_path / "nonexist.toml"
    for extra in ([], ["--out", str(tmp_path / "x.onnx")]):
        assert main(["card", "attach" if extra else "check", str(TEST_MODEL_PATH), str(absent), *extra]) == 2
        text = "".join(capsys.readouterr())
        assert f"error: {absent}: card file not found" in text and "Errno" not in text


def test_attached_card_serves_the_pooled_decision_vector_over_grpc(foreign, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path, w = foreign
    card_path = tmp_path / "card.toml"
    card_path.write_text(toml_text.dumps(complete(template(path)[0])))
    out = tmp_path / "served.onnx"
    assert main(["card", "attach", str(path), str(card_path), "--out", str(out)]) == 0
    assert main(["card", "check", str(out)]) == 0
    model = DecisionModel(out)
    assert model.card.version and model.card.name == "foreign"
    # the version is reproducible: attaching the same card to the same graph gives the same one
    assert attach(path, card_path, tmp_path / "again.onnx").version == model.card.version
    assert [p.output for p in model.card.decision_vector_parts] == ["h1", "h2"]

    rng = np.random.default_rng(3)
    obs = rng.normal(size=(6, N_OBS)).astype(np.float32)
    goal = np.zeros((6, N_GOAL), np.float32)
    norm = Normalisation.of(model.card)
    xn, pn, _ = norm.apply(obs, goal)
    outputs = model.forward(xn, pn)
    scores, dv = reference(w, xn, pn)
    np.testing.assert_allclose(outputs.logits, scores, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outputs.decision_vector, dv, rtol=1e-5, atol=1e-5)

    probs = np.exp(scores - scores.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    assert decision_vector_names(model)[H1 - 1 : H1 + 1] == [f"h1[{H1 - 1}]", "h2[0]"]
    with ServerThread(ServerConfig(model=out, port=0)) as srv, grpc.insecure_channel(srv.address) as ch:
        info = pb_grpc.ControllerServiceStub(ch).GetModelInfo(pb.GetModelInfoRequest()).model
        assert (info.decision_vector_output, info.decision_vector_size) == ("h1,h2", H1 + H2)
        session = DriveSession(ch, "foreign", pb.CLOCK_MODE_LOCKSTEP, observation_period_ns=100_000_000)
        for i in range(len(obs)):
            session.send(i + 1, i * 100_000_000, obs[i].tolist())
        snaps = [session.recv() for _ in range(1 + (len(obs) - 1) * 20)]
        session.cancel()
    fresh = [s for s in snaps if not s.observation_held]
    assert [s.observation_seq for s in fresh] == list(range(1, len(obs) + 1))
    np.testing.assert_allclose([list(s.proposed.probabilities) for s in fresh], probs, atol=1e-5)
    assert [s.proposed.action.name for s in fresh] == [["left", "keep", "right"][i] for i in probs.argmax(axis=1)]


def test_shipped_models_cards_are_unchanged() -> None:
    # the new optional card field is left out of cards that do not use it: versions stay as exported
    model = DecisionModel(BASE_MODEL_PATH, warmup_batches=())
    raw = onnx.load(str(BASE_MODEL_PATH)).metadata_props
    stored = next(p.value for p in raw if p.key == METADATA_KEY)
    assert model.card.to_json() == stored
    assert "decision_vector_outputs" not in stored
    assert [p.output for p in model.card.decision_vector_parts] == [model.card.io.decision_vector]
