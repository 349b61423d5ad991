"""Split-conformal calibration: the false-veto rate on fresh data is the stated alpha."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from dualloop.ood.calibrate import (
    FeatureRange,
    FeatureRows,
    RangeSettings,
    calibrate_norm_band,
    calibrate_threshold,
    conformal_rank,
    fit_feature_range,
)
from dualloop.ood.fit import fit_statistics, raw_norms
from dualloop.ood.mahalanobis import GateScorer


def test_conformal_rank_and_threshold_are_the_right_order_statistic() -> None:
    assert conformal_rank(999, 0.001) == 999  # (n+1)(1-alpha) = 999 exactly; no float bump
    assert conformal_rank(1000, 0.001) == 1000
    assert conformal_rank(99, 0.05) == 95
    scores = np.random.default_rng(0).permutation(np.arange(1.0, 100.0))  # 1..99
    cal = calibrate_threshold(scores, 0.05, "integers 1..99")
    assert cal.threshold == 95.0 and cal.rank == 95 and cal.n == 99
    assert cal.quantile_level == pytest.approx(95 / 99)
    assert cal.empirical_rate == pytest.approx(4 / 99)
    assert cal.data_description == "integers 1..99"


def test_too_few_rows_or_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 999 held-out rows, got 500"):
        calibrate_threshold(np.arange(500.0), 0.001, "x")
    with pytest.raises(ValueError, match="data_description"):
        calibrate_threshold(np.arange(500.0), 0.1, " ")
    with pytest.raises(ValueError, match="NaN/Inf"):
        calibrate_threshold(np.array([1.0, np.inf, 2.0]), 0.5, "x")
    with pytest.raises(ValueError, match="all-zero"):
        calibrate_norm_band(np.r_[np.zeros(5), np.ones(100)], 0.1)


def test_false_veto_rate_on_fresh_data_is_near_alpha() -> None:
    rng = np.random.default_rng(42)
    d, alpha = 16, 0.01
    mix = rng.normal(size=(d, d)) / 4
    mean = 3.0 * rng.normal(size=d)
    draw = lambda n: mean + rng.normal(size=(n, d)) @ mix  # noqa: E731
    stats = fit_statistics(draw(5000))
    scorer = GateScorer(stats)
    cal = calibrate_threshold(scorer.score(draw(20000))[0], alpha, "synthetic gaussian, seed 42")
    fresh, _ = scorer.score(draw(200000))
    rate = float(np.mean(fresh > cal.threshold))
    # Sampling sd of the calibrated quantile ~ sqrt(a(1-a)/n_cal) = 7e-4; 4 sd allowed.
    assert abs(rate - alpha) < 0.003, rate
    assert abs(cal.empirical_rate - alpha) < 1e-3


def test_norm_band_rate_on_fresh_data_is_near_alpha() -> None:
    rng = np.random.default_rng(5)
    mean = 2.0 * rng.normal(size=8)
    band = calibrate_norm_band(raw_norms(mean + rng.normal(size=(20000, 8))), 0.02)
    fresh = raw_norms(mean + rng.normal(size=(200000, 8)))
    rate = float(np.mean((fresh < band.low) | (fresh > band.high)))
    assert abs(rate - 0.02) < 0.004, rate
    assert 0 < band.low < band.high
    assert math.isclose(band.empirical_rate, 0.02, abs_tol=2e-3)


def test_the_range_is_the_physical_envelope_or_the_training_data_beyond_it() -> None:
    """Training data narrower than what real sensors read (a simulator's accelerations in [-7.5, 2]):
    the stated envelope widens the value limits; the margin never reaches past it (a gap of -35 m passed
    the shipped guard), while training data beyond it stays inside; the note round-trips with the
    limits, and a reading inside the envelope is no longer out of range."""
    rng = np.random.default_rng(2)
    x = np.column_stack([rng.uniform(-7.5, 2.0, 500), rng.uniform(0.0, 40.0, 500), rng.normal(size=500)])
    x[0, 1] = -1.0  # one training row below its envelope
    train, calib = FeatureRows(x[:400]), FeatureRows(x[400:])
    plain = fit_feature_range(train, calib, RangeSettings(margin=0.25))
    envelope = ((-8.0, 8.0), (0.0, 45.0), None)
    wide = fit_feature_range(train, calib, RangeSettings(margin=0.25, envelope=envelope, envelope_note="n"))
    assert plain.low[0] < -8.0 and wide.low[0] == -8.0 and wide.high[0] == 8.0  # the margin cut back, widened up
    assert plain.low[1] < -1.0 and wide.low[1] == -1.0  # the training data's own extreme below the envelope
    assert plain.high[1] > 45.0 and wide.high[1] == 45.0
    assert (wide.low[2], wide.high[2]) == (plain.low[2], plain.high[2])
    assert wide.envelope_note == "n" and FeatureRange.from_dict(wide.to_dict()).to_dict() == wide.to_dict()
    human = np.array([[6.0, 20.0, 0.0]])
    assert plain.outside(human)[0] and not wide.outside(human)[0]
    with pytest.raises(ValueError, match="an envelope of 2 features for 3"):
        fit_feature_range(train, calib, RangeSettings(margin=0.25, envelope=(None, None)))


def test_a_context_raised_to_a_feature_is_accepted_wherever_the_feature_is() -> None:
    """A plan's target speed that a card's no-plan default raises to the ego speed: the plan range
    takes it up to the speed's own limit (widened by its envelope), and no further than that."""
    rng = np.random.default_rng(3)
    x = np.column_stack([rng.uniform(0.0, 33.0, 500), rng.normal(size=500)])
    plans = np.column_stack([rng.uniform(0.0, 30.0, 500), rng.uniform(0.0, 1.0, 500)])
    train, calib = FeatureRows(x[:400], context=plans[:400]), FeatureRows(x[400:], context=plans[400:])
    settings = RangeSettings(margin=0.25, envelope=((0.0, 45.0), None), context_names=("target_speed", "keep"))
    plain = fit_feature_range(train, calib, settings)
    raised = fit_feature_range(train, calib, dataclasses.replace(settings, context_at_least=((0, 0),)))
    assert plain.context_high[0] < 40.0 and raised.context_high[0] == raised.high[0] == 45.0
    assert raised.context_high[1] == plain.context_high[1] and raised.context_low == plain.context_low
    motorway = np.array([[40.0, 0.0]])
    assert plain.outside(motorway, context=motorway)[0] and not raised.outside(motorway, context=motorway)[0]
    assert raised.outside(np.array([[46.0, 0.0]]), context=np.array([[46.0, 0.0]]))[0]
