"""The state every Drive stream shares (SessionRuntime): the executor and its tick loop, each session's
outbox, the recording, the statistics GetStats and the metrics read, and this worker's row of the
board. Named for what it holds (the running sessions), apart from the gRPC handlers (service.RpcHandlers)
and from what builds, starts and stops it all (lifecycle.ServerLifecycle).

One asyncio loop (uvloop) runs both the gRPC handlers and the tick loop: the ticker sleeps on the
loop until just before each deadline, so handlers run in the gaps, and the tick itself is short.
REALTIME sessions are conflated both ways (newest observation wins, newest snapshot wins); LOCKSTEP
sessions are lossless and paced by the client, since their snapshots are a deterministic record.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

from dualloop.controller.contract.wire import model_info, snapshot_to_proto
from dualloop.controller.logs.format import (
    ACTUAL_CONTROLS_DETAIL,
    ACTUAL_IS_COMMAND,
    ACTUAL_NOT_DECLARED,
    EXPIRED_PLAN_IS_STALE_DETAIL,
    REQUIRE_PLAN_DETAIL,
)
from dualloop.controller.logs.recorder import Recorder
from dualloop.controller.serve import board as wb
from dualloop.controller.serve import events
from dualloop.controller.serve.agents_outbox import AgentsOutbox
from dualloop.controller.serve.config import ServerConfig
from dualloop.controller.serve.conflation import LatestSlot
from dualloop.controller.serve.metrics import (
    MetricsReading,
    PlannerReading,
    RecorderReading,
    ServerMetrics,
    TokensReading,
)
from dualloop.controller.serve.planning import ServerPlanning
from dualloop.controller.serve.realtime_threads import REALTIME
from dualloop.controller.serve.security import TokenStore
from dualloop.controller.serve.session_claims import SessionClaims
from dualloop.controller.serve.shadow_registry import ShadowRegistry
from dualloop.controller.serve.ticker import LatenessLog, PreciseTicker
from dualloop.executor.candidate import Candidate, SwapRefused
from dualloop.executor.core import Executor
from dualloop.executor.model_runner import DecisionModel
from dualloop.executor.snapshot import Clock, Snapshot
from dualloop.planner.scheduler import LATENCY_BUCKETS_S
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import log_pb2

_mono_ns = time.monotonic_ns

_LOWER_NEW_THREADS_EVERY = 200  # ticks: about once a second
# Upper bounds of the lateness histogram buckets in GetStats (microseconds).
LATENESS_BUCKETS_US = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0]


class RuntimeStats:
    """What `dualloop bench tick` and operators read: lateness, misses, latency, streaming cost."""

    def __init__(self) -> None:
        # totals since start: a GetStats reset (the window below) never touches them
        self.started_ns = _mono_ns()
        self.ticks_total = 0
        self.snapshots_sent_total = 0
        self.reset()

    def reset(self) -> None:
        self.lateness = LatenessLog()
        self.decision_latency = LatenessLog()
        self.tick_work_ns = LatenessLog()
        self.missed = 0
        self.ticks = 0
        self.snapshots_sent = 0
        self.stream_ns = 0  # converting and handing snapshots to gRPC
        self.sessions_opened = 0
        self.sessions_closed = 0
        self.window_start_ns = _mono_ns()


class SessionRuntime:
    """Executor + tick loop + per-session outboxes, shared by all Drive streams."""

    def __init__(self, executor: Executor, config: ServerConfig) -> None:
        self.executor = executor
        self.config = config
        self.outboxes: dict[str, LatestSlot[Snapshot]] = {}
        # DriveAgents streams (REALTIME): each agent's group outbox, and every group's (ended each tick)
        self.agent_outboxes: dict[str, AgentsOutbox] = {}
        self.agent_groups: set[AgentsOutbox] = set()
        self.recorder: Recorder | None = None
        self.shadows = ShadowRegistry(executor)  # what GetShadowStats answers, per session instance
        self.stats = RuntimeStats()
        self._last_seq: dict[str, int] = {}
        self._stopping = False
        self.ticker = PreciseTicker(executor.period_ns, guard_ns=int(config.executor.ticker_guard_ms * 1e6))
        self.missed_at_reset = 0
        self.scheduling = "not started"
        self.planning: ServerPlanning | None = None  # the server's own planner, if configured
        # Set when the server starts draining (SIGTERM): new sessions are refused, open ones end.
        self.draining = asyncio.Event()
        self.drives_active = 0  # Drive handlers running, opened or not
        self.drives_idle = asyncio.Event()
        self.drives_idle.set()
        # Prometheus counts beyond the runtime's own (None: no metrics endpoint, nothing counted)
        self.metrics = (
            ServerMetrics(LATENESS_BUCKETS_US, executor.checks.kinds) if config.metrics_port is not None else None
        )
        # One of several worker processes (dualloop serve --workers N): its row on the shared board
        self.board: wb.Board | None = None
        self.board_slot = 0
        self.claims: SessionClaims | None = None  # with a board: the ids open on any worker
        self._board_epoch = 0
        self._board_log: LatenessLog | None = None
        self._board_seen = 0
        self._board_hist: wb.LatenessHistogram | None = None
        self.board_fields: dict[int, float] = {}  # set by the server: ready, metrics port, draining
        self.token_store: TokenStore | None = None  # set by the server when it reads a tokens file
        self._model_info: pb.ModelInfo | None = None
        self._model_info_of: DecisionModel | None = None  # the model it describes

    def publish(self) -> None:
        """This worker's figures to its row of the board (between ticks, on the loop)."""
        board = self.board
        if board is None:
            return
        if board.reset_epoch != self._board_epoch:  # GetStats(reset=True) on another worker
            self._board_epoch = board.reset_epoch
            self.reset_stats()
        log = self.stats.lateness
        if log is not self._board_log or self._board_hist is None:  # a new window
            self._board_log, self._board_seen = log, 0
            self._board_hist = wb.LatenessHistogram(board.edges)
        self._board_hist.add(log.since(self._board_seen))
        self._board_seen = log.count
        stats, hist = self.stats, self._board_hist
        board.write(
            self.board_slot,
            {
                wb.PID: os.getpid(),
                wb.TICKS: stats.ticks,
                wb.TICKS_TOTAL: stats.ticks_total,
                wb.MISSED: self.ticker.missed - self.missed_at_reset,
                wb.MISSED_TOTAL: self.ticker.missed,
                wb.SESSIONS_OPEN: len(self.executor.sessions),
                wb.SESSIONS_OPENED: stats.sessions_opened,
                wb.SNAPSHOTS_SENT: stats.snapshots_sent,
                wb.SNAPSHOTS_SENT_TOTAL: stats.snapshots_sent_total,
                wb.LATENESS_MAX_US: hist.max_us,
                wb.LATENESS_COUNT: hist.n,
                wb.PUBLISHED_NS: _mono_ns(),
                wb.RECORDS_DROPPED: self.recorder.stats.total_dropped if self.recorder is not None else 0,
                wb.RECORDER_QUEUE_BYTES: self.recorder.queue_bytes if self.recorder is not None else 0,
                **self.board_fields,
            },
            hist.counts,
        )

    def stop(self) -> None:
        self._stopping = True

    @property
    def model_info(self) -> pb.ModelInfo:
        """ModelInfo of the live model (GetModelInfo, SessionOpened); rebuilt after a promotion."""
        if self._model_info is None or self._model_info_of is not self.executor.model:
            gates = self.executor.gates
            info = model_info(
                self.executor.card,
                self.executor.period_ns,
                "+".join(g.version_hash[:16] for g in gates),
                "+".join(g.schema.source for g in gates),
            )
            if self.planning is not None:
                info.planner = self.planning.name
            self._model_info, self._model_info_of = info, self.executor.model
        return self._model_info

    def set_candidate(self, candidate: Candidate | None, path: str | Path = "") -> None:
        """Install (or remove) the candidate; on the loop, so between two ticks."""
        previous = self.executor.candidate
        self.executor.candidate = candidate
        if candidate is not None:
            candidate.on_pause = lambda reason: events.event(
                "server.candidate_paused", logging.WARNING, candidate_version=candidate.version, reason=reason
            )
            events.event(
                "server.candidate_loaded",
                candidate=candidate.model.card.name,
                candidate_version=candidate.version,
                path=str(path),
                replaced=previous.version if previous is not None else None,
                live_version=self.executor.card.version,
                sessions_open=len(self.executor.sessions),
            )

    def promote(self, by: str) -> tuple[str, str]:
        """The candidate becomes the live model between two ticks (this runs on the loop, as the ticks
        do); SwapRefused says why not. Every open session and stream keeps going."""
        previous, current = self.executor.promote()
        events.event(
            "server.promoted",
            by=by,
            previous_version=previous,
            model_version=current,
            sessions_kept=len(self.executor.sessions),
        )
        return previous, current

    def promote_on_signal(self) -> None:
        """SIGHUP: promote the loaded candidate; a refusal is logged (a signal has no caller to answer)."""
        try:
            self.promote("SIGHUP")
        except SwapRefused as err:
            events.event("server.promote_refused", logging.WARNING, by="SIGHUP", reason=str(err))

    def reset_stats(self) -> None:
        self.stats.reset()
        self.missed_at_reset = self.ticker.missed

    async def run_ticks(self) -> None:
        ex, ticker = self.executor, self.ticker
        metrics = self.metrics
        tally = metrics.realtime.add if metrics is not None else None
        board = self.board
        record_agreement = self.shadows.record
        try:
            while not self._stopping:
                precise = ex.realtime_sessions > 0
                tick = await ticker.next(precise)
                stats = self.stats  # publish() below may have started a new window
                if precise:  # lateness and tick counts describe ticks someone was served
                    stats.lateness.add(tick.lateness_ns)
                    stats.ticks += 1
                    stats.ticks_total += 1
                stats.missed = ticker.missed
                if self.planning is not None:
                    self.planning.realtime.on_tick(tick.scheduled_ns)
                snaps = ex.tick(tick.scheduled_ns, tick.index, tick.lateness_ns)
                for snap in snaps:
                    record_agreement(snap)
                    self.record_snapshot(snap)
                    if tally is not None:
                        tally(snap)
                    box = self.outboxes.get(snap.session_id)
                    if box is not None:
                        box.put(snap)
                    elif (group := self.agent_outboxes.get(snap.session_id)) is not None:
                        group.put(snap)
                    if self._last_seq.get(snap.session_id) != snap.observation_seq:
                        self._last_seq[snap.session_id] = snap.observation_seq
                        # arrival -> first snapshot that used it
                        stats.decision_latency.add(snap.observation_age_ns + snap.emit_time_ns - snap.scheduled_time_ns)
                for group in self.agent_groups:  # each DriveAgents stream: its agents' snapshots of this tick
                    group.end_tick(tick.index)
                work_ns = _mono_ns() - tick.started_ns
                stats.tick_work_ns.add(work_ns)
                if metrics is not None and precise:
                    metrics.on_tick(tick.lateness_ns, work_ns)
                if board is not None and ticker.ticks % wb.PUBLISH_EVERY == 0:
                    self.publish()  # after the tick's work, in the time before the next deadline
                if ticker.ticks % _LOWER_NEW_THREADS_EVERY == 0:
                    REALTIME.lower_new_threads()  # any a library started from this thread meanwhile
        finally:
            ticker.close()  # its alarm's file descriptor

    def open_recording(
        self,
        session_id: str,
        clock: pb.ClockMode,
        shadow: bool,
        observation_period_ns: int = 0,
        measured_features: Sequence[str] = (),
        require_plan: bool = False,
        actual_is_command: bool = False,
    ) -> None:
        if self.recorder is None:
            return
        # what the client declared its actual controls to be (OpenSession.actual_controls_are_commands)
        details = {ACTUAL_CONTROLS_DETAIL: ACTUAL_IS_COMMAND if actual_is_command else ACTUAL_NOT_DECLARED}
        if require_plan:  # a replay judges plans by the same rule
            details[REQUIRE_PLAN_DETAIL] = "true"
        if self.planning is not None:  # the server plans it: an expired plan is stale, in its replay too
            details[EXPIRED_PLAN_IS_STALE_DETAIL] = "true"
        card, gates = self.executor.card, self.executor.gates
        self.recorder.open_session(
            log_pb2.SessionHeader(
                session_id=session_id,
                clock=clock,
                shadow=shadow,
                model_version=card.version,
                model_schema_hash=card.schema_hash(),
                gate_version="+".join(g.version_hash[:16] for g in gates),
                config_json=self.config.model_dump_json(),
                source="grpc session",
                start_time_unix_ns=time.time_ns(),
                format_version=1,
                feature_names=card.feature_names,
                action_names=card.actions,
                control_names=[c.name for c in card.controls],
                tick_period_ns=self.executor.period_ns,
                observation_period_ns=observation_period_ns,
                measured_features=measured_features,
                source_details=details,
            )
        )
        if self.planning is not None:  # the server plans it: its plans go into its recording
            self.planning.recording.open(session_id, self.recorder)

    def record_observation(self, session_id: str, observation: pb.Observation) -> None:
        if self.recorder is not None:
            if self.planning is not None:  # with the plan the server applied, not the client's
                observation = self.planning.recording.observation(session_id, observation)
            self.recorder.write_observation(session_id, observation)

    def record_snapshot(self, snap: Snapshot) -> None:
        """To the session log, when recording: every snapshot, not only those a slow client received."""
        if self.recorder is not None:
            self.recorder.write_snapshot(snapshot_to_proto(snap))

    def forget(self, session_id: str) -> None:
        if self.metrics is not None:  # before they go: what the session had dropped
            self.metrics.on_close(self.executor.sessions.get(session_id), self.outboxes.get(session_id))
        self.executor.close_session(session_id)
        if self.claims is not None:
            self.claims.release(session_id)
        if self.recorder is not None:
            self.recorder.close_session(session_id)
        box = self.outboxes.pop(session_id, None)
        if box is not None:
            box.close()
        self._last_seq.pop(session_id, None)
        self.shadows.close(session_id)
        if self.planning is not None:
            self.planning.forget(session_id)
        self.stats.sessions_closed += 1

    def _tokens_reading(self) -> TokensReading | None:
        store = self.token_store
        if store is None:
            return None
        store.tokens()  # a scrape sees a broken file even while no caller comes (the check is one stat)
        return TokensReading(store.broken is not None, store.reload_failures)

    def metrics_reading(self) -> MetricsReading:
        """One scrape's values (on the loop, between ticks: they agree with each other as GetStats' do)."""
        metrics = self.metrics
        assert metrics is not None
        sessions_open = dict.fromkeys(Clock, 0)
        dropped = {c: metrics.closed_observations_dropped[c] for c in Clock}
        for s in self.executor.sessions.values():
            sessions_open[s.clock] += 1
            dropped[s.clock] += s.observations_dropped
        planner = None
        if self.planning is not None:
            scheduler, lockstep = self.planning.scheduler, self.planning.lockstep
            planner = PlannerReading(
                scheduler.counts(),
                dict(lockstep.counts) if lockstep is not None else {},
                list(scheduler.latency_buckets),
                scheduler.latency_sum_s,
                LATENCY_BUCKETS_S,
            )
        rec = self.recorder
        ex = self.executor.stats
        return metrics.read(
            missed_total=self.ticker.missed,
            stage_ns=ex.stage_ns.tolist(),
            batches=ex.ticks,
            rows=ex.rows,
            sessions_open=sessions_open,
            observations_dropped=dropped,
            snapshots_sent_total=self.stats.snapshots_sent_total,
            snapshots_dropped_total=metrics.closed_snapshots_dropped + sum(b.dropped for b in self.outboxes.values()),
            planner=planner,
            recorder=None
            if rec is None
            else RecorderReading(rec.queue_depth, dict(rec.stats.dropped), dict(rec.stats.written), rec.queue_bytes),
            tokens=self._tokens_reading(),
        )
