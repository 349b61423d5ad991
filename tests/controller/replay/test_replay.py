from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dualloop.controller.cli import main
from dualloop.controller.contract.wire import observation_from_proto, snapshot_to_proto, without_wall_clock
from dualloop.controller.logs.format import require_plan
from dualloop.controller.logs.logfile import LogFileError, read_log, write_log
from dualloop.controller.logs.synthetic import REAL_DRIVE as FIXTURE
from dualloop.controller.logs.synthetic import slice_log, synthetic_log
from dualloop.controller.replay.fleet import RAY_MISSING, replay_many
from dualloop.controller.replay.lockstep import (
    SessionOptions,
    _observations,
    build_executor,
    executor_config_for,
    replay_log,
    run_replay,
)
from dualloop.controller.replay.report import format_report
from dualloop.executor.lane_keeping import LaneKeepingConfig
from dualloop.executor.lockstep_batch import run_lockstep
from dualloop.executor.sessions import InvalidObservation
from dualloop.executor.snapshot import Check, Clock, PlanState, Reason, SafetyState
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES, TEST_MODEL_PATH
from dualloop.v2 import log_pb2


@pytest.fixture(scope="module")
def fixture_replay(tmp_path_factory):
    out = tmp_path_factory.mktemp("replay") / "a.mcap"
    return replay_log(FIXTURE, BASE_MODEL_PATH, DEFAULT_GATES, out_path=out)


def test_real_drive_agreement_over_every_observation(fixture_replay):
    r = fixture_replay.report
    assert r.observations == 5995 and r.fresh_ticks == 5995  # every observation drives one fresh tick
    assert r.ticks == 11989  # 59.94 s on the 5 ms grid
    groups = r.agreement["groups"]
    assert groups["all"]["ticks"] == r.ticks and r.agreement["ticks_without_actual"] == 0
    assert np.array(r.agreement["confusion"]).sum() == r.ticks
    assert 0.0 <= r.agreement_top1 <= 1.0 and 0.0 <= r.gate_veto_fraction <= 1.0
    assert "agreement with the actual action" in format_report(r)


def test_replay_log_header_and_round_trip(fixture_replay):
    data = read_log(fixture_replay.out_path)
    h = data.header
    assert h.model_version == fixture_replay.header.model_version != ""
    assert h.gate_version.count("+") == len(DEFAULT_GATES) - 1 and h.source_details["replay_of"] == str(FIXTURE)
    assert len(data.observations) == 5995 and len(data.snapshots) == 11989


def test_double_replay_is_byte_identical(fixture_replay, tmp_path):
    again = replay_log(FIXTURE, BASE_MODEL_PATH, DEFAULT_GATES, out_path=tmp_path / "b.mcap")
    a = read_log(fixture_replay.out_path).snapshots
    b = read_log(again.out_path).snapshots
    assert len(a) == len(b) and all(without_wall_clock(x) == without_wall_clock(y) for x, y in zip(a, b))


def _assert_same(fast, plain):
    assert len(fast) == len(plain)
    for f, p in zip(fast, plain):
        assert (
            f.tick,
            f.observation_seq,
            f.proposed_index,
            f.applied.index,
            f.reasons,
            f.safety_state,
            f.gate_veto,
            f.input_hash,
            f.plan_id,
            f.plan_state,
            f.plan_age_ns,
            f.plan_valid_for_ns,
            f.observation_held,
            f.observation_period_ns,
            f.invalid_input,
        ) == (
            p.tick,
            p.observation_seq,
            p.proposed_index,
            p.applied.index,
            p.reasons,
            p.safety_state,
            p.gate_veto,
            p.input_hash,
            p.plan_id,
            p.plan_state,
            p.plan_age_ns,
            p.plan_valid_for_ns,
            p.observation_held,
            p.observation_period_ns,
            p.invalid_input,
        )
        np.testing.assert_allclose(f.probabilities, p.probabilities, atol=1e-5)
        np.testing.assert_allclose(f.applied.controls, p.applied.controls, atol=1e-5)
        np.testing.assert_allclose(f.proposed_controls, p.proposed_controls, atol=1e-5)
        if p.gate_score is not None:
            assert f.gate_score == pytest.approx(p.gate_score, rel=1e-5, abs=1e-5)
        # every check's verdict, status and threshold exactly; its score as the model's and gates'
        # products allow between a batch of one and a whole replay (as gate_score above)
        assert f.check_kinds == p.check_kinds and p.checks is not None and f.checks is not None
        for name in ("veto", "status", "threshold"):
            assert f.checks[name].tobytes() == p.checks[name].tobytes(), (p.tick, name, f.checks, p.checks)
        np.testing.assert_allclose(f.checks["score"], p.checks["score"], rtol=1e-5, atol=1e-5)
        # the combined veto is exactly the checks' (all but the margin, whose verdict is LOW_MARGIN)
        gates = np.array(p.check_kinds) != Check.MARGIN
        assert p.gate_veto == bool(p.checks["veto"][gates].any()), (p.tick, p.checks)
        assert (Reason.LOW_MARGIN in p.reasons) == bool(p.checks["veto"][~gates].any())
        assert np.isfinite(p.checks["score"]).all() and np.isfinite(p.checks["threshold"]).all()


@pytest.mark.parametrize("model,gates", [(BASE_MODEL_PATH, DEFAULT_GATES), (TEST_MODEL_PATH, ())])
def test_fast_replay_equals_plain_lockstep(tmp_path, model, gates):
    log = synthetic_log(tmp_path / "syn.mcap", seconds=4.0, rate_hz=150.0)  # off-grid: reused and dropped obs
    data = read_log(log)
    obs = _observations(data)
    runs = []
    for fast in (True, False):
        ex = build_executor(model, gates, executor_config_for(data.header))
        runs.append(run_replay(ex, "s", obs, fast=fast)[0])
    _assert_same(*runs)
    assert len({s.plan_id for s in runs[0]}) > 5


@pytest.mark.parametrize("rate_hz", [200.0, 150.0])
def test_fast_replay_equals_plain_through_every_fault(tmp_path, rate_hz):
    log = synthetic_log(tmp_path / "faults.mcap", seconds=5.0, rate_hz=rate_hz, faults=True)
    obs = _observations(read_log(log))
    runs = []
    for fast in (True, False):
        ex = build_executor(BASE_MODEL_PATH, DEFAULT_GATES, executor_config_for(read_log(log).header))
        runs.append(
            run_replay(ex, "s", obs, SessionOptions(require_plan=require_plan(read_log(log).header)), fast=fast)[0]
        )
    _assert_same(*runs)
    seen = {r.name for s in runs[1] for r in s.reasons} | {s.safety_state.name for s in runs[1]}
    assert seen >= {
        "OOD_VETO",
        "INVALID_INPUT",
        "STALE_OBSERVATION",
        "STALE_PLAN",
        "FALLBACK",
        "VETO_HOLD",
        "FALLBACK_ACTIVE",
        "RECOVERING",
        "NOMINAL",
    }, seen
    assert [s.observations_dropped for s in runs[0]] == [s.observations_dropped for s in runs[1]]
    assert [s.plan_age_ns for s in runs[0]] == [s.plan_age_ns for s in runs[1]]


def test_fast_replay_equals_plain_through_a_blind_fallback_on_a_curve(tmp_path):
    """Inputs frozen for 1.2 s after 3 s of clean driving on the fixture's curving road: the fallback
    steers blind by the lane dead-reckoned from the last second of trusted readings. The replay's
    scan must keep the same readings as the live tick does, so the blind steering is equal bit for bit."""
    log = synthetic_log(tmp_path / "curve.mcap", seconds=6.0, rate_hz=200.0)
    data = read_log(log)
    obs = _observations(data)
    frozen = obs[600].features.copy()
    for o in obs[600:840]:
        o.features = frozen.copy()
    runs = []
    for fast in (True, False):
        ex = build_executor(BASE_MODEL_PATH, DEFAULT_GATES, executor_config_for(data.header))
        runs.append(run_replay(ex, "s", obs, fast=fast)[0])
    _assert_same(*runs)
    blind = [s for s in runs[1] if s.safety_state is SafetyState.FALLBACK_ACTIVE and 600 <= s.tick < 840]
    assert len(blind) > 100  # the hold's 300 ms, then the blind fallback until the inputs move again
    steer = [(s.applied.controls[1], f.applied.controls[1]) for s, f in zip(runs[1], runs[0]) if 600 <= s.tick < 840]
    assert all(a.tobytes() == b.tobytes() for a, b in steer)
    assert len({a.tobytes() for a, _ in steer}) > 50  # steering the estimated lane, not a held angle


@pytest.mark.parametrize("rate_hz,declared", [(10.0, True), (20.0, False)])
def test_fast_replay_equals_plain_at_sensor_rates_with_a_sensor_profile(tmp_path, rate_hz, declared):
    """A 10 or 20 Hz sensor measuring five features, with a few lost and late observations: held
    ticks are not stale, the late ones hold, and both replay paths agree tick by tick."""
    import dataclasses

    log = synthetic_log(tmp_path / "slow.mcap", seconds=6.0, rate_hz=rate_hz)
    data = read_log(log)
    names = list(data.header.feature_names)
    obs = []
    for i, o in enumerate(_observations(data)):
        if i in (20, 21, 22, 40):  # lost observations: the ticks after them run late
            continue
        x = o.features.copy()
        x[5:] = np.nan  # not measured: NaN by contract
        obs.append(dataclasses.replace(o, features=x))
    period = int(1e9 / rate_hz) if declared else 0
    # the test model steers 0.5 rad, which the recovery's steering would take 2.5 s to reach at the
    # keeper's rate: a fast wheel keeps the recoveries as short as the lateness they follow
    config = executor_config_for(data.header)
    fast_wheel = config.safety.model_copy(update={"lane_keeping": LaneKeepingConfig(max_steer_rate=1e3)})
    config = config.model_copy(update={"safety": fast_wheel})
    runs = []
    for fast in (True, False):
        ex = build_executor(TEST_MODEL_PATH, (), config)
        runs.append(
            run_replay(
                ex, "s", obs, SessionOptions(observation_period_ns=period, provided_features=names[:5]), fast=fast
            )[0]
        )
    _assert_same(*runs)
    snaps = runs[0]
    assert {s.observation_period_ns for s in snaps[int(0.5 * rate_hz) * 40 :]} == {int(1e9 / rate_hz)}
    assert all(Reason.INVALID_INPUT not in s.reasons for s in snaps)
    held = sum(s.observation_held for s in snaps) / len(snaps)
    assert held > 0.9  # 5 ms ticks on a 10-20 Hz sensor
    stale = [s for s in snaps if Reason.STALE_OBSERVATION in s.reasons]
    # after a late observation the model's command is blended back in at once, no 500 ms dwell
    late = [i for i, s in enumerate(snaps) if Reason.STALE_OBSERVATION in s.reasons]
    recovering = [i for i, s in enumerate(snaps) if s.safety_state is SafetyState.RECOVERING]
    assert stale and all(any(0 < i - j <= 50 for j in late) for i in recovering)
    assert sum(s.safety_state is SafetyState.NOMINAL for s in snaps) / len(snaps) > 0.85


@pytest.mark.slow
def test_fast_replay_equals_plain_on_the_real_drive(fixture_replay):
    data = read_log(FIXTURE)
    ex = build_executor(BASE_MODEL_PATH, DEFAULT_GATES, executor_config_for(data.header))
    plain, _ = run_replay(ex, data.session_id, _observations(data), fast=False)
    _assert_same(fixture_replay.snapshots, plain)
    assert [snapshot_to_proto(s).applied.index for s in plain[:50]] == [
        s.applied.index for s in fixture_replay.snapshots[:50]
    ]


def test_fast_replay_refuses_what_a_live_session_refuses():
    data = read_log(FIXTURE)
    obs = _observations(data)[:20]
    obs[7].timestamp_ns = obs[6].timestamp_ns  # time must strictly increase
    ex = build_executor(TEST_MODEL_PATH, (), executor_config_for(data.header))
    with pytest.raises(InvalidObservation, match=f"observation seq {obs[7].seq} has timestamp"):
        run_replay(ex, "s", obs, fast=True)
    assert "s" not in ex.sessions  # closed again


@pytest.mark.parametrize("previous_ns", [5_000_000, 7_000_000], ids=["previous-on-the-grid", "previous-off-the-grid"])
def test_fast_replay_refuses_the_lockstep_gap_a_live_session_refuses(previous_ns):
    """The gap limit at its boundary (docs/contract.md: a jump past lockstep_max_gap_s, in whole ticks,
    from the previous observation): accepted and refused alike by the live session and the vectorised
    replay, with the same message, whether the previous observation lies on the tick grid or not."""
    data = read_log(FIXTURE)
    config = executor_config_for(data.header).model_copy(update={"lockstep_max_gap_s": 0.5012})
    limit_ns = 500_000_000  # 0.5012 s in whole 5 ms ticks: SessionLimits.lockstep_max_gap_ns
    for gap, refused in ((limit_ns - 1, False), (limit_ns, False), (limit_ns + 1, True), (limit_ns + 5_000_000, True)):
        outcomes = []
        for fast in (False, True):
            obs = _observations(data)[:4]
            t0 = obs[0].timestamp_ns
            for k, ts in enumerate((t0, t0 + previous_ns, t0 + previous_ns + gap, t0 + previous_ns + gap + 5_000_000)):
                obs[k].timestamp_ns = ts
            ex = build_executor(TEST_MODEL_PATH, (), config)
            try:
                snaps, _ = run_replay(ex, "s", obs, fast=fast)
                outcomes.append([(s.tick, s.observation_seq, s.applied.index) for s in snaps])
            except InvalidObservation as err:
                outcomes.append(str(err))
        live, replayed = outcomes
        assert live == replayed, (gap, live, replayed)
        if refused:
            assert live == (
                f"observation seq {obs[2].seq} jumps {gap / 1e9:.9f} s past the previous one's timestamp; LOCKSTEP "
                f"refuses jumps over lockstep_max_gap_s=0.5012 s (SessionLimits.lockstep_max_gap_ns = {limit_ns})"
            )
        else:
            assert isinstance(live, list) and len(live) > 100


def test_replay_many_with_a_process_pool(tmp_path):
    logs = [slice_log(tmp_path / f"l{i}.mcap", i * 300, 200, f"s{i}") for i in range(3)]
    result = replay_many(logs, TEST_MODEL_PATH, workers=2, out_dir=tmp_path / "out", progress=False)
    assert not result.errors and len(result.reports) == 3
    assert result.ticks == sum(r["ticks"] for r in result.reports.values()) > 3 * 390
    assert result.confusion().sum() == result.ticks
    assert len(list((tmp_path / "out").glob("*.replayed.mcap"))) == 3


def _start_ray_cluster(ray: Any) -> None:
    """The test's own single-machine cluster, on loopback (dualloop only ever joins one). Ray gives
    its node a fixed 30 s to register; on a loaded CI machine that once ran out, so a start that
    times out is tried again, at most three times in all."""
    for attempt in range(3):
        try:
            ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=2, log_to_driver=False)
            return
        except Exception as err:  # noqa: BLE001 - Ray raises a bare Exception for this
            ray.shutdown()
            if "timed out during startup" not in str(err) or attempt == 2:
                raise


@pytest.mark.slow
def test_replay_many_on_a_ray_cluster(tmp_path):
    ray = pytest.importorskip("ray")
    logs = [slice_log(tmp_path / f"l{i}.mcap", i * 300, 200, f"s{i}") for i in range(3)]
    _start_ray_cluster(ray)
    try:
        result = replay_many(logs, TEST_MODEL_PATH, use_ray=True, out_dir=tmp_path / "out", progress=False)
    finally:
        ray.shutdown()
    assert not result.errors and len(result.reports) == 3
    pooled = replay_many(logs, TEST_MODEL_PATH, workers=2, progress=False)
    assert {p: r["applied"] for p, r in result.reports.items()} == {p: r["applied"] for p, r in pooled.reports.items()}
    assert len(list((tmp_path / "out").glob("*.replayed.mcap"))) == 3


def test_ray_without_a_cluster_says_how_to_start_one(tmp_path, monkeypatch):
    pytest.importorskip("ray")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # and no cluster on this machine: the last test shut its own down
    with pytest.raises(RuntimeError, match="ray start --head"):
        replay_many([slice_log(tmp_path / "l.mcap", 0, 50, "s")], TEST_MODEL_PATH, use_ray=True, progress=False)


def test_ray_missing_names_the_extra(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray":
            raise ImportError("no ray")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(RuntimeError, match=r"pip install 'dualloop\[ray\]'") as err:
        replay_many([FIXTURE], TEST_MODEL_PATH, use_ray=True)
    assert str(err.value) == RAY_MISSING


@pytest.mark.parametrize("rate_hz", [200.0, 150.0, 100.0])
def test_fast_replay_equals_plain_with_the_actuation_check(tmp_path, rate_hz):
    """Every fault of the synthetic log, and commands the car falls short of (0.3-0.9 s: 1 m/s^2 more
    braking than it achieves), none for a while (3.4-3.6 s), at sensor rates on and off the tick grid."""
    log = synthetic_log(tmp_path / "faults.mcap", seconds=5.0, rate_hz=rate_hz, faults=True)
    data = read_log(log)
    obs = _observations(data)
    for o in obs:
        t = (o.timestamp_ns - obs[0].timestamp_ns) / 1e9
        accel = float(o.features[1]) if np.isfinite(o.features[1]) else 0.0
        o.actual_controls = (
            None if 3.4 <= t < 3.6 else np.array([accel - (1.0 if 0.3 <= t < 0.9 else 0.0), 0.0], np.float32)
        )
    runs = []
    for fast in (True, False):
        ex = build_executor(BASE_MODEL_PATH, DEFAULT_GATES, executor_config_for(data.header))
        runs.append(run_replay(ex, "s", obs, SessionOptions(actual_is_command=True), fast=fast)[0])
    _assert_same(*runs)
    threshold = ex.gating.actuation.threshold
    assert [s.gate_threshold for s in runs[0]] == [s.gate_threshold for s in runs[1]]
    by_check = [s for s in runs[1] if s.gate_threshold == threshold]
    assert by_check and [s.gate_score for s in by_check] == [
        s.gate_score for s in runs[0] if s.gate_threshold == threshold
    ]
    assert any(s.gate_veto for s in by_check) and all(0.3 <= s.scheduled_time_ns / 1e9 - 1.0 for s in by_check)


def test_real_drive_labels_are_not_judged_as_commands(fixture_replay):
    """The comma2k19 import's actual action is a label made from the speed itself: no actuation verdict."""
    assert fixture_replay.report.actuation_check.startswith("skipped")
    assert "actuation check: skipped" in format_report(fixture_replay.report)


def test_logs_without_plan_validity_replay_with_the_defaults(fixture_replay, tmp_path):
    """Logs recorded before PlanUpdate had valid_for_ns/created_ns: a plan is made at its observation's
    timestamp and valid for the default, exactly as if the log said so; a plan-less log has no plan."""
    assert {s.plan_state for s in fixture_replay.snapshots} == {PlanState.NONE}
    assert not any(Reason.STALE_PLAN in s.reasons for s in fixture_replay.snapshots)
    log = synthetic_log(tmp_path / "old.mcap", seconds=2.0, rate_hz=150.0)
    data = read_log(log)
    assert all(o.plan.valid_for_ns == 0 and o.plan.created_ns == 0 for o in data.observations)
    explicit = []
    for o in data.observations:
        copy = type(o)()
        copy.CopyFrom(o)
        if copy.HasField("plan"):
            copy.plan.created_ns = copy.timestamp_ns
            copy.plan.valid_for_ns = int(executor_config_for(data.header).max_plan_age_ms * 1e6)
        explicit.append(copy)
    runs = []
    for observations in (data.observations, explicit):
        ex = build_executor(TEST_MODEL_PATH, (), executor_config_for(data.header))
        obs = [observation_from_proto(m, 0) for m in observations]
        runs.append([without_wall_clock(snapshot_to_proto(s)) for s in run_replay(ex, "s", obs)[0]])
    assert runs[0] == runs[1]
    ex = build_executor(TEST_MODEL_PATH, (), executor_config_for(data.header))
    snaps = run_replay(ex, "s", _observations(data))[0]
    assert {s.plan_state for s in snaps} == {PlanState.VALID}  # a plan every 200 ms, from the first observation
    assert {s.plan_valid_for_ns for s in snaps} == {600_000_000}


@pytest.mark.parametrize("rate_hz", [200.0, 150.0])
def test_fast_replay_equals_plain_with_invalid_plans_and_actual_controls(tmp_path, rate_hz):
    """Content errors (docs/contract.md#invalid-input): a non-finite plan is not adopted and its ticks
    say INVALID_INPUT; a non-finite actual control means "not known" (no reason), in both paths alike."""
    log = synthetic_log(tmp_path / "syn.mcap", seconds=3.0, rate_hz=rate_hz)
    data = read_log(log)
    obs = _observations(data)
    with_plans = [k for k, o in enumerate(obs) if o.plan_values is not None]
    for k in with_plans[1:6:2]:
        obs[k].plan_values = obs[k].plan_values.copy()
        obs[k].plan_values[k % len(obs[k].plan_values)] = np.nan
    for k in [k for k in (3, 4, 200, 201, 202) if k not in with_plans[1:6:2]][:3]:  # not on a bad plan
        obs[k].actual_controls = np.array([np.inf, 0.0], np.float32)
    runs = []
    for fast in (True, False):
        ex = build_executor(TEST_MODEL_PATH, (), executor_config_for(data.header))
        runs.append(run_replay(ex, "s", obs, SessionOptions(actual_is_command=True), fast=fast)[0])
    _assert_same(*runs)
    invalid = [s for s in runs[0] if s.invalid_input]
    assert {part for s in invalid for part in s.invalid_input} == {"plan"}
    assert all(Reason.INVALID_INPUT in s.reasons for s in invalid)
    bad_ids = {obs[k].plan_id for k in with_plans[1:6:2]}
    assert not bad_ids & {s.plan_id for s in runs[0]}  # never adopted
    unknown = [s for s in runs[0] if s.actual_controls is not None and not np.isfinite(s.actual_controls).all()]
    assert unknown and not any(s.invalid_input or Reason.INVALID_INPUT in s.reasons for s in unknown)


def test_fast_replay_equals_plain_when_the_model_overflows(tmp_path):
    """Observations finite but huge enough to overflow the model: MODEL_ERROR on their ticks only, no
    decision vector on those ticks, the same in both paths (with the shipped gates)."""
    log = synthetic_log(tmp_path / "syn.mcap", seconds=2.0, rate_hz=100.0)
    data = read_log(log)
    obs = _observations(data)
    for k in (40, 41, 120):
        obs[k].features = np.full_like(obs[k].features, 3e37)
    runs = []
    for fast in (True, False):
        ex = build_executor(BASE_MODEL_PATH, DEFAULT_GATES, executor_config_for(data.header))
        ex.open_session("s", Clock.LOCKSTEP, shadow=True, include_decision_vector=True)
        if fast:
            runs.append(run_lockstep(ex, "s", obs).snapshots())
        else:
            runs.append([snap for o in obs for snap in ex.advance_lockstep("s", o)])
    _assert_same(*runs)
    failed = [s for s in runs[0] if Reason.MODEL_ERROR in s.reasons]
    assert failed and {s.observation_seq for s in failed} <= {obs[k].seq for k in (40, 41, 120)}
    for run in runs:
        assert all((s.decision_vector is None) == (Reason.MODEL_ERROR in s.reasons) for s in run)


def test_a_log_cut_short_is_refused_unless_its_complete_part_is_asked_for(tmp_path) -> None:
    """A recorder killed mid-drive leaves a log without its footer: replaying it as if whole would
    report a cut drive's agreement as the drive's, so it is refused with the reason, and replayed
    (its complete records) only with allow_truncated / --allow-truncated."""
    whole = FIXTURE.read_bytes()
    cut = tmp_path / "cut.mcap"
    cut.write_bytes(whole[: len(whole) // 3] + b"\x80\x00 garbage \xff")
    with pytest.raises(LogFileError, match=r"cut\.mcap: .*--allow-truncated"):
        replay_log(cut, TEST_MODEL_PATH)
    result = replay_log(cut, TEST_MODEL_PATH, allow_truncated=True)
    n_whole = len(read_log(FIXTURE).observations)
    assert 0 < result.report.observations < n_whole


def _damaged_copies(tmp_path: Path) -> dict[str, Path]:
    """The real log and copies of it as QA found them used: 0 bytes, its first 20 bytes, its first
    200,000 bytes, and 400 bytes inside a chunk overwritten (bytes 150000-150399 set to 0xAB)."""
    whole = FIXTURE.read_bytes()
    corrupt = bytearray(whole)
    corrupt[150_000:150_400] = b"\xab" * 400
    files = {"good": whole, "empty": b"", "tiny": whole[:20], "cut": whole[:200_000], "corrupt": bytes(corrupt)}
    for name, data in files.items():
        (tmp_path / f"{name}.mcap").write_bytes(data)
    return {name: tmp_path / f"{name}.mcap" for name in files}


def _replay_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["replay", *argv, "--model", str(TEST_MODEL_PATH), "--no-gate"])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_cli_refuses_an_output_over_an_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`replay good.mcap --out good.mcap` replaced the drive with its replay; --json (or a fleet's new
    log named <stem>.replayed.mcap) could land on a log given too. Each refused naming both, exit 2."""
    logs = _damaged_copies(tmp_path)
    good, before = logs["good"], logs["good"].read_bytes()
    code, printed = _replay_cli(capsys, str(good), "--out", str(good))
    assert code == 2 and f"error: {good}: the output would overwrite the input {good}" in printed, printed
    code, printed = _replay_cli(capsys, str(good), "--out", str(tmp_path / "r.mcap"), "--json", str(good))
    assert code == 2 and f"{good}: the output would overwrite the input {good}" in printed, printed
    fleet = tmp_path / "fleet"
    fleet.mkdir()
    other = fleet / "good.replayed.mcap"  # where the fleet writes good.mcap's replay
    other.write_bytes(before)
    code, printed = _replay_cli(capsys, str(good), str(other), "--out", str(fleet), "--workers", "1")
    assert code == 2 and f"{other}: the output would overwrite the input {other}" in printed, printed
    assert good.read_bytes() == before and other.read_bytes() == before
    assert not (tmp_path / "r.mcap").exists() and sorted(fleet.iterdir()) == [other]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("empty", "empty.mcap: empty file, not an MCAP log"),
        ("tiny", "tiny.mcap: no sessions in it"),
    ],
)
def test_cli_refuses_an_empty_or_stray_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, message: str
) -> None:
    """An empty file, or one cut before its first record, printed nothing, wrote nothing and exited 0."""
    logs = _damaged_copies(tmp_path)
    out = tmp_path / "r.mcap"
    code, printed = _replay_cli(capsys, str(logs[name]), "--out", str(out))
    assert code == 2 and f"error: {tmp_path / message}" in printed, printed
    assert not out.exists()


@pytest.mark.parametrize("workers", ["0", "-1"])
def test_cli_refuses_workers_below_one(workers: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["replay", str(FIXTURE), "--workers", workers])
    assert exit_.value.code == 2
    assert f"argument --workers: {workers}: a whole number from 1" in capsys.readouterr().err


@pytest.mark.parametrize(
    "field,edit",
    [
        ("feature_names", lambda names: [names[1], names[0], *names[2:]]),  # two signals swapped
        ("feature_names", lambda names: [*names[:3], "lead_gap", *names[4:]]),  # another name
        ("control_names", lambda names: names[::-1]),
    ],
)
def test_a_log_of_another_schema_is_refused_naming_the_first_difference(tmp_path, capsys, field, edit):
    """Found by QA: a log whose features were named in another order replayed with exit 0, each value
    read as another signal's (a wrong count was refused, the same count in another order was not)."""
    src = read_log(FIXTURE)
    header = log_pb2.SessionHeader()
    header.CopyFrom(src.header)
    kept = getattr(header, field)
    names = list(kept)
    del kept[:]
    kept.extend(edit(names))
    log = write_log(tmp_path / "other.mcap", header, src.observations[:200])
    with pytest.raises(LogFileError, match=r"at position \d+ the log has '[^']+', the model '[^']+'"):
        replay_log(log, BASE_MODEL_PATH, DEFAULT_GATES)
    assert main(["replay", str(log), "--out", str(tmp_path / "r.mcap")]) == 2
    assert "replay it with the model it was recorded for" in capsys.readouterr().err
    assert not (tmp_path / "r.mcap").exists()
    same = write_log(tmp_path / "same.mcap", src.header, src.observations[:200])  # the names as recorded
    assert replay_log(same, BASE_MODEL_PATH, DEFAULT_GATES).report.ticks > 0
