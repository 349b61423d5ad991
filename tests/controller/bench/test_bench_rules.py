"""`dualloop bench rules`: the server's CPU per REALTIME tick, stage by stage, at each session count."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dualloop.controller.bench.drives import drive_seconds, nominal_drive
from dualloop.controller.bench.rules import STAGES, bench_rules, bench_rules_table
from dualloop.controller.cli import main
from dualloop.controller.contract.gate_files import load_gate_for_model
from dualloop.executor.model_runner import DecisionModel
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES
from dualloop.ood import signals
from dualloop.sim.schema import FEATURE_NAMES


def test_bench_rules_reports_each_stage_at_each_count(tmp_path):
    result = bench_rules_table(BASE_MODEL_PATH, DEFAULT_GATES, (1, 3), ticks=60, out_dir=tmp_path)
    (result_file,) = tmp_path.glob("rules-*.json")
    assert json.loads(result_file.read_text()) == result
    assert result["gates"] == [str(g) for g in DEFAULT_GATES] and len(result["loadavg_before"]) == 3
    for n in ("1", "3"):
        r = result["cpu_us_per_tick"][n]
        assert set(r) == set(STAGES)
        assert all(0.0 < r[s]["p50"] <= r[s]["p99"] for s in STAGES)
        assert r["total"]["p50"] >= r["rules"]["p50"]
        assert 0.0 <= result["nominal_share"][n] <= 1.0


def test_the_drive_is_nominal_driving_to_the_shipped_gates() -> None:
    """Sessions replay a simulated nominal drive with the command the driver was executing as the
    actual action: the gates and the actuation check trust it, so the bench measures the path
    served on ordinary driving (the measured acceleration sent as the command vetoed 18% of
    ticks: the actuation check saw it lag its own command)."""
    model = DecisionModel(BASE_MODEL_PATH)
    gates = [load_gate_for_model(g, model) for g in DEFAULT_GATES]
    ticks = 400
    drive = nominal_drive(0, drive_seconds(ticks))
    assert np.abs(drive.commands - drive.features[:, FEATURE_NAMES.index("ego_accel")]).max() > 0.05
    point = bench_rules(model, gates, 8, ticks, drive=drive)
    assert point.nominal_share >= 0.97


def test_bench_rules_command_runs_the_shipped_model_with_its_gates(tmp_path, capsys):
    assert main(["bench", "rules", "--sessions", "2", "--duration", "0.3", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "base.onnx with 2 gates" in out and "machine load" in out
    (result_file,) = tmp_path.glob("rules-*.json")
    assert list(json.loads(result_file.read_text())["cpu_us_per_tick"]) == ["2"]


@pytest.mark.skipif(not signals.compiled_available(), reason="ood._signals did not build (no C compiler)")
def test_compare_pure_times_both_paths_of_the_signal_checks_and_restores_the_choice(tmp_path, capsys):
    before = signals.compiled_wanted()
    assert (
        main(["bench", "rules", "--sessions", "2", "--duration", "0.2", "--compare-pure", "--out", str(tmp_path)]) == 0
    )
    assert signals.compiled_wanted() == before
    assert "per-signal checks in C vs Python" in capsys.readouterr().out
    (result_file,) = tmp_path.glob("rules-*.json")
    paths = json.loads(result_file.read_text())["signal_paths"]["2"]
    assert set(paths) == {"C", "Python"}
    assert all(0 < paths[p][s] < 1e6 for p in paths for s in ("p50", "p99"))
