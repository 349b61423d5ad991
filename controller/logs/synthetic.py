"""Logs made from the real drive for replay tests and `dualloop bench replay` (no simulator: fast).

REAL_DRIVE is the converted comma2k19 segment that ships as a test fixture (tests/fixtures/README.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dualloop.controller.logs.format import REQUIRE_PLAN_DETAIL
from dualloop.controller.logs.logfile import read_log, write_log
from dualloop.sim import schema
from dualloop.sim.sensors import NOMINAL_SIGMA
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import log_pb2

REAL_DRIVE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "comma2k19-example1.mcap"


def synthetic_log(
    path: Path,
    seconds: float = 60.0,
    rate_hz: float = 200.0,
    seed: int = 0,
    plan_every_s: float = 0.2,
    faults: bool = False,
) -> Path:
    """The fixture's features resampled to `rate_hz` with the simulator's sensor noise, a client plan every
    `plan_every_s` (target speed varying), and the fixture's actual actions.

    faults (needs seconds >= 5): every way a tick can go wrong, at fixed times: inputs scaled far out
    of distribution (1.0-1.6 s: gate veto, hold, fallback, recovery), a NaN observation (2.0 s), a
    dead sensor (2.2-2.25 s), frozen inputs (2.6-2.8 s), a gap with no observations (3.0-3.05 s),
    and no more plans after 3.2 s (stale plan: the session requires plans, REQUIRE_PLAN_DETAIL)."""
    src = read_log(REAL_DRIVE)
    feats = np.array([list(o.features) for o in src.observations], np.float32)
    actual = [o.actual for o in src.observations]
    rng = np.random.default_rng(seed)
    n = int(seconds * rate_hz)
    period_ns = int(round(1e9 / rate_hz))
    plan_every = max(1, int(round(plan_every_s * rate_hz)))
    obs, frozen = [], None
    for i in range(n):
        j = min(int(i * 100 / rate_hz), len(feats) - 1)
        x = feats[j] + (NOMINAL_SIGMA * rng.standard_normal(feats.shape[1])).astype(np.float32)
        t = i / rate_hz
        if faults:
            if 3.0 <= t < 3.05:
                continue
            x = x * 5.0 if 1.0 <= t < 1.6 else x
            x = np.full_like(x, np.nan) if abs(t - 2.0) < 0.5 / rate_hz else x
            x = np.zeros_like(x) if 2.2 <= t < 2.25 else x
            if t < 2.6:
                frozen = x
            elif t < 2.8:
                x = frozen
        msg = pb.Observation(seq=i + 1, timestamp_ns=1_000_000_000 + i * period_ns, features=x.tolist())
        msg.actual.CopyFrom(actual[j])
        if i % plan_every == 0 and not (faults and t > 3.2):
            k = i // plan_every
            values = schema.make_plan(25.0 + 3.0 * np.sin(k / 10), 0.0, schema.BEHAVIOURS.index("keep"))
            msg.plan.plan_id = f"p{k}"
            msg.plan.values.extend(np.asarray(values, np.float32).tolist())
        obs.append(msg)
    header = log_pb2.SessionHeader(
        session_id="synthetic",
        clock=pb.CLOCK_MODE_LOCKSTEP,
        shadow=True,
        config_json="{}",
        source=f"synthetic {seconds:g} s at {rate_hz:g} Hz, seed {seed}",
        feature_names=src.header.feature_names,
        action_names=src.header.action_names,
        control_names=src.header.control_names,
        tick_period_ns=period_ns,
    )
    if faults:
        header.source_details[REQUIRE_PLAN_DETAIL] = "true"
    return write_log(path, header, obs)


def slice_log(path: Path, start: int, count: int, session_id: str) -> Path:
    src = read_log(REAL_DRIVE)
    header = log_pb2.SessionHeader()
    header.CopyFrom(src.header)
    header.session_id = session_id
    return write_log(path, header, src.observations[start : start + count])
