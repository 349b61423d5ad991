"""The stopped-lead hold (executor/standstill.py) inside the safe-state machine: at rest behind a
stopped lead nothing positive reaches the actuators, a positive command steps down at the jerk
limit, the hold ends by itself when the lead moves off (the model ramped back in at the limit), only
trusted readings engage it, and the live batch, the reference and the replay agree on it."""

from __future__ import annotations

import copy
from dataclasses import replace as dataclasses_replace

import numpy as np
import pytest

from dualloop.executor.safety import SafetyConfig, SafetyMachine, SafetyMemory
from dualloop.executor.snapshot import AppliedAction, Reason, SafetyState
from dualloop.executor.standstill import StandstillConfig, StandstillHold

TICK = 5_000_000
FEATURES = [
    "ego_speed",
    "lane_offset",
    "heading_error",
    "road_curvature",
    "lead_present",
    "lead_distance",
    "lead_rel_speed",
]
ACTIONS = ["brake_hard", "brake", "keep", "accelerate"]
SAFE = AppliedAction(1, "brake", np.array([-2.0, 0.0], np.float32))


def _machine(**safety: object) -> SafetyMachine:
    return SafetyMachine(SafetyConfig(**safety), ["accel", "steer"], TICK, SAFE, FEATURES, ACTIONS)  # type: ignore[arg-type]


def _x(speed: float = 0.0, gap: float = 4.0, lead_speed: float = 0.0, present: float = 1.0) -> np.ndarray:
    return np.array([speed, 0.0, 0.0, 0.0, present, gap, lead_speed - speed], np.float32)


def _go(accel: float) -> AppliedAction:
    return AppliedAction(
        3 if accel > 0.5 else 2, "accelerate" if accel > 0.5 else "keep", np.array([accel, 0.0], np.float32)
    )


def _tick(
    machine: SafetyMachine,
    mem: SafetyMemory,
    k: int,
    accel: float,
    x: np.ndarray | None,
    reasons: list[Reason] | None = None,
    actuation_only: bool = False,
) -> tuple[float, list[Reason], SafetyState, str]:
    r = list(reasons or [])
    applied, state = machine.decide(mem, k * TICK, r, _go(accel), x, actuation_only)
    return float(applied.controls[0]), r, state, applied.name


def test_at_rest_behind_a_stopped_lead_nothing_positive_is_applied() -> None:
    machine, mem = _machine(), SafetyMemory()
    for k in range(200):
        accel = 0.4 * np.sin(k / 7.0)  # a model hovering around 0 at rest
        a, reasons, state, name = _tick(machine, mem, k, accel, _x())
        assert a <= 0.0 and state is SafetyState.NOMINAL
        assert (Reason.STOPPED_LEAD_HOLD in reasons) == (accel > 0.0)  # said exactly when it changed the command
        if accel <= 0.0:
            assert a == pytest.approx(accel)  # the model's braking stays the model's
        assert name == ("keep" if a >= -0.5 else "brake")


def test_a_positive_command_steps_down_at_the_jerk_limit() -> None:
    machine, mem = _machine(), SafetyMemory()
    for k in range(200):  # rolling at 1 m/s, accelerating gently: not at rest, the model drives
        a, reasons, *_ = _tick(machine, mem, k, 1.0, _x(speed=1.0))
        assert a == pytest.approx(1.0) and not reasons
    applied = [_tick(machine, mem, 200 + k, 1.0, _x(speed=0.05))[0] for k in range(100)]  # at rest now
    steps = np.diff([1.0, *applied])
    assert (steps <= 0.0).all() and (-steps <= machine.jerk_step + 1e-9).all()
    assert applied[-1] == 0.0 and applied[len(applied) // 2 - 1] > 0.0  # 80 ticks down from 1 m/s^2 at 2.5 m/s^3


@pytest.mark.parametrize("how", ["the lead moves off", "the gap grows past the hold's"])
def test_it_releases_by_itself_and_ramps_the_model_back_in(how: str) -> None:
    machine, mem = _machine(), SafetyMemory()
    for k in range(50):
        assert _tick(machine, mem, k, 1.5, _x())[0] == 0.0
    released = _x(lead_speed=0.6) if how == "the lead moves off" else _x(gap=8.5)
    applied, held = [], []
    for k in range(50, 250):
        a, reasons, state, _ = _tick(machine, mem, k, 1.5, released)
        applied.append(a)
        held.append(Reason.STOPPED_LEAD_HOLD in reasons)
        assert state is SafetyState.NOMINAL
    steps = np.diff([0.0, *applied])
    assert (steps >= 0.0).all() and (steps <= machine.jerk_step + 1e-9).all()
    met = applied.index(1.5)
    assert met == pytest.approx(1.5 / machine.jerk_step, abs=1) and all(held[:met]) and not any(held[met:])
    assert not mem.lead_hold


@pytest.mark.parametrize(
    "x",
    [
        _x(present=0.0),  # no lead
        _x(gap=float("nan")),
        _x(lead_speed=float("nan")),
        _x(gap=-1.0),  # not a gap
        _x(gap=8.0),  # not closer than the hold's gap
        _x(lead_speed=0.5),  # the lead moves
        _x(speed=0.2),  # the ego moves
        _x(speed=float("inf")),
        None,  # inputs that must not be read (a frozen sensor)
    ],
)
def test_no_hold_without_a_trusted_stopped_lead_close_ahead(x: np.ndarray | None) -> None:
    machine, mem = _machine(), SafetyMemory()
    for k in range(20):
        a, reasons, *_ = _tick(machine, mem, k, 0.4, x)
        assert a == pytest.approx(0.4) and Reason.STOPPED_LEAD_HOLD not in reasons


def test_doubted_inputs_do_not_engage_it_but_the_hold_of_a_veto_keeps_the_held_command() -> None:
    """A veto that doubts the inputs: the lead's readings do not count, yet the veto's hold aims at
    what was applied (0), not at the positive commands the stopped-lead hold lowered."""
    machine, mem = _machine(), SafetyMemory()
    for k in range(50):
        assert _tick(machine, mem, k, 0.4, _x())[0] == 0.0
    for k in range(50, 80):
        a, reasons, state, _ = _tick(machine, mem, k, 0.4, _x(), [Reason.OOD_VETO])
        assert state is SafetyState.VETO_HOLD and Reason.STOPPED_LEAD_HOLD not in reasons
        assert a == 0.0  # rolled back to a lowered command


def test_it_holds_in_any_state_on_inputs_not_doubted() -> None:
    """A late observation does not doubt the sensors: the blend back to the model after it stops at 0
    (RECOVERING, the model's +0.4 never met) while the stopped lead stays."""
    machine, mem = _machine(), SafetyMemory()
    for k in range(20):
        assert _tick(machine, mem, k, -0.3, _x())[0] == pytest.approx(-0.3)
    assert _tick(machine, mem, 20, 0.4, _x(), [Reason.STALE_OBSERVATION])[2] is SafetyState.VETO_HOLD
    out = [_tick(machine, mem, k, 0.4, _x()) for k in range(21, 200)]
    applied = [a for a, *_ in out]
    assert max(applied) == 0.0 and (np.diff(applied) <= machine.jerk_step + 1e-9).all()
    assert out[-1][2] is SafetyState.RECOVERING and Reason.STOPPED_LEAD_HOLD in out[-1][1]
    # the lead moves off: the recovery's own blend goes on from 0, at the jerk limit
    a, reasons, state, _ = _tick(machine, mem, 200, 0.4, _x(lead_speed=2.0))
    assert a == pytest.approx(machine.jerk_step, abs=1e-6) and state is SafetyState.RECOVERING
    assert Reason.STOPPED_LEAD_HOLD not in reasons


def test_without_it_the_model_creeps() -> None:
    """The comparison the tests above rest on: with `standstill=None` the same inputs apply the
    model's positive command."""
    machine, mem = _machine(standstill=None), SafetyMemory()
    assert machine.standstill is None
    assert _tick(machine, mem, 0, 0.4, _x())[0] == pytest.approx(0.4)


def test_engaged_rows_equals_engaged_row_by_row() -> None:
    rng = np.random.default_rng(3)
    hold = StandstillHold(StandstillConfig(), FEATURES)
    x = np.stack(
        [
            _x(speed=s, gap=g, lead_speed=v, present=p)
            for s, g, v, p in zip(
                rng.choice([0.0, 0.05, 0.19999, 0.2, 1.0, np.nan], 2000),
                rng.choice([-0.5, 0.0, 4.0, 7.99, 8.0, 20.0, np.nan, np.inf], 2000),
                rng.choice([-2.0, 0.0, 0.49, 0.5, 3.0, np.nan], 2000),
                rng.choice([0.0, 1.0, 0.5], 2000),
            )
        ]
    )
    rows = hold.engaged_rows(x)
    assert rows.tolist() == [hold.engaged(r) for r in x]
    assert rows.any() and not rows.all()


class _BlindBatch(SafetyMachine):
    """A batch that takes every steady row's fast path, blind to the hold: what a slip would look like."""

    def decide_batch(self, mems, now_ns, reasons, proposals, features, *rest):  # type: ignore[no-untyped-def]
        hold, self.standstill = self.standstill, None
        try:
            return super().decide_batch(mems, now_ns, reasons, proposals, features, *rest)
        finally:
            self.standstill = hold


@pytest.mark.parametrize("blind", [False, True])
def test_decide_batch_equals_decide_at_rest_behind_stopped_leads(blind: bool) -> None:
    """Sessions at rest behind leads that stop, wait and move off, with a few vetoes among them:
    the batch gives the reference's applied actions, reasons and memory; a batch blind to the hold
    on its fast path does not."""
    rng = np.random.default_rng(11)
    machine = _machine()
    batch = (_BlindBatch if blind else SafetyMachine)(SafetyConfig(), ["accel", "steer"], TICK, SAFE, FEATURES, ACTIONS)
    n = 8
    ref, got = [SafetyMemory() for _ in range(n)], [SafetyMemory() for _ in range(n)]
    lead_speed = np.zeros(n)
    differ = held = 0
    for k in range(1500):
        lead_speed = np.where(rng.random(n) < 0.01, rng.choice([0.0, 1.0], n), lead_speed)
        x = np.stack(
            [_x(speed=0.0, gap=float(g), lead_speed=float(v)) for g, v in zip(rng.uniform(2.0, 10.0, n), lead_speed)]
        )
        reasons = [[Reason.OOD_VETO] if rng.random() < 0.002 else [] for _ in range(n)]
        proposals = [_go(float(a)) for a in rng.normal(0.2, 0.5, n)]
        mine = copy.deepcopy(reasons)
        out = batch.decide_batch(got, k * TICK, mine, proposals, x)
        for s in range(n):
            applied, state = machine.decide(ref[s], k * TICK, reasons[s], proposals[s], x[s])
            same = (
                applied.controls.tobytes() == out[s][0].controls.tobytes()
                and applied.name == out[s][0].name
                and state is out[s][1]
                and reasons[s] == mine[s]
                and ref[s].last_accel == got[s].last_accel
                and ref[s].lead_hold == got[s].lead_hold
            )
            differ += not same
            held += Reason.STOPPED_LEAD_HOLD in reasons[s]
    assert held > 100
    assert (differ > 0) == blind


@pytest.mark.slow
def test_replay_applies_the_hold_as_the_live_lockstep_tick_does(base_model, base_gates) -> None:  # noqa: ANN001
    """A closed-loop drive with the shipped model that stops behind a stopped car (which later drives
    off), recorded and fed again: the vectorised replay (run_lockstep) and the live LOCKSTEP tick
    (advance_lockstep) apply the same commands, the hold's included, with the same reasons."""
    from dualloop.controller.demo.closed_loop import InProcessDecider, run_closed_loop
    from dualloop.executor.core import Executor
    from dualloop.executor.lockstep_batch import run_lockstep
    from dualloop.executor.snapshot import Clock, Observation
    from dualloop.sim.env import make_scenario

    recorded: list[Observation] = []

    class Recording(InProcessDecider):
        def decide(self, seq, timestamp_ns, features, plan_id, plan, actual=None):  # type: ignore[no-untyped-def]
            obs = Observation(
                seq, timestamp_ns, features.copy(), plan_id=plan_id, plan_values=None if plan is None else plan.copy()
            )
            if actual is not None:
                obs.actual_index, obs.actual_controls = actual[0], np.array(actual[1], np.float32)
            recorded.append(obs)
            return super().decide(seq, timestamp_ns, features, plan_id, plan, actual)

    env = make_scenario("stopped_vehicle_ahead", 900_012, duration_s=20.0)
    env.world.script.accel_end[:, 1], env.world.v0[:, 1] = 16.0, 15.0  # the stopped car drives off at 16 s
    run_closed_loop(env, Recording(Executor(base_model, None, base_gates), "drive"), 900_012)
    live_ex, replay_ex = Executor(base_model, None, base_gates), Executor(base_model, None, base_gates)
    live_ex.open_session("a", clock=Clock.LOCKSTEP)
    replay_ex.open_session("a", clock=Clock.LOCKSTEP)
    live = [snap for obs in recorded for snap in live_ex.advance_lockstep("a", obs)]
    table = run_lockstep(replay_ex, "a", [dataclasses_replace(o) for o in recorded])
    assert len(live) == len(table.reasons)
    held = [Reason.STOPPED_LEAD_HOLD in s.reasons for s in live]
    assert sum(held) > 100
    assert [tuple(s.reasons) for s in live] == [tuple(r) for r in table.reasons]
    np.testing.assert_array_equal(np.array([s.applied.controls for s in live]), table.applied_controls)
    np.testing.assert_array_equal([s.applied.index for s in live], table.applied)
