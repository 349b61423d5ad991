"""`dualloop bench tick`: executor timing under real gRPC load, next to a bare ticker in the same run.

Three processes share the machine for the same window: this one serves (executor + gRPC), one runs
N REALTIME client sessions, one runs the bare ticker (nothing but waiting for the same deadlines).
The bare ticker's lateness is the machine's floor under that load; the executor is judged against it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from controller.config import ServerConfig
from controller.server import ControllerServer, new_event_loop
from controller.ticker import percentiles_us
from executor.core import ExecutorStats


async def _subprocess(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(sys.executable, "-m", "controller.bench_clients", *args,
                                                stdout=asyncio.subprocess.PIPE)


async def _bench_tick(model: Path, sessions: int, duration_s: float, guard_ms: float,
                      console: Console) -> dict[str, Any]:
    server = ControllerServer(ServerConfig(model=model, port=0, executor={"max_sessions": max(sessions, 1),
                                                                          "ticker_guard_ms": guard_ms}))
    port = await server.start()
    runtime, executor = server.runtime, server.executor
    with tempfile.TemporaryDirectory() as tmp:
        bare_file = str(Path(tmp) / "bare.npy")
        clients = await _subprocess("clients", "--address", f"127.0.0.1:{port}", "--sessions", str(sessions),
                                    "--duration", str(duration_s))
        # Measure only while all sessions are connected.
        while runtime.stats.sessions_opened < sessions and clients.returncode is None:
            await asyncio.sleep(0.01)
        bare = await _subprocess("bare", "--duration", str(duration_s), "--save", bare_file,
                                 "--guard-ms", str(guard_ms))
        runtime.stats.reset()
        executor.stats = ExecutorStats()
        missed0 = runtime.ticker.missed
        cpu0, t0 = time.process_time(), time.monotonic()
        with Progress(TextColumn("[bold]bench tick[/]"), BarColumn(), TextColumn("{task.completed:.0f}/{task.total:.0f} s"),
                      TimeRemainingColumn(), console=console, transient=True) as progress:
            task = progress.add_task("run", total=duration_s)
            while clients.returncode is None:
                progress.update(task, completed=min(duration_s, time.monotonic() - t0))
                try:
                    await asyncio.wait_for(clients.wait(), 0.25)
                except asyncio.TimeoutError:
                    pass
        cpu_s, wall_s = time.process_time() - cpu0, time.monotonic() - t0
        stats = runtime.stats
        snapshot = {
            "ticks": stats.ticks, "missed": runtime.ticker.missed - missed0,
            "lateness": stats.lateness.values(), "decision_latency": stats.decision_latency.values(),
            "tick_work": stats.tick_work_ns.values(), "stage_ns": executor.stats.stage_ns.copy(),
            "rows": executor.stats.rows, "stream_ns": stats.stream_ns, "sent": stats.snapshots_sent,
        }
        client_out, _ = await clients.communicate()
        bare_out, _ = await bare.communicate()
        bare_values = np.load(bare_file)
    await server.stop()
    if clients.returncode != 0 or bare.returncode != 0:
        raise RuntimeError(f"bench subprocess failed (clients exit {clients.returncode}, bare exit {bare.returncode})")
    per_session = json.loads(client_out)
    bare_result = json.loads(bare_out)
    ticks = max(snapshot["ticks"], 1)
    stage = snapshot["stage_ns"] / ticks / 1e3
    cpu_per_tick_us = cpu_s / ticks * 1e6
    split = {"model": float(stage[0] + stage[1]), "rules": float(stage[3]), "gate": float(stage[2]),
             "streaming": snapshot["stream_ns"] / ticks / 1e3}
    split["other (gRPC I/O, event loop, precise wait)"] = cpu_per_tick_us - sum(split.values())
    ex_lat = percentiles_us(snapshot["lateness"])
    bare_lat = bare_result["lateness_us"]
    return {
        "when": datetime.now().isoformat(timespec="seconds"), "sessions": sessions, "duration_s": wall_s,
        "executor": {"ticks": snapshot["ticks"], "missed_deadlines": snapshot["missed"], "lateness_us": ex_lat,
                     "tick_work_us": percentiles_us(snapshot["tick_work"]),
                     "decision_latency_us": percentiles_us(snapshot["decision_latency"]),
                     "cpu_per_tick_us": split, "cpu_fraction": cpu_s / wall_s,
                     "snapshots_sent": snapshot["sent"]},
        "bare_ticker": {"ticks": bare_result["ticks"], "missed_deadlines": bare_result["missed"],
                        "lateness_us": bare_lat, "cpu_fraction": bare_result["cpu_fraction"]},
        "p99_ratio_executor_over_bare": ex_lat["p99"] / max(bare_lat["p99"], 1e-9),
        "sessions_detail": per_session,
        "_raw": {"executor_lateness_ns": snapshot["lateness"], "bare_lateness_ns": bare_values},
    }


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, values in (("executor (serving gRPC)", result["_raw"]["executor_lateness_ns"]),
                          ("bare ticker (same run)", result["_raw"]["bare_lateness_ns"])):
        v = np.sort(values.astype(np.float64) / 1e3)
        if v.size:
            ax.plot(np.maximum(v, 0.01), 1.0 - np.arange(v.size) / v.size, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tick lateness (us)")
    ax.set_ylabel("fraction of ticks later than x")
    ax.set_title(f"{result['sessions']} REALTIME sessions, {result['duration_s']:.0f} s, 5 ms ticks")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_tick_report(result: dict[str, Any], console: Console) -> None:
    ex, bare = result["executor"], result["bare_ticker"]
    table = Table(title=f"tick lateness, {result['sessions']} sessions, {result['duration_s']:.1f} s (us)")
    for col in ("", "min", "p50", "p99", "p99.9", "max", "missed"):
        table.add_column(col, justify="right")
    for name, r in (("executor", ex), ("bare ticker", bare)):
        lat = r["lateness_us"]
        table.add_row(name, *(f"{lat[k]:.1f}" for k in ("min", "p50", "p99", "p99.9", "max")),
                      str(r["missed_deadlines"]))
    console.print(table)
    lat = ex["decision_latency_us"]
    console.print(f"p99 ratio executor/bare: [bold]{result['p99_ratio_executor_over_bare']:.2f}x[/]   "
                  f"decision latency (observation arrival -> first snapshot using it): p50 {lat['p50']:.0f} us, "
                  f"p99 {lat['p99']:.0f} us, max {lat['max']:.0f} us")
    work = ex["tick_work_us"]
    console.print(f"tick work (wake -> snapshots handed to outboxes): p50 {work['p50']:.0f} us, p99 {work['p99']:.0f} us; "
                  f"server CPU {ex['cpu_fraction'] * 100:.0f}% of a core, bare ticker {bare['cpu_fraction'] * 100:.0f}%")
    split = Table(title="server CPU per tick (us)")
    split.add_column("part")
    split.add_column("us", justify="right")
    for k, v in ex["cpu_per_tick_us"].items():
        split.add_row(k, f"{v:.1f}")
    console.print(split)
    sessions = Table(title="per session")
    for col in ("session", "obs sent", "snapshots", "dropped", "tick gaps", "tick span"):
        sessions.add_column(col, justify="right")
    for s in result["sessions_detail"]:
        sessions.add_row(str(s["session"]), str(s["observations_sent"]), str(s["snapshots_received"]),
                         str(s["snapshots_dropped"]), str(s["tick_gaps"]), str(s["tick_span"]))
    console.print(sessions)


def bench_tick(model: Path, sessions: int = 8, duration_s: float = 60.0, out_dir: Path = Path("runs/bench"),
               guard_ms: float = 1.0, console: Console | None = None) -> dict[str, Any]:
    console = console or Console()
    loop = new_event_loop()
    try:
        result = loop.run_until_complete(_bench_tick(model, sessions, duration_s, guard_ms, console))
    finally:
        loop.close()
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    plot_path = out_dir / f"tick-{stamp}.png"
    _plot(result, plot_path)
    stored = {k: v for k, v in result.items() if k != "_raw"}
    json_path = out_dir / f"tick-{stamp}.json"
    json_path.write_text(json.dumps(stored, indent=2))
    print_tick_report(result, console)
    console.print(f"results: {json_path}  plot: {plot_path}")
    return stored
