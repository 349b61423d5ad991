"""What the bench processes report (one JSON line each, controller.bench.procs), typed: the fields
`bench tick`, `bench planner` and `bench soak` read from them and store in runs/bench/*.json."""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

# min, p50, p99, p99.9 and max in microseconds (controller.serve.ticker.percentiles_us)
Percentiles = dict[str, float]


class ServerFirst(TypedDict):
    """A bench server's first line: where it listens and what it serves."""

    port: int
    metrics_port: int | None
    model: dict[str, str]
    gates: list[dict[str, str]]
    candidate: dict[str, Any] | None


class SessionRow(TypedDict):
    """One client session, as the clients process saw it."""

    session: int
    observations_sent: int
    snapshots_received: int
    snapshots_dropped: int  # the server's count, from the session's last snapshot
    tick_gaps: int
    tick_span: int
    reasons: dict[str, int]
    client_process_cpu_s: NotRequired[float]  # the whole process's CPU, on every row


class WorkerRow(TypedDict):
    """One server worker of several (bench tick --workers)."""

    sessions_here: int
    ticks: int
    missed_deadlines: int
    lateness_us: Percentiles
    cpu_fraction: float
    cpus: list[int] | None


class ServerResult(TypedDict):
    """A bench server's measured window (every worker's merged into one with --workers)."""

    planner: dict[str, Any] | None
    ticks: int
    missed_deadlines: int
    missed_at_ns: list[int]  # when (monotonic ns, the machine's clock) each run of missed deadlines began
    missed_causes: list[dict[str, int | str]]
    gc: dict[str, Any]
    wall_s: float
    lateness_us: Percentiles
    tick_work_us: Percentiles
    decision_latency_us: Percentiles
    cpu_per_tick_us: dict[str, float]
    cpu_fraction: float
    snapshots_sent: int
    sessions_here: int
    cpus: list[int] | None
    planner_worker_cpus: str | None
    scheduling: str
    security: dict[str, bool]
    workers: NotRequired[int]
    per_worker: NotRequired[list[WorkerRow]]


class BareResult(TypedDict):
    """The bare ticker's run (controller.serve.ticker.run_bare_ticker)."""

    lateness_us: Percentiles
    missed: int
    ticks: int
    cpu_fraction: float
    scheduling: str
    stalls_at_ns: list[int]
    missed_causes: list[dict[str, int | str]]


class AgentsStreamRow(TypedDict):
    """One DriveAgents stream of `bench agents`, as its clients process saw it."""

    stream: int
    agents: int
    requests_sent: int
    responses: int
    agent_snapshots_received: int
    agent_snapshots_dropped: int  # the server's count, from the stream's last response
    agent_snapshots_nominal: int  # of those received, NOMINAL (the path measured: a veto takes the fallback's)
    tick_gaps: int  # responses whose tick was not the previous one's + 1
    agent_errors: int
    send_rate_hz: float  # requests over the time the stream sent them (its drain after the last not counted)
    client_process_cpu_s: float


def reasons_text(sessions: list[SessionRow]) -> str:
    """The reasons on a run's snapshots, as shares of them (a run whose sessions fell back measured the
    fallback path, not the one served)."""
    total = max(sum(s["snapshots_received"] for s in sessions), 1)
    counts: dict[str, int] = {}
    for s in sessions:
        for name, n in s["reasons"].items():
            counts[name] = counts.get(name, 0) + n
    shares = ", ".join(f"{name} {n / total:.2%}" for name, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    return f"reasons on the snapshots: {shares or 'none (every snapshot NOMINAL without a reason)'}"


def snapshots_dropped(result: dict[str, Any]) -> int:
    """Snapshots the server dropped for slow readers, over all sessions of a run."""
    return sum(int(s["snapshots_dropped"]) for s in result["sessions_detail"])
