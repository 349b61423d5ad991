"""Import a comma2k19 processed-log segment as a dualloop drive log.

Only the longitudinal picture is real: ego speed (CAN), ego acceleration (derived from the CAN
speed, see `ego_accel_from_speed`), and the in-lane lead from the radar tracks, plus yaw rate and a
kinematic curvature from the gyro. Lane offset, heading error and the neighbouring lanes are not in
this data: they are NaN and left out of measured_features (the sensor profile), never filled.

Time base: every channel is resampled onto a fixed grid (default 100 Hz, near the CAN rate) using
the latest sample at or before each grid time, so an observation never contains anything measured
after its own timestamp. Timestamps start at 0 ns at the first instant every channel has data; the
grid times before the CAN speed has a past (no causal ego_accel yet) are left out.

The human's actual action is the one exception to "no look-ahead": it is ground truth, not an
input. It is `action_labels.lookahead_labels` of the grid's ego speed: the band of
(v(t + 0.5 s) - v(t)) / 0.5 s (what the driver's pedal did next), -1 for the last 0.5 s. Its
controls are [that accel, front-wheel angle = steering-wheel angle / STEERING_RATIO in radians,
+ = left].
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from dualloop.controller.logs.following import imported_header
from dualloop.controller.logs.format import ACTUAL_CONTROLS_DETAIL
from dualloop.controller.logs.import_report import ImportReport, count_labels
from dualloop.controller.logs.logfile import write_log
from dualloop.controller.logs.outputs import refuse_overwriting_inputs
from dualloop.executor.action_labels import ACCEL_WINDOW_S, LOOKAHEAD_S, backward_accel, lookahead_labels
from dualloop.sim.schema import FEATURE_INDEX, FEATURE_NAMES, N_FEATURES, SENSOR_RANGE_M
from dualloop.v2 import controller_pb2 as pb

# Toyota RAV4 2018 steering ratio (steering-wheel angle / front-wheel angle), as in the brief.
STEERING_RATIO = 15.3
# The gyro is noisy at 104 Hz; a short trailing mean makes yaw rate and curvature usable.
YAW_WINDOW_S = 0.25
# Lead selection. A track enters the ego lane at |left| < 2.0 m and leaves at |left| >= 2.5 m
# (lateral hysteresis); it must stay in lane for 0.3 s before it counts as a lead (no flicker from a
# track crossing the lane edge); a track not reported for 0.3 s is gone (each radar address
# reports at ~16 Hz, so that is several missed reports).
LEAD_ENTER_M = 2.0
LEAD_EXIT_M = 2.5
LEAD_CONFIRM_S = 0.3
TRACK_STALE_S = 0.3
# The current lead is kept unless another confirmed track is nearer by more than this: the radar
# reports some objects twice under two addresses, which must not make the lead switch back and forth.
LEAD_SWITCH_MARGIN_M = 1.0

MEASURED = ("ego_speed", "ego_accel", "lead_present", "lead_distance", "lead_rel_speed", "yaw_rate", "road_curvature")

_CHANNELS = ("CAN/speed", "CAN/steering_angle", "CAN/radar", "IMU/gyro")


class Comma2k19Error(ValueError):
    pass


@dataclass
class Segment:
    """The channels the importer uses, as loaded (times in seconds of device boot time)."""

    speed_t: npt.NDArray[np.float64]
    speed: npt.NDArray[np.float64]
    steer_t: npt.NDArray[np.float64]
    steer_deg: npt.NDArray[np.float64]
    radar_t: npt.NDArray[np.float64]
    radar: npt.NDArray[np.float64]  # (N, 7): forward m, left m, rel speed m/s, nan, nan, address, new flag
    gyro_t: npt.NDArray[np.float64]
    gyro: npt.NDArray[np.float64]  # (N, 3) rad/s about [forward, right, down]


# the value columns of each channel: (N,) or (N, 1) for one, (N, k) for k
_COLUMNS = {"CAN/speed": 1, "CAN/steering_angle": 1, "CAN/radar": 7, "IMU/gyro": 3}


def _load_npy(path: Path) -> np.ndarray:
    try:
        # allow_pickle=False: these are plain numeric arrays; never execute code from a dataset.
        array = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise
    except Exception as exc:  # numpy raises ValueError, EOFError, OSError, SyntaxError... for a damaged .npy
        raise Comma2k19Error(f"{path}: not a readable .npy array ({type(exc).__name__}: {exc})") from None
    if not isinstance(array, np.ndarray) or array.dtype.kind not in "iuf":
        raise Comma2k19Error(f"{path}: holds {getattr(array, 'dtype', type(array).__name__)}, not numbers")
    return array


def load_segment(directory: Path) -> Segment:
    arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for channel in _CHANNELS:
        folder = directory / "processed_log" / channel
        try:
            t = _load_npy(folder / "t")
            value = _load_npy(folder / "value")
        except FileNotFoundError as exc:
            raise Comma2k19Error(f"{directory}: not a comma2k19 segment: missing {exc.filename}") from exc
        columns = _COLUMNS[channel]
        shape_ok = value.shape[1:] in ((), (1,)) if columns == 1 else value.shape[1:] == (columns,)
        if t.ndim != 1 or len(t) < 2 or value.ndim == 0 or len(value) != len(t) or not shape_ok:
            raise Comma2k19Error(
                f"{folder}: t {t.shape} and value {value.shape} do not match (expected t (N,) with N >= 2 and "
                f"value {'(N,) or (N, 1)' if columns == 1 else f'(N, {columns})'})"
            )
        if not np.all(np.isfinite(t)):
            bad = int(np.flatnonzero(~np.isfinite(t))[0])
            raise Comma2k19Error(f"{folder / 't'}: sample {bad} is {t[bad]}, not a finite time")
        order = np.argsort(t, kind="stable")  # the channels are sorted already; be robust anyway
        arrays[channel] = (t[order].astype(np.float64), value[order].astype(np.float64))
    speed_t, speed = arrays["CAN/speed"]
    repeated = np.flatnonzero(np.diff(speed_t) <= 0)
    if len(repeated):  # the causal ego_accel needs one time per speed sample
        raise Comma2k19Error(
            f"{directory / 'processed_log' / 'CAN' / 'speed' / 't'}: time {speed_t[repeated[0]]!r} s appears twice; "
            f"the speed samples' times must strictly increase"
        )
    return Segment(
        speed_t,
        speed.reshape(len(speed_t), -1)[:, 0],
        *arrays["CAN/steering_angle"],
        *arrays["CAN/radar"],
        *arrays["IMU/gyro"],
    )


def latest_index(sample_t: npt.NDArray[np.float64], grid: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """Index of the latest sample at or before each grid time (the grid starts after the first sample)."""
    return np.searchsorted(sample_t, grid, side="right") - 1


def window_mean(
    sample_t: npt.NDArray[np.float64], value: npt.NDArray[np.float64], grid: npt.NDArray[np.float64], length_s: float
) -> npt.NDArray[np.float64]:
    """Mean of the samples in (g - length_s, g]; the latest sample when the window is empty."""
    sums = np.concatenate(([0.0], np.cumsum(value)))
    lo = np.searchsorted(sample_t, grid - length_s, side="right")
    hi = np.searchsorted(sample_t, grid, side="right")
    n = hi - lo
    latest = value[np.maximum(hi - 1, 0)]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, (sums[hi] - sums[lo]) / np.maximum(n, 1), latest)


def ego_accel_from_speed(seg: Segment, grid: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """`action_labels.backward_accel` of the CAN speed samples, the latest at or before each grid time
    (the samples before the grid's start give the first grid times a full window).

    Why the CAN speed and not the IMU's forward accelerometer: on this segment the accelerometer
    agrees in shape (correlation 0.85 with the speed's slope) but reads -0.6 m/s^2 on average while
    the car speeds up from 8 to 20 m/s: the windshield mount's pitch and the road grade leak gravity
    into the forward axis. Uncorrected, that bias alone would turn "keep" into "brake"; the speed
    slope has no such bias and is what the action labels are measured with too."""
    return backward_accel(seg.speed_t, seg.speed)[latest_index(seg.speed_t, grid)]


@dataclass
class _Track:
    last_t: float
    distance: float
    left: float
    rel_speed: float
    in_lane_since: float | None


def select_leads(seg: Segment, grid: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """(len(grid), 3): lead_present, lead_distance, lead_rel_speed, causal (tracks up to each grid time)."""
    out = np.empty((len(grid), 3))
    tracks: dict[int, _Track] = {}
    rows = _radar_rows(seg)
    pending = next(rows, None)
    current: int | None = None
    for k, now in enumerate(grid):
        while pending is not None and pending[0] <= now:
            _update_track(tracks, *pending)
            pending = next(rows, None)
        confirmed = {
            address: track
            for address, track in tracks.items()
            if track.in_lane_since is not None
            and now - track.last_t <= TRACK_STALE_S
            and now - track.in_lane_since >= LEAD_CONFIRM_S
        }
        if not confirmed:
            current = None
            out[k] = (0.0, SENSOR_RANGE_M, 0.0)
            continue
        nearest = min(confirmed, key=lambda a: confirmed[a].distance)
        if current not in confirmed or confirmed[nearest].distance < confirmed[current].distance - LEAD_SWITCH_MARGIN_M:
            current = nearest
        lead = confirmed[current]
        out[k] = (1.0, lead.distance, lead.rel_speed)
    return out


def _radar_rows(seg: Segment) -> Iterator[tuple[float, int, bool, float, float, float]]:
    for t, row in zip(seg.radar_t, seg.radar):
        distance, left, rel_speed = row[0], row[1], row[2]
        if np.isfinite(distance) and np.isfinite(left) and np.isfinite(rel_speed):
            yield float(t), int(row[5]), bool(row[6] == 1), float(distance), float(left), float(rel_speed)


def _update_track(
    tracks: dict[int, _Track], t: float, address: int, new_track: bool, distance: float, left: float, rel_speed: float
) -> None:
    track = tracks.get(address)
    if track is None or new_track or t - track.last_t > TRACK_STALE_S:
        # A new object on this address: it has to earn its place in the lane from scratch.
        track = tracks[address] = _Track(t, distance, left, rel_speed, None)
    track.last_t, track.distance, track.left, track.rel_speed = t, distance, left, rel_speed
    within_range = 0.0 < distance <= SENSOR_RANGE_M
    if track.in_lane_since is None:
        if abs(left) < LEAD_ENTER_M and within_range:
            track.in_lane_since = t
    elif abs(left) >= LEAD_EXIT_M or not within_range:
        track.in_lane_since = None


def route_name(directory: Path) -> str:
    """The route named in the segment's README (`<dongle>|<date>`), else the folder's name."""
    readme = directory / "README.md"
    if readme.is_file():
        found = re.search(r"`([0-9a-f]{16}\|[0-9-]+--[0-9-]+)`(?:, segment (\d+))?", readme.read_text())
        if found:
            return found.group(1) + (f" segment {found.group(2)}" if found.group(2) else "")
    return directory.name


def _grid(seg: Segment, period_ns: int, directory: Path) -> tuple[float, npt.NDArray[np.int64]]:
    """The first instant every channel has data and the grid's timestamps (ns from it) over their overlap."""
    start = max(seg.speed_t[0], seg.steer_t[0], seg.radar_t[0], seg.gyro_t[0])
    end = min(seg.speed_t[-1], seg.steer_t[-1], seg.radar_t[-1], seg.gyro_t[-1])
    count = int((end - start) * 1e9 // period_ns) + 1
    if count < 2:
        raise Comma2k19Error(f"{directory}: the channels overlap for less than one grid period")
    return start, np.arange(count, dtype=np.int64) * period_ns


def _features(
    seg: Segment, grid: npt.NDArray[np.float64]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """The feature rows at the grid times (NaN where this data has nothing), the leads and the speed."""
    speed = seg.speed[latest_index(seg.speed_t, grid)]
    yaw_rate = -window_mean(seg.gyro_t, seg.gyro[:, 2], grid, YAW_WINDOW_S)  # about "down" -> + = left
    features = np.empty((len(grid), N_FEATURES), dtype=np.float64)
    features[:, FEATURE_INDEX["ego_speed"]] = speed
    features[:, FEATURE_INDEX["ego_accel"]] = ego_accel_from_speed(seg, grid)
    leads = select_leads(seg, grid)
    for column, name in enumerate(("lead_present", "lead_distance", "lead_rel_speed")):
        features[:, FEATURE_INDEX[name]] = leads[:, column]
    features[:, FEATURE_INDEX["yaw_rate"]] = yaw_rate
    features[:, FEATURE_INDEX["road_curvature"]] = yaw_rate / np.maximum(speed, 1.0)  # kinematic: r = v * kappa
    measured = [FEATURE_INDEX[n] for n in MEASURED]
    missing = [i for i in range(N_FEATURES) if i not in measured]
    features[:, missing] = np.nan  # not in this data: the sensor profile says so, nothing is invented
    return features, leads, speed


def _details(route: str, start: float, rate_hz: float) -> dict[str, str]:
    """The header's details: where the drive comes from and how each measured column was made."""
    return {
        "dataset": "comma2k19 (MIT licence, arXiv:1812.05752)",
        "route": route,
        "boot_time_of_t0_s": f"{start:.6f}",
        "rate_hz": f"{rate_hz:g}",
        "ego_speed": "CAN speed, latest sample at or before each grid time",
        "ego_accel": f"backward_accel: slope of the CAN speed over the previous {ACCEL_WINDOW_S} s, latest "
        "sample at or before each grid time (the IMU forward axis carries a -0.6 m/s^2 gravity bias "
        "from mount pitch and grade)",
        "lead": f"nearest radar track with |left| < {LEAD_ENTER_M} m (leaves at >= {LEAD_EXIT_M} m), "
        f"in lane for {LEAD_CONFIRM_S} s, reported within {TRACK_STALE_S} s, range <= {SENSOR_RANGE_M} m",
        "yaw_rate": f"-gyro[down], mean over the previous {YAW_WINDOW_S} s",
        "road_curvature": "yaw_rate / ego_speed (no lane model in this data)",
        "actual_action": f"lookahead_labels of ego_speed: band of (v(t + {LOOKAHEAD_S} s) - v(t)) / "
        f"{LOOKAHEAD_S} s; controls[accel] = that look-ahead acceleration",
        ACTUAL_CONTROLS_DETAIL: "look-ahead acceleration label made from the speed profile, not a command; "
        "steer: the steering wheel angle at the observation",
        "missing": "lane_offset, heading_error and the neighbour lanes are not in this data: NaN",
        "actual_steer": f"steering wheel angle / {STEERING_RATIO} (RAV4 steering ratio), radians, + = left",
    }


def _observations(
    timestamps_ns: npt.NDArray[np.int64],
    features: npt.NDArray[np.float64],
    actions: npt.NDArray[np.int64],
    label_accel: npt.NDArray[np.float64],
    steer: npt.NDArray[np.float64],
) -> Iterator[pb.Observation]:
    feats32 = features.astype(np.float32)
    for i in range(len(timestamps_ns)):
        yield pb.Observation(
            seq=i + 1,
            timestamp_ns=int(timestamps_ns[i]),
            features=feats32[i].tolist(),
            actual=pb.ActualAction(action_index=int(actions[i]), controls=[float(label_accel[i]), float(steer[i])]),
        )


def import_comma2k19(
    directory: str | Path,
    out_path: str | Path,
    rate_hz: float = 100.0,
    session_id: str | None = None,
    start_time_unix_ns: int | None = None,
) -> ImportReport:
    """Convert a comma2k19 processed-log segment folder into a dualloop log at `out_path`.

    `start_time_unix_ns` goes into the header (default: now); fix it to make the output byte-identical.
    """
    directory, out_path = Path(directory), Path(out_path)
    refuse_overwriting_inputs([out_path], [directory], Comma2k19Error)
    if rate_hz <= 0:
        raise Comma2k19Error(f"rate_hz must be positive, not {rate_hz}")
    seg = load_segment(directory)
    period_ns = round(1e9 / rate_hz)
    start, timestamps_ns = _grid(seg, period_ns, directory)
    grid = start + timestamps_ns / 1e9
    features, leads, speed = _features(seg, grid)

    actions, label_accel = lookahead_labels(timestamps_ns / 1e9, speed)
    steer = np.deg2rad(seg.steer_deg[latest_index(seg.steer_t, grid)]) / STEERING_RATIO
    # backward_accel is NaN only where the speed has no past yet: the first grid times.
    first = int(np.argmax(np.isfinite(features[:, FEATURE_INDEX["ego_accel"]])))
    timestamps_ns, actions = timestamps_ns[first:], actions[first:]
    features, leads, label_accel, steer = features[first:], leads[first:], label_accel[first:], steer[first:]
    if not np.all(np.isfinite(features[:, [FEATURE_INDEX[n] for n in MEASURED]])):
        raise Comma2k19Error(f"{directory}: non-finite feature values after resampling")

    route = route_name(directory)
    header = imported_header(
        session_id=session_id or f"comma2k19-{directory.name}",
        source=f"comma2k19 import of {route}",
        measured=[n for n in FEATURE_NAMES if n in MEASURED],
        observation_period_ns=period_ns,
        start_time_unix_ns=start_time_unix_ns,
        details=_details(route, start, rate_hz),
    )
    write_log(out_path, header, _observations(timestamps_ns, features, actions, label_accel, steer))
    return ImportReport(
        source=header.source,
        out_path=out_path,
        observations=len(timestamps_ns),
        duration_s=float(timestamps_ns[-1] - timestamps_ns[0]) / 1e9,
        rate_hz=rate_hz,
        lead_present_fraction=float(leads[:, 0].mean()),
        label_counts=count_labels(actions),
        measured_features=list(header.measured_features),
        filled_features=[],
        session_id=header.session_id,
    )
