"""Fitting: shrinkage formulas and Mahalanobis scores against direct computations."""

from __future__ import annotations

import numpy as np
import pytest

from dualloop.ood.fit import fit_statistics, l2_normalise
from dualloop.ood.mahalanobis import GateScorer
from dualloop.ood.shrinkage import ledoit_wolf, oas


def _data(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    mix = rng.normal(size=(d, d)) / np.sqrt(d)
    return 3.0 * rng.normal(size=d) + rng.normal(size=(n, d)) @ mix


def _ledoit_wolf_paper(x: np.ndarray) -> float:
    """Ledoit & Wolf (2004), lemma 3.x, written literally with per-sample outer products."""
    n, d = x.shape
    s = x.T @ x / n
    inner = lambda a, b: float(np.trace(a @ b.T)) / d  # noqa: E731 - the paper's scaled inner product
    m = inner(s, np.eye(d))
    d2 = inner(s - m * np.eye(d), s - m * np.eye(d))
    b_bar2 = sum(inner(np.outer(r, r) - s, np.outer(r, r) - s) for r in x) / n**2
    return min(b_bar2, d2) / d2


def _oas_traces(x: np.ndarray) -> float:
    """Chen et al. (2010) eq. 23 without the 2/p terms (scikit-learn >= 1.3), in trace form."""
    n, p = x.shape
    s = x.T @ x / n
    tr_s2, tr2_s = float(np.trace(s @ s)), float(np.trace(s)) ** 2
    return min((tr_s2 + tr2_s) / ((n + 1) * (tr_s2 - tr2_s / p)), 1.0)


@pytest.mark.parametrize("n,d", [(40, 12), (300, 8), (25, 30)])
def test_shrinkage_matches_reference_formulas(n: int, d: int) -> None:
    rng = np.random.default_rng(n + d)
    x = _data(rng, n, d)
    xc = x - x.mean(axis=0)
    emp = xc.T @ xc / n
    mu = np.trace(emp) / d
    for est, ref in ((ledoit_wolf, _ledoit_wolf_paper), (oas, _oas_traces)):
        cov, coef = est(xc)
        assert coef == pytest.approx(ref(xc), rel=1e-10)
        np.testing.assert_allclose(cov, (1 - coef) * emp + coef * mu * np.eye(d), rtol=1e-12, atol=1e-14)
        assert 0.0 < coef <= 1.0


def test_shrinkage_matches_sklearn() -> None:
    sk = pytest.importorskip("sklearn.covariance")
    rng = np.random.default_rng(7)
    for n, d in ((50, 20), (500, 64), (30, 64)):
        xc = _data(rng, n, d)
        xc = xc - xc.mean(axis=0)
        lw = sk.LedoitWolf(assume_centered=True).fit(xc)
        cov, coef = ledoit_wolf(xc)
        assert coef == pytest.approx(lw.shrinkage_, rel=1e-9)
        np.testing.assert_allclose(cov, lw.covariance_, rtol=1e-9, atol=1e-13)
        o = sk.OAS(assume_centered=True).fit(xc)
        cov, coef = oas(xc)
        assert coef == pytest.approx(o.shrinkage_, rel=1e-9)
        np.testing.assert_allclose(cov, o.covariance_, rtol=1e-9, atol=1e-13)


def _direct_d2(z: np.ndarray, mean: np.ndarray, cov: np.ndarray) -> np.ndarray:
    diff = z - mean
    return np.einsum("ij,jk,ik->i", diff, np.linalg.inv(cov), diff)


@pytest.mark.parametrize("shrinkage", ["ledoit_wolf", "oas"])
def test_single_d2_equals_inverse_covariance(shrinkage: str) -> None:
    rng = np.random.default_rng(1)
    x = _data(rng, 400, 24)
    stats = fit_statistics(x, variant="single", shrinkage=shrinkage)
    z = l2_normalise(x)
    np.testing.assert_allclose(stats.center, z.mean(axis=0), rtol=1e-12)
    ref_cov, _ = (ledoit_wolf if shrinkage == "ledoit_wolf" else oas)(z - z.mean(axis=0))
    np.testing.assert_allclose(stats.covariance, ref_cov, rtol=1e-12)
    test = _data(rng, 50, 24) * rng.uniform(0.5, 2.0, size=(50, 1))  # scale must not matter
    d2, flags = GateScorer(stats).score(test)
    np.testing.assert_allclose(d2, _direct_d2(l2_normalise(test), stats.center, stats.covariance), rtol=1e-8)
    assert not flags.exceed.any()  # default threshold is +inf


def _labelled(rng: np.random.Generator, n: int, d: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    y = rng.integers(0, k, size=n)
    centres = 3.0 * rng.normal(size=(k, d))
    return centres[y] + rng.normal(size=(n, d)), y * 10 + 3  # labels need not be 0..K-1


def test_tied_d2_is_min_over_classes_with_pooled_covariance() -> None:
    rng = np.random.default_rng(2)
    x, y = _labelled(rng, 600, 16, 4)
    stats = fit_statistics(x, y, variant="tied")
    z = l2_normalise(x)
    means = np.stack([z[y == c].mean(axis=0) for c in np.unique(y)])
    resid = z - means[np.searchsorted(np.unique(y), y)]
    cov, _ = ledoit_wolf(resid)
    np.testing.assert_allclose(stats.covariance, cov, rtol=1e-10)
    test, _ = _labelled(rng, 40, 16, 4)
    zt = l2_normalise(test)
    ref = np.min(np.stack([_direct_d2(zt, m, cov) for m in means]), axis=0)
    d2, _ = GateScorer(stats).score(test)
    np.testing.assert_allclose(d2, ref, rtol=1e-8, atol=1e-9)


def test_relative_is_min_class_distance_minus_background_distance() -> None:
    rng = np.random.default_rng(3)
    x, y = _labelled(rng, 800, 12, 3)
    stats = fit_statistics(x, y, variant="relative", shrinkage="oas")
    z = l2_normalise(x)
    classes = np.unique(y)
    means = np.stack([z[y == c].mean(axis=0) for c in classes])
    cov, _ = oas(z - means[np.searchsorted(classes, y)])
    bg_cov, _ = oas(z - z.mean(axis=0))
    np.testing.assert_allclose(stats.bg_covariance, bg_cov, rtol=1e-10)
    test = np.vstack([_labelled(rng, 30, 12, 3)[0], rng.normal(size=(10, 12))])
    zt = l2_normalise(test)
    md0 = _direct_d2(zt, z.mean(axis=0), bg_cov)
    rmd = np.stack([_direct_d2(zt, m, cov) - md0 for m in means])  # RMD_k = MD_k - MD_0
    d2, _ = GateScorer(stats).score(test)
    np.testing.assert_allclose(d2, rmd.min(axis=0), rtol=1e-7, atol=1e-7)
    assert (d2 < 0).any()  # a relative score is not a distance: negative values are legitimate


def test_fit_refuses_bad_training_data() -> None:
    rng = np.random.default_rng(4)
    x = _data(rng, 50, 6)
    with pytest.raises(ValueError, match="NaN/Inf"):
        fit_statistics(np.vstack([x, np.full((1, 6), np.nan)]))
    with pytest.raises(ValueError, match="all-zero"):
        fit_statistics(np.vstack([x, np.zeros((1, 6))]))
    with pytest.raises(ValueError, match="labels"):
        fit_statistics(x, variant="tied")
    with pytest.raises(ValueError, match="at least 2 classes"):
        fit_statistics(x, np.zeros(50, dtype=int), variant="relative")
    with pytest.raises(ValueError, match="unknown variant"):
        fit_statistics(x, variant="diagonal")
