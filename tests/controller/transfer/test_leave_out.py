"""Leave one dataset out (controller.transfer): each dataset scored by a model that never trained on it,
beside the shipped model on the dataset's own held-out split, and judged by `eval-logs --check` and
`qualify --transfer`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dualloop.controller.cli import main
from dualloop.controller.training.log_eval import evaluate
from dualloop.controller.training.recorded import log_paths, read_log_rows
from dualloop.controller.transfer.leave_out import (
    RATIO_TARGET,
    Column,
    Driving,
    TransferConfig,
    TransferReport,
    leave_one_dataset_out,
    replay_driving,
)
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES
from tests.controller.training.human_logs import human_drive

# the module's fixture trains and fits two small models (about 2 min on an idle 2-core machine),
# charged to whichever test asks for it first
FIXTURE_TIMEOUT_S = 1800


@pytest.fixture(scope="module")
def drives(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two made-up datasets as `import shared-data` lays them out: Alpha with a training and a
    held-out drive, Beta held out whole."""
    root = tmp_path_factory.mktemp("real")
    (root / "train").mkdir()
    (root / "heldout").mkdir()
    human_drive(root / "train" / "a1.mcap", "a1", dataset="Alpha Set", seconds=60.0, seed=1)
    human_drive(root / "heldout" / "a2.mcap", "a2", dataset="Alpha Set", seconds=40.0, seed=2)
    human_drive(root / "heldout" / "b1.mcap", "b1", dataset="Beta", seconds=40.0, seed=3)
    return root


@pytest.fixture(scope="module")
def report(drives: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[TransferReport, Path]:
    work = tmp_path_factory.mktemp("transfer")
    paths = log_paths([drives / "train", drives / "heldout"])
    config = TransferConfig(smoke=True, size="small")
    return leave_one_dataset_out(paths, BASE_MODEL_PATH, DEFAULT_GATES, config, work_dir=work), work


@pytest.mark.slow
@pytest.mark.timeout(FIXTURE_TIMEOUT_S)
def test_each_dataset_is_scored_by_a_model_trained_without_it(drives: Path, report) -> None:
    result, work = report
    assert [d.dataset for d in result.datasets] == ["alpha-set", "beta"]
    rows = read_log_rows(log_paths([drives]))
    for d in result.datasets:
        model = work / f"without-{d.dataset}.onnx"
        gates = [work / f"without-{d.dataset}.gate.npz", work / f"without-{d.dataset}.inputs.gate.npz"]
        assert model.is_file() and all(g.is_file() for g in gates)
        # the left-out figure is that model's on every labelled row of the dataset, none of which it trained on
        mine = (rows.dataset == d.dataset) & (rows.label >= 0)
        again = next(r for r in evaluate(model, rows, on=mine) if r.dataset == d.dataset)
        assert d.left_out.disagreement_ratio == pytest.approx(again.disagreement_ratio)
        assert d.left_out.rows == again.model_on[again.best_baseline].rows == int(mine.sum())
        # every tick of the dataset's drives was replayed with that model and its own gate
        files = sorted({Path(f) for f, ds in zip(rows.paths, rows.datasets) if ds == d.dataset})
        driving = replay_driving(files, model, gates)
        assert d.left_out.driving == driving and driving.ticks > 0
        assert 0.0 <= driving.vetoed <= 1.0 and 0.0 <= driving.nominal <= 1.0


@pytest.mark.slow
@pytest.mark.timeout(FIXTURE_TIMEOUT_S)
def test_within_is_the_shipped_model_on_the_held_out_split_only(drives: Path, report) -> None:
    result, _ = report
    alpha, beta = result.datasets
    rows = read_log_rows(log_paths([drives / "heldout"]))
    mine = (rows.dataset == "alpha-set") & (rows.label >= 0)
    shipped = next(r for r in evaluate(BASE_MODEL_PATH, rows, on=mine) if r.dataset == "alpha-set")
    assert alpha.within is not None
    assert alpha.within.disagreement_ratio == pytest.approx(shipped.disagreement_ratio)
    assert alpha.within.rows == int(mine.sum()) < alpha.left_out.rows  # the training drive is not in it
    assert beta.within is not None and beta.within.rows == beta.left_out.rows  # held out whole


@pytest.mark.slow
@pytest.mark.timeout(FIXTURE_TIMEOUT_S)
def test_the_report_round_trips_and_names_what_it_misses(report) -> None:
    result, _ = report
    again = TransferReport.from_json(result.to_json())
    assert again == result
    for d in result.datasets:
        ratio_missed = any("disagreement" in m for m in d.misses)
        assert ratio_missed == (not d.left_out.disagreement_ratio <= RATIO_TARGET)


@pytest.mark.slow
@pytest.mark.timeout(FIXTURE_TIMEOUT_S)
def test_eval_logs_check_and_qualify_judge_the_left_out_figures(drives: Path, report, tmp_path: Path, capsys) -> None:
    result, work = report
    path = tmp_path / "transfer.json"
    path.write_text(result.to_json())
    out = tmp_path / "qualify"
    code = main(["qualify", str(BASE_MODEL_PATH), "--transfer", str(path), "--stress-seeds", "0", "--out", str(out)])
    data = json.loads((out / "qualify.json").read_text())
    checks = [c for c in data["checks"] if c["step"] == "transfer"]
    assert len(checks) == 3 * len(result.datasets)
    assert code == (1 if result.failed else 0)
    assert (code == 1) == any(not c["passed"] for c in checks)
    assert "each dataset left out of training" in (out / "qualify.html").read_text()
    # a file that is not such a report is bad input, named
    bad = tmp_path / "bad.json"
    bad.write_text('{"datasets": 3}')
    capsys.readouterr()
    assert main(["qualify", str(BASE_MODEL_PATH), "--transfer", str(bad), "--stress-seeds", "0"]) == 2
    said = capsys.readouterr()
    assert "bad.json" in said.out + said.err and "not a report" in said.out + said.err


def test_the_replay_says_which_checks_vetoed(tmp_path: Path) -> None:
    clean = human_drive(tmp_path / "clean.mcap", "clean", seconds=30.0, seed=4)
    faulty = human_drive(tmp_path / "flicker.mcap", "flicker", seconds=30.0, seed=4, flicker=(10.0, 14.0))
    before = replay_driving([clean], BASE_MODEL_PATH, DEFAULT_GATES)
    after = replay_driving([faulty], BASE_MODEL_PATH, DEFAULT_GATES)
    assert "lead_flicker" not in before.vetoed_by
    # the flag flickers for 4 s of 30: lead_flicker vetoes about that share, no check more than were vetoed
    assert 0.5 * 4 / 30 < after.vetoed_by["lead_flicker"] <= after.vetoed <= 1.0
    assert all(0.0 < share <= after.vetoed for share in after.vetoed_by.values())
    assert list(after.vetoed_by.values()) == sorted(after.vetoed_by.values(), reverse=True)


def test_only_names_datasets_the_drives_hold(drives: Path, capsys) -> None:
    logs = [str(drives / "train"), str(drives / "heldout")]
    assert main(["eval-logs", *logs, "--leave-one-out", "--quick", "--only", "gamma"]) == 2
    said = capsys.readouterr()
    assert "gamma" in said.out + said.err and "alpha-set, beta" in said.out + said.err
    assert main(["eval-logs", *logs, "--only", "beta"]) == 2
    said = capsys.readouterr()
    assert "--only: only with --leave-one-out" in said.out + said.err


@pytest.mark.slow
@pytest.mark.timeout(FIXTURE_TIMEOUT_S)
def test_holding_out_one_dataset_alone_gives_its_figures_of_the_whole_run(drives: Path, report, tmp_path: Path) -> None:
    result, _ = report
    paths = log_paths([drives / "train", drives / "heldout"])
    config = TransferConfig(smoke=True, size="small", only=("beta",))
    alone = leave_one_dataset_out(paths, BASE_MODEL_PATH, DEFAULT_GATES, config, work_dir=tmp_path)
    assert [d.dataset for d in alone.datasets] == ["beta"]
    assert alone.datasets[0] == result.datasets[1]
    assert TransferReport.from_json(alone.to_json()) == alone


def test_a_missed_ratio_says_whether_its_interval_could_still_meet_the_target() -> None:
    def column(ratio: float, low: float, high: float) -> Column:
        return Column(1000, 0.9, "ego_accel", 0.88, ratio, Driving(100, 1.0, 0.0), low, high)

    (undecided,) = column(0.88, 0.70, 1.07).misses()
    assert undecided == "disagreement 0.88x [0.70-1.07] the best baseline's > 0.80x (its interval holds the target)"
    (missed,) = column(1.15, 1.04, 1.27).misses()
    assert missed == "disagreement 1.15x [1.04-1.27] the best baseline's > 0.80x"
    assert column(0.64, 0.62, 0.68).misses() == []
    assert column(1.15, float("nan"), float("nan")).misses() == ["disagreement 1.15x the best baseline's > 0.80x"]


def test_one_dataset_cannot_be_left_out(drives: Path, capsys) -> None:
    assert main(["eval-logs", str(drives / "heldout" / "b1.mcap"), "--leave-one-out", "--quick"]) == 2
    said = capsys.readouterr()
    assert "at least two datasets" in said.out + said.err
