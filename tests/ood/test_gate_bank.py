"""The executor's one-pass gate (ood.GateBank, Python-number filters and freeze check) decides every
tick as the per-gate monitors, the numpy filter and freeze rules and executor.gating.nearest_gate
decided before it, on nominal and faulty inputs, with sessions coming and going."""

from __future__ import annotations

import numpy as np
import pytest

from dualloop.controller.contract.gate_files import load_gate_for_model
from dualloop.controller.gates.fitting import nominal_inputs
from dualloop.executor.config import ExecutorConfig
from dualloop.executor.core import Executor
from dualloop.executor.gating import nearest_gate
from dualloop.executor.model_runner import DecisionModel
from dualloop.executor.snapshot import Observation
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES
from dualloop.ood import GateMonitor


class _NumpyKOfN:
    """The k-of-n filter as it was: a uint64 window per slot, updated with numpy bit operations."""

    def __init__(self, k: int, n: int, n_slots: int) -> None:
        self.bits = np.zeros(n_slots, np.uint64)
        self.mask, self.k = np.uint64((1 << n) - 1), k

    def update(self, exceed, immediate=None, slots=None):  # noqa: ANN001 - GateMonitor's filter protocol
        bits = (self.bits[slots] << np.uint64(1)) | exceed
        bits &= self.mask
        self.bits[slots] = bits
        return (np.bitwise_count(bits) >= self.k) | immediate

    def reset(self, slot: int) -> None:
        self.bits[slot] = 0


class _NumpyFreeze:
    """The freeze check as it was, in numpy."""

    def __init__(self, n_slots: int, dim: int, repeats: int, rest: tuple[int, float] | None) -> None:
        self.last = np.full((n_slots, dim), np.nan, np.float32)
        self.count = np.zeros(n_slots, np.int64)
        self.repeats = repeats
        self.rest = rest

    def update(self, x: np.ndarray, slots: np.ndarray, fresh: np.ndarray) -> np.ndarray:
        same = np.all(x == self.last[slots], axis=1) & fresh
        if self.rest is not None:  # a car at rest repeats itself
            same &= ~(np.abs(x[:, self.rest[0]].astype(np.float64)) <= self.rest[1])
        count = np.where(same, self.count[slots] + 1, np.where(fresh, 0, self.count[slots]))
        self.count[slots] = count
        self.last[slots[fresh]] = x[fresh]
        return count >= self.repeats

    def reset(self, slot: int) -> None:
        self.last[slot] = np.nan
        self.count[slot] = 0


class _NumpyChanges:
    """Each row's rate of change (unit/s) since its slot's last finite fresh observation, in numpy (NaN:
    unknown)."""

    def __init__(self, n_slots: int, dim: int) -> None:
        self.last = np.full((n_slots, dim), np.nan)
        self.last_t = np.zeros(n_slots, np.int64)
        self.change = np.full((n_slots, dim), np.nan)

    def update(self, x: np.ndarray, slots: np.ndarray, fresh: np.ndarray, times: np.ndarray) -> np.ndarray:
        x64 = x.astype(np.float64)
        finite = np.isfinite(x64).all(axis=1)
        dt = (times - self.last_t[slots]).astype(np.float64) * 1e-9
        with np.errstate(divide="ignore", invalid="ignore"):
            new = np.where(finite[:, None] & (dt > 0)[:, None], (x64 - self.last[slots]) / dt[:, None], np.nan)
        self.change[slots[fresh]] = new[fresh]
        self.last[slots[fresh & finite]] = x64[fresh & finite]
        self.last_t[slots[fresh & finite]] = times[fresh & finite]
        return self.change[slots]

    def reset(self, slot: int) -> None:
        self.last[slot] = np.nan
        self.last_t[slot] = 0
        self.change[slot] = np.nan


@pytest.mark.slow
@pytest.mark.parametrize("first", [("a", "b", "c", "d"), ("a",)])
def test_bank_decides_every_tick_as_the_per_gate_reference(first: tuple[str, ...]) -> None:
    """Several sessions (the bank's general path) and one session at a time (its one-row path)."""
    model = DecisionModel(BASE_MODEL_PATH)
    gates = [load_gate_for_model(g, model) for g in DEFAULT_GATES]
    cap = 6
    # rows drawn at random are no drive in time: the per-signal checks (not the bank's) stay off
    ex = Executor(model, ExecutorConfig(max_sessions=cap, min_margin=0.0, signal_checks=False), gates)
    ref = [
        (GateMonitor(g.scorer(cap), _NumpyKOfN(g.filter.k, g.filter.n, cap)), g.schema.source, g.threshold)
        for g in gates
    ]
    ref_freeze = _NumpyFreeze(cap, model.n_features, ex.config.freeze_repeats, ex.gating.freeze.rest)
    ref_changes = _NumpyChanges(cap, model.n_features)
    assert any(
        g.feature_range is not None and g.feature_range.change_low for g in gates
    )  # the change limits are tested
    features, _ = nominal_inputs([3], every=2, duration_s=4.0)
    rng = np.random.default_rng(11)
    held: dict[str, np.ndarray] = {}
    seq: dict[str, int] = {}
    stamp: dict[str, int] = {}

    def open_session(sid: str) -> None:
        slot = ex.open_session(sid, include_decision_vector=True).slot
        for monitor, _, _ in ref:
            monitor.reset(slot)
        ref_freeze.reset(slot)
        ref_changes.reset(slot)
        seq[sid] = 0

    for sid in first:
        open_session(sid)
    vetoes = exceedances = out_of_range = 0
    for k in range(400):
        if k == 150 and len(first) == 1:  # a new session in another slot
            ex.close_session("a")
            held.pop("a", None)
            open_session("e")
        elif k == 150:  # sessions come and go: slots are no longer consecutive
            ex.close_session("b")
            held.pop("b", None)
            open_session("e")
            open_session("f")
        if k == 250 and len(first) > 1:
            ex.close_session("a")
            held.pop("a", None)
        obs = {}
        for sid in list(ex.sessions):
            if rng.random() < 0.3 and sid in held:
                continue  # no new observation: the tick reuses the last one
            x = features[rng.integers(len(features))].copy()
            fault = rng.random()
            if fault < 0.05:
                x[rng.integers(len(x))] = np.nan
            elif fault < 0.08:
                x[:] = 0.0
            elif fault < 0.2:
                x *= np.float32(3.6)  # units mix-up: out of distribution, finite
            elif fault < 0.25 and sid in held:
                x = held[sid] + np.float32(0.5)  # a jump: within range, beyond the change limits
            elif fault < 0.35 and sid in held:
                x = held[sid].copy()  # a stuck sensor repeats itself
            seq[sid] += 1
            # the sensor's clock: a little before the tick, irregularly
            stamp[sid] = k * 5_000_000 - int(rng.integers(0, 2_000_000))
            obs[sid] = Observation(seq=seq[sid], timestamp_ns=stamp[sid], features=x)
            held[sid] = x
        fresh = {sid: sid in obs for sid in ex.sessions}
        snaps = ex.step(obs, now_ns=k * 5_000_000)
        sids = [s.session_id for s in snaps]
        slots = np.array([ex.sessions[sid].slot for sid in sids])
        x = np.stack([held[sid] for sid in sids])
        finite = np.isfinite(x).all(axis=1)
        dv = np.stack([s.decision_vector for s in snaps]).astype(np.float32)
        is_fresh = np.array([fresh[sid] for sid in sids])
        changes = ref_changes.update(x, slots, is_fresh, np.array([stamp[sid] for sid in sids], np.int64))
        per_gate = []
        for monitor, source, threshold in ref:
            if source == "input_features":
                step = monitor.step(x, slots, changes)
                out_of_range += int(step.flags.out_of_range.sum())
            else:
                step = monitor.step(np.where(finite[:, None], dv, np.float32(np.nan)), slots)
            per_gate.append((step.score, step.alarm, threshold))
            exceedances += int(step.flags.exceed.sum())
        score, threshold, veto = nearest_gate(per_gate)
        veto |= ref_freeze.update(x, slots, is_fresh)
        np.testing.assert_allclose([s.gate_score for s in snaps], score, rtol=1e-9)
        assert [s.gate_threshold for s in snaps] == threshold.tolist()
        assert [s.gate_veto for s in snaps] == veto.tolist(), k
        vetoes += int(veto.sum())
    assert 0 < vetoes and 0 < exceedances and 0 < out_of_range  # alarms of every kind, not only quiet ticks
