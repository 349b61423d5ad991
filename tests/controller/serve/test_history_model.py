"""A model with history features behind a real gRPC server: ModelInfo names them, and a LOCKSTEP
session's proposals are the model's on [observation, history derived from the stream sent]."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest

from dualloop.controller.contract.client import DriveSession
from dualloop.controller.serve.config import ServerConfig
from dualloop.controller.serve.lifecycle import ServerThread
from dualloop.controller.training.driving_card import build_test_model
from dualloop.executor.history import DEFAULT_HISTORY
from dualloop.executor.model_card import Normalisation
from dualloop.executor.model_runner import DecisionModel
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc


@pytest.fixture(scope="module")
def history_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("history") / "history.onnx"
    build_test_model(path, history=DEFAULT_HISTORY)
    return path


def test_model_info_names_the_history_features_and_proposals_use_them(history_model_path: Path) -> None:
    model = DecisionModel(history_model_path)
    assert model.history is not None
    n = 20
    ns = (np.arange(n) * 100_000_000).astype(np.int64)  # 10 Hz
    x = np.full((n, model.n_features), np.nan, np.float32)
    x[:, :5] = np.column_stack(
        [20.0 + 1.5 * ns / 1e9, np.full(n, 0.2), np.ones(n), 40.0 - 0.5 * ns / 1e9, np.full(n, -0.5)]
    )
    names = model.card.feature_names[:5]
    with ServerThread(ServerConfig(model=history_model_path, port=0)) as srv, grpc.insecure_channel(srv.address) as ch:
        info = pb_grpc.ControllerServiceStub(ch).GetModelInfo(pb.GetModelInfoRequest()).model
        assert list(info.history_features) == list(DEFAULT_HISTORY)
        session = DriveSession(
            ch, "h", pb.CLOCK_MODE_LOCKSTEP, observation_period_ns=100_000_000, provided_features=names
        )
        for i in range(n):
            session.send(i + 1, int(ns[i]), x[i].tolist())
        snaps = [session.recv() for _ in range(1 + (n - 1) * 20)]  # every 5 ms tick up to the last
        session.cancel()
    fresh = [s for s in snaps if not s.observation_held]
    assert [s.observation_seq for s in fresh] == list(range(1, n + 1))
    # what the model proposes on [x, history] with the sensor profile, computed here without the server
    present = np.zeros((n, model.n_features), bool)
    present[:, :5] = True
    history = model.history.batch(ns, x)
    full_present = np.concatenate([present, model.history.present(present)], axis=1)
    assert full_present.all(axis=0)[model.n_features :].all()  # the five features feed every history one
    plan = np.broadcast_to(np.array(model.card.plan_default, np.float32), (n, model.n_plan)).copy()
    xn, pn, _ = Normalisation.of(model.card).apply(np.concatenate([x, history], axis=1), plan, present=full_present)
    z = model.forward(xn, pn, full_present).logits / model.card.temperature
    probs = np.exp(z - z.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    np.testing.assert_allclose([list(s.proposed.probabilities) for s in fresh], probs, atol=1e-6)
    # and the history made a difference to them: the same observations alone give other probabilities
    xn0, _, _ = Normalisation.of(model.card).apply(
        np.concatenate([x, np.zeros_like(history)], axis=1), plan, present=full_present
    )
    z0 = model.forward(xn0, pn, full_present).logits
    assert np.abs(z0 - model.forward(xn, pn, full_present).logits).max() > 1e-3
