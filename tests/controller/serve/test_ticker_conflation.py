"""The ticker skips and counts missed deadlines; the one-slot mailbox keeps the newest and counts."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from dualloop.controller.serve.conflation import LatestSlot
from dualloop.controller.serve.ticker import LatenessLog, PreciseTicker, percentiles_us

PERIOD = 5_000_000


def test_missed_deadlines_are_skipped_not_bursted():
    async def run() -> list:
        ticker = PreciseTicker(PERIOD)
        first = await ticker.next()
        time.sleep(0.0175)  # the loop is blocked through three more deadlines
        late = await ticker.next()
        after = await ticker.next()
        return [first, late, after, ticker.missed]

    first, late, after, missed = asyncio.run(run())
    assert late.index - first.index >= 3  # jumped to the newest passed deadline ...
    assert late.missed_before == late.index - first.index - 1 >= 2  # ... counting the skipped ones
    # and no burst of catch-up ticks follows (on a busy machine `first` or `after` may be late too: the
    # deadlines they skipped are counted as well)
    assert after.index > late.index and after.missed_before == after.index - late.index - 1
    assert missed == first.missed_before + late.missed_before + after.missed_before
    assert after.scheduled_ns == late.scheduled_ns + (after.index - late.index) * PERIOD
    assert after.started_ns >= after.scheduled_ns


def test_missed_deadlines_are_kept_with_the_time_the_first_was_due():
    async def run() -> tuple:
        ticker = PreciseTicker(PERIOD, stall_ns=PERIOD)  # lateness alone (under a period) is no stall here
        first = await ticker.next()
        time.sleep(0.0175)
        late = await ticker.next()
        return first, late, list(ticker.stalls)

    first, late, stalls = asyncio.run(run())
    missed = [s for s in stalls if s.missed and s.at_ns > first.scheduled_ns]  # a busy machine may delay `first`
    assert len(missed) == 1 and missed[0].missed == late.missed_before >= 2
    assert missed[0].at_ns == first.scheduled_ns + PERIOD  # the deadline right after the last tick that ran


def test_ticks_follow_the_grid():
    async def run() -> list:
        ticker = PreciseTicker(PERIOD)
        return [await ticker.next() for _ in range(20)]

    ticks = asyncio.run(run())
    scheduled = np.array([t.scheduled_ns for t in ticks])
    assert np.all(np.diff(scheduled) % PERIOD == 0) and np.all(np.diff(scheduled) > 0)
    assert all(t.started_ns >= t.scheduled_ns for t in ticks)


def test_latest_slot_keeps_newest_and_counts():
    async def run():
        slot: LatestSlot[int] = LatestSlot()
        for i in range(5):
            slot.put(i)
        got = await slot.get()
        waiter = asyncio.create_task(slot.get())
        await asyncio.sleep(0)
        slot.put(9)
        second = await waiter
        slot.close()
        return got, second, await slot.get(), slot.dropped

    assert asyncio.run(run()) == (4, 9, None, 4)


def test_lateness_log_is_bounded():
    log = LatenessLog(capacity=8)
    for v in range(20):
        log.add(v * 1000)
    assert len(log) == 8 and sorted(log.values().tolist()) == [v * 1000 for v in range(12, 20)]
    p = percentiles_us(log.values())
    assert p["min"] == 12.0 and p["max"] == 19.0
