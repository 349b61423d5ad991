"""Clients generated from proto v1 keep working: v2 changed names, not field numbers, and the server
answers the v1 service name too (only GetModelInfo's answer is unwrapped for them)."""

from __future__ import annotations

import grpc

from dualloop.v2 import controller_pb2 as pb

V1 = "/dualloop.v1.Controller"


def _identity(b: bytes) -> bytes:
    return b


def test_a_v1_client_gets_model_info_unwrapped(channel):
    v2 = pb.GetModelInfoResponse.FromString(
        channel.unary_unary("/dualloop.v2.ControllerService/GetModelInfo", _identity, _identity)(b"")
    )
    raw = channel.unary_unary(f"{V1}/GetModelInfo", _identity, _identity)(b"")
    v1 = pb.ModelInfo.FromString(raw)  # v1's GetModelInfo returned ModelInfo itself
    assert v1 == v2.model and len(v1.features) == 19 and v1.schema_hash


def test_a_v1_client_drives_a_lockstep_session(channel):
    """Messages are the same bytes under both names: a v1 DriveRequest opens and drives a session,
    and the snapshots parse (the v1 client ignores the fields v2 added)."""
    info = pb.GetModelInfoResponse.FromString(
        channel.unary_unary("/dualloop.v2.ControllerService/GetModelInfo", _identity, _identity)(b"")
    ).model
    features = [f.mean for f in info.features]
    requests = [pb.DriveRequest(open=pb.OpenSession(session_id="old", clock=pb.CLOCK_MODE_LOCKSTEP))]
    requests += [
        pb.DriveRequest(observation=pb.Observation(seq=k, timestamp_ns=k * 10_000_000, features=features))
        for k in range(1, 11)
    ]
    drive = channel.stream_stream(f"{V1}/Drive", _identity, _identity)
    responses = [pb.DriveResponse.FromString(r) for r in drive(iter(r.SerializeToString() for r in requests))]
    assert responses[0].WhichOneof("msg") == "opened" and responses[0].opened.clock == 2  # v1's LOCKSTEP = 2
    snapshots = [r.snapshot for r in responses[1:]]
    assert [s.tick for s in snapshots] == list(range(19))  # 90 ms at 5 ms ticks
    assert all(s.applied.name for s in snapshots)


def test_a_v1_stats_call_is_answered(channel):
    stats = pb.GetStatsResponse.FromString(channel.unary_unary(f"{V1}/GetStats", _identity, _identity)(b""))
    assert stats.scheduling
    err = None
    try:
        channel.unary_unary(f"{V1}/NoSuchMethod", _identity, _identity)(b"")
    except grpc.RpcError as e:
        err = e
    assert err is not None and err.code() == grpc.StatusCode.UNIMPLEMENTED
