"""`dualloop bench rules`: the server's CPU per REALTIME tick, in process, stage by stage.

What one tick of `dualloop serve` costs the server's thread apart from gRPC's own I/O: the requests
of every session parsed and submitted (read: into the session's mailbox and history stream), the
executor's batch (model: the forward pass; rules: the rest, history features, gates, reasons, the
safe-state machine, checks and snapshots), and each snapshot turned into the bytes the Drive stream
writes (stream). The shipped model with its two gates by default, as `serve` loads them, on nominal driving
(one new observation per session per tick, shadow actuals included, so every check runs).

CPU time (the thread's clock) per tick, median and p99 after warm-up, at 8, 16, 32 and 64 sessions;
beside it, in the same run and interleaved tick by tick, the bare forward pass of the same batch:
the floor no rule can go under. The machine's load average is printed and stored with the numbers.

`--compare-pure` first times the whole tick with the per-signal checks' update in C and in Python
(`ood.signals`), the two paths alternated round by round in this process, at each session count.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from rich.console import Console
from rich.table import Table

from dualloop.controller.bench.drives import Drive, drive_seconds, nominal_drive
from dualloop.controller.bench.harness import store_result
from dualloop.controller.contract.gate_files import load_gate_for_model
from dualloop.controller.contract.wire import observation_from_proto, snapshot_response, snapshot_to_proto
from dualloop.executor.config import ExecutorConfig
from dualloop.executor.core import Executor
from dualloop.executor.model_runner import DecisionModel
from dualloop.executor.snapshot import SafetyState
from dualloop.ood import signals
from dualloop.v2 import controller_pb2 as pb

SESSION_COUNTS = (8, 16, 32, 64)
TICKS = 2000  # per session count; the first tenth is warm-up
ROUNDS = 3  # --compare-pure: each path this many times per session count, alternated
STAGES = ("read", "model", "rules", "stream", "total", "bare_forward")
_cpu_ns = time.thread_time_ns


class RulesPoint(NamedTuple):
    cpu_us: dict[str, dict[str, float]]  # per stage: p50, p99
    nominal_share: float  # of the snapshots after warm-up


def _requests(model: DecisionModel, drive: Drive, sessions: int, ticks: int, seed: int) -> list[list[bytes]]:
    """Each tick's DriveRequest bytes per session: the drive's rows, each session at its own place in
    it, with the command the simulated driver was executing as the actual action (shadow mode)."""
    rows = drive.features
    # each session from its own place, so that none wraps round the drive (a jump no sensor makes)
    offsets = np.random.default_rng(seed).integers(0, max(len(rows) - ticks, 1), sessions)
    out = []
    for k in range(ticks):
        tick = []
        for off in offsets:
            at = (off + k) % len(rows)
            obs = pb.Observation(
                seq=k + 1,
                timestamp_ns=k * 5_000_000,
                features=rows[at].tolist(),
                actual=pb.ActualAction(action_index=-1, controls=[float(drive.commands[at]), 0.0]),
            )
            tick.append(pb.DriveRequest(observation=obs).SerializeToString())
        out.append(tick)
    return out


def bench_rules(
    model: DecisionModel,
    gates: list[Any],
    sessions: int,
    ticks: int = TICKS,
    seed: int = 0,
    drive: Drive | None = None,
) -> RulesPoint:
    """CPU us per tick of each stage (p50/p99 after warm-up) at one session count, and the share of
    snapshots after warm-up that were NOMINAL (the path measured: a vetoed tick takes the fallback's)."""
    ex = Executor(model, ExecutorConfig(max_sessions=max(sessions, 1)), gates)
    ids = [f"s{i}" for i in range(sessions)]
    for sid in ids:
        ex.open_session(sid)
    drive = nominal_drive(seed, drive_seconds(ticks)) if drive is None else drive
    requests = _requests(model, drive, sessions, ticks, seed)
    t = {name: np.empty(ticks) for name in STAGES}
    stage = ex.stats.stage_ns
    # the model's normalised inputs as the tick left them (wire and history features)
    xn = (ex._xn if ex.history is None else ex._xmn)[:sessions]
    pn = ex._pn[:sessions]
    period = ex.period_ns
    warm = slice(ticks // 10, None)
    nominal = 0
    for k in range(ticks):
        now = k * period
        c0 = _cpu_ns()
        for sid, data in zip(ids, requests[k]):
            obs = observation_from_proto(pb.DriveRequest.FromString(data).observation, now, 0)
            ex.submit(sid, obs)
        c1 = _cpu_ns()
        fwd0 = int(stage[1])
        snaps = ex.tick(now, k, 0)
        c2 = _cpu_ns()
        fwd = int(stage[1]) - fwd0  # wall clock of the forward pass: its CPU on one thread
        for snap in snaps:
            snapshot_response(snapshot_to_proto(snap))  # the bytes the server's Drive stream writes
        c3 = _cpu_ns()
        if k >= warm.start:
            nominal += sum(snap.safety_state is SafetyState.NOMINAL for snap in snaps)
        # the floor: the same batch's forward pass alone (interleaved, so load weighs on both alike)
        b0 = _cpu_ns()
        ex.model.forward(xn, pn)
        b1 = _cpu_ns()
        t["read"][k], t["model"][k], t["rules"][k] = c1 - c0, fwd, c2 - c1 - fwd
        t["stream"][k], t["total"][k], t["bare_forward"][k] = c3 - c2, c3 - c0, b1 - b0
    cpu = {
        name: {"p50": float(np.median(v[warm]) / 1e3), "p99": float(np.percentile(v[warm], 99) / 1e3)}
        for name, v in t.items()
    }
    return RulesPoint(cpu, nominal / max((ticks - warm.start) * sessions, 1))


def bench_signal_paths(
    model: DecisionModel, gates: list[Any], counts: Sequence[int], ticks: int, drive: Drive, console: Console
) -> dict[str, dict[str, dict[str, float]]]:
    """Per session count and path (the per-signal checks' update in C, in Python): the whole tick's CPU
    per session, p50 and p99, each the median of ROUNDS runs, the paths alternated run by run."""
    if not signals.compiled_available():
        console.print("compare-pure: the per-signal checks' C update was not built here; only Python runs")
        return {}
    out: dict[str, dict[str, dict[str, float]]] = {}
    table = Table(title=f"server CPU per session-tick, per-signal checks in C vs Python ({ROUNDS} rounds each, us)")
    for name in ("sessions", "C p50", "Python p50", "C p99", "Python p99", "C / Python p50"):
        table.add_column(name, justify="right")
    for n in counts:
        runs: dict[str, list[dict[str, float]]] = {"C": [], "Python": []}
        for _ in range(ROUNDS):
            for path in runs:
                before = signals.use_compiled(path == "C")
                try:
                    runs[path].append(bench_rules(model, gates, n, ticks, drive=drive).cpu_us["total"])
                finally:
                    signals.use_compiled(before)
        got = {p: {s: statistics.median(r[s] for r in rows) / n for s in ("p50", "p99")} for p, rows in runs.items()}
        out[str(n)] = got
        c, py = got["C"], got["Python"]
        cells = (c["p50"], py["p50"], c["p99"], py["p99"])
        table.add_row(str(n), *(f"{v:.1f}" for v in cells), f"{c['p50'] / py['p50']:.2f}")
    console.print(table)
    return out


def bench_rules_table(
    model_path: Path,
    gate_paths: Sequence[Path],
    session_counts: Sequence[int] = SESSION_COUNTS,
    ticks: int = TICKS,
    out_dir: Path = Path("runs/bench"),
    console: Console | None = None,
    compare_pure: bool = False,
) -> dict[str, Any]:
    """`bench_rules` at each session count; prints the table, writes runs/bench/rules-<time>.json.
    `compare_pure`: first `bench_signal_paths` at each count (stored as "signal_paths")."""
    console = console or Console()
    model = DecisionModel(model_path)
    gates = [load_gate_for_model(g, model) for g in gate_paths]
    console.print(
        f"bench rules: {model_path.name} with {len(gates)} gate{'s' if len(gates) != 1 else ''} "
        f"({', '.join(g.name for g in gate_paths) or 'none'}), {ticks} ticks per count, in process"
    )
    drive = nominal_drive(0, drive_seconds(ticks))
    load_before = os.getloadavg()
    paths = bench_signal_paths(model, gates, session_counts, ticks, drive, console) if compare_pure else None
    rows, nominal = {}, {}
    for n in session_counts:
        rows[str(n)], nominal[str(n)] = bench_rules(model, gates, n, ticks, drive=drive)
    result: dict[str, Any] = {
        "when": datetime.now().isoformat(timespec="seconds"),
        "model": str(model_path),
        "gates": [str(g) for g in gate_paths],
        "ticks": ticks,
        "warmup_ticks": ticks // 10,
        "cpu_us_per_tick": rows,
        "nominal_share": nominal,
        "signal_paths": paths,  # us per session-tick by path (--compare-pure), else None
        "loadavg_before": list(load_before),
        "loadavg_after": list(os.getloadavg()),
        "cpus": os.cpu_count(),
    }
    # one table per statistic, so a terminal of 80 columns shows every cell
    for stat in ("p50", "p99"):
        table = Table(title=f"server CPU per REALTIME tick in process, {stat} (us; model: its wall clock)")
        table.add_column("sessions", justify="right")
        for name in STAGES:
            table.add_column("bare fwd" if name == "bare_forward" else name, justify="right")
        table.add_column("total per session", justify="right")
        for count, r in rows.items():
            cells = [f"{r[s][stat]:.0f}" for s in STAGES]
            table.add_row(count, *cells, f"{r['total'][stat] / int(count):.1f}")
        console.print(table)
    shares = ", ".join(f"{100 * v:.1f}% at {n}" for n, v in nominal.items())
    console.print(f"snapshots NOMINAL after warm-up (the path measured): {shares}")
    la, lb = result["loadavg_before"], result["loadavg_after"]
    console.print(
        f"machine load (1/5/15 min) before {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}, after "
        f"{lb[0]:.2f} {lb[1]:.2f} {lb[2]:.2f} on {result['cpus']} CPUs"
    )
    console.print(f"results: {store_result(out_dir, 'rules', result)}")
    return result
