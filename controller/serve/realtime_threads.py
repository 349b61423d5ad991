"""Real-time scheduling of a serving process: its tick loop's thread above all its other threads.

Every thread runs SCHED_FIFO, not just the loop's: gRPC's threads take the GIL, and one preempted
at normal priority while holding it would stall the loop (priority inversion; seen here as a 100 ms
stall). But not all at one priority: SCHED_FIFO never preempts a thread of the same priority, so a
gRPC thread that had the CPU when the tick was due kept it, and at 32 sessions on one CPU the loop
waited 5 ms behind one (docs/measurements.md). So the loop's thread gets the priority asked for and
every other thread the one below: still above every normal process, and preempted by the loop the
moment its tick is due (a thread preempted holding the GIL gets it back as soon as the loop waits).

Threads started later come out under the normal scheduler (SCHED_RESET_ON_FORK, which keeps the
policy from processes this one starts, applies to new threads too), where a GIL holder could be
preempted by any process: pools move theirs to the other threads' priority with
`lower_this_thread` as their initializer, and `lower_new_threads`, called by the tick loop about
once a second, moves any other.
"""

from __future__ import annotations

import contextlib
import os
import threading

from threadpoolctl import threadpool_limits

_TASKS = "/proc/self/task"


class RealtimeThreads:
    """One per process (REALTIME below): the process has one set of threads."""

    def __init__(self) -> None:
        self.loop_priority: int | None = None
        self.loop_tid: int | None = None
        self._known: set[int] = set()

    @property
    def others_priority(self) -> int | None:
        return None if self.loop_priority is None else max(1, self.loop_priority - 1)

    def apply(self, priority: int | None) -> str:
        """The calling thread (the tick loop's) at `priority`, every other thread one below; returns
        what happened, for the log."""
        if not priority:  # None or 0 (the configuration's way to undo a priority set elsewhere)
            return "normal scheduling"
        loop_tid = threading.get_native_id()
        others = max(1, priority - 1)
        try:
            for tid in self._tasks():
                _set_fifo(tid, priority if tid == loop_tid else others)
        except (AttributeError, PermissionError, OSError) as err:
            return f"SCHED_FIFO {priority} refused ({err}); normal scheduling"
        self.loop_priority, self.loop_tid = priority, loop_tid
        self._known = set(self._tasks())
        return f"SCHED_FIFO {priority} (tick loop; other threads {others})"

    def lower_this_thread(self) -> None:
        """For a thread started after apply(): to the other threads' priority (no-op when the
        process is not real-time, or on the loop's own thread)."""
        others = self.others_priority
        tid = threading.get_native_id()
        if others is not None and tid != self.loop_tid:
            with contextlib.suppress(AttributeError, PermissionError, OSError):
                _set_fifo(tid, others)

    def lower_new_threads(self) -> int:
        """Threads started since the last look, moved to the other threads' priority; returns how
        many. One directory listing when none is new (a few microseconds)."""
        others = self.others_priority
        if others is None:
            return 0
        tids = set(self._tasks())
        new = tids - self._known - {self.loop_tid}
        self._known = tids
        for tid in new:
            with contextlib.suppress(PermissionError, OSError):  # it may have exited meanwhile
                _set_fifo(tid, others)
        return len(new)

    @staticmethod
    def _tasks() -> list[int]:
        return [int(t) for t in os.listdir(_TASKS)] if os.path.isdir(_TASKS) else [0]


def _set_fifo(tid: int, priority: int) -> None:
    # RESET_ON_FORK: processes this one starts (bench clients, tools) must not inherit it.
    os.sched_setscheduler(tid, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(priority))


REALTIME = RealtimeThreads()


def set_realtime_priority(priority: int | None) -> str:
    """REALTIME.apply: call on the tick loop's thread."""
    return REALTIME.apply(priority)


def lower_this_thread() -> None:
    """A thread pool's initializer (see the module's docstring)."""
    REALTIME.lower_this_thread()


def one_blas_thread() -> None:
    """numpy's BLAS computes on the thread that calls it, for the whole process. By default OpenBLAS
    hands a large enough product (the gates' at 64 rows and more) to a thread per core: the tick then
    waits on a thread another process may hold the core of, and the idle BLAS threads spin on the
    core the clients need. The tick's products are small: one thread is also the fastest. Call it
    from the process's main thread: OpenBLAS 0.3.31 ignored it from another for that thread's own products."""
    threadpool_limits(1, user_api="blas")
