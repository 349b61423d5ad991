"""`dualloop bench agents` runs end to end, reports every figure it promises and `--check` names the
targets a run misses (no timing asserted: a short run on a shared machine)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from dualloop.controller.bench.agents import TARGET_AGENTS, agents_verdict, check_targets
from dualloop.controller.bench.drives import sensor_readings, sensor_slot
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
        assert 0.0 <= p["nominal_share"] <= 1.0  # the path measured (no bound: a loaded machine delays clients)
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


def test_a_late_sender_sends_the_reading_of_its_time_never_a_burst_of_old_ones():
    """A sender that sent slot 0 and woke 23 ms later, on a 5 ms grid, sends slot 4 (the newest due)
    and then slot 5: not slots 1-4 back to back, whose near-equal send times would read as a step of every signal in no
    time (the change check vetoes that), and never one slot twice (the freeze check's repeats)."""
    period = 5_000_000
    assert sensor_slot(-1, 0, period) == 0
    assert sensor_slot(0, 23_000_000, period) == 4
    assert sensor_slot(4, 25_000_000, period) == 5
    assert sensor_slot(5, 25_000_001, period) == 6  # woken early: the next slot, not the same one
    slots = [-1]
    for elapsed in (0, 5_000_000, 9_999_999, 40_000_000, 40_000_000, 45_000_000):
        slots.append(sensor_slot(slots[-1], elapsed, period))
    assert slots[1:] == [0, 1, 2, 8, 9, 10] and len(set(slots)) == len(slots)


def test_sensor_readings_are_never_sent_before_their_time_and_skip_what_a_stall_missed():
    """The pacing every served bench's sessions use: each reading's sensor time is at most the clock
    when it is handed out, slots strictly increase, and a consumer that stalls 23 ms (on a 5 ms grid)
    gets the reading of its time next, four or more slots on, not the ones it missed one by one."""

    async def take() -> list[tuple[int, int, int, int]]:
        out = []
        async for seq, slot, ts in sensor_readings(0.005, time.monotonic() + 0.2):
            out.append((seq, slot, ts, time.monotonic_ns()))
            if seq == 3:
                await asyncio.sleep(0.023)
        return out

    got = asyncio.run(take())
    assert [g[0] for g in got] == list(range(1, len(got) + 1)) and len(got) >= 5
    assert all(ts <= now for _, _, ts, now in got)
    slots = [g[1] for g in got]
    assert all(b > a for a, b in zip(slots, slots[1:]))
    assert slots[3] - slots[2] >= 4  # the stall's missed readings were skipped


def test_a_model_that_does_not_read_the_simulators_features_gets_no_drives(tmp_path):
    """Its sessions send draws near its card's means instead (`procs.bench_inputs`)."""
    from dualloop.controller.bench.drives import save_session_drives

    assert save_session_drives(("speed", "gap"), 10.0, tmp_path) is None
    assert not (tmp_path / "drives.npy").exists()
