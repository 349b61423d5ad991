"""`dualloop bench planner`: executor tick lateness with the planner busy next to the planner idle.

One run of the `bench tick` processes (server, N REALTIME client sessions, bare ticker) with the
built-in behaviour planner, which the server pauses and resumes in turns (PHASE_S each, starting
paused). Busy phases plan every session every period in the worker process; idle phases make no
request (the worker process stays up, waiting). Each phase's first SETTLE_S is left out: a batch
asked for just before a pause may still be being planned. Alternating in one run, not two windows
one after the other, gives both sides the same machine: on this shared 2-core VM the background load
moves over tens of seconds, and two separate windows measured its drift more than the planner
(idle p99 went from 29 to 540 us between windows minutes apart). The goal is busy p99 <= 1.2x idle p99.

The paused phases would leave plans to age past the executor's limit and put every session into
STALE_PLAN fallback, a different tick path; the bench server raises that limit, and plan freshness
is reported from the scheduler's request -> plan latency instead.
"""

from __future__ import annotations

import collections
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from rich.console import Console
from rich.table import Table

from dualloop.controller.bench.harness import P99_BOUND_US, Result, TickRun, floor_failures, store_result
from dualloop.controller.bench.tick import _bench_tick, cause_name, missed_text, print_ran
from dualloop.controller.serve.lifecycle import new_event_loop
from dualloop.controller.serve.ticker import percentiles_us

GOAL_RATIO = 1.2
PHASE_S = 2.0
BOOTSTRAP_SEED = 0


def compare_turns(rows: npt.NDArray[np.int64], resamples: int = 2000, seed: int = BOOTSTRAP_SEED) -> dict[str, Any]:
    """rows (turn, busy, lateness ns): percentiles of each side, the busy/idle p99 ratio and its 95%
    interval from a bootstrap over whole turns (ticks within a turn are not independent: a noisy
    second of the VM makes a run of late ticks, so resampling single ticks would overstate certainty)."""
    turn, busy, late = rows[:, 0], rows[:, 1].astype(bool), rows[:, 2]
    sides = {
        name: [late[turn == k] for k in np.unique(turn[busy == flag])]
        for name, flag in (("idle", False), ("busy", True))
    }  # a turn with no tick has no row
    if not sides["idle"] or not sides["busy"]:
        raise ValueError("the run ended before both an idle and a busy turn were measured")
    result: dict[str, Any] = {
        name: {"turns": len(t), "ticks": int(sum(x.size for x in t)), "lateness_us": percentiles_us(np.concatenate(t))}
        for name, t in sides.items()
    }
    result["p99_ratio_busy_over_idle"] = result["busy"]["lateness_us"]["p99"] / max(
        result["idle"]["lateness_us"]["p99"], 1e-3
    )
    rng = np.random.default_rng(seed)
    ratios = np.empty(resamples)
    for r in range(resamples):
        p99 = [
            np.percentile(np.concatenate([t[i] for i in rng.integers(0, len(t), len(t))]), 99)
            for t in (sides["idle"], sides["busy"])
        ]
        ratios[r] = p99[1] / max(p99[0], 1.0)  # 1 ns floor: a p99 of 0 would divide by zero
    result["p99_ratio_interval_95"] = [float(np.percentile(ratios, 2.5)), float(np.percentile(ratios, 97.5))]
    return result


def planner_verdict(result: dict[str, Any]) -> dict[str, Any]:
    """The goal with absolute bounds beside the ratio: a ratio of two overloaded windows is no pass."""
    failures = floor_failures(result.get("bare_missed_deadlines", 0), result["bare_lateness_us"]["p99"])
    if result["missed_deadlines"]:
        failures.append(missed_text(result["missed_deadlines"], result["missed_beside_floor"]))
    for side in ("idle", "busy"):
        p99 = result[side]["lateness_us"]["p99"]
        if not p99 < P99_BOUND_US:
            failures.append(f"{side} p99 {p99:.0f} us >= {P99_BOUND_US:.0f} us")
    if not result["p99_ratio_busy_over_idle"] <= GOAL_RATIO:
        failures.append(f"busy/idle p99 {result['p99_ratio_busy_over_idle']:.2f}x > {GOAL_RATIO}x")
    return {"met": not failures, "failures": failures, "ratio_bound": GOAL_RATIO, "p99_bound_us": P99_BOUND_US}


def print_planner_report(result: dict[str, Any], console: Console) -> None:
    table = Table(
        title=f"tick lateness (us), {result['sessions']} REALTIME sessions, {result['duration_s']:.0f} s "
        f"in turns of {result['phase_s']:.0f} s"
    )
    for col in ("planner", "turns", "ticks", "p50", "p99", "p99.9", "max"):
        table.add_column(col, justify="right")
    for name in ("idle", "busy"):
        w = result[name]
        lat = w["lateness_us"]
        table.add_row(
            name if name == "idle" else f"busy ({result['planner']})",
            str(w["turns"]),
            str(w["ticks"]),
            *(f"{lat[k]:.0f}" for k in ("p50", "p99", "p99.9", "max")),
        )
    console.print(table)
    bare_causes = collections.Counter(cause_name(c) for c in result.get("bare_missed_causes", ()))
    bare_why = f" ({', '.join(f'{k} {n}' for k, n in bare_causes.most_common())})" if bare_causes else ""
    console.print(
        f"whole run: {missed_text(result['missed_deadlines'], result['missed_beside_floor'])}; bare ticker "
        f"{result['bare_missed_deadlines']} missed{bare_why}, p99 {result['bare_lateness_us']['p99']:.0f} us (the "
        f"machine's floor in the same run)"
    )
    if result.get("gc"):
        g = result["gc"]
        console.print(
            f"server's garbage collector (whole run): collections by generation {g['collections']}, longest pause "
            f"{g['longest_us']} us, {g['total_ms']:.0f} ms in all"
        )
    ratio = result["p99_ratio_busy_over_idle"]
    low, high = result["p99_ratio_interval_95"]
    v = result["verdict"]
    console.print(
        f"p99 busy/idle: [bold]{ratio:.2f}x[/] (95% interval {low:.2f}-{high:.2f}x, bootstrap over turns); "
        f"goal: <= {GOAL_RATIO}x with both windows' p99 < {P99_BOUND_US:.0f} us and 0 missed: "
        + ("[green]met[/]" if v["met"] else "[yellow]not met[/]: " + "; ".join(v["failures"])),
        highlight=False,
    )
    p = result["planner_stats"] or {}
    if p:
        which = (
            "worker process"
            if result.get("workers", 1) == 1
            else f"the {result['workers']} server workers' (counts summed, times the worst worker's)"
        )
        console.print(
            f"planner ({p['source']}, {which}): {p['plans']} plans in {p['batches']} batches "
            f"(p50 {p['batch_size_p50']:.0f} sessions), time per batch p50 "
            f"{p['batch_time_us_p50'] / 1e3:.2f} ms, p99 {p['batch_time_us_p99'] / 1e3:.2f} ms (CPU p50 "
            f"{p['batch_cpu_us_p50'] / 1e3:.2f} ms, p99 {p['batch_cpu_us_p99'] / 1e3:.2f} ms), per plan p50 "
            f"{p['plan_time_us_p50'] / 1e3:.2f} ms, p99 {p['plan_time_us_p99'] / 1e3:.2f} ms; request -> "
            f"plan p99 {p['latency_us_p99'] / 1e3:.1f} ms; overruns (missed cycles) {p['overruns']}, "
            f"errors {p['errors']}, timeouts {p['timeouts']}, restarts {p['restarts']}, batches that waited "
            f"for a CPU past the deadline {p['starved_batches']}"
        )
        policy = (
            f"SCHED_IDLE, raised to SCHED_BATCH while a batch waited for a CPU: {p.get('priority_raises', 0)} times"
            if p.get("worker_idle_priority")
            else "SCHED_BATCH"
        )
        console.print(f"planner worker's CPU policy: {policy}")


def bench_planner(
    run: TickRun, out_dir: Path = Path("runs/bench"), console: Console | None = None, phase_s: float = PHASE_S
) -> Result:
    """One run, planner idle and busy in turns; prints and stores the comparison. run.workers: server
    processes sharing the port, each with its own planner worker, all starting idle together: the
    k-th turn of every worker is the same window of the run, so their ticks are pooled by turn."""
    if run.duration_s < 4 * phase_s:
        raise ValueError(
            f"--duration {run.duration_s:g} s is too short: at least two idle and two busy phases of "
            f"{phase_s:g} s are needed ({4 * phase_s:g} s)"
        )
    console = console or Console()
    planner = run.planner
    loop = new_event_loop()
    try:
        label = f"planner idle/busy ({planner})"
        measured = loop.run_until_complete(_bench_tick(replace(run, label=label, alternate_s=phase_s), console))
    finally:
        loop.close()
    ex = measured["executor"]
    result: dict[str, Any] = {
        "when": datetime.now().isoformat(timespec="seconds"),
        "model": str(run.model),
        "ran": measured["ran"],
        "sessions": run.sessions,
        "workers": run.workers,
        "duration_s": run.duration_s,
        "phase_s": phase_s,
        "guard_ms": run.guard_ms,
        "planner": planner,
        "scheduling": measured["scheduling"],
        **compare_turns(measured["_raw"]["executor_lateness_ns"]),
        "missed_deadlines": ex["missed_deadlines"],
        "bare_lateness_us": measured["bare_ticker"]["lateness_us"],
        "cpu_fraction": ex["cpu_fraction"],
        "planner_stats": ex["planner"],
        "tick_gaps": sum(s["tick_gaps"] for s in measured["sessions_detail"]),
        "snapshots_dropped": sum(s["snapshots_dropped"] for s in measured["sessions_detail"]),
        "bare_missed_deadlines": measured["bare_ticker"]["missed_deadlines"],
        "missed_beside_floor": measured["missed_beside_floor"],
        "missed_causes": ex["missed_causes"],
        "bare_missed_causes": measured["bare_ticker"]["missed_causes"],
        "gc": ex.get("gc"),
    }
    result["verdict"] = planner_verdict(result)
    path = store_result(out_dir, "planner", result)
    print_ran(measured, console)
    print_planner_report(result, console)
    console.print(f"results: {path}")
    return result
