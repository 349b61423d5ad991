"""The gates on real sensors: observations at 10-200 Hz on irregular clocks, and sessions that measure
only some features (Session.present). The live step (GateWiring.step, through advance_lockstep) and the
replay (run_lockstep) decide the same vetoes; a missing feature's NaN is not an invalid input for the
gate, a present one's is; a realistic 10 Hz drive is not vetoed for how fast its features change."""

from __future__ import annotations

import numpy as np
import pytest

from dualloop.executor.config import ExecutorConfig
from dualloop.executor.core import Executor
from dualloop.executor.lockstep_batch import run_lockstep
from dualloop.executor.snapshot import Clock, Observation
from dualloop.ood import ChangeTracker
from dualloop.sim.env import run_expert_batch
from dualloop.sim.schema import FEATURE_INDEX, FEATURE_NAMES

LONGITUDINAL = ("ego_speed", "ego_accel", "lead_present", "lead_distance", "lead_rel_speed")


@pytest.fixture()
def model(base_model):  # noqa: ANN001, ANN201
    return base_model


@pytest.fixture()
def gates(base_gates):  # noqa: ANN001, ANN201
    return base_gates


@pytest.fixture(scope="module")
def drive():  # noqa: ANN201
    """An expert's nominal drive behind a lead, observed at every 5 ms tick: (t s, features)."""
    _, data = run_expert_batch("lead_brakes_hard", [950_101], duration_s=12.0)
    return data.t, data.features[0]


def _longitudinal() -> np.ndarray:
    return np.array([n in LONGITUDINAL for n in FEATURE_NAMES])


def _observe(rng: np.random.Generator, t: np.ndarray, x: np.ndarray, hz: float, present: np.ndarray | None):
    """Observations of the drive at about `hz` on an irregular clock (+-30% jitter, now and then late):
    the sensor's reading at each timestamp, NaN where the profile does not measure."""
    period = 1.0 / hz
    stamps, now = [], t[0] + 0.01
    while now < t[-1]:
        stamps.append(now)
        now += period * (1.0 + rng.uniform(-0.3, 0.3)) + (period * rng.uniform(0.5, 2.0) if rng.random() < 0.05 else 0)
    at = np.searchsorted(t, stamps, side="right") - 1
    rows = x[at].copy()
    if present is not None:
        rows[:, ~present] = np.nan
    ns = np.round(np.array(stamps) * 1e9).astype(np.int64)
    return ns, rows


def _faults(rng: np.random.Generator, rows: np.ndarray, present: np.ndarray | None) -> np.ndarray:
    """A NaN in a measured feature, a jump, a stuck stretch: vetoes of every kind."""
    rows = rows.copy()
    measured = np.flatnonzero(present) if present is not None else np.arange(rows.shape[1])
    n = len(rows)
    rows[n // 5, measured[1]] = np.nan
    rows[n // 3, FEATURE_INDEX["ego_speed"]] += 6.0
    stuck = 2 * n // 3
    rows[stuck : stuck + 5] = rows[stuck]
    return rows


@pytest.mark.parametrize("hz", [10.0, 20.0, 100.0])
@pytest.mark.parametrize("profile", ["all", "longitudinal"])
def test_live_and_replay_agree_at_any_rate_and_profile(model, gates, drive, hz, profile) -> None:
    """advance_lockstep observation by observation and run_lockstep in one pass give every tick the
    same gate veto and threshold (scores within 1e-5: the replay scores with other batch sizes), for a
    session measuring every feature or only the longitudinal ones, on irregular 10, 20 and 100 Hz clocks."""
    rng = np.random.default_rng(int(hz) + len(profile))
    present = None if profile == "all" else _longitudinal()
    ns, rows = _observe(rng, *drive, hz, present)
    rows = _faults(rng, rows, present)
    observations = [Observation(seq=i + 1, timestamp_ns=int(s), features=r) for i, (s, r) in enumerate(zip(ns, rows))]
    config = ExecutorConfig(min_margin=0.0)
    live_ex, replay_ex = Executor(model, config, gates), Executor(model, config, gates)
    for ex in (live_ex, replay_ex):
        ex.open_session("a", clock=Clock.LOCKSTEP).present = present
    live = [snap for obs in observations for snap in live_ex.advance_lockstep("a", obs)]
    table = run_lockstep(replay_ex, "a", observations)
    assert len(live) == len(table.gate_veto)
    veto = np.array([s.gate_veto for s in live])
    np.testing.assert_array_equal(veto, table.gate_veto)
    np.testing.assert_array_equal([s.gate_threshold for s in live], table.gate_threshold)
    np.testing.assert_allclose([s.gate_score for s in live], table.gate_score, rtol=1e-5)
    assert veto.any() and not veto.all()
    if present is not None:  # the profile's own threshold, not the full gate's
        assert live_ex.gating.profile(present) is not None
        assert set(table.gate_threshold.tolist()) - {g.threshold for g in gates}


def test_a_missing_features_nan_is_not_vetoed_a_present_ones_is(model, gates, drive) -> None:
    """Through the raw-input gate: a session measuring the longitudinal features sends the others as
    NaN, tick after tick, without a veto; NaN in its speed vetoes in that very tick, live and in a
    replay; the same NaN rows from a session that says it measures everything veto at once."""
    t, x = drive
    inputs = [g for g in gates if g.schema.source == "input_features"]
    present = _longitudinal()
    ns, rows = _observe(np.random.default_rng(5), t, x, 10.0, present)
    rows = rows[:60]
    bad = 40
    rows[bad, FEATURE_INDEX["ego_speed"]] = np.nan
    observations = [Observation(seq=i + 1, timestamp_ns=int(s), features=r) for i, (s, r) in enumerate(zip(ns, rows))]
    for replay in (False, True):
        ex = Executor(model, ExecutorConfig(min_margin=0.0), inputs)
        ex.open_session("a", clock=Clock.LOCKSTEP).present = present
        if replay:
            table = run_lockstep(ex, "a", observations)
            veto, obs_index = table.gate_veto, table.obs_index
        else:
            snaps = [s for o in observations for s in ex.advance_lockstep("a", o)]
            veto, obs_index = np.array([s.gate_veto for s in snaps]), np.array([s.observation_seq - 1 for s in snaps])
        assert not veto[obs_index < bad].any(), replay
        assert veto[obs_index == bad].all(), replay
    unmasked = Executor(model, ExecutorConfig(min_margin=0.0), inputs)
    unmasked.open_session("a", clock=Clock.LOCKSTEP)
    assert run_lockstep(unmasked, "a", observations[:10]).gate_veto.all()


def test_a_realistic_10hz_drive_is_within_the_change_limits(gates, drive) -> None:
    """A 10 Hz sensor with realistic noise (0.1 m/s on speeds, 0.3 m/s^2 on a finite-difference
    acceleration, 0.5 m on the gap) changes by 20 times a 200 Hz one's between observations, and so
    does the interval: rates per second stay inside the limits fitted on 200 Hz simulation. The same
    changes judged per observation, as the limits were before, leave a quarter of them outside."""
    (inputs,) = [g for g in gates if g.schema.source == "input_features"]
    rng_limits = inputs.feature_range
    assert rng_limits is not None
    t, x = drive
    rng = np.random.default_rng(9)
    ns, rows = _observe(rng, t, x, 10.0, None)
    noise = np.zeros(rows.shape[1], np.float32)
    for name, sigma in (("ego_speed", 0.1), ("ego_accel", 0.3), ("lead_distance", 0.5), ("lead_rel_speed", 0.1)):
        noise[FEATURE_INDEX[name]] = sigma
    rows = (rows + noise * rng.standard_normal(rows.shape)).astype(np.float32)
    rates = ChangeTracker(1, rows.shape[1]).scan(rows, np.isfinite(rows).all(axis=1), 0, ns)
    low, high = np.array(rng_limits.change_low), np.array(rng_limits.change_high)
    outside = ((rates < low) | (rates > high)).any(axis=1)
    assert len(rows) > 100 and not outside.any()
    per_observation = np.diff(rows.astype(np.float64), axis=0)  # the old reading: limits * 5 ms per observation
    old_outside = ((per_observation < low * 0.005) | (per_observation > high * 0.005)).any(axis=1)
    assert old_outside.mean() > 0.2


def test_sessions_of_several_profiles_in_one_tick_are_judged_as_alone(model, gates, drive) -> None:
    """Four sessions ticking together (every feature; the longitudinal profile twice; another
    profile), observations at 20 Hz on 200 Hz ticks, with faults: each session's gate verdicts are the
    ones it gets ticking alone (the bank's several-row path and its one-row path, the profiles' banks
    side by side, their filters kept per session)."""
    t, x = drive
    lateral = np.array([n in LONGITUDINAL or n in ("lane_offset", "heading_error", "yaw_rate") for n in FEATURE_NAMES])
    profiles = {"all": None, "long1": _longitudinal(), "long2": _longitudinal(), "lateral": lateral}
    rng = np.random.default_rng(21)
    feeds = {}
    for k, (sid, present) in enumerate(profiles.items()):
        ns, rows = _observe(rng, t[k * 40 :], x[k * 40 :], 20.0, present)
        feeds[sid] = (ns - ns[0], _faults(rng, rows, present))
    ticks = 1000

    def run(sids: list[str]) -> dict[str, list[tuple[bool, float, float]]]:
        ex = Executor(model, ExecutorConfig(min_margin=0.0, max_sessions=4), gates)
        for sid in sids:
            ex.open_session(sid).present = profiles[sid]
        out: dict[str, list[tuple[bool, float, float]]] = {sid: [] for sid in sids}
        seq = dict.fromkeys(sids, 0)
        for k in range(ticks):
            now = k * 5_000_000
            obs = {}
            for sid in sids:
                ns, rows = feeds[sid]
                if seq[sid] < len(ns) and ns[seq[sid]] <= now:  # the newest observation by now, once
                    i = int(np.searchsorted(ns, now, side="right")) - 1
                    obs[sid] = Observation(seq=i + 1, timestamp_ns=int(ns[i]), features=rows[i])
                    seq[sid] = i + 1
            for snap in ex.step(obs, now):
                out[snap.session_id].append((snap.gate_veto, snap.gate_score, snap.gate_threshold))
        return out

    together = run(list(profiles))
    for sid in profiles:
        alone = run([sid])[sid]
        assert [v for v, _, _ in together[sid]] == [v for v, _, _ in alone], sid
        assert [th for _, _, th in together[sid]] == [th for _, _, th in alone], sid
        np.testing.assert_allclose([s for _, s, _ in together[sid]], [s for _, s, _ in alone], rtol=1e-9)
        assert any(v for v, _, _ in alone), sid


@pytest.mark.parametrize("which", ["none", "decision_vector"])
def test_a_masked_session_without_a_raw_input_gate(model, gates, drive, which) -> None:
    """No gate, or only the decision vector's: nothing to complete, live and replay agree, and a
    missing feature's NaN vetoes nothing."""
    chosen = [] if which == "none" else [g for g in gates if g.schema.source == "decision_vector"]
    present = _longitudinal()
    ns, rows = _observe(np.random.default_rng(2), *drive, 10.0, present)
    observations = [Observation(seq=i + 1, timestamp_ns=int(s), features=r) for i, (s, r) in enumerate(zip(ns, rows))]
    live_ex, replay_ex = (Executor(model, ExecutorConfig(min_margin=0.0), chosen) for _ in range(2))
    for ex in (live_ex, replay_ex):
        ex.open_session("a", clock=Clock.LOCKSTEP).present = present
        assert ex.gating.profile(present) is None
    live = [s.gate_veto for obs in observations[:40] for s in live_ex.advance_lockstep("a", obs)]
    np.testing.assert_array_equal(live, run_lockstep(replay_ex, "a", observations[:40]).gate_veto)


def test_a_queue_behind_the_lead_passes_and_a_dead_sensor_does_not(model, gates):
    """Stopped 0.8 m behind the lead (real queues read present-feature norms of 1.0-2.3, below every
    simulated row's) is no norm alarm for a longitudinal session; an all-zero dead sensor still is."""
    verdicts = {}
    for name, five in (("queue", [0.4, -0.1, 1.0, 0.8, -0.3]), ("dead", [0.0] * 5)):
        ex = Executor(model, ExecutorConfig(), gates)
        ex.open_session(name, Clock.LOCKSTEP, provided_features=list(LONGITUDINAL))
        x = np.full(len(FEATURE_NAMES), np.nan, np.float32)
        x[[FEATURE_INDEX[n] for n in LONGITUDINAL]] = five
        (snap,) = ex.advance_lockstep(name, Observation(seq=1, timestamp_ns=0, features=x))
        verdicts[name] = snap.gate_veto
    assert verdicts == {"queue": False, "dead": True}
