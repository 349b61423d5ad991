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


@pytest.mark.parametrize("seed", [0, 1])
def test_freeze_scan_equals_updates(seed):
    rng = np.random.default_rng(seed)
    dim, slot = 5, 1
    stepped, scanned = FreezeDetector(3, dim, repeats=2), FreezeDetector(3, dim, repeats=2)
    seen = []
    for length in (1, 300, 40):
        x = rng.normal(size=(length, dim)).astype(np.float32)
        for start in rng.integers(0, length, size=length // 20):  # frozen stretches
            x[start : start + rng.integers(2, 12)] = x[start]
        x[rng.random(length) < 0.01] = np.nan
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


@pytest.mark.parametrize("seed", [0, 1])
def test_change_scan_equals_steps(seed):
    """The replay's changes between observations equal a live session's, fresh ticks or not, with
    NaN observations (no change, and the next change is measured from the last finite one)."""
    from dualloop.ood.change import ChangeTracker

    rng = np.random.default_rng(seed)
    dim, slot = 4, 2
    stepped, scanned = ChangeTracker(3, dim), ChangeTracker(3, dim)
    for length in (1, 200, 30):  # consecutive scans continue from each other's state
        x = rng.normal(size=(length, dim)).astype(np.float32)
        x[rng.random(length) < 0.05] = np.nan
        finite = np.isfinite(x).all(axis=1)
        # a live session: each observation is fresh on its first tick, then reused by 0-2 more ticks
        expected = []
        for i in range(length):
            for repeat in range(1 + int(rng.integers(0, 3))):
                got = stepped.step(x[i : i + 1], [slot], [repeat == 0], [bool(finite[i])])[0]
                if repeat == 0:
                    expected.append(got)
                else:  # a reused observation reports the change it made
                    np.testing.assert_array_equal(got, expected[-1])
        scan = scanned.scan(x, finite, slot)
        np.testing.assert_array_equal(scan, np.array(expected))
        last_a, change_a = stepped.state
        last_b, change_b = scanned.state
        assert last_a[slot] == last_b[slot]
        np.testing.assert_array_equal(change_a[slot], change_b[slot])
    # the very first observation of a slot, and every NaN one, have no change
    first = ChangeTracker(1, dim).scan(rng.normal(size=(3, dim)).astype(np.float32), np.ones(3, bool), 0)
    assert np.isnan(first[0]).all() and np.isfinite(first[1:]).all()
