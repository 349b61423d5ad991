"""Under --realtime-priority the tick loop's thread is above every other thread of the server.

Each case runs in a process of its own: SCHED_FIFO must not leak into the test runner. Needs
CAP_SYS_NICE (root in CI); where the kernel refuses, the server says so and the test is skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SERVER_THREADS = r"""
import asyncio, json, os, sys, threading
from dualloop.controller.serve.config import ServerConfig
from dualloop.controller.serve.realtime_threads import REALTIME
from dualloop.controller.serve.lifecycle import ServerThread

def priorities():
    out = {}
    for t in os.listdir("/proc/self/task"):
        tid = int(t)
        try:
            policy = os.sched_getscheduler(tid) & ~os.SCHED_RESET_ON_FORK
            out[tid] = os.sched_getparam(tid).sched_priority if policy == os.SCHED_FIFO else 0
        except ProcessLookupError:
            pass
    return out

with ServerThread(ServerConfig(model=sys.argv[1], port=0, realtime_priority=50)) as srv:
    scheduling = srv.call(lambda: srv.server.scheduling)
    # a worker of the loop's default pool (asyncio.to_thread)
    worker = asyncio.run_coroutine_threadsafe(asyncio.to_thread(threading.get_native_id), srv.loop).result(10)
    # a thread a library starts from the loop's thread: normal scheduling (reset on fork) ...
    started = srv.call(lambda: _start_thread())
    before = priorities()
    REALTIME.lower_new_threads()  # ... until the tick loop's next look (about once a second)
    after = priorities()
print(json.dumps({"scheduling": scheduling, "loop": REALTIME.loop_tid, "worker": worker, "started": started,
                  "before": before, "after": after}))
"""

START_THREAD = r"""
import threading
_hold = threading.Event()
def _start_thread():
    t = threading.Thread(target=_hold.wait, daemon=True)
    t.start()
    return t.native_id
"""


def test_the_tick_loop_is_above_every_other_thread_of_the_server(test_model_path: Path):
    script = START_THREAD + SERVER_THREADS
    out = subprocess.run(
        [sys.executable, "-c", script, str(test_model_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    if "refused" in r["scheduling"]:
        pytest.skip(f"no real-time scheduling here: {r['scheduling']}")
    assert r["scheduling"] == "SCHED_FIFO 50 (tick loop; other threads 49)"
    after = {int(k): v for k, v in r["after"].items()}
    assert after.pop(r["loop"]) == 50
    assert len(after) >= 3 and set(after.values()) == {49}, after  # gRPC's threads, the main thread, ...
    assert after[r["worker"]] == 49  # lowered as it started (the pool's initializer)
    assert r["before"][str(r["started"])] == 0 and after[r["started"]] == 49  # placed at the next look


BLAS_THREADS = r"""
import json, time
import numpy as np
from threadpoolctl import threadpool_limits
from dualloop.controller.serve.config import ServerConfig
from dualloop.controller.serve.lifecycle import ServerThread
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES

threadpool_limits(2, user_api="blas")  # a process that came with a BLAS thread per core
x = np.random.default_rng(0).random((384, 384))

def products():  # on the tick loop's thread: its own CPU time and the whole process's
    t0, p0 = time.thread_time(), time.process_time()
    for _ in range(30):
        x @ x
    return time.thread_time() - t0, time.process_time() - p0

server = ServerThread(ServerConfig(model=BASE_MODEL_PATH, gates=list(DEFAULT_GATES), port=0)).start()
try:
    print(json.dumps(server.call(products)))
finally:
    server.stop()
"""


def test_a_server_computes_numpy_products_on_the_loop_thread() -> None:
    """The gates' products at 64 rows and more went to OpenBLAS's thread per core: pinned to one CPU
    (the bench, a container's cpuset) a 128-session tick took 32 ms instead of 6.6 (p50). Judged by
    CPU time, which load does not change: the loop thread's against the whole process's (with a
    second BLAS thread, about half of it). In a process of its own: the limit is the process's."""
    done = subprocess.run([sys.executable, "-c", BLAS_THREADS], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    thread_s, process_s = json.loads(done.stdout.strip().splitlines()[-1])
    assert thread_s > 0.02 and process_s < 1.3 * thread_s, (thread_s, process_s)
