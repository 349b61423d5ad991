"""A one-slot, latest-wins mailbox: the only buffer between the tick loop and a slow client."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

from dualloop.executor.snapshot import Snapshot

T = TypeVar("T")


class LatestSlot(Generic[T]):
    def __init__(self, merge: Callable[[T, T], None] | None = None) -> None:
        """merge(replaced, newest): called when an untaken item is replaced, so the newest can carry
        what the client would otherwise never learn about the replaced one."""
        self._item: T | None = None
        self._ready = asyncio.Event()
        self._closed = False
        self._merge = merge
        self.dropped = 0  # items replaced before anyone took them

    def put(self, item: T) -> None:
        if self._item is not None:
            self.dropped += 1
            if self._merge is not None:
                self._merge(self._item, item)
        self._item = item
        self._ready.set()

    def close(self) -> None:
        self._closed = True
        self._ready.set()

    async def get(self) -> T | None:
        """The newest item, waiting for one; None once closed and empty."""
        while self._item is None:
            if self._closed:
                return None
            self._ready.clear()
            await self._ready.wait()
        item, self._item = self._item, None
        return item


def carry_over(replaced: Snapshot, newest: Snapshot) -> None:
    """A conflated snapshot's tick is accounted for in the one that replaced it: one more conflated,
    its missed ticks, and its lateness (late ticks are the ones most often conflated away, so the
    delivered lateness alone would be biased low)."""
    newest.snapshots_conflated_since_previous += replaced.snapshots_conflated_since_previous + 1
    newest.ticks_missed_since_previous += replaced.ticks_missed_since_previous
    newest.max_lateness_since_previous_us = max(
        newest.max_lateness_since_previous_us, replaced.max_lateness_since_previous_us
    )
