"""The model file contract: card required and consistent, export reproducible and exact."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from dualloop.controller.training.driving_card import build_test_model, driving_card
from dualloop.executor.model_card import METADATA_KEY, ModelFileError, Normalisation
from dualloop.executor.model_runner import DecisionModel
from dualloop.executor.onnx_export import export_mlp, random_mlp
from dualloop.models import TEST_MODEL_PATH


def test_test_model_is_reproducible_from_its_seed(tmp_path):
    card = build_test_model(tmp_path / "m.onnx")
    assert (tmp_path / "m.onnx").read_bytes() == TEST_MODEL_PATH.read_bytes(), (
        "models/test_model.onnx differs from `dualloop make-test-model`"
    )
    assert card.version == DecisionModel(TEST_MODEL_PATH, warmup_batches=()).card.version


def test_forward_matches_numpy_reference(tmp_path):
    card = driving_card("ref", "test", decision_vector_size=16)
    w = random_mlp(25, (32, 16), 4, 2, seed=3)
    export_mlp(w, card, tmp_path / "ref.onnx")
    model = DecisionModel(tmp_path / "ref.onnx")
    rng = np.random.default_rng(0)
    x, p = rng.normal(size=(5, 19)).astype(np.float32), rng.normal(size=(5, 6)).astype(np.float32)
    h = np.concatenate([x, p], axis=1)
    for W, b in w.hidden:
        h = np.maximum(h @ W + b, 0)
    out = model.forward(x, p)
    np.testing.assert_allclose(out.decision_vector, h, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.logits, h @ w.logits[0] + w.logits[1], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.controls, h @ w.controls[0] + w.controls[1], rtol=1e-5, atol=1e-5)


def test_mask_input_model_gets_the_profile_and_missing_features_at_their_mean(tmp_path):
    card = driving_card("masked", "test", decision_vector_size=16).model_copy(update={"mask_input": True})
    w = random_mlp(2 * 19 + 6, (32, 16), 4, 2, seed=5)
    export_mlp(w, card, tmp_path / "masked.onnx")
    model = DecisionModel(tmp_path / "masked.onnx")
    norm = Normalisation.of(model.card)
    rng = np.random.default_rng(1)
    x, p = rng.normal(size=(3, 19)).astype(np.float32), rng.normal(size=(3, 6)).astype(np.float32)
    present = np.ones((3, 19), bool)
    present[1, 5:] = False
    x[1, 5:] = np.nan  # missing features arrive as NaN by contract
    xn, pn, finite = norm.apply(x, p, present=present)
    assert finite.all(), "NaN in a missing feature is not invalid input"
    assert (xn[1, 5:] == 0).all() and np.isfinite(xn).all()
    h = np.concatenate([xn, present.astype(np.float32), pn], axis=1)
    for W, b in w.hidden:
        h = np.maximum(h @ W + b, 0)
    out = model.forward(xn, pn, present)
    np.testing.assert_allclose(out.logits, h @ w.logits[0] + w.logits[1], rtol=1e-5, atol=1e-5)
    # without a profile every feature counts as present (mask all ones), and NaN is invalid again
    full = model.forward(xn, pn)
    assert not np.allclose(full.logits[1], out.logits[1])
    np.testing.assert_allclose(full.logits[0], out.logits[0], rtol=1e-6)
    assert not norm.apply(x, p)[2][1]
    # a present NaN is still invalid under a profile
    x[0, 0] = np.nan
    assert not norm.apply(x, p, present=present)[2][0]


def test_mask_input_model_with_the_wrong_input_width_is_refused(tmp_path):
    card = driving_card("masked", "test", decision_vector_size=16).model_copy(update={"mask_input": True})
    export_mlp(random_mlp(2 * 19 + 6, (32, 16), 4, 2, seed=5), card, tmp_path / "masked.onnx")
    _rewrite_card(
        tmp_path / "masked.onnx",
        tmp_path / "unmasked.onnx",
        lambda props: {
            k: v.replace('"mask_input":true', '"mask_input":false') if k == METADATA_KEY else v
            for k, v in props.items()
        },
    )
    with pytest.raises(ModelFileError, match=r"features.*\[batch, 19\]"):
        DecisionModel(tmp_path / "unmasked.onnx")


def _rewrite_card(src: Path, dst: Path, edit) -> None:
    model = onnx.load(str(src))
    props = {p.key: p.value for p in model.metadata_props}
    del model.metadata_props[:]
    new = edit(props)
    for k, v in new.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = k, v
    onnx.save(model, str(dst))


def test_model_without_card_is_refused(tmp_path):
    _rewrite_card(TEST_MODEL_PATH, tmp_path / "bare.onnx", lambda props: {})
    with pytest.raises(ModelFileError, match=f"no '{METADATA_KEY}' entry"):
        DecisionModel(tmp_path / "bare.onnx")


def test_invalid_card_names_the_field(tmp_path):
    def broken(props):
        card = json.loads(props[METADATA_KEY])
        card["controls"][0]["min"] = 5.0  # above its max
        card["plan_default"] = [0.0]
        return {METADATA_KEY: json.dumps(card)}

    _rewrite_card(TEST_MODEL_PATH, tmp_path / "broken.onnx", broken)
    with pytest.raises(ModelFileError) as err:
        DecisionModel(tmp_path / "broken.onnx")
    assert "controls.0" in str(err.value) and "broken.onnx" in str(err.value)


def test_card_graph_mismatch_is_refused(tmp_path):
    def wrong_width(props):
        card = json.loads(props[METADATA_KEY])
        card["decision_vector_size"] = 99
        return {METADATA_KEY: json.dumps(card)}

    _rewrite_card(TEST_MODEL_PATH, tmp_path / "wrong.onnx", wrong_width)
    with pytest.raises(ModelFileError, match="decision_vector.*implies \\[batch, 99\\]"):
        DecisionModel(tmp_path / "wrong.onnx")


def test_missing_and_garbage_files(tmp_path):
    with pytest.raises(ModelFileError, match="not found"):
        DecisionModel(tmp_path / "nope.onnx")
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    with pytest.raises(ModelFileError, match="onnxruntime cannot load it"):
        DecisionModel(tmp_path / "junk.onnx")


def test_metadata_that_is_not_utf8_is_a_model_file_error(tmp_path):
    """onnxruntime parses the file but cannot hand back its card as text (found by tests/fuzz: was a
    UnicodeDecodeError from get_modelmeta)."""
    data = bytearray(TEST_MODEL_PATH.read_bytes())
    at = data.index(b'"features"')  # inside the card's JSON in the metadata
    data[at + 1] = 0xFF
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match=r"broken\.onnx: its metadata or graph names are not UTF-8 text"):
        DecisionModel(broken, warmup_batches=())
