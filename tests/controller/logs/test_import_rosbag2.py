"""`dualloop import rosbag2`: a bag written with mcap-ros2-support and the standard ROS 2 message
definitions (nav_msgs/Odometry, sensor_msgs/Imu, sensor_msgs/Range, geometry_msgs/TwistStamped),
imported through a mapping file and replayed."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from mcap_ros2.writer import Writer

from dualloop.controller.cli import main
from dualloop.controller.logs.import_rosbag2 import Rosbag2ImportError, bag_files, import_rosbag2, load_map
from dualloop.controller.logs.logfile import read_log
from dualloop.executor.action_labels import lookahead_labels
from dualloop.models import TEST_MODEL_PATH
from dualloop.sim.schema import FEATURE_INDEX, FEATURE_NAMES, SENSOR_RANGE_M

SEP = "=" * 80 + "\n"
TIME = "MSG: builtin_interfaces/Time\nint32 sec\nuint32 nanosec\n"
HEADER = "MSG: std_msgs/Header\nbuiltin_interfaces/Time stamp\nstring frame_id\n"
VECTOR3 = "MSG: geometry_msgs/Vector3\nfloat64 x\nfloat64 y\nfloat64 z\n"
QUATERNION = "MSG: geometry_msgs/Quaternion\nfloat64 x 0\nfloat64 y 0\nfloat64 z 0\nfloat64 w 1\n"
POINT = "MSG: geometry_msgs/Point\nfloat64 x\nfloat64 y\nfloat64 z\n"
TWIST = "MSG: geometry_msgs/Twist\nVector3  linear\nVector3  angular\n"
# The definitions as the ROS 2 recorder stores them (the message, then each dependency after a separator).
ODOMETRY = SEP.join(
    [
        "std_msgs/Header header\nstring child_frame_id\ngeometry_msgs/PoseWithCovariance pose\n"
        "geometry_msgs/TwistWithCovariance twist\n",
        HEADER,
        TIME,
        "MSG: geometry_msgs/PoseWithCovariance\nPose pose\nfloat64[36] covariance\n",
        "MSG: geometry_msgs/Pose\nPoint position\nQuaternion orientation\n",
        POINT,
        QUATERNION,
        "MSG: geometry_msgs/TwistWithCovariance\nTwist twist\nfloat64[36] covariance\n",
        TWIST,
        VECTOR3,
    ]
)
IMU = SEP.join(
    [
        "std_msgs/Header header\ngeometry_msgs/Quaternion orientation\nfloat64[9] orientation_covariance\n"
        "geometry_msgs/Vector3 angular_velocity\nfloat64[9] angular_velocity_covariance\n"
        "geometry_msgs/Vector3 linear_acceleration\nfloat64[9] linear_acceleration_covariance\n",
        HEADER,
        TIME,
        QUATERNION,
        VECTOR3,
    ]
)
RANGE = SEP.join(
    [
        "uint8 ULTRASOUND=0\nuint8 INFRARED=1\nstd_msgs/Header header\nuint8 radiation_type\nfloat32 field_of_view\n"
        "float32 min_range\nfloat32 max_range\nfloat32 range\nfloat32 variance\n",
        HEADER,
        TIME,
    ]
)
# radar_msgs (ros-perception/radar_msgs, a ROS 2 package): an object list with positions and velocities
RADAR_TRACKS = SEP.join(
    [
        "std_msgs/Header header\nradar_msgs/RadarTrack[] tracks\n",
        HEADER,
        TIME,
        "MSG: radar_msgs/RadarTrack\nunique_identifier_msgs/UUID uuid\ngeometry_msgs/Point position\n"
        "geometry_msgs/Vector3 velocity\ngeometry_msgs/Vector3 acceleration\ngeometry_msgs/Vector3 size\n"
        "uint16 classification\nfloat32[6] position_covariance\nfloat32[6] velocity_covariance\n"
        "float32[6] acceleration_covariance\nfloat32[6] size_covariance\n",
        "MSG: unique_identifier_msgs/UUID\nuint8[16] uuid\n",
        POINT,
        VECTOR3,
    ]
)
TWIST_STAMPED = SEP.join(["std_msgs/Header header\nTwist twist\n", HEADER, TIME, TWIST, VECTOR3])

T0_NS = 1_700_000_000_000_000_000
DURATION_S = 8.0


def _speed(t: float) -> float:
    return 20.0 + 2.0 * math.sin(t / 1.5)


def _gap(t: float) -> float:
    return 40.0 - 2.0 * t if t < 6.0 else math.inf  # the lead leaves at 6 s: the radar reads +inf


def _header(t_ns: int) -> dict[str, object]:
    return {"stamp": {"sec": t_ns // 1_000_000_000, "nanosec": t_ns % 1_000_000_000}, "frame_id": "base_link"}


def _vec(x: float = 0.0, y: float = 0.0, z: float = 0.0) -> dict[str, float]:
    return {"x": x, "y": y, "z": z}


def _track(x: float, y: float, vx: float) -> dict[str, object]:
    return {
        "uuid": {"uuid": [0] * 16},
        "position": _vec(x, y),
        "velocity": _vec(vx),
        "acceleration": _vec(),
        "size": _vec(4.5, 1.8, 1.5),
        "classification": 0,
        **{f"{k}_covariance": [0.0] * 6 for k in ("position", "velocity", "acceleration", "size")},
    }


def write_bag(path: Path, odom_unit_factor: float = 1.0, steps: range | None = None) -> Path:
    """50 Hz odometry (speed in m/s * factor), 100 Hz IMU, 20 Hz radar range and relative speed; `steps`:
    the 10 ms steps to write (default: all of DURATION_S), for a bag split into several files."""
    with path.open("wb") as f:
        w = Writer(f)
        odom = w.register_msgdef("nav_msgs/msg/Odometry", ODOMETRY)
        imu = w.register_msgdef("sensor_msgs/msg/Imu", IMU)
        rng = w.register_msgdef("sensor_msgs/msg/Range", RANGE)
        tw = w.register_msgdef("geometry_msgs/msg/TwistStamped", TWIST_STAMPED)
        tracks = w.register_msgdef("radar_msgs/msg/RadarTracks", RADAR_TRACKS)
        for k in steps if steps is not None else range(int(DURATION_S * 100) + 1):
            t_ns = T0_NS + k * 10_000_000
            t = k / 100
            pose = {"pose": {"position": _vec(), "orientation": {"x": 0.0, "y": 0.0, "z": 0.0, "w": 1.0}}}
            w.write_message(
                "/imu/data",
                imu,
                {
                    "header": _header(t_ns),
                    "orientation": {"x": 0.0, "y": 0.0, "z": 0.0, "w": 1.0},
                    "orientation_covariance": [0.0] * 9,
                    "angular_velocity": _vec(z=0.01),
                    "angular_velocity_covariance": [0.0] * 9,
                    "linear_acceleration": _vec(x=(2.0 / 1.5) * math.cos(t / 1.5), z=9.81),
                    "linear_acceleration_covariance": [0.0] * 9,
                },
                log_time=t_ns,
            )
            if k % 2 == 0:
                twist = {"twist": {"linear": _vec(x=_speed(t) * odom_unit_factor), "angular": _vec()}}
                w.write_message(
                    "/odom",
                    odom,
                    {
                        "header": _header(t_ns),
                        "child_frame_id": "base_link",
                        "pose": {**pose, "covariance": [0.0] * 36},
                        "twist": {**twist, "covariance": [0.0] * 36},
                    },
                    log_time=t_ns,
                )
            if k % 5 == 0:
                reading = {"radiation_type": 0, "field_of_view": 0.1, "min_range": 0.5, "max_range": 120.0}
                reading |= {"header": _header(t_ns), "range": _gap(t), "variance": 0.0}
                w.write_message("/radar/lead_range", rng, reading, log_time=t_ns)
                rel = -2.0 if t < 6.0 else 0.0
                objects = [_track(10.0, 3.5, 1.0)]  # a car in the left lane, alongside
                if t < 6.0:  # the lead: its centre 2.5 m beyond its rear bumper
                    objects.insert(0, _track(_gap(t) + 2.5, 0.2, -2.0))
                w.write_message("/radar/tracks", tracks, {"header": _header(t_ns), "tracks": objects}, log_time=t_ns)
                w.write_message(
                    "/radar/lead_velocity",
                    tw,
                    {"header": _header(t_ns), "twist": {"linear": _vec(x=rel), "angular": _vec()}},
                    log_time=t_ns,
                )
        w.finish()
    return path


MAP = """\
rate_hz: 20
max_age_s: 0.2
features:
  ego_speed: {topic: /odom, field: twist.twist.linear.x, unit: m/s}
  ego_accel: {topic: /imu/data, field: linear_acceleration.x}
  yaw_rate: {topic: /imu/data, field: angular_velocity.z, unit: rad/s}
  lead_present: {topic: /radar/lead_range, field: range, transform: present}
  lead_distance: {topic: /radar/lead_range, field: range, unit: m}
  lead_rel_speed: {topic: /radar/lead_velocity, field: twist.linear.x}
"""


@pytest.fixture
def bag(tmp_path: Path) -> Path:
    return write_bag(tmp_path / "drive.mcap")


def _map(tmp_path: Path, text: str = MAP, name: str = "map.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_bag_becomes_a_log_with_the_mapped_features_only(tmp_path: Path, bag: Path) -> None:
    report = import_rosbag2(bag, _map(tmp_path), tmp_path / "out.mcap")
    data = read_log(tmp_path / "out.mcap")
    mapped = ["ego_speed", "ego_accel", "lead_present", "lead_distance", "lead_rel_speed", "yaw_rate"]
    assert list(data.header.measured_features) == [n for n in FEATURE_NAMES if n in mapped]
    assert data.header.observation_period_ns == 50_000_000 and data.header.tick_period_ns == 5_000_000
    assert data.header.source_details["ego_speed"] == "/odom twist.twist.linear.x [m/s]"
    assert report.observations == len(data.observations) == int(DURATION_S * 20) + 1
    feats = np.array([o.features for o in data.observations])
    t = np.array([(o.timestamp_ns - T0_NS) / 1e9 for o in data.observations])
    np.testing.assert_allclose(t, np.arange(len(t)) / 20, atol=1e-9)
    held = np.floor(t * 50 + 1e-6) / 50  # odometry at 50 Hz: the newest message at or before each sample
    np.testing.assert_allclose(feats[:, FEATURE_INDEX["ego_speed"]], [_speed(x) for x in held], rtol=1e-6)
    np.testing.assert_allclose(feats[:, FEATURE_INDEX["ego_accel"]], (2.0 / 1.5) * np.cos(t / 1.5), rtol=1e-5)
    np.testing.assert_allclose(feats[:, FEATURE_INDEX["yaw_rate"]], 0.01, rtol=1e-6)
    lead = t < 6.0
    np.testing.assert_array_equal(feats[:, FEATURE_INDEX["lead_present"]], lead.astype(np.float32))
    np.testing.assert_allclose(feats[lead, FEATURE_INDEX["lead_distance"]], 40.0 - 2.0 * t[lead], rtol=1e-6)
    assert (feats[~lead, FEATURE_INDEX["lead_distance"]] == SENSOR_RANGE_M).all()  # +inf: nothing in range
    unmapped = [FEATURE_INDEX[n] for n in FEATURE_NAMES if n not in mapped]
    assert np.isnan(feats[:, unmapped]).all()  # declared missing, never invented
    labels = np.array([o.actual.action_index if o.HasField("actual") else -1 for o in data.observations])
    speed = np.array([_speed(x) for x in held])
    np.testing.assert_array_equal(labels, lookahead_labels(t, speed)[0])
    assert report.lead_present_fraction == pytest.approx(np.mean(lead))


def test_lead_from_an_object_list(tmp_path: Path, bag: Path) -> None:
    """radar_msgs/RadarTracks: the nearest track ahead within the lane half-width is the lead."""
    select = "select: {array: tracks, ahead: position.x, lateral: position.y, max_lateral_m: 1.75}"
    text = (
        "rate_hz: 20\nmax_age_s: 0.2\nfeatures:\n"
        "  ego_speed: {topic: /odom, field: twist.twist.linear.x}\n"
        f"  lead_present: {{topic: /radar/tracks, field: position.x, transform: present, {select}}}\n"
        f"  lead_distance: {{topic: /radar/tracks, field: position.x, offset: -2.5, {select}}}\n"
        f"  lead_rel_speed: {{topic: /radar/tracks, field: velocity.x, {select}}}\n"
    )
    import_rosbag2(bag, _map(tmp_path, text), tmp_path / "out.mcap")
    data = read_log(tmp_path / "out.mcap")
    feats = np.array([o.features for o in data.observations])
    t = np.array([(o.timestamp_ns - T0_NS) / 1e9 for o in data.observations])
    lead = t < 6.0
    np.testing.assert_array_equal(feats[:, FEATURE_INDEX["lead_present"]], lead.astype(np.float32))
    np.testing.assert_allclose(feats[lead, FEATURE_INDEX["lead_distance"]], 40.0 - 2.0 * t[lead], rtol=1e-6)
    # the left-lane car is never the lead: without one the gap reads the sensor range and rel speed 0
    assert (feats[~lead, FEATURE_INDEX["lead_distance"]] == SENSOR_RANGE_M).all()
    np.testing.assert_array_equal(feats[:, FEATURE_INDEX["lead_rel_speed"]], np.where(lead, -2.0, 0.0))
    assert np.isnan(feats[:, FEATURE_INDEX["left_front_gap"]]).all()


def test_units_and_derived_ego_accel(tmp_path: Path) -> None:
    bag = write_bag(tmp_path / "kmh.mcap", odom_unit_factor=3.6)
    text = "rate_hz: 10\nfeatures:\n  ego_speed: {topic: /odom, field: twist.twist.linear.x, unit: km/h}\n"
    report = import_rosbag2(bag, _map(tmp_path, text), tmp_path / "out.mcap")
    data = read_log(tmp_path / "out.mcap")
    feats = np.array([o.features for o in data.observations])
    t = np.array([(o.timestamp_ns - T0_NS) / 1e9 for o in data.observations])
    held = np.floor(t * 50 + 1e-6) / 50
    np.testing.assert_allclose(feats[:, FEATURE_INDEX["ego_speed"]], [_speed(x) for x in held], rtol=1e-6)
    assert list(data.header.measured_features) == ["ego_speed", "ego_accel"]
    assert "backward slope" in data.header.source_details["ego_accel"]
    assert t[0] > 0.0 and report.warnings  # the first sample has no past for ego_accel
    assert np.isfinite(feats[:, FEATURE_INDEX["ego_accel"]]).all()


def test_cli_imports_and_replays(tmp_path: Path, bag: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "imported.mcap"
    assert main(["import", "rosbag2", str(bag), "--map", str(_map(tmp_path)), "-o", str(out)]) == 0
    assert "161 observations" in "".join(capsys.readouterr())
    argv = ["replay", str(out), "--model", str(TEST_MODEL_PATH), "--workers", "1", "--out", str(tmp_path / "r")]
    assert main(argv) == 0
    assert "161 of 161 observations ticked, 151 labelled" in "".join(capsys.readouterr())
    replayed = read_log(tmp_path / "r" / "imported.replayed.mcap")
    assert replayed.header.session_id == "rosbag2-drive" and len(replayed.snapshots) == 1601  # one per 5 ms tick


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("rate_hz: 20\nfeatures: {}\n", "features: ego_speed is required"),
        ("features:\n  ego_speed: {topic: /odom, field: twist.twist.linear.x}\n", "rate_hz: Field required"),
        (
            "rate_hz: 20\nfeatures:\n  ego_sped: {topic: /odom, field: a}\n",
            "features: unknown feature 'ego_sped'",
        ),
        (
            "rate_hz: 20\nfeatures:\n  ego_speed: {topic: /odom, field: twist.twist.linear.x, unit: ft}\n",
            "ego_speed: unit 'ft' cannot be converted to m/s",
        ),
        (
            "rate_hz: 20\nfeatures:\n  ego_speed: {topic: /odom, feld: x}\n",
            "features.ego_speed.field: Field required; features.ego_speed.feld: Extra inputs",
        ),
        ("rate_hz: 20\nfeatures:\n  ego_speed: {topic: /odom, field: 'a..b'}\n", "features.ego_speed.field:"),
        ("rate_hz: 20\nfeatures: [\n", "line 3: not valid YAML"),
    ],
)
def test_bad_map_files_name_the_file_and_field(tmp_path: Path, text: str, message: str) -> None:
    path = _map(tmp_path, text, "bad.yaml")
    with pytest.raises(Rosbag2ImportError, match="bad.yaml") as err:
        load_map(path)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("replace", "message"),
    [
        (
            ("topic: /odom", "topic: /odometry"),
            "topic '/odometry' ({map}: features.ego_speed.topic) is not in the bag; "
            "its topics: /imu/data, /odom, /radar/lead_range, /radar/lead_velocity, /radar/tracks",
        ),
        (
            ("twist.twist.linear.x", "twist.linear.x"),
            "topic '/odom' message 1 (Odometry): no field 'linear' at twist (it has: covariance, twist) "
            "({map}: features.ego_speed.field)",
        ),
        (
            ("field: range, unit: m", "field: header, unit: m"),
            "topic '/radar/lead_range' message 1 (Range): field 'header' is Header, not a number "
            "({map}: features.lead_distance.field)",
        ),
        (
            ("field: range, unit: m", "field: range, unit: m, select: {array: header, ahead: x}"),
            "topic '/radar/lead_range' message 1 (Range): field 'header' is Header, not a list "
            "({map}: features.lead_distance.select.array)",
        ),
    ],
)
def test_bag_errors_name_the_topic_and_field(tmp_path: Path, bag: Path, replace: tuple[str, str], message: str) -> None:
    map_path = _map(tmp_path, MAP.replace(*replace))
    with pytest.raises(Rosbag2ImportError) as err:
        import_rosbag2(bag, map_path, tmp_path / "out.mcap")
    assert str(err.value) == f"{bag}: " + message.format(map=map_path)


def test_a_file_that_is_not_a_bag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake = tmp_path / "notes.mcap"
    fake.write_text("not an mcap file\n")
    assert main(["import", "rosbag2", str(fake), "--map", str(_map(tmp_path))]) == 2
    printed = "".join(capsys.readouterr())
    assert "notes.mcap: not a readable ROS 2 MCAP bag" in printed
    assert main(["import", "rosbag2", str(tmp_path / "gone.mcap"), "--map", str(_map(tmp_path))]) == 2
    assert "gone.mcap: no such file" in "".join(capsys.readouterr())


def test_a_mapped_topic_without_messages(tmp_path: Path) -> None:
    bag = tmp_path / "quiet.mcap"
    with bag.open("wb") as f:
        w = Writer(f)
        w.register_msgdef("nav_msgs/msg/Odometry", ODOMETRY)
        odom = w.register_msgdef("sensor_msgs/msg/Imu", IMU)
        w.write_message("/imu/data", odom, {"header": _header(T0_NS)}, log_time=T0_NS)
        w.finish()
    text = "rate_hz: 10\nfeatures:\n  ego_speed: {topic: /imu/data, field: linear_acceleration.x}\n"
    with pytest.raises(Rosbag2ImportError, match=r"quiet.mcap: topic '/imu/data' has 1 message\(s\)"):
        import_rosbag2(bag, _map(tmp_path, text), tmp_path / "out.mcap")


def test_an_output_over_the_bag_or_the_map_is_refused(
    tmp_path: Path, bag: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`-o` naming the bag (or the mapping file) replaced it with the dualloop log: refused naming both."""
    map_path = _map(tmp_path)
    before = bag.read_bytes(), map_path.read_bytes()
    for out, given in ((bag, bag), (map_path, map_path)):
        assert main(["import", "rosbag2", str(bag), "--map", str(map_path), "-o", str(out)]) == 2
        printed = "".join(capsys.readouterr())
        assert f"error: {out}: the output would overwrite the input {given}" in printed, printed
    assert (bag.read_bytes(), map_path.read_bytes()) == before


@pytest.mark.parametrize("unit", [", unit: m/s", ""])
def test_a_speed_in_kmh_mapped_as_ms_is_refused(tmp_path: Path, unit: str) -> None:
    """The CSV importer refuses such a speed as "looks like km/h"; a bag imported it silently."""
    bag = write_bag(tmp_path / "kmh.mcap", odom_unit_factor=3.6)
    map_path = _map(
        tmp_path, f"rate_hz: 20\nfeatures:\n  ego_speed: {{topic: /odom, field: twist.twist.linear.x{unit}}}\n"
    )
    with pytest.raises(Rosbag2ImportError) as err:
        import_rosbag2(bag, map_path, tmp_path / "out.mcap")
    assert str(err.value).startswith(
        f"{bag}: ego_speed (/odom twist.twist.linear.x) at 2.35 s, log_time 1700000002.350000000: "
    )
    assert str(err.value).endswith(
        f"79.1996 m/s (median 73.6181) is implausible for a car: looks like km/h; declare unit: km/h "
        f"({map_path}: features.ego_speed.unit)"
    )
    assert not (tmp_path / "out.mcap").exists()


def test_values_out_of_range_are_kept_with_a_warning_naming_the_first_sample(tmp_path: Path) -> None:
    """A negative gap, a flag other than 0/1 and a reversing speed: kept, with the CSV importer's warnings."""
    bag = write_bag(tmp_path / "odd.mcap", odom_unit_factor=-1.0)
    text = (
        "rate_hz: 20\nmax_age_s: 0.2\nfeatures:\n"
        "  ego_speed: {topic: /odom, field: twist.twist.linear.x}\n"
        "  lead_present: {topic: /radar/lead_velocity, field: twist.linear.x}\n"  # -2 while the lead is there
        "  lead_distance: {topic: /radar/lead_range, field: range, offset: -50}\n"  # 40 - 2 t - 50 < 0
    )
    report = import_rosbag2(bag, _map(tmp_path, text), tmp_path / "out.mcap")
    t0 = "first at 0.00 s, log_time 1700000000.000000000"
    expected = [
        f"feature 'ego_speed' (/odom twist.twist.linear.x): 161 sample(s) out of range ({t0}: -20 m/s); "
        "the model knows forward driving only",
        f"feature 'lead_present' (/radar/lead_velocity twist.linear.x): 120 sample(s) out of range ({t0}: -2); "
        "a flag is 1 or 0",
        f"feature 'lead_distance' (/radar/lead_range range): 120 sample(s) out of range ({t0}: -10 m); "
        "a gap is at least 0 m (150 m when nothing is there)",
    ]
    assert report.warnings[:3] == expected
    data = read_log(tmp_path / "out.mcap")
    assert data.header.source_details["warnings"].startswith("; ".join(expected))
    assert data.observations[0].features[FEATURE_INDEX["lead_distance"]] == pytest.approx(
        -10.1
    )  # kept as is (t = 0.05 s)


def test_a_topic_much_slower_than_rate_hz_is_warned_about_and_a_slow_ego_speed_refused(
    tmp_path: Path, bag: Path
) -> None:
    """Held values of a slow topic: a warning; a held ego_speed makes steps that the derived ego_accel and
    the look-ahead labels read as accelerations (1 Hz odometry at 20 Hz gave +-2.5 m/s^2 for a 1.33 peak)."""
    text = (
        "rate_hz: RATE\nfeatures:\n  ego_speed: {topic: /odom, field: twist.twist.linear.x}\n"
        "  lead_distance: {topic: /radar/lead_range, field: range}\n"
    )
    report = import_rosbag2(bag, _map(tmp_path, text.replace("RATE", "100")), tmp_path / "out.mcap")
    assert report.warnings[0] == (
        "topic '/radar/lead_range' (lead_distance) has a message every 50 ms (20 Hz, the median interval), "
        "below half of rate_hz 100: its values are held over several samples (NaN beyond max_age_s)"
    )
    assert not any("/odom" in w for w in report.warnings)  # 50 Hz is half of 100: fine
    map_path = _map(tmp_path, text.replace("RATE", "200"))
    with pytest.raises(Rosbag2ImportError) as err:
        import_rosbag2(bag, map_path, tmp_path / "fast.mcap")
    assert str(err.value) == (
        f"{bag}: topic '/odom' (ego_speed) has a message every 20 ms (50 Hz, the median interval), below half "
        f"of rate_hz 200 ({map_path}: rate_hz): each speed would be held over 4 samples, and the derived "
        "ego_accel and the labels would read its steps as accelerations; set rate_hz to the topic's rate (50) "
        "or lower"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "rate_hz: 20\nfeatures:\n  ego_speed: {topic: /odom, field: twist.twist.linear.x}\n"
            "  ego_speed: {topic: /odom, field: twist.twist.linear.y}\n",
            "line 4: key 'ego_speed' given twice in one mapping (first at line 3)",
        ),
        (
            "rate_hz: 20\nfeatures:\n  ego_speed: {topic: /odom, field: twist.twist.linear.x, field: pose.x}\n",
            "line 3: key 'field' given twice in one mapping (first at line 3)",
        ),
        (
            "rate_hz: 20\nfeatures:\n  ego_speed: {topic: /odom, field: twist.twist.linear.x}\nrate_hz: 10\n",
            "line 4: key 'rate_hz' given twice in one mapping (first at line 1)",
        ),
    ],
)
def test_a_key_given_twice_in_the_mapping_file_is_refused(tmp_path: Path, text: str, message: str) -> None:
    """YAML keeps the last of two equal keys silently: the speed came from the wrong field."""
    path = _map(tmp_path, text, "twice.yaml")
    with pytest.raises(Rosbag2ImportError) as err:
        load_map(path)
    assert str(err.value) == f"{path}: {message}; YAML would keep only the last: remove one"


def test_a_merge_key_may_still_be_overridden(tmp_path: Path) -> None:
    text = (
        "rate_hz: 20\nfeatures:\n  ego_speed: &odom {topic: /odom, field: twist.twist.linear.x, unit: m/s}\n"
        "  yaw_rate: {<<: *odom, field: twist.twist.angular.z, unit: rad/s}\n"
    )
    mapping = load_map(_map(tmp_path, text))
    assert (mapping.features["yaw_rate"].topic, mapping.features["yaw_rate"].unit) == ("/odom", "rad/s")


METADATA = """\
rosbag2_bagfile_information:
  version: 8
  storage_identifier: STORAGE
  duration: {nanoseconds: 8000000000}
  starting_time: {nanoseconds_since_epoch: 1700000000000000000}
  message_count: 2000
  compression_format: ""
  compression_mode: ""
  relative_file_paths:
FILES
"""


def _bag_folder(folder: Path, names: list[str], metadata: bool = True, storage: str = "mcap") -> Path:
    """A bag as `ros2 bag record` writes it: the drive split in len(names) files, and metadata.yaml."""
    folder.mkdir()
    bounds = np.linspace(0, int(DURATION_S * 100) + 1, len(names) + 1).astype(int)
    for name, start, stop in zip(names, bounds[:-1], bounds[1:], strict=True):
        write_bag(folder / name, steps=range(start, stop))
    if metadata:
        files = "".join(f"    - {n}\n" for n in names)
        (folder / "metadata.yaml").write_text(METADATA.replace("STORAGE", storage).replace("FILES\n", files))
    return folder


@pytest.mark.parametrize(
    ("names", "metadata"), [(["drive_0.mcap", "drive_1.mcap"], True), (["d_9.mcap", "d_10.mcap"], False)]
)
def test_a_bag_folder_is_read_file_after_file(tmp_path: Path, bag: Path, names: list[str], metadata: bool) -> None:
    """A bag folder (metadata.yaml and its split files) was "no such file": it gives what the one file gives.
    Without metadata.yaml the files are taken in natural order (d_9 before d_10)."""
    folder = _bag_folder(tmp_path / "drive", names, metadata)
    assert bag_files(folder) == [folder / n for n in names]
    whole = import_rosbag2(bag, _map(tmp_path), tmp_path / "whole.mcap")
    split = import_rosbag2(folder, _map(tmp_path), tmp_path / "split.mcap")
    assert split.observations == whole.observations == int(DURATION_S * 20) + 1
    one, parts = read_log(tmp_path / "whole.mcap"), read_log(tmp_path / "split.mcap")
    assert parts.header.session_id == "rosbag2-drive"
    assert [o.timestamp_ns for o in parts.observations] == [o.timestamp_ns for o in one.observations]
    np.testing.assert_array_equal(
        np.array([o.features for o in parts.observations]), np.array([o.features for o in one.observations])
    )


def test_bag_folders_without_a_readable_mcap_name_the_folder(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(Rosbag2ImportError, match=f"^{empty}: a folder without .mcap files"):
        bag_files(empty)
    lost = _bag_folder(tmp_path / "lost", ["lost_0.mcap", "lost_1.mcap"])
    (lost / "lost_1.mcap").unlink()
    with pytest.raises(Rosbag2ImportError) as err:
        bag_files(lost)
    assert (
        str(err.value) == f"{lost / 'metadata.yaml'}: relative_file_paths lists 'lost_1.mcap', which is not in {lost}"
    )
    sqlite = _bag_folder(tmp_path / "sql", ["sql_0.mcap"], storage="sqlite3")
    with pytest.raises(Rosbag2ImportError, match="storage_identifier 'sqlite3': only MCAP bags are read"):
        bag_files(sqlite)


def test_the_cli_takes_a_bag_folder_and_refuses_an_output_in_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _bag_folder(tmp_path / "rosbag2_2026_12_06", ["rosbag2_2026_12_06_0.mcap"])
    map_path = _map(tmp_path)
    assert main(["import", "rosbag2", str(folder), "--map", str(map_path)]) == 0
    assert "161 observations" in "".join(capsys.readouterr())
    assert (tmp_path / "rosbag2_2026_12_06.dualloop.mcap").is_file()  # beside the folder, not in it
    before = sorted(p.name for p in folder.iterdir())
    for out, why in (
        (folder / "out.mcap", "would be written inside the input folder"),
        (folder, "would overwrite the input"),
    ):
        assert main(["import", "rosbag2", str(folder), "--map", str(map_path), "-o", str(out)]) == 2
        assert f"error: {out}: the output {why} {folder}" in "".join(capsys.readouterr())
    assert sorted(p.name for p in folder.iterdir()) == before


def test_a_cut_bag_points_at_recover_and_its_recovery_imports(tmp_path: Path, bag: Path) -> None:
    """Found by QA: a bag cut mid-record (a killed `ros2 bag record`) was "not a readable ROS 2 MCAP bag
    (RecordLengthLimitExceeded ...)", with nothing said of `dualloop recover`, which reads it."""
    cut = tmp_path / "cut.mcap"
    data = bag.read_bytes()
    cut.write_bytes(data[: len(data) * 2 // 3] + b"\x0f" * 64)  # cut mid-record, then junk
    with pytest.raises(Rosbag2ImportError) as err:
        import_rosbag2(cut, _map(tmp_path), tmp_path / "out.mcap")
    assert f"dualloop recover {cut} cut.recovered.mcap` rewrites its complete part" in str(err.value)
    recovered = tmp_path / "cut.recovered.mcap"
    assert main(["recover", str(cut), str(recovered)]) == 0
    import_rosbag2(recovered, _map(tmp_path), tmp_path / "out.mcap")
    assert read_log(tmp_path / "out.mcap").observations
