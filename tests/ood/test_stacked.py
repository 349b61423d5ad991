"""The per-tick fast path equals straightforward reference computations.

StackedScorer scores several gates in one pass with the normalisation folded into an expansion of
the distance; these tests compare it with the textbook definition (normalise, centre, solve with
the covariance) on random data, and GateBank (one pass of filters and gate selection) with
per-gate monitors combined the way the executor combined them before.
"""

from __future__ import annotations

import numpy as np
import pytest

from dualloop import ood
from dualloop.ood.mahalanobis import GateScorer, StackedScorer
from tests.ood.gate_data import clustered_stats


def _reference_d2(x: np.ndarray, stats: ood.GateStats) -> np.ndarray:
    """Mahalanobis score by definition: z = x / ||x||, d2 = (z - mu) cov^-1 (z - mu)^T (tied: min
    over class means, relative: minus the distance to the background Gaussian)."""
    x = np.asarray(x, np.float64)
    x = x / np.maximum(np.abs(x).max(axis=1, initial=0.0), np.finfo(np.float64).tiny)[:, None]  # same direction
    z = x / np.maximum(np.linalg.norm(x, axis=1), np.finfo(np.float64).tiny)[:, None]

    def maha(mu: np.ndarray, cov: np.ndarray) -> np.ndarray:
        r = z - mu
        return np.einsum("ij,ij->i", r, np.linalg.solve(cov, r.T).T)

    if stats.variant == "single":
        return maha(stats.center, stats.covariance)
    d2 = np.maximum(np.min([maha(m, stats.covariance) for m in stats.class_means], axis=0), 0.0)
    if stats.variant == "relative":
        d2 = d2 - maha(stats.center, stats.bg_covariance)
    return d2


def _fitted(rng: np.random.Generator, d: int, variant: str) -> ood.GateStats:
    return clustered_stats(rng, d, variant, classes=4, n=3000)


def _rows(rng: np.random.Generator, stats: ood.GateStats, n: int) -> np.ndarray:
    """In- and out-of-distribution rows at very different scales, one all-zero row."""
    base = stats.center + rng.normal(size=(n, stats.dim)) * 0.3
    base[n // 2 :] = rng.normal(size=(n - n // 2, stats.dim))  # far from the training direction
    base *= 10.0 ** rng.uniform(-3, 3, size=(n, 1))
    base[0] = 0.0
    return base


@pytest.mark.parametrize("variant", ["single", "tied", "relative"])
@pytest.mark.parametrize("seed", [0, 1])
def test_scores_equal_the_definition(variant: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    stats = _fitted(rng, 13, variant)
    x = _rows(rng, stats, 64)
    d2, flags = GateScorer(stats).score(x)
    np.testing.assert_allclose(d2, _reference_d2(x, stats), rtol=1e-9, atol=1e-9)
    assert not flags.nonfinite.any()


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the 1e300 row, as in test_ood_score
def test_several_gates_in_one_pass_equal_each_gate_alone() -> None:
    rng = np.random.default_rng(5)
    stats = [
        _fitted(rng, 19, "single"),
        _fitted(rng, 64, "single"),
        _fitted(rng, 7, "tied"),
        _fitted(rng, 30, "relative"),
    ]
    thresholds, lows, highs = [50.0, 80.0, 20.0, 5.0], [0.5, 1.0, 0.1, 2.0], [300.0, 40.0, 1e4, 30.0]
    stacked = StackedScorer(stats, thresholds, lows, highs, max_batch=4)
    for batch in (1, 3, 9):  # 9 grows the buffers
        rows = [_rows(rng, s, batch) for s in stats]
        rows[1][batch // 2, 5] = np.nan  # a NaN in one gate's features leaves the others alone
        rows[3][-1] *= 1e300  # squares overflow: rescaled, outside the band
        got = stacked.score_rows(batch, rows)
        for g, s in enumerate(stats):
            want_d2, want = GateScorer(s, thresholds[g], lows[g], highs[g]).score(rows[g])
            entries = slice(g, None, len(stats))
            np.testing.assert_allclose(got.score[entries], want_d2, rtol=1e-12)
            assert got.nonfinite[entries] == want.nonfinite.tolist()
            assert got.norm_out[entries] == want.norm_out.tolist()
            assert got.exceed[entries] == want.exceed.tolist()
            assert got.immediate[entries] == want.immediate.tolist()
            ok = np.isfinite(rows[g]).all(axis=1)
            np.testing.assert_allclose(
                np.array(got.score[entries])[ok], _reference_d2(rows[g][ok], s), rtol=1e-9, atol=1e-9
            )
    assert got.nonfinite[1 + len(stats) * (9 // 2)] and not any(got.nonfinite[: len(stats)])


# 1e170 squared is the overflow under test (the scorer vetoes the row); numpy's warning about it is expected
@pytest.mark.filterwarnings("ignore:overflow encountered in vecdot:RuntimeWarning")
def test_many_rows_score_as_the_per_row_pass_does(monkeypatch):
    """Above _VECTORISED_FROM rows, single-variant gates are scored with numpy instead of a Python
    pass: bit-identical scores and flags, NaN/Inf, all-zero and overflowing rows included."""
    from dualloop.ood import mahalanobis as score_module

    rng = np.random.default_rng(11)
    stats = ood.fit_statistics(rng.normal(size=(500, 6)), variant="single")
    x = rng.normal(size=(400, 6)) * rng.uniform(0.01, 100.0, size=(400, 1))
    x[3], x[4], x[5], x[6, 2] = np.nan, 0.0, 1e170, np.inf
    scorer = ood.GateScorer(stats, threshold=5.0, norm_low=0.5, norm_high=80.0, max_batch=400)
    fast = scorer.score(x)
    monkeypatch.setattr(score_module, "_VECTORISED_FROM", 10**9)
    slow = scorer.score(x)
    assert np.array_equal(fast[0], slow[0])
    assert all(np.array_equal(a, b) for a, b in zip(fast[1], slow[1]))
    assert fast[1].nonfinite[[3, 6]].all() and fast[1].norm_out[[4, 5]].all() and fast[1].exceed.any()
