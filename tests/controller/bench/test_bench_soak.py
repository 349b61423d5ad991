"""`dualloop bench soak`: its verdicts, and a short run end to end (numbers are not asserted: timing)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dualloop.controller.bench.soak import SLOPE_BOUND_MB_PER_MIN, SoakRun, bench_soak, memory_verdict


def test_memory_verdict_flat_passes_and_a_leak_fails() -> None:
    t = np.arange(0.0, 600.0, 5.0)
    rng = np.random.default_rng(0)
    flat = memory_verdict(t, 150.0 + rng.normal(0, 0.3, t.size), 600.0)
    assert flat["met"] and abs(flat["slope_mb_per_min"]) < 0.2
    leak = memory_verdict(t, 150.0 + 2.0 * t / 60.0, 600.0)  # 2 MB/min
    assert not leak["met"] and leak["slope_mb_per_min"] == pytest.approx(2.0)
    assert leak["slope_mb_per_min"] > SLOPE_BOUND_MB_PER_MIN
    # warm-up is left out: a big start that then stays flat is no leak
    warm = memory_verdict(t, np.where(t < 60.0, 100.0 + t, 160.0), 600.0)
    assert warm["met"] and warm["warmup_s"] == 60.0
    assert memory_verdict(t[:3], [1.0, 2.0, 3.0], 600.0)["met"] is None


@pytest.mark.slow
def test_a_short_soak_runs_end_to_end_and_finds_no_leak(tmp_path: Path) -> None:
    result = bench_soak(SoakRun(sessions=2, duration_s=20.0, sample_s=1.0, realtime_priority=50), tmp_path)
    stored = json.loads(next(tmp_path.glob("soak-*.json")).read_text())
    assert stored["what"]["sessions"] == 2 and stored["what"]["planner"] == "behaviour"
    # the server was asked for SCHED_FIFO 50 (granted, or refused without CAP_SYS_NICE: said either way)
    assert "SCHED_FIFO 50" in stored["what"]["scheduling"]
    leaks = result["leaks"]
    assert leaks["met"] and leaks["leaked_sessions"] == 0, leaks
    assert result["server_after"] == {"health": "SERVING", "exit_code": 0, "error_lines": []}
    clients = result["clients"]
    assert clients["sessions"] >= 2 and clients["refused"] == {} and clients["failed"] == {}
    assert clients["states"].get("NOMINAL", 0) > 0  # the drives are what the shipped model passes
    assert len(result["samples"]) >= 3 and result["samples"][-1]["rss_mb"] > 0
    assert result["deadlines"]["server_ticks"] > 0 and result["deadlines"]["bare_ticks"] > 0
