"""The ticker's coarse wait: a timerfd the loop watches. It must never wake early, must keep working
after a cancelled wait, and must give its file descriptor back."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import pytest
import uvloop

from dualloop.controller.serve.alarm import MonotonicAlarm
from dualloop.controller.serve.ticker import PreciseTicker

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd is Linux's")

PERIOD = 5_000_000


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("new_loop", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"])
def test_the_alarm_never_wakes_before_the_time_asked_for(new_loop):
    async def run() -> list[int]:
        alarm = MonotonicAlarm.create()
        assert alarm is not None
        early = []
        try:
            for k in range(200):
                # odd offsets: whole milliseconds are what a loop timer would round to
                t = time.monotonic_ns() + 137_000 + 9_000 * (k % 50)
                await alarm.wait_until(t)
                early.append(t - time.monotonic_ns())
        finally:
            alarm.close()
        return early

    loop = new_loop()
    try:
        early = loop.run_until_complete(run())
    finally:
        loop.close()
    assert len(early) == 200 and max(early) <= 0, f"woke {max(early)} ns early"


def test_a_time_already_past_returns_at_once_and_a_cancelled_wait_leaves_it_usable():
    async def run() -> None:
        alarm = MonotonicAlarm.create()
        assert alarm is not None
        try:
            await asyncio.wait_for(alarm.wait_until(time.monotonic_ns() - 1_000_000), 5)
            waiting = asyncio.ensure_future(alarm.wait_until(time.monotonic_ns() + 60_000_000_000))
            await asyncio.sleep(0.01)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            t = time.monotonic_ns() + 2_000_000
            await asyncio.wait_for(alarm.wait_until(t), 5)
            assert time.monotonic_ns() >= t
        finally:
            alarm.close()
        with pytest.raises(RuntimeError, match="closed"):
            await alarm.wait_until(time.monotonic_ns())

    asyncio.run(run())


def test_a_ticker_gives_its_descriptors_back_when_closed():
    async def run() -> tuple[int, int, int]:
        before = _open_fds()
        ticker = PreciseTicker(PERIOD, guard_ns=1_000_000)
        for _ in range(5):
            tick = await ticker.next()
            assert tick.started_ns >= tick.scheduled_ns  # never early
        during = _open_fds()
        ticker.close()
        return before, during, _open_fds()

    before, during, after = asyncio.run(run())
    assert during == before + 2  # the timerfd, and the loop thread's schedstat (thread_clock.py)
    assert after == before
