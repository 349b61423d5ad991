"""DUALLOOP_TRACE_STALLS: the loop's stack is taken while it overruns, and labelled afterwards.

In a process of its own: the tracer takes SIGALRM, which pytest-timeout may use in the runner.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = r"""
import asyncio, sys, time
from dualloop.controller.bench.stall_trace import StallTracer
from dualloop.controller.serve.ticker import PreciseTicker

def hog_the_loop():
    end = time.thread_time_ns() + 12_000_000
    while time.thread_time_ns() < end:
        pass

async def run():
    tracer = StallTracer(open(sys.argv[1], "a"))
    ticker = PreciseTicker(5_000_000)
    ticker.watchdog = tracer
    await ticker.next()
    await ticker.next()
    for _ in range(3):  # quiet ticks: nothing written
        await ticker.next()
    asyncio.get_running_loop().call_soon(hog_the_loop)  # runs while the ticker waits for its alarm
    await ticker.next()
    await ticker.next()
    tracer.close()
    ticker.close()

asyncio.run(run())
"""


def test_a_stall_leaves_the_loops_stack_behind(tmp_path: Path):
    out = tmp_path / "stalls.txt"
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(out)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert "hog_the_loop" in text  # caught in the act
    assert "== above: the loop woke at" in text  # labelled (a loaded machine may add stalls of its own)
