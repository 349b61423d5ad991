"""`dualloop bench replay`: how much faster than real time a log replays, next to the per-tick path.

Two logs of 60 s on the 5 ms grid (12,000 ticks each): the real drive (100 Hz observations; the
gates veto part of it, so the safe-state machine has work to do) and a synthetic 200 Hz log made
from it with a client plan every 200 ms. For each log, in the same run:
  - the vectorised replay (`lockstep_batch.run_lockstep`) `repeats` times: compute time from decoded
    observations to every tick's decision (median, min, max), and its speed-up over real time;
  - the reference path (`advance_lockstep`, observation by observation) once: the baseline;
  - the whole command (read the MCAP, replay, build snapshots, write the new MCAP, report) once.
The process is pinned to one core while it runs: the target is "on one core".

Then the fleet (`logs` > 0): that many 60 s logs cut from the real drive (each the drive rotated
by a different offset, its end joined to its start: real sensor data, distinct logs), replayed by
the whole command, `dualloop replay LOG... --workers W` in a new interpreter, on every core it is
given: wall time from launch to exit (interpreter start-up, worker start-up and model loads, reading,
replaying, writing the new logs, the reports), its aggregate x real time, and the per-log times
from its --report (median, p99). Beside it, in the same run, the bare start-up of the command
(`dualloop replay --help`), and the machine's load average before and after.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table
from threadpoolctl import threadpool_limits

from dualloop.controller.bench.harness import store_result
from dualloop.controller.logs.bulk import TopicMessages, write_messages
from dualloop.controller.logs.format import FORMAT_VERSION, TOPIC_HEADER, TOPIC_OBSERVATION
from dualloop.controller.logs.logfile import read_log
from dualloop.controller.logs.synthetic import REAL_DRIVE, slice_log, synthetic_log
from dualloop.controller.replay.lockstep import (
    _observations,
    build_executor,
    executor_config_for,
    read_columns,
    replay_log,
    run_replay,
)
from dualloop.executor.lockstep_batch import TickTable
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES

GOAL_SPEEDUP = 1000.0
# `python -c` running the CLI as the console script does (no dependence on where the script lives)
_CLI = "import sys; from dualloop.controller.cli import main; sys.exit(main(sys.argv[1:]))"


def rotated_drives(out_dir: Path, count: int, seconds: float = 60.0, source: Path = REAL_DRIVE) -> list[Path]:
    """`count` logs of the real drive's first `seconds`, log k rotated by k * 59 observations (its end
    joined to its start; the join's interval is the drive's median interval), seq and timestamps
    renumbered so each is a valid log of its own."""
    src = read_log(source)
    obs = src.observations
    ts = np.fromiter((o.timestamp_ns for o in obs), np.int64, len(obs))
    gaps = np.diff(ts)
    join = int(np.median(gaps))
    n = len(obs)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for k in range(count):
        offset = (k * 59) % n
        order = np.concatenate([np.arange(offset, n), np.arange(0, offset)])
        steps = np.concatenate([[0], np.where(order[1:] == order[:-1] + 1, gaps[np.minimum(order[:-1], n - 2)], join)])
        times = ts[0] + np.cumsum(steps)
        keep = times - times[0] <= int(seconds * 1e9)
        data = []
        for i, j in enumerate(order[keep].tolist()):
            msg = type(obs[j])()
            msg.CopyFrom(obs[j])
            msg.seq, msg.timestamp_ns = i + 1, int(times[i])
            data.append(msg.SerializeToString(deterministic=True))
        header = type(src.header)()
        header.CopyFrom(src.header)
        header.session_id = f"rotated-{k:03d}"
        header.source = f"{src.header.source}, rotated by {offset} observations (bench replay)"
        header.format_version = header.format_version or FORMAT_VERSION
        path = out_dir / f"drive-{k:03d}.mcap"
        write_messages(
            path,
            header.session_id,
            [
                TopicMessages(TOPIC_HEADER, [header.SerializeToString(deterministic=True)], times[:1]),
                TopicMessages(TOPIC_OBSERVATION, data, times[keep]),
            ],
        )
        paths.append(path)
    return paths


def _run_cli(args: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _CLI, *args], capture_output=True, text=True, check=False)
    return time.perf_counter() - t0, done


def bench_fleet(
    model: Path, gates: tuple[Path, ...], logs: int, workers: int | None, seconds: float, tmp_dir: Path
) -> dict[str, Any]:
    """The whole `dualloop replay` command over `logs` rotated drives (see the module's doc)."""
    paths = rotated_drives(tmp_dir / "fleet", logs, seconds)
    report = tmp_dir / "fleet-report.json"
    gate_args = [a for g in gates for a in ("--gate", str(g))] if gates else ["--no-gate"]
    startup_s, _ = _run_cli(["replay", "--help"])
    load_before = list(os.getloadavg())
    args = ["replay", *map(str, paths), "--model", str(model), *gate_args, "--out", str(tmp_dir / "fleet-out")]
    args += ["--report", str(report)] + (["--workers", str(workers)] if workers else [])
    wall, done = _run_cli(args)
    load_after = list(os.getloadavg())
    if done.returncode != 0:
        raise RuntimeError(f"dualloop replay exited {done.returncode}: {done.stderr[-2000:] or done.stdout[-2000:]}")
    fleet = json.loads(report.read_text())
    pooled = fleet["pooled"]
    per_log = [r["seconds"] for r in fleet["logs"]]
    drive_s = pooled["drive_s"]
    return {
        "logs": logs,
        "log_source": f"{REAL_DRIVE.name} rotated (rotated_drives), {seconds:g} s each",
        "workers": pooled["workers"],
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "drive_s": drive_s,
        "ticks": pooled["ticks"],
        "whole_command_s": wall,
        "whole_command_speedup": drive_s / wall,
        "goal_wall_s": drive_s / GOAL_SPEEDUP,  # the absolute bound beside the ratio
        "in_process_wall_s": pooled["wall_s"],  # replay_many's own wall time (pool start-up included)
        "per_log_s": {
            "median": float(np.median(per_log)),
            "p99": float(np.percentile(per_log, 99)),
            "max": max(per_log),
        },
        "per_log_cpu_s": {  # the worker's CPU time per log: what a log costs without the machine's waits
            "median": float(np.median([r["cpu_s"] for r in fleet["logs"]])),
            "p99": float(np.percentile([r["cpu_s"] for r in fleet["logs"]], 99)),
        },
        # drive time over the workers' CPU time spread on the workers: the speed an idle machine
        # with that many cores would approach (start-up not included)
        "cpu_bound_speedup": drive_s / (pooled["worker_cpu_s"] / max(1, pooled["workers"])),
        "per_log_compute_s": {
            "median": float(np.median([r["compute_s"] for r in fleet["logs"]])),
            "p99": float(np.percentile([r["compute_s"] for r in fleet["logs"]], 99)),
        },
        "bare_startup_s": startup_s,  # `dualloop replay --help`: the interpreter and imports alone
        "load_average_before": load_before,
        "load_average_after": load_after,
    }


def _one_log(name: str, log: Path, model: Path, gates: tuple[Path, ...], repeats: int, out_dir: Path) -> dict[str, Any]:
    data = read_log(log)
    # as `dualloop replay` reads it: as columns when the decoder takes it, else an Observation per message
    columns = read_columns(log)
    observations = columns.observations if columns is not None else _observations(data)
    config = executor_config_for(data.header)
    drive_s = (observations[-1].timestamp_ns - observations[0].timestamp_ns) / 1e9
    fast, fast_cpu = [], []
    tables: list[TickTable] = []
    for _ in range(repeats):
        ex = build_executor(model, gates, config)
        cpu0 = time.process_time()
        _, timings = run_replay(ex, "bench", observations, fast=True, table_out=tables, snapshots=False)
        fast_cpu.append(time.process_time() - cpu0)
        fast.append(timings["compute_s"])
    snaps = tables[-1].snapshots()
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
        "read_as": "columns" if columns is not None else "observations",
        "fast_compute_ms": {"median": median * 1e3, "min": min(fast) * 1e3, "max": max(fast) * 1e3, "runs": len(fast)},
        # CPU time: what the replay costs without the waits of a busy machine
        "fast_compute_cpu_ms": {"median": statistics.median(fast_cpu) * 1e3, "min": min(fast_cpu) * 1e3},
        "speedup_cpu_median": drive_s / statistics.median(fast_cpu),
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
    logs: int = 100,
    workers: int | None = None,
) -> dict[str, Any]:
    """`seconds` < 60 shortens both logs (the real drive is cut to its first `seconds`); `logs`: the
    fleet's size (0: no fleet), `workers` its pool (default: the cores)."""
    console = console or Console()
    load_at_start = list(os.getloadavg())
    pinned = hasattr(os, "sched_setaffinity")
    if pinned:
        cpus = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {min(cpus)})
    try:  # one core, one BLAS thread (more threads on one core would only take turns)
        with threadpool_limits(1), tempfile.TemporaryDirectory() as tmp, console.status("replaying") as status:
            tmp_dir = Path(tmp)
            real = REAL_DRIVE if seconds >= 60.0 else slice_log(tmp_dir / "real.mcap", 0, int(seconds * 100), "real")
            bench_logs = {
                "real drive (100 Hz)": real,
                "synthetic (200 Hz, plans)": synthetic_log(tmp_dir / "synthetic.mcap", seconds=seconds, rate_hz=200.0),
            }
            results = {}
            for name, log in bench_logs.items():
                status.update(f"replaying {name}")
                results[name] = _one_log(name.split()[0], log, model, gates, repeats, tmp_dir)
    finally:
        if pinned:
            os.sched_setaffinity(0, cpus)
    fleet = None
    if logs > 0:
        with tempfile.TemporaryDirectory() as tmp, console.status(f"replaying {logs} logs (the whole command)"):
            fleet = bench_fleet(model, gates, logs, workers, seconds, Path(tmp))
    result = {
        "when": datetime.now().isoformat(timespec="seconds"),
        "model": str(model),
        "gates": [str(g) for g in gates],
        "pinned_to_one_core": pinned,
        "load_average_at_start": load_at_start,
        "load_average_at_end": list(os.getloadavg()),
        "logs": results,
        "fleet": fleet,
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
    for name, r in result["logs"].items():
        cpu = r["fast_compute_cpu_ms"]
        console.print(
            f"{name}: read as {r['read_as']}; replay CPU {cpu['median']:.1f} ms median ({cpu['min']:.1f} min) = "
            f"{r['speedup_cpu_median']:.0f}x real time on CPU time"
        )
    worst = min(r["speedup_median"] for r in result["logs"].values())
    verdict = "[green]met[/]" if worst >= GOAL_SPEEDUP else "[red]not met[/]"
    console.print(
        f"goal: replay >= {GOAL_SPEEDUP:.0f}x real time on one core: {verdict} (slowest log {worst:.0f}x). "
        "The whole command adds reading the log, writing the new one, the report and the evaluation."
    )
    fleet = result.get("fleet")
    if fleet:
        ok = fleet["whole_command_speedup"] >= GOAL_SPEEDUP
        wall, cpu = fleet["per_log_s"], fleet["per_log_cpu_s"]
        console.print(
            f"fleet: {fleet['logs']} logs ({fleet['log_source']}), {fleet['drive_s']:.0f} s of drive, "
            f"{fleet['workers']} workers on {fleet['cores']} cores: the whole command took "
            f"{fleet['whole_command_s']:.2f} s = {fleet['whole_command_speedup']:.0f}x real time "
            f"(goal >= {GOAL_SPEEDUP:.0f}x, i.e. <= {fleet['goal_wall_s']:.2f} s: "
            + ("[green]met[/]" if ok else "[red]not met[/]")
            + f"); per log {wall['median'] * 1e3:.0f} ms median, {wall['p99'] * 1e3:.0f} ms p99 "
            f"(CPU {cpu['median'] * 1e3:.0f} ms median, {cpu['p99'] * 1e3:.0f} ms p99: "
            f"{fleet['cpu_bound_speedup']:.0f}x real time on {fleet['workers']} idle cores without start-up; "
            f"replay compute {fleet['per_log_compute_s']['median'] * 1e3:.0f} ms median); bare start-up of the "
            f"command {fleet['bare_startup_s']:.2f} s; load average {fleet['load_average_before'][0]:.2f} before, "
            f"{fleet['load_average_after'][0]:.2f} after"
        )
    console.print(
        f"machine load average (1 min) {result['load_average_at_start'][0]:.2f} at start, "
        f"{result['load_average_at_end'][0]:.2f} at end, on {os.cpu_count()} cores: other work slows every number"
    )
    if not all(r["same_decisions"] for r in result["logs"].values()):
        console.print("[red]the vectorised replay and the per-tick path disagree on applied actions[/]")
