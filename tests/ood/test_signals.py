"""The per-signal checks' rules on hand-made streams: what counts as stuck, what a held observation and a
pause do, a new lead against a spike, flicker; and their settings' errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dualloop.ood.signals import GAP_RATE, LEAD_FLICKER, SPEED_ACCEL, STUCK, SignalMonitor, SignalSettings

NAMES = ["ego_speed", "ego_accel", "lead_present", "lead_distance", "lead_rel_speed", "yaw_rate"]
PERIOD = 100_000_000  # 10 Hz


def drive(n: int, speed: float = 20.0, accel: float = 0.0, gap: float = 30.0, rel: float = 0.0) -> np.ndarray:
    """n observations of a car at `speed` (plus accel * t) behind a lead at `gap` (plus rel * t), with
    a little sensor noise so that nothing repeats by itself."""
    t = np.arange(n) * PERIOD / 1e9
    noise = np.random.default_rng(0).normal(0, 0.01, (n, 4))
    x = np.zeros((n, len(NAMES)), np.float32)
    x[:, 0] = speed + accel * t + noise[:, 0]
    x[:, 1] = accel + noise[:, 1]
    x[:, 2] = 1.0
    x[:, 3] = gap + rel * t + noise[:, 2]
    x[:, 4] = rel + noise[:, 3]
    return x


def scan(x: np.ndarray, settings: SignalSettings | None = None) -> np.ndarray:
    mon = SignalMonitor(1, settings or SignalSettings(), NAMES)
    return mon.scan(x, 0, np.arange(len(x), dtype=np.int64) * PERIOD)


def test_a_clean_drive_scores_low_on_every_check() -> None:
    scores = scan(drive(100, accel=0.8, rel=-1.0))
    limits = SignalSettings().thresholds
    for k in range(4):
        judged = scores[:, k][~np.isnan(scores[:, k])]
        assert judged.size > 80 and (judged <= limits[k]).all(), k


def test_a_stuck_speed_counts_its_seconds_while_moving_and_not_at_rest() -> None:
    x = drive(60)
    x[20:50, 0] = x[19, 0]
    s = scan(x)[:, STUCK]
    assert s[19] == 0.0 and s[20] == pytest.approx(0.1) and s[49] == pytest.approx(3.0)
    assert s[50] == 0.0  # moving again
    at_rest = drive(60, speed=0.0)
    at_rest[:, 0] = 0.0  # a car at rest reads exactly 0 for as long as it stands
    assert (scan(at_rest)[:, STUCK] == 0.0).all()


def test_speed_against_acceleration_catches_a_jump_and_a_dead_accelerometer() -> None:
    x = drive(60, accel=1.5)
    x[30:, 1] = 0.0  # the acceleration drops out while the car keeps accelerating
    s = scan(x)[:, SPEED_ACCEL]
    assert np.isnan(s[:4]).all()  # not a window of observations yet
    assert s[29] < 0.2 and s[40] == pytest.approx(0.75, abs=0.1)  # 1.5 m/s^2 x 0.5 s unexplained
    y = drive(60)
    y[30, 0] *= 3.6  # one reading in km/h
    assert scan(y)[30, SPEED_ACCEL] > SignalSettings().speed_accel_m_s


def test_a_gap_spike_vetoes_and_a_new_lead_or_a_lone_jump_does_not() -> None:
    limit = SignalSettings().gap_rate_m
    spike = drive(60, rel=-1.0)
    spike[30, 3] += 20.0  # there and back: two jumps in a second
    s = scan(spike)[:, GAP_RATE]
    assert s[31] == pytest.approx(20.0, abs=0.2) and s[31] > limit
    assert (s[:30] < 1.0).all() and s[45] < 1.0  # gone when the window has passed
    lone = drive(60, rel=-1.0)
    lone[30:, 3] += 40.0  # one jump: the lead left the lane (or a constant bias began)
    assert (scan(lone)[:, GAP_RATE] < 1.0).all()
    cut_in = drive(60, rel=-1.0)
    cut_in[30:, 3] -= 15.0
    cut_in[30:, 4] -= 3.0  # a slower car cut in: the relative speed jumps with the gap
    cut_in[31, 3] += 10.0  # and the radar glitches right after
    assert scan(cut_in)[31, GAP_RATE] < 1.0  # the new lead's track started afresh at its jump


def test_a_flickering_lead_flag_counts_its_toggles_in_a_second() -> None:
    x = drive(40)
    x[10:20:2, 2] = 0.0
    s = scan(x)[:, LEAD_FLICKER]
    assert s[9] == 0.0 and s[12] == 3.0 and s[12] > SignalSettings().flicker_toggles
    assert s[35] == 0.0


def test_held_observations_are_no_evidence_and_a_pause_starts_afresh() -> None:
    mon = SignalMonitor(2, SignalSettings(), NAMES)
    x = drive(30)
    x[10:, 0] = x[9, 0]
    for k in range(12):
        mon.step(x[k : k + 1], [0], [True], [k * PERIOD])
    held = [mon.step(x[11:12], [0], [False], [11 * PERIOD + j * 5_000_000])[0][STUCK] for j in range(1, 10)]
    assert held == [pytest.approx(0.2)] * 9  # the verdict of the last fresh observation
    after_pause = mon.step(x[12:13], [0], [True], [11 * PERIOD + 600_000_000])[0]
    assert after_pause[STUCK] == 0.0 and math.isnan(after_pause[SPEED_ACCEL])
    assert mon.step(x[12:13], [1], [True], [0])[0][STUCK] == 0.0  # the other slot knows nothing of it


def test_unmeasured_and_non_finite_signals_are_not_judged() -> None:
    mon = SignalMonitor(1, SignalSettings(), NAMES)
    present = np.array([True, False, False, False, False, True])
    mon.set_present(0, present)
    x = drive(20)
    x[:, ~present] = np.nan
    out = mon.scan(x, 0, np.arange(20, dtype=np.int64) * PERIOD)
    assert np.isnan(out[:, [SPEED_ACCEL, GAP_RATE, LEAD_FLICKER]]).all() and (out[:, STUCK] == 0.0).all()
    assert mon.applies(0) == (True, False, False, False)
    y = drive(20)
    y[10, 3] = np.nan
    gap = scan(y)[:, GAP_RATE]
    assert np.isnan(gap[10]) and gap[11] == 0.0  # a new track after the bad reading
    assert not SignalMonitor(1, SignalSettings(), ["yaw_rate"]).available


@pytest.mark.parametrize("field,value", [("stuck_s", 0.0), ("gap_rate_m", math.nan), ("speed_feature", "")])
def test_bad_settings_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SignalSettings(**{field: value})  # type: ignore[arg-type]
