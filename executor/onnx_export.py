"""Export an MLP decision model to ONNX with its model card.

Graph: concat(features_normalised, plan) -> [Gemm -> Relu]* -> decision_vector
       decision_vector -> Gemm -> logits ; decision_vector -> Gemm -> controls
The decision vector is the penultimate layer: what the OOD gate scores.
Needs the `onnx` package (dev/train extra); the runtime only needs onnxruntime.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dualloop.executor.model_card import METADATA_KEY, ModelCard


@dataclass(frozen=True)
class MLPWeights:
    hidden: list[tuple[np.ndarray, np.ndarray]]  # (W (in, out), b (out,)) per hidden layer
    logits: tuple[np.ndarray, np.ndarray]
    controls: tuple[np.ndarray, np.ndarray]


def random_mlp(n_in: int, hidden: tuple[int, ...], n_actions: int, n_controls: int, seed: int) -> MLPWeights:
    """He-initialised weights from a fixed seed: the test model needs no training and no download."""
    rng = np.random.default_rng(seed)
    layers = []
    width = n_in
    for h in hidden:
        layers.append(
            (
                rng.normal(0, np.sqrt(2.0 / width), (width, h)).astype(np.float32),
                rng.normal(0, 0.05, h).astype(np.float32),
            )
        )
        width = h

    def head(n: int) -> tuple[np.ndarray, np.ndarray]:
        return (
            rng.normal(0, np.sqrt(1.0 / width), (width, n)).astype(np.float32),
            rng.normal(0, 0.05, n).astype(np.float32),
        )

    return MLPWeights(hidden=layers, logits=head(n_actions), controls=head(n_controls))


def export_mlp(weights: MLPWeights, card: ModelCard, path: Path) -> ModelCard:
    """Write the ONNX file; returns the card with its version (a hash of graph and card) filled in."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    # a mask_input model's features input is [normalised features, present as 0/1] (history features
    # after the wire features in both halves)
    n_feat, n_plan = card.input_width, len(card.plan)
    if weights.hidden[0][0].shape[0] != n_feat + n_plan:
        raise ValueError(
            f"first layer takes {weights.hidden[0][0].shape[0]} inputs; the card declares "
            f"{n_feat} feature inputs + {n_plan} plan fields"
        )
    if weights.hidden[-1][0].shape[1] != card.decision_vector_size:
        raise ValueError(
            f"last hidden layer has {weights.hidden[-1][0].shape[1]} units; card says "
            f"decision_vector_size={card.decision_vector_size}"
        )
    io = card.io
    inits, nodes = [], []
    nodes.append(helper.make_node("Concat", [io.features, io.plan], ["x0"], axis=1))
    prev = "x0"
    for i, (w, b) in enumerate(weights.hidden):
        inits += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(b, f"b{i}")]
        out = io.decision_vector if i == len(weights.hidden) - 1 else f"h{i}"
        nodes.append(helper.make_node("Gemm", [prev, f"W{i}", f"b{i}"], [f"z{i}"]))
        nodes.append(helper.make_node("Relu", [f"z{i}"], [out]))
        prev = out
    for name, (w, b) in ((io.logits, weights.logits), (io.controls, weights.controls)):
        inits += [numpy_helper.from_array(w, f"W_{name}"), numpy_helper.from_array(b, f"b_{name}")]
        nodes.append(helper.make_node("Gemm", [prev, f"W_{name}", f"b_{name}"], [name]))

    batch = "batch"
    graph = helper.make_graph(
        nodes,
        card.name,
        inputs=[
            helper.make_tensor_value_info(io.features, TensorProto.FLOAT, [batch, n_feat]),
            helper.make_tensor_value_info(io.plan, TensorProto.FLOAT, [batch, n_plan]),
        ],
        outputs=[
            helper.make_tensor_value_info(io.logits, TensorProto.FLOAT, [batch, len(card.actions)]),
            helper.make_tensor_value_info(io.controls, TensorProto.FLOAT, [batch, len(card.controls)]),
            helper.make_tensor_value_info(io.decision_vector, TensorProto.FLOAT, [batch, card.decision_vector_size]),
        ],
        initializer=inits,
    )
    model = helper.make_model(graph, producer_name="dualloop", opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9  # readable by every onnxruntime >= 1.16
    onnx.checker.check_model(model)
    digest = hashlib.sha256(model.SerializeToString(deterministic=True))
    digest.update(card.identity_json().encode())
    card = card.model_copy(update={"version": digest.hexdigest()[:12]})
    helper.set_model_props(model, {METADATA_KEY: card.to_json()})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, model.SerializeToString(deterministic=True))
    return card


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to a temp file beside ``path`` and rename it over ``path``: a server loading the
    model (or a hot swap) never reads half a file, and a failed write leaves the old model whole. The
    temp file is created as a plain open would (0o666 less the umask), so the model keeps its mode."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
