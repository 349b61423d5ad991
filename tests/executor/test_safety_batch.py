"""`SafetyMachine.decide_batch` equals the reference `decide` row by row: on seeded random sequences
of reasons, proposals and inputs over many ticks and sessions, the same applied actions (bits), states,
added reasons and memories."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

from dualloop.executor.lane_keeping import LaneKeepingConfig
from dualloop.executor.reasons import TICK_REASONS
from dualloop.executor.safety import SafetyConfig, SafetyMachine, SafetyMemory
from dualloop.executor.snapshot import AppliedAction, Reason, SafetyState
from dualloop.executor.stuck_lead import LeadDoubt

TICK = 5_000_000
FEATURES = [
    "ego_speed",
    "ego_accel",
    "lane_offset",
    "heading_error",
    "road_curvature",
    "lead_present",
    "lead_distance",
    "lead_rel_speed",
]
ACTIONS = ["brake_hard", "brake", "keep", "accelerate"]
SAFE = AppliedAction(1, "brake", np.array([-2.0, 0.0], np.float32))


def _ticks(rng: np.random.Generator, sessions: int, ticks: int):
    """Per tick: (reasons, proposals, features (sessions, F), use_features, actuation_only, release, lead
    doubt) per session. Mostly clean ticks, with runs of faults so holds, fallbacks, standstills, releases,
    recoveries, abstentions and threats all happen."""
    fault, stuck = np.zeros(sessions, bool), np.zeros(sessions, bool)
    gap, rel = rng.uniform(20.0, 60.0, sessions), rng.uniform(-15.0, 2.0, sessions)
    stuck_at = gap.copy()
    speed, moving = rng.uniform(0.0, 40.0, sessions), np.ones(sessions, bool)
    for _ in range(ticks):
        fault ^= rng.random(sessions) < 0.03  # faults come and go in runs
        reasons, proposals = [], []
        for s in range(sessions):
            r = [x for x in TICK_REASONS if rng.random() < (0.35 if fault[s] else 0.01)]
            scored = Reason.INVALID_INPUT not in r and Reason.MODEL_ERROR not in r
            idx = int(rng.integers(len(ACTIONS)))
            controls = np.array([rng.normal(0.0, 3.0), rng.normal(0.0, 0.05)], np.float32)
            reasons.append(r)
            proposals.append(AppliedAction(idx, ACTIONS[idx], controls) if scored else None)
        x = rng.normal(0.0, 1.0, (sessions, len(FEATURES))).astype(np.float32)
        moving ^= rng.random(sessions) < 0.01  # standing still in runs
        x[:, 0] = np.where(moving, speed + rng.normal(0.0, 0.5, sessions), 0.0)  # some below the steer bound's 1 m/s
        # a lead closing as its relative speed says, so the threat assessor can trust it
        gap += rel * TICK / 1e9
        new = (gap < 3.0) | (rng.random(sessions) < 0.002)
        gap[new], rel[new] = rng.uniform(20.0, 60.0, new.sum()), rng.uniform(-15.0, 2.0, new.sum())
        # standing sessions stand behind a lead 2-12 m ahead (the stopped-lead hold's range and beyond)
        # that now and then moves off
        behind = rng.uniform(2.0, 12.0, sessions)
        moves_off = rng.random(sessions) < 0.3
        # gap sensors that stick in runs (the threat assessor reckons such a gap from the relative speed)
        starts = ~stuck & (rng.random(sessions) < 0.003)
        stuck_at[starts] = gap[starts]
        stuck = (stuck | starts) & (rng.random(sessions) > 0.02)
        x[:, 5], x[:, 6] = 1.0, np.where(moving, np.where(stuck, stuck_at, gap), behind)
        x[:, 7] = np.where(moving, rel, np.where(moves_off, 1.0, 0.0))
        x[rng.random(x.shape) < np.where(np.arange(len(FEATURES)) < 5, 0.05, 0.002)] = np.nan
        use, only, release = (rng.random((3, sessions)) < [[0.95], [0.2], [0.01]]).tolist()
        kinds = [LeadDoubt.ONE_STUCK, LeadDoubt.REL_DOUBTED, LeadDoubt.REL_AGAINST_TREND, LeadDoubt.ALL]
        doubts = rng.choice(kinds, sessions, p=[0.4, 0.2, 0.2, 0.2])
        lead = np.where((stuck | (rng.random(sessions) < 0.05)) & fault, doubts, 0)
        yield reasons, proposals, x, use, only, release, lead.tolist()


def _same_action(a: AppliedAction | None, b: AppliedAction | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.index == b.index and a.name == b.name and a.controls.tobytes() == b.controls.tobytes()


def _same_memory(a: SafetyMemory, b: SafetyMemory) -> bool:
    actions = {"last_safe", "fallback"}
    for f in dataclasses.fields(SafetyMemory):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name in actions:
            if not _same_action(x, y):
                return False
        elif f.name == "recent":
            if len(x) != len(y) or not all(map(_same_action, x, y)):
                return False
        elif isinstance(x, float):
            if np.float64(x).tobytes() != np.float64(y).tobytes():
                return False
        elif x != y:
            return False
    return True


def _compare(machine: SafetyMachine, batch: SafetyMachine, seed: int, sessions: int, ticks: int) -> int:
    """Rows where decide_batch and decide row by row differ (applied, state, reasons or memory)."""
    rng = np.random.default_rng(seed)
    ref, got = [SafetyMemory() for _ in range(sessions)], [SafetyMemory() for _ in range(sessions)]
    differ = 0
    states = set()
    added: set[Reason] = set()
    for k, (reasons, proposals, x, use, only, release, lead) in enumerate(_ticks(rng, sessions, ticks)):
        now = k * TICK
        batch_reasons = copy.deepcopy(reasons)
        out = batch.decide_batch(got, now, batch_reasons, proposals, x, use, only, release, lead)
        for s in range(sessions):
            applied, state = machine.decide(
                ref[s], now, reasons[s], proposals[s], x[s] if use[s] else None, only[s], release[s], lead[s]
            )
            added.update(reasons[s])
            states.add(state)
            same = (
                _same_action(applied, out[s][0])
                and state is out[s][1]
                and reasons[s] == batch_reasons[s]
                and _same_memory(ref[s], got[s])
            )
            differ += not same
    # the sequences reached every state (without a dwell, RECOVERING is the blend) and added every reason
    assert states == set(SafetyState)
    assert {Reason.FALLBACK, Reason.STANDSTILL_HOLD} <= added
    assert Reason.THREAT_BRAKING in added or machine.threat is None or not machine.threat.available
    assert Reason.STOPPED_LEAD_HOLD in added or machine.standstill is None
    return differ


def _machine(config: SafetyConfig) -> SafetyMachine:
    return SafetyMachine(config, ["accel", "steer"], TICK, SAFE, FEATURES)


CONFIGS = {
    "default": SafetyConfig(),
    "no lane keeping": SafetyConfig(lane_keeping=None),
    "short timers": SafetyConfig(
        hold_timeout_ms=20.0, recovery_dwell_ms=0.0, max_abstain_ms=10.0, rollback_ticks=0, max_vetoed_brake=0.0
    ),
    "lane keeping without its features": SafetyConfig(lane_keeping=LaneKeepingConfig(curvature_feature="absent")),
    "no stopped-lead hold": SafetyConfig(standstill=None),
}


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("seed", [0, 1])
def test_decide_batch_equals_decide_row_by_row(name: str, seed: int) -> None:
    config = CONFIGS[name]
    assert _compare(_machine(config), _machine(config), seed, sessions=12, ticks=1500) == 0


def test_decide_batch_without_features() -> None:
    """Rows without inputs (features None): the lane keeper is blind, nothing is trusted from them."""
    machine, batch = _machine(SafetyConfig()), _machine(SafetyConfig())
    rng = np.random.default_rng(5)
    ref, got = [SafetyMemory() for _ in range(4)], [SafetyMemory() for _ in range(4)]
    for k, (reasons, proposals, *_) in enumerate(_ticks(rng, 4, 600)):
        batch_reasons = copy.deepcopy(reasons)
        out = batch.decide_batch(got, k * TICK, batch_reasons, proposals, None)
        for s in range(4):
            applied, state = machine.decide(ref[s], k * TICK, reasons[s], proposals[s], None)
            assert _same_action(applied, out[s][0]) and state is out[s][1] and reasons[s] == batch_reasons[s]
            assert _same_memory(ref[s], got[s])


class _ForgetsTheRoad(SafetyMachine):
    """A batch that drops the steady rows' trusted speed: what a slip in decide_batch would look like."""

    def decide_batch(self, mems, now_ns, reasons, proposals, features, use_features=None, *flags):  # type: ignore[no-untyped-def]
        speeds = [m.trusted_speed for m in mems]
        out = super().decide_batch(mems, now_ns, reasons, proposals, features, use_features, *flags)
        for m, r, v in zip(mems, reasons, speeds):
            if not r and m.state is SafetyState.NOMINAL:
                m.trusted_speed = v
        return out


def test_the_comparison_can_fail() -> None:
    """The comparison above sees a batch that differs from the reference in one memory field."""
    config = SafetyConfig()
    broken = _ForgetsTheRoad(config, ["accel", "steer"], TICK, SAFE, FEATURES)
    assert _compare(_machine(config), broken, 0, sessions=12, ticks=600) > 0
