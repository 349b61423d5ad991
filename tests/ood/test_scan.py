"""The replay scans (one slot over many ticks) equal tick-by-tick updates, alarms and final state."""

from __future__ import annotations

import numpy as np
import pytest

from dualloop.ood.filter import CusumFilter, CusumSettings, KOfNFilter, KOfNSettings
from dualloop.ood.freeze import FreezeDetector


def _bursty(rng: np.random.Generator, n: int, p: float) -> np.ndarray:
    # runs of exceedances as well as isolated ones, so windows fill up and drain
    base = rng.random(n) < p
    return base | np.convolve(rng.random(n) < p / 4, np.ones(6))[:n].astype(bool)


@pytest.mark.parametrize(
    "make",
    [
        lambda: KOfNFilter(KOfNSettings(3, 5), 4),
        lambda: KOfNFilter(KOfNSettings(1, 1), 4),
        lambda: KOfNFilter(KOfNSettings(7, 64), 4),
        lambda: CusumFilter(CusumSettings(3.0, 0.5), 4),
        lambda: CusumFilter(CusumSettings(2.5, 0.3, cap=6.0), 4),
    ],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_filter_scan_equals_updates(make, seed):
    rng = np.random.default_rng(seed)
    stepped, scanned = make(), make()
    slot, seen = 2, []
    for length in (1, 3, 200, 1, 57):  # consecutive scans continue from each other's state
        exceed = _bursty(rng, length, 0.1)
        immediate = rng.random(length) < 0.02
        expected = np.array(
            [stepped.update(exceed[i : i + 1], immediate[i : i + 1], np.array([slot]))[0] for i in range(length)]
        )
        got = scanned.scan(exceed, immediate, slot)
        assert got.tolist() == expected.tolist()
        seen += got.tolist()
    assert any(seen) and not all(seen)
    assert scanned.state.tolist() == stepped.state.tolist()  # k-of-n windows or CUSUM statistics


@pytest.mark.parametrize("profile", ["all", "rest", "masked"])
@pytest.mark.parametrize("seed", [0, 1])
def test_freeze_scan_equals_updates(seed, profile):
    """Tick by tick and over a whole session, the same alarms and state: every feature compared, or
    with the rest rule (repeats at speed 0 are a car at rest), or over the present features only (the
    missing ones NaN), with stretches at rest and stuck stretches at speed."""
    rng = np.random.default_rng(seed)
    dim, slot = 5, 1
    rest = None if profile == "all" else (0, 0.1)
    stepped, scanned = FreezeDetector(3, dim, 2, rest), FreezeDetector(3, dim, 2, rest)
    if profile == "masked":
        present = np.array([True, True, False, True, False])
        stepped.set_present(slot, present)
        scanned.set_present(slot, present)
    seen = []
    for length in (1, 300, 40):
        x = rng.normal(size=(length, dim)).astype(np.float32)
        for start in rng.integers(0, length, size=length // 20):  # frozen stretches
            x[start : start + rng.integers(2, 12)] = x[start]
        for start in rng.integers(0, length, size=length // 30):  # at rest: speed 0 (or tiny), all repeated
            x[start : start + rng.integers(2, 12)] = x[start] * np.array([0.0, 0, 1, 1, 1], np.float32)
        x[x[:, 0] == 0.0, 0] = rng.choice([0.0, 0.1, -0.05, 0.10001])  # on and off the rest limit
        x[rng.random(length) < 0.01] = np.nan
        if profile == "masked":
            x[:, [2, 4]] = np.nan
        fresh = rng.random(length) < 0.6
        expected = np.array(
            [stepped.update(x[i : i + 1], np.array([slot]), fresh[i : i + 1])[0] for i in range(length)]
        )
        got = scanned.scan(x, slot, fresh)
        assert got.tolist() == expected.tolist()
        seen += got.tolist()
    assert any(seen) and not all(seen)
    (last_a, count_a), (last_b, count_b) = scanned.state, stepped.state
    assert count_a.tolist() == count_b.tolist()
    np.testing.assert_array_equal(last_a, last_b)


def test_a_car_at_rest_is_not_a_freeze_and_a_stuck_sensor_at_speed_is():
    """Speed 0, acceleration 0, the same gap: a stopped car repeats itself exactly, for ever; a sensor
    stuck at 20 m/s alarms at its second repeat. Without the rest rule the stopped car would alarm."""
    stopped = np.array([[0.0, 0.0, 1.0, 7.5, 0.0]], np.float32)
    stuck = np.array([[20.0, 0.3, 1.0, 40.0, -0.5]], np.float32)
    for make in (lambda: FreezeDetector(1, 5, 2, (0, 0.1)), lambda: FreezeDetector(1, 5, 2)):
        det = make()
        at_rest = [det.update(stopped, [0], np.array([True]))[0] for _ in range(50)]
        assert not any(at_rest) if det.rest is not None else at_rest[2:] == [True] * 48
        det.reset(0)
        moving = [det.update(stuck, [0], np.array([True]))[0] for _ in range(5)]
        assert moving == [False, False, True, True, True]
        replay = make()
        assert bool(replay.scan(np.repeat(stopped, 50, 0), 0, np.ones(50, bool)).any()) == (det.rest is None)


def test_only_present_features_are_compared():
    """A session that does not measure two features sends them as NaN, which never equals itself: its
    stuck sensor is still caught, on the features it measures; a change in a measured one resets."""
    present = np.array([True, True, False, True, False])
    row = np.array([[20.0, 0.3, np.nan, 40.0, np.nan]], np.float32)
    det, plain = FreezeDetector(1, 5, 2, (0, 0.1)), FreezeDetector(1, 5, 2, (0, 0.1))
    det.set_present(0, present)
    assert [det.update(row, [0], np.array([True]))[0] for _ in range(4)] == [False, False, True, True]
    assert not any(plain.update(row, [0], np.array([True]))[0] for _ in range(4))  # NaN: never a repeat
    moved = row.copy()
    moved[0, 3] += 0.5
    assert not det.update(moved, [0], np.array([True]))[0]
    det.set_present(0, None)
    assert not det.update(moved, [0], np.array([True]))[0]


def _irregular_times(rng: np.random.Generator, n: int, hz: float, start: int = 0) -> np.ndarray:
    """Sensor timestamps (int ns) at about ``hz``: the period jitters by up to +-30%, and now and then
    an observation is late by up to two periods (a real sensor's clock over a real link)."""
    period = 1e9 / hz
    gaps = period * (1.0 + rng.uniform(-0.3, 0.3, n))
    gaps[rng.random(n) < 0.05] += period * rng.uniform(0.5, 2.0)
    return start + np.cumsum(np.round(gaps).astype(np.int64))


@pytest.mark.parametrize("hz", [10.0, 20.0, 100.0, 200.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_change_scan_equals_steps(seed, hz):
    """The replay's rates of change between observations equal a live session's, fresh ticks or not,
    at several observation rates with irregular timestamps, with NaN observations (no rate, and the
    next one is measured from the last finite one) and features NaN in every row (a feature the
    session does not measure: no rate for it, the others measured)."""
    from dualloop.ood.change import ChangeTracker

    rng = np.random.default_rng(seed)
    dim, slot = 4, 2
    stepped, scanned = ChangeTracker(3, dim), ChangeTracker(3, dim)
    t0 = 1_700_000_000_000_000_000  # ns since the epoch: the intervals must survive large timestamps
    for length in (1, 200, 30):  # consecutive scans continue from each other's state
        x = rng.normal(size=(length, dim)).astype(np.float32)
        x[:, 3] = np.nan  # not measured
        x[rng.random(length) < 0.05] = np.nan
        finite = np.isfinite(x[:, :3]).all(axis=1)
        times = _irregular_times(rng, length, hz, t0)
        t0 = int(times[-1])
        # a live session: each observation is fresh on its first tick, then reused by 0-2 more ticks
        expected = []
        for i in range(length):
            for repeat in range(1 + int(rng.integers(0, 3))):
                got = stepped.step(x[i : i + 1], [slot], [repeat == 0], [bool(finite[i])], [int(times[i])])[0]
                if repeat == 0:
                    expected.append(got)
                else:  # a reused observation reports the rate it made
                    np.testing.assert_array_equal(got, expected[-1])
        scan = scanned.scan(x, finite, slot, times)
        assert scan.tobytes() == np.array(expected, np.float64).tobytes()
        last_a, t_a, change_a = stepped.state
        last_b, t_b, change_b = scanned.state
        assert np.array(last_a[slot]).tobytes() == np.array(last_b[slot]).tobytes() and t_a[slot] == t_b[slot]
        assert change_a[slot].tobytes() == change_b[slot].tobytes()
    assert np.isnan(scan[:, 3]).all() and np.isfinite(scan[finite][1:, :3]).all()
    # the very first observation of a slot, and every NaN one, have no rate
    first = ChangeTracker(1, dim).scan(
        rng.normal(size=(3, dim)).astype(np.float32), np.ones(3, bool), 0, [10**9, 2 * 10**9, 3 * 10**9]
    )
    assert np.isnan(first[0]).all() and np.isfinite(first[1:]).all()


def test_change_is_a_rate_per_second_at_any_observation_rate():
    """A feature moving at 2 units/s gives 2.0 at 10, 20, 100 and 200 Hz, live and in a replay; the
    same rows with a 1 ns interval would give 1e9 times the change (the limit is per second)."""
    from dualloop.ood.change import ChangeTracker

    for hz in (10, 20, 100, 200):
        period = 10**9 // hz
        times = np.arange(6, dtype=np.int64) * period + 5 * 10**9
        x = (2.0 * (times - times[0]) * 1e-9).astype(np.float32)[:, None]
        live = ChangeTracker(1, 1)
        rates = [live.step(x[i : i + 1], [0], [True], [True], [int(times[i])])[0][0] for i in range(6)]
        replay = ChangeTracker(1, 1).scan(x, np.ones(6, bool), 0, times)[:, 0]
        assert np.isnan(rates[0]) and np.allclose(rates[1:], 2.0, rtol=1e-5)
        assert np.array(rates).tobytes() == replay.tobytes()
    # an interval that is not positive gives no rate (and no division by zero)
    same = ChangeTracker(1, 1)
    same.step(np.ones((1, 1), np.float32), [0], [True], [True], [100])
    assert np.isnan(same.step(np.full((1, 1), 2.0, np.float32), [0], [True], [True], [100])[0][0])
