"""Time the garbage collector took from this process: collections and their pauses.

CPython's cyclic collector stops the whole interpreter while it walks the tracked objects, on
whatever thread triggered it; a collection of the oldest generation in a serving process that has
built up sessions can take milliseconds, a whole tick deadline. The ticker reads `total_ns` around
its wait (an attribute read) so that a stall can say how much of it was the collector. The callback
costs about a microsecond per collection.
"""

from __future__ import annotations

import gc
import time
from typing import Any

_now_ns = time.perf_counter_ns


class GcClock:
    """Installed once per process (GC below), on first use."""

    def __init__(self) -> None:
        self.total_ns = 0
        self.collections = [0, 0, 0]
        self.longest_ns = [0, 0, 0]
        self._started_ns = 0
        self._installed = False

    def install(self) -> GcClock:
        if not self._installed:
            gc.callbacks.append(self._callback)
            self._installed = True
        return self

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started_ns = _now_ns()
            return
        took = _now_ns() - self._started_ns
        generation = int(info.get("generation", 0))
        self.total_ns += took
        self.collections[generation] += 1
        self.longest_ns[generation] = max(self.longest_ns[generation], took)

    def summary(self) -> dict[str, Any]:
        """Collections per generation, the longest pause of each (us) and the total (ms)."""
        return {
            "collections": list(self.collections),
            "longest_us": [ns // 1000 for ns in self.longest_ns],
            "total_ms": self.total_ns / 1e6,
        }


GC = GcClock()
