"""`dualloop bench agents` runs end to end, reports every figure it promises and `--check` names the
targets a run misses (no timing asserted: a short run on a shared machine)."""

from __future__ import annotations

import json

import pytest

from dualloop.controller.bench.agents import TARGET_AGENTS, agents_verdict, check_targets
from dualloop.controller.cli import main


@pytest.mark.slow
def test_bench_agents_quick_reports_every_figure_and_check_names_the_missed_target(tmp_path, capsys):
    args = ["bench", "agents", "--quick", "--agents", "4", "--streams", "1,2", "--duration", "1.5"]
    code = main([*args, "--realtime-priority", "0", "--check", "--out", str(tmp_path)])
    (result_file,) = tmp_path.glob("agents-*.json")
    result = json.loads(result_file.read_text())
    assert [(p["agents_per_stream"], p["streams"]) for p in result["points"]] == [(4, 1), (4, 2)]
    assert result["layout"] == "columns"  # the clients counted each agent in the columns
    for p in result["points"]:
        ex = p["executor"]
        assert ex is not None, p["verdict"]
        assert ex["ticks"] > 50 and ex["cpu_us_per_agent_tick"] > 0 and {"p50", "p99"} <= set(ex["lateness_us"])
        assert p["bare_ticker"]["ticks"] > 50
        assert p["agent_snapshots_received"] > 50 * p["agents"] and p["agent_errors"] == 0
        assert len(p["streams_detail"]) == p["streams"]
        assert isinstance(p["verdict"]["met"], bool)
    out = capsys.readouterr().out
    assert "largest agent count that kept time" in out
    # no run at 512 agents: --check exits 1 and says which target it could not judge
    assert code == 1 and f"no run at {TARGET_AGENTS} agents" in out


def _point(agents: int, missed: int, bare_missed: int, p99: float, dropped: float, cpu: float) -> dict:
    point = {
        "agents": agents,
        "executor": {"missed_deadlines": missed, "lateness_us": {"p99": p99}, "cpu_us_per_agent_tick": cpu},
        "bare_ticker": {"missed_deadlines": bare_missed, "lateness_us": {"p99": 50.0}},
        "dropped_fraction": dropped,
        "client_send_rate_hz": 200.0,
        "tick_rate_hz": 200.0,
        "agent_errors": 0,
    }
    point["verdict"] = agents_verdict(point)
    return point


def test_check_names_each_missed_target():
    kept = _point(TARGET_AGENTS, 0, 0, 300.0, 0.0, 4.0)
    assert kept["verdict"]["met"] and check_targets({"points": [kept]}) == []
    slow = _point(TARGET_AGENTS, 7, 1, 1500.0, 0.01, 9.0)
    failures = " ".join(slow["verdict"]["failures"])
    assert "6 beyond the bare ticker's" in failures and "p99 lateness 1500 us" in failures and "1.00%" in failures
    missed = check_targets({"points": [slow]})
    assert len(missed) == 2 and "did not keep time" in missed[0] and "9.0 us at 512 agents > 5 us" in missed[1]
    floor = _point(TARGET_AGENTS, 0, 3, 300.0, 0.0, 4.0)  # the machine, not the server: no verdict
    assert not floor["verdict"]["met"] and "floor itself did not keep time" in floor["verdict"]["failures"][0]
