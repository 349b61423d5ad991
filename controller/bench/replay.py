"""`dualloop bench replay`: how much faster than real time a log replays, next to the per-tick path.

Two logs of 60 s on the 5 ms grid (12,000 ticks each): the real drive (100 Hz observations; the
gates veto part of it, so the safe-state machine has work to do) and a synthetic 200 Hz log made
from it with a client plan every 200 ms. For each log, in the same run:
  - the vectorised replay (`lockstep_batch.run_lockstep`) `repeats` times: compute time from decoded
    observations to every tick's decision (median, min, max), and its speed-up over real time;
  - the reference path (`advance_lockstep`, observation by observation) once: the baseline;
  - the whole command (read the MCAP, replay, build snapshots, write the new MCAP, report) once.
The process is pinned to one core while it runs: the target is "on one core".
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from threadpoolctl import threadpool_limits

from dualloop.controller.bench.tick import store_result
from dualloop.controller.logs.logfile import read_log
from dualloop.controller.logs.synthetic import REAL_DRIVE, slice_log, synthetic_log
from dualloop.controller.replay.lockstep import (
    _observations,
    build_executor,
    executor_config_for,
    replay_log,
    run_replay,
)
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES

GOAL_SPEEDUP = 1000.0


def _one_log(name: str, log: Path, model: Path, gates: tuple[Path, ...], repeats: int, out_dir: Path) -> dict[str, Any]:
    data = read_log(log)
    observations = _observations(data)
    config = executor_config_for(data.header)
    drive_s = (observations[-1].timestamp_ns - observations[0].timestamp_ns) / 1e9
    fast = []
    for _ in range(repeats):
        ex = build_executor(model, gates, config)
        snaps, timings = run_replay(ex, "bench", observations, fast=True)
        fast.append(timings["compute_s"])
    ex = build_executor(model, gates, config)
    reference, ref_timings = run_replay(ex, "bench", observations, fast=False)
    t0 = time.perf_counter()
    result = replay_log(log, model, gates, out_path=out_dir / f"{name}.replay.mcap")
    end_to_end = time.perf_counter() - t0
    median = statistics.median(fast)
    return {
        "log": str(log),
        "ticks": len(snaps),
        "observations": len(observations),
        "drive_s": drive_s,
        "fast_compute_ms": {"median": median * 1e3, "min": min(fast) * 1e3, "max": max(fast) * 1e3, "runs": len(fast)},
        "speedup_median": drive_s / median,
        "speedup_best": drive_s / min(fast),
        "reference_compute_ms": ref_timings["compute_s"] * 1e3,
        "reference_speedup": drive_s / ref_timings["compute_s"],
        "fast_over_reference": ref_timings["compute_s"] / median,
        "same_decisions": [s.applied.index for s in snaps] == [s.applied.index for s in reference],
        "end_to_end_ms": end_to_end * 1e3,
        "end_to_end_speedup": drive_s / end_to_end,
        "end_to_end_phases_ms": {k: v * 1e3 for k, v in result.timings.items()},
        "gate_veto_fraction": result.report.gate_veto_fraction,
    }


def bench_replay(
    model: Path = BASE_MODEL_PATH,
    gates: tuple[Path, ...] = DEFAULT_GATES,
    repeats: int = 7,
    out_dir: Path = Path("runs/bench"),
    seconds: float = 60.0,
    console: Console | None = None,
) -> dict[str, Any]:
    """`seconds` < 60 shortens both logs (the real drive is cut to its first `seconds`)."""
    console = console or Console()
    pinned = hasattr(os, "sched_setaffinity")
    if pinned:
        cpus = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {min(cpus)})
    try:  # one core, one BLAS thread (more threads on one core would only take turns)
        with threadpool_limits(1), tempfile.TemporaryDirectory() as tmp, console.status("replaying") as status:
            tmp_dir = Path(tmp)
            real = REAL_DRIVE if seconds >= 60.0 else slice_log(tmp_dir / "real.mcap", 0, int(seconds * 100), "real")
            logs = {
                "real drive (100 Hz)": real,
                "synthetic (200 Hz, plans)": synthetic_log(tmp_dir / "synthetic.mcap", seconds=seconds, rate_hz=200.0),
            }
            results = {}
            for name, log in logs.items():
                status.update(f"replaying {name}")
                results[name] = _one_log(name.split()[0], log, model, gates, repeats, tmp_dir)
    finally:
        if pinned:
            os.sched_setaffinity(0, cpus)
    result = {
        "when": datetime.now().isoformat(timespec="seconds"),
        "model": str(model),
        "gates": [str(g) for g in gates],
        "pinned_to_one_core": pinned,
        "logs": results,
    }
    path = store_result(out_dir, "replay", result)
    print_replay_report(result, console)
    console.print(f"results: {path}")
    return result


def print_replay_report(result: dict[str, Any], console: Console) -> None:
    table = Table(title="replay speed, one core" if result["pinned_to_one_core"] else "replay speed")
    for col in (
        "log",
        "ticks",
        "replay ms (median, min-max)",
        "x real time",
        "per-tick path ms",
        "speed-up",
        "whole command ms",
        "x real time",
    ):
        table.add_column(col, justify="right")
    for name, r in result["logs"].items():
        f = r["fast_compute_ms"]
        table.add_row(
            name,
            str(r["ticks"]),
            f"{f['median']:.1f} ({f['min']:.1f}-{f['max']:.1f})",
            f"{r['speedup_median']:.0f}x",
            f"{r['reference_compute_ms']:.0f}",
            f"{r['fast_over_reference']:.0f}x",
            f"{r['end_to_end_ms']:.0f}",
            f"{r['end_to_end_speedup']:.0f}x",
        )
    console.print(table)
    worst = min(r["speedup_median"] for r in result["logs"].values())
    verdict = "[green]met[/]" if worst >= GOAL_SPEEDUP else "[red]not met[/]"
    console.print(
        f"goal: replay >= {GOAL_SPEEDUP:.0f}x real time on one core: {verdict} (slowest log {worst:.0f}x). "
        "The whole command adds reading and writing MCAP (per message in the mcap library) and the report."
    )
    if not all(r["same_decisions"] for r in result["logs"].values()):
        console.print("[red]the vectorised replay and the per-tick path disagree on applied actions[/]")
