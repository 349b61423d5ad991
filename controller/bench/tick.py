"""`dualloop bench tick`: executor timing under real gRPC load, next to a bare ticker in the same run.

Three processes share the machine for the same window: this one serves (executor + gRPC), one runs
N REALTIME client sessions, one the bare ticker (waiting for the same deadlines, the machine's floor
under that load, which the executor is judged against)."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from rich.console import Console
from rich.table import Table

from dualloop.controller.bench.drives import simulate_session_drives
from dualloop.controller.bench.harness import (
    DROPPED_BOUND,
    P99_BOUND_US,
    CpuPlan,
    Result,
    TickRun,
    cpu_plan,
    floor_failures,
    machine_cpus,
    start_role,
    store_result,
    wait_all,
)
from dualloop.controller.bench.procs import PLANNER_COUNTS, BareSpec, ClientSpec, ServerSpec, open_channel
from dualloop.controller.bench.results import (
    BareResult,
    ServerFirst,
    ServerResult,
    SessionRow,
    WorkerRow,
    reasons_text,
    snapshots_dropped,
)
from dualloop.controller.bench.secure import TOKEN_ENV, BenchPKI, make_pki
from dualloop.controller.plotting import pyplot
from dualloop.controller.serve import board as wb
from dualloop.controller.serve.lifecycle import new_event_loop
from dualloop.controller.serve.runtime import LATENESS_BUCKETS_US
from dualloop.controller.serve.ticker import percentiles_us
from dualloop.controller.serve.workers import reserve_port
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc


async def _refused(address: str, ca_file: str | None) -> str:
    """The status a caller without a token gets (plaintext if ca_file is None, else TLS): the secure
    run's proof that the server it measured really refused what a network attacker would try."""
    try:
        async with open_channel(address, ca_file, None) as channel:
            await pb_grpc.ControllerServiceStub(channel).GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    except grpc.aio.AioRpcError as err:
        return err.code().name
    return "OK"


def _merge_workers(results: list[ServerResult], raws: list[np.ndarray]) -> ServerResult:
    """One executor result from several workers' (bench tick --workers): counts and CPU summed,
    lateness percentiles over every worker's ticks, other percentiles the worst worker's."""
    if len(results) == 1:
        return {**results[0], "workers": 1}
    first = results[0]
    merged = first.copy()
    merged["ticks"] = sum(r["ticks"] for r in results)
    merged["missed_deadlines"] = sum(r["missed_deadlines"] for r in results)
    merged["snapshots_sent"] = sum(r["snapshots_sent"] for r in results)
    merged["cpu_fraction"] = sum(r["cpu_fraction"] for r in results)
    merged["sessions_here"] = sum(r["sessions_here"] for r in results)
    merged["wall_s"] = max(r["wall_s"] for r in results)
    merged["lateness_us"] = percentiles_us(np.concatenate(raws))
    merged["tick_work_us"] = {k: max(r["tick_work_us"][k] for r in results) for k in first["tick_work_us"]}
    merged["decision_latency_us"] = {
        k: max(r["decision_latency_us"][k] for r in results) for k in first["decision_latency_us"]
    }
    merged["cpu_per_tick_us"] = {k: sum(r["cpu_per_tick_us"][k] for r in results) for k in first["cpu_per_tick_us"]}
    merged["missed_at_ns"] = sorted(t for r in results for t in r["missed_at_ns"])
    merged["missed_causes"] = sorted((c for r in results for c in r["missed_causes"]), key=lambda c: c["at_ns"])
    merged["planner"] = _merge_planners([r["planner"] for r in results])
    merged["workers"] = len(results)
    merged["per_worker"] = [
        WorkerRow(
            sessions_here=r["sessions_here"],
            ticks=r["ticks"],
            missed_deadlines=r["missed_deadlines"],
            lateness_us=r["lateness_us"],
            cpu_fraction=r["cpu_fraction"],
            cpus=r["cpus"],
        )
        for r in results
    ]
    return merged


def _merge_planners(stats: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """Every worker's planner as one: counts summed, times the worst worker's (the sessions may all
    sit on one worker, whose planner then did all the work)."""
    present = [s for s in stats if s]
    if not present:
        return None
    merged: dict[str, Any] = dict(present[0])
    for key in present[0]:
        values = [s[key] for s in present if s.get(key) is not None]
        if not values or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
            continue  # the source's name, the idle-priority flag: the same on every worker
        merged[key] = sum(values) if key in PLANNER_COUNTS or key == "applied" else max(values)
    return merged


def _server_spec(run: TickRun, save: str, slot: int, port: int, board: wb.Board | None, **kw: Any) -> ServerSpec:
    return ServerSpec(
        model=str(run.model),
        sessions=run.sessions,
        save=save,
        guard_ms=run.guard_ms,
        realtime_priority=run.rt_priority,
        cpu_wake_latency_us=run.cpu_wake_latency_us,
        planner=run.planner,
        alternate_s=run.alternate_s,
        metrics=run.metrics,
        gates=tuple(map(str, run.gates)),
        port=port,
        board=str(board.path) if board is not None else None,
        workers=run.workers,
        slot=slot,
        candidate=str(run.candidate) if run.candidate is not None else None,
        candidate_gates=tuple(map(str, run.candidate_gates)) if run.candidate is not None else (),
        **kw,
    )


@dataclass
class _Outputs:
    """What a run's processes reported: the servers' first lines and results, the clients' rows,
    the bare ticker's result, the raw lateness (ns) of the servers and the bare ticker."""

    firsts: list[ServerFirst]
    servers: list[ServerResult]
    server_raws: list[np.ndarray]
    clients: list[list[SessionRow]]
    bare: BareResult
    bare_raw: np.ndarray
    scrape_ms: list[float]
    refused: dict[str, str] | None


async def _start_servers(
    run: TickRun, tmp: Path, plan: CpuPlan, pki: BenchPKI | None, board: wb.Board | None, port: int
) -> tuple[list[asyncio.subprocess.Process], list[ServerFirst]]:
    tls = (
        {"tls_cert": str(pki.cert_file), "tls_key": str(pki.key_file), "tokens_file": str(pki.tokens_file)}
        if pki
        else {}
    )
    servers = []
    for i in range(run.workers):
        cpus = tuple(plan.servers[i] or ()) or None
        servers.append(
            await start_role(
                "server", _server_spec(run, str(tmp / f"server-{i}.npy"), i, port, board, cpus=cpus, **tls)
            )
        )
    firsts = []
    for server in servers:
        assert server.stdout is not None
        line = await server.stdout.readline()
        if not line:
            raise RuntimeError("a bench server process did not start (see its error above)")
        firsts.append(json.loads(line))
    return servers, firsts


async def _start_clients(
    run: TickRun, address: str, plan: CpuPlan, pki: BenchPKI | None, n_clients: int, drives: Path | None
) -> list[asyncio.subprocess.Process]:
    clients = []
    cpus = tuple(plan.clients) if plan.clients else None
    for k in range(n_clients):
        lo, hi = k * run.sessions // n_clients, (k + 1) * run.sessions // n_clients
        spec = ClientSpec(
            address,
            hi - lo,
            run.duration_s,
            first=lo,
            channel_per_session=run.workers > 1,
            cpus=cpus,
            ca_file=str(pki.ca_file) if pki else None,
            drives_file=None if drives is None else str(drives),
        )
        clients.append(await start_role("clients", spec, env={**os.environ, TOKEN_ENV: pki.token} if pki else None))
    return clients


async def _run_processes(run: TickRun, tmp: Path, plan: CpuPlan, console: Console, pki: BenchPKI | None) -> _Outputs:
    """The sessions' drives, the servers, then (listening) the clients and the bare ticker till they end."""
    board: wb.Board | None = None
    reservation = None
    try:
        drives = simulate_session_drives(run.model, run.duration_s + 2.0, tmp, run.sessions, console)
        port = 0
        if run.workers > 1:
            reservation, port = reserve_port("127.0.0.1", 0)
            board = wb.Board.create(run.workers, LATENESS_BUCKETS_US)
        servers, firsts = await _start_servers(run, tmp, plan, pki, board, port)
        if reservation is not None:
            reservation.close()
        address = f"127.0.0.1:{firsts[0]['port']}"
        # before the clients connect: the server measures only once all of them are
        refused = None
        if pki:
            refused = {
                "plaintext": await _refused(address, None),
                "tls_without_token": await _refused(address, str(pki.ca_file)),
            }
        n_clients = max(1, min(run.client_procs or max(1, -(-run.sessions // 16)), run.sessions))
        clients = await _start_clients(run, address, plan, pki, n_clients, drives)
        bare_file = str(tmp / "bare.npy")
        bare_spec = BareSpec(
            run.duration_s,
            guard_ms=run.guard_ms,
            save=bare_file,
            realtime_priority=run.rt_priority or None,
            cpu_wake_latency_us=run.cpu_wake_latency_us,
            cpus=tuple(plan.bare) if plan.bare else None,
        )
        bare = await start_role("bare", bare_spec)
        scrape_ms: list[float] = []
        metrics_port = firsts[0]["metrics_port"]
        scraper = None
        if run.metrics and metrics_port is not None:
            scraper = asyncio.ensure_future(_scrape_every(metrics_port, SCRAPE_S, scrape_ms))
        await wait_all(clients, run.label, run.duration_s, console)
        if scraper is not None:
            scraper.cancel()
        client_outs = [(await c.communicate())[0] for c in clients]
        server_outs = [(await s.communicate())[0] for s in servers]
        bare_out, _ = await bare.communicate()
        codes = {
            "servers": [s.returncode for s in servers],
            "clients": [c.returncode for c in clients],
            "bare": bare.returncode,
        }
        if any(s.returncode for s in servers) or any(c.returncode for c in clients) or bare.returncode:
            raise RuntimeError(f"a bench process failed (exit codes {codes})")
        server_raws = [np.load(tmp / f"server-{i}.npy") for i in range(run.workers)]
        return _Outputs(
            firsts,
            [json.loads(o) for o in server_outs],
            server_raws,
            [json.loads(o) for o in client_outs],
            json.loads(bare_out),
            np.load(bare_file),
            scrape_ms,
            refused,
        )
    finally:
        if reservation is not None:
            reservation.close()
        if board is not None:
            board.close()


async def _bench_tick(run: TickRun, console: Console, pki: BenchPKI | None = None) -> Result:
    """One run: the server (workers), the clients and the bare ticker for run.duration_s, and its
    result with a verdict. pki: the server serves TLS and requires its token, and the clients
    connect with both."""
    if run.workers > 1 and (run.metrics or pki):
        raise ValueError("bench tick --workers runs plain: without --metrics or --secure")
    cpus = machine_cpus()
    plan = cpu_plan(cpus, run.workers, run.pin)
    with tempfile.TemporaryDirectory() as tmp:
        out = await _run_processes(run, Path(tmp), plan, console, pki)
    ex = _merge_workers(out.servers, out.server_raws)
    bare = out.bare
    details = [s for rows in out.clients for s in rows]
    first = out.firsts[0]
    ran = {
        "model": first["model"],
        "gates": first["gates"],
        "candidate": first.get("candidate"),
        "workers": run.workers,
        "planner": run.planner,
        "client_processes": len(out.clients),
        "cpus": cpus,
        "pinning": plan.note,
        "load_average_at_start": list(os.getloadavg()),
    }
    result = {
        "when": datetime.now().isoformat(timespec="seconds"),
        "sessions": run.sessions,
        "duration_s": ex["wall_s"],
        "guard_ms": run.guard_ms,
        "planner": run.planner,
        "ran": ran,
        "scheduling": {"executor": ex["scheduling"], "bare_ticker": bare["scheduling"]},
        "executor": ex,
        "bare_ticker": {
            "ticks": bare["ticks"],
            "missed_deadlines": bare["missed"],
            "lateness_us": bare["lateness_us"],
            "cpu_fraction": bare["cpu_fraction"],
            "stalls_at_ns": bare["stalls_at_ns"],
            "missed_causes": bare["missed_causes"],
        },
        "missed_beside_floor": missed_beside_floor(ex["missed_at_ns"], bare["stalls_at_ns"], ex["missed_causes"]),
        "p99_ratio_executor_over_bare": ex["lateness_us"]["p99"] / max(bare["lateness_us"]["p99"], 1e-9),
        "sessions_detail": details,
        "clients_cpu_fraction": sum(rows[0]["client_process_cpu_s"] for rows in out.clients if rows)
        / max(ex["wall_s"], 1e-9),
        "metrics": _metrics_summary(run.metrics, out.scrape_ms),
        "secure": pki is not None,
        "refused_without_credentials": out.refused,
        "_raw": {"executor_lateness_ns": np.concatenate(out.server_raws), "bare_lateness_ns": out.bare_raw},
    }
    result["verdict"] = tick_verdict(result)
    return result


def _metrics_summary(on: bool, scrape_ms: list[float]) -> Result:
    return {
        "on": on,
        "scrape_interval_s": SCRAPE_S if on else None,
        "scrapes": len(scrape_ms),
        "scrape_ms_p50": float(np.median(scrape_ms)) if scrape_ms else None,
        "scrape_ms_max": max(scrape_ms) if scrape_ms else None,
    }


BESIDE_FLOOR_NS = 10_000_000  # two periods either side


def missed_beside_floor(
    missed_at_ns: Sequence[int],
    floor_stalls_at_ns: Sequence[int],
    causes: Sequence[dict[str, Any]] = (),
    within_ns: int = BESIDE_FLOOR_NS,
) -> dict[str, Any]:
    """The executor's runs of missed deadlines (each by the time its first missed deadline was due),
    and how many of them began within within_ns of a stall of the bare ticker in the same run (a
    deadline it missed, or a tick over 1 ms late). The bare ticker does nothing but wait at the same
    priority: a run beside one of its stalls is the machine stalling both, one apart from them is
    the executor's own, or a stall of the server's CPU alone, which the bare ticker (on another CPU)
    cannot see: the runs' causes (Stall.record: where the loop thread's time went) tell those apart.
    Both clocks are the machine's CLOCK_MONOTONIC."""
    runs = np.asarray(missed_at_ns, dtype=np.int64)
    floor = np.sort(np.asarray(floor_stalls_at_ns, dtype=np.int64))
    out: dict[str, Any] = {"runs": int(runs.size), "beside_floor": 0, "apart": int(runs.size)}
    out["causes"] = dict(collections.Counter(cause_name(c) for c in causes).most_common())
    if runs.size == 0 or floor.size == 0:
        return out
    i = np.searchsorted(floor, runs)
    before = floor[np.clip(i - 1, 0, floor.size - 1)]
    after = floor[np.clip(i, 0, floor.size - 1)]
    beside = int((np.minimum(np.abs(runs - before), np.abs(after - runs)) <= within_ns).sum())
    return out | {"beside_floor": beside, "apart": int(runs.size) - beside}


def cause_name(record: dict[str, Any]) -> str:
    """'loop: off CPU' and the like (ticker.Overrun): the stretch that overran and why."""
    return f"{record['stretch']}: {record['why']}" if "stretch" in record else "unknown (first tick)"


def missed_text(missed: int, beside: dict[str, Any]) -> str:
    """'N missed deadlines', where their runs fell against the bare ticker's stalls, and why."""
    causes = beside.get("causes") or {}
    why = f"; where the time went: {', '.join(f'{k} {n}' for k, n in causes.items())}" if causes else ""
    return (
        f"{missed} missed deadlines ({beside['runs']} run{'s' if beside['runs'] != 1 else ''}: "
        f"{beside['beside_floor']} within {BESIDE_FLOOR_NS // 1_000_000} ms of a stall of the bare ticker, "
        f"{beside['apart']} apart from any{why})"
    )


def tick_verdict(result: dict[str, Any]) -> dict[str, Any]:
    """Whether this run kept time, with each reason it did not (never a ratio alone)."""
    ex, bare = result["executor"], result["bare_ticker"]
    received = sum(int(s["snapshots_received"]) for s in result["sessions_detail"])
    dropped = snapshots_dropped(result)
    fraction = dropped / max(received + dropped, 1)
    failures = floor_failures(bare["missed_deadlines"], bare["lateness_us"]["p99"], "the executor")
    if ex["missed_deadlines"]:
        failures.append(missed_text(ex["missed_deadlines"], result["missed_beside_floor"]))
    if not ex["lateness_us"]["p99"] < P99_BOUND_US:
        failures.append(f"executor p99 lateness {ex['lateness_us']['p99']:.0f} us >= {P99_BOUND_US:.0f} us")
    if not fraction < DROPPED_BOUND:
        failures.append(f"{fraction:.2%} of snapshots dropped (>= {DROPPED_BOUND:.1%})")
    return {
        "met": not failures,
        "failures": failures,
        "baseline_valid": not failures or not failures[0].startswith("the machine's floor"),
        "bounds": {"missed": 0, "p99_us": P99_BOUND_US, "dropped_fraction": DROPPED_BOUND},
        "dropped_fraction": fraction,
        "p99_ratio_executor_over_bare": result["p99_ratio_executor_over_bare"],
    }


def print_verdict(result: dict[str, Any], console: Console) -> None:
    v = result["verdict"]
    ex = result["executor"]
    said = "did not keep time" if v["baseline_valid"] else "no verdict"  # the bare ticker missed: the machine was
    console.print(
        f"verdict ({result['sessions']} sessions): missed {ex['missed_deadlines']}, p99 "
        f"{ex['lateness_us']['p99']:.0f} us (bound {P99_BOUND_US:.0f} us; {v['p99_ratio_executor_over_bare']:.2f}x "
        f"the bare ticker's {result['bare_ticker']['lateness_us']['p99']:.0f} us), dropped "
        f"{v['dropped_fraction']:.3%} (bound {DROPPED_BOUND:.1%}): "
        + ("[green]kept time[/]" if v["met"] else f"[yellow]{said}[/]: " + "; ".join(v["failures"])),
        highlight=False,
    )


def print_ran(result: dict[str, Any], console: Console) -> None:
    ran = result["ran"]
    gates = ", ".join(f"{Path(g['path']).name} ({g['version']})" for g in ran["gates"]) or "none"
    console.print(
        f"ran: model {ran['model']['name']} {ran['model']['version']} ({ran['model']['path']}), gates {gates}; "
        f"{ran['workers']} server worker(s), planner {ran['planner']}, {result['sessions']} REALTIME sessions at "
        f"200 Hz in {ran['client_processes']} client process(es) (CPU {result['clients_cpu_fraction']:.0%} of a "
        f"core); {ran['pinning']}; load average at start {', '.join(f'{x:.2f}' for x in ran['load_average_at_start'])}",
        highlight=False,
    )


SCRAPE_S = 1.0  # bench tick --metrics on: a scrape a second (Prometheus' default is every 15 s)


async def _scrape_every(port: int, interval_s: float, took_ms: list[float]) -> None:
    """GET /metrics every interval_s (from this process, as a Prometheus server would from its own)."""
    url = f"http://127.0.0.1:{port}/metrics"

    def get() -> None:
        with urllib.request.urlopen(url, timeout=10) as response:
            response.read()

    while True:
        t0 = time.perf_counter()
        await asyncio.to_thread(get)
        took_ms.append((time.perf_counter() - t0) * 1e3)
        await asyncio.sleep(interval_s)


def _plot(result: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, values in (
        ("executor (serving gRPC)", result["_raw"]["executor_lateness_ns"]),
        ("bare ticker (same run)", result["_raw"]["bare_lateness_ns"]),
    ):
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
    print_ran(result, console)
    ex, bare = result["executor"], result["bare_ticker"]
    table = Table(
        title=f"tick lateness, {result['sessions']} sessions, {result['duration_s']:.1f} s (us); "
        f"guard {result['guard_ms']} ms, {result['scheduling']['executor']}"
    )
    for col in ("", "min", "p50", "p99", "p99.9", "max", "missed"):
        table.add_column(col, justify="right")
    for name, r in (("executor", ex), ("bare ticker", bare)):
        lat = r["lateness_us"]
        table.add_row(
            name, *(f"{lat[k]:.1f}" for k in ("min", "p50", "p99", "p99.9", "max")), str(r["missed_deadlines"])
        )
    console.print(table)
    lat = ex["decision_latency_us"]
    console.print(
        f"p99 ratio executor/bare: [bold]{result['p99_ratio_executor_over_bare']:.2f}x[/]   "
        f"decision latency (observation arrival -> first snapshot using it): p50 {lat['p50']:.0f} us, "
        f"p99 {lat['p99']:.0f} us, max {lat['max']:.0f} us"
    )
    work = ex["tick_work_us"]
    console.print(
        f"tick work (wake -> snapshots handed to outboxes): p50 {work['p50']:.0f} us, p99 {work['p99']:.0f} us; "
        f"server CPU {ex['cpu_fraction'] * 100:.0f}% of a core, bare ticker {bare['cpu_fraction'] * 100:.0f}%"
    )
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
        sessions.add_row(
            str(s["session"]),
            str(s["observations_sent"]),
            str(s["snapshots_received"]),
            str(s["snapshots_dropped"]),
            str(s["tick_gaps"]),
            str(s["tick_span"]),
        )
    if len(result["sessions_detail"]) <= 16:
        console.print(sessions)
    console.print(reasons_text(result["sessions_detail"]), highlight=False)
    if ex.get("per_worker"):
        for k, w in enumerate(ex["per_worker"]):
            console.print(
                f"worker {k} (CPU {w['cpus']}): {w['sessions_here']} sessions, {w['ticks']} ticks, "
                f"{w['missed_deadlines']} missed, p99 {w['lateness_us']['p99']:.0f} us, CPU {w['cpu_fraction']:.0%}",
                highlight=False,
            )
    print_verdict(result, console)


def print_comparison(results: dict[str, dict[str, Any]], console: Console, title: str, first: str) -> None:
    """Runs of one command side by side, each with the bare ticker of its own run."""
    table = Table(title=f"{title}, back to back (us; late: lateness; bare: the bare ticker of its run)")
    for col in (first, "work p50", "work p99", "late p50", "late p99", "missed", "dropped", "bare p50", "bare p99"):
        table.add_column(col, justify="right")
    for mode, r in results.items():
        work, lat, bare = r["executor"]["tick_work_us"], r["executor"]["lateness_us"], r["bare_ticker"]["lateness_us"]
        table.add_row(
            mode,
            *(f"{v:.1f}" for v in (work["p50"], work["p99"], lat["p50"], lat["p99"])),
            str(r["executor"]["missed_deadlines"]),
            str(snapshots_dropped(r)),
            *(f"{v:.1f}" for v in (bare["p50"], bare["p99"])),
        )
    console.print(table)


def print_metrics_comparison(results: dict[str, dict[str, Any]], console: Console) -> None:
    """`bench tick --metrics both`: the runs side by side, each with the bare ticker of its own run."""
    print_comparison(results, console, "metrics off vs on", "metrics")
    for mode, r in results.items():
        m = r["metrics"]
        if m["on"] and m["scrapes"]:
            console.print(
                f"metrics {mode}: {m['scrapes']} scrapes, one every {m['scrape_interval_s']:g} s, "
                f"p50 {m['scrape_ms_p50']:.1f} ms"
            )


# bench tick --secure both: the secure runs must add at most this much to the executor's p99
# lateness over the plain run just before each (a fiftieth of the 5 ms tick; the tick target is
# p99 < 500 us), and miss no deadline when the plain runs miss none.
SECURE_P99_BOUND_US = 100.0


def secure_verdict(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each secure run against the plain run before it: absolute differences in us, never ratios."""
    plain = [r for r in runs.values() if not r["secure"]]
    secure = [r for r in runs.values() if r["secure"]]

    def p99(r: dict[str, Any], side: str, key: str) -> float:
        return float(r[side][key]["p99"])

    lateness = [p99(s, "executor", "lateness_us") - p99(p, "executor", "lateness_us") for p, s in zip(plain, secure)]
    plain_missed = [int(r["executor"]["missed_deadlines"]) for r in plain]
    secure_missed = [int(r["executor"]["missed_deadlines"]) for r in secure]
    kept_zero = any(plain_missed) or not any(secure_missed)
    return {
        "bound_us": SECURE_P99_BOUND_US,
        "missed_plain": plain_missed,
        "missed_secure": secure_missed,
        "kept_zero_missed": kept_zero,
        "lateness_p99_diff_us": lateness,
        "tick_work_p99_diff_us": [
            p99(s, "executor", "tick_work_us") - p99(p, "executor", "tick_work_us") for p, s in zip(plain, secure)
        ],
        "bare_p99_diff_us": [
            p99(s, "bare_ticker", "lateness_us") - p99(p, "bare_ticker", "lateness_us") for p, s in zip(plain, secure)
        ],
        # the machine's own stalls: the bare ticker of the same runs
        "bare_missed_plain": [int(r["bare_ticker"]["missed_deadlines"]) for r in plain],
        "bare_missed_secure": [int(r["bare_ticker"]["missed_deadlines"]) for r in secure],
        "server_cpu_diff_percent": [
            100 * (s["executor"]["cpu_fraction"] - p["executor"]["cpu_fraction"]) for p, s in zip(plain, secure)
        ],
        "dropped_plain": [snapshots_dropped(r) for r in plain],
        "dropped_secure": [snapshots_dropped(r) for r in secure],
        "met": kept_zero and max(lateness) <= SECURE_P99_BOUND_US,
    }


def print_secure_verdict(v: dict[str, Any], console: Console) -> None:
    def us(values: list[float]) -> str:
        return ", ".join(f"{x:+.1f}" for x in values) + " us"

    console.print(
        f"verdict: missed deadlines plain {v['missed_plain']}, secure {v['missed_secure']} "
        f"({'kept 0' if v['kept_zero_missed'] else 'NOT kept at 0'}; the bare ticker of the same runs missed "
        f"{v['bare_missed_plain']}, {v['bare_missed_secure']}); executor p99 lateness secure - plain "
        f"{us(v['lateness_p99_diff_us'])} (bare floor moved {us(v['bare_p99_diff_us'])}; tick work p99 "
        f"{us(v['tick_work_p99_diff_us'])}; server CPU "
        + ", ".join(f"{x:+.1f}" for x in v["server_cpu_diff_percent"])
        + f" % of a core); bound: 0 missed kept and p99 difference <= "
        f"{v['bound_us']:g} us: " + ("[green]met[/]" if v["met"] else "[yellow]not met in this run[/]"),
        highlight=False,
    )


def bench_tick(
    run: TickRun,
    out_dir: Path = Path("runs/bench"),
    console: Console | None = None,
    metrics: str = "off",
    secure: str = "off",
    candidate_mode: str = "on",
    plot: bool = True,
) -> Result:
    """run: what is served and driven (the CLI's default: the shipped model with its two gates).
    metrics: "off", "on" (the server serves Prometheus metrics, scraped every SCRAPE_S) or "both":
    off, on, off, on in one command (interleaved, so that a machine whose load drifts shows it as a
    difference between two runs of the same kind); stored together as tick-metrics-<time>.json.
    secure: "off", "on" (TLS + a bearer token + metrics scraped every SCRAPE_S, with certificates
    made for the run) or "both": plain, secure, plain, secure (plain: none of them), stored together
    as tick-secure-<time>.json with a verdict. candidate_mode "both": without and with run.candidate
    in turns."""
    console = console or Console()
    if run.candidate is not None and candidate_mode == "both":
        return _candidate_both(run, out_dir, console)
    if secure == "both":
        return _secure_both(replace(run, candidate=None, candidate_gates=()), out_dir, console)
    if metrics == "both":
        both = {
            f"{mode} ({k})": bench_tick(replace(run, candidate=None, candidate_gates=()), out_dir, console, mode)
            for k in (1, 2)
            for mode in ("off", "on")
        }
        print_metrics_comparison(both, console)
        path = store_result(out_dir, "tick-metrics", both)
        console.print(f"both runs: {path}")
        return both
    label = f"bench tick, {run.sessions} sessions" + (", secure" if secure == "on" else f", metrics {metrics}")
    run = replace(run, label=label, metrics=metrics == "on" or secure == "on")
    loop = new_event_loop()
    try:
        with tempfile.TemporaryDirectory() as pki_dir:
            pki = make_pki(Path(pki_dir)) if secure == "on" else None
            result = loop.run_until_complete(_bench_tick(run, console, pki))
    finally:
        loop.close()
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    plot_path = out_dir / f"tick-{stamp}-{run.sessions}.png"
    if plot:
        _plot(result, plot_path)
    stored = {k: v for k, v in result.items() if k != "_raw"}
    json_path = store_result(out_dir, "tick", stored, f"{stamp}-{run.sessions}")
    print_tick_report(result, console)
    console.print(f"results: {json_path}" + (f"  plot: {plot_path}" if plot else ""))
    return stored


def _secure_both(run: TickRun, out_dir: Path, console: Console) -> Result:
    runs = {
        f"{name} ({k})": bench_tick(run, out_dir, console, "off", mode)
        for k in (1, 2)
        for name, mode in (("plain", "off"), ("secure", "on"))
    }
    print_comparison(runs, console, "plain vs secure (TLS + bearer token + metrics scraped each second)", "run")
    verdict = secure_verdict(runs)
    print_secure_verdict(verdict, console)
    stored = {
        "what": {
            "command": "bench tick --secure both",
            "sessions": run.sessions,
            "duration_s": run.duration_s,
            "plain": "no TLS, no authentication, no metrics",
            "secure": f"TLS (EC P-256 certificate made for the run), a bearer token checked on every RPC, "
            f"Prometheus metrics scraped every {SCRAPE_S:g} s",
            "load_average_at_end": list(os.getloadavg()),
            "cpus": os.cpu_count(),
        },
        "runs": runs,
        "verdict": verdict,
    }
    path = store_result(out_dir, "tick-secure", stored)
    console.print(f"all runs: {path}")
    return stored


def _candidate_both(run: TickRun, out_dir: Path, console: Console) -> Result:
    """without, with, without, with a candidate in one command (interleaved: a machine whose load
    drifts shows it as a difference between two runs of the same kind); tick-candidate-<time>.json."""
    assert run.candidate is not None
    alone = replace(run, candidate=None, candidate_gates=())
    runs = {
        f"{name} ({k})": bench_tick(r, out_dir, console, plot=False)
        for k in (1, 2)
        for name, r in (("live only", alone), ("with candidate", run))
    }
    print_comparison(runs, console, f"live model alone vs with candidate {run.candidate.name} beside it", "run")
    table = Table(title="CPU per tick (us, server)")
    for col in ("run", "model", "candidate", "rules", "gate", "streaming", "tick work p99 us"):
        table.add_column(col, justify="right")
    for name, r in runs.items():
        cpu = r["executor"]["cpu_per_tick_us"]
        parts = (cpu["model"], cpu.get("candidate", 0.0), cpu["rules"], cpu["gate"], cpu["streaming"])
        table.add_row(name, *(f"{v:.0f}" for v in parts), f"{r['executor']['tick_work_us']['p99']:.0f}")
    console.print(table)
    stored = {
        "what": {
            "command": f"bench tick --candidate {run.candidate} --candidate-runs both",
            "sessions": run.sessions,
            "duration_s": run.duration_s,
            "load_average_at_end": list(os.getloadavg()),
            "cpus": os.cpu_count(),
        },
        "runs": runs,
    }
    path = store_result(out_dir, "tick-candidate", stored)
    console.print(f"all runs: {path}")
    return stored


SWEEP = (8, 16, 24, 32, 48, 64)


def bench_sweep(
    run: TickRun, counts: Sequence[int], out_dir: Path = Path("runs/bench"), console: Console | None = None
) -> Result:
    """bench tick at each session count in turn, stopping at the first that does not keep time
    (tick_verdict); prints and stores the largest count that did (tick-sweep-<time>.json). A count
    whose bare ticker itself missed the bounds says nothing of the executor: it is run once more
    (the first run stays in the steps), and the sweep stops there if the machine is noisy again."""
    console = console or Console()
    steps: list[dict[str, Any]] = []
    for n in counts:
        r = bench_tick(replace(run, sessions=n), out_dir, console, plot=False)
        if not r["verdict"]["baseline_valid"]:
            console.print(f"{n} sessions: the bare ticker missed its bounds (a noisy machine); once more")
            steps.append(r)
            r = bench_tick(replace(run, sessions=n), out_dir, console, plot=False)
        steps.append(r)
        if not r["verdict"]["met"]:
            break
    final = {r["sessions"]: r for r in steps}  # each count's last run (after a retry)
    kept = [n for n, r in final.items() if r["verdict"]["met"]]
    failed = next((r for r in final.values() if not r["verdict"]["met"]), None)
    table = Table(title="sweep: REALTIME sessions at 200 Hz (bounds: 0 missed, p99 < 1 ms, dropped < 0.1%)")
    for col in ("sessions", "missed", "p99 us", "bare p99 us", "dropped", "server CPU", "clients CPU", "kept time"):
        table.add_column(col, justify="right")
    for r in steps:
        table.add_row(
            str(r["sessions"]),
            str(r["executor"]["missed_deadlines"]),
            f"{r['executor']['lateness_us']['p99']:.0f}",
            f"{r['bare_ticker']['lateness_us']['p99']:.0f}",
            f"{r['verdict']['dropped_fraction']:.3%}",
            f"{r['executor']['cpu_fraction']:.0%}",
            f"{r['clients_cpu_fraction']:.0%}",
            "yes" if r["verdict"]["met"] else "no",
        )
    console.print(table)
    if failed is None:
        line = f"the executor kept time at every count tried (up to {counts[-1]} sessions)"
    elif not failed["verdict"]["baseline_valid"]:
        line = (
            f"stopped at {failed['sessions']} sessions: the bare ticker itself missed its bounds there (a noisy "
            f"machine, not a verdict on the executor); kept time up to {max(kept) if kept else 'none'}"
        )
    else:
        line = (
            f"the executor stops keeping time at {failed['sessions']} sessions "
            f"({'; '.join(failed['verdict']['failures'])}); largest count that kept time: "
            f"{max(kept) if kept else 'none of those tried'}"
        )
    console.print(line, highlight=False)
    stored = {
        "what": {"command": "bench tick --sweep", "counts": list(counts), "ran": steps[0]["ran"] if steps else None},
        "largest_kept": max(kept) if kept else None,
        "stopped_at": failed["sessions"] if failed is not None else None,
        "summary": line,
        "steps": steps,
    }
    path = store_result(out_dir, "tick-sweep", stored)
    console.print(f"sweep: {path}")
    return stored
