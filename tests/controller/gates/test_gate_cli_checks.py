"""`dualloop gate fit` and `gate eval` refuse what would fail only after minutes of driving and fitting:
a model off the simulator schema, an --alpha rarer than the held-out driving states, an --out that
cannot be written, a negative --seed; and without --out a gate for another model goes beside it, never
over the shipped gate. Each refusal is one line and exit 2, found before any work: the tests pair it with
a second bad argument that the old code refused at once, so that they are quick on either."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from dualloop import ood
from dualloop.controller.cards import toml_text
from dualloop.controller.cards.cards import attach, template
from dualloop.controller.cli import main
from dualloop.controller.contract.gate_files import NO_REFIT, load_gate_for_model
from dualloop.controller.gates.cli import default_gate_path
from dualloop.executor.gating import gate_feature_names
from dualloop.executor.model_runner import DecisionModel
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES, TEST_MODEL_PATH
from tests.controller.cards.test_cards import build_foreign_model, complete


def _said(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    return " ".join((captured.out + captured.err).split())


@pytest.fixture(scope="module")
def foreign_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model with its own 4 features (a dualloop card attached): it serves, but the simulator's
    observations do not fit it."""
    folder = tmp_path_factory.mktemp("foreign")
    graph = folder / "graph.onnx"
    build_foreign_model(graph)
    card = folder / "card.toml"
    card.write_text(toml_text.dumps(complete(template(graph)[0])))
    attach(graph, card, folder / "foreign.onnx")
    return folder / "foreign.onnx"


def test_gate_fit_refuses_a_model_off_the_simulator_schema_at_once(
    foreign_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It drove the simulator for 40 s, then: InvalidObservation ... has 19 values; expected 4."""
    out = tmp_path / "f.gate.npz"
    assert main(["gate", "fit", "--model", str(foreign_model), "--out", str(out)]) == 2
    said = _said(capsys)
    assert "gates fit only models on the simulator schema" in said and "fitting" not in said, said
    assert not out.exists()


def test_a_gate_refused_for_such_a_model_suggests_no_refit(foreign_model: Path, tmp_path: Path) -> None:
    """serve's and gate eval's refusal suggested `dualloop gate fit --model foreign.onnx`, which cannot work."""
    model = DecisionModel(foreign_model, warmup_batches=())
    names = gate_feature_names(model, "decision_vector")
    rng = np.random.default_rng(3)
    gate = ood.fit_gate(
        ood.FeatureRows(rng.normal(size=(400, len(names)))),
        ood.FeatureRows(rng.normal(size=(400, len(names)))),
        ood.FeatureSchema(tuple(names), "decision_vector"),
        "synthetic",
        ood.GateFitSettings(alpha=0.01),
    )
    path = tmp_path / "other.gate.npz"
    dataclasses.replace(gate, model=ood.ModelRef("other", "0123456789ab", "abcdef0123456789")).save(path)
    with pytest.raises(ood.GateFileError) as refused:
        load_gate_for_model(path, model)
    assert NO_REFIT in str(refused.value) and "dualloop gate fit" not in str(refused.value)


def test_gate_fit_without_out_writes_beside_another_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It wrote models/base.gate.npz, replacing the shipped model's gate with one fitted on mine.onnx."""
    mine = tmp_path / "mine.onnx"
    mine.write_bytes(TEST_MODEL_PATH.read_bytes())
    shipped = [g.stat().st_mtime_ns for g in DEFAULT_GATES]
    for source, name in (("decision_vector", "mine.gate.npz"), ("input_features", "mine.inputs.gate.npz")):
        argv = ["gate", "fit", "--model", str(mine), "--source", source, "--real-logs", str(tmp_path / "none")]
        assert main(argv) == 2
        assert f"the gate goes to {tmp_path / name}" in _said(capsys)
    assert [g.stat().st_mtime_ns for g in DEFAULT_GATES] == shipped
    assert default_gate_path(BASE_MODEL_PATH, "input_features") == DEFAULT_GATES[1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--alpha", "1e-7"], "--alpha 1e-07: rarer than the fit's held-out driving can calibrate"),
        (["--out", "{tmp}/afile/g.gate.npz"], "afile is a file, not a folder"),
        (["--out", "{tmp}/folder"], "folder: is a folder; give a file name in it"),
    ],
)
def test_gate_fit_refuses_what_failed_after_the_fit(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--alpha 1e-7 raised in calibrate_threshold after 3 CPU-minutes; an --out that cannot be written
    failed at the save (naming a temp file .gate-XXXX.npz.tmp). The missing --real-logs is the old
    code's quick refusal, checked after these."""
    (tmp_path / "afile").write_text("")
    (tmp_path / "folder").mkdir()
    argv = ["gate", "fit", "--real-logs", str(tmp_path / "none"), *(a.format(tmp=tmp_path) for a in args)]
    assert main(argv) == 2
    said = _said(capsys)
    assert message.format(tmp=tmp_path) in said and "fitting" not in said, said


def test_gate_fit_makes_a_missing_out_folder_before_fitting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "new" / "sub" / "g.gate.npz"
    assert main(["gate", "fit", "--out", str(out), "--real-logs", str(tmp_path / "none")]) == 2
    assert out.parent.is_dir() and not out.exists()


def test_gate_eval_makes_its_out_folder_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """In simulator mode --out was made only at the end, after minutes: a file there failed then."""
    (tmp_path / "afile").write_text("")
    missing = str(tmp_path / "missing.gate.npz")  # the old code's quick refusal, checked after --out
    assert main(["gate", "eval", "--out", str(tmp_path / "afile" / "e"), "--gate", missing]) == 2
    assert "afile is a file, not a folder" in _said(capsys)
    out = tmp_path / "new" / "eval"  # made before the gates load (a missing one: the old code's quick refusal)
    assert main(["gate", "eval", "--out", str(out), "--gate", missing]) == 2
    assert out.is_dir()


@pytest.mark.parametrize(
    "argv",
    [
        ["gate", "eval", "--real", "{tmp}", "--episodes", "1", "--faults", "unknown", "--seed", "-1"],
        ["train", "--size", "small", "--quick", "--log-share", "5", "--seed", "-1"],
        ["eval-logs", "{tmp}/none", "--seed", "-1"],
    ],
)
def test_a_negative_seed_is_refused_while_parsing(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ValueError: expected non-negative integer, a traceback (the other bad argument: the old code's
    quick refusal, so this fails at once there too)."""
    with pytest.raises(SystemExit) as exited:
        main([a.format(tmp=tmp_path) for a in argv])
    assert exited.value.code == 2
    assert "argument --seed: -1: a whole number from 0" in _said(capsys)
