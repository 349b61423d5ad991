"""Qualify's shadow evidence from a server that ran the candidate beside the live model
(`serve --candidate --record-dir`): the candidate's proposals recorded in the live snapshots are
judged against the actual actions, next to the live model's proposals on the same ticks."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest

from dualloop.controller.contract.client import DriveSession
from dualloop.controller.contract.errors import ConfigError
from dualloop.controller.logs.logfile import read_sessions
from dualloop.controller.qualify.criteria import ShadowCriteria
from dualloop.controller.qualify.shadow_step import run_shadow_step
from dualloop.controller.serve.config import ServerConfig
from dualloop.controller.serve.lifecycle import ServerThread
from dualloop.controller.training.driving_card import driving_card
from dualloop.executor.model_runner import DecisionModel
from dualloop.executor.onnx_export import export_mlp, random_mlp
from dualloop.v2 import controller_pb2 as pb
from tests.controller.serve.inputs import MS, sensor


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory, test_model_path: Path) -> tuple[Path, Path]:
    """(candidate model, the recording of a LOCKSTEP shadow session served with it beside the live one)."""
    tmp = tmp_path_factory.mktemp("beside")
    candidate = tmp / "candidate.onnx"
    export_mlp(random_mlp(25, (32, 48), 4, 2, seed=3), driving_card("candidate", "test", 48), candidate)
    srv = ServerThread(
        ServerConfig(port=0, model=test_model_path, candidate=candidate, record_dir=tmp / "rec")  # type: ignore[arg-type]
    ).start()
    try:
        with grpc.insecure_channel(srv.address) as ch:
            session = DriveSession(ch, "beside", pb.CLOCK_MODE_LOCKSTEP, shadow=True)
            for seq in range(1, 41):
                session.send(seq, seq * 20 * MS, sensor(seq), actual_index=seq % 4, actual_controls=[0.0, 0.0])
                for _ in range(1 if seq == 1 else 4):
                    session.recv()
            session.close()
    finally:
        srv.stop()  # the recorder closes its files
    (log,) = sorted((tmp / "rec").glob("*.mcap"))
    return candidate, log


def test_the_candidates_proposals_beside_the_live_model_are_its_shadow_evidence(recorded, test_model_path):
    candidate_path, log = recorded
    cand, live = DecisionModel(candidate_path).card, DecisionModel(test_model_path).card
    step = run_shadow_step([log], cand, live)
    (data,) = read_sessions(log).values()
    snaps = data.snapshots
    actual = {o.seq: o.actual.action_index for o in data.observations}
    truth = np.array([actual[s.observation_seq] for s in snaps])
    cand_idx = np.array([s.candidate_never_applied.action.index for s in snaps])
    live_idx = np.array([s.proposed.action.index for s in snaps])
    assert step.candidate.ticks == 0 and step.candidate.beside_ticks == len(snaps) > 100
    assert step.baseline is not None and step.baseline.ticks == len(snaps)
    assert step.candidate.beside is not None and step.baseline.proposed is not None
    assert step.candidate.beside.agreement() == pytest.approx(np.mean(cand_idx == truth))
    assert step.baseline.proposed.agreement() == pytest.approx(np.mean(live_idx == truth))
    assert not np.array_equal(cand_idx, live_idx)  # a candidate that disagrees: the comparison means something
    (check,) = step.checks(ShadowCriteria())
    assert "beside the live model" in check.name
    # the verdict follows the numbers: no worse within the tolerance, or it fails
    drop = step.baseline.proposed.agreement() - step.candidate.beside.agreement()
    assert check.passed == (drop <= ShadowCriteria().agreement_drop)
    (strict,) = step.checks(ShadowCriteria(agreement_drop=0.0))  # no drop at all allowed
    assert strict.passed == (step.candidate.beside.agreement() >= step.baseline.proposed.agreement())


def test_a_recording_without_the_candidate_is_refused(recorded, test_model_path, tmp_path):
    _, log = recorded
    other = tmp_path / "other.onnx"
    export_mlp(random_mlp(25, (32, 48), 4, 2, seed=9), driving_card("other", "test", 48), other)
    with pytest.raises(ConfigError, match="hold no snapshots of the candidate"):
        run_shadow_step([log], DecisionModel(other).card, DecisionModel(test_model_path).card)
