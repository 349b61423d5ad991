"""PlanScheduler with real worker processes: delivery, latest-wins, errors, hangs, restarts, shutdown."""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import time

import numpy as np
import pytest

from planner.behaviour import BehaviourPlanner
from planner.plan import Plan, PlanRequest, make_plan_id
from planner.scheduler import PlanScheduler
from sim.schema import FEATURE_INDEX, N_FEATURES, SENSOR_RANGE_M

PERIOD_S = 0.2
POISON = 999.0  # an ego speed that makes HangingSource hang


def features(v: float = 20.0) -> np.ndarray:
    x = np.zeros(N_FEATURES, np.float32)
    x[FEATURE_INDEX["ego_speed"]] = v
    for name in ("lead_distance", "left_front_gap", "left_rear_gap", "right_front_gap", "right_rear_gap"):
        x[FEATURE_INDEX[name]] = SENSOR_RANGE_M
    x[FEATURE_INDEX["left_lane_exists"]] = 1.0
    return x


class RaisingSource:
    name = "raising"

    def plan(self, request: PlanRequest) -> Plan:
        raise RuntimeError(f"planner bug for {request.session_id}")


class HangingSource:
    """Plans instantly, except that it hangs on a poisoned observation (or always, if told to)."""

    def __init__(self, always: bool = False) -> None:
        self.name = "hanging"
        self.always = always

    def plan(self, request: PlanRequest) -> Plan:
        if self.always or request.features[FEATURE_INDEX["ego_speed"]] == POISON:
            time.sleep(60.0)
        return Plan(make_plan_id(self.name, request.session_id, request.now_ns), request.session_id,
                    request.now_ns, 10**9, self.name, "keep", 20.0, 0.0)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); a reaped process does not exist. /proc tells them apart.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def wait_for(predicate, timeout_s: float, sched: PlanScheduler, collected: list[Plan]) -> bool:
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        collected.extend(sched.poll())
        if predicate():
            return True
        time.sleep(0.005)
    return False


def test_good_source_delivers_plans_within_two_periods():
    with PlanScheduler(BehaviourPlanner, period_s=PERIOD_S) as sched:
        pid = sched.stats()["worker_pid"]
        assert pid is not None and pid != os.getpid()
        got: list[Plan] = []
        for k in range(5):
            sent = time.monotonic()
            now_ns = k * int(PERIOD_S * 1e9)
            for s in ("car-1", "car-2", "car-3"):
                sched.request(s, features(), now_ns)
            before = len(got)
            assert wait_for(lambda: len(got) >= before + 3, 2 * PERIOD_S, sched, got), sched.stats()
            assert time.monotonic() - sent < 2 * PERIOD_S
            assert {p.session_id for p in got[before:]} == {"car-1", "car-2", "car-3"}
            assert all(p.created_ns == now_ns and p.source == "behaviour" for p in got[before:])
        stats = sched.stats()
        assert stats["plans"] == 15 and stats["errors"] == stats["timeouts"] == stats["overruns"] == 0
        assert 0 < stats["plan_time_us_p50"] < 50_000
    assert not pid_alive(pid)
    assert mp.active_children() == []


def test_latest_wins_and_overruns_are_counted():
    with PlanScheduler(functools.partial(HangingSource), period_s=PERIOD_S, deadline_s=5.0) as sched:
        # Poison car-1 so the worker is busy; car-2's requests pile up and replace one another.
        sched.request("car-1", features(POISON), 0)
        time.sleep(0.05)
        for k in range(5):
            sched.request("car-2", features(float(k)), k)
        stats = sched.stats()
        assert stats["replaced"] == 4 and stats["overruns"] == 4 and stats["pending"] == 1
        sched.forget("car-2")
        assert sched.stats()["pending"] == 0


def test_raising_source_counts_errors_and_request_poll_stay_cheap():
    with PlanScheduler(RaisingSource, period_s=PERIOD_S) as sched:
        request_s, poll_s = [], []
        x = features()
        end = time.monotonic() + 1.0
        k = 0
        while time.monotonic() < end:
            t0 = time.perf_counter()
            sched.request(f"car-{k % 4}", x, k)
            t1 = time.perf_counter()
            assert sched.poll() == []
            t2 = time.perf_counter()
            request_s.append(t1 - t0)
            poll_s.append(t2 - t1)
            k += 1
            time.sleep(0.002)
        stats = sched.stats()
        assert stats["errors"] > 10 and stats["plans"] == 0
        assert "RuntimeError: planner bug" in stats["last_error"]
        for name, samples in (("request", request_s), ("poll", poll_s)):
            p99 = float(np.percentile(samples, 99))
            assert p99 < 1e-3, f"{name} p99 {p99 * 1e6:.0f} us"
            assert max(samples) < 0.05, f"{name} max {max(samples) * 1e3:.1f} ms"


def test_hung_worker_times_out_and_is_replaced():
    deadline_s = 0.3
    with PlanScheduler(HangingSource, period_s=PERIOD_S, deadline_s=deadline_s) as sched:
        first_pid = sched.stats()["worker_pid"]
        t0 = time.perf_counter()
        sched.request("car-1", features(POISON), 0)
        assert time.perf_counter() - t0 < 1e-3
        got: list[Plan] = []
        assert wait_for(lambda: sched.stats()["timeouts"] == 1, deadline_s + 1.0, sched, got)
        # Killed at once, reaped by a later poll (never waited for inside one).
        assert wait_for(lambda: not pid_alive(first_pid), 2.0, sched, got)
        # The replacement worker (fresh process, same source) plans normal requests again.
        sched.request("car-1", features(), 1)
        assert wait_for(lambda: len(got) == 1, 30.0, sched, got), sched.stats()
        stats = sched.stats()
        assert stats["restarts"] == 1 and stats["worker_pid"] not in (None, first_pid)
        assert got[0].created_ns == 1


def test_always_hanging_source_recovers_when_replaced():
    with PlanScheduler(functools.partial(HangingSource, always=True), period_s=PERIOD_S, deadline_s=0.2) as sched:
        got: list[Plan] = []
        sched.request("car-1", features(), 0)
        assert wait_for(lambda: sched.stats()["timeouts"] >= 1, 2.0, sched, got)
        assert got == []
        sched.replace_source(BehaviourPlanner)
        sched.request("car-1", features(), 1)
        assert wait_for(lambda: len(got) >= 1, 30.0, sched, got), sched.stats()
        assert got[-1].source == "behaviour"


def test_thread_mode_also_isolates_errors():
    with PlanScheduler(RaisingSource, mode="thread") as sched:
        assert sched.stats()["worker_pid"] is None
        got: list[Plan] = []
        sched.request("car-1", features(), 0)
        assert wait_for(lambda: sched.stats()["errors"] == 1, 2.0, sched, got)
        sched.replace_source(BehaviourPlanner)
        sched.request("car-1", features(), 1)
        assert wait_for(lambda: len(got) == 1, 5.0, sched, got)


def test_a_source_that_cannot_be_built_fails_start_with_its_error(tmp_path):
    from planner.onnx_planner import OnnxPlanner

    missing = tmp_path / "nope.onnx"
    sched = PlanScheduler(functools.partial(OnnxPlanner, str(missing)))
    with pytest.raises(RuntimeError, match="nope.onnx"):
        sched.start(timeout_s=30.0)
    assert mp.active_children() == []
