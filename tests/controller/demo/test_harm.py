"""The demo report's harm columns, computed from synthetic per-tick traces."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dualloop.controller.demo.harm import drive_offs, time_to_standstill, transition_step
from dualloop.v2 import controller_pb2 as pb

N, H, F, R = (
    pb.SAFETY_STATE_NOMINAL,
    pb.SAFETY_STATE_VETO_HOLD,
    pb.SAFETY_STATE_FALLBACK_ACTIVE,
    pb.SAFETY_STATE_RECOVERING,
)
DT = 0.005


def test_transition_step_is_the_largest_step_at_or_next_to_a_non_nominal_state() -> None:
    accel = np.array([0.5, 0.5, -3.0, 1.0, -6.0, -6.0, -5.9, 2.25, 2.0, -1.0])
    state = np.array([N, N, N, N, H, F, F, R, N, N])
    # NOMINAL -> NOMINAL steps (0.5 -> -3.0, -3.0 -> 1.0, 2.0 -> -1.0) do not count, however large;
    # 1.0 -> -6.0 entering the hold (7.0) does, as does -5.9 -> 2.25 (8.15) and 2.25 -> 2.0 leaving
    assert transition_step(accel, state) == pytest.approx(8.15)
    state[7] = F  # the recovery's jump, still in FALLBACK, counts too
    assert transition_step(accel, state) == pytest.approx(8.15)
    assert transition_step(accel, np.full(accel.shape, N)) == 0.0
    # the first tick compares with nothing applied, when it is not NOMINAL
    assert transition_step(np.array([-2.0, -2.0]), np.array([F, F])) == pytest.approx(2.0)
    assert transition_step(np.array([-2.0, -2.0]), np.array([N, N])) == 0.0
    assert transition_step(np.zeros(0), np.zeros(0, np.int64)) == 0.0


def test_time_to_standstill_counts_from_the_first_non_nominal_tick() -> None:
    t = np.arange(2000) * DT
    speed = np.maximum(20.0 - 4.0 * np.maximum(t - 1.0, 0.0), 0.0)  # brakes from 1.0 s, stands at 6.0 s
    state = np.full(2000, N)
    assert math.isnan(time_to_standstill(t, speed, state, DT))  # never left NOMINAL
    state[200:] = F  # from 1.0 s
    first_still = int(np.argmax(speed < 0.1))
    assert time_to_standstill(t, speed, state, DT) == pytest.approx(t[first_still] - 1.0 + DT)
    assert 4.9 < time_to_standstill(t, speed, state, DT) < 5.1
    assert math.isnan(time_to_standstill(t, np.full(2000, 20.0), state, DT))  # never stands


def test_drive_offs_after_a_standstill_the_safety_layer_brought_about() -> None:
    speed = np.concatenate([np.linspace(20, 0, 100), np.zeros(100), np.linspace(0, 5, 100)])
    state = np.full(300, F)
    assert drive_offs(speed, state) == 1
    state[150:] = N  # recovered while standing, then drove off: still unreleased
    assert drive_offs(speed, state) == 1
    released = np.zeros(300, bool)
    released[180] = True
    assert drive_offs(speed, state, released) == 0
    # a stop in NOMINAL (e.g. behind a stopped car) and driving on is no drive-off
    assert drive_offs(speed, np.full(300, N)) == 0
    # creeping at 0.3 m/s is not moving off; two stops and two drive-offs count twice
    assert drive_offs(np.concatenate([np.zeros(10), np.full(10, 0.3)]), np.full(20, F)) == 0
    twice = np.concatenate([speed, speed])
    assert drive_offs(twice, np.full(600, H)) == 2
