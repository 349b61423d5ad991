"""The end of a standstill hold without a release (executor/override.py), inside the safe-state
machine: a vehicle stopped by the minimal-risk manoeuvre is taken as driven by someone else only when
its measured acceleration explains its measured speed all the way from rest. A QA pass biased the
speed by +2 m/s at rest: nothing vetoed once the step had passed, the hold ended and the car drove off."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from dualloop.executor.model_runner import DecisionModel
from dualloop.executor.safety import SafetyConfig, SafetyMachine, SafetyMemory
from dualloop.executor.snapshot import AppliedAction, Reason, SafetyState

TICK = 5_000_000
GO = AppliedAction(3, "accelerate", np.array([1.5, 0.0], np.float32))


def _stopped(model: DecisionModel) -> tuple[SafetyMachine, SafetyMemory, np.ndarray, int, int]:
    """A machine whose session the fallback stopped (inputs unreadable from 10 m/s), then its inputs at rest."""
    card = model.card
    safe = AppliedAction(1, "brake", np.array([-2.0, 0.0], np.float32))
    machine = SafetyMachine(SafetyConfig(), ["accel", "steer"], TICK, safe, card.feature_names, card.actions)
    names = list(card.feature_names)
    speed_at, accel_at = names.index("ego_speed"), names.index("ego_accel")
    x = np.zeros(len(names), np.float32)
    x[speed_at], x[names.index("lead_distance")] = 10.0, 150.0
    mem = SafetyMemory()
    for k in range(10):
        machine.decide(mem, k * TICK, [], GO, x)
    for k in range(10, 1400):
        machine.decide(mem, k * TICK, [Reason.INVALID_INPUT], None, None)
    assert mem.stopped
    x[speed_at] = 0.0
    return machine, mem, x, speed_at, accel_at


def _held_ticks(
    model: DecisionModel, readings: Callable[[float], tuple[float, float]], seconds: float
) -> tuple[int, int, float]:
    """(ticks, ticks still held, largest command applied) over `seconds` of (speed, accel) readings."""
    machine, mem, x, speed_at, accel_at = _stopped(model)
    held, ticks, top = 0, int(seconds / 0.005), -np.inf
    for k in range(ticks):
        x[speed_at], x[accel_at] = readings(k * 0.005)
        reasons: list[Reason] = []
        applied, state = machine.decide(mem, (1400 + k) * TICK, reasons, GO, x)
        held += state is SafetyState.FALLBACK_ACTIVE and Reason.STANDSTILL_HOLD in reasons
        top = max(top, float(applied.controls[0]))
    return ticks, held, top


@pytest.mark.parametrize(
    "readings",
    [
        lambda t: (0.0 if t < 1.0 else 2.0, 0.0),  # a +2 m/s bias from 1 s on
        lambda t: (0.0 if t < 1.0 else 1.6, 0.0),  # just above the override speed
        lambda t: (0.1 * t, 0.0),  # a drift of 0.1 m/s per second
        lambda t: (0.0 if t < 1.0 else 2.0, 0.5),  # with an accelerometer reading a slope's 0.5 m/s^2
    ],
    ids=["bias-2", "bias-1.6", "drift", "bias-on-a-slope"],
)
def test_a_speed_sensor_alone_never_ends_the_hold(test_model: DecisionModel, readings) -> None:  # noqa: ANN001
    ticks, held, top = _held_ticks(test_model, readings, 20.0)
    assert held == ticks
    assert top <= 0.0  # nothing positive reaches the actuators


def test_a_pull_away_both_sensors_measure_ends_the_hold(test_model: DecisionModel) -> None:
    """1.2 m/s^2 from rest, with the accelerometer's bias (0.2 m/s^2) and the speed read at 10 Hz."""

    def readings(t: float) -> tuple[float, float]:
        if t < 1.0:
            return 0.0, 0.2
        moving = np.floor((t - 1.0) * 10) / 10  # sample-and-hold at 10 Hz
        return 1.2 * moving, 1.4

    ticks, held, _ = _held_ticks(test_model, readings, 4.0)
    # released once past 1.5 m/s (1.25 s after it moved off, plus a sample)
    assert 2.25 / 0.005 <= held <= 2.4 / 0.005


def test_a_pull_away_begun_unseen_never_ends_the_hold(test_model: DecisionModel) -> None:
    """The speed read moving with nothing trusted at rest before it (the speed sensor itself was the
    fault the stop was dead-reckoned through): nothing to check it against."""
    machine, mem, x, speed_at, accel_at = _stopped(test_model)
    x[speed_at], x[accel_at] = 3.0, 0.0
    for k in range(1400, 3400):
        speed = 3.0 + 1.0 * (k - 1400) * 0.005
        x[speed_at], x[accel_at] = speed, 1.0
        reasons: list[Reason] = []
        _, state = machine.decide(mem, k * TICK, reasons, GO, x)
        assert state is SafetyState.FALLBACK_ACTIVE and Reason.STANDSTILL_HOLD in reasons
