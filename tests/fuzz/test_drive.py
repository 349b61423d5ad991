"""Random valid and invalid Drive streams against a live server on loopback: only documented status codes
come back and the server stays healthy.

The server is what users run (the shipped model with its gates, recording on). Each example is one
stream: an OpenSession with odd fields (or none), then observations whose seq, timestamps, sizes and
values are drawn to be right or wrong in every way the contract names (NaN, inf, huge, duplicate
seq, time going back, plans and actual controls of the wrong size, garbage bytes). Every stream must
end in OK or a documented status (docs/contract.md#status-codes) with a message, the one the
contract predicts where the stream is simple enough to predict; no snapshot may carry a NaN or inf;
afterwards the server answers its health check SERVING and drives a clean session.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import given

from dualloop.controller.contract.client import DriveSession
from dualloop.controller.logs.logfile import read_sessions
from dualloop.controller.serve.config import ServerConfig
from dualloop.controller.serve.lifecycle import ServerThread
from dualloop.controller.server_process import serve_shipped
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc
from tests.controller.serve.inputs import MS, sensor
from tests.fuzz.budget import FACTOR, RANDOM, fuzz_settings
from tests.fuzz.drive_grammar import (
    CLEAN,
    INVALID,
    LOCKSTEP,
    OVERSIZE_ROW,
    REALTIME,
    UNKNOWN,
    Seeded,
    Stream,
    drive_stream,
    streams,
)

# huge and non-finite inputs overflow inside the server's numpy by design (INVALID_INPUT or MODEL_ERROR follow)
pytestmark = [
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]

# what a Drive stream may end with (docs/contract.md#status-codes) when no credentials are configured,
# the server is not draining and the client neither cancels nor sets a deadline
DOCUMENTED = {
    grpc.StatusCode.OK,
    INVALID,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
# The bulk fuzz: seeded streams per run (at least 10,000 per CI run, cheap to draw), one in
# BULK_REALTIME_EVERY of them REALTIME, BULK_THREADS at a time on one channel (HTTP/2 streams side by side)
BULK_STREAMS = 10_000
BULK_REALTIME_EVERY = 5
BULK_THREADS = 16


def non_finite_fields(msg: Message, path: str = "") -> list[str]:
    """Every float or double field (at any depth, maps included) holding NaN or inf, by its path."""
    bad = []
    for fd, value in msg.ListFields():
        name = f"{path}{fd.name}"
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            values = list(value.values())
        else:
            values = list(value) if fd.is_repeated else [value]
        for k, v in enumerate(values):
            where = f"{name}[{k}]" if fd.is_repeated else name
            if isinstance(v, Message):
                bad += non_finite_fields(v, f"{where}.")
            elif isinstance(v, float) and not math.isfinite(v):
                bad.append(f"{where}={v}")
    return bad


def unexpected_non_finite(response: pb.DriveResponse) -> list[str]:
    """non_finite_fields, less the one documented exception: the legacy `gate.score` is +Inf on a
    tick whose input was not finite (docs/contract.md#checks; `checks` carries finite scores)."""
    bad = non_finite_fields(response)
    snap = response.snapshot
    if response.WhichOneof("msg") == "snapshot" and (snap.invalid_input or pb.REASON_CODE_MODEL_ERROR in snap.reasons):
        bad = [b for b in bad if b != "snapshot.gate.score=inf"]
    return bad


class Bystander:
    """A clean REALTIME session open beside the fuzzed streams: one observation every 10 ms until stop()."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.session = DriveSession(channel, "bystander", REALTIME, shadow=True)
        self.snapshots: list[pb.DecisionSnapshot] = []
        self.error: grpc.RpcError | None = None
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._send), threading.Thread(target=self._read)]
        for thread in self._threads:
            thread.start()

    def _send(self) -> None:
        seq = 0
        while not self._stop.wait(0.01):
            seq += 1
            self.session.send(seq, seq * 10 * MS, sensor(seq))
        self.session.close()

    def _read(self) -> None:
        try:
            self.snapshots.extend(self.session.snapshots())
        except grpc.RpcError as err:
            self.error = err

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)


class ErrorRecords(logging.Handler):
    """The log records at ERROR and above, from any logger (the server's, asyncio's, gRPC's)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _identity(b: bytes) -> bytes:
    return b


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory, base_model) -> Iterator[ServerThread]:
    record_dir = tmp_path_factory.mktemp("fuzz-rec")
    config = ServerConfig(model=BASE_MODEL_PATH, gates=DEFAULT_GATES, port=0, record_dir=record_dir)
    with ServerThread(config, base_model) as srv:
        yield srv


@pytest.fixture(scope="module")
def fuzz_channel(fuzz_server: ServerThread) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(fuzz_server.address) as channel:
        yield channel


@pytest.fixture(scope="module")
def schema_hash(base_model) -> str:
    return str(base_model.card.schema_hash())


def run_stream(channel: grpc.Channel, stream: Stream) -> tuple[grpc.StatusCode, str, list[pb.DriveResponse]]:
    drive = channel.stream_stream(
        "/dualloop.v2.ControllerService/Drive",
        request_serializer=_identity,
        response_deserializer=pb.DriveResponse.FromString,
    )

    def requests() -> Iterator[bytes]:
        for data, _ in stream.items:
            yield data
            if stream.clock == REALTIME:  # let the 5 ms ticks run on what was sent
                time.sleep(stream.pause_s)
        if stream.clock == REALTIME and stream.items:
            time.sleep(0.015)  # before the half-close, which ends a REALTIME session at once

    responses: list[pb.DriveResponse] = []
    # generous: a stream that has not ended by then hangs, which is a failure (DEADLINE_EXCEEDED is not OK)
    call = drive(requests(), timeout=60)
    try:
        for response in call:
            responses.append(response)
    except grpc.RpcError as err:
        return err.code(), err.details() or "", responses
    return grpc.StatusCode.OK, "", responses


@pytest.mark.parametrize("clock, examples", [(LOCKSTEP, 150), (REALTIME, 60)], ids=["LOCKSTEP", "REALTIME"])
def test_drive_streams_never_crash_never_leak_non_finite_and_fail_as_documented(
    fuzz_server: ServerThread, fuzz_channel: grpc.Channel, schema_hash: str, clock: int, examples: int
) -> None:
    seen: dict[grpc.StatusCode, int] = {}
    snapshots = [0]
    stub = pb_grpc.ControllerServiceStub(fuzz_channel)

    @fuzz_settings(max_examples=examples)
    @given(streams(schema_hash, clock))
    def one_stream(stream: Stream) -> None:
        code, details, responses = run_stream(fuzz_channel, stream)
        seen[code] = seen.get(code, 0) + 1
        problems = contract_problems(stream, code, details, responses)
        assert not problems, problems
        if responses:
            snapshots[0] += len(responses) - 1
            # the session's agreement statistics: finite too, whatever the actual values were
            shadow = stub.GetShadowStats(
                pb.GetShadowStatsRequest(session_instance=responses[0].opened.session_instance), timeout=10
            )
            assert not non_finite_fields(shadow), non_finite_fields(shadow)

    errors = ErrorRecords()
    logging.getLogger().addHandler(errors)
    bystander = Bystander(fuzz_channel)
    try:
        one_stream()
        gc.collect()  # asyncio reports a task whose exception nobody retrieved when the task is collected
    finally:
        logging.getLogger().removeHandler(errors)
        bystander.stop()
    # nothing went wrong inside the server either: no error logged (refusals are warnings)
    assert not errors.records, [f"{r.name}: {r.getMessage()}" for r in errors.records]
    # a clean session open all along was served throughout, and ended cleanly
    assert bystander.error is None, bystander.error
    assert len(bystander.snapshots) >= 10 and bystander.snapshots[-1].observation_seq > 0
    odd = [(x.observation_seq, non_finite_fields(x), list(x.invalid_input)) for x in bystander.snapshots]
    assert not [o for o in odd if o[1] or o[2]], [o for o in odd if o[1] or o[2]][:3]
    # the strategies reached the server's answers, not only the first refusal
    least = examples * FACTOR // 10
    assert seen.get(grpc.StatusCode.OK, 0) >= least and seen.get(INVALID, 0) >= least, seen
    assert snapshots[0] > 100, snapshots
    stats = stub.GetStats(pb.GetStatsRequest(), timeout=10)
    assert not non_finite_fields(stats), non_finite_fields(stats)
    assert_healthy(fuzz_server, fuzz_channel)


def contract_problems(
    stream: Stream, code: grpc.StatusCode, details: str, responses: list[pb.DriveResponse]
) -> list[str]:
    """What in a stream's answer breaks the contract: an undocumented status, another than the one
    predicted, a refusal without a message, a first answer that is not `opened`, a non-finite field."""
    problems = []
    if code not in DOCUMENTED:
        problems.append(f"undocumented status {code}: {details}")
    expected = stream.expected()
    if expected is not UNKNOWN and code != expected:
        problems.append(f"expected {expected}, got {code}: {details}")
    if code != grpc.StatusCode.OK and (not details or "Traceback" in details):
        problems.append(f"{code} without a message a person can act on: {details!r}")
    if responses and responses[0].WhichOneof("msg") != "opened":
        problems.append(f"first answer {responses[0].WhichOneof('msg')}, not opened")
    if any(r.WhichOneof("msg") != "snapshot" for r in responses[1:]):
        problems.append("an answer after `opened` that is not a snapshot")
    for response in responses:
        bad = unexpected_non_finite(response)
        if bad:
            problems.append(f"non-finite fields in {response.WhichOneof('msg')}: {bad}")
    return problems


@pytest.mark.slow
# CPU-bound volume: about 5 min on two cores beside a training run, more beside two busy loops; the
# timeout is there to catch a hang, not to time it
@pytest.mark.timeout(1200)
def test_ten_thousand_seeded_streams_keep_the_contract(tmp_path: Path, schema_hash: str) -> None:
    """The grammar's volume: BULK_STREAMS streams a run, drawn from a seed (hypothesis would spend
    ~10 ms of CPU drawing each), BULK_THREADS at a time, each judged as the property tests judge one,
    against `dualloop serve` in its own process (the shipped model and gates, recording on, JSON
    logs), with a clean session beside them all along. DUALLOOP_FUZZ_RANDOM=1 draws a new seed."""
    seed = int.from_bytes(os.urandom(4)) if RANDOM else 20261202
    count = BULK_STREAMS * FACTOR
    record_dir = tmp_path / "recordings"
    with serve_shipped(tmp_path, {"record_dir": str(record_dir)}, log_format="json") as server:
        with grpc.insecure_channel(server.address) as channel:

            def one(k: int) -> tuple[grpc.StatusCode, int, list[str]]:
                clock = REALTIME if k % BULK_REALTIME_EVERY == 0 else LOCKSTEP
                fuzzed = drive_stream(Seeded(f"{seed}:{k}"), schema_hash, clock)
                code, details, responses = run_stream(channel, fuzzed)
                return code, len(responses) - 1 if responses else 0, contract_problems(fuzzed, code, details, responses)

            bystander = Bystander(channel)
            try:
                with ThreadPoolExecutor(BULK_THREADS) as pool:
                    results = list(pool.map(one, range(count)))
            finally:
                bystander.stop()
            broken = [(k, problems) for k, (_, _, problems) in enumerate(results) if problems]
            assert not broken, (
                f"{len(broken)} of {count} streams broke the contract; stream k is "
                f"drive_grammar.drive_stream(Seeded('{seed}:k'), schema_hash, clock): {broken[:5]}"
            )
            assert bystander.error is None, bystander.error
            assert len(bystander.snapshots) >= 10
            odd = [(x.observation_seq, non_finite_fields(x), list(x.invalid_input)) for x in bystander.snapshots]
            assert not [o for o in odd if o[1] or o[2]], [o for o in odd if o[1] or o[2]][:3]
            # the grammar reached the server's answers, not only its first refusals
            codes = [code for code, _, _ in results]
            assert codes.count(grpc.StatusCode.OK) >= count // 10 and codes.count(INVALID) >= count // 10
            assert sum(n for _, n, _ in results) > count
            # afterwards: serving, a clean session answered in full, nothing left open
            assert server.health() == "SERVING"
            clean = DriveSession(channel, "after-fuzz", LOCKSTEP, shadow=True)
            for k in range(20):
                clean.send(k + 1, k * 5 * MS, sensor(k))
            clean.close()
            assert [x.observation_seq for x in clean.snapshots()] == list(range(1, 21))
            assert server.stats().sessions_open == 0
            stats = server.stats()
            assert not non_finite_fields(stats), non_finite_fields(stats)
        assert server.stop() == 0
    # nothing went wrong inside the server (refusals are warnings), and what it recorded reads back
    errors = [e for e in server.events() if e.get("level") in ("ERROR", "CRITICAL")]
    assert not errors and "Traceback" not in server.stderr_text(), errors[:3]
    assert len(read_sessions(sorted(record_dir.glob("*.mcap")))) > count // 10


def assert_healthy(srv: ServerThread, channel: grpc.Channel) -> None:
    """SERVING, a clean LOCKSTEP session answered in full, nothing left open, the recording readable."""
    health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    s = DriveSession(channel, "after-fuzz", LOCKSTEP, shadow=True)
    for k in range(20):
        s.send(k + 1, k * 5 * MS, sensor(k))
    s.close()
    snaps = list(s.snapshots())
    assert [x.observation_seq for x in snaps] == list(range(1, 21))
    assert all(x.safety_state != pb.SAFETY_STATE_UNSPECIFIED for x in snaps)
    assert srv.call(lambda: len(srv.server.executor.sessions)) == 0
    recorder = srv.server.runtime.recorder
    assert recorder is not None
    assert recorder.stats.error == "", recorder.stats.error
    # the fuzzed sessions as recorded read back (the file is still being written: up to its last chunk)
    time.sleep(0.5)  # the recorder flushes every 0.25 s
    assert len(read_sessions(recorder.stats.files)) > 10


@pytest.mark.parametrize("clock", [LOCKSTEP, REALTIME], ids=["LOCKSTEP", "REALTIME"])
def test_a_request_over_the_size_limit_ends_the_stream_quietly(
    fuzz_server: ServerThread, fuzz_channel: grpc.Channel, clock: int
) -> None:
    """RESOURCE_EXHAUSTED as documented, and nothing logged as an error by the server (found by the
    fuzz: a LOCKSTEP read cut short by gRPC left an asyncio task whose end nobody looked at)."""
    errors = ErrorRecords()
    logging.getLogger().addHandler(errors)
    try:
        for _ in range(3):
            stream = Stream(clock, pause_s=0.003)
            stream.items.append((pb.DriveRequest(open=pb.OpenSession(clock=clock)).SerializeToString(), CLEAN))
            first = pb.Observation(seq=1, timestamp_ns=0, features=sensor(1))
            stream.items.append((pb.DriveRequest(observation=first).SerializeToString(), CLEAN))
            big = pb.Observation(seq=2, timestamp_ns=5 * MS, features=OVERSIZE_ROW)
            stream.items.append((pb.DriveRequest(observation=big).SerializeToString(), CLEAN))
            code, details, _ = run_stream(fuzz_channel, stream)
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details, (code, details)
        gc.collect()
    finally:
        logging.getLogger().removeHandler(errors)
    assert not errors.records, [f"{r.name}: {r.getMessage()}" for r in errors.records]
