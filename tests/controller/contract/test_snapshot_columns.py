"""SnapshotColumns: a DriveAgents response's snapshots as columns give back the per-agent messages,
byte for byte, whatever each snapshot holds."""

from __future__ import annotations

import numpy as np
import pytest

from dualloop.controller.contract.columns import ColumnsError
from dualloop.controller.contract.snapshot_columns import (
    _set_packed,
    snapshot_columns,
    snapshots_from_columns,
)
from dualloop.controller.contract.wire import snapshot_to_proto
from dualloop.controller.serve.agents_outbox import agents_columns_bytes
from dualloop.executor.snapshot import CHECK_DTYPE, CandidateProposal, Check
from dualloop.v2 import controller_pb2 as pb
from tests.controller.contract.test_wire import _random_snapshot

OTHER_KINDS = (Check.REL_UNIT, Check.GAP_STEP)


def _snapshots(rng: np.random.Generator, n: int) -> list:
    snaps = [_random_snapshot(rng) for _ in range(n)]
    for snap in snaps:
        if rng.random() < 0.3:  # a candidate model's proposal beside the live one
            snap.candidate = CandidateProposal(
                "cand-2", int(rng.integers(-1, 5)), "brake", rng.normal(size=2).astype(np.float32), 0.7, 0.1
            )
        if rng.random() < 0.1:  # a gate score past float32's range goes out as its largest
            snap.gate_score, snap.gate_threshold = float(rng.choice([1e300, -1e300, np.inf])), 1.0
        if rng.random() < 0.1:  # a snapshot whose checks are another tuple than the others'
            snap.check_kinds = OTHER_KINDS
            snap.checks = np.zeros(len(OTHER_KINDS), CHECK_DTYPE)
            snap.checks["score"], snap.checks["veto"] = rng.normal(size=2), True
    return snaps


@pytest.mark.parametrize("seed", range(4))
def test_columns_give_back_each_snapshot_byte_for_byte(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for n in (0, 1, 7, 64):
        snaps = _snapshots(rng, n)
        wire = snapshot_columns(snaps).SerializeToString()
        back = snapshots_from_columns(pb.SnapshotColumns.FromString(wire))
        assert [b.SerializeToString() for b in back] == [snapshot_to_proto(s).SerializeToString() for s in snaps]


def test_pieces_of_columns_are_the_columns_of_all() -> None:
    """A REALTIME tick's columns go out in pieces (the ticker may run between them); parsed, the
    response holds every agent's snapshot in order."""
    snaps = _snapshots(np.random.default_rng(9), 50)
    head = pb.DriveAgentsResponse(tick=12)
    pieces = [snapshot_columns(snaps[a : a + 16]).SerializeToString() for a in range(0, 50, 16)]
    response = pb.DriveAgentsResponse.FromString(agents_columns_bytes(head, pieces))
    assert response.tick == 12 and response.columns == snapshot_columns(snaps)
    assert not pb.DriveAgentsResponse.FromString(agents_columns_bytes(head, [])).HasField("columns")


@pytest.mark.parametrize(
    ("field", "values", "kind"),
    [
        ("check_score", np.array([0.5, -0.0, np.inf, np.nan, 1e308]), "double"),
        ("probabilities", np.array([0.25, -1.5, 3.4e38], np.float32), "float"),
        ("input_hash", np.array([0, 2**64 - 1, 12345], np.uint64), "fixed64"),
        ("check_veto", np.array([True, False, True]), "small"),
        ("check", np.array([1, 17, 127]), "small"),
        ("check_status", np.array([0, 200, 3]), "small"),  # past one byte's varint: assigned value by value
        ("check", np.zeros(0, np.int64), "small"),
    ],
)
def test_packed_bytes_are_the_field_assigned(field: str, values: np.ndarray, kind: str) -> None:
    got, want = pb.SnapshotColumns(), pb.SnapshotColumns()
    getattr(got, field).append(values[0] if len(values) else 0)  # replaced, not appended to
    _set_packed(got, field, values, kind)
    getattr(want, field)[:] = values.tolist()
    assert got.SerializeToString() == want.SerializeToString()


def test_columns_whose_sizes_do_not_add_up_are_refused() -> None:
    cols = snapshot_columns(_snapshots(np.random.default_rng(1), 3))
    del cols.probabilities[-1]
    with pytest.raises(ColumnsError, match=r"SnapshotColumns.probabilities: 3 counts adding to \d+ for 3 agents"):
        snapshots_from_columns(cols)
    cols = snapshot_columns(_snapshots(np.random.default_rng(1), 3))
    del cols.tick[-1]
    with pytest.raises(ColumnsError, match="SnapshotColumns.tick: 2 entries for 3 agents"):
        snapshots_from_columns(cols)
