"""A minimal dualloop client in Python: python clients/python/example.py HOST:PORT (docs/contract.md)."""

import math
import sys
import time

import grpc

from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc

# A small receive window: a client that falls behind reads the newest snapshot after a short
# backlog, and the server drops the rest (snapshots_dropped).
channel = grpc.insecure_channel(sys.argv[1], [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 8192)])
stub = pb_grpc.ControllerServiceStub(channel)


def requests():
    yield pb.DriveRequest(
        open=pb.OpenSession(clock=pb.CLOCK_MODE_REALTIME, observation_period_ns=50_000_000)
    )  # first: open
    for seq in range(1, 21):  # 1 s at 20 Hz, in ModelInfo.features order and units
        features = [
            round(f.mean) if f.unit == "bool" else 0.0 if f.unit == "1/m" else f.mean + 0.1 * f.std * math.sin(seq + i)
            for i, f in enumerate(info.features)
        ]
        yield pb.DriveRequest(observation=pb.Observation(seq=seq, timestamp_ns=time.monotonic_ns(), features=features))
        time.sleep(0.05)
    # returning half-closes the stream: the server ends the session


latest = None
try:
    info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).model  # the schema to build observations from
    for response in stub.Drive(requests()):
        if response.WhichOneof("msg") == "opened":
            print(f"session {response.opened.session_id}, tick {response.opened.tick_period_ns} ns")
            continue
        snap = response.snapshot
        if latest is None or snap.safety_state != latest.safety_state:  # SAFETY_STATE_NOMINAL, ..._VETO_HOLD, ...
            reasons = ",".join(pb.ReasonCode.Name(r) for r in snap.reasons)
            print(f"tick {snap.tick}: {pb.SafetyState.Name(snap.safety_state)} {reasons}")
        latest = snap  # actuate latest.applied, never latest.proposed
except grpc.RpcError as err:  # a refused session or a bad observation: the status says why
    sys.exit(f"{err.code().name}: {err.details()}")
assert latest is not None
print(f"last: {latest.applied.name} {list(latest.applied.controls)} {pb.SafetyState.Name(latest.safety_state)}")
