"""One session's tick (ood.decision.RowDecider inside GateBank.step) decides exactly as the bank's
general path: the same score bits, threshold, veto and filter state after every tick, on random rows
of every kind (nominal, far away, all-zero, out of range, jumping, NaN, Inf, overflowing, tiny) and
gates of every variant, and it hands every row it cannot take to the general path untouched."""

from __future__ import annotations

import numpy as np
import pytest

from dualloop import ood
from dualloop.ood import CusumSettings, FeatureRange, GateBank, GateMonitor, KOfNSettings, make_filter
from dualloop.ood.mahalanobis import GateScorer
from tests.ood.gate_data import clustered_stats


def _stats(rng: np.random.Generator, d: int, variant: str) -> ood.GateStats:
    return clustered_stats(rng, d, variant, classes=3, n=2000)


def _range(rng: np.random.Generator, stats: ood.GateStats, n_context: int) -> FeatureRange:
    spread = np.abs(stats.center) * 40.0 + 5.0
    return FeatureRange(
        tuple((-spread).tolist()),
        tuple(spread.tolist()),
        0.25,
        100,
        0.0,
        tuple([-3.0] * stats.dim),
        tuple([3.0] * stats.dim),
        "test",
        tuple(f"p{i}" for i in range(n_context)),
        tuple([-1.0] * n_context),
        tuple([1.0] * n_context),
    )


def _banks(
    variants: tuple[str, ...], seed: int, n_slots: int
) -> tuple[list, list[FeatureRange | None], GateBank, GateBank]:
    rng = np.random.default_rng(seed)
    dims = [19, 64, 7, 12][: len(variants)]
    stats = [_stats(rng, d, v) for d, v in zip(dims, variants)]
    ranges = [_range(rng, s, 3) if g % 2 == 0 else None for g, s in enumerate(stats)]
    filters = [KOfNSettings(2, 4), CusumSettings(2.0, 0.5), KOfNSettings(3, 5), KOfNSettings(2, 3)]

    thresholds = [
        float(np.quantile(GateScorer(s).score(s.center[None] + rng.normal(size=(200, s.dim)) * 0.05)[0], 0.9))
        for s in stats
    ]

    def bank() -> GateBank:
        monitors = []
        for g, s in enumerate(stats):
            scorer = GateScorer(
                s,
                thresholds[g],
                0.2 * float(np.linalg.norm(s.center)),
                5.0 * float(np.linalg.norm(s.center)),
                n_slots,
                ranges[g],
            )
            monitors.append(GateMonitor(scorer, make_filter(filters[g], n_slots)))
        return GateBank(monitors, n_slots)

    return stats, ranges, bank(), bank()


class _GeneralOnly:
    def step(self, *args: object) -> None:
        return None


def _row(rng: np.random.Generator, stats: ood.GateStats, kind: int) -> np.ndarray:
    x = stats.center * (1.0 + rng.normal(size=stats.dim) * 0.02)
    if kind == 1:
        x = rng.normal(size=stats.dim) * 3.0  # far from the training direction
    elif kind == 2:
        x = np.zeros(stats.dim)
    elif kind == 3:
        x = x * 1000.0  # outside the value range, and the norm band
    elif kind == 4:
        x[rng.integers(stats.dim)] = np.nan
    elif kind == 5:
        x[rng.integers(stats.dim)] = np.inf
    elif kind == 6:
        x = x * 1e160  # squares overflow: the general path rescales
    elif kind == 7:
        x = x * 1e-110  # squares below float64's comfortable range
    return x


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("variants", [("single", "single"), ("single", "tied", "relative", "single")])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_row_decider_equals_the_general_path(variants: tuple[str, ...], dtype: type) -> None:
    n_slots = 3
    stats, ranges, fast, general = _banks(variants, 7, n_slots)
    general._decider = _GeneralOnly()
    taken = [0]
    real_step = fast._decider.step

    def counting(*args: object):  # noqa: ANN202 - wraps RowDecider.step
        out = real_step(*args)
        taken[0] += out is not None
        return out

    fast._decider.step = counting
    rng = np.random.default_rng(3)
    kinds = [0] * 12 + [1, 1, 2, 3, 4, 5, 6, 7]
    vetoes = 0
    for tick in range(600):
        slot = int(rng.integers(n_slots))
        rows = [
            _row(rng, s, kinds[rng.integers(len(kinds))] if rng.random() < 0.5 else 0)[None].astype(dtype)
            for s in stats
        ]
        finite = all(np.isfinite(r).all() for r in rows)
        nan_rows = None if finite or rng.random() < 0.5 else np.array([True])  # the executor marks them; tests may not
        if any(np.isinf(r).any() for r in rows) and nan_rows is None:
            rows = [np.where(np.isinf(r), np.nan, r) for r in rows]  # the bank's callers never pass Inf unmarked
        if rng.random() < 0.05:
            rows[1] = None  # no decision vector this tick
        changes = [
            None if ranges[g] is None else (rng.normal(size=(1, s.dim)) * (1.0 if rng.random() < 0.9 else 5.0))
            for g, s in enumerate(stats)
        ]
        if rng.random() < 0.5:
            changes = [None if c is None else c.tolist() for c in changes]  # as ChangeTracker gives them
        context = [None if ranges[g] is None else rng.uniform(-1.2, 1.2, size=(1, 3)) for g in range(len(stats))]
        if rng.random() < 0.2:
            changes = None
        if rng.random() < 0.2:
            context = None
        also = [bool(rng.random() < 0.05)] if rng.random() < 0.5 else None
        a = fast.step([slot], rows, nan_rows, also, changes, context)
        b = general.step([slot], rows, nan_rows, also, changes, context)
        assert a.score.tobytes() == b.score.tobytes(), tick  # the same bits
        assert a.threshold.tobytes() == b.threshold.tobytes() and a.alarm.tolist() == b.alarm.tolist(), tick
        assert a.score.dtype == b.score.dtype and a.alarm.dtype == b.alarm.dtype and a.score.shape == (1,)
        for m_fast, m_general in zip(fast.monitors, general.monitors):
            assert m_fast.filter.slot_states == m_general.filter.slot_states, tick
        vetoes += int(a.alarm[0])
    assert 300 < taken[0] < 600  # most ticks took the one-row path; the odd rows went the general way
    assert 50 < vetoes < 600 - 30, vetoes  # both outcomes, often


def test_the_row_decider_hands_odd_rows_over_before_moving_a_filter() -> None:
    stats, _, bank, _ = _banks(("single", "single"), 1, 2)
    one = bank._decider
    for monitor in bank.monitors:
        monitor.filter.slot_states[1] = monitor.filter._zero
    clean = [s.center[None].copy() for s in stats]
    for odd in (
        [clean[0], None],
        [clean[0] * np.nan, clean[1]],
        [clean[0] * 1e170, clean[1]],
        [clean[0] * 1e-120, clean[1]],
    ):
        with np.errstate(all="ignore"):
            assert one.step(1, odd, None, None, None) is None
        assert [m.filter.slot_states[1] for m in bank.monitors] == [0, 0]
    assert one.step(1, [clean[0], np.zeros((1, stats[1].dim))], None, None, None) is not None  # zero: in-path
