"""One DriveAgents stream (DriveAgentsCall): a group of agents, each a session of its own, driven by
one message per tick each way. Every agent is opened, checked, recorded and closed by the same steps
as a Drive stream's session (drive.DriveCall's, with a context whose abort refuses that agent only),
so its decisions, recording and log events are a Drive session's; what differs is the transport:
one request holds every agent's observation, one response every agent's snapshot of a tick."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import cast

import grpc

from dualloop.controller.contract.columns import ColumnsError
from dualloop.controller.contract.observation_columns import observation_message, observations_from_columns
from dualloop.controller.contract.snapshot_columns import snapshot_columns
from dualloop.controller.contract.wire import observation_from_proto, snapshot_to_proto
from dualloop.controller.serve import client_strings, events
from dualloop.controller.serve.agents_outbox import AgentsOutbox, agents_columns_bytes, agents_response_bytes
from dualloop.controller.serve.drive import _DRAINED, _END, _TIMED_OUT, DriveCall, cancelled_ending, confirm_half_close
from dualloop.controller.serve.limits import session_limits
from dualloop.controller.serve.runtime import SessionRuntime
from dualloop.controller.serve.status import MalformedRequest, status_of
from dualloop.executor.sessions import InvalidObservation, Session
from dualloop.executor.snapshot import Observation, Snapshot
from dualloop.v2 import controller_pb2 as pb

_mono_ns = time.monotonic_ns
_FLUSH_S = 1.0  # at the stream's end, how long the writer may take to send what is waiting
# REALTIME: a group's request is applied, and its tick's snapshots converted, in pieces of this many
# agents with the tick first whenever its deadline comes (at ~10-20 us per agent, a piece is well
# under the ticker's guard)
_YIELD_EVERY = 16
# ... and its snapshots as columns (~3 us per agent) in pieces of this many
_COLUMNS_PIECE = 128
_PLANNER_REFUSAL = (
    "DriveAgents does not run with the server's planner (serve --planner): open each agent as a Drive "
    "session, or run the server without its planner and send each agent's plan in its observations"
)


class AgentRefused(Exception):
    """One agent refused or ended: answered in its AgentError, the stream goes on."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


class _AgentContext:
    """What DriveCall's checks use of a call's context, for one agent: abort() refuses the agent only."""

    def __init__(self, peer: str) -> None:
        self._peer = peer

    def peer(self) -> str:
        return self._peer

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise AgentRefused(code, details)


@dataclass
class _Agent:
    call: DriveCall
    session: Session


def _refusal(obs: pb.Observation | Observation) -> str | None:
    """A string of the observation past its limit (its plan id)."""
    if isinstance(obs, pb.Observation):
        return client_strings.observation_refusal(obs)
    refusal = client_strings.too_long("ObservationColumns.plan_id", obs.plan_id, client_strings.MAX_ID_BYTES)
    return None if refusal is None else f"observation seq {obs.seq}: {refusal}"


def _named(session_id: str) -> str:
    """An agent's id for a message: never a string past the client-string limit."""
    n = len(session_id.encode())
    return repr(session_id) if n <= client_strings.MAX_ID_BYTES else f"(an id of {n} bytes)"


class DriveAgentsCall:
    """One DriveAgents stream from its first request to its end; run() takes the steps in order."""

    def __init__(
        self, runtime: SessionRuntime, profile_builds: asyncio.Lock, context: grpc.aio.ServicerContext
    ) -> None:
        self.runtime = runtime
        self.executor = runtime.executor
        self.context = context
        self._profile_builds = profile_builds
        # the stream's own steps (reading with the drain in view); its trace logs nothing (no session)
        self._stream = DriveCall(runtime, profile_builds, context, events.SessionTrace(context.peer()))
        self.agents: dict[str, _Agent] = {}
        self.clock: int | None = None  # the first agent's; every agent's after it
        self.outbox: AgentsOutbox | None = None  # REALTIME only
        self.notices = pb.DriveAgentsResponse()  # LOCKSTEP (and before the clock is known)
        self._writer: asyncio.Task | None = None
        self.columns: bool | None = None  # answered as SnapshotColumns: the first request's choice

    async def run(self, requests: AsyncIterator[pb.DriveAgentsRequest]) -> None:
        context, runtime = self.context, self.runtime
        if runtime.planning is not None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, _PLANNER_REFUSAL)
        await context.write(
            pb.DriveAgentsResponse(
                model=runtime.model_info,
                limits=session_limits(self.executor, runtime.config),
                tick_period_ns=self.executor.period_ns,
            )
        )
        drain = asyncio.ensure_future(runtime.draining.wait())
        error: tuple | None = cancelled_ending(runtime.config.max_receive_message_bytes)
        try:
            ending = await self._loop(requests.__aiter__(), drain)
            if ending is None:
                await confirm_half_close(context)  # a cancel that ended the requests lands here: not OK
            error = ending
        finally:
            drain.cancel()
            await self._stop_writer()
            code, message = (error[0].name, error[1]) if error is not None else ("OK", "the stream ended")
            for session_id in list(self.agents):  # each agent's session.close says how its stream ended
                self._remove(session_id, code, message)
        if error is not None:
            await context.abort(*error)

    async def _loop(self, requests: AsyncIterator, drain: asyncio.Future) -> tuple | None:
        ticker = self.runtime.ticker
        open_timeout_s = self.runtime.config.open_timeout_s  # for the first request, as Drive's OpenSession
        first = True
        while (msg := await self._stream._next_request(requests, drain, open_timeout_s if first else None)) is not _END:
            first = False
            if msg is _TIMED_OUT:
                return (
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"no DriveAgentsRequest within open_timeout_s={open_timeout_s} s of the stream's start",
                )
            if msg is _DRAINED:
                return (
                    grpc.StatusCode.UNAVAILABLE,
                    f"server draining (shutting down): the stream of {len(self.agents)} agents ended; open a "
                    f"new stream, on this server once it is back or on another",
                )
            if isinstance(msg, MalformedRequest):
                return grpc.StatusCode.INVALID_ARGUMENT, msg.message
            # the first request chooses; a later one need not repeat it (an unset bool reads False), so
            # only asking for columns on a stream that chose a message per snapshot is a contradiction
            if self.columns is None:
                self.columns = msg.snapshot_columns
            elif msg.snapshot_columns and not self.columns:
                return (
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "DriveAgentsRequest.snapshot_columns is set after the stream's first request chose a message "
                    "per snapshot: a stream keeps the layout its first request chose; open another stream for "
                    "columns",
                )
            if self.clock == pb.CLOCK_MODE_REALTIME:
                while ticker.hand_over_due():  # the deadline first; this request just after it
                    await ticker.until_tick()
            try:
                snaps = await self._apply(msg)
            except ColumnsError as err:
                return grpc.StatusCode.INVALID_ARGUMENT, f"DriveAgentsRequest.observation_columns: {err}"
            if self.outbox is not None:  # its notices ride on the next tick's response
                if self._writer is None:
                    self._writer = asyncio.create_task(self._write_realtime(self.outbox))
            else:
                await self._write_lockstep(snaps)
        return None

    async def _apply(self, msg: pb.DriveAgentsRequest) -> list[Snapshot]:
        """Joins, then observations, then leaves; LOCKSTEP: the snapshots the observations made."""
        for i, req in enumerate(msg.join):
            await self._join(i, req)
        snaps: list[Snapshot] = []
        seen: set[str] = set()
        ticker = self.runtime.ticker
        realtime = self.clock == pb.CLOCK_MODE_REALTIME
        observed: list[tuple[str, pb.Observation | Observation]] = [
            (item.session_id, item.observation) for item in msg.observations
        ]
        if msg.HasField("observation_columns"):
            wall = time.time_ns() if realtime else 0
            observed += observations_from_columns(msg.observation_columns, _mono_ns(), wall)
        for i, (session_id, obs) in enumerate(observed):
            if i % _YIELD_EVERY == _YIELD_EVERY - 1 and realtime:
                while ticker.hand_over_due():  # a large group's request must not run past a deadline
                    await ticker.until_tick()
            snaps += self._observe(session_id, seen, obs)
        if not realtime:  # recorded before a leave closes its agent: a log's snapshots precede its summary
            self._record_lockstep(snaps)
        for session_id in msg.leave:
            if session_id in self.agents:
                self._remove(session_id, "OK", "left")
                self._notices().left.append(session_id)
            else:
                self._error(
                    session_id, grpc.StatusCode.NOT_FOUND, f"leave: no agent {_named(session_id)} in this stream"
                )
        return snaps

    def _notices(self) -> pb.DriveAgentsResponse:
        return self.outbox.notices if self.outbox is not None else self.notices

    def _error(self, session_id: str, code: grpc.StatusCode, message: str) -> None:
        named = len(session_id.encode()) <= client_strings.MAX_ID_BYTES
        self._notices().errors.add(session_id=session_id if named else "", code=code.value[0], message=message)

    async def _join(self, index: int, req: pb.OpenSession) -> None:
        """Join `req`, the request's join[index], or answer its AgentError (naming the join: an id past
        its limit is not echoed). A join of an agent already in the stream leaves that agent as it is."""
        session_id = req.session_id or uuid.uuid4().hex[:12]
        if session_id in self.agents:
            self._error(
                session_id,
                grpc.StatusCode.ALREADY_EXISTS,
                f"join[{index}]: agent {_named(session_id)} is already in this stream (it goes on as it was); "
                f"join an agent once",
            )
            return
        trace = events.SessionTrace(self.context.peer())
        agent_context = cast("grpc.aio.ServicerContext", _AgentContext(self.context.peer()))
        call = DriveCall(self.runtime, self._profile_builds, agent_context, trace)
        limit = self.runtime.config.max_agents_per_stream
        try:
            await call._refuse_unservable(req)
            if self.clock is not None and req.clock != self.clock:
                raise AgentRefused(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"agent {_named(session_id)}: OpenSession.clock is {pb.ClockMode.Name(req.clock)}; every agent "
                    f"of a stream has the stream's clock ({pb.ClockMode.Name(cast('pb.ClockMode', self.clock))})",
                )
            if len(self.agents) >= limit:
                raise AgentRefused(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"agent {_named(session_id)}: this stream holds {len(self.agents)} agents, the limit "
                    f"(SessionLimits.max_agents_per_stream = {limit}); open another stream for more",
                )
            session = await call._open_session(session_id, req)
        except AgentRefused as err:
            trace.ended(err.code.name, err.message)
            self._error(session_id, err.code, f"join[{index}]: {err.message}")
            return
        if self.clock is None:
            self._set_clock(req.clock)
        provided, instance = call._register(session_id, session, req)
        self.agents[session_id] = _Agent(call, session)
        if self.outbox is not None:
            self.runtime.agent_outboxes[session_id] = self.outbox
        self._notices().opened.add(
            session_id=session_id,
            clock=req.clock,
            tick_period_ns=self.executor.period_ns,
            observation_period_ns=req.observation_period_ns,
            provided_features=provided,
            require_plan=req.require_plan,
            session_instance=instance,
        )

    def _set_clock(self, clock: int) -> None:
        self.clock = clock
        if clock == pb.CLOCK_MODE_REALTIME:
            self.outbox = AgentsOutbox()
            self.outbox.notices.MergeFrom(self.notices)  # what this request answered so far
            self.notices = pb.DriveAgentsResponse()
            self.runtime.agent_groups.add(self.outbox)

    def _observe(self, session_id: str, seen: set[str], obs: pb.Observation | Observation) -> list[Snapshot]:
        """One agent's observation (a message of `observations`, or read from `observation_columns`):
        submitted (REALTIME) or advanced (LOCKSTEP: its snapshots). An invalid one ends that agent,
        with the status a Drive stream would have ended with."""
        if session_id not in self.agents:
            self._error(
                session_id,
                grpc.StatusCode.NOT_FOUND,
                f"observation for agent {_named(session_id)}, which is not in this stream (never joined, "
                f"refused, or left)",
            )
            return []
        try:
            if session_id in seen:
                raise AgentRefused(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "a second observation in one DriveAgentsRequest (the first was taken; the agent is now "
                    "closed): send one per agent and request",
                )
            seen.add(session_id)
            if (refusal := _refusal(obs)) is not None:
                raise AgentRefused(grpc.StatusCode.INVALID_ARGUMENT, refusal)
            snaps = self._advance(session_id, obs)
        except AgentRefused as err:
            self._remove(session_id, err.code.name, err.message)
            self._error(session_id, err.code, f"agent {_named(session_id)}: {err.message}")
            return []
        if self.runtime.recorder is not None:
            self.runtime.record_observation(
                session_id, obs if isinstance(obs, pb.Observation) else observation_message(obs)
            )
        return snaps

    def _advance(self, session_id: str, obs: pb.Observation | Observation) -> list[Snapshot]:
        realtime = self.clock == pb.CLOCK_MODE_REALTIME
        if isinstance(obs, pb.Observation):
            obs = observation_from_proto(obs, _mono_ns(), time.time_ns() if realtime else 0)
        try:
            if realtime:
                self.executor.submit(session_id, obs)
                return []
            return self.executor.advance_lockstep(session_id, obs)
        except InvalidObservation as err:
            raise AgentRefused(status_of(err), str(err)) from None

    def _remove(self, session_id: str, code: str, message: str) -> None:
        agent = self.agents.pop(session_id)
        if self.outbox is not None:
            self.runtime.agent_outboxes.pop(session_id, None)
        agent.call._close(session_id, agent.session)
        if self.outbox is not None:
            agent.call.trace.snapshots_dropped = self.outbox.dropped_by_agent.pop(session_id, 0)
        agent.call.trace.ended(code, message)

    def _count_sent(self, snaps: list[Snapshot]) -> None:
        stats = self.runtime.stats
        stats.snapshots_sent += len(snaps)
        stats.snapshots_sent_total += len(snaps)
        for snap in snaps:
            agent = self.agents.get(snap.session_id)
            if agent is not None:
                agent.call.trace.snapshots_sent += 1

    def _record_lockstep(self, snaps: list[Snapshot]) -> None:
        runtime = self.runtime
        tally = runtime.metrics.lockstep.add if runtime.metrics is not None else None
        for snap in snaps:
            runtime.shadows.record(snap)
            runtime.record_snapshot(snap)
            if tally is not None:
                tally(snap)

    async def _write_lockstep(self, snaps: list[Snapshot]) -> None:
        """One response per request, lossless: awaiting the write is the backpressure."""
        notices, self.notices = self.notices, pb.DriveAgentsResponse()
        await self.context.write(self._response(notices, self._encode(snaps)))
        self._count_sent(snaps)

    def _encode(self, snaps: list[Snapshot]) -> list:
        """Some of a response's snapshots in the stream's layout: a piece of the columns' bytes, or
        a message per snapshot."""
        if self.columns:
            return [snapshot_columns(snaps).SerializeToString()]
        return [snapshot_to_proto(snap) for snap in snaps]

    def _response(self, notices: pb.DriveAgentsResponse, parts: list) -> bytes:
        """The response's bytes: the notices with the snapshots `_encode` made."""
        return agents_columns_bytes(notices, parts) if self.columns else agents_response_bytes(notices, parts)

    async def _write_realtime(self, outbox: AgentsOutbox) -> None:
        """The newest tick's snapshots of every agent, with the notices since the previous response."""
        stats, ticker = self.runtime.stats, self.runtime.ticker
        while (item := await outbox.get()) is not None:
            notices, snaps, tick = item
            dropped = outbox.dropped_by_agent
            for snap in snaps:
                snap.snapshots_dropped = dropped.get(snap.session_id, 0)
            piece = _COLUMNS_PIECE if self.columns else _YIELD_EVERY
            parts: list = []
            for start in range(0, len(snaps), piece):
                if start:
                    while ticker.hand_over_due():  # converting a large group's tick must not delay the next
                        await ticker.until_tick()
                t0 = time.perf_counter_ns()
                parts += self._encode(snaps[start : start + piece])
                stats.stream_ns += time.perf_counter_ns() - t0
            notices.tick, notices.agent_snapshots_dropped = tick, outbox.dropped
            await self.context.write(self._response(notices, parts))
            self._count_sent(snaps)

    async def _stop_writer(self) -> None:
        outbox, writer = self.outbox, self._writer
        if outbox is None:
            return
        # the writer sends what is waiting, the last request's notices on the next tick, then ends
        outbox.close()
        try:
            if writer is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.wait_for(writer, _FLUSH_S)
        finally:
            self.runtime.agent_groups.discard(outbox)
