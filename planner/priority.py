"""The planner worker's CPU priority: idle between batches and while it has CPU to spare, raised
only while a batch waits for a CPU.

On a machine whose CPUs are shared with other work (the user's own stack, gRPC clients, the bench's
load), a worker at normal or even niced priority still delays the others: a task woken on a CPU it
is using waits until the scheduler's fairness lets it in. Linux's SCHED_IDLE policy gives the worker
only what nobody else wants, and any other task that wakes preempts it at once. Left there, though,
a saturated machine would starve planning altogether, and every session would end in STALE_PLAN
fallback because of someone else's load. So the scheduler raises a worker whose batch is still
waiting for a CPU after a while to SCHED_BATCH at its nice level (the policy it always had before),
and the worker returns to SCHED_IDLE once the batch is answered.

Leaving SCHED_IDLE needs CAP_SYS_NICE or an RLIMIT_NICE that allows the nice level (Linux man page
sched(7)); where the scheduler cannot raise the worker it never puts it there: the worker then runs
SCHED_BATCH throughout, as it did before.
"""

from __future__ import annotations

import os
import resource

_CAP_SYS_NICE = 23  # linux/capability.h


def supported() -> bool:
    return all(hasattr(os, name) for name in ("SCHED_IDLE", "SCHED_BATCH", "sched_setscheduler"))


def can_raise_from_idle(nice: int) -> bool:
    """Whether this process may move another of its own processes from SCHED_IDLE to SCHED_BATCH
    at this nice level: the kernel allows it with CAP_SYS_NICE, or with an RLIMIT_NICE soft limit of
    at least 20 - nice."""
    if not supported():
        return False
    if _has_cap_sys_nice():
        return True
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    except (AttributeError, ValueError, OSError):
        return False
    return soft == resource.RLIM_INFINITY or soft >= 20 - nice


def _has_cap_sys_nice() -> bool:
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"CapEff:"):
                    return bool(int(line.split()[1], 16) >> _CAP_SYS_NICE & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def lower(nice: int, idle: bool) -> str:
    """In the worker, once at start: nice, then SCHED_IDLE (idle) or SCHED_BATCH; returns the policy
    it got. SCHED_BATCH rather than plain niceness: a batch arrives over a unix socket, whose write
    wakes the reader "synchronously", and Linux then puts the woken worker on the writer's CPU and
    lets it preempt the writer, the tick loop, for as long as the batch takes (measured: the
    scheduler's send took 2.9 ms p50, each time with an involuntary context switch; 13-33 us as
    SCHED_BATCH, which never preempts on wake-up). Needs no privilege; a refusal is not an error."""
    try:
        os.nice(nice)
    except OSError:
        pass
    return to_idle() if idle else _set(0, "SCHED_BATCH")


def to_idle() -> str:
    """In the worker, after each batch: back to SCHED_IDLE (always allowed)."""
    return _set(0, "SCHED_IDLE")


def raise_to_batch(pid: int) -> str:
    """In the scheduler: the worker process pid (its planning thread) to SCHED_BATCH; "" if refused."""
    return _set(pid, "SCHED_BATCH")


def policy_name(pid: int) -> str:
    """The scheduling policy of pid's main thread, for tests and reports."""
    if not hasattr(os, "sched_getscheduler"):
        return "unknown"
    policy = os.sched_getscheduler(pid)
    names = {
        getattr(os, n): n
        for n in ("SCHED_OTHER", "SCHED_BATCH", "SCHED_IDLE", "SCHED_FIFO", "SCHED_RR")
        if hasattr(os, n)
    }
    return names.get(policy & 0xFF, str(policy))


def _set(pid: int, name: str) -> str:
    policy = getattr(os, name, None)
    if policy is None:
        return ""
    try:
        os.sched_setscheduler(pid, policy, os.sched_param(0))
    except OSError:
        return ""
    return name
