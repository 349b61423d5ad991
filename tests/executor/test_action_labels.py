"""The one definition of a driver's action: bands, look-ahead labels, the causal acceleration."""

from __future__ import annotations

import numpy as np
import pytest

from dualloop.executor.action_labels import (
    ACTIONS,
    UNLABELLED,
    action_of_accel,
    backward_accel,
    lookahead_accel,
    lookahead_labels,
)


@pytest.mark.parametrize(
    "accel,action",
    [(-3.6, "brake_hard"), (-3.5, "brake"), (-0.51, "brake"), (-0.5, "keep"), (0.5, "keep"), (0.51, "accelerate")],
)
def test_bands(accel, action):
    assert int(action_of_accel(accel)) == ACTIONS.index(action)


def test_nan_has_no_label():
    assert action_of_accel([np.nan, 0.0]).tolist() == [UNLABELLED, ACTIONS.index("keep")]


def test_lookahead_is_the_slope_over_the_next_half_second():
    t = np.arange(0, 5, 0.1)  # 10 Hz
    v = 10 + 0.5 * t**2  # a = t, so the mean over [t, t + 0.5] is t + 0.25
    a = lookahead_accel(t, v)
    ok = t + 0.5 <= t[-1] + 1e-9
    np.testing.assert_allclose(a[ok], t[ok] + 0.25, rtol=1e-9)
    assert np.isnan(a[~ok]).all() and (~ok).sum() == 5  # 4.5-4.9 s: the horizon runs past the end
    labels, accel = lookahead_labels(t, v)
    assert labels[0] == ACTIONS.index("keep") and labels[10] == ACTIONS.index("accelerate")
    assert (labels[~ok] == UNLABELLED).all()
    np.testing.assert_array_equal(accel, a)


def test_lookahead_does_not_bridge_a_gap_in_the_samples():
    t = np.array([0.0, 0.1, 0.2, 2.0, 2.1, 2.2, 2.3, 2.4, 2.5, 2.6])
    a = lookahead_accel(t, np.arange(10.0))
    assert np.isnan(a[:3]).all() and np.isfinite(a[3:5]).all()


def test_backward_accel_uses_the_past_only():
    t = np.arange(0, 3, 0.05)
    v = np.where(t < 2.0, 10.0, 10.0 + (t - 2.0) * 4)  # starts accelerating at 2 s
    a = backward_accel(t, v)
    assert np.isnan(a[0]) and np.all(a[1:][t[1:] <= 2.0] == 0)  # nothing before the change shows it
    np.testing.assert_allclose(a[t >= 2.5 - 1e-9], 4.0)


def test_mismatched_inputs_are_refused():
    with pytest.raises(ValueError, match="strictly increase"):
        lookahead_accel([0.0, 0.0, 0.1], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="same length"):
        backward_accel([0.0, 0.1], [1.0])
