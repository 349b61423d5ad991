"""The fault injectors of the real-data benchmark: each changes exactly one signal (or the timestamps, or
the rows), within its window only, as the fault says, and the same seed gives the same fault."""

from __future__ import annotations

import numpy as np
import pytest

from dualloop.controller.gates import fault_injection as fi
from dualloop.sim.schema import FEATURE_NAMES

NAMES = list(FEATURE_NAMES)
N = 300
FIRST, STOP = 120, 150


def drive(seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(20.0, 3.0, (N, len(NAMES))).astype(np.float32)
    x[:, NAMES.index("lead_present")] = 1.0
    ts = 1_000_000_000 + np.arange(N, dtype=np.int64) * 100_000_000  # 10 Hz
    return x, ts


CASES = [(fault, signal) for fault, signals in fi.SIGNALS.items() for signal in signals]


@pytest.mark.parametrize(("fault", "signal"), CASES, ids=[f"{f}-{s}" for f, s in CASES])
def test_a_fault_changes_one_signal_inside_its_window_only(fault: str, signal: str) -> None:
    x, ts = drive()
    rng = np.random.default_rng(7)
    column = x[:, NAMES.index(signal)] if signal in NAMES else np.zeros(0)
    ep = fi.Episode(fault, signal, FIRST, STOP, fi.draw_magnitude(fault, signal, column, rng))
    out = fi.inject(x, ts, [ep], NAMES, rng)
    window = np.zeros(N, bool)
    window[FIRST:STOP] = True
    same = (out.features == x) | (np.isnan(out.features) & np.isnan(x))
    if fault == fi.FROZEN_TIME:
        assert same.all() and out.keep.all()
        assert (out.timestamps[window] == ts[FIRST - 1]).all()
        assert (out.timestamps[~window] == ts[~window]).all()
        return
    assert (out.timestamps == ts).all()
    if fault == fi.MISSING_ROWS:
        assert same.all()
        assert (~out.keep == window).all()
        return
    assert out.keep.all()
    col = NAMES.index(signal)
    others = np.ones(len(NAMES), bool)
    others[col] = False
    assert same[:, others].all(), "another signal changed"
    assert same[~window, col].all(), "the signal changed outside the window"
    before, got, was = x[FIRST - 1, col], out.features[window, col], x[window, col]
    if fault == fi.STUCK:
        assert (got == before).all()
    elif fault == fi.NAN:
        assert np.isnan(got).all()
    elif fault == fi.ZERO:
        assert (got == 0).all()
    elif fault == fi.UNIT:
        factor = fi.KMH_PER_MS if signal in fi.SPEEDS else fi.FT_PER_M
        np.testing.assert_allclose(got, was * factor, rtol=1e-6)
    elif fault == fi.BIAS:
        np.testing.assert_allclose(got - was, fi.BIAS_M, atol=1e-4)
    elif fault == fi.SIGN:
        assert (got == -was).all()
    elif fault == fi.FLICKER:
        assert set(np.unique(got)) <= {0.0, 1.0} and (got == 0).any()
    elif fault == fi.NOISE:
        assert (got != was).all() and 0 < np.std(got - was) < 10 * fi.spread(x[:, col], signal)
    elif fault == fi.SPIKES:
        jumps = np.abs(got - was)[got != was]
        assert jumps.size >= 1
        np.testing.assert_allclose(jumps, ep.magnitude, rtol=1e-3)
    else:
        raise AssertionError(f"no assertion for {fault}")


def test_the_same_seed_gives_the_same_fault_and_another_seed_another() -> None:
    x, ts = drive()
    ep = fi.Episode(fi.NOISE, "ego_speed", FIRST, STOP, 1.0)
    a = fi.inject(x, ts, [ep], NAMES, np.random.default_rng(3)).features
    b = fi.inject(x, ts, [ep], NAMES, np.random.default_rng(3)).features
    c = fi.inject(x, ts, [ep], NAMES, np.random.default_rng(4)).features
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    w1 = fi.draw_windows(ts, np.random.default_rng(5), 10.0, 5.0)
    assert w1 == fi.draw_windows(ts, np.random.default_rng(5), 10.0, 5.0)
    assert len(w1) == 2  # 30 s: slots at 5-15 s and 15-25 s
    for first, stop in w1:
        duration = (ts[stop] - ts[first]) / 1e9
        assert fi.DURATION_S[0] - 0.1 <= duration <= fi.DURATION_S[1] + 0.1


def test_lead_faults_only_where_a_lead_is_present() -> None:
    x, _ = drive()
    x[FIRST + 5, NAMES.index("lead_present")] = 0.0
    assert not fi.eligible(fi.BIAS, "lead_distance", x, NAMES, FIRST, STOP)
    assert fi.eligible(fi.BIAS, "lead_distance", x, NAMES, STOP, STOP + 20)
    assert fi.eligible(fi.STUCK, "ego_speed", x, NAMES, FIRST, STOP)  # not a lead signal
    x[FIRST, NAMES.index("ego_speed")] = np.nan  # not measured there
    assert not fi.eligible(fi.STUCK, "ego_speed", x, NAMES, FIRST, STOP)


def test_a_window_outside_the_drive_is_an_error() -> None:
    x, ts = drive()
    with pytest.raises(ValueError, match="not inside"):
        fi.inject(x, ts, [fi.Episode(fi.STUCK, "ego_speed", 0, 10, 0.0)], NAMES, np.random.default_rng(0))


def test_a_fault_begins_where_it_first_changes_a_reading() -> None:
    """Spikes and a flickering flag may first show late in their window: their onset is the first
    reading they changed. Faults that change the first reading begin with the window, and a fault
    that changes nothing (a +0 m bias) too."""
    x, ts = drive()
    onsets = []
    for seed in range(40):
        ep = fi.Episode(fi.SPIKES, "ego_speed", FIRST, STOP, 5.0)
        out = fi.inject(x, ts, [ep], NAMES, np.random.default_rng(seed))
        onset = fi.first_change(out, x, ts, ep)
        col = out.features[:, NAMES.index("ego_speed")] != x[:, NAMES.index("ego_speed")]
        assert onset == FIRST + int(np.flatnonzero(col[FIRST:STOP])[0])
        onsets.append(onset)
    assert min(onsets) == FIRST and max(onsets) > FIRST + 3  # a quarter of the readings spiked
    for fault, signal, magnitude in (
        (fi.NOISE, "ego_speed", 1.0),
        (fi.FROZEN_TIME, fi.TIMESTAMPS, 0.0),
        (fi.MISSING_ROWS, fi.ROWS, 0.0),
        (fi.BIAS, "lead_distance", 0.0),
    ):
        ep = fi.Episode(fault, signal, FIRST, STOP, magnitude)
        assert fi.first_change(fi.inject(x, ts, [ep], NAMES, np.random.default_rng(0)), x, ts, ep) == FIRST


def test_how_far_a_fault_moved_the_reading_in_its_first_moments() -> None:
    """A stuck speed while the car holds its speed moves the reading by nothing, while it accelerates
    at 1 m/s^2 by 0.1 m/s per 100 ms; a NaN dropout by infinitely much; a frozen clock has no reading."""
    x, ts = drive()
    col = NAMES.index("ego_speed")
    x[:, col] = 20.0
    ep = fi.Episode(fi.STUCK, "ego_speed", FIRST, STOP, 0.0)
    out = fi.inject(x, ts, [ep], NAMES, np.random.default_rng(0))
    assert fi.moved_by(out, x, ts, NAMES, ep, FIRST, 1.0) == 0.0
    x[:, col] = 20.0 + 0.1 * np.arange(N)  # 1 m/s^2 at 10 Hz
    out = fi.inject(x, ts, [ep], NAMES, np.random.default_rng(0))
    assert fi.moved_by(out, x, ts, NAMES, ep, FIRST, 0.1) == pytest.approx(0.2, abs=1e-4)  # 2 readings
    assert fi.moved_by(out, x, ts, NAMES, ep, FIRST, 1.0) == pytest.approx(1.1, abs=1e-4)
    nan = fi.Episode(fi.NAN, "ego_speed", FIRST, STOP, 0.0)
    assert (
        fi.moved_by(fi.inject(x, ts, [nan], NAMES, np.random.default_rng(0)), x, ts, NAMES, nan, FIRST, 0.1) == np.inf
    )
    frozen = fi.Episode(fi.FROZEN_TIME, fi.TIMESTAMPS, FIRST, STOP, 0.0)
    assert (
        fi.moved_by(fi.inject(x, ts, [frozen], NAMES, np.random.default_rng(0)), x, ts, NAMES, frozen, FIRST, 1.0)
        is None
    )
