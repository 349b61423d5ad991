"""A precise periodic ticker for an asyncio loop that counts lag instead of catching up.

Why not `await asyncio.sleep(period)`: event-loop timers are kept in whole milliseconds (uvloop
rounds to the nearest one and can fire up to 1 ms early), which gives ~1 ms p99 lateness on a 5 ms
period. So the ticker waits in three steps:
1. on the loop until a guard interval before the deadline (the loop serves gRPC meanwhile), woken
   by a timerfd (alarm.py) to the microsecond rather than by a loop timer; the guard covers the
   callbacks already running when it fires (1 ms by default);
2. in the thread (`time.sleep`, CPU free) until a short spin interval before the deadline;
3. a busy wait on the monotonic clock for the last ~200 us.
Step 2 blocks the loop, so the guard is time the loop cannot serve gRPC in every period. With a
loop timer it had to be 2 ms (1 ms of rounding, plus the callbacks), and an early timer made it up
to 3: at 32 sessions on one process the loop then fell behind and dropped 9.9% of the snapshots.
With the timerfd and a 1 ms guard it dropped 0.14% (docs/measurements.md).

A deadline whose tick could not start before the next deadline was due is *missed*: it is counted
and skipped, never run late in a burst (ros2_control's "missed cycles", openpilot's Ratekeeper lag).
This holds whether the loop arrives late or the wait itself overshoots, so every tick that runs
starts less than one period after its deadline, and the missed count is exactly the grid deadlines
no tick ran on (controller.proto, ServerStats.missed_deadlines).

A tick whose work runs past the next alarm still lets the loop run before the next tick: a period
or more late, for half the time the late tick took (at least 1 ms), else for one pass. So a model
slower than the period costs missed deadlines, never gRPC, health, the streams or SIGTERM.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dualloop.controller.serve.alarm import MonotonicAlarm
from dualloop.controller.serve.cpu_latency import hold_cpu_wake_latency
from dualloop.controller.serve.gc_clock import GC
from dualloop.controller.serve.realtime_threads import set_realtime_priority
from dualloop.controller.serve.thread_clock import ThreadClock, ThreadTimes
from dualloop.executor.config import DEFAULT_TICKER_GUARD_MS

_now_ns = time.monotonic_ns
STALLS_KEPT = 4096
_NEVER = 1 << 62
# What the loop is given before a tick that starts a period or more late (the previous one overran):
# time for gRPC and signal handlers however long every tick takes (docs/measurements.md).
OVERRUN_YIELD_NS = 1_000_000
MAX_OVERRUN_YIELD_NS = 50_000_000


@dataclass(slots=True)
class Tick:
    index: int  # position on the grid: index * period after the start; gaps are missed ticks
    scheduled_ns: int  # monotonic clock
    started_ns: int
    missed_before: int  # ticks skipped just before this one

    @property
    def lateness_ns(self) -> int:
        return self.started_ns - self.scheduled_ns


@dataclass(slots=True, frozen=True)
class Overrun:
    """The stretch of a wait that ran longest past its time, and how the loop's thread spent that
    excess (lower bounds: the counters cover the whole stretch, the excess is its end). `stretch`:
    "tick work" (the previous tick's own work, to the alarm), "loop" (serving the loop until the
    alarm woke it) or "thread wait" (the sleep and spin to the deadline). `why`: "running" (the
    thread was executing: our code or a library's), "queued" (runnable, another task had the CPU),
    "off CPU" (asleep past its alarm, waiting for the GIL, or its vCPU not run by the host),
    "garbage collection" (the collector took half the excess or more) or "mixed"."""

    stretch: str
    over_ns: int
    ran_ns: int
    queued_ns: int
    off_ns: int
    gc_ns: int = 0  # of the stretch, in the garbage collector (any thread's collection stops all)

    @property
    def why(self) -> str:
        if self.gc_ns * 2 >= self.over_ns:
            return "garbage collection"
        share = {"running": self.ran_ns, "queued": self.queued_ns, "off CPU": self.off_ns}
        name, most = max(share.items(), key=lambda kv: kv[1])
        return name if most * 2 >= self.over_ns else "mixed"


def overrun(stretch: str, wall_ns: int, over_ns: int, spent: ThreadTimes, gc_ns: int = 0) -> Overrun:
    kept = wall_ns - over_ns  # the part of the stretch that was on time
    off_ns = wall_ns - spent.ran_ns - spent.queued_ns
    return Overrun(
        stretch,
        over_ns,
        max(0, spent.ran_ns - kept),
        max(0, spent.queued_ns - kept),
        max(0, off_ns - kept),
        gc_ns,
    )


@dataclass(slots=True, frozen=True)
class _Waited:
    """One precise wait's moments (monotonic ns, the loop thread's times then)."""

    called: tuple[int, ThreadTimes, int]  # next() was called: the previous tick's work was done
    alarm_ns: int  # the loop was to be woken for the thread wait
    woke: tuple[int, ThreadTimes, int]
    deadline: int
    started: tuple[int, ThreadTimes, int]  # each: (monotonic ns, the thread's times, GC.total_ns)


@dataclass(slots=True, frozen=True)
class Stall:
    """Deadlines missed (missed > 0: the first of them was at_ns) or a tick that started late_ns
    after its deadline at_ns, past the ticker's stall threshold: when the loop could not keep time,
    and where that time went (None: no earlier tick to measure from)."""

    at_ns: int
    missed: int
    late_ns: int
    overrun: Overrun | None = None

    def record(self) -> dict[str, int | str]:
        """For a JSON report: when, how many, and where the time went (microseconds)."""
        out: dict[str, int | str] = {"at_ns": self.at_ns, "missed": self.missed, "late_us": self.late_ns // 1000}
        if self.overrun is not None:
            o = self.overrun
            out |= {"stretch": o.stretch, "why": o.why, "over_us": o.over_ns // 1000}
            out |= {"ran_us": o.ran_ns // 1000, "queued_us": o.queued_ns // 1000, "off_us": o.off_ns // 1000}
            out["gc_us"] = o.gc_ns // 1000
        return out


class LatenessLog:
    """A bounded ring of per-tick lateness values, for percentiles without unbounded memory."""

    def __init__(self, capacity: int = 1 << 17) -> None:
        self._values = np.zeros(capacity, dtype=np.int64)
        self._count = 0

    def add(self, lateness_ns: int) -> None:
        self._values[self._count % self._values.size] = lateness_ns
        self._count += 1

    def values(self) -> np.ndarray:
        return self._values[: min(self._count, self._values.size)].copy()

    def __len__(self) -> int:
        return min(self._count, self._values.size)

    @property
    def count(self) -> int:
        """Values added since the start (the ring keeps the last `capacity` of them)."""
        return self._count

    def since(self, count: int) -> np.ndarray:
        """The values added after the first `count` (those the ring still holds)."""
        start = max(count, self._count - self._values.size)
        idx = np.arange(start, self._count) % self._values.size
        return self._values[idx]


class PreciseTicker:
    """Waits for the deadlines start + k * period on the monotonic clock."""

    def __init__(
        self,
        period_ns: int,
        guard_ns: int = int(DEFAULT_TICKER_GUARD_MS * 1e6),
        start_ns: int | None = None,
        spin_ns: int = 200_000,
        stall_ns: int = 1_000_000,
        overrun_yield_ns: int = OVERRUN_YIELD_NS,
    ) -> None:
        """stall_ns: ticks later than this, and missed deadlines, are kept in `stalls` (the newest
        STALLS_KEPT), so that two loops can be compared in time (bench tick: was the machine's bare
        ticker stalled when the executor missed?)."""
        if period_ns <= 0:
            raise ValueError(f"tick period must be positive, got {period_ns} ns")
        self.period_ns = period_ns
        self.guard_ns = guard_ns
        # time.sleep overshoots by the timer slack (50 us by default, 0 under SCHED_FIFO) plus wake-up
        # latency: the spin covers that.
        self.spin_ns = spin_ns
        self.overrun_yield_ns = overrun_yield_ns
        self._start_ns = (start_ns if start_ns is not None else _now_ns()) + period_ns
        self._next_index = 0
        self.missed = 0
        self.ticks = 0
        self.stall_ns = stall_ns
        self.stalls: collections.deque[Stall] = collections.deque(maxlen=STALLS_KEPT)
        # made on the first precise wait, on the loop that waits; False: not available here
        self._alarm: MonotonicAlarm | None | bool = None
        # the loop thread's running/queued time at the last precise tick's start, to tell where a
        # stall's time went (three ~1 us reads a tick)
        self._clock: ThreadClock | None = None
        self._last_start: tuple[int, ThreadTimes, int] | None = None
        # From its alarm until the tick starts, the loop belongs to the tick (hand_over_due)
        self._hand_over_at_ns = _NEVER
        self._tick_started: asyncio.Future[None] | None = None
        self.hand_overs = 0  # times a loop task waited for the tick (until_tick)
        self.overrun_yields = 0  # waits that began past their alarm: the loop got its turn first
        self._last_tick_ns = _now_ns()  # when the newest tick started (precise or not)
        # called with the alarm time as the loop starts serving until it, and with 0 once it woke
        # (bench/stall_trace.py: stacks taken in the middle of a stall); None in service
        self.watchdog: Callable[[int], None] | None = None

    def close(self) -> None:
        """Releases the alarm's and thread clock's file descriptors (a ticker left to the garbage
        collector leaks them)."""
        if isinstance(self._alarm, MonotonicAlarm):
            self._alarm.close()
        self._alarm = None
        if self._clock is not None:
            self._clock.close()
        self._clock = None
        self._release_waiters()

    def hand_over_due(self) -> bool:
        """True once the alarm of a precise wait has rung and its tick has not started yet: loop
        work that can wait (the next message of a stream) should await until_tick() first.

        Why: the loop runs every callback that is ready before it sees the alarm, so a burst (a
        client that was held up sending several periods of observations at once) would run past the
        alarm and the deadline; measured at 32 sessions as 7-8 ms of loop work in one period
        (docs/measurements.md). One comparison: cheap enough for every message."""
        return _now_ns() >= self._hand_over_at_ns

    async def until_tick(self) -> None:
        """Returns once the next tick has started (at once if no precise wait is under way)."""
        if self._hand_over_at_ns == _NEVER:
            return
        if self._tick_started is None:
            self._tick_started = asyncio.get_running_loop().create_future()
        self.hand_overs += 1
        await asyncio.shield(self._tick_started)  # a cancelled waiter must not cancel the others'

    def _release_waiters(self) -> None:
        self._hand_over_at_ns = _NEVER
        waiters, self._tick_started = self._tick_started, None
        if waiters is not None and not waiters.done():
            waiters.set_result(None)

    async def _coarse_wait(self, until_ns: int) -> None:
        if self._alarm is None:
            self._alarm = MonotonicAlarm.create() or False
        if isinstance(self._alarm, MonotonicAlarm):
            await self._alarm.wait_until(until_ns)
        else:
            await asyncio.sleep((until_ns - _now_ns()) / 1e9)

    def _open_clock(self) -> ThreadClock:
        self._clock = ThreadClock()  # here, on the loop's thread
        GC.install()
        return self._clock

    def _overrun(self, w: _Waited) -> Overrun | None:
        """The stretch since the previous tick started that ran longest past its time."""
        if self._last_start is None:
            return None
        stretches = (
            ("tick work", self._last_start, w.called, w.called[0] - w.alarm_ns),
            ("loop", w.called, w.woke, w.woke[0] - max(w.alarm_ns, w.called[0])),
            ("thread wait", w.woke, w.started, w.started[0] - max(w.deadline, w.woke[0])),
        )
        name, begin, end, over = max(stretches, key=lambda s: s[3])
        return overrun(name, end[0] - begin[0], max(0, over), end[1] - begin[1], end[2] - begin[2])

    async def next(self, precise: bool = True) -> Tick:
        """The next deadline. precise=False: nobody needs this tick on time (no REALTIME session), so
        wait on the loop timer alone and leave the loop free (LOCKSTEP streams use it meanwhile);
        such ticks count neither lateness nor misses."""
        index = self._next_index
        deadline = self._start_ns + index * self.period_ns
        now = _now_ns()
        too_late = now >= deadline + self.period_ns  # for this deadline: skipped below, no wait
        if not precise:
            if not too_late and deadline > now:
                await asyncio.sleep((deadline - now) / 1e9)
                now = max(_now_ns(), deadline)
            else:
                await asyncio.sleep(0)  # overran: the loop's turn all the same (see below)
                now = _now_ns()
            return self._advance(index, deadline, now, None)
        clock = self._clock or self._open_clock()
        called = woke = (now, clock.read(), GC.total_ns)
        alarm_ns = deadline - self.guard_ns
        self._hand_over_at_ns = alarm_ns
        if too_late or alarm_ns <= now:
            # The previous tick's work ran past this tick's alarm: no wait on the loop below. The
            # loop gets its turn all the same, or a tick that always overruns would never let it run
            # gRPC, health or signal handlers again (a 15 ms model on a 5 ms tick froze the server,
            # SIGTERM included). Past a whole period (deadlines are missed anyway) it serves for
            # overrun_yield_ns, or half the time since the last tick started if longer (a third of
            # the wall time, however slow the ticks or the machine): one pass per tick made a unary
            # call wait ~7 overrunning ticks (100+ ms), a quarter still 200+ ms p99 at load 10.
            # Short of a period, one pass, so that a tick still on time stays on time. The streams
            # are not handed over meanwhile: held until the tick, they would never read an
            # observation again while ticks overrun.
            self.overrun_yields += 1
            self._release_waiters()
            if too_late and self.overrun_yield_ns > 0:
                half = min((now - self._last_tick_ns) // 2, MAX_OVERRUN_YIELD_NS)
                await self._coarse_wait(now + max(self.overrun_yield_ns, half))
            else:
                await asyncio.sleep(0)
            self._hand_over_at_ns = alarm_ns
            now = _now_ns()
            too_late = now >= deadline + self.period_ns
        if not too_late:
            if alarm_ns > now:
                if self.watchdog is not None:
                    self.watchdog(alarm_ns)
                await self._coarse_wait(alarm_ns)
                if self.watchdog is not None:
                    self.watchdog(0)
            woke = (_now_ns(), clock.read(), GC.total_ns)
            fine_ns = deadline - woke[0] - self.spin_ns
            if fine_ns > 0:
                time.sleep(fine_ns / 1e9)
            while (now := _now_ns()) < deadline:
                pass
        started = (now, clock.read(), GC.total_ns)
        return self._advance(index, deadline, now, _Waited(called, alarm_ns, woke, deadline, started))

    def _advance(self, index: int, deadline: int, now: int, waited: _Waited | None) -> Tick:
        missed = 0
        first_missed = deadline
        # Checked after the wait too (a wait can overshoot by a whole period under load), so that a
        # tick never starts a full period or more after its deadline: lateness < period, always.
        if now >= deadline + self.period_ns:
            # Too late for this one and maybe more: skip to the newest deadline that has passed.
            missed = (now - deadline) // self.period_ns
            index += missed
            deadline += missed * self.period_ns
        if waited is not None:  # precise: lateness and misses count
            late_ns = now - deadline
            if missed or late_ns > self.stall_ns:
                cause = self._overrun(waited)
                if missed:
                    self.missed += missed
                    self.stalls.append(Stall(first_missed, missed, 0, cause))
                if late_ns > self.stall_ns:
                    self.stalls.append(Stall(deadline, 0, late_ns, cause))
            self._last_start = waited.started
            self._release_waiters()
        self._next_index = index + 1
        self._last_tick_ns = now
        self.ticks += 1
        return Tick(index=index, scheduled_ns=deadline, started_ns=now, missed_before=missed)


# The young generation's threshold in a serving process. A tick holds its new objects (the snapshots
# and what they hold, ~5 per session) until it ends, when reference counting frees them: at 512
# sessions a few thousand at once. CPython's default, 700, made that ~4 young collections per tick,
# each moving the tick's live objects a generation older, and so the full collections that walk them
# (0.7-1.0 ms of collection per tick at 512 sessions, pauses up to 1.7 ms young and 5 ms full). Above a
# tick's peak, a young collection runs only when the heap grows (sessions opening), as it should.
YOUNG_THRESHOLD = 20_000


def settle_collector() -> int:
    """Set the garbage collector up for ticking: every object alive now (the imports, the model,
    gRPC) moved out of its reach, and young collections only past YOUNG_THRESHOLD new objects;
    returns how many were frozen. Call once a serving process has started, before it serves.

    The frozen objects live as long as the process, yet each collection of an older generation walks
    them again: on this project's 2-core VM a full collection of a started server took 17-100 ms and
    the first young ones after start-up 1-14 ms, so several 5 ms deadlines at once. No collect()
    first: it would cost that pause itself, with the tick loop already running. For whole processes
    only (`dualloop serve`, its workers, the bench's server), never a host that embeds a server."""
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    return gc.get_freeze_count()


def percentiles_us(values_ns: np.ndarray) -> dict[str, float]:
    """min/p50/p99/p99.9/max in microseconds (NaN when empty)."""
    if values_ns.size == 0:
        return {k: float("nan") for k in ("min", "p50", "p99", "p99.9", "max")}
    v = values_ns.astype(np.float64) / 1e3
    p50, p99, p999 = np.percentile(v, [50, 99, 99.9])
    return {"min": float(v.min()), "p50": float(p50), "p99": float(p99), "p99.9": float(p999), "max": float(v.max())}


async def run_bare_ticker(
    period_ns: int,
    duration_s: float,
    guard_ns: int = int(DEFAULT_TICKER_GUARD_MS * 1e6),
    save: str | None = None,
    realtime_priority: int | None = None,
    cpu_wake_latency_us: int | None = None,
) -> dict[str, object]:
    """A loop that does nothing but wait for the deadlines: the machine's floor for lateness.
    Scheduled as the server it is compared with: the same priority and CPU wake latency request."""
    scheduling = set_realtime_priority(realtime_priority)
    wake_request, held = hold_cpu_wake_latency(cpu_wake_latency_us)
    if held:
        scheduling = f"{scheduling}; {held}"
    ticker = PreciseTicker(period_ns, guard_ns=guard_ns)
    log = LatenessLog()
    n = int(duration_s * 1e9 / period_ns)
    cpu0 = time.process_time()
    while ticker.ticks < n:
        tick = await ticker.next()
        log.add(tick.lateness_ns)
    cpu = time.process_time() - cpu0
    ticker.close()
    if wake_request is not None:
        wake_request.close()
    if save:
        np.save(save, log.values())
    return {
        "lateness_us": percentiles_us(log.values()),
        "missed": ticker.missed,
        "ticks": ticker.ticks,
        "cpu_fraction": cpu / duration_s,
        "scheduling": scheduling,
        "stalls_at_ns": [s.at_ns for s in ticker.stalls],  # missed, or later than its stall threshold
        "missed_causes": [s.record() for s in ticker.stalls if s.missed],
    }
