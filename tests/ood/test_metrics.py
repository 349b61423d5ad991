"""Evaluation helpers, and OOD separation on well-separated synthetic data."""

from __future__ import annotations

import numpy as np
import pytest

from dualloop.ood.fit import fit_statistics
from dualloop.ood.mahalanobis import GateScorer
from dualloop.ood.metrics import auroc, detection_delay, false_veto_rate, tnr_at_tpr


def _pairwise_auroc(s_in: np.ndarray, s_out: np.ndarray) -> float:
    diff = s_out[:, None] - s_in[None, :]
    return float(np.mean((diff > 0) + 0.5 * (diff == 0)))


def test_auroc_matches_pairwise_definition_with_ties() -> None:
    rng = np.random.default_rng(0)
    s_in = rng.integers(0, 6, size=300).astype(float)  # heavy ties
    s_out = rng.integers(2, 9, size=200).astype(float)
    s_out[:5] = np.inf
    assert auroc(s_in, s_out) == pytest.approx(_pairwise_auroc(s_in, s_out), abs=1e-12)
    assert auroc(np.ones(10), np.ones(10)) == 0.5
    assert auroc(np.zeros(3), np.ones(3)) == 1.0 and auroc(np.ones(3), np.zeros(3)) == 0.0
    with pytest.raises(ValueError, match="NaN"):
        auroc(np.array([np.nan]), np.ones(2))


def test_tnr_at_95_tpr() -> None:
    s_in = np.arange(100.0)  # 95% accepted at t = 94
    s_out = np.array([50.0, 94.0, 94.5, 200.0])
    assert tnr_at_tpr(s_in, s_out) == 0.5


def test_well_separated_ood_gets_auroc_near_one() -> None:
    rng = np.random.default_rng(3)
    d = 32
    mix = rng.normal(size=(d, d)) / np.sqrt(d)
    mean = 3.0 * rng.normal(size=d)
    draw = lambda n, m=mean: m + rng.normal(size=(n, d)) @ mix  # noqa: E731
    scorer = GateScorer(fit_statistics(draw(4000)))
    s_in, _ = scorer.score(draw(2000))
    shifted = mean + 2.0 * rng.normal(size=d)
    s_out, _ = scorer.score(draw(2000, shifted) * 3.0)  # shifted mean, and scaled
    assert auroc(s_in, s_out) > 0.999
    assert tnr_at_tpr(s_in, s_out) > 0.99
    s_noise, _ = scorer.score(rng.normal(size=(500, d)))  # far from the training direction
    assert auroc(s_in, s_noise) > 0.99


def test_detection_delay_and_false_veto_rate() -> None:
    alarms = np.zeros(100, bool)
    alarms[[3, 40, 41, 42, 90]] = True
    assert detection_delay(alarms, 38) == 2
    assert detection_delay(alarms, 40) == 0
    assert detection_delay(alarms, 91) is None
    r = false_veto_rate(alarms, tick_period_s=0.005)
    assert r["per_tick"] == 0.05
    assert r["per_hour"] == pytest.approx(0.05 * 720000)
    assert r["episodes"] == 3 and r["episodes_per_hour"] == pytest.approx(3 / (100 * 0.005 / 3600))
