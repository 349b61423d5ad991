"""`dualloop bench overrun` runs end to end and reports what it promises (no timing asserted)."""

from __future__ import annotations

import json

import pytest

from dualloop.controller.cli import main


@pytest.mark.slow
def test_bench_overrun_reports_every_call_and_the_drain(tmp_path):
    assert main(["bench", "overrun", "--calls", "3", "--out", str(tmp_path)]) == 0
    (result_file,) = (tmp_path / "overrun").glob("overrun-*.json")
    result = json.loads(result_file.read_text())
    assert result["slow_forward_ms"] > 0 and len(result["loadavg_before"]) == 3
    assert len(result["runs"]) == 2
    for run in result["runs"].values():
        assert set(run["calls"]) == {"health", "GetStats", "open"}
        for call in run["calls"].values():
            assert call["unanswered"] == 0 and call["p99_ms"] >= call["p50_ms"] > 0
        assert run["sigterm_exit"] == 0 and run["ticks_per_s"] > 0
    overrun = next(r for name, r in result["runs"].items() if name.startswith("every tick overrunning"))
    assert overrun["missed_per_s"] > 0  # the point of the run: its ticks do overrun
