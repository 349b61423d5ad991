"""The per-signal checks' rules on hand-made streams: what counts as stuck, what a held observation and a
pause do, a new lead against a spike, flicker; and their settings' errors."""

from __future__ import annotations

import math
from collections import deque
from pathlib import Path

import numpy as np
import pytest

from dualloop.controller.contract.wire import observation_from_proto
from dualloop.controller.gates.real_logs import load_real_dir
from dualloop.controller.logs.format import sensor_profile
from dualloop.controller.logs.logfile import read_log
from dualloop.ood.signal_settings import (
    CHECKS,
    GAP_RATE,
    GAP_REPEAT,
    GAP_STEP,
    LEAD_FLICKER,
    REL_ACCEL,
    REL_SIGN,
    REL_UNIT,
    SPEED_ACCEL,
    SPEED_REPEAT,
    STUCK,
    SignalSettings,
)
from dualloop.ood.signals import SignalMonitor, _TopTwo

NAMES = ["ego_speed", "ego_accel", "lead_present", "lead_distance", "lead_rel_speed", "yaw_rate"]
PERIOD = 100_000_000  # 10 Hz
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


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
    for k in range(len(CHECKS)):
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
    assert s[9] == 0.0 and s[10] == 1.0 and s[10] <= SignalSettings().flicker_toggles  # one change: a lead came
    assert s[11] == 2.0 and s[11] > SignalSettings().flicker_toggles  # and went back at once: a blink
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


def test_relative_acceleration_bounds_how_fast_the_relative_speed_changes_again_and_again() -> None:
    limit = SignalSettings().rel_accel_m_s2
    braking_lead = drive(80, gap=40.0, rel=-1.0)
    braking_lead[:, 4] -= np.clip(np.arange(80) - 20, 0, None) * 0.8  # the lead brakes at 8 m/s^2
    braking_lead[:, 3] = 40.0 + np.cumsum(braking_lead[:, 4]) * PERIOD / 1e9
    clean = scan(braking_lead)[:, REL_ACCEL]
    assert clean[0] == 0.0 and 7.0 < clean[30] < 9.0 and (clean <= limit).all()
    spike = drive(80)
    spike[40, 4] += 3.0  # one reading 3 m/s off: 30 m/s^2 there and back at 10 Hz
    s = scan(spike)[:, REL_ACCEL]
    assert s[40] < 1.0  # one step so far: a new lead's, or a spike's first half
    assert (s[41:45] > limit).all() and (s[45:] < 1.0).all()  # back: a spike, while both steps are 0.5 s old
    noisy = drive(80)
    noisy[40:60, 4] += np.random.default_rng(2).normal(0.0, 2.0, 20).astype(np.float32)
    assert (scan(noisy)[43:60, REL_ACCEL] > limit).mean() > 0.8  # from its fourth reading on
    handover = drive(80, gap=52.0, rel=-8.0)
    handover[:, 3] = 52.0  # a braking lead hands over to a faster car ahead of it at the same gap
    handover[40:, 4] += 9.5
    assert (scan(handover)[:, REL_ACCEL] < 1.0).all()
    cut_in = drive(80, gap=40.0)
    cut_in[40:, 3] -= 20.0  # a car cuts in 20 m closer, 5 m/s slower
    cut_in[40:, 4] -= 5.0
    assert (scan(cut_in)[:, REL_ACCEL] < 1.0).all()
    fast = np.repeat(drive(40, rel=-1.0), 10, axis=0)  # a 10 Hz radar held in a 100 Hz stream
    fast[:, 4] += np.random.default_rng(3).normal(0.0, 0.05, len(fast)).astype(np.float32)
    mon = SignalMonitor(1, SignalSettings(), NAMES)
    times = np.arange(len(fast), dtype=np.int64) * PERIOD // 10
    assert mon.scan(fast, 0, times)[:, REL_ACCEL].max() < 5.0
    # measured between readings 10 ms apart, the same noise alone would veto
    unspanned = SignalMonitor(1, SignalSettings(rel_span_s=0.001), NAMES)
    assert unspanned.scan(fast, 0, times)[:, REL_ACCEL].max() > limit


def test_unmeasured_and_non_finite_signals_are_not_judged() -> None:
    mon = SignalMonitor(1, SignalSettings(), NAMES)
    present = np.array([True, False, False, False, False, True])
    mon.set_present(0, present)
    x = drive(20)
    x[:, ~present] = np.nan
    out = mon.scan(x, 0, np.arange(20, dtype=np.int64) * PERIOD)
    others = [SPEED_ACCEL, GAP_RATE, LEAD_FLICKER, SPEED_REPEAT, GAP_REPEAT, GAP_STEP, REL_ACCEL, REL_UNIT, REL_SIGN]
    assert np.isnan(out[:, others]).all() and (out[:, STUCK] == 0.0).all()
    assert mon.applies(0) == (True,) + (False,) * (len(CHECKS) - 1)
    y = drive(20)
    y[10, 3] = np.nan
    gap = scan(y)[:, GAP_RATE]
    assert np.isnan(gap[10]) and gap[11] == 0.0  # a new track after the bad reading
    assert not SignalMonitor(1, SignalSettings(), ["yaw_rate"]).available


@pytest.mark.parametrize("field,value", [("stuck_s", 0.0), ("gap_rate_m", math.nan), ("speed_feature", "")])
def test_bad_settings_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SignalSettings(**{field: value})  # type: ignore[arg-type]


def test_a_speed_stuck_while_accelerating_is_flagged_at_its_first_repeat() -> None:
    limit = SignalSettings().speed_repeat_m_s
    x = drive(60, accel=1.5)
    x[30:45, 0] = x[29, 0]
    s = scan(x)[:, SPEED_REPEAT]
    assert (s[:30] == 0.0).all()  # noisy readings never repeat
    assert s[30] == pytest.approx(0.15, abs=0.01) and s[30] > limit  # 1.5 m/s^2 x 0.1 s at the first repeat
    assert s[44] == pytest.approx(2.25, abs=0.05)  # it grows while the repeat lasts
    assert s[45] == 0.0  # moving again (its catch-up is speed_accel's)


def test_the_same_stuck_speed_at_constant_speed_is_not_flagged() -> None:
    """Physically undetectable: nothing says the speed should have changed."""
    x = drive(60)
    x[30:45, 0] = x[29, 0]
    assert (scan(x)[:, SPEED_REPEAT] <= SignalSettings().speed_repeat_m_s).all()
    at_rest = drive(60, speed=0.0, accel=0.0)
    at_rest[:, 0] = 0.0  # standing still: exact zeros, whatever the accelerometer's noise
    at_rest[:, 1] = 0.3
    assert (scan(at_rest)[:, SPEED_REPEAT] == 0.0).all()


def test_a_stuck_acceleration_while_the_speed_changes_is_flagged() -> None:
    x = drive(60, accel=0.0)
    x[30:, 0] += 2.0 * (np.arange(30) + 1) * 0.1 * 0.1 * 10  # the car starts to accelerate at 2 m/s^2
    x[29:, 1] = x[28, 1]  # while the accelerometer holds its last reading
    s = scan(x)[:, SPEED_REPEAT]
    assert (s[:29] <= 0.05).all()
    flagged = np.flatnonzero(s > SignalSettings().speed_repeat_m_s)
    assert flagged.size and flagged[0] <= 31 and (s[31:] > SignalSettings().speed_repeat_m_s).all()


def test_a_stuck_gap_while_closing_is_flagged_and_a_steady_one_is_not() -> None:
    limit = SignalSettings().gap_repeat_m
    closing = drive(60, rel=-4.0)
    closing[30:45, 3] = closing[29, 3]
    s = scan(closing)[:, GAP_REPEAT]
    assert (s[:30] < 0.1).all() and s[30] == pytest.approx(0.4, abs=0.05) and s[31] > limit  # 0.4 m per reading
    steady = drive(60, rel=0.0)
    steady[30:45, 3] = steady[29, 3]
    assert (scan(steady)[:, GAP_REPEAT] <= limit).all()
    no_lead = drive(60, rel=-4.0)
    no_lead[:, 2] = 0.0
    no_lead[30:45, 3] = no_lead[29, 3]
    assert np.isnan(scan(no_lead)[:, GAP_REPEAT]).all()


def test_a_lead_distance_bias_is_flagged_from_its_onset_until_it_ends() -> None:
    limit = SignalSettings().gap_step_m
    x = drive(80, rel=-1.0)
    x[30:55, 3] += 15.0  # reads 15 m too far for 2.5 s
    s = scan(x)[:, GAP_STEP]
    assert (s[:30] < 0.1).all()
    assert (s[30:55] > limit).all()  # latched while the bias lasts
    assert s[55] < 0.1 and (s[56:] < 0.1).all()  # back where its history says: unlatched
    lasting = drive(80, rel=-1.0)
    lasting[30:, 3] += 15.0
    held = scan(lasting)[:, GAP_STEP]
    assert held[69] > limit and held[71] == 0.0  # latched for 4 s at most
    switch = drive(80, rel=-1.0)
    switch[30:55, 3] += 15.0
    switch[40:, 3] += 30.0 - 2.0 * np.arange(40) * 0.1  # another car becomes the lead during the bias,
    switch[40:, 4] -= 2.0  # 2 m/s slower: the same sensor reads it too far as well
    switched = scan(switch)[:, GAP_STEP]
    assert (switched[30:55] > limit).all() and switched[55] < 0.1 and (switched[56:] < 0.1).all()
    zeroed = drive(80, rel=-1.0)
    zeroed[30:50, 3] = 0.0  # the radar reads 0 for 2 s: stuck long enough that its return looks like a catch-up
    back = scan(zeroed)[:, GAP_STEP]
    assert (back[30:50] > limit).all() and back[50] < 0.1 and (back[51:] < 0.1).all()
    big = drive(80, rel=-1.0)
    big[30, 3] += 20.0
    big[34, 3] += 70.0  # a spike beyond any offset while latched: its way back must not be carried
    assert (scan(big)[36:, GAP_STEP] < 0.1).all()
    train = drive(80, gap=47.0, rel=-1.0)
    train[30:40, 3] += np.array([24.0, -24.0, 24.0, -24.0, 0.0, 24.0, -24.0, -24.0, 24.0, 0.0])  # steps of 48 m
    trained = scan(train)[:, GAP_STEP]
    assert trained[30] > limit and (trained[40:] < 0.1).all()  # back on the track it had before the train
    spikes = drive(80, rel=-1.0)
    spikes[30, 3] += 8.0
    spikes[31, 3] += 4.0  # a spike, then a smaller one: two steps back of 4 m, each too small to count
    after = scan(spikes)[:, GAP_STEP]
    # 8 m off the track: distrusted; 4 m: trusted (the track follows it), and back by 4 m
    assert after[30] == pytest.approx(8.0, abs=0.1) and after[31] == pytest.approx(4.0, abs=0.1)
    assert after[32] == pytest.approx(4.0, abs=0.1) and (after[33:] < 0.1).all()  # nothing stays off


def test_a_new_lead_is_not_a_bias() -> None:
    limit = SignalSettings().gap_step_m
    cut_in = drive(60, rel=-1.0)
    cut_in[30:, 3] -= 15.0
    cut_in[30:, 4] -= 3.0  # a slower car cut in: the relative speed jumps with the gap
    assert (scan(cut_in)[:, GAP_STEP] <= limit).all()
    swap = drive(60, rel=-1.0)
    swap[30, 2] = 0.0  # the lead left, another came: the flag says so
    swap[31:, 3] += 25.0
    swapped = scan(swap)[:, GAP_STEP]
    assert np.isnan(swapped[30]) and (swapped[31:] < 0.1).all()  # no lead, then a new track
    spike_then_switch = drive(60, rel=-1.0)
    spike_then_switch[29, 3] += 30.0  # a spike on the reading just before a real lead switch
    spike_then_switch[30:, 3] += 20.0 - 2.0 * np.arange(30) * 0.1
    spike_then_switch[30:, 4] -= 2.0
    assert (scan(spike_then_switch)[30:, GAP_STEP] < 0.1).all()  # the spike is not carried onto the new lead
    leaves = drive(60, rel=-1.0)
    leaves[30:, 3] += 64.0  # the lead left the lane: the next car ahead, at the same speed, is the lead now
    assert (scan(leaves)[:, GAP_STEP] < 0.1).all()
    small = drive(60, rel=-1.0)
    small[30:, 3] += 5.0  # a step within what real radars do at a target switch
    stepped = scan(small)[:, GAP_STEP]
    assert stepped[30] == pytest.approx(5.0, abs=0.1) and (stepped[31:] < 0.1).all()  # trusted: the new track


@pytest.mark.parametrize("gap", [25.0, 45.0])
def test_a_gap_read_in_feet_is_not_a_new_target(gap: float) -> None:
    limit = SignalSettings().gap_step_m
    feet = drive(90, gap=gap, rel=-1.0)
    feet[30:60, 3] /= 0.3048  # the radar's driver switched to feet for 30 readings: a step of 40 m or more
    s = scan(feet)[:, GAP_STEP]
    assert (s[:30] < 0.1).all() and (s[30:60] > limit).all()  # distrusted from the first reading to the last
    assert (s[60:] < 0.1).all()  # back in metres, back on the track
    # the same step with the relative speed jumping is a new lead, as before
    new_lead = feet.copy()
    new_lead[30:, 4] -= 3.0
    assert (scan(new_lead)[30:60, GAP_STEP] <= limit).all()


def test_a_gap_dropped_to_zero_is_not_a_new_target() -> None:
    limit = SignalSettings().gap_step_m
    dropped = drive(60, gap=50.0, rel=-1.0)
    dropped[30:40, 3] = 0.0  # the radar's gap drops to 0 while its flag says a lead is there
    dropped[30:40, 4] -= 3.0  # with the relative speed jumping too: still no lead is 0 m away
    s = scan(dropped)[:, GAP_STEP]
    assert (s[30:40] > limit).all() and (s[40:] < 0.1).all()


def test_a_relative_speed_read_in_km_h_is_vetoed_until_it_steps_back() -> None:
    limit = SignalSettings().rel_unit_m_s
    kmh = drive(90, rel=-1.5)
    kmh[30:60, 4] *= 3.6  # the radar's driver switched to km/h for 30 readings
    s = scan(kmh)[:, REL_UNIT]
    assert (s[:30] == 0.0).all() and (s[30:60] > limit).all()  # from the first reading to the last
    assert (s[60:] == 0.0).all()  # back in m/s
    # the same step with the gap jumping is a new lead with its own relative speed
    new_lead = kmh.copy()
    new_lead[30:, 3] -= 12.0
    assert (scan(new_lead)[:, REL_UNIT] == 0.0).all()
    # near 0 the unit changes the reading by less than sensor noise: unseen
    slow = drive(90, rel=-0.1)
    slow[30:60, 4] *= 3.6
    assert (scan(slow)[:, REL_UNIT] == 0.0).all()
    # a unit error that persists: the gap keeps agreeing with the readings divided by 3.6, past the hold time
    persists = drive(120, rel=-1.5)
    persists[30:, 4] *= 3.6
    assert (scan(persists)[30:, REL_UNIT] > limit).all()
    # one reading at 3.6 times the last is a spike, not a unit, once the next is back; so is a step that
    # jumps on by more than half its size (noise)
    spike = drive(60, rel=-1.5)
    spike[30, 4] *= 3.6
    assert (scan(spike)[31:, REL_UNIT] == 0.0).all()
    noise = drive(60, rel=-1.5)
    noise[30, 4] *= 3.6
    noise[31, 4] = -3.0
    assert (scan(noise)[31:, REL_UNIT] == 0.0).all()
    # a dip of noise and back: the trend through the dip times 3.6 is where the reading came back to
    dip = drive(60, rel=1.2)
    dip[29, 4], dip[30, 4], dip[31, 4] = 1.205, 0.8, 1.307  # measured in the simulator at 200 Hz
    assert (scan(dip)[:, REL_UNIT] == 0.0).all()


def test_live_steps_and_a_replay_scan_give_the_same_unit_verdicts() -> None:
    """The km/h run and the feet track live in the slot: two sessions stepped live, interleaved, give
    what a replay's scan of each gives."""
    kmh = drive(90, rel=-1.5)
    kmh[30:60, 4] *= 3.6
    feet = drive(90, gap=45.0, rel=-1.0)
    feet[30:60, 3] /= 0.3048
    live = SignalMonitor(2, SignalSettings(), NAMES)
    stepped = np.array(
        [live.step(np.stack([kmh[k], feet[k]]), [0, 1], [True, True], [k * PERIOD] * 2) for k in range(90)]
    )
    for slot, x in enumerate((kmh, feet)):
        replayed = scan(x)
        np.testing.assert_array_equal(stepped[:, slot], replayed)
    assert (stepped[30:60, 0, REL_UNIT] > 0).all() and (stepped[30:60, 1, GAP_STEP] > 0).all()


def closing_on_a_braking_lead(n: int, brake_at: int) -> np.ndarray:
    """A lead at the ego's speed that brakes at 6 m/s^2 from observation `brake_at` on (10 Hz): the gap
    shrinks and the relative speed falls as they should."""
    x = drive(n, gap=40.0)
    t = np.maximum(np.arange(n) - brake_at, 0) * PERIOD / 1e9
    x[:, 4] += (-6.0 * t).astype(np.float32)
    x[:, 3] += (-3.0 * t * t).astype(np.float32)
    return x


def test_a_sign_flipped_relative_speed_disagrees_with_the_gap_over_seconds() -> None:
    """Flipped from the braking onset, the relative speed says the lead pulls away while the gap
    shrinks: rel_sign vetoes once both moved 4 m opposite ways (1.2 s at 6 m/s^2), and no other check
    of the lead does; the same drive read correctly, and a stuck gap, score about 0."""
    limit = SignalSettings().rel_sign_m
    honest = closing_on_a_braking_lead(50, 20)
    assert scan(honest)[:, REL_SIGN].max() < 0.05  # noise around a steady gap, then agreement
    flipped = honest.copy()
    flipped[20:, 4] *= -1.0
    scores = scan(flipped)
    vetoes = np.flatnonzero(scores[:, REL_SIGN] > limit)
    assert vetoes.size and 31 <= vetoes[0] <= 34 and (scores[vetoes[0] :, REL_SIGN] > limit).all()
    others = [GAP_RATE, GAP_REPEAT, GAP_STEP, REL_ACCEL, REL_UNIT]
    assert not (scores[:, others] > np.array(SignalSettings().thresholds)[others]).any()
    stuck = flipped.copy()
    stuck[20:, 3] = stuck[19, 3]  # the gap stuck too: nothing to compare the relative speed with
    assert scan(stuck)[:, REL_SIGN].max() < 0.05


def test_a_new_lead_starts_the_trend_afresh() -> None:
    """A cut-in 25 m nearer while the relative speed says the old lead pulled away at 3 m/s: the gap's
    step is a new lead's, not a trend, and is never compared with the integral."""
    x = drive(60, gap=50.0, rel=3.0)
    x[30:, 3] -= 25.0
    x[30:, 4] = -0.5
    s = scan(x)[:, REL_SIGN]
    assert s[30] == 0.0 and (s <= SignalSettings().rel_sign_m).all()
    assert (scan(x, SignalSettings(gap_jump_m=50.0))[30:, REL_SIGN] > SignalSettings().rel_sign_m).any()


@pytest.mark.parametrize("name", ["comma2k19-example1.mcap", "real-drives/openacc-astazero-human"])
def test_clean_real_drives_are_never_flagged(name: str, tmp_path: Path) -> None:
    """The shipped thresholds against real sensors: repeats, 20 Hz radars in a 100 Hz stream, lead
    changes and quantised speeds never veto."""
    folder = FIXTURES / name
    paths = [folder] if folder.suffix == ".mcap" else list(load_real_dir(folder, tmp_path).logs)
    limits = np.array(SignalSettings().thresholds)
    judged = 0
    for path in paths:
        data = read_log(path)
        obs = [observation_from_proto(m, 0) for m in data.observations]
        x = np.array([o.features for o in obs], np.float64)
        names = list(data.header.feature_names)
        mon = SignalMonitor(1, SignalSettings(), names)
        profile = sensor_profile(data.header)
        if profile is not None:
            mon.set_present(0, np.array([n in profile for n in names]))
        out = mon.scan(x, 0, np.array([o.timestamp_ns for o in obs], np.int64))
        assert not (out > limits).any(), (path, [CHECKS[k] for k in np.flatnonzero((out > limits).any(axis=0))])
        judged += int(np.isfinite(out[:, SPEED_REPEAT]).sum())
    assert judged > 200


def test_readings_near_the_float_limits_give_finite_scores_that_veto() -> None:
    """A rate times a time overflows for readings near float64's limit: the score is capped, never
    inf (DecisionSnapshot.checks are finite by contract), and still far above every threshold."""
    x = drive(6).astype(np.float64)
    x[2:, 0] = x[1, 0]  # the speed repeats ...
    x[2:, 1] = 1.7e308  # ... while the accelerometer reads near the largest float
    x[2:, 4] = -1.7e308
    scores = scan(x)
    judged = scores[~np.isnan(scores)]
    assert np.isfinite(judged).all()
    limits = SignalSettings().thresholds
    assert scores[3, SPEED_REPEAT] > limits[SPEED_REPEAT]


@pytest.mark.parametrize("max_kept", [None, 7])
def test_the_window_keeps_what_its_two_largest_need(max_kept: int | None) -> None:
    """_TopTwo gives the second-largest value of a time window (and of its last `max_kept` readings),
    as a deque of every reading sorted each time would, keeping a few readings instead of all."""
    rng = np.random.default_rng(3)
    top, every = _TopTwo(max_kept), deque(maxlen=max_kept)
    span, t, most = 50, 0, 0
    for _ in range(5000):
        t += int(rng.integers(0, 4))
        if rng.random() < 0.01:
            top.clear()
            every.clear()
        if rng.random() < 0.7:
            value = float(rng.integers(0, 20))  # ties too
            top.add(t, value)
            every.append((t, value))
        top.expire(t, span)
        while every and t - every[0][0] >= span:
            every.popleft()
        want = sorted((v for _, v in every), reverse=True)[1] if len(every) >= 2 else 0.0
        assert (len(top) >= 2) == (len(every) >= 2) and top.second() == want
        most = max(most, len(every))
    assert most == max_kept if max_kept else most > 20  # the bound was reached, or the window was long
