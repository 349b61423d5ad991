"""The shadow statistics of every opening of a session (ShadowRegistry): what GetShadowStats answers,
kept per session instance so that a reused session id starts fresh, and bounded (the newest closed
instances only)."""

from __future__ import annotations

import collections
import uuid
from dataclasses import dataclass

import numpy as np

from dualloop.controller.contract.shadow import CandidateTally, ShadowAgreement
from dualloop.executor.core import Executor
from dualloop.executor.snapshot import Snapshot


@dataclass
class ShadowInstance:
    """The shadow statistics of one opening of a session (SessionOpened.session_instance)."""

    session_id: str
    instance: str
    agreement: ShadowAgreement
    candidate: CandidateTally | None = None  # a candidate model's proposals against the live ones
    owner: str = ""  # the opener's security.CALLER_ID ("": authentication off, or opened directly)


class ShadowRegistry:
    """Shadow statistics per session instance: open instances by session id; every kept instance by
    its id; the newest instance of each session id; and the closed ones, oldest first, forgotten
    beyond KEEP_CLOSED (bounded memory)."""

    KEEP_CLOSED = 256  # closed session instances whose agreement stays queryable

    def __init__(self, executor: Executor) -> None:
        self.executor = executor  # its card (the live model's: a promotion replaces it) sizes the tallies
        self.open_instances: dict[str, ShadowInstance] = {}
        self.instances: dict[str, ShadowInstance] = {}
        self.latest: dict[str, str] = {}
        self._closed: collections.deque[str] = collections.deque()

    def new_agreement(self) -> ShadowAgreement:
        card = self.executor.card
        return ShadowAgreement(card.actions, len(card.controls))

    def open(self, session_id: str, owner: str = "") -> str:
        """Fresh shadow statistics for a new opening of `session_id`; returns its instance id."""
        shadow = ShadowInstance(session_id, uuid.uuid4().hex, self.new_agreement(), owner=owner)
        self.open_instances[session_id] = shadow
        self.instances[shadow.instance] = shadow
        self.latest[session_id] = shadow.instance
        return shadow.instance

    def close(self, session_id: str) -> None:
        shadow = self.open_instances.pop(session_id, None)
        if shadow is None:
            return
        self._closed.append(shadow.instance)
        while len(self._closed) > self.KEEP_CLOSED:
            old = self.instances.pop(self._closed.popleft())
            if self.latest.get(old.session_id) == old.instance:
                del self.latest[old.session_id]

    def record(self, snap: Snapshot) -> None:
        """Count one snapshot against its session's open instance (on the loop, after each tick)."""
        shadow = self.open_instances.get(snap.session_id)
        if shadow is None:  # a session opened on the executor directly, not through Drive
            shadow = self.instances[self.open(snap.session_id)]
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
