"""The Prometheus endpoint: real servers, scraped over HTTP, parsed with prometheus-client's own parser,
and checked against GetStats and against what the sessions received."""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from dualloop.controller.contract.client import DriveSession, realtime_channel
from dualloop.controller.logs.logfile import read_log
from dualloop.controller.logs.synthetic import synthetic_log
from dualloop.controller.replay.lockstep import _observations
from dualloop.controller.serve.config import ServerConfig, load_server_config
from dualloop.controller.serve.lifecycle import ServerThread
from dualloop.controller.serve.runtime import LATENESS_BUCKETS_US
from dualloop.executor.snapshot import Observation
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> tuple[Samples, dict[str, str]]:
    """Every sample by (name, labels), and every family's type, parsed by prometheus-client."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples: Samples = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples, types


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def stats(channel: grpc.Channel) -> pb.GetStatsResponse:
    return pb_grpc.ControllerServiceStub(channel).GetStats(pb.GetStatsRequest())


@pytest.fixture(scope="module")
def driving(tmp_path_factory) -> list[Observation]:
    """Ordinary 100 Hz driving (after the first 0.6 s, which the input gate flags)."""
    log = synthetic_log(Path(tmp_path_factory.mktemp("metrics")) / "syn.mcap", seconds=3.0, rate_hz=100.0)
    return _observations(read_log(log))[60:160]


class RealtimeClient:
    """A REALTIME session sending observations every 5 ms (ordinary ones, every 10th out of range)
    and keeping every snapshot it reads."""

    def __init__(self, address: str, driving: list[Observation]) -> None:
        self.channel = realtime_channel(address)
        self.session = DriveSession(self.channel, "rt", pb.CLOCK_MODE_REALTIME)
        self.snaps: list[pb.DecisionSnapshot] = []
        self._driving = driving
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=f, daemon=True) for f in (self._send, self._read)]
        for t in self._threads:
            t.start()

    def _send(self) -> None:
        seq = 0
        while not self._stop.is_set():
            features = self._driving[seq % len(self._driving)].features.copy()
            seq += 1
            if seq % 10 == 0:
                features[0] = 200.0  # ego_speed far above the fitted range: OOD_VETO
            self.session.send(seq, time.monotonic_ns(), features.tolist())
            time.sleep(0.005)

    def _read(self) -> None:
        for snap in self.session.snapshots():
            self.snaps.append(snap)

    def close(self) -> None:
        self._stop.set()
        self._threads[0].join(5)
        self.session.close()
        self._threads[1].join(10)
        self.channel.close()


def drive_lockstep(channel: grpc.Channel, driving: list[Observation]) -> list[pb.DecisionSnapshot]:
    """A LOCKSTEP session with one out-of-range observation (an OOD_VETO) and two observations between
    grid ticks, the first replaced by the second before a tick used it (an observation dropped)."""
    session = DriveSession(channel, "ls", pb.CLOCK_MODE_LOCKSTEP)
    seq = 0
    for k, o in enumerate(driving[:60]):
        features = o.features.copy()
        if k == 40:
            features[0] = 200.0
        seq += 1
        session.send(seq, o.timestamp_ns, features.tolist())
        if k == 20:  # 1 ms and 2 ms after an on-grid observation (5 ms ticks): the 1 ms one is never used
            for dt in (1_000_000, 2_000_000):
                seq += 1
                session.send(seq, o.timestamp_ns + dt, features.tolist())
    session.close()
    return list(session.snapshots())


def test_scrape_agrees_with_get_stats_and_with_what_the_sessions_received(tmp_path: Path, driving) -> None:
    config = ServerConfig(
        model=BASE_MODEL_PATH, gates=list(DEFAULT_GATES), port=0, metrics_port=0, record_dir=tmp_path / "rec"
    )
    with ServerThread(config) as srv, grpc.insecure_channel(srv.address) as channel:
        port = srv.server.metrics_port
        assert port is not None and port > 0
        rt = RealtimeClient(srv.address, driving)
        idle = DriveSession(channel, "ls-idle", pb.CLOCK_MODE_LOCKSTEP)  # open, never fed
        ls = drive_lockstep(channel, driving)
        deadline = time.monotonic() + 30
        while sum(pb.CHECK_INPUT_RANGE in s.vetoed_by for s in rt.snaps) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)

        received = list(rt.snaps)  # made before the scrape, so counted by it
        before = stats(channel)
        samples, types = scrape(port)
        after = stats(channel)

        # ticks and lateness: the same increments as GetStats, read between two GetStats calls
        count = value(samples, "dualloop_tick_lateness_seconds_count")
        assert before.ticks_total <= count <= after.ticks_total and count > 0
        bounds = [f"{b / 1e6!r}" for b in LATENESS_BUCKETS_US] + ["+Inf"]
        buckets = [value(samples, "dualloop_tick_lateness_seconds_bucket", le=b) for b in bounds]
        assert buckets[-1] == count
        # GetStats' histogram covers the same ticks (its window was never reset): cumulative, bounded
        for lo, got, hi in zip(
            np.cumsum(list(before.lateness_histogram)), buckets, np.cumsum(list(after.lateness_histogram))
        ):
            assert lo <= got <= hi
        assert value(samples, "dualloop_tick_lateness_seconds_sum") >= 0
        missed = value(samples, "dualloop_missed_deadlines_total")
        assert before.missed_deadlines_total <= missed <= after.missed_deadlines_total
        assert value(samples, "dualloop_tick_work_seconds_count") == count
        assert value(samples, "dualloop_tick_work_seconds_sum") > 0
        sent = value(samples, "dualloop_snapshots_sent_total")
        assert before.snapshots_sent_total <= sent <= after.snapshots_sent_total

        # sessions
        assert before.sessions_open == after.sessions_open == 2
        assert value(samples, "dualloop_sessions_open", clock="REALTIME") == 1
        assert value(samples, "dualloop_sessions_open", clock="LOCKSTEP") == 1
        assert value(samples, "dualloop_sessions_opened_total", clock="REALTIME") == 1
        assert value(samples, "dualloop_sessions_opened_total", clock="LOCKSTEP") == 2

        # LOCKSTEP, closed before the scrape: exactly what the session received
        assert value(samples, "dualloop_decisions_total", clock="LOCKSTEP") == len(ls)
        reasons = collections.Counter(pb.ReasonCode.Name(r).removeprefix("REASON_CODE_") for s in ls for r in s.reasons)
        assert reasons["OOD_VETO"] > 0
        for name in ("OOD_VETO", "LOW_MARGIN", "STALE_OBSERVATION", "INVALID_INPUT", "FALLBACK", "SAFE_DEFAULT"):
            assert value(samples, "dualloop_reasons_total", clock="LOCKSTEP", reason=name) == reasons[name], name
        states = collections.Counter(pb.SafetyState.Name(s.safety_state).removeprefix("SAFETY_STATE_") for s in ls)
        for name in ("NOMINAL", "VETO_HOLD", "FALLBACK_ACTIVE", "RECOVERING"):
            assert value(samples, "dualloop_safety_state_total", clock="LOCKSTEP", state=name) == states[name], name
        vetoes = collections.Counter(pb.Check.Name(c).removeprefix("CHECK_") for s in ls for c in s.vetoed_by)
        assert vetoes["INPUT_RANGE"] > 0
        for name in ("DECISION_VECTOR_DENSITY", "INPUT_DENSITY", "INPUT_RANGE", "INPUT_CHANGE", "FREEZE", "MARGIN"):
            assert value(samples, "dualloop_check_vetoes_total", clock="LOCKSTEP", check=name) == vetoes[name], name
        assert ls[-1].observations_dropped == 1
        assert value(samples, "dualloop_observations_dropped_total", clock="LOCKSTEP") == 1

        # REALTIME, still running: at least what the client had received before the scrape
        decisions = value(samples, "dualloop_decisions_total", clock="REALTIME")
        assert decisions >= len(received) > 0
        got = collections.Counter(
            pb.ReasonCode.Name(r).removeprefix("REASON_CODE_") for s in received for r in s.reasons
        )
        assert got["OOD_VETO"] >= 3
        for name, n in got.items():
            assert value(samples, "dualloop_reasons_total", clock="REALTIME", reason=name) >= n, name
        got = collections.Counter(pb.Check.Name(c).removeprefix("CHECK_") for s in received for c in s.vetoed_by)
        assert got["INPUT_RANGE"] >= 3
        for name, n in got.items():
            assert value(samples, "dualloop_check_vetoes_total", clock="REALTIME", check=name) >= n, name
        assert (
            sum(
                value(samples, "dualloop_safety_state_total", clock="REALTIME", state=name)
                for name in ("NOMINAL", "VETO_HOLD", "FALLBACK_ACTIVE", "RECOVERING")
            )
            == decisions
        )
        assert value(samples, "dualloop_snapshots_dropped_total") >= max(s.snapshots_dropped for s in received)

        # one atomic reading: every row the executor decided is one snapshot of one clock
        rows = value(samples, "dualloop_tick_rows_total")
        assert rows == decisions + len(ls)
        batches = value(samples, "dualloop_tick_stage_seconds_count", stage="forward")
        assert 0 < batches <= rows and value(samples, "dualloop_tick_stage_seconds_sum", stage="forward") > 0

        # the recorder: nothing dropped, never more written than decided
        assert value(samples, "dualloop_recorder_queue_depth") >= 0
        assert value(samples, "dualloop_recorder_dropped_total", kind="snapshot") == 0
        assert 0 <= value(samples, "dualloop_recorder_written_total", kind="snapshot") <= rows

        assert types["dualloop_tick_lateness_seconds"] == "histogram"
        assert types["dualloop_tick_stage_seconds"] == "summary"
        assert types["dualloop_sessions_open"] == "gauge"
        assert types["dualloop_reasons"] == "counter"
        assert not any(name.startswith("dualloop_planner") for name in types)  # no planner configured

        # after the REALTIME session: its drops stay counted, its gauge goes back to 0
        rt.close()
        idle.close()
        deadline = time.monotonic() + 10
        while stats(channel).sessions_open and time.monotonic() < deadline:
            time.sleep(0.01)
        later, _ = scrape(port)
        assert value(later, "dualloop_sessions_open", clock="REALTIME") == 0
        assert value(later, "dualloop_sessions_open", clock="LOCKSTEP") == 0
        assert value(later, "dualloop_decisions_total", clock="REALTIME") >= len(rt.snaps) + max(
            s.snapshots_dropped for s in rt.snaps
        )
        assert value(later, "dualloop_snapshots_dropped_total") >= max(s.snapshots_dropped for s in rt.snaps)
        assert (
            value(later, "dualloop_observations_dropped_total", clock="REALTIME") >= rt.snaps[-1].observations_dropped
        )
        assert value(later, "dualloop_tick_lateness_seconds_count") >= count


def test_off_by_default_loopback_only_and_one_registry_per_server(test_model_path: Path) -> None:
    with ServerThread(ServerConfig(model=test_model_path, port=0)) as srv:
        assert srv.server.metrics_port is None and srv.server.runtime.metrics is None
    with pytest.raises(ValidationError, match="metrics_host '0.0.0.0' is not a loopback address"):
        ServerConfig(model=test_model_path, metrics_port=9100, metrics_host="0.0.0.0")
    assert ServerConfig(model=test_model_path, metrics_port=9100, metrics_host="::1").metrics_host == "::1"
    assert load_server_config(None, model=test_model_path, metrics_port=0).metrics_port == 0
    # two servers in one process: each scrape reports its own server only
    config = ServerConfig(model=test_model_path, port=0, metrics_port=0)
    with ServerThread(config) as a, ServerThread(config) as b, grpc.insecure_channel(a.address) as channel:
        assert a.server.metrics_port != b.server.metrics_port
        session = DriveSession(channel, "only-on-a", pb.CLOCK_MODE_LOCKSTEP)
        n = len(session.opened.model.features)
        for k in range(5):
            session.send(k + 1, k * 5_000_000, [0.1] * n)
        session.close()
        snaps = list(session.snapshots())
        on_a, _ = scrape(a.server.metrics_port)
        on_b, _ = scrape(b.server.metrics_port)
        assert value(on_a, "dualloop_sessions_opened_total", clock="LOCKSTEP") == 1
        assert value(on_a, "dualloop_decisions_total", clock="LOCKSTEP") == len(snaps) == 5
        assert value(on_b, "dualloop_sessions_opened_total", clock="LOCKSTEP") == 0
        assert value(on_b, "dualloop_decisions_total", clock="LOCKSTEP") == 0
    with ServerThread(config) as c:  # stopped: the port is free again
        port = c.server.metrics_port
    with pytest.raises(OSError):
        scrape(port)


@pytest.mark.slow
def test_planner_metrics_agree_with_the_scheduler(driving) -> None:
    config = ServerConfig(
        model=BASE_MODEL_PATH, port=0, metrics_port=0, planner={"source": "behaviour", "period_ms": 50.0}
    )
    with ServerThread(config) as srv, grpc.insecure_channel(srv.address) as channel:
        planning = srv.server.runtime.planning
        rt = RealtimeClient(srv.address, driving)
        ls = drive_lockstep(channel, driving)  # 0.6 s of observation time: a plan every 50 ms of it
        deadline = time.monotonic() + 30
        while srv.call(lambda: planning.scheduler.counts()["plans"]) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        before = srv.call(planning.scheduler.counts)
        samples, types = scrape(srv.server.metrics_port)
        after = srv.call(planning.scheduler.counts)
        rt.close()
        assert ls and types["dualloop_planner_latency_seconds"] == "histogram"
        plans = value(samples, "dualloop_planner_plans_total", clock="REALTIME")
        assert 3 <= before["plans"] <= plans <= after["plans"]
        # every plan handed out was answered first, and its latency counted then
        assert value(samples, "dualloop_planner_latency_seconds_count") >= plans
        assert value(samples, "dualloop_planner_latency_seconds_sum") > 0
        lockstep = srv.call(lambda: dict(planning.lockstep.counts))  # the stream has ended: stable
        assert value(samples, "dualloop_planner_plans_total", clock="LOCKSTEP") == lockstep["plans"] > 0
        assert value(samples, "dualloop_planner_errors_total", clock="LOCKSTEP") == lockstep["errors"]
        for name in ("overruns", "restarts"):
            assert before[name] <= value(samples, f"dualloop_planner_{name}_total") <= after[name]


@pytest.mark.slow
def test_cli_serve_metrics_port_and_host(test_model_path: Path) -> None:
    serve = [sys.executable, "-m", "dualloop.controller.cli", "serve", "--model", str(test_model_path), "--port", "0"]
    refused = subprocess.run(
        [*serve, "--metrics-port", "0", "--metrics-host", "203.0.113.5"], capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 2
    assert "metrics_host '203.0.113.5' is not a loopback address" in refused.stdout + refused.stderr
    proc = subprocess.Popen(
        [*serve, "--metrics-port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, COLUMNS="200"),
    )
    try:
        proc.stdout.readline()  # the start line
        match = re.search(r"metrics: http://127\.0\.0\.1:(\d+)/metrics", proc.stdout.readline())
        assert match
        samples, _ = scrape(int(match.group(1)))
        assert value(samples, "dualloop_sessions_open", clock="REALTIME") == 0
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
