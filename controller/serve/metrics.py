"""Prometheus metrics: counted with plain ints where things happen, turned into metrics only when scraped.

The tick never calls prometheus-client: it bumps list entries (a bisect for a histogram bucket, one
increment per snapshot for its safety state; for a snapshot with reasons, one per reason and its
check row's bytes kept for a bulk sum), and the counters the
runtime keeps anyway (RuntimeStats, ExecutorStats, the ticker, the planner's scheduler, the recorder)
are read as they are. A scrape asks the server's loop for one `MetricsReading` (every value read in
one loop callback, between ticks, so they agree with each other as GetStats' do) and builds the
metric families from it in the HTTP thread. Each server has its own CollectorRegistry.
docs/operations.md#metrics lists the metrics.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIServer

import numpy as np
from prometheus_client import start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector, CollectorRegistry

from dualloop.controller.contract.addresses import bare_host
from dualloop.controller.serve.conflation import LatestSlot
from dualloop.executor.sessions import Session
from dualloop.executor.snapshot import CHECK_DTYPE, Check, Clock, Reason, SafetyState, Snapshot

# Upper bounds of the REALTIME tick work histogram (wake -> snapshots handed to the outboxes), us.
TICK_WORK_BUCKETS_US = (50.0, 100.0, 200.0, 300.0, 500.0, 750.0, 1000.0, 1500.0, 2000.0, 3000.0, 5000.0)
STAGES = ("preprocess", "forward", "gate", "postprocess")  # ExecutorStats.stage_ns, in its order
READ_TIMEOUT_S = 5.0  # a scrape waits this long for the server loop, then fails (HTTP 500)


class SnapshotTally:
    """Decisions of one clock by safety state, reason and vetoing check: ints, bumped per snapshot."""

    __slots__ = ("states", "reasons", "kinds", "_vetoes", "_rows")

    FOLD_ROWS = 1024  # check rows kept before they are summed (bounded memory without a scrape)

    def __init__(self, kinds: Sequence[Check]) -> None:
        self.states = [0] * (max(SafetyState) + 1)  # indexed by the enum value
        self.reasons = [0] * (max(Reason) + 1)
        self.kinds = tuple(kinds)  # the executor's checks, the columns of Snapshot.checks
        self._vetoes = np.zeros(len(self.kinds), np.int64)
        # The check rows (their bytes) of snapshots with a reason, summed in bulk: a numpy add per
        # snapshot cost 1-2 us, tobytes and append a fifth of that (a sensor fault can make every
        # snapshot of every tick a vetoed one).
        self._rows: list[bytes] = []

    def add(self, snap: Snapshot) -> None:
        self.states[snap.safety_state] += 1
        if snap.reasons:  # a vetoing check always gives a reason (OOD_VETO, LOW_MARGIN): nominal ticks stop here
            for r in snap.reasons:
                self.reasons[r] += 1
            if snap.checks is not None:
                self._rows.append(snap.checks.tobytes())
                if len(self._rows) >= self.FOLD_ROWS:
                    self._fold()

    def _fold(self) -> None:
        if self._rows and self.kinds:
            rows = np.frombuffer(b"".join(self._rows), CHECK_DTYPE).reshape(-1, len(self.kinds))
            self._vetoes += rows["veto"].sum(axis=0)
        self._rows.clear()

    def vetoes(self) -> list[int]:
        """Snapshots each check (`kinds`) vetoed."""
        self._fold()
        result: list[int] = self._vetoes.tolist()
        return result


class ServerMetrics:
    """What the runtime counts for the metrics beyond its own counters; None on a runtime without metrics."""

    def __init__(self, lateness_buckets_us: Sequence[float], kinds: Sequence[Check]) -> None:
        # bucket bounds in integer ns: bisect on the tick's own int, no float conversion
        self.lateness_bounds_us = tuple(lateness_buckets_us)
        self._lateness_ns = [int(round(b * 1e3)) for b in lateness_buckets_us]
        self._work_ns = [int(round(b * 1e3)) for b in TICK_WORK_BUCKETS_US]
        self.lateness = [0] * (len(self._lateness_ns) + 1)  # per bucket, the last one above every bound
        self.lateness_sum_ns = 0
        self.work = [0] * (len(self._work_ns) + 1)
        self.work_sum_ns = 0
        self.realtime = SnapshotTally(kinds)
        self.lockstep = SnapshotTally(kinds)
        self.opened = [0] * (max(Clock) + 1)
        # what closed sessions had counted (open ones are read from the sessions at scrape time)
        self.closed_observations_dropped = [0] * (max(Clock) + 1)
        self.closed_snapshots_dropped = 0

    def on_tick(self, lateness_ns: int, work_ns: int) -> None:
        """A tick served to REALTIME sessions (the ticks GetStats counts)."""
        self.lateness[bisect.bisect_left(self._lateness_ns, lateness_ns)] += 1
        self.lateness_sum_ns += lateness_ns
        self.work[bisect.bisect_left(self._work_ns, work_ns)] += 1
        self.work_sum_ns += work_ns

    def read(self, **runtime: Any) -> MetricsReading:
        """Copies of the counts kept here, with the runtime's values (the other MetricsReading fields)."""
        by_clock = {Clock.REALTIME: self.realtime, Clock.LOCKSTEP: self.lockstep}
        return MetricsReading(
            lateness=list(self.lateness),
            lateness_sum_ns=self.lateness_sum_ns,
            lateness_bounds_us=self.lateness_bounds_us,
            work=list(self.work),
            work_sum_ns=self.work_sum_ns,
            opened=list(self.opened),
            kinds=self.realtime.kinds,
            states={c: list(t.states) for c, t in by_clock.items()},
            reasons={c: list(t.reasons) for c, t in by_clock.items()},
            vetoes={c: t.vetoes() for c, t in by_clock.items()},
            **runtime,
        )

    def on_close(self, session: Session | None, outbox: LatestSlot[Snapshot] | None) -> None:
        if session is not None:
            self.closed_observations_dropped[session.clock] += session.observations_dropped
        if outbox is not None:
            self.closed_snapshots_dropped += outbox.dropped


@dataclass
class PlannerReading:
    realtime: dict[str, int]  # PlanScheduler.counts()
    lockstep: dict[str, int]  # LockstepPlanning.counts
    latency_buckets: list[int]
    latency_sum_s: float
    latency_bounds_s: Sequence[float]


@dataclass
class RecorderReading:
    queue_depth: int
    dropped: dict[str, int]
    written: dict[str, int]
    queue_bytes: int = 0


@dataclass
class TokensReading:
    broken: bool  # the tokens file could not be used at its last reload: every token refused
    reload_failures: int


@dataclass
class MetricsReading:
    """Every value of one scrape, read in one callback on the server loop (SessionRuntime.metrics_reading)."""

    lateness: list[int]
    lateness_sum_ns: int
    lateness_bounds_us: Sequence[float]
    work: list[int]
    work_sum_ns: int
    opened: list[int]
    kinds: tuple[Check, ...]
    states: dict[Clock, list[int]]
    reasons: dict[Clock, list[int]]
    vetoes: dict[Clock, list[int]]
    missed_total: int
    stage_ns: list[int]
    batches: int
    rows: int
    sessions_open: dict[Clock, int]
    observations_dropped: dict[Clock, int]
    snapshots_sent_total: int
    snapshots_dropped_total: int
    planner: PlannerReading | None
    recorder: RecorderReading | None
    tokens: TokensReading | None = None  # None: no tokens file


def _histogram(
    name: str, doc: str, counts: Sequence[int], bounds: Sequence[float], per_second: float, total: float
) -> HistogramMetricFamily:
    """Per-bucket counts (the last above every bound) as Prometheus' cumulative buckets, the bounds
    given in units of 1 / per_second (divided, not multiplied: 5 us is "5e-06", not "4.9999999999999996e-06")."""
    cumulative = np.cumsum(counts).tolist()
    buckets = [(repr(b / per_second), c) for b, c in zip(bounds, cumulative)] + [("+Inf", cumulative[-1])]
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=total)


def families(r: MetricsReading) -> Iterable[Metric]:
    """The metric families of one reading (names, types and labels: docs/operations.md#metrics)."""
    yield from _tick_families(r)
    yield from _session_families(r)
    yield from _decision_families(r)
    if r.planner is not None:
        yield from _planner_families(r.planner)
    if r.recorder is not None:
        yield from _recorder_families(r.recorder)
    if r.tokens is not None:
        yield from _token_families(r.tokens)


_CLOCKS = (Clock.REALTIME, Clock.LOCKSTEP)


def _tick_families(r: MetricsReading) -> Iterable[Metric]:
    """The tick loop: lateness, missed deadlines, work, time per executor stage, rows decided."""
    yield _histogram(
        "dualloop_tick_lateness_seconds",
        "Tick start minus its deadline, ticks with REALTIME sessions open (GetStats' ticks and buckets).",
        r.lateness,
        r.lateness_bounds_us,
        1e6,
        r.lateness_sum_ns / 1e9,
    )
    yield CounterMetricFamily(
        "dualloop_missed_deadlines",
        "Tick deadlines skipped because the loop was a period or more late (GetStats.missed_deadlines_total).",
        value=r.missed_total,
    )
    yield _histogram(
        "dualloop_tick_work_seconds",
        "Work of a tick with REALTIME sessions open: wake to snapshots handed to the outboxes.",
        r.work,
        TICK_WORK_BUCKETS_US,
        1e6,
        r.work_sum_ns / 1e9,
    )
    stage = SummaryMetricFamily(
        "dualloop_tick_stage_seconds",
        "Executor time per stage of every batch (REALTIME ticks and LOCKSTEP ticks); count: batches.",
        labels=["stage"],
    )
    for name, ns in zip(STAGES, r.stage_ns):
        stage.add_metric([name], r.batches, ns / 1e9)
    yield stage
    yield CounterMetricFamily("dualloop_tick_rows", "Session rows decided over all batches.", value=r.rows)


def _session_families(r: MetricsReading) -> Iterable[Metric]:
    """Sessions per clock, dropped observations, snapshots sent and conflated."""
    open_ = GaugeMetricFamily("dualloop_sessions_open", "Sessions open now.", labels=["clock"])
    opened = CounterMetricFamily("dualloop_sessions_opened", "Sessions opened through Drive.", labels=["clock"])
    obs = CounterMetricFamily(
        "dualloop_observations_dropped",
        "Observations no tick used: replaced by a newer one (REALTIME) or off the tick grid (LOCKSTEP).",
        labels=["clock"],
    )
    for c in _CLOCKS:
        open_.add_metric([c.name], r.sessions_open.get(c, 0))
        opened.add_metric([c.name], r.opened[c])
        obs.add_metric([c.name], r.observations_dropped.get(c, 0))
    yield from (open_, opened, obs)
    yield CounterMetricFamily(
        "dualloop_snapshots_sent",
        "Snapshots written to Drive streams (GetStats.snapshots_sent_total).",
        value=r.snapshots_sent_total,
    )
    yield CounterMetricFamily(
        "dualloop_snapshots_dropped",
        "REALTIME snapshots replaced in a session's outbox before the client took them (conflation).",
        value=r.snapshots_dropped_total,
    )


def _decision_families(r: MetricsReading) -> Iterable[Metric]:
    """Snapshots per clock: all, by safety state, by reason, by vetoing check."""
    decisions = CounterMetricFamily("dualloop_decisions", "Snapshots the executor made.", labels=["clock"])
    states = CounterMetricFamily(
        "dualloop_safety_state", "Snapshots by the safety state they applied.", labels=["clock", "state"]
    )
    reasons = CounterMetricFamily(
        "dualloop_reasons",
        "Snapshots carrying each reason (one snapshot may carry several).",
        labels=["clock", "reason"],
    )
    vetoes = CounterMetricFamily("dualloop_check_vetoes", "Snapshots each check vetoed.", labels=["clock", "check"])
    for c in _CLOCKS:
        s = r.states[c]
        decisions.add_metric([c.name], sum(s))
        for st in SafetyState:
            states.add_metric([c.name, st.name], s[st])
        for reason in Reason:
            reasons.add_metric([c.name, reason.name], r.reasons[c][reason])
        for kind, n in zip(r.kinds, r.vetoes[c]):
            vetoes.add_metric([c.name, kind.name], n)
    yield from (decisions, states, reasons, vetoes)


def _planner_families(p: PlannerReading) -> Iterable[Metric]:
    yield _histogram(
        "dualloop_planner_latency_seconds",
        "REALTIME planning: request to plan received from the planner's worker.",
        p.latency_buckets,
        p.latency_bounds_s,
        1.0,
        p.latency_sum_s,
    )
    for key, doc in (
        ("plans", "Plans received."),
        ("errors", "Plan requests that failed."),
        ("timeouts", "Plan requests past their deadline."),
    ):
        fam = CounterMetricFamily(f"dualloop_planner_{key}", doc, labels=["clock"])
        fam.add_metric([Clock.REALTIME.name], p.realtime.get(key, 0))
        fam.add_metric([Clock.LOCKSTEP.name], p.lockstep.get(key, 0))
        yield fam
    yield CounterMetricFamily(
        "dualloop_planner_overruns",
        "REALTIME plan requests made while the session's previous one was unanswered.",
        value=p.realtime.get("overruns", 0),
    )
    yield CounterMetricFamily(
        "dualloop_planner_restarts", "Planner workers replaced (hung or died).", value=p.realtime.get("restarts", 0)
    )


def _recorder_families(rec: RecorderReading) -> Iterable[Metric]:
    yield GaugeMetricFamily("dualloop_recorder_queue_depth", "Records waiting to be written.", value=rec.queue_depth)
    yield GaugeMetricFamily(
        "dualloop_recorder_queue_bytes",
        "Serialised bytes of the records waiting to be written.",
        value=rec.queue_bytes,
    )
    dropped = CounterMetricFamily(
        "dualloop_recorder_dropped",
        "Records dropped: the recorder's queue was full, or a write failed (recording stopped).",
        labels=["kind"],
    )
    written = CounterMetricFamily("dualloop_recorder_written", "Records written.", labels=["kind"])
    for record in sorted(rec.dropped):
        dropped.add_metric([record], rec.dropped[record])
        written.add_metric([record], rec.written.get(record, 0))
    yield from (dropped, written)


def _token_families(tokens: TokensReading) -> Iterable[Metric]:
    yield GaugeMetricFamily(
        "dualloop_tokens_file_broken",
        "1 while the tokens file could not be used at its last reload: every token is refused.",
        value=int(tokens.broken),
    )
    yield CounterMetricFamily(
        "dualloop_tokens_reload_failures",
        "Reloads of the tokens file that failed (unreadable, deleted, a bad line, no token).",
        value=tokens.reload_failures,
    )


class MetricsCollector(Collector):
    """Reads the server on its loop at scrape time; prometheus-client calls collect() in its HTTP thread."""

    def __init__(self, read: Callable[[], MetricsReading], loop: asyncio.AbstractEventLoop) -> None:
        self._read = read
        self._loop = loop

    def reading(self) -> MetricsReading:
        read = self._read
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:  # called on the loop itself (a test, generate_latest in a handler)
            result: MetricsReading = read()
            return result
        future: concurrent.futures.Future[MetricsReading] = concurrent.futures.Future()

        def call() -> None:
            try:
                future.set_result(read())
            except BaseException as err:  # noqa: BLE001 - handed to the scraping thread
                future.set_exception(err)

        self._loop.call_soon_threadsafe(call)
        return future.result(READ_TIMEOUT_S)

    def collect(self) -> Iterable[Metric]:
        return list(families(self.reading()))


class MetricsEndpoint:
    """GET http://host:port/metrics (any path answers) on a daemon thread, with this server's own registry."""

    def __init__(self, collector: Collector) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self._httpd: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None

    def start(self, host: str, port: int) -> int:
        try:
            self._httpd, self._thread = start_http_server(port, addr=bare_host(host.strip()), registry=self.registry)
        except OSError as err:
            raise OSError(f"cannot serve metrics on {host}:{port} ({err}): is the port in use?") from None
        self.port = int(self._httpd.server_port)
        return self.port

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(5)
