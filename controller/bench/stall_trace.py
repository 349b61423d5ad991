"""Where the loop was when it overran: every thread's Python stack, taken in the middle of a stall.

A missed deadline is only seen once the loop is back, when whatever held it has finished. So the
bench server (with DUALLOOP_TRACE_STALLS=FILE) arms a one-shot interval timer each time the loop
goes back to serving gRPC, to ring a few milliseconds after the tick's alarm; the tick disarms it
when it wakes. If it rings, faulthandler writes every thread's stack to FILE from the signal
handler: no GIL needed, so it shows what the loop's thread is running at that moment. Two
setitimer calls per tick; for diagnosis, not for serving.
"""

from __future__ import annotations

import faulthandler
import signal
import time
from typing import IO

TRACE_ENV = "DUALLOOP_TRACE_STALLS"
LATE_NS = 3_000_000  # past the alarm: a deadline is missed about 6 ms past it (guard 1 ms + period)


class StallTracer:
    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.armed_ns = 0
        faulthandler.register(signal.SIGALRM, file=out, all_threads=True, chain=False)

    def __call__(self, alarm_ns: int) -> None:
        """The ticker's watchdog hook: alarm_ns > 0 when the loop starts serving until the alarm,
        0 when the loop woke for the tick."""
        if alarm_ns:
            self.armed_ns = alarm_ns + LATE_NS
            signal.setitimer(signal.ITIMER_REAL, max(1e-6, (self.armed_ns - time.monotonic_ns()) / 1e9))
            return
        signal.setitimer(signal.ITIMER_REAL, 0.0)
        now = time.monotonic_ns()
        if self.armed_ns and now > self.armed_ns:  # it rang: label the stacks it wrote
            late_ms = (now - self.armed_ns + LATE_NS) / 1e6
            self.out.write(f"== above: the loop woke at {now} (monotonic ns), {late_ms:.1f} ms past its alarm\n\n")
            self.out.flush()
        self.armed_ns = 0

    def close(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0.0)
        faulthandler.unregister(signal.SIGALRM)
