"""The statistics of `dualloop bench planner` (the benchmark itself prints numbers, it is not a test)."""

from __future__ import annotations

import numpy as np
import pytest

from dualloop.controller.bench.planner import compare_turns


def _rows(rng: np.random.Generator, turns: int, scale_busy: float) -> np.ndarray:
    rows = []
    for k in range(turns):
        busy = k % 2 == 1
        late = rng.exponential(10_000.0 * (scale_busy if busy else 1.0), 300)
        rows.append(np.column_stack([np.full(300, k), np.full(300, busy), late]))
    return np.concatenate(rows).astype(np.int64)


def test_a_slower_busy_side_is_reported_with_an_interval_above_one() -> None:
    result = compare_turns(_rows(np.random.default_rng(1), 20, 3.0))
    assert result["idle"]["turns"] == result["busy"]["turns"] == 10
    assert result["idle"]["ticks"] == result["busy"]["ticks"] == 3000
    low, high = result["p99_ratio_interval_95"]
    assert 2.0 < low <= result["p99_ratio_busy_over_idle"] <= high < 4.5


def test_the_same_distribution_on_both_sides_gives_intervals_around_one() -> None:
    results = [compare_turns(_rows(np.random.default_rng(seed), 20, 1.0), resamples=500) for seed in range(10)]
    covered = sum(r["p99_ratio_interval_95"][0] < 1.0 < r["p99_ratio_interval_95"][1] for r in results)
    assert covered >= 8  # a 95% interval; 10 replications
    assert all(0.7 < r["p99_ratio_busy_over_idle"] < 1.4 for r in results)


def test_one_bad_turn_widens_the_interval_instead_of_hiding() -> None:
    rows = _rows(np.random.default_rng(3), 20, 1.0)
    rows[(rows[:, 0] == 3), 2] *= 20  # one busy turn during which the VM stalled
    low, high = compare_turns(rows)["p99_ratio_interval_95"]
    calm_low, calm_high = compare_turns(_rows(np.random.default_rng(3), 20, 1.0))["p99_ratio_interval_95"]
    assert high - low > 2 * (calm_high - calm_low)


def test_a_run_without_a_busy_turn_is_refused() -> None:
    rows = _rows(np.random.default_rng(4), 1, 1.0)
    with pytest.raises(ValueError, match="both an idle and a busy turn"):
        compare_turns(rows)
