"""The planner fails during a run: its worker process killed, or a remote planner that stops answering.

Documented rules (docs/contract.md#plans, docs/architecture.md): a dead or hung worker is replaced;
a session whose server-made plan has expired is STALE_PLAN (distrust: hold, then fallback) and
recovers with the next plan after the clean dwell. The executor never waits for the planner.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from dualloop.controller.server_process import serve_shipped
from dualloop.planner.behaviour import BehaviourPlanner
from dualloop.planner.plan import Plan, PlanRequest
from dualloop.planner.remote import serve_planner
from tests.controller.chaos.helpers import TIMEOUT_S, Driver, assert_still_serving

pytestmark = pytest.mark.slow


def _stale(s) -> bool:
    return "STALE_PLAN" in s.reasons


def _kill(pids: list[int]) -> int:
    killed = 0
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except ProcessLookupError:
            pass
    return killed


def test_planner_worker_killed_mid_run(tmp_path: Path, drive_rows: np.ndarray) -> None:
    with serve_shipped(tmp_path, {"planner": {"source": "behaviour"}}) as server:
        driver = Driver(server.address, drive_rows)
        first = driver.wait_for(lambda s: s.plan_id != "" and s.state == "NOMINAL")
        planned = driver.snaps[first].plan_id
        # Killed every time it comes back, the worker plans nothing: the last plan expires and the
        # session must say so. Its replacement is spawned by the scheduler each time.
        killed = 0
        stop = threading.Event()

        def keep_killing() -> None:
            nonlocal killed
            while not stop.is_set():
                killed += _kill(server.planner_workers())
                time.sleep(0.02)

        killer = threading.Thread(target=keep_killing, daemon=True)
        killer.start()
        try:
            stale = driver.wait_for(_stale, first)
        finally:
            stop.set()
            killer.join()
        assert killed >= 1
        assert driver.snaps[stale].state in ("VETO_HOLD", "FALLBACK_ACTIVE", "RECOVERING")
        # the server kept ticking for the session meanwhile, and a new worker plans again
        new_plan = driver.wait_for(lambda s: s.plan_id not in ("", planned) and not _stale(s), stale)
        driver.wait_for(lambda s: s.state == "NOMINAL", new_plan)
        assert server.planner_workers(), "no planner worker after the kills"
        assert driver.stop().name == "OK"
        assert server.stats().sessions_open == 0
        assert_still_serving(server, drive_rows)


class _Stallable:
    """The behaviour planner behind a switch: while stalled, a call blocks (up to TIMEOUT_S)."""

    name = "stallable"

    def __init__(self) -> None:
        self.inner = BehaviourPlanner()
        self.running = threading.Event()
        self.running.set()
        self.calls = 0
        self.lock = threading.Lock()

    def plan(self, request: PlanRequest) -> Plan:
        self.running.wait(TIMEOUT_S)
        with self.lock:  # the reference server answers on several threads; the planner is not thread-safe
            self.calls += 1
            return self.inner.plan(request)


def test_remote_planner_stalled(tmp_path: Path, drive_rows: np.ndarray) -> None:
    source = _Stallable()
    with serve_planner(source, max_workers=8) as planner:
        config = {"planner": {"source": "remote", "address": planner.address, "deadline_ms": 200.0}}
        with serve_shipped(tmp_path, config) as server:
            driver = Driver(server.address, drive_rows)
            first = driver.wait_for(lambda s: s.plan_id != "" and s.state == "NOMINAL")
            ticks_before = server.stats().ticks_total
            source.running.clear()  # the remote planner stops answering
            try:
                stale = driver.wait_for(_stale, first)
                planned = driver.snaps[stale].plan_id
                # the executor keeps its tick while the planner hangs: snapshots keep coming, tick after tick
                later = driver.wait_for(lambda s: s.tick >= driver.snaps[stale].tick + 200, stale)
                assert all(_stale(s) for s in driver.snaps[stale:later] if s.plan_id == planned)
                assert server.stats().ticks_total > ticks_before
            finally:
                source.running.set()
            recovered = driver.wait_for(lambda s: s.plan_id != planned and not _stale(s), stale)
            driver.wait_for(lambda s: s.state == "NOMINAL", recovered)
            assert driver.stop().name == "OK"
            assert_still_serving(server, drive_rows)
