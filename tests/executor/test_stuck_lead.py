"""The runs of repeated lead readings and the gap's trend (executor/stuck_lead.py): the replay's
`follow_rows` over a run of clean ticks leaves them exactly as tick-by-tick `follow` does, on seeded
random readings with a stuck gap or a stuck relative speed in runs, dropped flags, NaN, pauses and
relative-speed steps; and what stands in for the stuck or doubted reading."""

from __future__ import annotations

import dataclasses
from collections import deque

import numpy as np
import pytest

from dualloop.executor.stuck_lead import LeadDoubt, LeadRuns, StuckReadings, TimedReadings
from dualloop.executor.threat import ThreatConfig

TICK = 5_000_000


def _stuck() -> StuckReadings:
    c = ThreatConfig()
    return StuckReadings(
        c.max_reading_gap_s, c.stuck_gap_reckon_s, c.stuck_after_s, c.new_lead_rel_step, c.rate_window_s
    )


def _readings(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(ticks ns, lead (n, 3): flag, gap, relative speed): a lead whose gap or relative speed sticks in runs."""
    ticks = np.cumsum(np.where(rng.random(n) < 0.01, 700_000_000, TICK)).astype(np.int64)  # now and then a pause
    lead = np.zeros((n, 3))
    gap, rel, stuck, which = 40.0, -3.0, None, 1
    for k in range(n):
        rel += rng.normal(0.0, 0.05) + (rng.choice([-5.0, 5.0]) if rng.random() < 0.005 else 0.0)
        held = rng.random() < 0.3  # a held observation repeats both readings
        gap += 0.0 if held else rel * TICK / 1e9
        if stuck is None and rng.random() < 0.02:
            which = int(rng.integers(1, 3))
            stuck = gap if which == 1 else rel
        elif stuck is not None and rng.random() < 0.01:
            stuck = None
        row = [1.0, gap, rel]
        if stuck is not None:
            row[which] = stuck
        lead[k] = lead[k - 1] if held and k else row
    lead[rng.random(n) < 0.01, 0] = 0.0
    lead[rng.random((n, 3)) < 0.003] = np.nan
    return ticks, lead.astype(np.float32).astype(np.float64)


def _state(run: LeadRuns) -> tuple[bytes, ...]:
    values = [*dataclasses.astuple(run)]
    return tuple(np.float64(v).tobytes() if isinstance(v, float) else repr(v).encode() for v in values)


@pytest.mark.parametrize("seed", range(6))
def test_follow_rows_leaves_the_runs_as_tick_by_tick(seed: int) -> None:
    rng = np.random.default_rng(seed)
    stuck = _stuck()
    ticks, lead = _readings(rng, 4000)
    ref, got = LeadRuns(), LeadRuns()
    cuts = np.sort(rng.choice(np.arange(1, len(ticks)), 60, replace=False))
    stood_in = {"gap": 0, "rel": 0, "trend": 0}
    for a, b in zip(np.concatenate(([0], cuts)), np.concatenate((cuts, [len(ticks)]))):
        for k in range(a, b):
            stuck.follow(ref, int(ticks[k]), *(float(v) for v in lead[k]))
            gap, rel = stuck.stand_in(ref, int(ticks[k]), float(lead[k, 1]), float(lead[k, 2]))
            stood_in["gap"] += gap == gap and gap != lead[k, 1]
            stood_in["rel"] += rel == rel and rel != lead[k, 2]
            _, trend = stuck.stand_in(ref, int(ticks[k]), float(lead[k, 1]), float(lead[k, 2]), LeadDoubt.REL_DOUBTED)
            stood_in["trend"] += trend == trend
        stuck.follow_rows(got, ticks[a:b], lead[a:b])
        assert _state(got) == _state(ref), (a, b)
    assert stood_in["gap"] > 20 and stood_in["rel"] > 20  # both kinds of run were long enough to stand in
    assert stood_in["trend"] > 200  # and the gap's trend was long enough to read a rate from


def test_the_comparison_can_fail() -> None:
    """Runs one tick short of the reference's are seen."""
    rng = np.random.default_rng(0)
    stuck = _stuck()
    ticks, lead = _readings(rng, 400)
    ref, got = LeadRuns(), LeadRuns()
    for k in range(400):
        stuck.follow(ref, int(ticks[k]), *(float(v) for v in lead[k]))
    stuck.follow_rows(got, ticks[:399], lead[:399])
    assert _state(got) != _state(ref)


def _closing(
    stuck_column: int, ticks: int = 400, flip: bool = False
) -> tuple[LeadRuns, StuckReadings, float, float, float]:
    """A lead 40 m ahead closing at 5 m/s and 2 m/s^2 more each second, one reading stuck from tick 100
    (or, with `flip`, the relative speed's sign flipped from then on): (runs, follower, the last
    tick's true gap and relative speed, its ns)."""
    stuck, run = _stuck(), LeadRuns()
    rng = np.random.default_rng(1)
    gap, rel, held = 40.0, -5.0, None
    for k in range(ticks):
        rel -= 2.0 * TICK / 1e9
        gap += rel * TICK / 1e9
        row = [1.0, gap + rng.normal(0.0, 0.05), rel + rng.normal(0.0, 0.02)]
        if k >= 100 and flip:
            row[2] = -row[2]
        elif k >= 100:
            held = row[stuck_column] if held is None else held
            row[stuck_column] = held
        stuck.follow(run, k * TICK, *row)
        last = row
    return run, stuck, gap, rel, (ticks - 1) * TICK, last  # type: ignore[return-value]


def test_a_stuck_gap_is_its_last_reading_moved_on_by_the_relative_speed() -> None:
    run, stuck, gap, rel, now, last = _closing(1)
    got_gap, got_rel = stuck.stand_in(run, now, last[1], last[2])
    assert got_gap == pytest.approx(gap, abs=0.2) and got_rel == last[2]
    assert abs(last[1] - gap) > 8.0  # the stuck reading itself is far off


def test_a_stuck_relative_speed_is_the_gaps_rate() -> None:
    run, stuck, gap, rel, now, last = _closing(2)
    got_gap, got_rel = stuck.stand_in(run, now, last[1], last[2])
    assert got_gap == last[1]
    assert got_rel == pytest.approx(rel + 2.0 * 0.25, abs=0.3)  # the window's middle: 0.25 s ago
    assert abs(last[2] - rel) > 2.5


def test_a_doubted_relative_speed_is_the_gaps_rate() -> None:
    """Flipped, the relative speed changes every tick and never sticks: the gap's rate over the last
    window of its readings stands in for it all the same."""
    run, stuck, gap, rel, now, last = _closing(2, flip=True)
    got_gap, got_rel = stuck.stand_in(run, now, last[1], last[2], LeadDoubt.REL_DOUBTED)
    assert got_gap == last[1]
    assert got_rel == pytest.approx(rel + 2.0 * 0.25, abs=0.3)
    assert last[2] > 5.0  # the reading itself says the lead pulls away
    assert all(v != v for v in stuck.stand_in(run, now, last[1], last[2]))  # nothing stuck: no stuck stand-in


def test_a_doubted_relative_speed_beside_a_stuck_gap_stands_in_for_neither() -> None:
    run, stuck, _, _, now, last = _closing(1)
    assert all(v != v for v in stuck.stand_in(run, now, last[1], last[2], LeadDoubt.REL_DOUBTED))


def test_both_stuck_stand_in_for_neither() -> None:
    """The whole track froze: past `stuck_after_s` neither reading is healthy."""
    stuck, run = _stuck(), LeadRuns()
    for k in range(400):
        stuck.follow(run, k * TICK, 1.0, 30.0, -4.0)
    assert all(v != v for v in stuck.stand_in(run, 399 * TICK, 30.0, -4.0))


@pytest.mark.parametrize("maxlen", [3, 8, 256])
def test_the_timed_readings_keep_what_a_bounded_deque_of_pairs_did(maxlen: int) -> None:
    """Appends past maxlen, both forgetting rules and clears, against deque(maxlen) of (ns, value)
    with the loops `follow` ran on it before the readings became two flat arrays."""
    rng = np.random.default_rng(maxlen)
    readings, reference = TimedReadings(maxlen), deque(maxlen=maxlen)
    t = 0
    window = 40 * TICK
    for step in range(20_000):
        t += int(rng.integers(1, 4)) * TICK
        value = float(rng.normal(30.0, 5.0))
        roll = rng.random()
        if roll < 0.2:  # appended and the window forgotten in one call, as the gap's trend is
            readings.append(t, value, t - window)
        elif roll < 0.21:
            readings.restart(t, value)
            reference.clear()
        else:
            readings.append(t, value)
        reference.append((t, value))
        if roll < 0.2 or 0.3 <= roll < 0.5:
            if roll >= 0.2:
                readings.drop_older_than(t - window)
            while reference and t - reference[0][0] > window:
                reference.popleft()
        elif 0.5 <= roll < 0.8:
            readings.keep_one_at_or_before(t - window)
            while len(reference) > 2 and t - reference[1][0] >= window:
                reference.popleft()
        elif roll > 0.999:
            readings.clear()
            reference.clear()
        assert len(readings) == len(reference), step
        assert len(readings._t) <= 2 * maxlen  # what was forgotten is trimmed, not kept growing
        if reference and step % 97 == 0:
            assert list(readings) == list(reference), step
    assert list(readings) == list(reference) and len(reference) > 2
    assert readings != TimedReadings(maxlen)  # equal only to the same readings
    twin = TimedReadings(maxlen)
    for t_ns, value in reference:
        twin.append(t_ns, value)
    assert twin == readings and repr(twin) == repr(readings)
    twin.append(t + 1, 0.0)
    assert twin != readings
