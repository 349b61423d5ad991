"""`dualloop gate eval --real` on a real drive (the comma2k19 fixture, 100 Hz highway driving), at a small
size: faults the shipped executor must catch are caught at onset by the verdict that should catch them,
a "fault" that changes nothing is never detected and scores AUROC 0.5 on every check, the same seed gives
the same results, and --check exits 1 naming each target not met."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from dualloop.controller.cli import main
from dualloop.controller.gates import fault_injection as fi
from dualloop.controller.gates import real_faults as rf
from dualloop.controller.gates.real_logs import RealDataError, RealDataset, load_real_dir
from dualloop.controller.replay.lockstep import LoadedModel
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
COMMA = FIXTURES / "comma2k19-example1.mcap"


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return LoadedModel.load(BASE_MODEL_PATH, DEFAULT_GATES)


@pytest.fixture(scope="module")
def comma(tmp_path_factory: pytest.TempPathFactory) -> RealDataset:
    folder = tmp_path_factory.mktemp("real") / "comma2k19"
    folder.mkdir()
    shutil.copy(COMMA, folder / COMMA.name)
    return load_real_dir(folder, folder.parent / "scratch")


@pytest.fixture(scope="module")
def result(loaded: LoadedModel, comma: RealDataset) -> dict:
    faults = [fi.UNIT, fi.NAN, fi.MISSING_ROWS, fi.FROZEN_TIME]
    return rf.evaluate_real(loaded, [comma], episodes=4, seed=11, faults=faults)


def test_kmh_speed_at_highway_speed_is_caught_at_onset(result: dict) -> None:
    r = result["datasets"]["comma2k19"]["faults"][fi.UNIT]["ego_speed"]
    assert r["episodes"] == 4
    assert r["best_auroc"] >= 0.99
    assert r["checks"][rf.ANY]["detected_100ms"] == 1.0


def test_nan_dropout_is_invalid_input_and_missing_rows_a_stale_observation(result: dict) -> None:
    faults = result["datasets"]["comma2k19"]["faults"]
    for signal, r in faults[fi.NAN].items():
        assert r["episodes"] > 0, signal
        assert r["checks"][rf.INVALID]["auroc"] == 1.0, signal
        assert r["checks"][rf.INVALID]["detected_100ms"] == 1.0, signal
        assert r["checks"][rf.INVALID]["vetoed_in_window"] == 1.0, signal
    rows = faults[fi.MISSING_ROWS]["rows"]
    assert rows["checks"][rf.STALE]["detected_100ms"] == 1.0  # 100 Hz: stale after a few periods
    assert rows["checks"][rf.STALE]["auroc"] > 0.9


def test_a_frozen_timestamp_is_refused_at_onset(result: dict) -> None:
    r = result["datasets"]["comma2k19"]["faults"][fi.FROZEN_TIME]["timestamp"]
    assert r["episodes"] == 4
    assert r["checks"][rf.REFUSED]["detected_100ms"] == 1.0
    assert r["checks"][rf.REFUSED]["delay_median_s"] == 0.0


def test_a_fault_that_changes_nothing_is_never_detected(
    loaded: LoadedModel, comma: RealDataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A +0 m bias: the faulted replay is the clean one, so no detection and AUROC 0.5 on every check."""
    monkeypatch.setattr(fi, "BIAS_M", 0.0)
    r = rf.evaluate_real(loaded, [comma], episodes=4, seed=11, faults=[fi.BIAS])
    bias = r["datasets"]["comma2k19"]["faults"][fi.BIAS]["lead_distance"]
    assert bias["episodes"] == 4
    for name, c in bias["checks"].items():
        assert c["auroc"] == 0.5, name
        assert c["detected"] == 0.0, name
    assert r["datasets"]["comma2k19"]["false_vetoes_outside"]["ticks"] > 0


def test_the_same_seed_gives_the_same_results(loaded: LoadedModel, comma: RealDataset, result: dict) -> None:
    again = rf.evaluate_real(
        loaded, [comma], episodes=4, seed=11, faults=[fi.UNIT, fi.NAN, fi.MISSING_ROWS, fi.FROZEN_TIME]
    )
    assert json.dumps(rf.jsonable(again)) == json.dumps(rf.jsonable(result))
    other = rf.evaluate_real(loaded, [comma], episodes=4, seed=12, faults=[fi.UNIT])
    a = result["datasets"]["comma2k19"]["faults"][fi.UNIT]["ego_speed"]["episode_list"]
    b = other["datasets"]["comma2k19"]["faults"][fi.UNIT]["ego_speed"]["episode_list"]
    assert [e["onset_s"] for e in a] != [e["onset_s"] for e in b]


def test_check_exits_1_naming_each_target_not_met(
    comma: RealDataset, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = comma.source
    args = ["gate", "eval", "--real", str(folder), "--faults", "unit_error", "--episodes", "2", "--out", str(tmp_path)]
    assert main(args) == 0  # without --check, results only
    written = json.loads((tmp_path / "real_faults.json").read_text())
    failed = written["targets"]["failed"]
    capsys.readouterr()
    assert main([*args, "--check"]) == (1 if failed else 0)
    out = " ".join("".join(capsys.readouterr()).split())  # rich wraps long lines at spaces
    if failed:
        assert f"{len(failed)} targets not met" in out
    for line in failed:
        assert " ".join(line.split()) in out
    assert written["schema"] == rf.SCHEMA
    assert np.isfinite(written["datasets"]["comma2k19"]["clean_vetoes"]["rate"])


def test_a_folder_without_drives_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(RealDataError, match="no .mcap logs"):
        load_real_dir(tmp_path, tmp_path / "scratch")
    assert main(["gate", "eval", "--real", str(tmp_path / "absent"), "--out", str(tmp_path / "o")]) == 2
    assert "absent: not a folder" in "".join(capsys.readouterr())


def test_a_shared_data_set_folder_is_imported(tmp_path: Path) -> None:
    """The OpenACC fixture folder goes through the project's importer, one log per leader-follower pair."""
    ds = load_real_dir(FIXTURES / "real-drives" / "openacc-astazero-human", tmp_path)
    assert ds.name == "openacc-astazero-human" and len(ds.logs) >= 2
    assert all(p.is_file() and p.suffix == ".mcap" for p in ds.logs)


def test_a_missed_detection_says_how_many_episodes_barely_moved_the_reading() -> None:
    """A stuck speed that moved the reading by less than 0.5 m/s in its first 100 ms is named so beside
    the miss, so a reader can tell a check that missed from a fault that had barely shown."""
    episodes = [{"moved_100ms": m, "moved_1s": 2.0} for m in (0.0, 0.3, 0.9)]
    summary = {
        "episodes": 3,
        "best_auroc": 1.0,
        "best_check": "speed_repeat",
        "checks": {rf.ANY: {"detected_100ms": 0.0, "detected_1s": 1.0}},
        "episode_list": episodes,
    }
    result = {
        "datasets": {
            "d": {"faults": {"stuck": {"ego_speed": summary}}, "false_vetoes_outside": {"rate": 0.0}},
        }
    }
    (line,) = rf.targets(result)
    assert line.endswith("< 95% (2 of 3 moved the reading by less than 0.5 m/s in that time)")
