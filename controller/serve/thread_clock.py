"""Where a thread's time went: on a CPU, queued for one, or neither (asleep, or its vCPU not run).

Linux keeps both counters per thread in /proc/thread-self/schedstat (nanoseconds): time spent
running and time spent runnable but waiting on a run queue. With paravirtual time accounting the
first leaves out time the hypervisor took the vCPU away, so a tick loop that was due to run and
shows neither was held up by the machine, not by its own code. A read costs ~1 us here (one pread on
a descriptor kept open). Elsewhere (no schedstat) only the running time is known, from the thread's
CPU clock, and the queued time reads as 0.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class ThreadTimes:
    ran_ns: int  # on a CPU
    queued_ns: int  # runnable, waiting for a CPU

    def __sub__(self, other: ThreadTimes) -> ThreadTimes:
        return ThreadTimes(self.ran_ns - other.ran_ns, self.queued_ns - other.queued_ns)


class ThreadClock:
    """The calling thread's running and queued time; open it on the thread it is to follow."""

    def __init__(self) -> None:
        self._fd: int | None = None
        with contextlib.suppress(OSError):
            # /proc/thread-self resolves to the opening thread, and the descriptor stays with it
            self._fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)

    @property
    def knows_queued_time(self) -> bool:
        return self._fd is not None

    def read(self) -> ThreadTimes:
        if self._fd is not None:
            try:
                ran, queued, _ = os.pread(self._fd, 64, 0).split()
                return ThreadTimes(int(ran), int(queued))
            except (OSError, ValueError):
                self.close()  # not what it should be: the thread clock from now on
        return ThreadTimes(time.thread_time_ns(), 0)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
