"""A one-slot, latest-wins mailbox: the only buffer between the tick loop and a slow client."""

from __future__ import annotations

import asyncio
from typing import Generic, TypeVar

T = TypeVar("T")


class LatestSlot(Generic[T]):
    def __init__(self) -> None:
        self._item: T | None = None
        self._ready = asyncio.Event()
        self._closed = False
        self.dropped = 0  # items replaced before anyone took them

    def put(self, item: T) -> None:
        if self._item is not None:
            self.dropped += 1
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
