"""What every bench shares: the run specification of a served bench (TickRun), where its processes
run (cpu_plan), how they are started (each role's specification as JSON), the progress bar while
they run, and where the results are stored (runs/bench/<kind>-<time>.json)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from dualloop.executor.config import DEFAULT_TICKER_GUARD_MS

# A benchmark's results as stored: JSON objects whose fields docs/measurements.md and the tests read
Result = dict[str, Any]


@dataclass(frozen=True)
class TickRun:
    """One run of the bench server (`bench tick`, `bench planner`): what it serves, the REALTIME
    sessions that drive it and for how long, its scheduling and where each process runs.

    rt_priority: SCHED_FIFO for the server and, for fairness, the bare ticker (None: normal).
    cpu_wake_latency_us: the server holds this PM QoS request while it serves (None: idle states
    left alone); it holds for the whole machine, the bare ticker's CPUs included.
    workers: server processes sharing one port (as `dualloop serve --workers`); each client session
    then has a connection of its own. client_procs: client processes (default one per 16 sessions).
    pin: the server apart from the clients and the bare ticker where the machine has the CPUs.
    candidate: a model decided beside the live one on every tick (never applied).
    metrics: the server serves Prometheus metrics, scraped every SCRAPE_S by the bench.
    alternate_s: the planner paused and planning in turns of this long (bench planner)."""

    model: Path
    sessions: int = 8
    duration_s: float = 60.0
    guard_ms: float = DEFAULT_TICKER_GUARD_MS
    rt_priority: int | None = None
    cpu_wake_latency_us: int | None = None
    gates: tuple[Path, ...] = ()
    workers: int = 1
    client_procs: int | None = None
    pin: bool = True
    planner: str = "none"
    candidate: Path | None = None
    candidate_gates: tuple[Path, ...] = ()
    metrics: bool = False
    alternate_s: float | None = None
    label: str = "bench tick"


def machine_cpus() -> list[int]:
    """The CPUs this process may run on."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


@dataclass
class CpuPlan:
    """Which CPUs each bench process may run on (None: any), and how to say it."""

    servers: Sequence[list[int] | None]
    clients: list[int] | None
    bare: list[int] | None
    note: str


def cpu_plan(cpus: Sequence[int], workers: int, pin: bool = True) -> CpuPlan:
    """Server workers one CPU each, clients and the bare ticker on the CPUs left: the clients' work
    must not be counted as the server's lateness, and the bare ticker measures the machine's floor
    beside neither the server's work nor its own priority fight with it. Where no CPU is left for the
    clients, nothing is pinned apart and the note says so."""
    cpus = sorted(cpus)
    if not pin:
        return CpuPlan([None] * workers, None, None, "not pinned (--no-pin)")
    if len(cpus) <= workers:
        # Pinning each worker to a CPU the clients also use was worse than letting the scheduler move
        # them (32 sessions, 2 workers, this 2-CPU VM: 26 missed and 0.25% dropped pinned, 10 and
        # 0.05% not, in runs minutes apart)
        return CpuPlan(
            [None] * workers,
            None,
            None,
            f"{workers} server worker(s) on {len(cpus)} CPU(s): no CPU left for the clients and the bare ticker, "
            f"nothing pinned (all share every CPU)",
        )
    servers = [[c] for c in cpus[:workers]]
    rest = cpus[workers:]
    return CpuPlan(
        servers,
        rest,
        rest,
        f"server on CPU {', '.join(str(s[0]) for s in servers)}; clients and the bare ticker on CPU "
        f"{', '.join(map(str, rest))}",
    )


async def start_module(module: str, *args: str, env: dict[str, str] | None = None) -> asyncio.subprocess.Process:
    """`python -m module args...`, its stdout piped (where it prints its JSON result)."""
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, *args, stdout=asyncio.subprocess.PIPE, env=env
    )


async def start_role(role: str, spec: object, env: dict[str, str] | None = None) -> asyncio.subprocess.Process:
    """A bench process (controller.bench.procs: server, clients, bare) given its specification."""
    return await start_module("dualloop.controller.bench.procs", role, json.dumps(asdict(spec)), env=env)  # type: ignore[call-overload]


def progress(label: str, console: Console, *, described: bool = False) -> Progress:
    """The bar a bench shows while its processes run (gone once they have ended)."""
    columns = [TextColumn(f"[bold]{label}[/]"), BarColumn(), TextColumn("{task.completed:.0f}/{task.total:.0f} s")]
    if described:
        columns.append(TextColumn("{task.description}"))
    return Progress(*columns, TimeRemainingColumn(), console=console, transient=True)


async def wait_all(
    procs: Sequence[asyncio.subprocess.Process], label: str, duration_s: float, console: Console
) -> None:
    """Until every process of procs has ended, with the bar filling over duration_s."""
    t0 = time.monotonic()
    with progress(label, console) as bar:
        task = bar.add_task("run", total=duration_s)
        while any(p.returncode is None for p in procs):
            bar.update(task, completed=min(duration_s, time.monotonic() - t0))
            try:
                await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), 0.25)
            except TimeoutError:
                pass


# The executor keeps time (absolute bounds, the serving target): no missed deadline, p99 lateness
# under 1 ms, fewer than 0.1% of the snapshots dropped for slow readers; and the verdict is only
# given when the bare ticker of the same run met the same bounds (else the machine, not the
# executor, was measured).
P99_BOUND_US = 1000.0
DROPPED_BOUND = 0.001


def floor_failures(bare_missed: int, bare_p99_us: float, subject: str = "") -> list[str]:
    """The failure that voids a verdict on `subject` (none where empty): the bare ticker, the machine's
    floor, missed deadlines itself or ran past the p99 bound."""
    if not bare_missed and bare_p99_us < P99_BOUND_US:
        return []
    void = f": no verdict on {subject} from this run" if subject else ""
    return [
        f"the machine's floor itself did not keep time (bare ticker: {bare_missed} missed, p99 {bare_p99_us:.0f} us)"
        + void
    ]


def store_result(out_dir: Path, kind: str, result: Result, stamp: str | None = None) -> Path:
    """A benchmark's results as runs/bench/<kind>-<timestamp>.json; returns the path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{kind}-{stamp or datetime.now().strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2))
    return path
