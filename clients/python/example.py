"""A minimal dualloop client in Python: python clients/python/example.py HOST:PORT (docs/contract.md)."""

import random
import sys
import time

import grpc

from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc

if len(sys.argv) != 2:  # the server's address is the one argument
    sys.exit("usage: python clients/python/example.py HOST:PORT (the address `dualloop serve` announces)")

# A small receive window: a client that falls behind reads the newest snapshot after a short
# backlog, and the server drops the rest (snapshots_dropped).
channel = grpc.insecure_channel(sys.argv[1], [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 8192)])
stub = pb_grpc.ControllerServiceStub(channel)


def reading(name: str, mean: float, unit: str, rng: random.Random) -> float:
    """A steady cruise at 20 m/s, 40 m behind a lead at the same speed, mid-lane on a straight road,
    as a sensor reads it: each value with a little noise (a reading that never changes looks stuck)."""
    cruise = {"ego_speed": (20.0, 0.02), "ego_accel": (0.0, 0.05), "lead_distance": (40.0, 0.1)}
    if name in cruise:
        value, noise = cruise[name]
    elif unit == "bool":  # lead and lanes present
        return 1.0
    elif unit == "1/m":  # a straight road
        value, noise = 0.0, 1e-5
    else:  # relative speeds, lane offset, heading, yaw rate: near zero; side gaps: typical
        value, noise = (mean, 0.1) if name.endswith("_gap") else (0.0, 0.005)
    return value + rng.gauss(0.0, noise)


def requests():
    yield pb.DriveRequest(
        open=pb.OpenSession(clock=pb.CLOCK_MODE_REALTIME, observation_period_ns=50_000_000)
    )  # first: open
    rng = random.Random(0)
    for seq in range(1, 21):  # 1 s at 20 Hz, in ModelInfo.features order and units
        features = [reading(f.name, f.mean, f.unit, rng) for f in info.features]
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
