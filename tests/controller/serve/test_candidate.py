"""A candidate model beside the live one, on live loopback servers with real ONNX files: it decides
on the same ticks and is never applied; GetShadowStats compares it; an admin promotes it mid-stream
(or SIGHUP does); a candidate of another schema, or without matching gates, is refused."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from dualloop.controller.contract.client import DriveSession
from dualloop.controller.contract.shadow import CandidateTally
from dualloop.controller.logs.logfile import read_sessions
from dualloop.controller.serve.config import ServerConfig
from dualloop.controller.serve.lifecycle import ServerThread
from dualloop.controller.serve.security import AuthConfig
from dualloop.controller.training.driving_card import build_test_model, driving_card
from dualloop.executor.candidate import SwapRefused
from dualloop.executor.config import ExecutorConfig
from dualloop.executor.core import Executor
from dualloop.executor.history import DEFAULT_HISTORY
from dualloop.executor.model_runner import DecisionModel
from dualloop.executor.onnx_export import export_mlp, random_mlp
from dualloop.executor.snapshot import Observation
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc
from tests.controller.serve.inputs import MS, sensor

ADMIN = "admin-token-0123456789abcdef"
USER = "user-token-0123456789abcdef"
ADMIN_MD = (("authorization", f"Bearer {ADMIN}"),)
USER_MD = (("authorization", f"Bearer {USER}"),)
WALL_CLOCK = ("emit_time_ns", "lateness_us", "timings", "max_lateness_since_previous_us")


@pytest.fixture(scope="module")
def candidate_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test model's schema, other (seeded random) weights: a candidate that disagrees sometimes."""
    path = tmp_path_factory.mktemp("cand") / "candidate.onnx"
    export_mlp(random_mlp(25, (32, 48), 4, 2, seed=3), driving_card("candidate", "test", 48), path)
    return path


@pytest.fixture(scope="module")
def history_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model that needs history features the live test model's sessions do not derive."""
    path = tmp_path_factory.mktemp("hist") / "history.onnx"
    build_test_model(path, history=DEFAULT_HISTORY)
    return path


@pytest.fixture()
def tokens(tmp_path: Path) -> Path:
    path = tmp_path / "tokens"
    path.write_text(f"admin:{ADMIN}\n{USER}\n")
    return path


@pytest.fixture()
def start(test_model_path: Path) -> Iterator:
    servers: list[ServerThread] = []

    def run(**settings: object) -> ServerThread:
        settings.setdefault("model", test_model_path)
        srv = ServerThread(ServerConfig(port=0, **settings)).start()  # type: ignore[arg-type]
        servers.append(srv)
        return srv

    yield run
    for srv in servers:
        srv.stop()


def drive_lockstep(channel: grpc.Channel, seqs: range, session_id: str = "s") -> list[pb.DecisionSnapshot]:
    """A LOCKSTEP shadow session with the actual action known: one snapshot per observation (20 ms apart
    and the 5 ms grid: the first observation gives 1 tick, each next 4)."""
    session = DriveSession(channel, session_id, pb.CLOCK_MODE_LOCKSTEP, shadow=True)
    snaps = []
    for seq in seqs:
        session.send(seq, seq * 20 * MS, sensor(seq), actual_index=seq % 4, actual_controls=[0.0, 0.0])
        snaps += [session.recv() for _ in range(1 if seq == seqs[0] else 4)]
    session.close()
    return snaps


def without_wall_clock(snap: pb.DecisionSnapshot) -> pb.DecisionSnapshot:
    out = pb.DecisionSnapshot()
    out.CopyFrom(snap)
    for name in WALL_CLOCK:
        out.ClearField(name)  # type: ignore[arg-type]
    out.ClearField("candidate_never_applied")
    return out


class _Token(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds a bearer token to every call that carries none (the Drive streams of DriveSession)."""

    def __init__(self, token: str) -> None:
        self.metadata = (("authorization", f"Bearer {token}"),)

    def _details(self, details):  # type: ignore[no-untyped-def]
        if details.metadata:
            return details
        return details._replace(metadata=self.metadata)

    def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return continuation(self._details(details), request)

    def intercept_stream_stream(self, continuation, details, requests):  # type: ignore[no-untyped-def]
        return continuation(self._details(details), requests)


def user_channel(address: str) -> grpc.Channel:
    return grpc.intercept_channel(grpc.insecure_channel(address), _Token(USER))


def stub(channel: grpc.Channel) -> pb_grpc.ControllerServiceStub:
    return pb_grpc.ControllerServiceStub(channel)


def test_candidate_decides_every_tick_and_is_never_applied(start, candidate_path):
    plain = start()
    beside = start(candidate=candidate_path)
    with grpc.insecure_channel(plain.address) as a, grpc.insecure_channel(beside.address) as b:
        alone = drive_lockstep(a, range(1, 41))
        with_candidate = drive_lockstep(b, range(1, 41))
        stats = stub(b).GetShadowStats(pb.GetShadowStatsRequest(session_id="s"), timeout=10)
        info = stub(b).GetModelInfo(pb.GetModelInfoRequest(), timeout=10).model
    cand_version = DecisionModel(candidate_path, warmup_batches=()).card.version
    assert len(alone) == len(with_candidate) == 157
    live_versions = {s.model_version for s in with_candidate}
    assert live_versions == {info.model_version} != {cand_version}
    for x, y in zip(alone, with_candidate):
        assert not x.HasField("candidate_never_applied")
        assert y.candidate_never_applied.model_version == cand_version
        # what the server applied (and every other field) is what it applies without the candidate
        assert without_wall_clock(x) == without_wall_clock(y)
    # the candidate really is another model: it disagrees with the live one on some ticks
    live = np.array([s.proposed.action.index for s in with_candidate])
    cand = np.array([s.candidate_never_applied.action.index for s in with_candidate])
    assert (cand >= 0).all() and 0 < np.count_nonzero(live != cand) < len(live)
    # GetShadowStats: the same counts from the snapshots
    c = stats.candidate
    n_act = len(stats.actions)
    expected = np.zeros((n_act, n_act), np.int64)
    np.add.at(expected, (live, cand), 1)
    assert (c.candidate_version, c.live_version) == (cand_version, info.model_version)
    assert c.ticks == c.compared == len(with_candidate)
    assert np.array_equal(np.array(c.migration).reshape(n_act, n_act), expected)
    assert c.agreeing_with_live_proposed == np.count_nonzero(live == cand)
    applied = np.array([s.applied.index for s in with_candidate])
    assert c.agreeing_with_applied == np.count_nonzero(applied == cand)
    actual = np.array([s.observation_seq % 4 for s in with_candidate])
    assert c.with_actual == len(with_candidate)
    assert c.candidate_agreeing_with_actual == np.count_nonzero(cand == actual)
    assert c.live_agreeing_with_actual == np.count_nonzero(live == actual)


def test_candidate_decisions_are_recorded(start, candidate_path, tmp_path):
    srv = start(candidate=candidate_path, record_dir=tmp_path / "rec")
    with grpc.insecure_channel(srv.address) as ch:
        live = drive_lockstep(ch, range(1, 11))
    srv.stop()  # the recorder closes its files
    (log,) = sorted((tmp_path / "rec").glob("*.mcap"))
    (data,) = read_sessions(log).values()
    assert [s.candidate_never_applied for s in data.snapshots] == [s.candidate_never_applied for s in live]
    assert all(s.candidate_never_applied.model_version for s in data.snapshots)


def test_admin_promotes_mid_stream_without_dropping_sessions(start, candidate_path, tokens):
    srv = start(auth=AuthConfig(tokens_file=tokens, tokens_env=None))
    with user_channel(srv.address) as ch:
        api = stub(ch)
        loaded = api.LoadCandidate(
            pb.LoadCandidateRequest(model_path=str(candidate_path)), metadata=ADMIN_MD, timeout=60
        )
        live_version = loaded.live_version
        assert loaded.candidate_version != live_version and not loaded.promoted
        lock = DriveSession(ch, "lock", pb.CLOCK_MODE_LOCKSTEP, shadow=True)
        rt = DriveSession(ch, "rt", pb.CLOCK_MODE_REALTIME, shadow=True, observation_period_ns=5 * MS)
        lock.send(1, 20 * MS, sensor(1))
        before = lock.recv()
        rt.send(1, time.monotonic_ns(), sensor(1))
        rt_before = rt.recv()
        assert before.model_version == rt_before.model_version == live_version
        assert before.candidate_never_applied.model_version == loaded.candidate_version
        with pytest.raises(grpc.RpcError) as err:  # not the loaded one: nothing happens
            api.PromoteCandidate(pb.PromoteCandidateRequest(expected_version="nope"), metadata=ADMIN_MD, timeout=10)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        done = api.PromoteCandidate(
            pb.PromoteCandidateRequest(expected_version=loaded.candidate_version), metadata=ADMIN_MD, timeout=10
        )
        assert (done.previous_version, done.model_version, done.sessions_kept) == (
            live_version,
            loaded.candidate_version,
            2,
        )
        # the same streams go on, decided by the new model, with no candidate beside it any more
        lock.send(2, 40 * MS, sensor(2))
        after = [lock.recv() for _ in range(4)]
        assert [s.tick for s in after] == [before.tick + k for k in range(1, 5)]
        assert {s.model_version for s in after} == {loaded.candidate_version}
        assert not any(s.HasField("candidate_never_applied") for s in after)
        for seq in range(2, 200):
            rt.send(seq, time.monotonic_ns(), sensor(seq))
            snap = rt.recv()
            if snap.model_version == loaded.candidate_version:
                break
        assert snap.model_version == loaded.candidate_version and snap.tick > rt_before.tick
        assert api.GetModelInfo(pb.GetModelInfoRequest(), metadata=USER_MD, timeout=10).model.model_version == (
            loaded.candidate_version
        )
        lock.close()
        rt.close()
        list(lock.snapshots())
        list(rt.snapshots())  # both end with OK: nothing was dropped or cancelled
        with pytest.raises(grpc.RpcError) as err:  # nothing loaded any more
            api.PromoteCandidate(pb.PromoteCandidateRequest(), metadata=ADMIN_MD, timeout=10)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "no candidate loaded" in (err.value.details() or "")


def test_admin_rpcs_need_an_admin_credential(start, candidate_path, tokens):
    secured = start(auth=AuthConfig(tokens_file=tokens, tokens_env=None))
    open_server = start()
    request = pb.LoadCandidateRequest(model_path=str(candidate_path))
    with grpc.insecure_channel(secured.address) as ch:
        for metadata, code in (((), grpc.StatusCode.UNAUTHENTICATED), (USER_MD, grpc.StatusCode.PERMISSION_DENIED)):
            api = stub(ch)
            for call, req in ((api.LoadCandidate, request), (api.PromoteCandidate, pb.PromoteCandidateRequest())):
                with pytest.raises(grpc.RpcError) as err:
                    call(req, metadata=metadata, timeout=10)
                assert err.value.code() == code
        assert "admin" in (err.value.details() or "")
    assert secured.server.executor.candidate is None
    with grpc.insecure_channel(open_server.address) as ch:  # no authentication: nobody is an admin
        with pytest.raises(grpc.RpcError) as err:
            stub(ch).LoadCandidate(request, timeout=10)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "SIGHUP" in (err.value.details() or "")
    assert open_server.server.executor.candidate is None


def test_admin_command(start, candidate_path, tokens):
    srv = start(auth=AuthConfig(tokens_file=tokens, tokens_env=None))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUALLOOP_")}
    cmd = [sys.executable, "-m", "dualloop.controller.cli", "admin"]
    where = ["--address", srv.address]
    refused = subprocess.run([*cmd, "promote", *where], env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stdout
    env["DUALLOOP_ADMIN_TOKEN"] = ADMIN
    loaded = subprocess.run(
        [*cmd, "load-candidate", str(candidate_path), "--promote", *where],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert loaded.returncode == 0, loaded.stdout + loaded.stderr
    assert "promoted" in loaded.stdout
    assert srv.server.executor.card.version == DecisionModel(candidate_path, warmup_batches=()).card.version
    nothing = subprocess.run([*cmd, "promote", *where], env=env, capture_output=True, text=True, timeout=60)
    assert nothing.returncode == 1 and "FAILED_PRECONDITION: no candidate loaded" in nothing.stdout


def test_schema_change_is_refused_and_sessions_go_on(start, history_model_path, tokens):
    srv = start(auth=AuthConfig(tokens_file=tokens, tokens_env=None))
    with user_channel(srv.address) as ch:
        lock = DriveSession(ch, "lock", pb.CLOCK_MODE_LOCKSTEP, shadow=True)
        lock.send(1, 20 * MS, sensor(1))
        first = lock.recv()
        for promote in (False, True):
            with pytest.raises(grpc.RpcError) as err:
                stub(ch).LoadCandidate(
                    pb.LoadCandidateRequest(model_path=str(history_model_path), promote=promote),
                    metadata=ADMIN_MD,
                    timeout=60,
                )
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            details = err.value.details() or ""
            assert "history features" in details and "its 1 open session(s) send" in details and "refused" in details
            live = srv.server.executor.card.schema_hash()
            assert details.count(live) == 1  # the same schema but for the history: said once (it read as two)
        lock.send(2, 40 * MS, sensor(2))
        assert {lock.recv().model_version for _ in range(4)} == {first.model_version}
        lock.close()
        list(lock.snapshots())
    assert srv.server.executor.candidate is None


def test_gates_must_come_with_the_candidate(start, tokens, tmp_path):
    """The shipped model with its two gates: a candidate without gates would drop the checks, and
    the shipped gates were fitted on another model; both refused before anything is installed."""
    int8 = BASE_MODEL_PATH.with_name("base.int8.onnx")
    srv = start(model=BASE_MODEL_PATH, gates=list(DEFAULT_GATES), auth=AuthConfig(tokens_file=tokens, tokens_env=None))
    with grpc.insecure_channel(srv.address) as ch:
        for gates, needle in (([], "must keep every check"), ([str(g) for g in DEFAULT_GATES], "fitted on model")):
            with pytest.raises(grpc.RpcError) as err:
                stub(ch).LoadCandidate(
                    pb.LoadCandidateRequest(model_path=str(int8), gate_paths=gates), metadata=ADMIN_MD, timeout=60
                )
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert needle in (err.value.details() or "")
        with pytest.raises(grpc.RpcError) as err:
            stub(ch).LoadCandidate(
                pb.LoadCandidateRequest(model_path=str(tmp_path / "missing.onnx")), metadata=ADMIN_MD, timeout=60
            )
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "not found" in (err.value.details() or "")
    assert srv.server.executor.candidate is None


def _serve(args: list[str], tmp_path: Path) -> tuple[subprocess.Popen, str, Path]:
    port_file = tmp_path / "stderr.log"
    err = port_file.open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dualloop.controller.cli", "serve", "--port", "0", "--log-format", "json", *args],
        stdout=subprocess.PIPE,
        stderr=err,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("DUALLOOP_")},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    found = re.search(r" on (\S+?)[, ]", line)
    address = found.group(1) if found else ""
    if not address:
        proc.kill()
        pytest.fail(f"serve did not start: {line!r} {port_file.read_text()}")
    return proc, address.replace("localhost", "127.0.0.1"), port_file


def log_events(path: Path, name: str) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("event") == name:
            out.append(record)
    return out


def test_sighup_promotes_the_candidate_mid_stream(test_model_path, candidate_path, tmp_path):
    proc, address, log = _serve(["--model", str(test_model_path), "--candidate", str(candidate_path)], tmp_path)
    try:
        with grpc.insecure_channel(address) as ch:
            lock = DriveSession(ch, "lock", pb.CLOCK_MODE_LOCKSTEP, shadow=True)
            lock.send(1, 20 * MS, sensor(1))
            before = lock.recv()
            cand = before.candidate_never_applied.model_version
            assert cand and cand != before.model_version
            proc.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 30
            while stub(ch).GetModelInfo(pb.GetModelInfoRequest(), timeout=10).model.model_version != cand:
                assert time.monotonic() < deadline, "SIGHUP did not promote the candidate"
                time.sleep(0.05)
            lock.send(2, 40 * MS, sensor(2))
            after = [lock.recv() for _ in range(4)]
            assert {s.model_version for s in after} == {cand}
            assert not any(s.HasField("candidate_never_applied") for s in after)
            proc.send_signal(signal.SIGHUP)  # nothing loaded now: refused and logged, the server serves on
            lock.send(3, 60 * MS, sensor(3))
            assert [lock.recv().model_version for _ in range(4)] == [cand] * 4
            lock.close()
            list(lock.snapshots())
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert proc.returncode == 0
    promoted = log_events(log, "server.promoted")
    assert len(promoted) == 1 and promoted[0]["by"] == "SIGHUP" and promoted[0]["sessions_kept"] == 1
    assert len(log_events(log, "server.promote_refused")) == 1


def test_sighup_reaches_every_worker(test_model_path, candidate_path, tmp_path):
    proc, address, log = _serve(
        ["--model", str(test_model_path), "--candidate", str(candidate_path), "--workers", "2"], tmp_path
    )
    try:
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while len(log_events(log, "server.promoted")) < 2:
            assert time.monotonic() < deadline, f"not every worker promoted: {log.read_text()[-2000:]}"
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    assert proc.returncode == 0


# --- in process: the executor's swap and the tally ----------------------------------------------


def test_promotion_keeps_each_sessions_state(test_model, candidate_path):
    ex = Executor(test_model, ExecutorConfig())
    ex.open_session("a")
    for k in range(1, 6):
        ex.submit("a", Observation(seq=k, timestamp_ns=k * 5 * MS, features=np.array(sensor(k), np.float32)))
        ex.tick(k * 5 * MS, k)
    session = ex.sessions["a"]
    state_before = (session.ticks, session.last_seq, session.slot, session.safety)
    candidate = DecisionModel(candidate_path)
    with pytest.raises(SwapRefused, match="no candidate loaded"):
        ex.promote()
    ex.candidate = ex.prepare_candidate(candidate, [])
    assert ex.promote() == (test_model.card.version, candidate.card.version)
    assert ex.sessions["a"] is session and (session.ticks, session.last_seq, session.slot, session.safety) == (
        state_before
    )
    ex.submit("a", Observation(seq=6, timestamp_ns=30 * MS, features=np.array(sensor(6), np.float32)))
    (snap,) = ex.tick(30 * MS, 6)
    assert snap.model_version == candidate.card.version and snap.candidate is None and session.ticks == 6


def test_candidate_tally_counts_only_ticks_both_proposed():
    t = CandidateTally("c1", ["a", "b", "c"], 2)
    t.update("l1", 0, np.zeros(2), 0, 1, np.ones(2), 1)
    t.update("l1", 2, np.zeros(2), 1, 2, np.zeros(2), -1)
    t.update("l1", -1, np.zeros(0), 0, 2, np.zeros(2), 2)  # the live model did not propose
    msg = t.to_proto()
    assert (msg.ticks, msg.compared, msg.agreeing_with_live_proposed, msg.agreeing_with_applied) == (3, 2, 1, 0)
    assert list(msg.migration) == [0, 1, 0, 0, 0, 0, 0, 0, 1]
    assert list(msg.control_mad) == [0.5, 0.5]
    assert (msg.with_actual, msg.live_agreeing_with_actual, msg.candidate_agreeing_with_actual) == (1, 0, 1)
