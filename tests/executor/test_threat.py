"""The threat assessor's run of a stuck gap (`ThreatAssessor.follow`): the replay's `follow_rows` over
a run of clean ticks leaves it exactly as tick-by-tick `follow` does, on seeded random readings with
stuck gaps, dropped flags, NaN, pauses and relative-speed steps."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dualloop.executor.threat import GapRun, ThreatAssessor, ThreatConfig

TICK = 5_000_000
FEATURES = ["ego_speed", "lead_present", "lead_distance", "lead_rel_speed"]


def _readings(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ticks ns, rows (n, F) float32, usable): a lead whose gap sticks in runs."""
    ticks = np.cumsum(np.where(rng.random(n) < 0.01, 700_000_000, TICK)).astype(np.int64)  # now and then a pause
    x = np.zeros((n, len(FEATURES)), np.float32)
    gap, rel, stuck = 40.0, -3.0, None
    for k in range(n):
        rel += rng.normal(0.0, 0.05) + (rng.choice([-5.0, 5.0]) if rng.random() < 0.005 else 0.0)
        if rng.random() > 0.3:  # a held reading repeats the relative speed too
            gap += rel * TICK / 1e9
        if stuck is None and rng.random() < 0.02:
            stuck = gap
        elif stuck is not None and rng.random() < 0.01:
            stuck = None
        x[k] = (20.0, 1.0, gap if stuck is None else stuck, rel)
    x[rng.random(n) < 0.01, 1] = 0.0
    x[rng.random((n, len(FEATURES))) < 0.003] = np.nan
    return ticks, x, rng.random(n) > 0.01


def _state(run: GapRun) -> tuple[bytes, ...]:
    values = dataclasses.astuple(run)
    return tuple(np.float64(v).tobytes() if isinstance(v, float) else repr(v).encode() for v in values)


@pytest.mark.parametrize("seed", range(6))
def test_follow_rows_leaves_the_run_as_tick_by_tick(seed: int) -> None:
    rng = np.random.default_rng(seed)
    threat = ThreatAssessor(ThreatConfig(), FEATURES)
    ticks, x, usable = _readings(rng, 4000)
    ref, got = GapRun(), GapRun()
    cuts = np.sort(rng.choice(np.arange(1, len(ticks)), 60, replace=False))
    reckoned = 0
    for a, b in zip(np.concatenate(([0], cuts)), np.concatenate((cuts, [len(ticks)]))):
        for k in range(a, b):
            p, g, r = (float(v) for v in x[k, 1:]) if usable[k] else (np.nan,) * 3
            threat.follow(ref, int(ticks[k]), p, g, r)
            reckoned += ref.moved != 0.0 and ref.last_ns - ref.start_ns > 200_000_000
        threat.follow_rows(got, ticks[a:b], x[a:b], usable[a:b])
        assert _state(got) == _state(ref), (a, b)
    assert reckoned > 100  # ticks in runs of a stuck gap long enough to reckon


def test_the_comparison_can_fail() -> None:
    """A run one tick short of the reference's is seen."""
    rng = np.random.default_rng(0)
    threat = ThreatAssessor(ThreatConfig(), FEATURES)
    ticks, x, usable = _readings(rng, 400)
    ref, got = GapRun(), GapRun()
    for k in range(400):
        threat.follow(ref, int(ticks[k]), *(float(v) for v in x[k, 1:]))
    threat.follow_rows(got, ticks[:399], x[:399], np.ones(399, bool))
    assert _state(got) != _state(ref)
