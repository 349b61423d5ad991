"""What a DriveAgents stream sends: the REALTIME outbox of a group of agents (AgentsOutbox: the
newest tick's snapshots, newest tick wins, and the notices that must all arrive) and the wire bytes
of a DriveAgentsResponse built from per-agent snapshot bytes (agents_response_bytes) or from pieces
of its snapshot columns (agents_columns_bytes)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from dualloop.controller.contract.wire import varint
from dualloop.controller.serve.conflation import carry_over
from dualloop.executor.snapshot import Snapshot
from dualloop.v2 import controller_pb2 as pb

# DriveAgentsResponse.snapshots' tag: field 3, length-delimited
_SNAPSHOTS_TAG = bytes([(pb.DriveAgentsResponse.DESCRIPTOR.fields_by_name["snapshots"].number << 3) | 2])


def agents_response_bytes(head: pb.DriveAgentsResponse, snapshots: Sequence[pb.DecisionSnapshot]) -> bytes:
    """The wire bytes of `head` with `snapshots` appended to its repeated snapshots field, without
    copying each snapshot into the response (a repeated message field is its elements' tag, length
    and bytes, in any order relative to the other fields: the same message once parsed)."""
    parts = [head.SerializeToString()]
    for snap in snapshots:
        body = snap.SerializeToString()
        parts += (_SNAPSHOTS_TAG, varint(len(body)), body)
    return b"".join(parts)


_COLUMNS_TAG = bytes([(pb.DriveAgentsResponse.DESCRIPTOR.fields_by_name["columns"].number << 3) | 2])


def agents_columns_bytes(head: pb.DriveAgentsResponse, pieces: Sequence[bytes]) -> bytes:
    """The wire bytes of `head` with its `columns` made of `pieces`, each a serialised SnapshotColumns
    of some of the agents (in order): a message parsed from bytes merges repeated fields end to end,
    so the pieces are the columns of all of them. No pieces (no snapshots): no columns."""
    body = b"".join(pieces)
    return head.SerializeToString() + (_COLUMNS_TAG + varint(len(body)) + body if body else b"")


class AgentsOutbox:
    """REALTIME: between the tick loop and one DriveAgents stream's writer. The tick loop put()s each
    agent's snapshot and end_tick()s; the writer takes the newest complete tick. A tick the writer
    did not take is replaced by the next (its snapshots counted dropped and carried over, per agent,
    as a Drive stream's outbox does). Notices (agents opened, refused, left) ride on the first tick
    after them, so that every response has its tick (a tick with notices and no snapshots is sent
    too); a replaced tick's notices move on to the next: they are never dropped."""

    def __init__(self) -> None:
        self._filling: list[Snapshot] = []
        self._ready: list[Snapshot] | None = None
        self._ready_tick = 0
        self._ready_notices = pb.DriveAgentsResponse()
        self._event = asyncio.Event()
        self._closed = False
        self.notices = pb.DriveAgentsResponse()  # since the last tick ended; the next takes them
        self.dropped = 0  # agent-snapshots replaced before the writer took them
        self.dropped_by_agent: dict[str, int] = {}

    def put(self, snap: Snapshot) -> None:
        self._filling.append(snap)

    def end_tick(self, tick: int) -> None:
        if self._closed and not self._has_notices():  # the stream ended: only its last notices still go
            self._filling = []
            return
        if not self._filling and not self._has_notices():
            return
        newest, self._filling = self._filling, []
        notices, self.notices = self.notices, pb.DriveAgentsResponse()
        if self._ready is not None:  # the writer is behind: newest tick wins
            replaced = {s.session_id: s for s in self._ready}
            self.dropped += len(self._ready)
            for snap in newest:
                old = replaced.pop(snap.session_id, None)
                if old is not None:
                    carry_over(old, snap)
                    self.dropped_by_agent[snap.session_id] = self.dropped_by_agent.get(snap.session_id, 0) + 1
            self._ready_notices.MergeFrom(notices)  # repeated fields append: the older notices first
            notices = self._ready_notices
        self._ready, self._ready_tick, self._ready_notices = newest, tick, notices
        self._event.set()

    def close(self) -> None:
        """The stream ends: the writer takes what is waiting, and notices not yet on a tick wait for
        the next one (the group stays in the tick loop until the writer is done); no tick after it."""
        self._closed = True
        self._event.set()

    async def get(self) -> tuple[pb.DriveAgentsResponse, list[Snapshot], int] | None:
        """(notices, snapshots, tick) of the newest tick not yet taken; None once closed with nothing
        left to send."""
        while self._ready is None:
            if self._closed and not self._has_notices():
                return None
            self._event.clear()
            await self._event.wait()
        snaps, self._ready = self._ready, None
        notices, self._ready_notices = self._ready_notices, pb.DriveAgentsResponse()
        return notices, snaps, self._ready_tick

    def _has_notices(self) -> bool:
        """Notices that no tick has taken yet."""
        n = self.notices
        return bool(len(n.opened) or len(n.errors) or len(n.left))
