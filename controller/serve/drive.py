"""One Drive stream, step by step (DriveCall): read the OpenSession, refuse what cannot be served,
open the session on the executor, announce it (SessionOpened), then stream REALTIME (conflated) or
LOCKSTEP (lossless, paced by the client) until the client ends, breaks the contract or the server drains."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc

from dualloop.controller.contract.wire import observation_from_proto, snapshot_response, snapshot_to_proto
from dualloop.controller.serve import client_strings, events
from dualloop.controller.serve.conflation import LatestSlot, carry_over
from dualloop.controller.serve.limits import session_limits
from dualloop.controller.serve.runtime import SessionRuntime
from dualloop.controller.serve.security import (
    CALLER_ID,
    refuse_actuating_for_shadow_only,
    refuse_shadow_only_past_share,
)
from dualloop.controller.serve.status import MalformedRequest, refuse_malformed, refuse_too_long, status_of
from dualloop.executor.sessions import InvalidObservation, Session, SessionError
from dualloop.executor.snapshot import Clock, Snapshot
from dualloop.v2 import controller_pb2 as pb

_mono_ns = time.monotonic_ns
_perf_ns = time.perf_counter_ns

# _next_request: the stream ended; the server is draining; no request within the time given
_END, _DRAINED, _TIMED_OUT = object(), object(), object()
DRAINING_REFUSAL = (
    "server draining (shutting down): not accepting new sessions; retry on another server, "
    "or on this one once it is back"
)


async def confirm_half_close(context: grpc.aio.ServicerContext) -> None:
    """Call once the requests have ended: returns if the client half-closed; if the call was cancelled
    (by the client, or by gRPC refusing a request past max_receive_message_bytes), the handler's
    CancelledError is raised here instead.

    gRPC's asyncio server ends the request iterator alike for both (a cancelled call's read reads as
    the end), and cancels the handler from a separate completion of the call, which may come after
    the handler saw the end and before it returned: such a stream was logged OK. context.cancelled()
    and done() are False in both cases. One more read completes on the call's completion queue after
    the cancellation already queued there, so the cancel lands during it; after a half-close it
    returns the end at once."""
    with contextlib.suppress(grpc.aio.BaseError):  # the call or the server has finished: nothing to wait for
        await context.read()


def cancelled_ending(max_receive_message_bytes: int) -> tuple[grpc.StatusCode, str]:
    """How a stream cancelled before it ended is logged and closed (Drive, DriveAgents): gRPC does not
    tell the handler which of the three causes it was."""
    return grpc.StatusCode.CANCELLED, (
        "the client cancelled the call, gRPC refused a request past max_receive_message_bytes "
        f"({max_receive_message_bytes} bytes; the client got RESOURCE_EXHAUSTED), or the server stopped "
        "before the stream ended"
    )


class DriveCall:
    """One Drive stream from its OpenSession to its end; run() takes the steps in order."""

    def __init__(
        self,
        runtime: SessionRuntime,
        profile_builds: asyncio.Lock,
        context: grpc.aio.ServicerContext,
        trace: events.SessionTrace,
    ) -> None:
        """profile_builds: held while a sensor profile is built, shared by every call (one at a time)."""
        self.runtime = runtime
        self.executor = runtime.executor
        self.planning = runtime.planning
        self.context = context
        self.trace = trace
        self._profile_builds = profile_builds

    async def run(self, request_iterator: AsyncIterator[pb.DriveRequest]) -> None:
        requests = request_iterator.__aiter__()
        req = await self._read_open(requests)
        if req is None:
            # gRPC ends the requests alike when the client closes the stream first and when it refuses
            # a message past max_receive_message_bytes (the client gets RESOURCE_EXHAUSTED): say both
            self.trace.ending = (
                "the stream ended before its OpenSession: the client closed it, or gRPC refused a message "
                f"past max_receive_message_bytes ({self.runtime.config.max_receive_message_bytes} bytes) and "
                "the client got RESOURCE_EXHAUSTED"
            )
            return
        await self._refuse_unservable(req)
        session_id = req.session_id or uuid.uuid4().hex[:12]
        session = await self._open_session(session_id, req)
        provided, instance = self._register(session_id, session, req)
        try:
            await self._write_opened(session_id, req, provided, instance)
            if req.clock == pb.CLOCK_MODE_REALTIME:
                error = await self._stream_realtime(session_id, requests)
            else:
                error = await self._stream_lockstep(session_id, requests)
            if error is not None:
                await self.context.abort(*error)
        finally:
            self._close(session_id, session)

    async def _read_open(self, requests: AsyncIterator[pb.DriveRequest]) -> pb.OpenSession | None:
        """The stream's first message, which must be an OpenSession; None: the stream ended first."""
        context, timeout_s = self.context, self.runtime.config.open_timeout_s
        try:
            first = await asyncio.wait_for(requests.__anext__(), timeout_s)
        except StopAsyncIteration:
            return None
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED, f"no OpenSession within open_timeout_s={timeout_s} s"
            )
        await refuse_malformed(first, context)
        if first.WhichOneof("msg") != "open":
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the first message of a Drive stream must be 'open' (OpenSession); got "
                f"{first.WhichOneof('msg') or 'an empty DriveRequest'}",
            )
        return first.open

    async def _refuse_unservable(self, req: pb.OpenSession) -> None:
        """Abort a session this server will not open: strings past their limits, a caller's scope, a clock
        or schema it cannot serve, a draining server, shadow-only callers past their share."""
        context = self.context
        await refuse_too_long(client_strings.open_session_refusal(req), context)
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

    async def _open_session(self, session_id: str, req: pb.OpenSession) -> Session:
        """The session on the executor; a refusal aborts with the status of its error class."""
        await self._build_sensor_profile(list(req.provided_features))
        claims = self.runtime.claims
        try:
            # another worker's: this process's own open id is the executor's to refuse, in its words
            if claims is not None and session_id not in self.executor.sessions:
                claims.claim(session_id)
            return self.executor.open_session(
                session_id,
                Clock(req.clock),
                shadow=req.shadow,
                include_decision_vector=req.include_decision_vector,
                observation_period_ns=req.observation_period_ns,
                provided_features=list(req.provided_features),
                require_plan=req.require_plan,
                # the server's planner plans this session: its plans expiring is a fault
                expired_plan_is_stale=self.planning is not None,
                # the actuation check judges actual.controls only when the client says they are commands
                actual_is_command=req.actual_controls_are_commands,
            )
        except SessionError as err:
            if claims is not None and session_id not in self.executor.sessions:
                claims.release(session_id)
            await self.context.abort(status_of(err), str(err))
            raise  # not reached: abort() raises

    def _register(self, session_id: str, session: Session, req: pb.OpenSession) -> tuple[list[str], str]:
        """Count the opened session, give it shadow statistics and a recording; returns the features
        it provides and its instance id (SessionOpened's)."""
        runtime = self.runtime
        names = self.executor.card.feature_names
        provided = names if session.present is None else [n for n, on in zip(names, session.present) if on]
        runtime.stats.sessions_opened += 1
        if runtime.metrics is not None:
            runtime.metrics.opened[req.clock] += 1
        instance = runtime.shadows.open(session_id, CALLER_ID.get())
        clock_name = pb.ClockMode.Name(req.clock).removeprefix("CLOCK_MODE_")
        self.trace.opened(session_id, clock_name, req.shadow, instance)
        runtime.open_recording(
            session_id,
            req.clock,
            req.shadow,
            req.observation_period_ns,
            provided,
            req.require_plan,
            req.actual_controls_are_commands,
        )
        return provided, instance

    async def _write_opened(self, session_id: str, req: pb.OpenSession, provided: list[str], instance: str) -> None:
        await self.context.write(
            pb.DriveResponse(
                opened=pb.SessionOpened(
                    session_id=session_id,
                    clock=req.clock,
                    tick_period_ns=self.executor.period_ns,
                    model=self.runtime.model_info,
                    observation_period_ns=req.observation_period_ns,
                    provided_features=provided,
                    # read now: the running configuration, as this session is judged by it
                    limits=session_limits(self.executor, self.runtime.config),
                    require_plan=req.require_plan,
                    session_instance=instance,
                )
            )
        )

    def _close(self, session_id: str, session: Session) -> None:
        """What the session.close event reports, then the session forgotten everywhere."""
        if session.clock is Clock.LOCKSTEP and session.pending is not None:
            # its last observation, off the tick grid: no tick reached its time before the stream ended,
            # so it was never decided (docs/contract.md#realtime-and-lockstep); said, not silently lost
            session.observations_dropped += 1
        trace = self.trace
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

    async def _stream_realtime(self, session_id: str, requests: AsyncIterator[pb.DriveRequest]) -> tuple | None:
        """Conflated both ways: the reader submits the newest observation, the writer sends the newest snapshot."""
        context, trace = self.context, self.trace
        box: LatestSlot[Snapshot] = LatestSlot(carry_over)
        self.runtime.outboxes[session_id] = box
        error: list[tuple] = []
        planning = self.planning

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
                        error.append((status_of(err), str(err)))
                        return
                    self.runtime.record_observation(session_id, obs_msg)
                await self._last_observation_decided(session_id)  # the client half-closed
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

    async def _stream_lockstep(self, session_id: str, requests: AsyncIterator[pb.DriveRequest]) -> tuple | None:
        """Lossless, paced by the client, until the stream ends or the server drains."""
        drain = asyncio.ensure_future(self.runtime.draining.wait())
        try:
            return await self._lockstep_loop(session_id, requests, drain)
        finally:
            drain.cancel()

    async def _last_observation_decided(self, session_id: str) -> None:
        """Returns once the tick loop has decided the session's last observation (its snapshot is then
        in the session's outbox, put in the same step), so that a REALTIME client that half-closes
        right after sending gets that decision before OK; a tick or two, never more than a second."""
        session = self.executor.sessions.get(session_id)
        period_s = self.executor.period_ns / 1e9
        give_up = time.monotonic() + 1.0
        while session is not None and session.pending is not None and time.monotonic() < give_up:
            if self.runtime.draining.is_set():  # the drain sends the final snapshot itself
                return
            await asyncio.sleep(period_s / 2)

    async def _next_request(self, requests, drain: asyncio.Future, timeout_s: float | None = None) -> Any:
        """The next request; _END at the end of the stream; _DRAINED once the server drains and no
        request is waiting (a request that arrived is processed first: it has been accepted);
        _TIMED_OUT when none came within `timeout_s` (None: no limit)."""
        if drain.done():
            return _DRAINED
        read = asyncio.ensure_future(requests.__anext__())
        timed_out = False
        try:
            await asyncio.wait((read, drain), timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
            timed_out = not read.done() and not drain.done()
        finally:
            if not read.done():  # draining (or this handler was cancelled): abandon the read
                read.cancel()
            elif not read.cancelled():
                # mark its outcome seen: when gRPC cancels this handler (a request over the size limit)
                # just as the read ends, asyncio would otherwise log "Task exception was never retrieved"
                read.exception()
        if timed_out:
            return _TIMED_OUT
        if not read.done() or read.cancelled():
            return _DRAINED
        try:
            return read.result()
        except StopAsyncIteration:
            return _END

    async def _lockstep_loop(
        self, session_id: str, requests: AsyncIterator[pb.DriveRequest], drain: asyncio.Future
    ) -> tuple | None:
        context, trace = self.context, self.trace
        stats = self.runtime.stats
        planning = self.planning
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
                return status_of(err), str(err)
            self.runtime.record_observation(session_id, obs_msg)
            for snap in snaps:
                self.runtime.shadows.record(snap)
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
