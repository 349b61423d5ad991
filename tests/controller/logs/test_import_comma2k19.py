"""The comma2k19 importer: the shipped fixture, a fresh import, lead selection and causality."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dualloop.controller.cli import main
from dualloop.controller.contract.wire import observation_from_proto
from dualloop.controller.logs import import_comma2k19 as c2k
from dualloop.controller.logs.logfile import read_log
from dualloop.executor.action_labels import backward_accel, lookahead_labels
from dualloop.executor.core import Executor
from dualloop.executor.model_runner import DecisionModel
from dualloop.executor.snapshot import Clock
from dualloop.sim.schema import ACTIONS, FEATURE_INDEX, FEATURE_NAMES, SENSOR_RANGE_M
from tests.paths import FIXTURES

FIXTURE = FIXTURES / "comma2k19-example1.mcap"
DATASET = Path("/work/shared/data/comma2k19-example1")
needs_dataset = pytest.mark.skipif(not DATASET.is_dir(), reason="the comma2k19 segment is not on this machine")


@pytest.fixture(scope="module")
def fixture_log():
    return read_log(FIXTURE)


def column(obs: list, name: str) -> np.ndarray:
    return np.array([o.features[FEATURE_INDEX[name]] for o in obs])


def test_fixture_is_a_plausible_minute_of_highway(fixture_log) -> None:
    obs = fixture_log.observations
    assert not fixture_log.truncated and FIXTURE.stat().st_size < 2_000_000
    times = np.array([o.timestamp_ns for o in obs])
    assert times[0] == 0 and np.all(np.diff(times) > 0)
    assert 58.0 < times[-1] / 1e9 < 61.0 and len(obs) > 5800
    features = np.array([o.features for o in obs])
    assert features.shape[1] == len(FEATURE_NAMES) and np.all(np.isfinite(features))
    speed = column(obs, "ego_speed")
    assert 7.5 < speed.min() and speed.max() < 20.5 and speed.max() - speed.min() > 8  # 8 -> 20 m/s and back to 11
    present = column(obs, "lead_present") == 1
    assert present.mean() > 0.8
    gaps = column(obs, "lead_distance")
    assert 20 < np.percentile(gaps[present], 5) and np.percentile(gaps[present], 95) < 80
    assert np.all(gaps[~present] == SENSOR_RANGE_M) and np.all(column(obs, "lead_rel_speed")[~present] == 0)
    assert np.abs(column(obs, "ego_accel")).max() < 4.0
    assert np.count_nonzero(np.diff(present.astype(int))) <= 4  # the lead does not flicker


def test_fixture_carries_actions_and_provenance(fixture_log) -> None:
    head = fixture_log.header
    assert head.source.startswith("comma2k19 import of b0c9d2329ad1606b|2018-08-02--08-34-47")
    assert list(head.feature_names) == list(FEATURE_NAMES) and list(head.action_names) == list(ACTIONS)
    assert set(head.measured_features) >= {"ego_speed", "ego_accel", "lead_present", "lead_distance", "lead_rel_speed"}
    assert set(head.filled_features) >= {"lane_offset", "left_front_gap"}
    assert not set(head.measured_features) & set(head.filled_features)
    assert head.clock == 2 and head.shadow and "steering" in head.source_details["actual_steer"]
    actions = np.array([o.actual.action_index for o in fixture_log.observations])
    assert len(set(actions.tolist())) >= 2 and actions.min() >= 0
    controls = np.array([o.actual.controls for o in fixture_log.observations])
    assert controls.shape[1] == 2 and np.abs(controls[:, 1]).max() < 0.05  # highway: small wheel angles
    # The label is the next 0.5 s of the same speed the accel feature looks back on: they must agree
    # once shifted by the window, which catches a sign or window mix-up.
    accel = column(fixture_log.observations, "ego_accel")
    assert np.corrcoef(controls[:-50, 0], accel[50:])[0, 1] > 0.95


def test_fixture_observations_are_accepted_by_the_executor(fixture_log, test_model: DecisionModel) -> None:
    executor = Executor(test_model)
    executor.open_session("replay", clock=Clock.LOCKSTEP, shadow=True)
    snapshots = []
    for msg in fixture_log.observations[:400]:
        snapshots += executor.advance_lockstep("replay", observation_from_proto(msg, arrival_ns=0))
    assert len(snapshots) >= 790 and all(s.proposed_index >= 0 for s in snapshots[5:])


@needs_dataset
def test_fresh_import_agrees_with_the_fixture(tmp_path: Path) -> None:
    """The fixture was made before the importer stopped filling: the measured columns must still be
    the same values (one row later: the first grid time has no causal ego_accel and is left out),
    the unmeasured ones NaN, and the labels those of action_labels."""
    out = tmp_path / "fresh.mcap"
    report = c2k.import_comma2k19(DATASET, out, rate_hz=100, start_time_unix_ns=1_533_198_887_000_000_000)
    fresh, old = read_log(out), read_log(FIXTURE)
    assert report.observations == len(fresh.observations) == len(old.observations) - 1
    assert [o.timestamp_ns for o in fresh.observations] == [o.timestamp_ns for o in old.observations[1:]]
    new_x = np.array([o.features for o in fresh.observations])
    old_x = np.array([o.features for o in old.observations[1:]])
    measured = list(fresh.header.measured_features)
    assert measured == [n for n in FEATURE_NAMES if n in c2k.MEASURED] and not fresh.header.filled_features
    for name in FEATURE_NAMES:
        k = FEATURE_INDEX[name]
        if name == "ego_accel":  # 2-point backward slope now, least squares then: same signal, less smoothing
            assert np.sqrt(np.mean((new_x[:, k] - old_x[:, k]) ** 2)) < 0.15
        elif name in measured:
            np.testing.assert_array_equal(new_x[:, k], old_x[:, k], err_msg=name)
        else:
            assert np.isnan(new_x[:, k]).all(), name
    t = np.array([o.timestamp_ns for o in fresh.observations]) / 1e9
    labels, accel = lookahead_labels(t, column(fresh.observations, "ego_speed"))
    # recomputed from the stored float32 speeds: equal bands, accelerations within float32 rounding
    np.testing.assert_array_equal([o.actual.action_index for o in fresh.observations], labels)
    np.testing.assert_allclose([o.actual.controls[0] for o in fresh.observations], accel, atol=1e-4)
    assert fresh.header.observation_period_ns == 10_000_000 and fresh.header.tick_period_ns == 5_000_000
    assert report.lead_present_fraction > 0.8 and "imported comma2k19" in report.summary()


@needs_dataset
def test_no_look_ahead_in_observation_features() -> None:
    seg = c2k.load_segment(DATASET)
    cut = seg.speed_t[0] + 30.0
    head = c2k.Segment(
        *(
            part
            for times, values in (
                (seg.speed_t, seg.speed),
                (seg.steer_t, seg.steer_deg),
                (seg.radar_t, seg.radar),
                (seg.gyro_t, seg.gyro),
            )
            for part in (times[times <= cut], values[times <= cut])
        )
    )
    grid = np.arange(seg.speed_t[0] + 1.0, cut, 0.01)
    np.testing.assert_array_equal(c2k.ego_accel_from_speed(head, grid), c2k.ego_accel_from_speed(seg, grid))
    np.testing.assert_array_equal(c2k.select_leads(head, grid), c2k.select_leads(seg, grid))


def _segment_with_radar(rows: list[tuple[float, float, float, int, int]]) -> c2k.Segment:
    """A segment whose radar reports (t, forward, left, address, new_flag); the rest is constant."""
    t = np.arange(0.0, 10.0, 0.01)
    radar = np.array([[d, left, 0.5, np.nan, np.nan, addr, new] for _, d, left, addr, new in rows])
    return c2k.Segment(
        t, np.full_like(t, 15.0), t, np.zeros_like(t), np.array([r[0] for r in rows]), radar, t, np.zeros((len(t), 3))
    )


def test_lead_hysteresis_persistence_and_disappearance() -> None:
    rows = []
    for k in range(120):  # 20 Hz for 6 s; the track hovers around the lane edge
        t = k * 0.05
        left = 1.5 if t < 2.0 else (2.2 if k % 2 else 1.9) if t < 4.0 else 3.0
        rows.append((t, 40.0, left, 530, 1 if k == 0 else 0))
    seg = _segment_with_radar(rows)
    grid = np.arange(0.0, 7.0, 0.01)
    leads = c2k.select_leads(seg, grid)
    present = leads[:, 0] == 1
    assert not present[grid < c2k.LEAD_CONFIRM_S - 0.01].any()  # must persist before it counts
    between = (grid > 0.5) & (grid < 3.95)
    assert present[between].all()  # 1.9/2.2 m alternation stays inside the 2.5 m exit threshold
    assert not present[grid > 4.05].any()  # left the lane (3 m): gone
    assert np.all(leads[~present, 1] == SENSOR_RANGE_M)


def test_lead_disappears_when_the_track_stops_reporting() -> None:
    rows = [(k * 0.05, 30.0 + k * 0.1, 0.2, 531, 0) for k in range(40)]  # reports until t = 1.95 s
    seg = _segment_with_radar(rows)
    grid = np.arange(0.0, 4.0, 0.01)
    present = c2k.select_leads(seg, grid)[:, 0] == 1
    assert present[(grid > 0.5) & (grid < 1.95)].all()
    assert not present[grid > 1.95 + c2k.TRACK_STALE_S + 0.01].any()


def test_nearer_cut_in_takes_over_and_duplicates_do_not_flicker() -> None:
    rows = []
    for k in range(100):
        t = k * 0.05
        rows.append((t, 60.0, 0.0, 532, 0))
        rows.append((t, 60.3, 0.1, 540, 0))  # the same car reported twice: must not swap leads
        if t >= 2.0:
            rows.append((t, 25.0, 1.0, 533, 1 if t == 2.0 else 0))  # a cut-in, nearer
    rows.sort()
    seg = _segment_with_radar(rows)
    grid = np.arange(0.0, 5.0, 0.01)
    leads = c2k.select_leads(seg, grid)
    before = (grid > 0.5) & (grid < 2.0)
    assert np.all(leads[before, 1] == 60.0)
    assert np.all(leads[grid > 2.0 + c2k.LEAD_CONFIRM_S + 0.01, 1] == 25.0)


def _save(folder: Path, t: np.ndarray, value: np.ndarray) -> None:
    folder.mkdir(parents=True)
    for name, array in (("t", t), ("value", value)):
        with open(folder / name, "wb") as stream:  # the dataset's files have no .npy suffix
            np.save(stream, array)


def test_import_of_a_segment_on_disk_leaves_missing_features_nan(tmp_path: Path) -> None:
    """A small segment written in comma2k19's layout: the unmeasured features are NaN and absent from
    the sensor profile, labels are lookahead_labels of the stored speed, ego_accel is causal."""
    segment = tmp_path / "segment"
    t = 1000.0 + np.arange(0.0, 12.0, 0.01)
    speed = 15.0 + 2.0 * np.sin(t)
    _save(segment / "processed_log" / "CAN" / "speed", t, speed.reshape(-1, 1))
    _save(segment / "processed_log" / "CAN" / "steering_angle", t, np.full_like(t, 3.0))
    radar_t = np.arange(1000.0, 1012.0, 0.05)
    radar = np.array([[30.0, 0.2, -1.0, np.nan, np.nan, 530, 0] for _ in radar_t])
    _save(segment / "processed_log" / "CAN" / "radar", radar_t, radar)
    _save(segment / "processed_log" / "IMU" / "gyro", t, np.zeros((len(t), 3)))
    report = c2k.import_comma2k19(segment, tmp_path / "s.mcap", start_time_unix_ns=1)
    data = read_log(tmp_path / "s.mcap")
    head = data.header
    assert list(head.measured_features) == [n for n in FEATURE_NAMES if n in c2k.MEASURED]
    assert not head.filled_features and report.filled_features == []
    assert head.observation_period_ns == 10_000_000 and head.tick_period_ns == 5_000_000
    x = np.array([o.features for o in data.observations], dtype=np.float64)
    for name in FEATURE_NAMES:
        assert np.isnan(x[:, FEATURE_INDEX[name]]).all() == (name not in c2k.MEASURED), name
    # the grid's first time is the first CAN sample: no past, left out
    assert data.observations[0].timestamp_ns == 10_000_000
    stamps = np.array([o.timestamp_ns for o in data.observations]) / 1e9
    labels, accel = lookahead_labels(stamps, x[:, FEATURE_INDEX["ego_speed"]])
    np.testing.assert_array_equal([o.actual.action_index for o in data.observations], labels)
    np.testing.assert_allclose([o.actual.controls[0] for o in data.observations], accel, atol=1e-4, equal_nan=True)
    np.testing.assert_allclose(x[:, FEATURE_INDEX["ego_accel"]], backward_accel(t, speed)[1 : len(x) + 1], atol=1e-4)
    assert {ACTIONS[i] for i in labels if i >= 0} >= {"brake", "accelerate"}


def test_damaged_segment_files_are_named(tmp_path: Path) -> None:
    """A truncated .npy, an array of text, and repeated speed times: each a Comma2k19Error naming the
    file (found by tests/fuzz: were numpy's and backward_accel's own exceptions)."""
    t = 1000.0 + np.arange(0.0, 3.0, 0.01)

    def segment(name: str) -> Path:
        root = tmp_path / name
        _save(root / "processed_log" / "CAN" / "speed", t, (15.0 + np.sin(t)).reshape(-1, 1))
        _save(root / "processed_log" / "CAN" / "steering_angle", t, np.zeros_like(t))
        _save(root / "processed_log" / "CAN" / "radar", t, np.zeros((len(t), 7)))
        _save(root / "processed_log" / "IMU" / "gyro", t, np.zeros((len(t), 3)))
        return root

    cut = segment("cut")
    gyro_t = cut / "processed_log" / "IMU" / "gyro" / "t"
    gyro_t.write_bytes(gyro_t.read_bytes()[:100])
    text = segment("text")
    with open(text / "processed_log" / "CAN" / "radar" / "value", "wb") as stream:
        np.save(stream, np.array(["a"] * len(t)))
    twice = segment("twice")
    with open(twice / "processed_log" / "CAN" / "speed" / "t", "wb") as stream:
        np.save(stream, np.concatenate([t[:10], t[9:-1]]))
    for root, message in (
        (cut, r"cut/processed_log/IMU/gyro/t: not a readable \.npy array"),
        (text, r"text/processed_log/CAN/radar/value: holds <U1, not numbers"),
        (twice, r"twice/processed_log/CAN/speed/t: time .* appears twice"),
    ):
        with pytest.raises(c2k.Comma2k19Error, match=message):
            c2k.import_comma2k19(root, tmp_path / "x.mcap")


def test_an_output_in_the_segment_folder_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`-o` inside the segment folder could land on one of its files (here the speed channel's times):
    refused naming both, the segment untouched."""
    segment = tmp_path / "segment"
    t = 1000.0 + np.arange(0.0, 12.0, 0.01)
    _save(segment / "processed_log" / "CAN" / "speed", t, (15.0 + np.sin(t)).reshape(-1, 1))
    _save(segment / "processed_log" / "CAN" / "steering_angle", t, np.zeros_like(t))
    _save(segment / "processed_log" / "CAN" / "radar", t, np.zeros((len(t), 7)))
    _save(segment / "processed_log" / "IMU" / "gyro", t, np.zeros((len(t), 3)))
    times = segment / "processed_log" / "CAN" / "speed" / "t"
    before = times.read_bytes()
    assert main(["import", "comma2k19", str(segment), "-o", str(times)]) == 2
    printed = "".join(capsys.readouterr())
    assert f"error: {times}: the output would be written inside the input folder {segment}" in printed, printed
    assert times.read_bytes() == before
    assert main(["import", "comma2k19", str(segment), "-o", str(tmp_path / "s.mcap")]) == 0
