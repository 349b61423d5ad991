"""History features (executor.history): the live ring buffer and the vectorised derivation give the
same bits, a LOCKSTEP session decides the same live and in a replay with a model that takes them, the
first ticks and gaps use the documented fallbacks, and a missing source masks what reads it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dualloop.controller.contract.wire import snapshot_to_proto
from dualloop.controller.training.driving_card import build_test_model
from dualloop.executor import history
from dualloop.executor.config import ExecutorConfig
from dualloop.executor.core import Executor
from dualloop.executor.history import BIN_NS, DEFAULT_HISTORY, GAP_NS, TOL_NS, HistoryDeriver, HistoryRing, K
from dualloop.executor.lockstep_batch import run_lockstep
from dualloop.executor.model_card import ModelFileError
from dualloop.executor.model_runner import DecisionModel
from dualloop.executor.snapshot import Clock, Observation, Snapshot, StageTimings
from dualloop.sim.env import run_expert_batch
from dualloop.sim.schema import FEATURE_INDEX, FEATURE_NAMES

LONGITUDINAL = ("ego_speed", "ego_accel", "lead_present", "lead_distance", "lead_rel_speed")


@pytest.fixture(scope="module")
def history_model(tmp_path_factory: pytest.TempPathFactory) -> DecisionModel:
    path = tmp_path_factory.mktemp("history") / "history.onnx"
    build_test_model(path, history=DEFAULT_HISTORY)
    return DecisionModel(path)


@pytest.fixture(scope="module")
def drive() -> tuple[np.ndarray, np.ndarray]:
    """An expert's drive behind a braking lead at every 5 ms: (t s, features)."""
    _, data = run_expert_batch("lead_brakes_hard", [950_101], duration_s=8.0)
    return data.t, data.features[0]


def _observe(rng: np.random.Generator, t: np.ndarray, x: np.ndarray, hz: float, lost: float) -> tuple:
    """Readings at about `hz` on a jittery clock (+-30%), a share `lost` of them never sent, and two
    gaps longer than GAP_NS (the history falls back after them); speed noise as a real sensor's."""
    period = 1.0 / hz
    stamps, now = [], t[0] + 0.01
    while now < t[-1]:
        stamps.append(now)
        now += period * (1.0 + rng.uniform(-0.3, 0.3))
        if len(stamps) in (25, 60):
            now += 0.6
    stamps_a = np.array(stamps)
    stamps_a = stamps_a[rng.random(len(stamps_a)) >= lost]
    rows = x[np.searchsorted(t, stamps_a, side="right") - 1].copy()
    rows[:, FEATURE_INDEX["ego_speed"]] += rng.normal(0, 0.05, len(rows)).astype(np.float32)
    return np.round(stamps_a * 1e9).astype(np.int64), rows


def _observations(ns: np.ndarray, rows: np.ndarray) -> list[Observation]:
    return [Observation(seq=i + 1, timestamp_ns=int(s), features=r) for i, (s, r) in enumerate(zip(ns, rows))]


def _wire(s: Snapshot) -> bytes:
    """The snapshot as the wire carries it, without what is wall-clock by nature."""
    s.emit_time_ns, s.timings = 0, StageTimings()
    return snapshot_to_proto(s).SerializeToString()


def test_ring_buffer_and_batch_give_the_same_bits(drive) -> None:
    """Observation by observation through the ring buffer (which forgets what is older than its
    horizon) and in one vectorised pass: bit-identical float32, at 10, 20, 100 and 250 Hz with gaps."""
    deriver = HistoryDeriver(DEFAULT_HISTORY, FEATURE_NAMES)
    rng = np.random.default_rng(3)
    for hz in (10.0, 20.0, 100.0, 250.0):
        ns, rows = _observe(rng, *drive, hz, lost=0.1)
        state = deriver.state()
        live = np.stack([state.push(int(s), r) for s, r in zip(ns, rows)])
        batch = deriver.batch(ns, rows)
        assert live.shape == (len(ns), len(DEFAULT_HISTORY))
        assert live.tobytes() == batch.tobytes(), hz
        assert len(state) < 1.5 * hz  # the buffer holds its horizon, not the drive
        assert np.abs(batch).max() > 0.5  # the features are not all fallbacks


_NEEDS_C = pytest.mark.skipif(
    not history.compiled_available(), reason="executor._history did not build (no C compiler)"
)
PATHS = [False, pytest.param(True, marks=_NEEDS_C)]  # the ring's numpy pass, its C pass


@pytest.mark.parametrize("compiled", PATHS)
@pytest.mark.parametrize("seed", [0, 1])
def test_the_ring_gives_each_push_its_bits(seed: int, compiled: bool) -> None:
    """HistoryRing.newest over many sessions at once equals each session's own push, bit for bit, in
    C and in numpy: sessions at 10 Hz to 1 kHz (past the ring's size: the state's own path), jittery
    and equal timestamps, gaps, NaN readings, -0.0 everywhere, lead switches, ticks that find only
    some sessions with a new observation, and the ring's slots in any order."""
    deriver = HistoryDeriver(DEFAULT_HISTORY, FEATURE_NAMES)
    rng = np.random.default_rng(seed)
    periods = [100, 50, 20, 10, 5, 5, 3, 2, 1]  # ms
    ring = HistoryRing(deriver, len(periods) + 3, size=512, compiled=compiled)
    slots = rng.permutation(len(periods) + 3)[: len(periods)]
    ref = [deriver.state() for _ in periods]
    got = [ring.state(int(slot)) for slot in slots]
    t = [0] * len(periods)
    lead = FEATURE_INDEX["lead_present"]
    compared, longest = 0, 0
    for _ in range(3000):
        due = []
        for s, period in enumerate(periods):
            if rng.random() < 0.5:
                jump = rng.random() < 0.01 and period > 1  # the 1 kHz session keeps its horizon full
                t[s] += int(rng.integers(0, 2 * 10**9)) if jump else int(period * 1e6 * rng.uniform(0.0, 2.0))
                x = rng.normal(size=len(FEATURE_NAMES)).astype(np.float32)
                x[lead] = float(rng.random() < 0.7)
                x[rng.random(len(FEATURE_NAMES)) < 0.02] = np.nan
                if rng.random() < 0.05:
                    x[:] = -0.0
                got[s].append(t[s], x)
                due.append((s, x, ref[s].push(t[s], x)))
        if due:
            out = ring.newest([got[s] for s, _, _ in due], np.stack([x for _, x, _ in due]))
            for row, (s, _, want) in zip(out, due):
                assert row.tobytes() == want.tobytes(), (s, t[s])
                compared += 1
        longest = max(longest, len(ref[-1]))
    assert compared > 10_000
    assert longest > 512  # the 1 kHz session outgrew the ring: its rows took the state's path


@pytest.mark.parametrize("compiled", PATHS)
def test_the_ring_bisects_observations_exactly_on_a_bin_bound(compiled: bool) -> None:
    """On an exact 1 ms grid observations fall exactly on the bins' bounds (t_i - e + 1 ms): the
    ring's one search over all rows (numpy) and its bisection per row (C) take them as the state's
    bisect_right does."""
    deriver = HistoryDeriver(DEFAULT_HISTORY, FEATURE_NAMES)
    periods_ms = [1, 2, 10, 100]
    ring = HistoryRing(deriver, len(periods_ms), size=2048, compiled=compiled)
    ref = [deriver.state() for _ in periods_ms]
    got = [ring.state(s) for s in range(len(periods_ms))]
    rng = np.random.default_rng(7)
    compared = 0
    for k in range(1, 2500):
        due = []
        for s, period in enumerate(periods_ms):
            if k % period == 0:
                x = rng.normal(size=len(FEATURE_NAMES)).astype(np.float32)
                x[FEATURE_INDEX["lead_present"]] = 1.0
                got[s].append(k * 1_000_000, x)
                due.append((s, x, ref[s].push(k * 1_000_000, x)))
        if len(due) >= 3:
            out = ring.newest([got[s] for s, _, _ in due], np.stack([x for _, x, _ in due]))
            for row, (s, _, want) in zip(out, due):
                assert row.tobytes() == want.tobytes(), (s, k)
                compared += 1
    assert compared > 700  # every 10 ms: three or four rows


def test_the_c_pass_is_built_where_a_compiler_exists_and_the_environment_can_refuse_it(c_compiler: str | None) -> None:
    deriver = HistoryDeriver(DEFAULT_HISTORY, FEATURE_NAMES)
    if c_compiler is not None and os.environ.get("DUALLOOP_HISTORY_PURE_PYTHON", "") in ("", "0"):
        assert HistoryRing(deriver, 4).compiled
    code = "from dualloop.executor.history import compiled_wanted; print(compiled_wanted())"
    env = {**os.environ, "DUALLOOP_HISTORY_PURE_PYTHON": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@_NEEDS_C
def test_the_c_pass_refuses_what_is_not_its_ring() -> None:
    deriver = HistoryDeriver(DEFAULT_HISTORY, FEATURE_NAMES)
    ring = HistoryRing(deriver, 4, size=64, compiled=True)
    state = ring.state(1)
    for k in range(3):
        state.append(k * 5_000_000, np.zeros(len(FEATURE_NAMES), np.float32))
    one = np.ones(1, np.int64)
    assert np.isfinite(ring._sums_compiled(one, one * 2, one * 0)[0]).all()
    with pytest.raises(ValueError, match="slot 7, observations 0..2: not in the ring"):
        ring._sums_compiled(one * 7, one * 2, one * 0)
    with pytest.raises(ValueError, match="observations 0..64: not in the ring"):  # more than its places
        ring._sums_compiled(one, one * 64, one * 0)
    with pytest.raises(TypeError, match="newest: expected a C-contiguous int64 array"):
        ring._sums_compiled(one, np.ones(1, np.int32), one * 0)


def test_equal_timestamps_and_nan_give_the_same_bits(drive) -> None:
    """REALTIME allows equal timestamps (a sensor that re-sends): a row never reads a later one with
    the same time; a NaN reading spoils only the bins that hold it (they fall back)."""
    deriver = HistoryDeriver(DEFAULT_HISTORY, FEATURE_NAMES)
    ns, rows = _observe(np.random.default_rng(4), *drive, 50.0, lost=0.0)
    ns[10::7] = ns[9::7][: len(ns[10::7])]  # every 7th observation shares its predecessor's time
    rows[40, FEATURE_INDEX["lead_rel_speed"]] = np.nan
    state = deriver.state()
    live = np.stack([state.push(int(s), r) for s, r in zip(ns, rows)])
    assert live.tobytes() == deriver.batch(ns, rows).tobytes()
    assert np.isfinite(live).all()


def test_first_ticks_and_gaps_use_the_fallbacks() -> None:
    """Until D seconds of stream exist (and right after a gap longer than D + GAP), a speed slope is
    the current ego_accel and the other features are 0; with the history there, a constant speed
    ramp gives its slope."""
    deriver = HistoryDeriver(DEFAULT_HISTORY, FEATURE_NAMES)
    n = 30
    ns = np.arange(n, dtype=np.int64) * 100_000_000  # 10 Hz
    ns[20:] += 2 * GAP_NS + 1_000_000_000  # a gap of 1.6 s before observation 20
    x = np.zeros((n, len(FEATURE_NAMES)), np.float32)
    x[:, FEATURE_INDEX["ego_speed"]] = 10.0 + 2.0 * ns / 1e9  # +2 m/s^2
    x[:, FEATURE_INDEX["ego_accel"]] = 0.7
    x[:, FEATURE_INDEX["lead_present"]] = 1.0
    x[:, FEATURE_INDEX["lead_rel_speed"]] = -1.0 * ns / 1e9  # the lead at constant speed 10 m/s + ...
    h = deriver.batch(ns, x)
    col = {name: i for i, name in enumerate(DEFAULT_HISTORY)}
    # the first observation: nothing changed
    assert h[0, col["speed_slope_0.1s"]] == np.float32(0.7)
    assert (h[0, [col[c] for c in DEFAULT_HISTORY if not c.startswith("speed_slope")]] == 0).all()
    # 0.3 s in: every speed slope sees the ramp; the 0.5 s windows still fall back
    assert h[3, col["speed_slope_0.3s"]] == pytest.approx(2.0, abs=1e-4)
    assert h[3, col["accel_change_0.5s"]] == 0.0 and h[3, col["lead_accel_0.5s"]] == 0.0
    # 1 s in: the lead's own acceleration (ego_speed + lead_rel_speed) is +1 m/s^2
    assert h[10, col["lead_accel_1.0s"]] == pytest.approx(1.0, abs=1e-4)
    # after the gap, the first observation is a first observation again
    assert h[20, col["speed_slope_0.1s"]] == np.float32(0.7)
    assert h[20, col["lead_accel_1.0s"]] == 0.0
    assert h[22, col["speed_slope_0.2s"]] == pytest.approx(2.0, abs=1e-4)


def test_a_missing_source_masks_what_reads_it() -> None:
    deriver = HistoryDeriver(DEFAULT_HISTORY, FEATURE_NAMES)
    present = np.ones(len(FEATURE_NAMES), bool)
    assert deriver.present(present).all() and deriver.present(None) is None
    present[FEATURE_INDEX["lead_rel_speed"]] = False
    got = dict(zip(DEFAULT_HISTORY, deriver.present(present)))
    assert not got["lead_rel_speed_slope_0.2s"] and not got["lead_accel_1.0s"]
    assert got["speed_slope_0.1s"] and got["lead_distance_slope_0.5s"] and got["accel_change_0.2s"]
    present[FEATURE_INDEX["ego_accel"]] = False  # the speed slopes' fallback: not needed, it stands in as 0
    got = dict(zip(DEFAULT_HISTORY, deriver.present(present)))
    assert got["speed_slope_0.1s"] and not got["accel_change_0.5s"]


def test_without_ego_accel_the_speed_slopes_stay_and_fall_back_to_zero() -> None:
    """A stack without an accelerometer (ego_accel NaN, not in its profile) still gets the speed's slopes
    where there is history, and 0 where there is none (the session's first observation), in the batch
    and the live derivation alike."""
    deriver = HistoryDeriver(DEFAULT_HISTORY, FEATURE_NAMES)
    n = 12
    t_ns = np.arange(n, dtype=np.int64) * 100_000_000  # 10 Hz
    x = np.zeros((n, len(FEATURE_NAMES)), np.float32)
    x[:, FEATURE_INDEX["ego_speed"]] = 20.0 + 0.5 * np.arange(n)  # 5 m/s^2
    x[:, FEATURE_INDEX["ego_accel"]] = np.nan
    h = deriver.batch(t_ns, x)
    col = DEFAULT_HISTORY.index("speed_slope_0.2s")
    assert h[0, col] == 0.0 and h[5, col] == pytest.approx(5.0, abs=1e-4)
    live = deriver.state()
    for i in range(n):
        np.testing.assert_array_equal(live.push(int(t_ns[i]), x[i]), h[i])


@pytest.mark.parametrize("hz", [10.0, 20.0, 100.0])
@pytest.mark.parametrize("profile", ["all", "longitudinal"])
def test_live_lockstep_and_replay_give_the_same_snapshots(history_model, drive, hz, profile) -> None:
    """advance_lockstep observation by observation and run_lockstep in one pass, with a model that
    takes history features: the same snapshots on the wire, byte for byte (wall-clock fields
    excepted), on jittery clocks with lost observations, gaps and a NaN, with either sensor profile,
    and alike when both continue live after the replay."""
    rng = np.random.default_rng(int(hz) + len(profile))
    ns, rows = _observe(rng, *drive, hz, lost=0.15)
    rows[len(rows) // 2, FEATURE_INDEX["ego_speed"]] = np.nan
    present = None if profile == "all" else np.isin(FEATURE_NAMES, LONGITUDINAL)
    if present is not None:
        rows[:, ~present] = np.nan
    observations = _observations(ns, rows)
    config = ExecutorConfig(min_margin=0.0)
    live_ex, replay_ex = Executor(history_model, config), Executor(history_model, config)
    for ex in (live_ex, replay_ex):
        ex.open_session("a", clock=Clock.LOCKSTEP, provided_features=None if present is None else LONGITUDINAL)
    live = [snap for obs in observations for snap in live_ex.advance_lockstep("a", obs)]
    table = run_lockstep(replay_ex, "a", observations)
    replayed = table.snapshots()
    assert len(live) == len(replayed) > 100
    assert [_wire(s) for s in live] == [_wire(s) for s in replayed]
    # both sessions continue alike after the replay (the ring buffer was left as live pushes leave it)
    more = _observations(ns[-1] + np.arange(1, 8) * int(1e9 / hz), np.repeat(rows[-1:], 7, axis=0))
    for i, o in enumerate(more):
        o.seq = len(observations) + i + 1
    tail_live = [s for o in more for s in live_ex.advance_lockstep("a", o)]
    tail_replay = [s for o in more for s in replay_ex.advance_lockstep("a", o)]
    assert [_wire(s) for s in tail_live] == [_wire(s) for s in tail_replay]
    # the model was fed real history, not fallbacks
    deriver = history_model.history
    assert deriver is not None
    assert np.abs(deriver.batch(ns, rows)).max() > 0.1


def test_realtime_pushes_every_observation_also_conflated_ones(history_model, drive) -> None:
    """REALTIME: two observations between ticks, the older conflated away, still enter the stream;
    the tick's history is the batch derivation's for the observation it uses."""
    ns, rows = _observe(np.random.default_rng(8), *drive, 100.0, lost=0.0)
    ex = Executor(history_model, ExecutorConfig(min_margin=0.0))
    ex.open_session("a")
    deriver = history_model.history
    assert deriver is not None
    expected = deriver.batch(ns, rows)
    seen = []
    for i, obs in enumerate(_observations(ns, rows)):
        obs.arrival_ns = int(ns[i])
        ex.submit("a", obs)
        if i % 2:  # a tick every second observation
            ex.tick(int(ns[i]))
            seen.append(ex.sessions["a"].current.history)  # type: ignore[union-attr]
    assert np.stack(seen).tobytes() == expected[1::2].tobytes()
    assert ex.sessions["a"].observations_dropped == len(ns) // 2


def test_a_card_whose_history_reads_an_unknown_feature_is_refused(tmp_path: Path) -> None:
    from dualloop.controller.training.driving_card import driving_card
    from dualloop.executor.model_card import FeatureSpec
    from dualloop.executor.onnx_export import export_mlp, random_mlp
    from dualloop.sim import schema

    card = driving_card("bad", "test", 8)
    card = card.model_copy(update={"history_features": [FeatureSpec(name="jerk_of_the_moon", unit="m/s^3")]})
    weights = random_mlp(card.input_width + schema.N_PLAN, (8,), schema.N_ACTIONS, len(schema.CONTROLS), 1)
    export_mlp(weights, card, tmp_path / "bad.onnx")
    with pytest.raises(ModelFileError, match="unknown history features"):
        DecisionModel(tmp_path / "bad.onnx")


def test_models_without_history_keep_their_cards(test_model) -> None:
    """A card without history features writes no such field (earlier models' version hashes stand)."""
    assert "history_features" not in test_model.card.to_json()
    assert test_model.history is None and test_model.n_inputs == test_model.n_features


def test_the_shipped_model_takes_the_history_features(base_model) -> None:
    assert base_model.card.history_names == list(DEFAULT_HISTORY) and base_model.card.mask_input
    assert base_model.n_inputs == base_model.n_features + len(DEFAULT_HISTORY)
    assert base_model.history is not None


def _bin_one_by_one(t: np.ndarray, series: np.ndarray, rows: np.ndarray, e: int) -> tuple:
    """The definition's bin, each row's summed on its own (K masked adds, newest first from +0.0):
    the reference `history._bins` is compared with."""
    ti = t[rows]
    jl = np.minimum(np.searchsorted(t, ti - e + TOL_NS, side="right") - 1, rows)
    lo = np.searchsorted(t, ti - e - BIN_NS + TOL_NS, side="right")
    n = np.minimum(jl - lo + 1, K)
    acc = np.zeros((len(rows), series.shape[1]), np.float64)
    for k in range(int(n.max(initial=0))):
        acc += np.where((k < n)[:, None], series[np.maximum(jl - k, 0)], 0.0)
    safe = np.maximum(jl, 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        value = np.where((n >= 1)[:, None], acc / np.maximum(n, 1)[:, None], series[safe])
    span = ti - t[safe]
    return value, (jl >= 0) & (span > 0) & (span <= e + GAP_NS), jl


@pytest.mark.parametrize("seed", range(6))
def test_shared_running_sums_give_each_bin_its_own_bits(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """`_bins` reads every bin's sum from the running sums of the observation it ends at; the same
    bits as summing each bin on its own, on jittery, repeated and dense (> K a bin) timestamps, NaN,
    -0.0 and huge values, all rows or some, across chunk bounds, one row, none."""
    rng = np.random.default_rng(seed)
    hz = [10.0, 100.0, 400.0, 1000.0, 200.0, 50.0][seed]
    n = int(rng.integers(1, 900))
    steps = np.round(rng.uniform(0.5, 1.5, n) * 1e9 / hz).astype(np.int64)
    steps[rng.random(n) < 0.05] = 0  # repeated timestamps
    steps[rng.random(n) < 0.01] = 700_000_000  # gaps
    t = np.cumsum(steps)
    series = rng.normal(0, 10, (n, 3))
    series[rng.random((n, 3)) < 0.02] = np.nan
    series[rng.random((n, 3)) < 0.02] = -0.0
    series[rng.random((n, 3)) < 0.01] = 1e300
    delays = (0, *sorted({s.delay_ns for s in history.SPECS.values()}))
    monkeypatch.setattr(history, "_SUM_CHUNK", int(rng.integers(1, 300)))
    some = np.flatnonzero(rng.random(n) < 0.3)
    for rows in (np.arange(n), some, np.array([n - 1]), np.array([0]), np.zeros(0, np.int64)):
        for e, (value, ok, jl) in zip(delays, history._bins(t, series, rows, delays)):
            ref = _bin_one_by_one(t, series, rows, e)
            assert value.tobytes() == ref[0].tobytes(), (e, len(rows))
            assert ok.tobytes() == ref[1].tobytes() and jl.tobytes() == ref[2].tobytes()
