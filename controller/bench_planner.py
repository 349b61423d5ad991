"""`dualloop bench planner`: executor tick lateness with the planner busy next to the planner idle.

Two windows in one run, each with the `bench tick` processes (server, clients, bare ticker): first
the same N REALTIME sessions with no server planner (idle), then with the built-in behaviour planner
planning every session every period in its worker process (busy). The goal is busy p99 <= 1.2x idle
p99; each window's bare ticker shows how noisy the machine was at the time.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from controller.bench import _bench_tick, store_result
from controller.server import new_event_loop

GOAL_RATIO = 1.2


def _window(result: dict[str, Any]) -> dict[str, Any]:
    ex = result["executor"]
    sessions = result["sessions_detail"]
    return {"lateness_us": ex["lateness_us"], "missed_deadlines": ex["missed_deadlines"], "ticks": ex["ticks"],
            "bare_lateness_us": result["bare_ticker"]["lateness_us"],
            "p99_ratio_executor_over_bare": result["p99_ratio_executor_over_bare"],
            "cpu_fraction": ex["cpu_fraction"], "planner": ex.get("planner"),
            "tick_gaps": sum(s["tick_gaps"] for s in sessions),
            "snapshots_dropped": sum(s["snapshots_dropped"] for s in sessions),
            "stale_plan_ticks": sum(s["reasons"].get("STALE_PLAN", 0) for s in sessions)}


def print_planner_report(result: dict[str, Any], console: Console) -> None:
    table = Table(title=f"tick lateness (us), {result['sessions']} REALTIME sessions, "
                        f"{result['duration_s']:.0f} s per window")
    for col in ("planner", "p50", "p99", "p99.9", "max", "missed", "bare p99"):
        table.add_column(col, justify="right")
    for name in ("idle", "busy"):
        w = result[name]
        lat = w["lateness_us"]
        table.add_row(name if name == "idle" else f"busy ({result['planner']})",
                      *(f"{lat[k]:.0f}" for k in ("p50", "p99", "p99.9", "max")),
                      str(w["missed_deadlines"]), f"{w['bare_lateness_us']['p99']:.0f}")
    console.print(table)
    ratio = result["p99_ratio_busy_over_idle"]
    verdict = "[green]within[/]" if ratio <= GOAL_RATIO else "[red]over[/]"
    console.print(f"p99 busy/idle: [bold]{ratio:.2f}x[/] ({verdict} the {GOAL_RATIO}x goal)")
    p = result["busy"]["planner"] or {}
    if p:
        console.print(f"planner ({p['source']}, worker process): {p['plans']} plans in {p['batches']} batches "
                      f"(p50 {p['batch_size_p50']:.0f} sessions), time per batch p50 "
                      f"{p['batch_time_us_p50'] / 1e3:.2f} ms, p99 {p['batch_time_us_p99'] / 1e3:.2f} ms (CPU p50 "
                      f"{p['batch_cpu_us_p50'] / 1e3:.2f} ms, p99 {p['batch_cpu_us_p99'] / 1e3:.2f} ms), per plan p50 "
                      f"{p['plan_time_us_p50'] / 1e3:.2f} ms, p99 {p['plan_time_us_p99'] / 1e3:.2f} ms; request -> "
                      f"plan p99 {p['latency_us_p99'] / 1e3:.1f} ms; overruns (missed cycles) {p['overruns']}, "
                      f"errors {p['errors']}, timeouts {p['timeouts']}, restarts {p['restarts']}, batches that waited "
                      f"for a CPU past the deadline {p['starved_batches']}; "
                      f"STALE_PLAN ticks {result['busy']['stale_plan_ticks']}")


def bench_planner(model: Path, sessions: int = 32, duration_s: float = 30.0, out_dir: Path = Path("runs/bench"),
                  guard_ms: float = 2.0, rt_priority: int | None = None, planner: str = "behaviour",
                  console: Console | None = None) -> dict[str, Any]:
    """Idle window, then busy window, same sessions and settings; prints and stores the comparison."""
    console = console or Console()
    loop = new_event_loop()
    try:
        idle = loop.run_until_complete(_bench_tick(model, sessions, duration_s, guard_ms, rt_priority, console,
                                                   planner="none", label="planner idle"))
        busy = loop.run_until_complete(_bench_tick(model, sessions, duration_s, guard_ms, rt_priority, console,
                                                   planner=planner, label=f"planner busy ({planner})"))
    finally:
        loop.close()
    result: dict[str, Any] = {
        "when": datetime.now().isoformat(timespec="seconds"), "model": str(model), "sessions": sessions,
        "duration_s": duration_s, "guard_ms": guard_ms, "planner": planner,
        "scheduling": busy["scheduling"], "idle": _window(idle), "busy": _window(busy),
    }
    result["p99_ratio_busy_over_idle"] = (result["busy"]["lateness_us"]["p99"]
                                          / max(result["idle"]["lateness_us"]["p99"], 1e-9))
    path = store_result(out_dir, "planner", result)
    print_planner_report(result, console)
    console.print(f"results: {path}")
    return result
