"""Gate files are written with the process umask's mode (as a plain open writes), still atomically, and
a file that is no gate is said to be none: mkstemp wrote 0600, unreadable to the container's user
(uid 10001) a host-fitted gate was mounted into; random bytes were "pickled (object) data", a missing
gate a raw [Errno 2]."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from dualloop import ood
from dualloop.controller.contract.gate_files import load_gate_for_model
from dualloop.executor.model_runner import DecisionModel
from dualloop.models import TEST_MODEL_PATH


def _gate() -> ood.Gate:
    rng = np.random.default_rng(4)
    return ood.fit_gate(
        ood.FeatureRows(rng.normal(size=(300, 3))),
        ood.FeatureRows(rng.normal(size=(300, 3))),
        ood.FeatureSchema(("a", "b", "c"), "decision_vector"),
        "synthetic",
        ood.GateFitSettings(alpha=0.01),
    )


@pytest.fixture
def umask_022() -> Iterator[None]:
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.mark.usefixtures("umask_022")
def test_a_gate_is_written_with_the_umask_mode_and_no_temp_file_left(tmp_path: Path) -> None:
    path = tmp_path / "g.gate.npz"
    digest = _gate().save(str(path))
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # as the shipped gates, readable by any uid
    assert [p.name for p in tmp_path.iterdir()] == ["g.gate.npz"]
    assert ood.load_gate(path).version_hash == digest


def test_a_gate_replaces_the_old_file_by_rename(tmp_path: Path) -> None:
    """A reader holding the old file (a hard link here) keeps it whole: the new one is renamed over it."""
    path, held = tmp_path / "g.gate.npz", tmp_path / "held.npz"
    _gate().save(str(path))
    os.link(path, held)
    before = held.read_bytes()
    gate = _gate()
    gate.save(str(path))  # the same content, written again
    assert held.read_bytes() == before and path.stat().st_ino != held.stat().st_ino


@pytest.fixture(scope="module")
def test_model() -> DecisionModel:
    return DecisionModel(TEST_MODEL_PATH, warmup_batches=())


def test_random_bytes_are_said_not_to_be_a_gate_file(tmp_path: Path, test_model: DecisionModel) -> None:
    path = tmp_path / "random.gate.npz"
    path.write_bytes(np.random.default_rng(0).bytes(512))
    with pytest.raises(ood.GateFileError, match=r"^gate file .*random\.gate\.npz: not a gate file \(not an \.npz"):
        load_gate_for_model(path, test_model)


def test_a_missing_gate_is_said_in_the_gate_file_form(tmp_path: Path, test_model: DecisionModel) -> None:
    path = tmp_path / "missing.gate.npz"
    with pytest.raises(ood.GateFileError, match=r"^gate file .*missing\.gate\.npz: no such file"):
        load_gate_for_model(path, test_model)
