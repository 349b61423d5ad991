"""The grammar of fuzzed Drive streams, written once, drawn two ways.

`Choose` is every kind of choice the grammar makes. `Drawn` makes them with hypothesis (the property
tests: shrinking, a fixed derandomized sequence); `Seeded` makes them with a seeded `random.Random`
(the bulk fuzz: thousands of streams a run, where hypothesis spends ~10 ms of CPU drawing each one).
Each stream holds its requests as bytes next to the verdict the contract predicts for each:
`CLEAN` (accepted), a status code, or `UNKNOWN` (any documented status will do).
"""

from __future__ import annotations

import functools
import math
import random
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import grpc
from hypothesis import strategies as st

from dualloop.v2 import controller_pb2 as pb
from tests.controller.serve.inputs import MS, sensor

T = TypeVar("T")

REALTIME, LOCKSTEP = pb.CLOCK_MODE_REALTIME, pb.CLOCK_MODE_LOCKSTEP
INVALID = grpc.StatusCode.INVALID_ARGUMENT
N_FEATURES, N_PLAN, N_CONTROLS, N_ACTIONS = 19, 6, 2, 4
LOCKSTEP_MAX_GAP_NS = 10_000 * MS  # executor.lockstep_max_gap_s; the grammar keeps well clear of it
UINT64_MAX, INT64_MAX = 2**64 - 1, 2**63 - 1
HOUR_NS = 3_600_000_000_000
OVERSIZE_ROW = [1.0] * (1 << 20)  # 4 MiB of floats and then some: beyond limits.max_receive_message_bytes

CLEAN = "clean"  # an item the contract accepts
UNKNOWN = None  # an item whose verdict is not predicted (any documented status will do)
Verdict = str | grpc.StatusCode | None

ODD_FLOATS = [math.nan, math.inf, -math.inf, 1e300, -1e300, 3.4e38, -3.4e38, 1e-45, 5e-324, -0.0, 1e20, 65504.0]
ANY_FLOAT = st.one_of(st.floats(-100, 100, width=32), st.sampled_from(ODD_FLOATS), st.floats())


@dataclass
class Stream:
    clock: int
    items: list[tuple[bytes, Verdict]] = field(default_factory=list)
    pause_s: float = 0.0  # REALTIME: between requests, so that ticks run on the odd inputs

    def expected(self) -> Verdict:
        """The status the contract predicts: the first item's that is not clean; OK when all are."""
        for _, verdict in self.items:
            if verdict != CLEAN:
                return verdict
        return grpc.StatusCode.OK


class Choose(Protocol):
    def one(self, options: Sequence[T]) -> T: ...
    def integer(self, lo: int, hi: int) -> int: ...
    def boolean(self) -> bool: ...
    def some(self, options: Sequence[T], max_size: int, unique: bool = False) -> list[T]: ...
    def any_float(self) -> float: ...
    def text(self, max_size: int) -> str: ...
    def binary(self, min_size: int, max_size: int) -> bytes: ...


class Drawn:
    """Choices drawn by hypothesis (inside an `st.composite`)."""

    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw

    def one(self, options: Sequence[T]) -> T:
        return self.draw(st.sampled_from(options))

    def integer(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, hi))

    def boolean(self) -> bool:
        return self.draw(st.booleans())

    def some(self, options: Sequence[T], max_size: int, unique: bool = False) -> list[T]:
        return self.draw(st.lists(st.sampled_from(options), max_size=max_size, unique=unique))

    def any_float(self) -> float:
        return self.draw(ANY_FLOAT)

    def text(self, max_size: int) -> str:
        return self.draw(st.text(max_size=max_size))

    def binary(self, min_size: int, max_size: int) -> bytes:
        return self.draw(st.binary(min_size=min_size, max_size=max_size))


class Seeded:
    """The same kinds of choice from a seeded random.Random: cheap, and reproducible from the seed."""

    def __init__(self, seed: int | str) -> None:
        self.rng = random.Random(seed)

    def one(self, options: Sequence[T]) -> T:
        return options[self.rng.randrange(len(options))]

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def boolean(self) -> bool:
        return self.rng.random() < 0.5

    def some(self, options: Sequence[T], max_size: int, unique: bool = False) -> list[T]:
        if unique:
            return self.rng.sample(list(options), self.rng.randint(0, min(max_size, len(options))))
        return [self.one(options) for _ in range(self.rng.randint(0, max_size))]

    def any_float(self) -> float:
        kind = self.rng.randrange(3)
        if kind == 0:  # a plausible value, as float32
            return struct.unpack("<f", struct.pack("<f", self.rng.uniform(-100, 100)))[0]
        if kind == 1:
            return self.one(ODD_FLOATS)
        return struct.unpack("<d", self.rng.randbytes(8))[0]  # any double: NaN payloads, subnormals, huge

    def text(self, max_size: int) -> str:
        # ASCII, the rest of the basic plane below the surrogates, the astral planes (UTF-8 on the wire)
        planes = ((0, 0x80), (0x80, 0xD800), (0x10000, 0x110000))
        return "".join(chr(self.rng.randrange(*self.one(planes))) for _ in range(self.rng.randint(0, max_size)))

    def binary(self, min_size: int, max_size: int) -> bytes:
        return self.rng.randbytes(self.rng.randint(min_size, max_size))


def pick(c: Choose, tidy: bool, clean: list[T], faulty: list[T]) -> T:
    """One of `clean`, or (unless the stream is tidy) of `clean + faulty`."""
    return c.one(clean if tidy else clean + faulty)


def float_row(c: Choose, seq: int, size: int) -> list[float]:
    """A plausible sensor row with a few odd values dropped in, of `size` values."""
    row = (sensor(seq) * 4)[:size]
    for k in c.some(range(size), 4) if size else []:
        row[k] = c.any_float()
    return row


def opening(c: Choose, schema_hash: str, clock: int, tidy: bool) -> tuple[pb.OpenSession, Verdict]:
    verdict: Verdict = CLEAN
    clock = pick(c, tidy, [clock] * 6, [0, 3, -7])
    if clock not in (REALTIME, LOCKSTEP):
        verdict = INVALID
    expected_hash = pick(c, tidy, ["", "", schema_hash], ["0" * 16])
    if expected_hash == "0" * 16 and verdict == CLEAN:
        verdict = grpc.StatusCode.FAILED_PRECONDITION
    # past an hour (SessionLimits.max_observation_period_ns) is refused as a negative period is
    period = pick(c, tidy, [0, 0, 100 * MS, 1, HOUR_NS, c.integer(0, 10**9)], [-1, -(10**9), HOUR_NS + 1, INT64_MAX])
    names = ["ego_speed", "ego_accel", "lead_distance", "lead_rel_speed", "yaw_rate"]
    provided = [] if c.boolean() else c.some(names, 4, unique=True)
    if not tidy and c.integer(0, 4) == 0:
        provided.append(c.one(["no_such_feature", ""]))
        verdict = INVALID if verdict == CLEAN else verdict
    if not 0 <= period <= HOUR_NS and verdict == CLEAN:
        verdict = INVALID
    msg = pb.OpenSession(
        session_id="" if c.boolean() else c.text(24),
        clock=clock,  # type: ignore[arg-type]  # an unknown enum number on purpose
        shadow=c.boolean(),
        include_decision_vector=c.boolean(),
        expected_schema_hash=expected_hash,
        observation_period_ns=period,
        provided_features=provided,
        require_plan=c.boolean(),
        actual_controls_are_commands=c.boolean(),
    )
    return msg, verdict


def observation(
    c: Choose, clock: int, prev_seq: int, prev_ts: int | None, tidy: bool
) -> tuple[pb.Observation, Verdict]:
    verdict: Verdict = CLEAN

    def fault(v: Verdict) -> None:
        nonlocal verdict
        if verdict == CLEAN:
            verdict = v

    # seq: from 1, strictly increasing
    how = pick(c, tidy, ["next"] * 6 + ["jump", "huge"], ["same", "back", "zero"])
    if how == "next" or (how == "huge" and prev_seq >= 2**63):
        seq = prev_seq + 1
    elif how == "jump":
        seq = prev_seq + c.integer(2, 10**6)
    elif how == "huge":
        seq = 2**63 + c.integer(0, 2**20)
    else:
        seq = {"same": prev_seq, "back": max(prev_seq - 1, 0), "zero": 0}[how]
        fault(INVALID)
    seq = min(seq, UINT64_MAX)
    # timestamps: LOCKSTEP strictly increasing within the gap limit, REALTIME never decreasing
    if prev_ts is None:
        ts = c.one([0, 0, 10**12, -(10**9), INT64_MAX - 10**12])
    else:
        # mostly one tick per observation, as sensors send; now and then a gap the executor steps through
        fine = [5 * MS] * 12 + [10 * MS, c.integer(1 * MS, 200 * MS)]
        step = pick(c, tidy, fine + ([0] if clock == REALTIME else []), [0, -1, -(10**9), 3 * LOCKSTEP_MAX_GAP_NS])
        ts = max(-(2**63), min(prev_ts + step, INT64_MAX))
        if ts < prev_ts or (clock == LOCKSTEP and ts == prev_ts):
            fault(INVALID)
        elif clock == LOCKSTEP and ts - prev_ts > LOCKSTEP_MAX_GAP_NS:
            fault(INVALID)
    n = pick(c, tidy, [N_FEATURES] * 8, [0, N_FEATURES - 1, N_FEATURES + 1, 64])
    if n != N_FEATURES:
        fault(INVALID)
    obs = pb.Observation(seq=seq, timestamp_ns=ts, features=float_row(c, seq, n))
    obs.sent_time_ns = c.one([0, 0, time.time_ns(), -1, INT64_MAX, -(2**63), time.time_ns() + 10**12])
    if c.integer(0, 2) == 0:  # a plan
        n_plan = pick(c, tidy, [N_PLAN] * 6, [0, 2, 7])
        obs.plan.plan_id = c.one(["", "p", "q", "\x00", "plan-é"])
        obs.plan.values.extend(float_row(c, seq + 7, n_plan))
        obs.plan.valid_for_ns = pick(c, tidy, [0, 0, 300 * MS, INT64_MAX], [-1])
        obs.plan.created_ns = pick(c, tidy, [0, 0, ts, max(ts - 100 * MS, -(2**63))], [ts + 1, -(2**63)])
        if n_plan != N_PLAN or obs.plan.valid_for_ns < 0:
            fault(INVALID)
        elif obs.plan.created_ns != 0 and obs.plan.created_ns > ts:
            fault(INVALID)
        elif obs.plan.created_ns != 0 and obs.plan.created_ns < ts - 10**12:
            fault(UNKNOWN)  # an age beyond int64 arithmetic's comfort: any documented answer
    if c.integer(0, 2) == 0:  # what the vehicle did
        obs.actual.action_index = pick(c, tidy, [-1, 0, 2, 3], [4, -2, 2**31 - 1])
        n_controls = pick(c, tidy, [0, N_CONTROLS, N_CONTROLS, N_CONTROLS], [1, 3])
        obs.actual.controls.extend(c.any_float() for _ in range(n_controls))
        if not -1 <= obs.actual.action_index < N_ACTIONS or n_controls not in (0, N_CONTROLS):
            fault(INVALID)
    return obs, verdict


def drive_stream(c: Choose, schema_hash: str, clock: int) -> Stream:
    # half the streams keep to the contract's structure (their values are still odd: NaN, inf, huge),
    # so that the server's answers are reached, not only its first refusal
    tidy = c.boolean()
    open_msg, open_verdict = opening(c, schema_hash, clock, tidy)
    out = Stream(open_msg.clock)
    first = pick(c, tidy, ["open"] * 12, ["observation", "empty", "garbage", "nothing"])
    if first == "nothing":
        return out  # a stream that ends before its first message: OK, no session
    if first == "open":
        out.items.append((pb.DriveRequest(open=open_msg).SerializeToString(), open_verdict))
    elif first == "observation":
        obs, _ = observation(c, LOCKSTEP, 0, None, tidy)
        out.items.append((pb.DriveRequest(observation=obs).SerializeToString(), INVALID))
    elif first == "empty":
        out.items.append((b"", INVALID))
    else:
        out.items.append((c.binary(1, 40), UNKNOWN))
    prev_seq, prev_ts = 0, None
    for _ in range(c.integer(0, 12)):
        kind = pick(c, tidy, ["observation"] * 12, ["open", "empty", "garbage", "oversize"])
        if kind == "observation":
            obs, verdict = observation(c, out.clock, prev_seq, prev_ts, tidy)
            out.items.append((pb.DriveRequest(observation=obs).SerializeToString(), verdict))
            if verdict == CLEAN:
                prev_seq, prev_ts = obs.seq, obs.timestamp_ns
        elif kind == "open":
            out.items.append((pb.DriveRequest(open=open_msg).SerializeToString(), INVALID))
        elif kind == "empty":
            out.items.append((b"", INVALID))
        elif kind == "oversize":  # past max_receive_message_bytes (4 MiB): gRPC refuses it
            head = pb.DriveRequest(observation=pb.Observation(seq=prev_seq + 1, timestamp_ns=(prev_ts or 0) + 5 * MS))
            out.items.append((head.SerializeToString() + _oversize_features(), grpc.StatusCode.RESOURCE_EXHAUSTED))
        else:
            out.items.append((c.binary(1, 40), UNKNOWN))
    if out.clock == REALTIME:
        out.pause_s = c.one([0.001, 0.003, 0.006])
    return out


@functools.cache
def _oversize_features() -> bytes:
    """A DriveRequest holding only OVERSIZE_ROW's features, serialized once (~50 ms each time): appended
    to another request's bytes it merges into that request's observation, as protobuf parsing does."""
    return pb.DriveRequest(observation=pb.Observation(features=OVERSIZE_ROW)).SerializeToString()


@st.composite
def streams(draw: st.DrawFn, schema_hash: str, clock: int) -> Stream:
    """The grammar as a hypothesis strategy."""
    return drive_stream(Drawn(draw), schema_hash, clock)
