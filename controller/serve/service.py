"""The handlers of the ControllerService RPCs (RpcHandlers) and their registration under the v2
service and its v1 alias. Named for what they are (the RPC handlers), apart from the state they
share (runtime.SessionRuntime) and the proto's service name; a Drive stream's steps are drive.py's."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable

import grpc
import numpy as np

from dualloop.controller.contract.wire import (
    drive_response_bytes,
)
from dualloop.controller.serve import client_strings, events
from dualloop.controller.serve.agents import DriveAgentsCall
from dualloop.controller.serve.candidate import CandidateError, candidate_status, load_candidate
from dualloop.controller.serve.drive import DriveCall, cancelled_ending, confirm_half_close
from dualloop.controller.serve.runtime import LATENESS_BUCKETS_US, SessionRuntime
from dualloop.controller.serve.security import (
    refuse_others_statistics,
    require_admin,
)
from dualloop.controller.serve.shadow_registry import ShadowInstance
from dualloop.controller.serve.status import (
    lenient,
    logged,
    refuse_malformed,
    refuse_too_long,
    release_aborted,
    status_of,
)
from dualloop.executor.candidate import SwapRefused
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc

_mono_ns = time.monotonic_ns


# GetModelInfo's answer differs (v2 wraps ModelInfo in GetModelInfoResponse.model = 1).
V1_SERVICE = "dualloop.v1.Controller"


def _model_info_v1(response: pb.GetModelInfoResponse) -> bytes:
    return response.model.SerializeToString()


def add_rpc_handlers(service: RpcHandlers, server: grpc.aio.Server) -> None:
    """pb_grpc.add_ControllerServiceServicer_to_server, with request deserializers that never raise,
    and the same handlers under V1_SERVICE for clients built from proto v1."""

    def handlers(model_info: Callable[[pb.GetModelInfoResponse], bytes]) -> dict[str, grpc.RpcMethodHandler]:
        return {
            "Drive": grpc.stream_stream_rpc_method_handler(
                service.Drive, lenient(pb.DriveRequest), drive_response_bytes
            ),
            "GetModelInfo": grpc.unary_unary_rpc_method_handler(
                logged("GetModelInfo", service.GetModelInfo), lenient(pb.GetModelInfoRequest), model_info
            ),
            "GetStats": grpc.unary_unary_rpc_method_handler(
                logged("GetStats", service.GetStats),
                lenient(pb.GetStatsRequest),
                pb.GetStatsResponse.SerializeToString,
            ),
            "GetShadowStats": grpc.unary_unary_rpc_method_handler(
                logged("GetShadowStats", service.GetShadowStats),
                lenient(pb.GetShadowStatsRequest),
                pb.GetShadowStatsResponse.SerializeToString,
            ),
        }

    v2_only = {  # v1 never had them
        "DriveAgents": grpc.stream_stream_rpc_method_handler(
            service.DriveAgents, lenient(pb.DriveAgentsRequest), drive_response_bytes
        ),
        "LoadCandidate": grpc.unary_unary_rpc_method_handler(
            logged("LoadCandidate", service.LoadCandidate),
            lenient(pb.LoadCandidateRequest),
            pb.LoadCandidateResponse.SerializeToString,
        ),
        "PromoteCandidate": grpc.unary_unary_rpc_method_handler(
            logged("PromoteCandidate", service.PromoteCandidate),
            lenient(pb.PromoteCandidateRequest),
            pb.PromoteCandidateResponse.SerializeToString,
        ),
    }
    name = pb.DESCRIPTOR.services_by_name["ControllerService"].full_name
    for service_name, table in (
        (name, handlers(pb.GetModelInfoResponse.SerializeToString) | v2_only),
        (V1_SERVICE, handlers(_model_info_v1)),
    ):
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service_name, table),))
        server.add_registered_method_handlers(service_name, table)


class RpcHandlers(pb_grpc.ControllerServiceServicer):
    """The seven RPCs of ControllerService; each reads or changes the SessionRuntime, on the loop."""

    def __init__(self, runtime: SessionRuntime) -> None:
        self.runtime = runtime
        self.executor = runtime.executor
        self._profile_builds = asyncio.Lock()  # one sensor profile built at a time, across Drive calls

    @property
    def _info(self) -> pb.ModelInfo:
        """The live model's (a promotion replaces it)."""
        return self.runtime.model_info

    async def GetModelInfo(
        self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetModelInfoResponse:
        await refuse_malformed(request, context)
        return pb.GetModelInfoResponse(model=self._info)

    async def GetStats(self, request: pb.GetStatsRequest, context: grpc.aio.ServicerContext) -> pb.GetStatsResponse:
        await refuse_malformed(request, context)
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
        merged fine histogram (board.py: within 2%, never below the exact value). The window is the
        board's, shared by every worker: it starts at the server's start or the last reset, whichever
        worker answers, and a restarted worker's predecessor's window counts stay in it."""
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
            window_s=(now - t.window_start_ns) / 1e9,
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
        await refuse_malformed(request, context)
        await refuse_too_long(client_strings.shadow_stats_refusal(request), context)
        shadows = self.runtime.shadows
        keep = shadows.KEEP_CLOSED
        shadow: ShadowInstance | None = None
        if request.session_instance:
            shadow = shadows.instances.get(request.session_instance)
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
            instance = shadows.latest.get(request.session_id)
            shadow = shadows.instances.get(instance) if instance is not None else None
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
            shadow.agreement = shadows.new_agreement()
            shadow.candidate = None
        return reply

    async def LoadCandidate(
        self, request: pb.LoadCandidateRequest, context: grpc.aio.ServicerContext
    ) -> pb.LoadCandidateResponse:
        await refuse_malformed(request, context)
        await require_admin(context)
        await refuse_too_long(client_strings.load_candidate_refusal(request), context)
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
                await context.abort(status_of(err), str(err))
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
        await refuse_malformed(request, context)
        await require_admin(context)
        await refuse_too_long(client_strings.promote_refusal(request), context)
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
            await context.abort(status_of(err), str(err))
        return pb.PromoteCandidateResponse(
            previous_version=previous,
            model_version=current,
            sessions_kept=len(self.executor.sessions),
            worker_pid=os.getpid(),
        )

    async def Drive(self, request_iterator: AsyncIterator[pb.DriveRequest], context: grpc.aio.ServicerContext) -> None:
        """A DriveCall, logged (session.open/close/refused with the status the client gets) and counted
        for the drain."""
        runtime = self.runtime
        trace = events.SessionTrace(context.peer())
        runtime.drives_active += 1
        runtime.drives_idle.clear()
        try:
            await DriveCall(runtime, self._profile_builds, context, trace).run(request_iterator)
            await confirm_half_close(context)  # a cancel that ended the requests lands here: not logged OK
        except asyncio.CancelledError:
            status, message = cancelled_ending(runtime.config.max_receive_message_bytes)
            trace.ended(status.name, message)
            raise
        except grpc.aio.AbortError as err:  # context.abort(): the status is on the context
            code = context.code()
            trace.ended(code.name if code is not None else "UNKNOWN", context.details() or "")
            release_aborted(err)
            del request_iterator, context
            raise
        except Exception as err:
            trace.ended("UNKNOWN", repr(err))
            raise
        else:
            trace.ended("OK", trace.ending)
        finally:
            runtime.drives_active -= 1
            if runtime.drives_active == 0:
                runtime.drives_idle.set()

    async def DriveAgents(
        self, request_iterator: AsyncIterator[pb.DriveAgentsRequest], context: grpc.aio.ServicerContext
    ) -> None:
        """A DriveAgentsCall (each agent logs its own session events), counted for the drain."""
        runtime = self.runtime
        runtime.drives_active += 1
        runtime.drives_idle.clear()
        try:
            await DriveAgentsCall(runtime, self._profile_builds, context).run(request_iterator)
        except grpc.aio.AbortError as err:
            release_aborted(err)
            del request_iterator, context
            raise
        finally:
            runtime.drives_active -= 1
            if runtime.drives_active == 0:
                runtime.drives_idle.set()
