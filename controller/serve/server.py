"""The gRPC server: a thin layer that feeds the executor and streams its snapshots.

One asyncio loop (uvloop) runs both the gRPC handlers and the tick loop: the ticker sleeps on the
loop until just before each deadline, so handlers run in the gaps, and the tick itself is short.
REALTIME sessions are conflated both ways (newest observation wins, newest snapshot wins); LOCKSTEP
sessions are lossless and paced by the client, since their snapshots are a deterministic record.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import logging
import os
import threading
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from google.protobuf.message import DecodeError, Message

from dualloop.controller.contract.addresses import host_port
from dualloop.controller.contract.errors import ConfigError
from dualloop.controller.contract.gate_files import load_gate_for_model
from dualloop.controller.contract.shadow import CandidateTally, ShadowAgreement
from dualloop.controller.contract.wire import (
    drive_response_bytes,
    model_info,
    observation_from_proto,
    snapshot_response,
    snapshot_to_proto,
)
from dualloop.controller.logs.format import (
    ACTUAL_CONTROLS_DETAIL,
    ACTUAL_IS_COMMAND,
    ACTUAL_NOT_DECLARED,
    REQUIRE_PLAN_DETAIL,
)
from dualloop.controller.logs.recorder import Recorder, unique_log_path
from dualloop.controller.serve import board as wb
from dualloop.controller.serve import client_strings, events
from dualloop.controller.serve.candidate import CandidateError, candidate_status, load_candidate
from dualloop.controller.serve.config import ServerConfig
from dualloop.controller.serve.conflation import LatestSlot, carry_over
from dualloop.controller.serve.cpu_latency import CpuLatencyRequest, hold_cpu_wake_latency
from dualloop.controller.serve.health import Health, enable_reflection
from dualloop.controller.serve.limits import session_limits
from dualloop.controller.serve.metrics import (
    MetricsCollector,
    MetricsEndpoint,
    MetricsReading,
    PlannerReading,
    RecorderReading,
    ServerMetrics,
    TokensReading,
)
from dualloop.controller.serve.planning import ServerPlanning
from dualloop.controller.serve.realtime_threads import REALTIME, lower_this_thread, set_realtime_priority
from dualloop.controller.serve.security import (
    CALLER_ID,
    Authenticator,
    AuthError,
    AuthInterceptor,
    TokenStore,
    refuse_actuating_for_shadow_only,
    refuse_others_statistics,
    refuse_shadow_only_past_share,
    require_admin,
)
from dualloop.controller.serve.ticker import LatenessLog, PreciseTicker, percentiles_us
from dualloop.executor.candidate import Candidate, SwapRefused
from dualloop.executor.core import Executor
from dualloop.executor.model_cost import OverBudget, check_live
from dualloop.executor.model_runner import DecisionModel
from dualloop.executor.sessions import InvalidObservation, SessionError
from dualloop.executor.snapshot import Clock, Snapshot
from dualloop.planner.scheduler import LATENCY_BUCKETS_S
from dualloop.planner.tls import validity_problem
from dualloop.planner.worker import SourceFactory
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc
from dualloop.v2 import log_pb2

_mono_ns = time.monotonic_ns
_perf_ns = time.perf_counter_ns

# Upper bounds of the lateness histogram buckets in GetStats (microseconds).
_LOWER_NEW_THREADS_EVERY = 200  # ticks: about once a second
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


@dataclass
class ShadowInstance:
    """The shadow statistics of one opening of a session (SessionOpened.session_instance)."""

    session_id: str
    instance: str
    agreement: ShadowAgreement
    candidate: CandidateTally | None = None  # a candidate model's proposals against the live ones
    owner: str = ""  # the opener's security.CALLER_ID ("": authentication off, or opened directly)


class ControllerRuntime:
    """Executor + tick loop + per-session outboxes, shared by all Drive streams."""

    KEEP_CLOSED_SHADOW_STATS = 256  # closed session instances whose agreement stays queryable

    def __init__(self, executor: Executor, config: ServerConfig) -> None:
        self.executor = executor
        self.config = config
        self.outboxes: dict[str, LatestSlot[Snapshot]] = {}
        self.recorder: Recorder | None = None
        # Shadow statistics per session instance: a reused session id starts fresh. Open instances
        # by session id; every kept instance by its id; the newest instance of each session id; and
        # the closed ones, oldest first, forgotten beyond KEEP_CLOSED_SHADOW_STATS (bounded memory).
        self.shadow_open: dict[str, ShadowInstance] = {}
        self.shadow_instances: dict[str, ShadowInstance] = {}
        self.shadow_latest: dict[str, str] = {}
        self._shadow_closed: collections.deque[str] = collections.deque()
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
                    self.record_agreement(snap)
                    self.record_snapshot(snap)
                    if tally is not None:
                        tally(snap)
                    box = self.outboxes.get(snap.session_id)
                    if box is not None:
                        box.put(snap)
                    if self._last_seq.get(snap.session_id) != snap.observation_seq:
                        self._last_seq[snap.session_id] = snap.observation_seq
                        # arrival -> first snapshot that used it
                        stats.decision_latency.add(snap.observation_age_ns + snap.emit_time_ns - snap.scheduled_time_ns)
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

    def record_observation(self, session_id: str, observation: pb.Observation) -> None:
        if self.recorder is not None:
            self.recorder.write_observation(session_id, observation)

    def record_snapshot(self, snap: Snapshot) -> None:
        """To the session log, when recording: every snapshot, not only those a slow client received."""
        if self.recorder is not None:
            self.recorder.write_snapshot(snapshot_to_proto(snap))

    def new_agreement(self) -> ShadowAgreement:
        card = self.executor.card
        return ShadowAgreement(card.actions, len(card.controls))

    def open_shadow(self, session_id: str, owner: str = "") -> str:
        """Fresh shadow statistics for a new opening of `session_id`; returns its instance id."""
        shadow = ShadowInstance(session_id, uuid.uuid4().hex, self.new_agreement(), owner=owner)
        self.shadow_open[session_id] = shadow
        self.shadow_instances[shadow.instance] = shadow
        self.shadow_latest[session_id] = shadow.instance
        return shadow.instance

    def close_shadow(self, session_id: str) -> None:
        shadow = self.shadow_open.pop(session_id, None)
        if shadow is None:
            return
        self._shadow_closed.append(shadow.instance)
        while len(self._shadow_closed) > self.KEEP_CLOSED_SHADOW_STATS:
            old = self.shadow_instances.pop(self._shadow_closed.popleft())
            if self.shadow_latest.get(old.session_id) == old.instance:
                del self.shadow_latest[old.session_id]

    def record_agreement(self, snap: Snapshot) -> None:
        shadow = self.shadow_open.get(snap.session_id)
        if shadow is None:  # a session opened on the executor directly, not through Drive
            shadow = self.shadow_instances[self.open_shadow(snap.session_id)]
        cand = snap.candidate
        if cand is not None:
            tally = shadow.candidate
            if tally is None or tally.candidate_version != cand.model_version:
                card = self.executor.card
                tally = shadow.candidate = CandidateTally(cand.model_version, card.actions, len(card.controls))
            tally.update(
                snap.model_version,
                snap.proposed_index,
                snap.proposed_controls,
                snap.applied.index,
                cand.index,
                cand.controls,
                snap.actual_index,
            )
        agreement = shadow.agreement
        if snap.actual_controls is not None and not bool(np.isfinite(snap.actual_controls).all()):
            agreement.unknown_actual_controls += 1
        if snap.actual_index < 0:  # the common live case: nothing to compare, keep the tick cheap
            agreement.without_actual += 1
            return
        agreement.update(
            snap.applied.index,
            snap.applied.controls,
            snap.actual_index,
            snap.actual_controls,
            snap.safety_state.name,
            tuple(r.name for r in snap.reasons),
            snap.proposed_index,
            snap.proposed_controls,
        )

    def forget(self, session_id: str) -> None:
        if self.metrics is not None:  # before they go: what the session had dropped
            self.metrics.on_close(self.executor.sessions.get(session_id), self.outboxes.get(session_id))
        self.executor.close_session(session_id)
        if self.recorder is not None:
            self.recorder.close_session(session_id)
        box = self.outboxes.pop(session_id, None)
        if box is not None:
            box.close()
        self._last_seq.pop(session_id, None)
        self.close_shadow(session_id)
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


class MalformedRequest:
    """What a request that does not parse as its message type arrives as (instead of an exception,
    which grpc.aio would turn into UNKNOWN with a Python class name): handlers answer INVALID_ARGUMENT."""

    __slots__ = ("message",)

    def __init__(self, type_name: str, size: int, error: str) -> None:
        self.message = (
            f"the request ({size} bytes) is not a valid {type_name} message: {error}; build requests with "
            f"code generated from proto/dualloop/v2/controller.proto"
        )


def _lenient(message_type: type[Message]) -> Callable[[bytes], Message | MalformedRequest]:
    """A request deserializer that answers a MalformedRequest instead of raising."""
    name = message_type.DESCRIPTOR.full_name

    def parse(data: bytes) -> Message | MalformedRequest:
        try:
            return message_type.FromString(data)
        except DecodeError as err:
            return MalformedRequest(name, len(data), str(err))

    return parse


# The service name clients generated from proto v1 call. v2 renamed the service, enum values and
# response messages without changing a field number, so v1's messages are v2's on the wire; only
# GetModelInfo's answer differs (v2 wraps ModelInfo in GetModelInfoResponse.model = 1).
V1_SERVICE = "dualloop.v1.Controller"


def _model_info_v1(response: pb.GetModelInfoResponse) -> bytes:
    return response.model.SerializeToString()


def _release_aborted(err: grpc.aio.AbortError) -> None:
    """Let an aborted call's memory go when the call ends, not at the next full garbage collection.

    grpc.aio keeps the abort's exception on the call's state, and its traceback keeps the handler's
    frames, which keep the context (so the call's state: a cycle) and the request. Only the cyclic
    collector frees such a cycle, and garbage that lived through a young collection waits for an old
    one: refused 1 MiB requests piled up to ~600 MB before it came. Clearing the finished frames'
    locals (and the caller deleting its own) leaves the exception nothing that leads back to the call."""
    traceback.clear_frames(err.__traceback__)


def _logged(method: str, handler: Callable) -> Callable:
    """A unary handler whose errors are logged (rpc.error) with the status and message the client gets."""

    async def logged(request: object, context: grpc.aio.ServicerContext) -> object:
        try:
            return await handler(request, context)
        except grpc.aio.AbortError as err:
            code = context.code()
            events.event(
                "rpc.error",
                logging.WARNING,
                method=method,
                peer=context.peer(),
                code=code.name if code is not None else "UNKNOWN",
                message=context.details() or "",
            )
            _release_aborted(err)
            del request, context
            raise

    return logged


def add_controller_service(service: ControllerService, server: grpc.aio.Server) -> None:
    """pb_grpc.add_ControllerServiceServicer_to_server, with request deserializers that never raise,
    and the same handlers under V1_SERVICE for clients built from proto v1."""

    def handlers(model_info: Callable[[pb.GetModelInfoResponse], bytes]) -> dict[str, grpc.RpcMethodHandler]:
        return {
            "Drive": grpc.stream_stream_rpc_method_handler(
                service.Drive, _lenient(pb.DriveRequest), drive_response_bytes
            ),
            "GetModelInfo": grpc.unary_unary_rpc_method_handler(
                _logged("GetModelInfo", service.GetModelInfo), _lenient(pb.GetModelInfoRequest), model_info
            ),
            "GetStats": grpc.unary_unary_rpc_method_handler(
                _logged("GetStats", service.GetStats),
                _lenient(pb.GetStatsRequest),
                pb.GetStatsResponse.SerializeToString,
            ),
            "GetShadowStats": grpc.unary_unary_rpc_method_handler(
                _logged("GetShadowStats", service.GetShadowStats),
                _lenient(pb.GetShadowStatsRequest),
                pb.GetShadowStatsResponse.SerializeToString,
            ),
        }

    admin = {  # v2 only: v1 never had them
        "LoadCandidate": grpc.unary_unary_rpc_method_handler(
            _logged("LoadCandidate", service.LoadCandidate),
            _lenient(pb.LoadCandidateRequest),
            pb.LoadCandidateResponse.SerializeToString,
        ),
        "PromoteCandidate": grpc.unary_unary_rpc_method_handler(
            _logged("PromoteCandidate", service.PromoteCandidate),
            _lenient(pb.PromoteCandidateRequest),
            pb.PromoteCandidateResponse.SerializeToString,
        ),
    }
    name = pb.DESCRIPTOR.services_by_name["ControllerService"].full_name
    for service_name, table in (
        (name, handlers(pb.GetModelInfoResponse.SerializeToString) | admin),
        (V1_SERVICE, handlers(_model_info_v1)),
    ):
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service_name, table),))
        server.add_registered_method_handlers(service_name, table)


async def _refuse_malformed(request: object, context: grpc.aio.ServicerContext) -> None:
    if isinstance(request, MalformedRequest):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)


async def _refuse_too_long(refusal: str | None, context: grpc.aio.ServicerContext) -> None:
    """A client string past its limit (client_strings.py): INVALID_ARGUMENT naming the field."""
    if refusal is not None:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, refusal)


_END, _DRAINED = object(), object()  # _next_request: the stream ended; the server is draining
DRAINING_REFUSAL = (
    "server draining (shutting down): not accepting new sessions; retry on another server, "
    "or on this one once it is back"
)


class ControllerService(pb_grpc.ControllerServiceServicer):
    def __init__(self, runtime: ControllerRuntime) -> None:
        self.runtime = runtime
        self.executor = runtime.executor
        self._planning = runtime.planning
        self._profile_builds = asyncio.Lock()

    @property
    def _info(self) -> pb.ModelInfo:
        """The live model's (a promotion replaces it)."""
        return self.runtime.model_info

    async def GetModelInfo(
        self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetModelInfoResponse:
        await _refuse_malformed(request, context)
        return pb.GetModelInfoResponse(model=self._info)

    async def GetStats(self, request: pb.GetStatsRequest, context: grpc.aio.ServicerContext) -> pb.GetStatsResponse:
        await _refuse_malformed(request, context)
        runtime = self.runtime
        if runtime.board is not None:
            return self._with_candidate(self._workers_stats(request))
        stats = runtime.stats
        lateness = stats.lateness.values().astype(np.float64) / 1e3
        p50, p99, p999, mx = np.percentile(lateness, [50, 99, 99.9, 100]) if lateness.size else (0.0,) * 4
        edges = np.array(LATENESS_BUCKETS_US)
        counts = np.bincount(np.searchsorted(edges, lateness, side="left"), minlength=edges.size + 1)
        reply = pb.GetStatsResponse(
            ticks=stats.ticks,
            missed_deadlines=runtime.ticker.missed - runtime.missed_at_reset,
            lateness_p50_us=p50,
            lateness_p99_us=p99,
            lateness_p999_us=p999,
            lateness_max_us=mx,
            lateness_bucket_upper_us=LATENESS_BUCKETS_US,
            lateness_histogram=counts.tolist(),
            sessions_open=len(self.executor.sessions),
            sessions_opened=stats.sessions_opened,
            snapshots_sent=stats.snapshots_sent,
            scheduling=runtime.scheduling,
            window_s=(_mono_ns() - stats.window_start_ns) / 1e9,
            ticks_total=stats.ticks_total,
            missed_deadlines_total=runtime.ticker.missed,
            uptime_s=(_mono_ns() - stats.started_ns) / 1e9,
            snapshots_sent_total=stats.snapshots_sent_total,
        )
        if runtime.recorder is not None:
            reply.records_dropped_total = runtime.recorder.stats.total_dropped
            reply.recorder_queue_bytes = runtime.recorder.queue_bytes
        if request.reset:
            runtime.reset_stats()
        return self._with_candidate(reply)

    def _with_candidate(self, reply: pb.GetStatsResponse) -> pb.GetStatsResponse:
        """The answering process's candidate, if one is loaded (paused or not)."""
        if self.executor.candidate is not None:
            reply.candidate.CopyFrom(candidate_status(self.executor.candidate, self.executor.config))
        return reply

    def _workers_stats(self, request: pb.GetStatsRequest) -> pb.GetStatsResponse:
        """GetStats for the whole server: every worker's row of the board, this one's just published
        (the others' are at most board.PUBLISH_EVERY ticks old). Lateness percentiles come from the
        merged fine histogram (board.py: within 2%, never below the exact value)."""
        runtime = self.runtime
        board = runtime.board
        assert board is not None
        runtime.publish()
        t = board.totals()
        p50, p99, p999 = board.percentiles_us(t.histogram, [50, 99, 99.9], t.lateness_max_us)
        now = _mono_ns()
        reply = pb.GetStatsResponse(
            ticks=t.ticks,
            missed_deadlines=t.missed,
            lateness_p50_us=p50,
            lateness_p99_us=p99,
            lateness_p999_us=p999,
            lateness_max_us=t.lateness_max_us,
            lateness_bucket_upper_us=LATENESS_BUCKETS_US,
            lateness_histogram=board.coarse(t.histogram),
            sessions_open=t.sessions_open,
            sessions_opened=t.sessions_opened,
            snapshots_sent=t.snapshots_sent,
            scheduling=f"{runtime.scheduling}; {t.workers} worker processes ({t.workers_ready} serving), "
            f"sessions opened per worker in this window: {', '.join(map(str, t.opened_per_worker))}",
            window_s=(now - runtime.stats.window_start_ns) / 1e9,
            ticks_total=t.ticks_total,
            missed_deadlines_total=t.missed_total,
            uptime_s=(now - t.started_ns) / 1e9,
            snapshots_sent_total=t.snapshots_sent_total,
            records_dropped_total=t.records_dropped,
            recorder_queue_bytes=t.recorder_queue_bytes,
        )
        if request.reset:  # every worker resets its window at its next publish; this one now
            runtime._board_epoch = board.request_reset()
            runtime.reset_stats()
            runtime.publish()
        return reply

    async def GetShadowStats(
        self, request: pb.GetShadowStatsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetShadowStatsResponse:
        await _refuse_malformed(request, context)
        await _refuse_too_long(client_strings.shadow_stats_refusal(request), context)
        runtime, keep = self.runtime, ControllerRuntime.KEEP_CLOSED_SHADOW_STATS
        shadow: ShadowInstance | None = None
        if request.session_instance:
            shadow = runtime.shadow_instances.get(request.session_instance)
            if shadow is None:
                await context.abort(
                    grpc.StatusCode.NOT_FOUND,
                    f"no agreement statistics for session_instance {request.session_instance!r}: not an "
                    f"instance of this server, or closed long ago (the last {keep} closed instances are kept)",
                )
            assert shadow is not None  # abort() raised
            if request.session_id and request.session_id != shadow.session_id:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"session_instance {request.session_instance!r} is an instance of session "
                    f"{shadow.session_id!r}, not {request.session_id!r}; send one of them, or both matching",
                )
        elif request.session_id:
            instance = runtime.shadow_latest.get(request.session_id)
            shadow = runtime.shadow_instances.get(instance) if instance is not None else None
            if shadow is None:
                await context.abort(
                    grpc.StatusCode.NOT_FOUND,
                    f"no agreement statistics for session {request.session_id!r}: never opened on this "
                    f"server, or closed long ago (the last {keep} closed instances are kept)",
                )
        else:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "GetShadowStatsRequest needs session_id (its newest opening) or session_instance "
                "(SessionOpened.session_instance)",
            )
        assert shadow is not None  # every branch without one aborted
        await refuse_others_statistics(context, shadow.owner)
        reply = shadow.agreement.to_proto(shadow.session_id, shadow.instance)
        if shadow.candidate is not None:
            reply.candidate.CopyFrom(shadow.candidate.to_proto())
        if request.reset:  # after answering: the counts just returned are not counted again
            shadow.agreement = runtime.new_agreement()
            shadow.candidate = None
        return reply

    async def LoadCandidate(
        self, request: pb.LoadCandidateRequest, context: grpc.aio.ServicerContext
    ) -> pb.LoadCandidateResponse:
        await _refuse_malformed(request, context)
        await require_admin(context)
        await _refuse_too_long(client_strings.load_candidate_refusal(request), context)
        runtime = self.runtime
        try:  # files and warm-up off the loop: the ticks go on meanwhile
            cand = await asyncio.to_thread(load_candidate, self.executor, request.model_path, list(request.gate_paths))
        except CandidateError as err:
            await context.abort(err.code, err.message)
        runtime.set_candidate(cand, request.model_path)
        promoted = False
        if request.promote:
            try:
                runtime.promote("LoadCandidate")
            except SwapRefused as err:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
            promoted = True
        return pb.LoadCandidateResponse(
            candidate_version=cand.version,
            live_version=self.executor.card.version,
            sessions_open=len(self.executor.sessions),
            promoted=promoted,
            worker_pid=os.getpid(),
            candidate=candidate_status(cand, self.executor.config),
        )

    async def PromoteCandidate(
        self, request: pb.PromoteCandidateRequest, context: grpc.aio.ServicerContext
    ) -> pb.PromoteCandidateResponse:
        await _refuse_malformed(request, context)
        await require_admin(context)
        await _refuse_too_long(client_strings.promote_refusal(request), context)
        cand = self.executor.candidate
        if request.expected_version and (cand is None or cand.version != request.expected_version):
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"the loaded candidate is {cand.version if cand is not None else 'none'}, not "
                f"{request.expected_version!r}: nothing promoted",
            )
        try:
            previous, current = self.runtime.promote("PromoteCandidate")
        except SwapRefused as err:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        return pb.PromoteCandidateResponse(
            previous_version=previous,
            model_version=current,
            sessions_kept=len(self.executor.sessions),
            worker_pid=os.getpid(),
        )

    async def Drive(self, request_iterator: AsyncIterator[pb.DriveRequest], context: grpc.aio.ServicerContext) -> None:
        """_drive, logged (session.open/close/refused with the status the client gets) and counted for the drain."""
        runtime = self.runtime
        trace = events.SessionTrace(context.peer())
        runtime.drives_active += 1
        runtime.drives_idle.clear()
        try:
            await self._drive(request_iterator, context, trace)
        except asyncio.CancelledError:
            trace.ended("CANCELLED", "the client cancelled the call, or the server stopped before the stream ended")
            raise
        except grpc.aio.AbortError as err:  # context.abort(): the status is on the context
            code = context.code()
            trace.ended(code.name if code is not None else "UNKNOWN", context.details() or "")
            _release_aborted(err)
            del request_iterator, context
            raise
        except Exception as err:
            trace.ended("UNKNOWN", repr(err))
            raise
        else:
            trace.ended("OK", "")
        finally:
            runtime.drives_active -= 1
            if runtime.drives_active == 0:
                runtime.drives_idle.set()

    async def _drive(
        self,
        request_iterator: AsyncIterator[pb.DriveRequest],
        context: grpc.aio.ServicerContext,
        trace: events.SessionTrace,
    ) -> None:
        requests = request_iterator.__aiter__()
        try:
            first = await asyncio.wait_for(requests.__anext__(), self.runtime.config.open_timeout_s)
        except StopAsyncIteration:
            return
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"no OpenSession within open_timeout_s={self.runtime.config.open_timeout_s} s",
            )
        await _refuse_malformed(first, context)
        if first.WhichOneof("msg") != "open":
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the first message of a Drive stream must be 'open' (OpenSession); got "
                f"{first.WhichOneof('msg') or 'an empty DriveRequest'}",
            )
        req = first.open
        await _refuse_too_long(client_strings.open_session_refusal(req), context)
        await refuse_actuating_for_shadow_only(context, req.shadow)
        if req.clock not in (pb.CLOCK_MODE_REALTIME, pb.CLOCK_MODE_LOCKSTEP):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"OpenSession.clock must be REALTIME (1) or LOCKSTEP (2); got {req.clock}",
            )
        schema_hash = self.executor.card.schema_hash()
        if req.expected_schema_hash and req.expected_schema_hash != schema_hash:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"the client built observations for schema {req.expected_schema_hash}; this server's "
                f"model {self.executor.card.version} has schema {schema_hash}: call GetModelInfo",
            )
        if self.runtime.draining.is_set():
            await context.abort(grpc.StatusCode.UNAVAILABLE, DRAINING_REFUSAL)
        await refuse_shadow_only_past_share(
            context, self.runtime.config.auth, len(self.executor.sessions), self.executor.config.max_sessions
        )
        session_id = req.session_id or uuid.uuid4().hex[:12]
        await self._build_sensor_profile(list(req.provided_features))
        try:
            session = self.executor.open_session(
                session_id,
                Clock(req.clock),
                shadow=req.shadow,
                include_decision_vector=req.include_decision_vector,
                observation_period_ns=req.observation_period_ns,
                provided_features=list(req.provided_features),
                require_plan=req.require_plan,
                # the server's planner plans this session: its plans expiring is a fault
                expired_plan_is_stale=self._planning is not None,
                # the actuation check judges actual.controls only when the client says they are commands
                actual_is_command=req.actual_controls_are_commands,
            )
        except SessionError as err:
            message = str(err)
            code = (
                grpc.StatusCode.ALREADY_EXISTS
                if "already open" in message
                else grpc.StatusCode.INVALID_ARGUMENT
                if "provided_features" in message or "observation_period_ns" in message
                else grpc.StatusCode.RESOURCE_EXHAUSTED
            )
            await context.abort(code, message)
        provided = (
            self.executor.card.feature_names
            if session.present is None
            else [n for n, on in zip(self.executor.card.feature_names, session.present) if on]
        )
        self.runtime.stats.sessions_opened += 1
        if self.runtime.metrics is not None:
            self.runtime.metrics.opened[req.clock] += 1
        instance = self.runtime.open_shadow(session_id, CALLER_ID.get())
        trace.opened(session_id, pb.ClockMode.Name(req.clock).removeprefix("CLOCK_MODE_"), req.shadow, instance)
        self.runtime.open_recording(
            session_id,
            req.clock,
            req.shadow,
            req.observation_period_ns,
            provided,
            req.require_plan,
            req.actual_controls_are_commands,
        )
        try:
            await context.write(
                pb.DriveResponse(
                    opened=pb.SessionOpened(
                        session_id=session_id,
                        clock=req.clock,
                        tick_period_ns=self.executor.period_ns,
                        model=self._info,
                        observation_period_ns=req.observation_period_ns,
                        provided_features=provided,
                        # read now: the running configuration, as this session is judged by it
                        limits=session_limits(self.executor, self.runtime.config),
                        require_plan=req.require_plan,
                        session_instance=instance,
                    )
                )
            )
            if req.clock == pb.CLOCK_MODE_REALTIME:
                error = await self._drive_realtime(session_id, requests, context, trace)
            else:
                error = await self._drive_lockstep(session_id, requests, context, trace)
            if error is not None:
                await context.abort(*error)
        finally:
            trace.ticks, trace.observations_dropped, trace.last_seq = (
                session.ticks,
                session.observations_dropped,
                session.last_seq,
            )
            box = self.runtime.outboxes.get(session_id)
            trace.snapshots_dropped = box.dropped if box is not None else 0
            self.runtime.forget(session_id)

    @staticmethod
    def _observation(msg: pb.DriveRequest) -> pb.Observation | None:
        return msg.observation if msg.WhichOneof("msg") == "observation" else None

    _NOT_AN_OBSERVATION = (
        grpc.StatusCode.INVALID_ARGUMENT,
        "after 'open', a Drive stream carries only observations; a second 'open' or an "
        "empty DriveRequest is not allowed",
    )

    def _drained(self, session_id: str) -> tuple:
        """How a stream ends when the server drains, after its final snapshot."""
        session = self.executor.sessions.get(session_id)
        return (
            grpc.StatusCode.UNAVAILABLE,
            f"server draining (shutting down): session {session_id!r} ended after its final snapshot; the last "
            f"observation received was seq {session.last_seq if session is not None else 0}; open a new session, "
            f"on this server once it is back or on another",
        )

    async def _build_sensor_profile(self, provided_features: list[str]) -> None:
        """A sensor profile not seen before costs ~90 ms to build (its gates' thresholds, from their
        calibration rows): 17 deadlines of every open session if built on the loop. Built on a
        thread, one at a time (numpy releases the GIL for most of it); open_session then finds it
        made. A profile already made only costs the hop to the thread and back."""
        try:
            present = self.executor.sensor_profile(provided_features)
        except SessionError:
            return  # open_session refuses these names, with its message
        if present is None:
            return
        async with self._profile_builds:
            await asyncio.to_thread(self.executor.gating.profile, present)

    async def _drive_realtime(self, session_id: str, requests, context, trace: events.SessionTrace) -> tuple | None:
        box: LatestSlot[Snapshot] = LatestSlot(carry_over)
        self.runtime.outboxes[session_id] = box
        error: list[tuple] = []
        planning = self._planning

        ticker = self.runtime.ticker

        async def read() -> None:
            try:
                async for msg in requests:
                    while ticker.hand_over_due():  # again after the tick: the next one may be due by then
                        await ticker.until_tick()  # the deadline first; this message just after it
                    if isinstance(msg, MalformedRequest):
                        error.append((grpc.StatusCode.INVALID_ARGUMENT, msg.message))
                        return
                    obs_msg = self._observation(msg)
                    if obs_msg is None:
                        error.append(self._NOT_AN_OBSERVATION)
                        return
                    if (refusal := client_strings.observation_refusal(obs_msg)) is not None:
                        error.append((grpc.StatusCode.INVALID_ARGUMENT, refusal))
                        return
                    obs = observation_from_proto(obs_msg, _mono_ns(), time.time_ns())
                    if planning is not None:  # the server's planner conditions this session
                        obs.plan_id, obs.plan_values = "", None
                    try:
                        self.executor.submit(session_id, obs)
                    except InvalidObservation as err:
                        error.append((grpc.StatusCode.INVALID_ARGUMENT, str(err)))
                        return
                    self.runtime.record_observation(session_id, obs_msg)
            finally:
                box.close()  # the client finished (or broke the contract): end the stream

        reader = asyncio.create_task(read())
        stats, draining = self.runtime.stats, self.runtime.draining
        try:
            while (snap := await box.get()) is not None:
                t0 = _perf_ns()
                snap.snapshots_dropped = box.dropped
                proto = snapshot_to_proto(snap)
                if planning is not None:
                    planning.decorate(session_id, pb.CLOCK_MODE_REALTIME, proto)
                msg = snapshot_response(proto)
                stats.stream_ns += _perf_ns() - t0
                await context.write(msg)
                stats.snapshots_sent += 1
                stats.snapshots_sent_total += 1
                trace.snapshots_sent += 1
                if draining.is_set():  # the snapshot just sent was the final one
                    error.append(self._drained(session_id))
                    break
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        return error[0] if error else None

    async def _drive_lockstep(self, session_id: str, requests, context, trace: events.SessionTrace) -> tuple | None:
        drain = asyncio.ensure_future(self.runtime.draining.wait())
        try:
            return await self._lockstep_loop(session_id, requests, context, trace, drain)
        finally:
            drain.cancel()

    async def _next_request(self, requests, drain: asyncio.Future) -> Any:
        """The next request; _END at the end of the stream; _DRAINED once the server drains and no
        request is waiting (a request that arrived is processed first: it has been accepted)."""
        if drain.done():
            return _DRAINED
        read = asyncio.ensure_future(requests.__anext__())
        try:
            await asyncio.wait((read, drain), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not read.done():  # draining (or this handler was cancelled): abandon the read
                read.cancel()
            elif not read.cancelled():
                # mark its outcome seen: when gRPC cancels this handler (a request over the size limit)
                # just as the read ends, asyncio would otherwise log "Task exception was never retrieved"
                read.exception()
        if not read.done() or read.cancelled():
            return _DRAINED
        try:
            return read.result()
        except StopAsyncIteration:
            return _END

    async def _lockstep_loop(
        self, session_id: str, requests, context, trace: events.SessionTrace, drain: asyncio.Future
    ) -> tuple | None:
        stats = self.runtime.stats
        planning = self._planning
        tally = self.runtime.metrics.lockstep.add if self.runtime.metrics is not None else None
        while (msg := await self._next_request(requests, drain)) is not _END:
            if msg is _DRAINED:
                return self._drained(session_id)
            if isinstance(msg, MalformedRequest):
                return grpc.StatusCode.INVALID_ARGUMENT, msg.message
            obs_msg = self._observation(msg)
            if obs_msg is None:
                return self._NOT_AN_OBSERVATION
            if (refusal := client_strings.observation_refusal(obs_msg)) is not None:
                return grpc.StatusCode.INVALID_ARGUMENT, refusal
            obs = observation_from_proto(obs_msg, _mono_ns())
            if planning is not None:
                await planning.plan_lockstep(session_id, obs)
            try:
                snaps = self.executor.advance_lockstep(session_id, obs)
            except InvalidObservation as err:
                return grpc.StatusCode.INVALID_ARGUMENT, str(err)
            self.runtime.record_observation(session_id, obs_msg)
            for snap in snaps:
                self.runtime.record_agreement(snap)
                self.runtime.record_snapshot(snap)
                if tally is not None:
                    tally(snap)
                proto = snapshot_to_proto(snap)
                if planning is not None:
                    planning.decorate(session_id, pb.CLOCK_MODE_LOCKSTEP, proto)
                # Awaiting each write is the backpressure: a LOCKSTEP stream never drops a snapshot.
                await context.write(snapshot_response(proto))
                stats.snapshots_sent += 1
                stats.snapshots_sent_total += 1
                trace.snapshots_sent += 1
        return None


class ControllerServer:
    """Owns the model, executor, gRPC server and tick loop; run it on an asyncio loop."""

    def __init__(
        self,
        config: ServerConfig,
        model: DecisionModel | None = None,
        plan_source: SourceFactory | None = None,
        worker: tuple[wb.Board, int] | None = None,
    ) -> None:
        """plan_source overrides config.planner.source (its period and deadline still apply).
        worker: (board, slot) when this is one of several processes sharing the port (workers.py)."""
        self.config = config
        try:  # tokens are read here, never kept in the configuration (it is recorded in session logs)
            self.auth = Authenticator(config.auth)
        except AuthError as err:
            raise ConfigError(str(err)) from None
        self.model = model or DecisionModel(
            config.model, warmup_batches=tuple(b for b in (1, 2, 4, 8, 16, 32, 64) if b <= config.executor.max_sessions)
        )
        gates = []
        for path in config.gates:
            try:
                gates.append(load_gate_for_model(path, self.model))
            except (OSError, ValueError) as err:
                raise ConfigError(f"gate {path}: {err}") from None
        try:  # on this machine, at the server's batch size: a model over the tick's budget never serves
            check_live(self.model, config.executor)
        except OverBudget as err:
            raise ConfigError(f"--model {self.model.path}: {err}") from None
        self.executor = Executor(self.model, config.executor, gates)
        self.runtime = ControllerRuntime(self.executor, config)
        if config.auth.tokens_file is not None:
            self.runtime.token_store = self.auth.store
        if config.candidate is not None:
            try:
                cand = load_candidate(self.executor, config.candidate, config.candidate_gates)
            except CandidateError as err:
                raise ConfigError(f"--candidate {config.candidate}: {err.message}") from None
            self.runtime.set_candidate(cand, config.candidate)
        if config.planner.enabled or plan_source is not None:
            self.runtime.planning = ServerPlanning(config.planner, self.executor, plan_source)
        if worker is not None:
            self.runtime.board, self.runtime.board_slot = worker
        self.port: int | None = None
        self.scheduling = "not started"
        self._cpu_latency: CpuLatencyRequest | None = None
        self._server: grpc.aio.Server | None = None
        self._ticks: asyncio.Task | None = None
        self.health: Health | None = None
        self.metrics_endpoint: MetricsEndpoint | None = None
        self.metrics_port: int | None = None  # where the metrics are served, once started

    async def start(self) -> int:
        if self.runtime.planning is not None:  # spawns the worker and builds the sources: seconds at most
            await asyncio.to_thread(self.runtime.planning.start)
        self._server = grpc.aio.server(
            options=[
                # several worker processes listen on one port; a single server keeps the port its own
                ("grpc.so_reuseport", 1 if self.runtime.board is not None else 0),
                ("grpc.max_receive_message_length", self.config.max_receive_message_bytes),
            ],
            interceptors=[AuthInterceptor(self.auth)] if self.auth.enabled else None,
        )
        add_controller_service(ControllerService(self.runtime), self._server)
        services = (pb.DESCRIPTOR.services_by_name["ControllerService"].full_name, V1_SERVICE)
        self.health = Health(self._server, services)
        await self.health.not_serving()
        if self.config.reflection_enabled:  # v1 is an alias without descriptors of its own: not listed
            enable_reflection(self._server, services[:1])
        address = host_port(self.config.host, self.config.port)
        tls = self.config.tls
        problem = validity_problem(tls.cert_file) if tls is not None else None
        if problem is not None:  # served anyway: the clock may be what is wrong, and a reload may fix it
            events.event("server.tls_certificate", logging.WARNING, problem=problem)
        self.port = (
            self._server.add_insecure_port(address)
            if tls is None
            else self._server.add_secure_port(address, tls.credentials())
        )
        if self.port == 0:
            raise OSError(f"cannot bind {address}: is the port in use?")
        await self._server.start()
        # After gRPC has started its threads, so that they are placed too (realtime_threads.py).
        self.scheduling = set_realtime_priority(self.config.realtime_priority)
        # to_thread's workers start from this (the loop's) thread: below it, as the others
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(thread_name_prefix="dualloop-worker", initializer=lower_this_thread)
        )
        self._cpu_latency, held = hold_cpu_wake_latency(self.config.cpu_wake_latency_us)
        if held:
            self.scheduling = f"{self.scheduling}; {held}"
        self.runtime.scheduling = self.scheduling
        if self.config.record_dir is not None:
            self.config.record_dir.mkdir(parents=True, exist_ok=True)
            mb = self.config.record_rotate_mb
            self.runtime.recorder = Recorder(
                unique_log_path(self.config.record_dir, suffix=self._worker_suffix),
                rotate_bytes=int(mb * 1e6) if mb else None,
                rotate_seconds=self.config.record_rotate_s,
                plots=self.config.record_plots,
                exclusive=True,  # servers sharing a record dir: never overwrite another's log
            )
        if self.runtime.metrics is not None and self.config.metrics_port is not None:
            collector = MetricsCollector(self.runtime.metrics_reading, asyncio.get_running_loop())
            self.metrics_endpoint = MetricsEndpoint(collector)
            self.metrics_port = self.metrics_endpoint.start(self.config.metrics_host, self.config.metrics_port)
        self._ticks = asyncio.create_task(self.runtime.run_ticks())
        # SERVING only once a forward pass has run (an onnxruntime session's first calls are slow); on
        # a thread, so that health answers NOT_SERVING meanwhile
        await asyncio.to_thread(self._warm)
        await self.health.serving()
        if self.runtime.board is not None:
            self.runtime.board_fields = {wb.READY: 1, wb.METRICS_PORT: self.metrics_port or 0}
            self.runtime.publish()
        return self.port

    @property
    def _worker_suffix(self) -> str:
        """Each worker records to files of its own."""
        return f"-w{self.runtime.board_slot}" if self.runtime.board is not None else ""

    def log_start(self) -> None:
        """The server.start event (the CLI logs it after its own start line, which scripts read first)."""
        card = self.executor.card
        assert self.port is not None
        events.event(
            "server.start",
            address=host_port(self.config.host, self.port),
            model=card.name,
            model_version=card.version,
            schema_hash=card.schema_hash(),
            gates=[str(g) for g in self.config.gates],
            tick_period_ms=self.config.executor.tick_period_ms,
            scheduling=self.scheduling,
            reflection=self.config.reflection_enabled,
            record_dir=str(self.config.record_dir) if self.config.record_dir is not None else None,
            gc_frozen_objects=gc.get_freeze_count(),  # freeze_startup_heap's work, when this process did it
        )

    def _warm(self) -> None:
        # the model's whole input: wire features, then the history features it derives (if any)
        self.model.forward(np.zeros((1, self.model.n_inputs), np.float32), np.zeros((1, self.model.n_plan), np.float32))
        # numpy's first percentile imports numpy.ma (8-16 ms here): not on the loop at the first
        # GetStats, where it cost a missed deadline (found by bench/stall_trace.py)
        percentiles_us(np.arange(2, dtype=np.int64))

    async def drain(self, grace_s: float | None = None) -> None:
        """Health NOT_SERVING, refuse new sessions (UNAVAILABLE), end the open ones after a final
        snapshot (UNAVAILABLE "server draining"), and wait up to grace_s (config.drain_grace_s) for them."""
        runtime = self.runtime
        if runtime.draining.is_set():
            return
        grace = self.config.drain_grace_s if grace_s is None else grace_s
        runtime.draining.set()
        if runtime.board is not None:
            runtime.board_fields[wb.DRAINING] = 1
            runtime.publish()
        events.event("server.drain", sessions_open=len(self.executor.sessions), grace_s=grace)
        if self.health is not None:
            await self.health.draining()
        try:
            await asyncio.wait_for(runtime.drives_idle.wait(), grace)
        except TimeoutError:
            events.event("server.drain_timeout", logging.WARNING, streams_left=runtime.drives_active, grace_s=grace)

    async def stop(self, grace_s: float | None = None) -> None:
        """Drain (grace_s: default config.drain_grace_s), then stop gRPC, the ticks, the planner and the recorder."""
        await self.drain(grace_s)
        self.runtime.stop()
        if self._server is not None:
            # the drained streams' statuses are on their way; what is still open (a stream stuck
            # past the grace, health Watch streams) is cancelled after this
            await self._server.stop(0.5)
        if self._ticks is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticks
        if self.runtime.planning is not None:
            await asyncio.to_thread(self.runtime.planning.stop)
        recording: dict[str, int] = {}
        if self.runtime.recorder is not None:
            self.recording_stats = await asyncio.to_thread(self.runtime.recorder.close)
            recording = {"recorder_dropped": self.recording_stats.total_dropped}
        stats = self.runtime.stats
        self.runtime.publish()  # the final totals, for the parent's exit line
        events.event(
            "server.stop",
            uptime_s=round((_mono_ns() - stats.started_ns) / 1e9, 3),
            ticks_total=stats.ticks_total,
            missed_deadlines_total=self.runtime.ticker.missed,
            snapshots_sent_total=stats.snapshots_sent_total,
            **recording,
        )
        if self._cpu_latency is not None:
            self._cpu_latency.close()
        if self.metrics_endpoint is not None:  # last: a scrape during the stop still gets its answer
            await asyncio.to_thread(self.metrics_endpoint.stop)

    async def wait(self) -> None:
        assert self._server is not None
        await self._server.wait_for_termination()


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux and macOS
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class ServerThread:
    """A real server on its own loop in a background thread: for tests, demos and benchmarks."""

    def __init__(
        self, config: ServerConfig, model: DecisionModel | None = None, plan_source: SourceFactory | None = None
    ) -> None:
        self.server = ControllerServer(config, model, plan_source)
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self._run, name="dualloop-server", daemon=True)
        self._started = threading.Event()
        self._error: BaseException | None = None

    @property
    def port(self) -> int:
        assert self.server.port is not None
        return self.server.port

    @property
    def address(self) -> str:
        """Where a client on this machine reaches the server (the bind host; localhost: 127.0.0.1)."""
        host = self.server.config.host
        return host_port("127.0.0.1" if host.strip().lower() in ("localhost", "localhost.") else host, self.port)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self.server.start())
        except BaseException as err:  # noqa: BLE001 - reported to the starting thread
            self._error = err
            self._started.set()
            return
        self._started.set()
        self.loop.run_forever()

    def start(self) -> ServerThread:
        self._thread.start()
        self._started.wait(30)
        if self._error is not None:
            raise self._error
        return self

    def call(self, fn, *args):
        """Run fn(*args) on the server loop and return its result (for inspecting state in tests)."""
        return asyncio.run_coroutine_threadsafe(_call(fn, *args), self.loop).result(10)

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(self.server.config.drain_grace_s + 10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


async def _call(fn, *args):
    return fn(*args)
