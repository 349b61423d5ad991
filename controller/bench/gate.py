"""`dualloop bench gate`: the gate's cost per session per tick, next to the model's forward pass.

Runs the real executor in-process (one batched tick for N sessions, as the server does) on simulated
nominal observations, with and without the gates, at 1, 8 and 32 sessions in one run, and reads the
executor's own stage timings (nanosecond totals in `Executor.stats`, so a 1-session tick is not rounded
to whole microseconds).
The executors being compared tick in turn, tick by tick, so a noisy machine weighs on all of them alike.
Prints a table and stores the numbers as JSON next to the other benches' results.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from dualloop import ood
from dualloop.controller.bench.harness import store_result
from dualloop.controller.gates.fitting import nominal_inputs
from dualloop.executor.config import ExecutorConfig
from dualloop.executor.core import Executor
from dualloop.executor.model_runner import DecisionModel
from dualloop.executor.snapshot import Observation

SESSION_COUNTS = (1, 8, 32)
TICKS = 4000  # per session count, with and without the gates; the first tenth is warm-up


def _stats(values_us: np.ndarray, sessions: int, name: str) -> dict[str, float]:
    p50, p99 = float(np.median(values_us)), float(np.percentile(values_us, 99))
    out = {f"{name}_us_p50": p50, f"{name}_us_p99": p99}
    if name == "gate":
        out |= {"gate_us_per_session_p50": p50 / sessions, "gate_us_per_session_p99": p99 / sessions}
    return out


def bench_gate(
    model: DecisionModel,
    gate: ood.Gate | list[ood.Gate],
    sessions: int = 8,
    ticks: int = 4000,
    seed: int = 0,
) -> dict[str, dict[str, float]]:
    """One session count: stage timings (us, p50/p99) per tick without and with the gates, the
    executors ticking in turn."""
    # nominal driving, observation after observation, as a sensor delivers it: what a gate sees most
    # of the time (random vectors would take the rare out-of-range path every tick)

    rows = nominal_inputs([seed + 1], every=1, scenarios=("nominal_cruise",), noise=None)[0]
    offsets = np.random.default_rng(seed).integers(0, len(rows), sessions)
    accel_at = model.card.feature_names.index("ego_accel") if "ego_accel" in model.card.feature_names else 0
    ids = [f"s{i}" for i in range(sessions)]
    executors = []
    for label, g in (("without gate", None), ("with gate", gate)):
        ex = Executor(model, ExecutorConfig(max_sessions=max(sessions, 1)), g)
        for sid in ids:
            ex.open_session(sid)
        executors.append((label, ex, ex.stats.stage_ns, np.empty(ticks), np.empty(ticks), np.empty(ticks)))
    for k in range(ticks):
        # with the command in effect (here the measured acceleration), so an actuation check runs in full
        obs = {
            sid: Observation(
                seq=k + 1,
                timestamp_ns=k * 5_000_000,
                features=(x := rows[(off + k) % len(rows)]),
                actual_controls=np.array([x[accel_at], 0.0], np.float32),
            )
            for sid, off in zip(ids, offsets)
        }
        for _, ex, stage, forward, gate_t, total in executors:
            f0, g0 = int(stage[1]), int(stage[2])
            t0 = time.perf_counter_ns()
            ex.step(obs, now_ns=k * 5_000_000)
            total[k] = time.perf_counter_ns() - t0
            forward[k], gate_t[k] = int(stage[1]) - f0, int(stage[2]) - g0
    warm = slice(ticks // 10, None)
    out: dict[str, dict[str, float]] = {}
    for label, _, _, forward, gate_t, total in executors:
        out[label] = (
            _stats(forward[warm] / 1e3, sessions, "forward")
            | _stats(gate_t[warm] / 1e3, sessions, "gate")
            | _stats(total[warm] / 1e3, sessions, "tick")
        )
    return out


def bench_gate_table(
    model: DecisionModel,
    gates: list[ood.Gate],
    session_counts: Sequence[int] = SESSION_COUNTS,
    ticks: int | None = None,
    out_dir: Path = Path("runs/bench"),
    console: Console | None = None,
    model_path: str = "",
    gate_paths: Sequence[str] = (),
) -> dict[str, Any]:
    """`bench_gate` at each session count; prints the table and writes runs/bench/gate-<time>.json."""
    console = console or Console()
    ticks = TICKS if ticks is None else ticks
    rows = {}
    for n in session_counts:
        console.print(
            f"bench gate: {n} session{'s' if n != 1 else ''}, {ticks} ticks without and with "
            f"{len(gates)} gate{'s' if len(gates) != 1 else ''} ..."
        )
        rows[str(n)] = bench_gate(model, gates, n, ticks)
    result: dict[str, Any] = {
        "when": datetime.now().isoformat(timespec="seconds"),
        "model": model_path,
        "gates": list(gate_paths),
        "ticks": ticks,
        "warmup_ticks": ticks // 10,
        "sessions": rows,
        "target_gate_us_per_session": 20.0,
    }
    print_gate_table(result, console)
    saved = store_result(out_dir, "gate", result)
    console.print(f"results: {saved}")
    return result


def print_gate_table(result: dict[str, Any], console: Console) -> None:
    table = Table(
        title=f"gate cost per tick ({len(result['gates'])} gates; executor stage timings, "
        f"{result['ticks'] - result['warmup_ticks']} ticks after warm-up)"
    )
    for col in (
        "sessions",
        "forward p50 / p99 us",
        "gate p50 / p99 us",
        "gate per session p50 / p99 us",
        "tick p50 / p99 us (no gate)",
        "tick p50 / p99 us (gates)",
    ):
        table.add_column(col, justify="right")
    for n, r in result["sessions"].items():
        on, off = r["with gate"], r["without gate"]
        table.add_row(
            n,
            f"{on['forward_us_p50']:.1f} / {on['forward_us_p99']:.1f}",
            f"{on['gate_us_p50']:.1f} / {on['gate_us_p99']:.1f}",
            f"{on['gate_us_per_session_p50']:.1f} / {on['gate_us_per_session_p99']:.1f}",
            f"{off['tick_us_p50']:.0f} / {off['tick_us_p99']:.0f}",
            f"{on['tick_us_p50']:.0f} / {on['tick_us_p99']:.0f}",
        )
    console.print(table)
