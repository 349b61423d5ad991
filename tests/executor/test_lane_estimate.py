"""The lane the fallback steers by while it cannot see it (executor/lane_estimate.py), judged by
where a vehicle driven by the safe-state machine ends up: a kinematic car on a road whose curvature
changes, its sensors lost at motorway speed."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

import numpy as np
import pytest

from dualloop.executor.lane_estimate import LaneEstimate, LaneHistory, curvature_trend
from dualloop.executor.lane_keeping import LaneKeepingConfig
from dualloop.executor.safety import SafetyConfig, SafetyMachine, SafetyMemory
from dualloop.executor.snapshot import AppliedAction, Reason, SafetyState

TICK = 5_000_000
DT = TICK / 1e9
FEATURES = ["ego_speed", "ego_accel", "lane_offset", "heading_error", "road_curvature"]
SAFE = AppliedAction(1, "brake", np.array([-2.0, 0.0], np.float32))
WHEELBASE = 2.7


def test_the_trend_is_the_clothoid_the_readings_follow() -> None:
    """Noisy readings of a curvature ramping with distance: the fit gives the ramp's rate and its
    value at the newest reading, far inside the readings' noise."""
    rng = np.random.default_rng(0)
    history = LaneHistory(200)
    rate, speed = 4.5e-6, 27.0
    for k in range(300):  # only the newest 200 are kept
        s = k * speed * DT
        history.append((-3e-4 - rate * s + 5e-5 * rng.standard_normal(), speed, 0.0, 0.0))
    now, fitted = curvature_trend(history.readings(), DT)
    assert fitted == pytest.approx(-rate, rel=0.15)
    assert now == pytest.approx(-3e-4 - rate * 299 * speed * DT, abs=2.5e-5)  # half the noise's sigma
    # a tenth of a second of the same readings (after a recovery): no trend that noise could make
    short = LaneHistory(20)
    for _ in range(20):
        short.append((-3e-4 + 5e-5 * rng.standard_normal(), speed, 0.0, 0.0))
    assert curvature_trend(short.readings(), DT)[1] == 0.0
    # standing still, there is no distance to read a trend over
    still = LaneHistory(50)
    for _ in range(50):
        still.append((1e-3, 0.0, 0.0, 0.0))
    assert curvature_trend(still.readings(), DT) == (pytest.approx(1e-3), 0.0)


def test_the_estimate_turns_by_the_steering_and_the_road() -> None:
    straight = LaneEstimate(offset=0.0, heading=0.01, curvature=0.0, curvature_rate=0.0)
    for _ in range(200):
        straight.advance(20.0, 0.0, DT, WHEELBASE, 60.0)
    assert straight.travelled == pytest.approx(20.0)
    assert straight.offset == pytest.approx(20.0 * math.sin(0.01), rel=1e-6)
    # steering the road's own curvature keeps the heading error
    curve = LaneEstimate(offset=0.0, heading=0.0, curvature=1e-3, curvature_rate=0.0)
    for _ in range(200):
        curve.advance(20.0, math.atan(WHEELBASE * 1e-3), DT, WHEELBASE, 60.0)
    assert abs(curve.heading) < 1e-12 and abs(curve.offset) < 1e-9
    # the trend is extrapolated over the preview, then held
    ramp = LaneEstimate(offset=0.0, heading=0.0, curvature=0.0, curvature_rate=1e-5, travelled=100.0)
    assert ramp.road_curvature(60.0) == pytest.approx(6e-4)


def _road(s: float) -> float:
    """A right-hand curve tightening from -0.0003 to -0.00075 1/m over 100 m from s = 20 m: the
    sensors are lost a third of the way in (s = 54 m)."""
    return -3e-4 - 4.5e-4 * min(max((s - 20.0) / 100.0, 0.0), 1.0)


def _blind_stop(
    config: SafetyConfig, road: Callable[[float], float] = _road, keeps_lane: bool = True, heading: float = 0.0
) -> tuple[float, float, list[SafetyState]]:
    """2 s of trusted driving at 27 m/s, then every sensor lost (frozen: nothing readable) until the
    vehicle stands still. The driver holds the lane, or (`keeps_lane` False) steers the road's
    curvature alone from `heading` off it. Returns the largest and the last lane offset after the loss."""
    rng = np.random.default_rng(1)
    machine = SafetyMachine(config, ["accel", "steer"], TICK, SAFE, FEATURES)
    mem = SafetyMemory()
    s, d, psi, v, steer = 0.0, 0.0, heading, 27.0, 0.0
    worst, states = 0.0, []
    for k in range(3000):
        kappa = road(s)
        if k < 400:
            noise = rng.standard_normal(3) * [0.02, 0.001, 5e-5]
            x = np.array([v, 0.0, d + noise[0], psi + noise[1], kappa + noise[2]], np.float32)
            drive = math.atan(WHEELBASE * kappa) - (psi + math.atan(d / v) if keeps_lane else 0.0)
            proposal = AppliedAction(2, "keep", np.array([0.0, drive], np.float32))
            applied, state = machine.decide(mem, k * TICK, [], proposal, x)
        else:
            applied, state = machine.decide(mem, k * TICK, [Reason.OOD_VETO], None, None)
            worst = max(worst, abs(d))
            states.append(state)
        accel, steer = float(applied.controls[0]), float(applied.controls[1])
        v = max(v + accel * DT, 0.0)
        psi += v * (math.tan(steer) / WHEELBASE - kappa) * DT
        d += v * math.sin(psi) * DT
        s += v * DT
    assert v == 0.0
    return worst, d, states


def test_a_blind_stop_keeps_its_lane_on_a_tightening_curve() -> None:
    worst, _, states = _blind_stop(SafetyConfig())
    assert SafetyState.FALLBACK_ACTIVE in states
    assert worst < 0.3
    # without the curvature's trend the same stop drifts out of its lane's half
    no_trend, _, _ = _blind_stop(SafetyConfig(lane_keeping=LaneKeepingConfig(preview_m=0.0)))
    assert no_trend > 0.8


def test_a_blind_stop_takes_back_the_heading_error_it_starts_with() -> None:
    """Lost 0.27 m off centre, pointing 0.005 rad further off, on a straight road: the estimate closes
    the loop on both. Steering the last curvature alone would keep the error for the whole stop
    (about 0.8 m off centre at its end)."""
    worst, last, _ = _blind_stop(SafetyConfig(), road=lambda s: 0.0, keeps_lane=False, heading=0.005)
    assert 0.25 < worst < 0.35 and abs(last) < 0.2


def _lane_change_with_a_veto(config: SafetyConfig) -> tuple[float, float, float]:
    """At 15.6 m/s a driver changes to the left lane (3.5 m); 0.15 s in, while it steers into the
    change at 0.035 rad, the inputs are vetoed for 250 ms, then clean again (the recovery's 500 ms
    dwell, then the driver). Returns the largest heading error of the hold and the dwell, how far
    left the car went, and the largest steering step from the first clean tick on, on a tick
    outside NOMINAL or the first back in it."""
    rng = np.random.default_rng(2)
    machine = SafetyMachine(config, ["accel", "steer"], TICK, SAFE, FEATURES)
    mem = SafetyMemory()
    d, psi, v, worst, leftmost = 0.0, 0.0, 15.6, 0.0, 0.0
    steer_before, state_before, largest_step = 0.0, SafetyState.NOMINAL, 0.0
    for k in range(1600):
        offset = d - 3.5 * round(d / 3.5)  # from the centre of the lane the car is in
        noise = rng.standard_normal(2) * [0.02, 0.001]
        x = np.array([v, 0.0, offset + noise[0], psi + noise[1], 0.0], np.float32)
        target = 3.5 if k >= 200 else 0.0
        drive = min(max(-psi - math.atan(0.6 * (d - target) / v), -0.035), 0.035)
        proposal = AppliedAction(2, "keep", np.array([0.0, drive], np.float32))
        vetoed = 230 <= k < 280
        applied, state = machine.decide(mem, k * TICK, [Reason.OOD_VETO] if vetoed else [], proposal, x)
        steer = float(applied.controls[1])
        psi += v * math.tan(steer) / WHEELBASE * DT
        d += v * math.sin(psi) * DT
        if 230 <= k and state is not SafetyState.NOMINAL:
            worst = max(worst, abs(psi))
        if k >= 280 and (SafetyState.NOMINAL is not state or SafetyState.NOMINAL is not state_before):
            largest_step = max(largest_step, abs(steer - steer_before))
        leftmost = max(leftmost, d)
        steer_before, state_before = steer, state
    return worst, leftmost, largest_step


def test_a_hold_in_the_middle_of_a_lane_change_keeps_a_lane() -> None:
    """A held steering angle is open loop: held for the veto and the recovery's dwell (750 ms) a
    lane change's 0.03 rad turns the car 0.14 rad further (a retrained model's change left the road
    that way). The hold keeps a lane instead, and the driver completes the change afterwards."""
    worst, leftmost, _ = _lane_change_with_a_veto(SafetyConfig())
    assert worst < 0.05 and 3.0 < leftmost < 4.0
    worst, _, _ = _lane_change_with_a_veto(SafetyConfig(lane_keeping=None))  # holding the angle
    assert worst > 0.15


def test_the_recovery_returns_to_the_models_steering_at_the_rate_limit() -> None:
    """Through the dwell and back to the driver in the middle of its lane change, no tick outside
    NOMINAL (or the first back in it) moves the wheel by more than `max_steer_rate` allows, and the
    return is not bounded below the driver's command (0.035 rad at 15.6 m/s is 3.2 m/s^2, above the
    hold's bound). The return from the keeper's angle was one step of ~0.03 rad (at 30 m/s that is
    ~10 m/s^2 of lateral acceleration in 5 ms)."""
    config = SafetyConfig()
    assert config.lane_keeping is not None
    limit = config.lane_keeping.max_steer_rate * DT
    _, leftmost, largest = _lane_change_with_a_veto(config)
    assert largest <= limit + 1e-6 and 3.0 < leftmost < 4.0
    fast = config.model_copy(update={"lane_keeping": LaneKeepingConfig(max_steer_rate=1e3)})
    assert _lane_change_with_a_veto(fast)[2] > 10 * limit


def _veto_on_noisy_lane(config: SafetyConfig, speed: float, model_steer: float, ticks: int) -> np.ndarray:
    """0.5 s of a model's command, then a veto of another signal: the lane readings stay readable,
    with the simulator's noise. Per tick from the veto on: (speed, applied steering)."""
    rng = np.random.default_rng(3)
    machine = SafetyMachine(config, ["accel", "steer"], TICK, SAFE, FEATURES)
    mem = SafetyMemory()
    model = AppliedAction(2, "keep", np.array([0.0, model_steer], np.float32))
    out = []
    for k in range(ticks):
        noise = rng.standard_normal(3) * [0.03, 0.003, 5e-5]
        x = np.array([speed, 0.0, noise[0], noise[1], noise[2]], np.float32)
        vetoed = k >= 100
        applied, _ = machine.decide(mem, k * TICK, [Reason.OOD_VETO] if vetoed else [], None if vetoed else model, x)
        speed = max(speed + float(applied.controls[0]) * DT, 0.0)
        if k >= 99:
            out.append((speed, float(applied.controls[1])))
    return np.array(out)


def test_at_rest_the_lane_keeper_holds_the_wheel() -> None:
    """At rest a correction moves nothing: the readings' noise must not turn the wheel every tick
    (over the second after the fallback stopped the car)."""

    def at_rest(config: SafetyConfig) -> np.ndarray:
        run = _veto_on_noisy_lane(config, 5.0, 0.0, 1000)
        steers = run[run[:, 0] == 0.0, 1][:200]
        assert len(steers) == 200
        return steers

    assert np.ptp(at_rest(SafetyConfig())) == 0.0
    unlimited = LaneKeepingConfig(min_speed=0.0, max_steer_rate=1e3)
    assert np.abs(np.diff(at_rest(SafetyConfig(lane_keeping=unlimited)))).max() > 0.01


def test_the_lane_keeper_turns_the_wheel_at_its_rate_limit() -> None:
    """Into the hold from the model's command and on noisy readings at a few m/s, every tick's
    steering is within `max_steer_rate` of the one before (it chattered by up to 0.04 rad)."""
    config = SafetyConfig()
    steers = _veto_on_noisy_lane(config, 8.0, 0.02, 600)[:, 1]
    assert np.abs(np.diff(steers)).max() <= config.lane_keeping.max_steer_rate * DT + 1e-6
    assert abs(steers[-1]) < 0.005  # and it got to the lane keeper's command (about 0) from 0.02


def test_a_session_distrusted_from_its_first_tick_still_steers_back_to_its_lane() -> None:
    """Nothing trusted yet (no action, no reading): the keeper's rate limit counts from the steering
    it applied itself, so it reaches its command (it stayed within one step of 0 when it counted
    from the safe action's, and all 8 runs of speed_out_of_range left the road)."""
    machine = SafetyMachine(SafetyConfig(), ["accel", "steer"], TICK, SAFE, FEATURES)
    mem = SafetyMemory()
    x = np.array([10.0, 0.0, -0.5, 0.0, 0.0], np.float32)  # 0.5 m right of the lane centre
    for k in range(100):
        applied, _ = machine.decide(mem, k * TICK, [Reason.OOD_VETO], None, x)
    assert float(applied.controls[1]) == pytest.approx(math.atan(0.5 / 10.0), rel=1e-4)  # the offset term


def _stop_into_a_tight_curve(config: SafetyConfig) -> float:
    """A veto of another signal at 15 m/s on a straight road (the lane readable); the fallback
    brakes, and 25 m on the road turns into a 40 m radius (over a 20 m clothoid). Returns the
    largest lane offset."""
    machine = SafetyMachine(config, ["accel", "steer"], TICK, SAFE, FEATURES)
    mem = SafetyMemory()
    s, d, psi, v, worst = 0.0, 0.0, 0.0, 15.0, 0.0
    keep = AppliedAction(2, "keep", np.array([0.0, 0.0], np.float32))
    for k in range(3000):
        kappa = 0.025 * min(max((s - 32.5) / 20.0, 0.0), 1.0)  # the veto comes at 0.5 s, 7.5 m
        x = np.array([v, 0.0, d, psi, kappa], np.float32)
        vetoed = k >= 100
        applied, _ = machine.decide(mem, k * TICK, [Reason.OOD_VETO] if vetoed else [], None if vetoed else keep, x)
        steer = float(applied.controls[1])
        v = max(v + float(applied.controls[0]) * DT, 0.0)
        psi += v * (math.tan(steer) / WHEELBASE - kappa) * DT
        d += v * math.sin(psi) * DT
        s += v * DT
        worst = max(worst, abs(d))
    assert v == 0.0
    return worst


def test_slowed_by_the_fallback_the_keeper_may_steer_a_tight_curve() -> None:
    """The steering bound is the lateral acceleration at the speed now (dead-reckoned while the
    speed is doubted), not at the last trusted one: bounded at the 15 m/s before the veto, 0.036 rad,
    the keeper could not follow a 40 m radius (0.067 rad) even at walking pace."""
    assert _stop_into_a_tight_curve(SafetyConfig()) < 0.1


def _lane_change_with_an_abstention(ticks: int) -> tuple[np.ndarray, np.ndarray, list[SafetyState]]:
    """The lane change of `_lane_change_with_a_veto`, the model abstaining (LOW_MARGIN) for `ticks`
    from 0.15 s into it: per tick the steering applied, the driver's, and the state."""
    rng = np.random.default_rng(2)
    machine = SafetyMachine(SafetyConfig(), ["accel", "steer"], TICK, SAFE, FEATURES)
    mem = SafetyMemory()
    d, psi, v = 0.0, 0.0, 15.6
    applied_steer, driver, states = [], [], []
    for k in range(900):
        offset = d - 3.5 * round(d / 3.5)
        noise = rng.standard_normal(2) * [0.02, 0.001]
        x = np.array([v, 0.0, offset + noise[0], psi + noise[1], 0.0], np.float32)
        target = 3.5 if k >= 200 else 0.0
        drive = min(max(-psi - math.atan(0.6 * (d - target) / v), -0.035), 0.035)
        proposal = AppliedAction(2, "keep", np.array([0.0, drive], np.float32))
        unsure = 230 <= k < 230 + ticks
        applied, state = machine.decide(mem, k * TICK, [Reason.LOW_MARGIN] if unsure else [], proposal, x)
        steer = float(applied.controls[1])
        psi += v * math.tan(steer) / WHEELBASE * DT
        d += v * math.sin(psi) * DT
        applied_steer.append(steer)
        driver.append(float(np.float32(drive)))
        states.append(state)
    return np.array(applied_steer), np.array(driver), states


def test_an_abstention_keeps_the_models_steering_and_its_fallback_turns_at_the_rate_limit() -> None:
    """The model abstains between acceleration bands; its steering is an output of its own on trusted
    inputs, so an abstention applies it (held, the angle was open loop for up to 1 s). An abstention
    past `max_abstain_ms` ends in the fallback, whose keeper turns from the steering applied at the
    rate limit."""
    steer, driver, states = _lane_change_with_an_abstention(100)  # 0.5 s, as on real 10 Hz drives
    assert all(s is SafetyState.NOMINAL for s in states)
    np.testing.assert_array_equal(steer, driver)
    steer, driver, states = _lane_change_with_an_abstention(400)  # 2 s: the fallback after 1 s
    first = states.index(SafetyState.FALLBACK_ACTIVE)
    assert first == 230 + 200
    np.testing.assert_array_equal(steer[:first], driver[:first])
    limit = SafetyConfig().lane_keeping.max_steer_rate * DT  # type: ignore[union-attr]
    assert np.abs(np.diff(steer[first - 1 : 630])).max() <= limit + 1e-6


def test_the_history_keeps_the_newest_readings_as_a_bounded_deque_would() -> None:
    """Appends past the length, clears and trims: the same readings, the same floats, as
    deque(maxlen=length) (what the history was before it became one flat array)."""
    rng = np.random.default_rng(3)
    for length in (1, 7, 200):
        history, reference = LaneHistory(length), deque(maxlen=length)
        for step in range(3000):
            if rng.random() < 0.003:
                history.clear(), reference.clear()
            reading = tuple(float(v) for v in rng.normal(size=4) * 10.0 ** rng.integers(-6, 3))
            history.append(reading)  # type: ignore[arg-type]
            reference.append(reading)
            if step % 37 == 0 or len(reference) < 3:
                assert history.readings() == list(reference) and len(history) == len(reference)
        assert bool(history) and not bool(LaneHistory(length))
