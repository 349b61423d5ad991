"""`dualloop bench rules`: the server's CPU per REALTIME tick, stage by stage, at each session count."""

from __future__ import annotations

import json

from dualloop.controller.bench.rules import STAGES, bench_rules_table
from dualloop.controller.cli import main
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES


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


def test_bench_rules_command_runs_the_shipped_model_with_its_gates(tmp_path, capsys):
    assert main(["bench", "rules", "--sessions", "2", "--duration", "0.3", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "base.onnx with 2 gates" in out and "machine load" in out
    (result_file,) = tmp_path.glob("rules-*.json")
    assert list(json.loads(result_file.read_text())["cpu_us_per_tick"]) == ["2"]
