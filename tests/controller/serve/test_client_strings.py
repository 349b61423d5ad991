"""Client strings against a real `dualloop serve`: bounded ids, logs that cannot be forged, and
record files that never collide.

Each server is a `dualloop serve` process on loopback; recordings are read back with the standard
MCAP reader (the `mcap` package), not with dualloop's own.
"""

from __future__ import annotations

import gc
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType

import grpc
import pytest
from mcap.reader import make_reader

from dualloop.controller.contract.client import DriveSession
from dualloop.controller.serve.client_strings import MAX_ID_BYTES
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc
from tests.controller.serve.inputs import sensor
from tests.paths import REPO_ROOT

MS = 1_000_000
# the modules whose handler frames a refused call must not leave behind in cyclic garbage
_HANDLER_FILES = ("serve/service.py", "serve/drive.py", "serve/status.py", "serve/runtime.py")


class Serve:
    """`dualloop serve --port 0 ARGS` with its stderr in a file; stop() sends SIGTERM and waits."""

    def __init__(self, args: list[str], stderr: Path) -> None:
        self.stderr = stderr
        with open(stderr, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dualloop.controller.cli", "serve", "--port", "0", *args],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                cwd=REPO_ROOT,
                env={k: v for k, v in os.environ.items() if not k.startswith("DUALLOOP_")},
            )

    def address(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        found = re.search(r" on 127\.0\.0\.1:(\d+)", line)
        if not found:
            self.proc.kill()
            pytest.fail(f"serve did not start: {line!r} {self.stderr.read_text()}")
        return f"127.0.0.1:{found.group(1)}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            assert self.proc.wait(60) == 0, self.stderr.read_text()
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)


def _code_and_details(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value.code(), err.value.details() or ""


def _open(channel: grpc.Channel, session_id: str, **fields) -> None:
    stub = pb_grpc.ControllerServiceStub(channel)
    request = pb.DriveRequest(open=pb.OpenSession(session_id=session_id, clock=pb.CLOCK_MODE_LOCKSTEP, **fields))
    list(stub.Drive(iter([request]), timeout=30))


def test_client_strings_past_their_limit_are_refused_naming_field_length_and_limit(test_model_path, tmp_path):
    """With recording on, a 1 MiB session id (and any other client string past its limit) is refused
    with INVALID_ARGUMENT naming the field, its length and the limit; the longest allowed id runs,
    and neither the log nor the recording ever holds the refused string."""
    serve = Serve(["--model", str(test_model_path), "--record-dir", str(tmp_path / "rec")], tmp_path / "err.log")
    try:
        with grpc.insecure_channel(serve.address()) as channel:
            huge = "x" * (1 << 20)
            code, details = _code_and_details(lambda: _open(channel, huge))
            assert code == grpc.StatusCode.INVALID_ARGUMENT, details
            assert details == "OpenSession.session_id is 1048576 bytes long; the limit is 128 bytes (UTF-8)"
            # bytes, not characters: 43 three-byte characters are 129 bytes
            code, details = _code_and_details(lambda: _open(channel, "\u20ac" * 43))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "session_id is 129 bytes long" in details
            for field, value, needle in (
                ("expected_schema_hash", "h" * 129, "OpenSession.expected_schema_hash is 129 bytes long"),
                ("provided_features", ["f" * 200], "OpenSession.provided_features[0] is 200 bytes long"),
                ("provided_features", ["ego_speed"] * 1025, "provided_features has 1025 entries; the limit is 1024"),
            ):
                code, details = _code_and_details(lambda: _open(channel, "ok", **{field: value}))  # noqa: B023
                assert code == grpc.StatusCode.INVALID_ARGUMENT and needle in details, (field, details)

            longest = "L" * MAX_ID_BYTES
            session = DriveSession(channel, longest, pb.CLOCK_MODE_LOCKSTEP)
            assert session.opened.limits.max_session_id_bytes == MAX_ID_BYTES
            assert session.opened.limits.max_plan_id_bytes == MAX_ID_BYTES
            session.send(1, 5 * MS, sensor(1), plan_id="p" * MAX_ID_BYTES, plan=[20.0, 0, 1, 0, 0, 0])
            assert session.recv().plan_id == "p" * MAX_ID_BYTES
            session.send(2, 10 * MS, sensor(2), plan_id="q" * (MAX_ID_BYTES + 1), plan=[20.0, 0, 1, 0, 0, 0])
            code, details = _code_and_details(session.recv)
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            assert details == (
                "observation seq 2: Observation.plan.plan_id is 129 bytes long; the limit is 128 bytes (UTF-8)"
            )

            stub = pb_grpc.ControllerServiceStub(channel)
            code, details = _code_and_details(
                lambda: stub.GetShadowStats(pb.GetShadowStatsRequest(session_id=huge), timeout=30)
            )
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            assert "GetShadowStatsRequest.session_id is 1048576 bytes long" in details
            stats = stub.GetStats(pb.GetStatsRequest(), timeout=30)
            assert stats.records_dropped_total == 0  # recording: nothing dropped in this light run
    finally:
        serve.stop()
    log = serve.stderr.read_text()
    assert "x" * 200 not in log and len(log) < 100_000
    (recording,) = (tmp_path / "rec").glob("*.mcap")
    assert recording.stat().st_size < 200_000
    with open(recording, "rb") as f:
        sessions = {ch.metadata["session_id"] for ch in make_reader(f).get_summary().channels.values()}
    assert sessions == {longest}


# No space in it (a space alone made the old human format quote a value): tabs separate the forged fields
FORGED = "2026-01-01T00:00:00.000Z\tINFO\tsession.open\tsession_id=admin\tclock=REALTIME"
HOSTILE_ID = "a\n" + FORGED + "\x1b[2J\x1b[31m\r\u2028z"


@pytest.mark.parametrize("fmt", ["human", "json"])
def test_a_session_id_cannot_forge_a_log_line(test_model_path, tmp_path, fmt):
    """A session id with a newline, a whole forged log line, ANSI escapes, a carriage return and a
    Unicode line separator: the server's log shows each event on one line, the id escaped."""
    serve = Serve(["--model", str(test_model_path), "--log-format", fmt], tmp_path / "err.log")
    try:
        with grpc.insecure_channel(serve.address()) as channel:
            session = DriveSession(channel, HOSTILE_ID, pb.CLOCK_MODE_LOCKSTEP)
            session.send(1, 5 * MS, sensor(1))
            session.recv()
            session.close()
            assert list(session.snapshots()) == []
    finally:
        serve.stop()
    text = serve.stderr.read_text()
    assert "\x1b" not in text and "\r" not in text and "\u2028" not in text
    lines = [line for line in text.split("\n") if line]
    assert not [line for line in lines if line.startswith("2026-01-01T00:00:00.000Z")], text
    if fmt == "json":
        records = [json.loads(line) for line in lines]  # every line is one JSON object
        events = [r["event"] for r in records]
        assert [r["session_id"] for r in records if r["event"].startswith("session.")] == [HOSTILE_ID] * 2
    else:  # every line is `TIME LEVEL EVENT key=value ...`, written by this server
        assert all(re.match(r"\d{4}-\d\d-\d\dT[\d:.]+Z (INFO |WARN|ERROR|DEBUG) ", line) for line in lines), text
        events = [line.split()[2] for line in lines]
        for line in lines[1:3]:
            assert f" session_id={json.dumps(HOSTILE_ID)} " in line
    assert events == ["server.start", "session.open", "session.close", "server.drain", "server.stop"], text


def test_two_servers_sharing_a_record_dir_in_one_second_keep_both_recordings(test_model_path, tmp_path):
    """Two `dualloop serve` processes started together on one --record-dir, until both name their
    recording in the same second (a few tries at most): both files exist, both sessions are in
    them, and the standard MCAP reader reads each one whole (summary and messages)."""
    second = re.compile(r"dualloop-(\d{8}-\d{6})")
    for attempt in range(8):
        record_dir = tmp_path / f"rec{attempt}"
        servers = [
            Serve(["--model", str(test_model_path), "--record-dir", str(record_dir)], tmp_path / f"err{attempt}{k}")
            for k in range(2)
        ]
        try:
            for k, serve in enumerate(servers):
                with grpc.insecure_channel(serve.address()) as channel:
                    session = DriveSession(channel, f"server{k}", pb.CLOCK_MODE_LOCKSTEP)
                    for seq in range(1, 11):
                        session.send(seq, seq * 5 * MS, sensor(seq))
                    session.close()
                    assert len(list(session.snapshots())) == 10
        finally:
            for serve in servers:
                serve.stop()
        files = sorted(record_dir.glob("*.mcap"))
        stamps = {m.group(1) for m in (second.match(f.name) for f in files) if m}
        if len(stamps) > 1:  # the two named their files in different seconds: no collision tried
            continue
        assert len(files) == 2, f"one recording overwrote the other: {[f.name for f in files]}"
        found: dict[str, int] = {}
        for path in files:
            with open(path, "rb") as f:
                reader = make_reader(f)
                summary = reader.get_summary()
                assert summary is not None and summary.statistics is not None, path
                messages = list(reader.iter_messages())
            assert len(messages) == summary.statistics.message_count
            for _, channel, _ in messages:
                sid = channel.metadata["session_id"]
                found[sid] = found.get(sid, 0) + (channel.topic == "/dualloop/snapshot")
        assert found == {"server0": 10, "server1": 10}
        return
    pytest.skip("the two servers never named their recordings in the same second in 8 tries")


def test_an_aborted_call_leaves_no_cycle_holding_its_request(server, channel):
    """grpc.aio keeps an abort's exception on the call, and its traceback the handler's frames: a
    reference cycle through the request, freed only by an old-generation collection (refused 1 MiB
    ids piled up to ~600 MB first). The server clears them: no request, context or call state is
    left for the cyclic collector after refused Drive streams and unary calls."""
    stub = pb_grpc.ControllerServiceStub(channel)
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for k in range(10):
            code, _ = _code_and_details(lambda: _open(channel, "x" * 200_000))  # refused at open
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            code, _ = _code_and_details(  # a unary call's abort
                lambda: stub.GetShadowStats(pb.GetShadowStatsRequest(session_id="y" * 200_000), timeout=30)
            )
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            session = DriveSession(channel, f"bad-{k}", pb.CLOCK_MODE_LOCKSTEP)  # fails after opening
            session.send(1, 5 * MS, sensor(1)[:3])
            assert _code_and_details(session.recv)[0] == grpc.StatusCode.INVALID_ARGUMENT
        server.call(gc.collect)
        # the server's side of the calls (the client's exceptions hold its own requests in cycles)
        kept = sorted(
            {type(o).__name__ for o in gc.garbage if type(o).__name__ in ("RPCState", "_ServicerContext")}
            | {
                o.f_code.co_name
                for o in gc.garbage
                if isinstance(o, FrameType) and o.f_code.co_filename.endswith(_HANDLER_FILES)
            }
        )
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert kept == [], f"cyclic garbage still holds {kept}"
