"""A raw-input gate seen through a sensor profile (ood.marginal): the completed copy's score is the
marginal Mahalanobis distance of the present features, what the missing features held is never read,
and a profile's threshold and band come from the gate's calibration rows."""

from __future__ import annotations

import numpy as np
import pytest

from dualloop import ood
from dualloop.ood.fit import l2_normalise
from dualloop.ood.mahalanobis import GateScorer
from dualloop.ood.marginal import marginal, present_limits, profile_gate


def _correlated(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    """Rows with correlated features of different scales, mostly positive (like gaps and speeds)."""
    mix = rng.normal(size=(d, d)) * 0.4 + np.eye(d)
    return rng.normal(size=(n, d)) @ mix + rng.uniform(2.0, 30.0, d)


def _direct_marginal(stats: ood.GateStats, present: np.ndarray, z_a: np.ndarray) -> np.ndarray:
    """(z_a - mu_a)^T (Sigma_aa)^-1 (z_a - mu_a), from the covariance itself (no precision, no completion)."""
    sigma_aa = stats.covariance[np.ix_(present, present)]
    d = z_a - stats.center[present]
    return np.einsum("ij,ij->i", d, np.linalg.solve(sigma_aa, d.T).T)


def _consistent(stats: ood.GateStats, present: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Rows for which a consistent scale exists (module docstring), computed here independently."""
    m = marginal(stats, present)
    xa = x[:, present]
    kx = xa @ m.gain.T
    gamma, beta, bb = (xa**2).sum(1) + (kx**2).sum(1), kx @ m.base, m.base @ m.base
    return np.ones(len(x), bool) if bb < 1 else (beta**2 + gamma * (1 - bb) >= 0) & (beta > 0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_completed_score_is_the_marginal_distance(seed: int) -> None:
    """On random correlated data and random profiles, the gate's score of the completed copy equals the
    marginal distance of the present features (at the completed row's scale) to 1e-6 relative; and
    an unconditional-mean completion, the simpler idea, does not (the comparison can fail)."""
    rng = np.random.default_rng(seed)
    d = 9
    x = _correlated(rng, 6000, d)
    stats = ood.fit_statistics(x[:5000])
    scorer = GateScorer(stats)
    rows = x[5000:] * rng.uniform(0.8, 1.2, (1000, 1))  # nominal and a little off
    checked = 0
    for _ in range(12):
        present = rng.random(d) < rng.uniform(0.3, 0.8)
        if present.all() or not present.any():
            continue
        done = marginal(stats, present).complete(rows)
        np.testing.assert_array_equal(done[:, present], rows[:, present])  # measured values untouched
        ok = _consistent(stats, present, rows)
        score, flags = scorer.score(done)
        z_a = done[ok][:, present] / np.linalg.norm(done[ok], axis=1)[:, None]
        np.testing.assert_allclose(score[ok], _direct_marginal(stats, present, z_a), rtol=1e-6)
        assert np.isfinite(score).all() and not flags.nonfinite.any()  # and finite where no scale is consistent
        checked += int(ok.sum())
        # the training centre for the missing features (in the gate's normalised space, at the present
        # features' scale) is not the marginal
        naive = rows.copy()
        naive[:, ~present] = (
            stats.center[~present]
            * np.linalg.norm(rows[:, present], axis=1)[:, None]
            / np.linalg.norm(stats.center[present])
        )
        naive_z = l2_normalise(naive)[:, present]
        assert not np.allclose(scorer.score(naive)[0], _direct_marginal(stats, present, naive_z), rtol=1e-6)
    assert checked > 5000


def test_what_a_missing_feature_holds_is_never_read() -> None:
    """NaN, 150 m or anything else in a missing feature: the same completed copy. NaN in a present
    feature: a non-finite copy (the gate vetoes it). All present features 0: an all-zero copy (the norm
    guard vetoes it). The caller's rows are not written."""
    rng = np.random.default_rng(3)
    x = _correlated(rng, 3000, 7)
    stats = ood.fit_statistics(x)
    present = np.array([True, True, False, True, False, False, True])
    m = marginal(stats, present)
    row = x[:5].copy()
    filled, nan = row.copy(), row.copy()
    filled[:, ~present], nan[:, ~present] = 150.0, np.nan
    kept = nan.copy()
    assert m.complete(filled).tobytes() == m.complete(nan).tobytes()
    np.testing.assert_array_equal(nan, kept)
    bad = nan.copy()
    bad[2, 1] = np.nan
    done = m.complete(bad)
    assert not np.isfinite(done[2]).all() and np.isfinite(np.delete(done, 2, 0)).all()
    zero = nan.copy()
    zero[:, present] = 0.0
    assert (m.complete(zero) == 0.0).all()
    assert np.isnan(marginal(stats, np.zeros(7, bool)).complete(row)).all()  # nothing measured: nothing passes
    assert m.complete(row[0]).shape == (1, 7)


def test_a_profile_is_calibrated_on_the_gates_calibration_rows() -> None:
    """A profile's threshold is the gate's alpha quantile of its calibration rows' marginal scores (so
    its false-veto rate on fresh nominal rows stays near alpha, where the full gate's threshold would
    veto almost nothing); the range guard judges present features only; without stored rows the gate's
    own threshold and band are kept."""
    rng = np.random.default_rng(4)
    d = 8
    x = _correlated(rng, 60_000, d)
    gate = ood.fit_gate(
        ood.FeatureRows(x[:20_000]),
        ood.FeatureRows(x[20_000:40_000]),
        ood.FeatureSchema(tuple(f"f{i}" for i in range(d)), "input_features"),
        "synthetic",
        ood.GateFitSettings(
            alpha=0.01, norm_alpha=0.01, range=ood.RangeSettings(margin=0.25), keep_calibration_rows=10_000
        ),
    )
    assert gate.calibration_rows is not None and gate.calibration_rows.shape == (10_000, d)
    present = np.array([True, False, True, True, False, False, True, False])
    judged = profile_gate(gate, present)
    assert judged.calibrated_on == 10_000 and judged.threshold < gate.threshold
    fresh = x[40_000:]
    scorer = judged.scorer(256)
    done = judged.marginal.complete(np.where(present, fresh, np.nan))
    score, flags = ood.mahalanobis.score_in_chunks(scorer, done)
    assert 0.005 < flags.exceed.mean() < 0.02  # alpha 0.01 on fresh rows
    assert not flags.norm_out.any() and not flags.out_of_range.any()  # the scorer's band is open
    corner = np.maximum(np.abs(gate.feature_range.low), np.abs(gate.feature_range.high))[present]
    assert judged.norm_high >= np.linalg.norm(corner)  # never stricter than every value limit together
    norm_out = judged.norm_out(fresh)  # the profile's norm guard, on the present features
    assert norm_out.mean() < 0.02 and (judged.norm_out(fresh * 100.0).all() and judged.norm_out(fresh * 0.01).all())
    full_rate = (score > gate.threshold).mean()
    assert full_rate < 0.002  # the full-dimension threshold: conservative towards fewer vetoes
    rng_p = judged.feature_range
    assert rng_p is not None and np.isinf(np.array(rng_p.low)[~present]).all()
    np.testing.assert_array_equal(np.array(rng_p.high)[present], np.array(gate.feature_range.high)[present])
    bare = profile_gate(ood.Gate(gate.stats, gate.calibration, gate.norm_band, gate.filter, gate.schema), present)
    assert bare.calibrated_on == 0 and bare.threshold == gate.threshold
    assert (bare.norm_low, bare.norm_high) == (0.0, np.inf)  # no band to state: only all-zero rows refused
    assert bare.norm_out(np.zeros((1, d)))[0] is np.False_ and bare.scorer().score(np.zeros((1, d)))[1].norm_out[0]


def test_present_limits_open_only_the_missing_features() -> None:
    rng = ood.FeatureRange((0.0, 1.0, 2.0), (5.0, 6.0, 7.0), 0.25, 10, 0.0, (-1.0,) * 3, (1.0,) * 3, "test")
    opened = present_limits(rng, np.array([True, False, True]))
    assert opened is not None
    assert opened.low == (0.0, -np.inf, 2.0) and opened.high == (5.0, np.inf, 7.0)
    assert opened.change_low == (-1.0, -np.inf, -1.0) and opened.change_high == (1.0, np.inf, 1.0)
    assert present_limits(None, np.array([True])) is None
