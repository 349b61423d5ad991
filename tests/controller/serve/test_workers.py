"""`dualloop serve --workers 2`: two real server processes on one loopback port (SO_REUSEPORT).

Sessions spread over the workers, GetStats and the Prometheus metrics add up what every worker did
(checked against what the clients themselves counted), health answers on every worker, SIGTERM
drains every worker's streams, and a worker killed from outside is restarted (GetStats' totals and
window go on across it), and a parent killed outright leaves nothing behind.
"""

from __future__ import annotations

import json
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from dualloop.controller.contract.client import DriveSession
from dualloop.controller.serve import board as wb
from dualloop.controller.serve.board import Board, LatenessHistogram
from dualloop.controller.serve.runtime import LATENESS_BUCKETS_US
from dualloop.controller.serve.workers import worker_count
from dualloop.controller.server_process import ServerProcess
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc
from tests.controller.serve.test_operations import SERVICE, SERVING, Producer, check, lockstep_steps
from tests.paths import REPO_ROOT

SESSIONS = 16  # one channel (one connection) each: the kernel spreads connections, not streams


class Workers:
    def __init__(self, proc: subprocess.Popen, address: str, metrics: str, stderr: Path) -> None:
        self.proc, self.address, self.metrics, self.stderr = proc, address, metrics, stderr

    def children(self) -> list[int]:
        path = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        return [int(p) for p in path.read_text().split()]

    def stats(self, reset: bool = False) -> pb.GetStatsResponse:
        with grpc.insecure_channel(self.address) as channel:
            return pb_grpc.ControllerServiceStub(channel).GetStats(pb.GetStatsRequest(reset=reset), timeout=10)

    def stats_on_new_connection(self) -> pb.GetStatsResponse:
        """GetStats on a connection of its own: answered by whichever worker the kernel picks."""
        with grpc.insecure_channel(self.address, [("grpc.use_local_subchannel_pool", 1)]) as channel:
            return pb_grpc.ControllerServiceStub(channel).GetStats(pb.GetStatsRequest(), timeout=10)

    def exposition(self) -> str:
        with urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=10) as response:
            return response.read().decode()

    def scrape(self) -> dict[str, float]:
        """name{labels} -> value, the clock label summed away."""
        out: dict[str, float] = {}
        for line in self.exposition().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                key = re.sub(r"\{clock=\"\w+\"\}", "", name)
                out[key] = out.get(key, 0.0) + float(value)
        return out


@pytest.fixture()
def workers(test_model_path: Path, tmp_path: Path) -> Iterator[Workers]:
    with _serve_workers(test_model_path, tmp_path) as started:
        yield started


@contextmanager
def _serve_workers(
    model: Path, tmp_path: Path, extra: Sequence[str] = (), preexec_fn: Callable[[], None] | None = None
) -> Iterator[Workers]:
    cmd = [sys.executable, "-m", "dualloop.controller.cli", "serve", "--model", str(model), *extra]
    cmd += ["--port", "0", "--workers", "2", "--metrics-port", "0", "--drain-grace", "10", "--log-format", "json"]
    stderr = tmp_path / "stderr.jsonl"
    with open(stderr, "w") as err:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=err, text=True, cwd=REPO_ROOT, preexec_fn=preexec_fn
        )
    try:
        assert proc.stdout is not None
        first, second = proc.stdout.readline(), proc.stdout.readline()
        port = re.search(r" on 127\.0\.0\.1:(\d+) with 2 worker processes", first)
        metrics = re.search(r"http://(127\.0\.0\.1:\d+)/metrics", second)
        assert port and metrics, first + second + stderr.read_text()
        yield Workers(proc, f"127.0.0.1:{port.group(1)}", metrics.group(1), stderr)
    finally:
        if proc.poll() is None:  # SIGTERM: the parent stops its workers (SIGKILL would orphan them for a second)
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _wait_for(predicate, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_sessions_spread_and_stats_and_metrics_add_up(workers: Workers) -> None:
    received = 0
    opened = 0
    lockstep_ticks = 0
    for k in range(SESSIONS):
        # a connection of its own per session: without a local subchannel pool, a channel opened right after
        # another one closed can reuse its connection, and so its worker
        with grpc.insecure_channel(workers.address, [("grpc.use_local_subchannel_pool", 1)]) as channel:
            assert check(channel) == SERVING  # health on whichever worker this connection reached
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)  # and reflection
            request = reflection_pb2.ServerReflectionRequest(list_services="")
            [answer] = list(stub.ServerReflectionInfo(iter([request]), timeout=10))
            assert SERVICE in {s.name for s in answer.list_services_response.service}
            clock = pb.CLOCK_MODE_LOCKSTEP if k % 2 else pb.CLOCK_MODE_REALTIME
            session = DriveSession(channel, f"s{k}", clock)
            opened += 1
            if clock == pb.CLOCK_MODE_LOCKSTEP:
                received += len(lockstep_steps(session, 1, 10 + k))
                lockstep_ticks += 10 + k
                session.close()
                assert list(session.snapshots()) == []
            else:
                producer = Producer(session)
                producer.wait_snapshots(5)
                session.close()  # half-close: the server sends what it has and ends the stream OK
                producer.join()
                assert producer.error is None, producer.error
                received += len(producer.snapshots)
    assert lockstep_ticks == sum(10 + k for k in range(1, SESSIONS, 2))

    def settled() -> bool:  # the other worker publishes every 100 ms
        s = workers.stats()
        return s.snapshots_sent_total == received and s.sessions_opened == opened and s.sessions_open == 0

    _wait_for(settled, "GetStats never added up to what the clients received")
    stats = workers.stats()
    per_worker = [int(n) for n in re.search(r"per worker in this window: (\d+), (\d+)", stats.scheduling).groups()]
    assert sum(per_worker) == SESSIONS and min(per_worker) > 0, stats.scheduling  # both workers served
    assert stats.ticks > 0 and sum(stats.lateness_histogram) == stats.ticks
    assert stats.lateness_p50_us <= stats.lateness_p99_us <= stats.lateness_max_us * 1.03

    metrics = workers.scrape()
    assert metrics["dualloop_workers"] == 2
    assert metrics["dualloop_snapshots_sent_total"] == received
    assert metrics["dualloop_sessions_opened_total"] == opened
    assert metrics["dualloop_tick_lateness_seconds_count"] == stats.ticks_total

    # a reset through any worker resets every worker's window
    workers.stats(reset=True)
    _wait_for(lambda: workers.stats().sessions_opened == 0, "the reset did not reach every worker")
    assert workers.stats().snapshots_sent_total == received  # totals since start are kept


def test_an_open_session_id_is_refused_on_every_worker_until_it_closes(workers: Workers) -> None:
    """As one process refuses a second open of an open id: a client reconnecting while its old stream
    lives must not get a second session of the id on the other worker."""
    first = grpc.insecure_channel(workers.address, [("grpc.use_local_subchannel_pool", 1)])
    producer = Producer(DriveSession(first, "car-1", pb.CLOCK_MODE_REALTIME))
    producer.wait_snapshots(5)
    said: set[str] = set()
    for _ in range(64):  # fresh connections until both workers refused (each connection: one in two)
        with grpc.insecure_channel(workers.address, [("grpc.use_local_subchannel_pool", 1)]) as channel:
            with pytest.raises(grpc.RpcError) as refused:
                DriveSession(channel, "car-1", pb.CLOCK_MODE_LOCKSTEP)
            assert refused.value.code() == grpc.StatusCode.ALREADY_EXISTS, refused.value.details()
            said.add(refused.value.details())
            if len(said) == 2:
                break
    other = "session 'car-1' is already open on this server (on another of its worker processes)"
    assert len(said) == 2 and any(s.startswith(other) for s in said), said  # the other worker's words
    assert producer.error is None and producer.session.opened.session_id == "car-1"  # the first goes on
    producer.session.close()
    producer.join()
    first.close()
    _wait_for(lambda: workers.stats().sessions_open == 0, "the session never closed")
    for _ in range(4):  # closed: free on any worker again
        with grpc.insecure_channel(workers.address, [("grpc.use_local_subchannel_pool", 1)]) as channel:
            again = DriveSession(channel, "car-1", pb.CLOCK_MODE_LOCKSTEP)
            assert again.opened.session_id == "car-1"
            again.close()
            assert list(again.snapshots()) == []


def test_sigterm_drains_every_worker(workers: Workers) -> None:
    # a channel of its own per session: channels with the same arguments share one connection
    channels = [grpc.insecure_channel(workers.address, [("grpc.use_local_subchannel_pool", 1)]) for _ in range(8)]
    try:
        producers = [Producer(DriveSession(c, f"rt{k}", pb.CLOCK_MODE_REALTIME)) for k, c in enumerate(channels)]
        for p in producers:
            p.wait_snapshots(10)
        _wait_for(lambda: workers.stats().sessions_open == 8, "not all sessions counted open")
        per_worker = re.search(r"per worker in this window: (\d+), (\d+)", workers.stats().scheduling)
        assert per_worker and min(int(n) for n in per_worker.groups()) > 0, "all sessions on one worker"
        workers.proc.send_signal(signal.SIGTERM)
        for p in producers:
            p.join()
            assert p.error is not None and p.error.code() == grpc.StatusCode.UNAVAILABLE, p.error
            assert "server draining" in p.error.details()
        assert workers.proc.wait(60) == 0
    finally:
        for c in channels:
            c.close()
    assert workers.proc.stdout is not None
    last = workers.proc.stdout.read()
    assert re.search(r"stopped after .* 2 workers: \d+ ticks .* 0 worker restarts", last), last
    drains = [line for line in workers.stderr.read_text().splitlines() if '"server.drain"' in line]
    assert len(drains) == 2  # each worker drained
    starts = [json.loads(line) for line in workers.stderr.read_text().splitlines() if '"server.start"' in line]
    assert len(starts) == 2 and all(s["gc_frozen_objects"] > 10_000 for s in starts)  # each froze its heap


def test_a_killed_worker_is_restarted_and_the_server_keeps_serving(workers: Workers) -> None:
    with grpc.insecure_channel(workers.address) as channel:
        before = DriveSession(channel, "before", pb.CLOCK_MODE_LOCKSTEP)
        lockstep_steps(before, 1, 20)
        # ended by the client: a stream cut by closing the channel may end before its last write is counted
        before.close()
        assert list(before.snapshots()) == []
    _wait_for(lambda: workers.stats().snapshots_sent_total == 20, "the first session's snapshots not counted")
    assert workers.scrape()["dualloop_snapshots_sent_total"] == 20
    # both workers die (so the one that served the session does): its counters must stay in the sums
    first, second = workers.children()
    scraped = []

    def restarted(pid: int) -> bool:
        scraped.append(workers.scrape()["dualloop_snapshots_sent_total"])  # scraped while it dies and restarts
        return pid not in workers.children() and len(workers.children()) == 2

    def serving() -> bool:
        try:
            return "(2 serving)" in workers.stats().scheduling
        except grpc.RpcError:  # the connection reached the worker being replaced
            return False

    for pid in (first, second):  # one after the other: the server serves throughout
        subprocess.run(["kill", "-KILL", str(pid)], check=True)
        _wait_for(lambda pid=pid: restarted(pid), "no restart")
        _wait_for(serving, "the new worker never served", 60)
    assert workers.stats().snapshots_sent_total >= 20  # a dead worker's totals are kept (or were on the other)
    with grpc.insecure_channel(workers.address) as channel:
        after = DriveSession(channel, "after", pb.CLOCK_MODE_LOCKSTEP)
        assert len(lockstep_steps(after, 1, 5)) == 5
        after.close()  # ended by the client: the server's handler counts every snapshot it wrote
        assert list(after.snapshots()) == []
    assert '"server.worker_exit"' in workers.stderr.read_text()
    metrics = workers.scrape()
    assert metrics["dualloop_worker_restarts_total"] == 2
    # a counter (it only grows: rate() and increase() apply), typed as the other counters are
    assert re.search(r"^# TYPE dualloop_worker_restarts(_total)? counter$", workers.exposition(), re.M)
    # the dead worker's 20 and the new session's 5 (its last one is counted just after the client has it)
    deadline = time.monotonic() + 60
    while workers.scrape()["dualloop_snapshots_sent_total"] != 25:
        assert time.monotonic() < deadline, (scraped, workers.scrape(), workers.stats())
    assert scraped and min(scraped) == 20, scraped  # never fell while the workers died and restarted


def test_worker_count_and_the_board_histogram() -> None:
    assert worker_count("3") == 3 and worker_count("auto") >= 1
    with pytest.raises(Exception, match="0: a whole number from 1, or 'auto'"):
        worker_count("0")
    board = Board.create(2, LATENESS_BUCKETS_US)
    try:
        rng = np.random.default_rng(0)
        values = [rng.lognormal(4, 1, 5000).astype(np.int64) * 1000 for _ in range(2)]  # ns
        for slot, v in enumerate(values):
            hist = LatenessHistogram(board.edges)
            hist.add(v)
            board.write(slot, {}, hist.counts)
        merged = board.totals().histogram
        exact = np.percentile(np.concatenate(values) / 1e3, 99)
        (p99,) = board.percentiles_us(merged, [99])
        assert exact <= p99 <= exact * 1.021  # the bin's upper edge: never below the truth, 2% above at most
        all_us = np.concatenate(values) / 1e3
        expect = np.bincount(np.searchsorted(LATENESS_BUCKETS_US, all_us, side="left"), minlength=13)
        assert board.coarse(merged) == expect.tolist()
        # ticks all under the first bin's edge (a precise ticker): no percentile above the exact max
        hist = LatenessHistogram(board.edges)
        hist.add(np.array([20, 44, 31], dtype=np.int64))  # ns
        assert board.percentiles_us(hist.counts, [50, 99]) == [board.edges[0]] * 2
        assert board.percentiles_us(hist.counts, [50, 99], max_us=0.044) == [0.044, 0.044]
    finally:
        board.close()


def test_workers_drain_and_exit_when_the_parent_is_killed(workers: Workers) -> None:
    children = workers.children()
    argv = Path(f"/proc/{children[0]}/cmdline").read_text().split("\0")
    parent_tmp = Path(argv[argv.index("--config-json") + 1]).parent  # the parent's folder: the configuration
    assert (parent_tmp / "config.json").exists()
    workers.proc.kill()  # SIGKILL: nothing is forwarded
    workers.proc.wait(10)

    def gone() -> bool:
        return not any(Path(f"/proc/{pid}").exists() and "zombie" not in _state(pid) for pid in children)

    _wait_for(gone, "the workers kept serving without their parent", 30)
    assert not list(Path("/dev/shm").glob(f"dualloop-board-{workers.proc.pid}-*"))  # nothing left behind
    assert not parent_tmp.exists(), list(parent_tmp.iterdir())  # nor the configuration, in the temp folder


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0].lower()
    except (OSError, IndexError):
        return "zombie"


def test_the_board_keeps_a_retired_workers_totals_and_window() -> None:
    """A worker that ends (retire, then another process in its slot): every total since start and the
    window's counts keep what it published; only a reset starts the window again."""
    board = Board.create(2, LATENESS_BUCKETS_US)
    try:
        hist = LatenessHistogram(board.edges)
        hist.add(np.array([1_000, 2_000], dtype=np.int64))  # ns
        board.write(0, {wb.TICKS: 10, wb.TICKS_TOTAL: 30, wb.RECORDS_DROPPED: 7, wb.LATENESS_MAX_US: 2.0}, hist.counts)
        board.write(1, {wb.TICKS: 4, wb.TICKS_TOTAL: 4, wb.RECORDS_DROPPED: 1}, None)
        before = board.totals()
        assert (before.ticks, before.ticks_total, before.records_dropped) == (14, 34, 8)
        board.retire(0)
        board.write(0, {wb.TICKS: 1, wb.TICKS_TOTAL: 1}, np.zeros_like(hist.counts))  # its successor
        after = board.totals()
        assert (after.ticks, after.ticks_total, after.records_dropped) == (15, 35, 8)
        assert after.window_start_ns == before.window_start_ns == after.started_ns
        assert after.histogram.sum() == 2 and after.lateness_max_us == 2.0
        board.request_reset()
        reset = board.totals()
        assert (reset.ticks, reset.histogram.sum(), reset.lateness_max_us) == (0, 0, 0.0)  # until each publishes
        assert (reset.ticks_total, reset.records_dropped) == (35, 8) and reset.window_start_ns > after.window_start_ns
        board.write(1, {wb.TICKS: 3}, None)  # worker 1 reset its window and published
        assert board.totals().ticks == 3
    finally:
        board.close()


RECORD_LIMIT_BYTES = 64 * 1024  # each worker's recording fills it within a second or two of a session


def _small_disk() -> None:
    """In the server's processes: a file grows to RECORD_LIMIT_BYTES, the write past it fails (EFBIG,
    as on a full disk) and the recorder drops what follows (tests/controller/chaos/test_recorder_disk_full.py)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (RECORD_LIMIT_BYTES, RECORD_LIMIT_BYTES))


def test_a_restart_keeps_the_totals_and_the_window_of_getstats(test_model_path: Path, tmp_path: Path) -> None:
    """Both workers killed in turn while REALTIME sessions recorded onto a full disk: GetStats on any
    worker (the new ones too) never counts less than before, and its window goes on from the start."""
    extra = ["--record-dir", str(tmp_path / "rec")]
    with _serve_workers(test_model_path, tmp_path, extra, preexec_fn=_small_disk) as workers:
        channels = [grpc.insecure_channel(workers.address, [("grpc.use_local_subchannel_pool", 1)]) for _ in range(4)]
        try:
            producers = [Producer(DriveSession(c, f"r{k}", pb.CLOCK_MODE_REALTIME)) for k, c in enumerate(channels)]
            _wait_for(lambda: workers.stats().records_dropped_total > 100, "nothing dropped", 120)
            before = workers.stats()
            for pid in workers.children():  # one after the other: every session's worker dies
                subprocess.run(["kill", "-KILL", str(pid)], check=True)
                _wait_for(lambda pid=pid: pid not in workers.children() and len(workers.children()) == 2, "no restart")
                _wait_for(lambda: "(2 serving)" in _scheduling(workers), "the new worker never served", 120)
            for p in producers:
                p.join()
        finally:
            for c in channels:
                c.close()
        for _ in range(20):  # connections of their own: some reach each new worker
            s = workers.stats_on_new_connection()
            assert s.records_dropped_total >= before.records_dropped_total, (s, before)
            assert s.ticks_total >= before.ticks_total and s.snapshots_sent_total >= before.snapshots_sent_total
            # no reset: the window is still the server's whole life, and holds what the dead workers counted
            assert s.window_s >= before.window_s and abs(s.window_s - s.uptime_s) < 1e-3, (s, before)
            assert s.ticks >= before.ticks and s.snapshots_sent >= before.snapshots_sent, (s, before)
            assert s.ticks <= 2 * s.window_s / 0.005 + 10, s  # a rate no two workers' 5 ms ticks exceed


def _scheduling(workers: Workers) -> str:
    try:
        return workers.stats().scheduling
    except grpc.RpcError:  # the connection reached the worker being replaced
        return ""


def test_the_workers_start_line_says_what_one_process_says_about_security(
    test_model_path: Path, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("admin:start-line-test-token-0123456789\n")
    said = {}
    for n in (1, 2):
        srv = ServerProcess(["--model", str(test_model_path), "--tokens-file", str(tokens), "--workers", str(n)])
        try:
            line = srv.stdout_text().splitlines()[0]
        finally:
            srv.stop(sig=signal.SIGTERM)  # its exit code is not under test (a signal before its handlers: 143)
        match = re.search(r", ([^,]+, [^,.]+)\. Ctrl-C stops\.$", line)
        assert match, line
        said[n] = match.group(1)
    assert said[1] == said[2] == "plaintext, authentication on", said


def test_no_writable_temporary_folder_is_said_with_the_way_out(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Found by QA: `docker run --read-only ... serve --workers 2` said only "[Errno 2] No usable
    temporary directory found"."""
    from dualloop.controller.contract.errors import ConfigError
    from dualloop.controller.serve import workers as workers_module

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "read-only"))  # what gettempdir found: nothing
    with pytest.raises(ConfigError, match=r"needs a writable temporary folder .*\(docker run --tmpfs /tmp\)"):
        workers_module._workers_folder()
