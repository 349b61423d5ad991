"""`dualloop bench tick` runs end to end and reports every number it promises (no timing asserted)."""

from __future__ import annotations

import json
import sys

import pytest

from dualloop.controller.bench import cli as bench_cli
from dualloop.controller.bench import gate as bench_gate
from dualloop.controller.bench import tick as bench_tick
from dualloop.controller.cli import main


@pytest.mark.slow
def test_bench_tick_reports_all_fields(tmp_path, test_model_path):
    assert (
        main(
            [
                "bench",
                "tick",
                "--model",
                str(test_model_path),
                "--sessions",
                "2",
                "--duration",
                "2",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    (result_file,) = tmp_path.glob("tick-*.json")
    assert list(tmp_path.glob("tick-*.png"))
    result = json.loads(result_file.read_text())
    ex, bare = result["executor"], result["bare_ticker"]
    for side in (ex, bare):
        assert set(side["lateness_us"]) == {"min", "p50", "p99", "p99.9", "max"}
        assert side["ticks"] > 200
        assert side["missed_deadlines"] >= 0
    assert set(ex["cpu_per_tick_us"]) >= {"model", "rules", "streaming"}
    assert ex["decision_latency_us"]["p50"] > 0
    assert len(result["sessions_detail"]) == 2
    for s in result["sessions_detail"]:
        assert s["snapshots_received"] > 200 and s["observations_sent"] > 200


@pytest.mark.slow
def test_bench_tick_metrics_both_runs_off_and_on_in_turns(tmp_path, test_model_path):
    args = ["bench", "tick", "--model", str(test_model_path), "--sessions", "1", "--duration", "2"]
    assert main([*args, "--metrics", "both", "--out", str(tmp_path)]) == 0
    (result_file,) = tmp_path.glob("tick-metrics-*.json")
    runs = json.loads(result_file.read_text())
    assert list(runs) == ["off (1)", "on (1)", "off (2)", "on (2)"]
    for name, r in runs.items():
        on = name.startswith("on")
        assert r["metrics"]["on"] is on and (r["metrics"]["scrapes"] > 0) is on
        assert r["executor"]["ticks"] > 200 and set(r["executor"]["tick_work_us"]) >= {"p50", "p99"}
        assert r["bare_ticker"]["ticks"] > 200


@pytest.mark.slow
def test_bench_tick_secure_both_runs_plain_and_secure_in_turns(tmp_path, test_model_path):
    args = ["bench", "tick", "--model", str(test_model_path), "--sessions", "2", "--duration", "2"]
    assert main([*args, "--secure", "both", "--out", str(tmp_path)]) == 0
    (result_file,) = tmp_path.glob("tick-secure-*.json")
    result = json.loads(result_file.read_text())
    runs = result["runs"]
    assert list(runs) == ["plain (1)", "secure (1)", "plain (2)", "secure (2)"]
    for name, r in runs.items():
        secure = name.startswith("secure")
        # what the server ran with, from its own configuration
        assert r["executor"]["security"] == {
            "tls": secure,
            "mutual_tls": False,
            "bearer_tokens": secure,
            "metrics": secure,
        }
        assert r["secure"] is secure and (r["metrics"]["scrapes"] > 0) is secure
        # the server that was measured refused a plaintext client and a TLS client without the token
        assert r["refused_without_credentials"] == (
            {"plaintext": "UNAVAILABLE", "tls_without_token": "UNAUTHENTICATED"} if secure else None
        )
        assert r["executor"]["ticks"] > 200 and r["bare_ticker"]["ticks"] > 200
        assert len(r["sessions_detail"]) == 2
        assert all(s["snapshots_received"] > 200 for s in r["sessions_detail"])  # the clients got through
    verdict = result["verdict"]
    assert len(verdict["lateness_p99_diff_us"]) == 2 and verdict["bound_us"] > 0
    assert result["what"]["sessions"] == 2 and len(result["what"]["load_average_at_end"]) == 3


def _run(secure: bool, late_p99: float, missed: int) -> dict:
    p99 = {"p99": late_p99}
    return {
        "secure": secure,
        "executor": {
            "lateness_us": p99,
            "tick_work_us": {"p99": 300.0},
            "missed_deadlines": missed,
            "cpu_fraction": 0.5,
        },
        "bare_ticker": {"lateness_us": {"p99": 10.0}, "missed_deadlines": 0},
        "sessions_detail": [{"snapshots_dropped": 1}, {"snapshots_dropped": 2}],
    }


def test_secure_verdict_is_absolute_and_pairs_each_secure_run_with_the_plain_one_before():
    from dualloop.controller.bench.tick import SECURE_P99_BOUND_US, secure_verdict

    runs = {"a": _run(False, 50.0, 0), "b": _run(True, 70.0, 0), "c": _run(False, 40.0, 0), "d": _run(True, 45.0, 0)}
    v = secure_verdict(runs)
    assert v["lateness_p99_diff_us"] == [20.0, 5.0] and v["dropped_secure"] == [3, 3] and v["met"]
    runs["d"] = _run(True, 40.0 + SECURE_P99_BOUND_US + 1, 0)  # over the bound: not met
    assert not secure_verdict(runs)["met"]
    runs["d"] = _run(True, 45.0, 1)  # a missed deadline where the plain runs missed none
    v = secure_verdict(runs)
    assert not v["kept_zero_missed"] and not v["met"]


def test_bench_tick_secure_refuses_metrics_and_names_the_extra_when_cryptography_is_missing(capsys, monkeypatch):
    ran = []
    monkeypatch.setattr(bench_cli, "bench_tick", lambda *a, **k: ran.append(k))
    assert main(["bench", "tick", "--secure", "both", "--metrics", "on"]) == 2
    assert "drop --metrics on" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "cryptography", None)  # import cryptography raises ImportError
    assert main(["bench", "tick", "--secure", "on"]) == 2
    out = capsys.readouterr().err
    assert "cryptography" in out and "dualloop[bench]" in out and not ran


def test_bench_replay_reports_both_paths(tmp_path):
    assert main(["bench", "replay", "--duration", "3", "--logs", "3", "--out", str(tmp_path)]) == 0
    (result_file,) = tmp_path.glob("replay-*.json")
    result = json.loads(result_file.read_text())
    assert len(result["logs"]) == 2
    fleet = result["fleet"]  # the whole command over 3 rotated drives of 3 s
    assert fleet["logs"] == 3 and fleet["drive_s"] == pytest.approx(3 * 3.0, abs=0.1)
    assert fleet["ticks"] > 3 * 590 and fleet["whole_command_s"] > fleet["bare_startup_s"] > 0
    assert fleet["per_log_s"]["median"] <= fleet["per_log_s"]["p99"] and len(fleet["load_average_before"]) == 3
    for r in result["logs"].values():
        assert r["ticks"] > 500 and r["same_decisions"]
        assert r["fast_compute_ms"]["runs"] == 7 and r["fast_compute_ms"]["min"] <= r["fast_compute_ms"]["median"]
        assert r["speedup_median"] > 0 and r["reference_compute_ms"] > 0 and r["end_to_end_ms"] > 0
        assert 0 < r["fast_compute_cpu_ms"]["min"] <= r["fast_compute_cpu_ms"]["median"] and r["speedup_cpu_median"] > 0
    # both as columns: the real drive and the synthetic log with its (finite) plans
    assert [r["read_as"] for r in result["logs"].values()] == ["columns", "columns"]


@pytest.mark.slow
def test_bench_gate_reports_each_session_count(tmp_path):
    """`dualloop bench gate`'s table: gate cost per session at each count, next to the forward pass."""
    from dualloop.controller.bench.gate import bench_gate_table
    from dualloop.controller.contract.gate_files import load_gate_for_model
    from dualloop.executor.model_runner import DecisionModel
    from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES

    model = DecisionModel(BASE_MODEL_PATH)
    gates = [load_gate_for_model(g, model) for g in DEFAULT_GATES]
    result = bench_gate_table(model, gates, (1, 3), ticks=60, out_dir=tmp_path)
    (result_file,) = tmp_path.glob("gate-*.json")
    assert json.loads(result_file.read_text()) == result
    assert set(result["sessions"]) == {"1", "3"}
    for row in result["sessions"].values():
        on, off = row["with gate"], row["without gate"]
        assert 0 < on["gate_us_p50"] <= on["gate_us_p99"] and on["forward_us_p50"] > 0
        assert on["gate_us_per_session_p50"] > 0 and off["gate_us_p50"] < on["gate_us_p50"]


@pytest.mark.slow
def test_bench_gate_cli_defaults_to_the_base_model_and_its_gates(tmp_path, monkeypatch):

    monkeypatch.setattr(bench_gate, "TICKS", 40)
    assert main(["bench", "gate", "--sessions", "2", "--out", str(tmp_path)]) == 0
    (result_file,) = tmp_path.glob("gate-*.json")
    result = json.loads(result_file.read_text())
    assert set(result["sessions"]) == {"1", "2", "8", "32"} and len(result["gates"]) == 2
    assert result["ticks"] == 40


def _assert_turns_counted(result: dict, duration_s: int, workers: int) -> None:
    """A turn of each kind and three in all, whichever kind a late start lost; the workers' k-th turns
    pooled into one (never more turns of a kind than the run has), never more ticks than every worker's
    whole run. A busy turn counts its 1.5 s at 200 Hz after settling (the run's end may cut the last
    short); an idle one only from when the SCHED_IDLE planner worker has answered what it was given
    before the pause, which on a loaded machine may be late in the turn, so it only has to count some."""
    assert result["idle"]["turns"] + result["busy"]["turns"] >= 3, result
    for side, least_per_whole_turn in (("idle", 0), ("busy", 250)):
        turns, ticks = result[side]["turns"], result[side]["ticks"]
        assert 1 <= turns <= duration_s / (2 * result["phase_s"]), result
        assert least_per_whole_turn * (turns - 1) < ticks <= workers * duration_s * 200, result


@pytest.mark.slow
def test_bench_planner_compares_idle_and_busy_turns_of_one_run(tmp_path, test_model_path):
    # 12 s in turns of 2 s: a turn is counted once the clients send, and a busy machine has started them
    # late enough to lose two turns of a 10 s run (one idle turn left); the comparison needs a turn of
    # each kind and three in all, whichever kind was lost
    assert (
        main(
            [
                "bench",
                "planner",
                "--model",
                str(test_model_path),
                "--sessions",
                "2",
                "--duration",
                "12",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    (result_file,) = tmp_path.glob("planner-*.json")
    result = json.loads(result_file.read_text())
    _assert_turns_counted(result, duration_s=12, workers=1)
    for side in ("idle", "busy"):
        assert set(result[side]["lateness_us"]) == {"min", "p50", "p99", "p99.9", "max"}
    low, high = result["p99_ratio_interval_95"]
    assert low <= result["p99_ratio_busy_over_idle"] <= high
    planner = result["planner_stats"]
    assert planner["source"] == "behaviour" and planner["plans"] >= 2 * 4 and planner["errors"] == 0


@pytest.mark.slow
def test_bench_planner_pools_the_turns_of_several_server_workers(tmp_path, test_model_path):
    # 16 s: on a loaded machine the clients connect late, and an idle turn counts only once the
    # SCHED_IDLE planner worker has answered what it was given before the pause: with both cores busy
    # that can take the whole turn (a clean CI run counted one idle turn of four in 16 s)
    duration_s = 16
    argv = ["bench", "planner", "--model", str(test_model_path), "--sessions", "2", "--workers", "2"]
    assert main([*argv, "--duration", str(duration_s), "--out", str(tmp_path)]) == 0
    (result_file,) = tmp_path.glob("planner-*.json")
    result = json.loads(result_file.read_text())
    assert result["workers"] == 2
    _assert_turns_counted(result, duration_s=duration_s, workers=2)
    planner = result["planner_stats"]  # summed over the workers: whichever got the sessions made the plans
    assert planner["source"] == "behaviour" and planner["plans"] >= 4 and planner["errors"] == 0


def test_planner_stats_of_several_workers_add_counts_and_keep_the_worst_times():
    idle = {"source": "behaviour", "worker_idle_priority": True, "plans": 0, "errors": 0, "applied": 0}
    idle |= {"plan_time_us_p99": None, "batch_time_us_p99": 0.0}
    busy = {"source": "behaviour", "worker_idle_priority": True, "plans": 40, "errors": 1, "applied": 38}
    busy |= {"plan_time_us_p99": 900.0, "batch_time_us_p99": 2500.0}
    merged = bench_tick._merge_planners([idle, None, busy])
    assert merged is not None
    assert (merged["plans"], merged["errors"], merged["applied"]) == (40, 1, 38)
    assert (merged["plan_time_us_p99"], merged["batch_time_us_p99"]) == (900.0, 2500.0)
    assert merged["source"] == "behaviour" and merged["worker_idle_priority"] is True
    assert bench_tick._merge_planners([None, None]) is None


def test_bench_planner_refuses_a_run_too_short_for_two_turns_of_each_kind(capsys, monkeypatch):

    ran = []
    monkeypatch.setattr(bench_cli, "bench_planner", lambda *a, **k: ran.append(a))
    assert main(["bench", "planner", "--duration", "7"]) == 2
    assert "--duration 7: too short" in capsys.readouterr().err and not ran
    # without --duration it runs long enough for a narrow interval: 600 s, 32 sessions
    assert main(["bench", "planner"]) == 0
    ((run, *_),) = ran
    assert (run.sessions, run.duration_s) == (32, 600.0)
