"""Import a ROS 2 bag recorded in MCAP as a dualloop log, through a mapping file (extra `rosbag2`).

The mapping file (YAML) says which topic and field gives which feature, in which unit:

    rate_hz: 20                 # the output's sample rate
    max_age_s: 0.5              # an older value is missing at a sample (NaN), never held longer
    features:
      ego_speed:     {topic: /odom, field: twist.twist.linear.x, unit: m/s}
      ego_accel:     {topic: /imu, field: linear_acceleration.x}
      lead_present:  {topic: /radar/lead_range, field: range, transform: present}
      lead_distance: {topic: /radar/lead_range, field: range}
      # or from an object list: the track nearest ahead in the ego lane (ObjectSelect)
      lead_rel_speed: {topic: /radar/tracks, field: velocity.x,
                       select: {array: tracks, ahead: position.x, lateral: position.y}}

The bag is an .mcap file or a bag folder (metadata.yaml and its split .mcap files, read in order).
Messages are decoded with mcap-ros2-support (the bag's own `ros2msg` schemas; no ROS install). Time is
each message's MCAP log_time (the recorder's receive time). The output samples every feature at
`rate_hz` from the first to the last ego_speed message: the newest message of its topic at or before
the sample, if it is at most max_age_s old, else NaN (sample-and-hold, no interpolation). The mapped
features are the sensor profile (measured_features); every other feature is NaN, never invented.
Labels, ego_accel when unmapped and the header follow docs/importers.md as the CSV importer does, and
so do the value checks (plausibility.py). A rate_hz more than twice the ego_speed topic's message rate
is refused (held speeds make junk labels); another topic that slow gets a warning. A key given twice in
the mapping file is refused.
"""

from __future__ import annotations

import math
import re
from collections.abc import Hashable, Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dualloop.controller.contract.config_files import problem_text
from dualloop.controller.extras import require
from dualloop.controller.logs.following import imported_header
from dualloop.controller.logs.format import ACTUAL_CONTROLS_DETAIL
from dualloop.controller.logs.import_csv import COLUMN_UNITS, UNITS
from dualloop.controller.logs.import_report import ImportReport, count_labels
from dualloop.controller.logs.logfile import write_log
from dualloop.controller.logs.outputs import refuse_overwriting_inputs
from dualloop.controller.logs.plausibility import RATE_MISMATCH, implausible_speed, out_of_range
from dualloop.executor.action_labels import ACCEL_WINDOW_S, LOOKAHEAD_S, backward_accel, lookahead_labels
from dualloop.sim.schema import (
    FEATURE_INDEX,
    FEATURE_NAMES,
    GAP_FEATURES,
    N_FEATURES,
    SENSOR_RANGE_M,
)
from dualloop.v2 import controller_pb2 as pb

_PATH_PART = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)((?:\[\d+\])*)$")
_INDEX = re.compile(r"\[(\d+)\]")
_DIGITS = re.compile(r"(\d+)")
_MERGE_TAG = "tag:yaml.org,2002:merge"


class Rosbag2ImportError(ValueError):
    pass


class ObjectSelect(BaseModel):
    """Pick the lead from an object list (a radar's tracks): the element nearest ahead in the ego lane."""

    model_config = ConfigDict(extra="forbid")

    array: str = Field(min_length=1)  # path to the list in the message: tracks, objects
    ahead: str = Field(min_length=1)  # path in an element to its distance ahead, m (+ = ahead): position.x
    lateral: str | None = None  # path in an element to its lateral offset, m: position.y
    max_lateral_m: float = Field(default=1.75, gt=0)  # |lateral| at most this is in the ego lane

    @field_validator("array", "ahead", "lateral")
    @classmethod
    def _paths(cls, value: str | None) -> str | None:
        return None if value is None else _check_path(value)


def _check_path(value: str) -> str:
    for part in value.split("."):
        if not _PATH_PART.match(part):
            raise ValueError(f"{value!r} is not a field path like twist.twist.linear.x or objects[0].range")
    return value


class FeatureSource(BaseModel):
    """Where one feature comes from."""

    model_config = ConfigDict(extra="forbid")

    topic: str = Field(min_length=1)
    # dotted path into the message, with [i] for array elements: twist.twist.linear.x, objects[0].pose.x
    field: str = Field(min_length=1)
    # the field's unit (docs/importers.md lists them); default: the feature's own (sim.schema.FEATURES)
    unit: str | None = None
    # value: the field converted to the feature's unit. present: 1 where the field is a finite number,
    # 0 where it is +-inf (REP 117: a range sensor's "nothing detected"), for the *_present flags.
    transform: Literal["value", "present"] = "value"
    # added after the unit conversion (value only): e.g. a radar's distance to the object's centre
    # minus half a car length for the bumper-to-bumper lead_distance
    offset: float = 0.0
    # with select, `field` is a path inside the selected element of an object list; no element in the
    # ego lane reads as the schema's "none": gaps the sensor range, rel speeds 0, flags 0 (else NaN)
    select: ObjectSelect | None = None

    @field_validator("field")
    @classmethod
    def _path(cls, value: str) -> str:
        return _check_path(value)


class Rosbag2Map(BaseModel):
    """The mapping file."""

    model_config = ConfigDict(extra="forbid")

    rate_hz: float = Field(gt=0, le=1000)
    max_age_s: float = Field(default=0.5, gt=0)
    session_id: str | None = None
    features: dict[str, FeatureSource]

    @field_validator("features")
    @classmethod
    def _known(cls, features: dict[str, FeatureSource]) -> dict[str, FeatureSource]:
        for name, src in features.items():
            if name not in FEATURE_INDEX:
                raise ValueError(f"unknown feature {name!r}; features: {', '.join(FEATURE_NAMES)}")
            if src.transform == "present" and COLUMN_UNITS[name] != "bool":
                raise ValueError(f"{name}: transform 'present' gives a 0/1 flag; {name} is in {COLUMN_UNITS[name]}")
            if src.unit is not None and src.transform == "value":
                target = COLUMN_UNITS[name]
                if src.unit not in UNITS or UNITS[src.unit][0] != target:
                    choices = [u for u, (base, _) in UNITS.items() if base == target]
                    raise ValueError(
                        f"{name}: unit {src.unit!r} cannot be converted to {target} (accepted: {', '.join(choices)})"
                    )
        return features

    @model_validator(mode="after")
    def _ego_speed(self) -> Rosbag2Map:
        if "ego_speed" not in self.features:
            raise ValueError("features: ego_speed is required (the labels and the time base come from it)")
        return self


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: object, first: yaml.Mark, again: yaml.Mark) -> None:
        where = f"line {again.line + 1}: key {key!r}"
        super().__init__(f"{where} given twice in one mapping (first at line {first.line + 1})")


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last one silently,
    so a copied line would replace the feature above it). A merge key's (<<) values may be overridden."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: dict[Hashable, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, Hashable):
                continue  # the base class says what is wrong with it
            first = seen.setdefault(key, key_node)
            if first is not key_node:
                raise _DuplicateKey(key, first.start_mark, key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def load_map(path: str | Path) -> Rosbag2Map:
    """Read and check a mapping file; errors name the file and the field (or line)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise Rosbag2ImportError(f"{path}: cannot read the mapping file: {err}") from None
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader
    except _DuplicateKey as err:
        raise Rosbag2ImportError(f"{path}: {err}; YAML would keep only the last: remove one") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise Rosbag2ImportError(f"{path}: {where}not valid YAML ({getattr(err, 'problem', err)})") from None
    if not isinstance(raw, dict):
        raise Rosbag2ImportError(f"{path}: the mapping file must be a YAML mapping with rate_hz and features")
    try:
        return Rosbag2Map.model_validate(raw)
    except ValidationError as err:
        problems = "; ".join(problem_text(e) for e in err.errors())
        raise Rosbag2ImportError(f"{path}: {problems}") from None


def _value(msg: Any, path: str) -> Any:
    """The field at a dotted path; KeyError naming the part that is not there."""
    node = msg
    done: list[str] = []
    for part in path.split("."):
        m = _PATH_PART.match(part)
        assert m is not None  # FeatureSource checked the path
        name = m.group(1)
        if not hasattr(node, name) or isinstance(node, (int, float, str, bytes)):
            have = sorted(getattr(node, "__slots__", None) or [a for a in vars(node) if not a.startswith("_")])
            at = ".".join(done) or "the message"
            raise KeyError(f"no field {name!r} at {at} (it has: {', '.join(have) or 'no fields'})")
        node = getattr(node, name)
        done.append(name)
        for index in _INDEX.findall(m.group(2)):
            i = int(index)
            if not isinstance(node, (list, tuple)) or i >= len(node):
                size = len(node) if isinstance(node, (list, tuple)) else "not an array"
                raise KeyError(f"{'.'.join(done)}[{i}]: out of range ({size})")
            node = node[i]
            done[-1] += f"[{i}]"
    return node


def _natural(path: Path) -> list[object]:
    """Sort key: drive_2.mcap before drive_10.mcap (the recorder numbers its split files)."""
    return [int(p) if p.isdigit() else p for p in _DIGITS.split(path.name)]


def _listed_files(folder: Path, meta: Path) -> list[Path]:
    """The MCAP files metadata.yaml lists in rosbag2_bagfile_information.relative_file_paths, in order."""
    try:
        info = yaml.safe_load(meta.read_text(encoding="utf-8"))["rosbag2_bagfile_information"]
        storage = info.get("storage_identifier") or "mcap"
        listed = [str(p) for p in info.get("relative_file_paths") or []]
    except (OSError, UnicodeDecodeError, yaml.YAMLError, TypeError, KeyError, AttributeError) as err:
        raise Rosbag2ImportError(
            f"{meta}: not a rosbag2 metadata file with rosbag2_bagfile_information ({type(err).__name__}: {err})"
        ) from None
    if storage != "mcap":
        raise Rosbag2ImportError(
            f"{meta}: storage_identifier {storage!r}: only MCAP bags are read (`ros2 bag convert` writes one)"
        )
    files = [folder / p for p in listed]
    for rel, file in zip(listed, files, strict=True):
        if not file.name.endswith(".mcap"):
            raise Rosbag2ImportError(
                f"{meta}: relative_file_paths lists {rel!r}, not an .mcap file (a file-compressed bag: "
                "decompress it, or `ros2 bag convert` it to plain MCAP)"
            )
        if not file.is_file():
            raise Rosbag2ImportError(f"{meta}: relative_file_paths lists {rel!r}, which is not in {folder}")
    return files


def bag_files(bag: Path) -> list[Path]:
    """The MCAP files of a bag, in recording order: the file itself, or a bag folder's (as `ros2 bag
    record` writes it: metadata.yaml and <name>_0.mcap, <name>_1.mcap, ...) as metadata.yaml lists them,
    else its *.mcap files in natural order."""
    if bag.is_file():
        return [bag]
    if not bag.is_dir():
        raise Rosbag2ImportError(f"{bag}: no such file or folder (expected a bag's .mcap file or its folder)")
    meta = bag / "metadata.yaml"
    files = _listed_files(bag, meta) if meta.is_file() else []
    files = files or sorted(bag.glob("*.mcap"), key=_natural)
    if not files:
        raise Rosbag2ImportError(
            f"{bag}: a folder without .mcap files (a ROS 2 bag folder holds metadata.yaml and <name>_0.mcap; "
            "a bag recorded with the sqlite3 storage must be converted: `ros2 bag convert`)"
        )
    return files


def _unreadable(file: Path, err: Exception) -> Rosbag2ImportError:
    """A bag mcap cannot read, and the way out when the recording was cut (a killed `ros2 bag record`):
    `dualloop recover` rewrites any MCAP file's complete records, a bag's included."""
    return Rosbag2ImportError(
        f"{file}: not a readable ROS 2 MCAP bag ({type(err).__name__}: {err}); if its recording was cut short, "
        f"`dualloop recover {file} {file.with_suffix('.recovered.mcap').name}` rewrites its complete part"
    )


def _bag_topics(files: list[Path], mcap_reader: Any) -> list[str] | None:
    """The topics the files' summaries list; None when one has no summary (a recording cut short)."""
    present: set[str] = set()
    for file in files:
        try:
            with file.open("rb") as f:
                summary = mcap_reader.make_reader(f).get_summary()
        except Exception as err:  # mcap's errors have no common base
            raise _unreadable(file, err) from None
        if summary is None:
            return None
        present |= {c.topic for c in summary.channels.values()}
    return sorted(present)


def _users(mapping: Rosbag2Map, topic: str) -> list[str]:
    """The features mapped from `topic`."""
    return [n for n, s in mapping.features.items() if s.topic == topic]


def _read_bag(bag: Path, mapping: Rosbag2Map, map_path: Path) -> dict[str, tuple[npt.NDArray[np.int64], list[Any]]]:
    """topic -> (log times ns, decoded messages, in time order) of the mapped topics."""
    decoder = require("mcap_ros2.decoder", "`dualloop import rosbag2`", "rosbag2")
    mcap_reader = require("mcap.reader", "`dualloop import rosbag2`", "rosbag2")
    topics = sorted({s.topic for s in mapping.features.values()})
    files = bag_files(bag)
    present = _bag_topics(files, mcap_reader)
    # a bag without a summary section (recording cut short) is checked after reading instead
    missing = [t for t in topics if t not in present] if present is not None else []
    if missing:
        raise Rosbag2ImportError(
            f"{bag}: topic {missing[0]!r} ({map_path}: features.{_users(mapping, missing[0])[0]}.topic) is not in "
            f"the bag; its topics: {', '.join(present or []) or 'none'}"
        )
    out: dict[str, tuple[list[int], list[Any]]] = {t: ([], []) for t in topics}
    for file in files:
        try:
            with file.open("rb") as f:
                reader = mcap_reader.make_reader(f, decoder_factories=[decoder.DecoderFactory()])
                for _, channel, message, decoded in reader.iter_decoded_messages(topics, log_time_order=True):
                    stamps, msgs = out[channel.topic]
                    stamps.append(message.log_time)
                    msgs.append(decoded)
        except Exception as err:  # mcap's and the CDR decoder's errors have no common base
            raise _unreadable(file, err) from None
    result = {}
    for topic, (stamps, msgs) in out.items():
        if not msgs:
            raise Rosbag2ImportError(
                f"{bag}: topic {topic!r} ({map_path}: features.{_users(mapping, topic)[0]}.topic) has no messages "
                "in the bag"
            )
        order = np.argsort(np.asarray(stamps, dtype=np.int64), kind="stable")  # split files in any order
        result[topic] = (np.asarray(stamps, dtype=np.int64)[order], [msgs[i] for i in order])
    return result


def _check_rates(
    bag: Path, map_path: Path, mapping: Rosbag2Map, data: dict[str, tuple[npt.NDArray[np.int64], list[Any]]]
) -> list[str]:
    """Refuse a rate_hz over RATE_MISMATCH times the ego_speed topic's message rate (held speeds are steps
    that the derived ego_accel and the look-ahead labels read as hard accelerations); warn for another
    topic that slow (its values are held over several samples)."""
    warnings = []
    for topic, (stamps, _) in data.items():
        intervals = np.diff(stamps)
        median_ns = float(np.median(intervals)) if len(intervals) else 0.0
        if median_ns <= 0 or 1e9 / median_ns * RATE_MISMATCH >= mapping.rate_hz:
            continue
        users, rate = _users(mapping, topic), 1e9 / median_ns
        what = (
            f"topic {topic!r} ({', '.join(users)}) has a message every {median_ns * 1e-6:g} ms "
            f"({rate:.3g} Hz, the median interval), below half of rate_hz {mapping.rate_hz:g}"
        )
        if "ego_speed" in users:
            raise Rosbag2ImportError(
                f"{bag}: {what} ({map_path}: rate_hz): each speed would be held over {mapping.rate_hz / rate:.0f} "
                "samples, and the derived ego_accel and the labels would read its steps as accelerations; "
                f"set rate_hz to the topic's rate ({rate:.3g}) or lower"
            )
        warnings.append(f"{what}: its values are held over several samples (NaN beyond max_age_s)")
    return warnings


def _series(
    bag: Path, map_path: Path, name: str, src: FeatureSource, stamps: npt.NDArray[np.int64], msgs: list[Any]
) -> npt.NDArray[np.float64]:
    """One feature's values, one per message of its topic, in the feature's unit."""
    out = np.empty(len(msgs))
    none = np.zeros(len(msgs), dtype=bool)  # select found no object in the ego lane
    factor = UNITS[src.unit][1] if src.unit is not None and src.transform == "value" else 1.0
    for k, msg in enumerate(msgs):
        where = f"{bag}: topic {src.topic!r} message {k + 1} ({type(msg).__name__})"
        node = msg
        if src.select is not None:
            node = _select(where, map_path, name, src.select, msg)
            if node is None:
                none[k] = True
                continue
        out[k] = _number(where, map_path, f"features.{name}.field", node, src.field)
    if src.transform == "present":
        return np.where(none, 0.0, np.where(np.isnan(out), np.nan, np.isfinite(out).astype(np.float64)))
    out = out * factor + src.offset
    if name in GAP_FEATURES:
        out[none] = np.inf
    elif name.endswith("rel_speed"):
        out[none] = 0.0
    else:
        out[none] = np.nan
    if name in GAP_FEATURES:  # +inf: nothing within range, which the schema writes as the sensor range
        out = np.where(np.isposinf(out), SENSOR_RANGE_M, np.minimum(out, SENSOR_RANGE_M))
    return np.where(np.isfinite(out), out, np.nan)


def _number(where: str, map_path: Path, key: str, node: Any, path: str) -> float:
    try:
        value = _value(node, path)
    except KeyError as err:
        raise Rosbag2ImportError(f"{where}: {err.args[0]} ({map_path}: {key})") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Rosbag2ImportError(f"{where}: field {path!r} is {type(value).__name__}, not a number ({map_path}: {key})")
    return float(value)


def _select(where: str, map_path: Path, name: str, sel: ObjectSelect, msg: Any) -> Any:
    """The element of the object list nearest ahead within max_lateral_m, None if there is none."""
    key = f"features.{name}.select"
    try:
        items = _value(msg, sel.array)
    except KeyError as err:
        raise Rosbag2ImportError(f"{where}: {err.args[0]} ({map_path}: {key}.array)") from None
    if not isinstance(items, (list, tuple)):
        raise Rosbag2ImportError(
            f"{where}: field {sel.array!r} is {type(items).__name__}, not a list ({map_path}: {key}.array)"
        )
    best, best_ahead = None, math.inf
    for j, item in enumerate(items):
        at = f"{where} {sel.array}[{j}]"
        ahead = _number(at, map_path, f"{key}.ahead", item, sel.ahead)
        if (
            sel.lateral is not None
            and abs(_number(at, map_path, f"{key}.lateral", item, sel.lateral)) > sel.max_lateral_m
        ):
            continue
        if 0.0 < ahead < best_ahead:
            best, best_ahead = item, ahead
    return best


def _sample(
    grid: npt.NDArray[np.int64], stamps: npt.NDArray[np.int64], values: npt.NDArray[np.float64], max_age_ns: int
) -> npt.NDArray[np.float64]:
    """Newest value at or before each grid time, NaN when none or older than max_age_ns."""
    idx = np.searchsorted(stamps, grid, side="right") - 1
    ok = idx >= 0
    safe = np.maximum(idx, 0)
    ok &= grid - stamps[safe] <= max_age_ns
    return np.where(ok, values[safe], np.nan)


def _grid(
    bag: Path, mapping: Rosbag2Map, data: dict[str, tuple[npt.NDArray[np.int64], list[Any]]]
) -> npt.NDArray[np.int64]:
    """The observation times: the mapping's rate over the span of the ego_speed topic."""
    speed_stamps = data[mapping.features["ego_speed"].topic][0]
    if len(speed_stamps) < 2:
        raise Rosbag2ImportError(
            f"{bag}: topic {mapping.features['ego_speed'].topic!r} has {len(speed_stamps)} message(s); "
            "ego_speed needs at least two"
        )
    period_ns = round(1e9 / mapping.rate_hz)
    return np.arange(int(speed_stamps[0]), int(speed_stamps[-1]) + 1, period_ns, dtype=np.int64)


def _resample(
    bag: Path,
    map_path: Path,
    mapping: Rosbag2Map,
    data: dict[str, tuple[npt.NDArray[np.int64], list[Any]]],
    grid: npt.NDArray[np.int64],
    details: dict[str, str],
) -> npt.NDArray[np.float64]:
    """Each mapped feature sampled and held onto `grid` (NaN where none or too old); notes its source in `details`."""
    max_age_ns = round(mapping.max_age_s * 1e9)
    features = np.full((len(grid), N_FEATURES), np.nan)
    for name, src in mapping.features.items():
        stamps, msgs = data[src.topic]
        order = np.argsort(stamps, kind="stable")
        values = _series(bag, map_path, name, src, stamps, msgs)[order]
        features[:, FEATURE_INDEX[name]] = _sample(grid, stamps[order], values, max_age_ns)
        unit = src.unit or COLUMN_UNITS[name]
        details[name] = f"{src.topic} {src.field}" + (" (finite -> 1)" if src.transform == "present" else f" [{unit}]")
    return features


def _observations(
    grid: npt.NDArray[np.int64],
    rows: npt.NDArray[np.intp],
    features: npt.NDArray[np.float64],
    actions: npt.NDArray[np.int64],
    accel: npt.NDArray[np.float64],
) -> Iterator[pb.Observation]:
    feats32 = features.astype(np.float32)
    for seq, i in enumerate(rows, start=1):
        obs = pb.Observation(seq=seq, timestamp_ns=int(grid[i]), features=feats32[i].tolist())
        if actions[i] >= 0 or math.isfinite(accel[i]):
            controls = [float(accel[i]), math.nan] if math.isfinite(accel[i]) else []
            obs.actual.CopyFrom(pb.ActualAction(action_index=int(actions[i]), controls=controls))
        yield obs


def _when(grid: npt.NDArray[np.int64], i: int) -> str:
    """Where sample i is: seconds from the first sample (the first ego_speed message) and its log_time."""
    ns = int(grid[i])
    return f"{(ns - int(grid[0])) / 1e9:.2f} s, log_time {ns // 10**9}.{ns % 10**9:09d}"


def _check_values(
    bag: Path, map_path: Path, mapping: Rosbag2Map, grid: npt.NDArray[np.int64], features: npt.NDArray[np.float64]
) -> list[str]:
    """The CSV importer's value checks (plausibility.py) on the samples: an ego_speed in m/s that looks like
    km/h is refused; values out of range are kept, with a warning naming the first sample's time."""
    speed = mapping.features["ego_speed"]
    if speed.unit in (None, "m/s"):
        wrong = implausible_speed(features[:, FEATURE_INDEX["ego_speed"]])
        if wrong is not None:
            peak, what = wrong
            raise Rosbag2ImportError(
                f"{bag}: ego_speed ({speed.topic} {speed.field}) at {_when(grid, peak)}: {what}; "
                f"declare unit: km/h ({map_path}: features.ego_speed.unit)"
            )
    out = []
    for name in FEATURE_NAMES:
        src = mapping.features.get(name)
        bad = out_of_range(name, features[:, FEATURE_INDEX[name]]) if src is not None else None
        if src is not None and bad is not None:
            out.append(bad.text(f"feature '{name}' ({src.topic} {src.field})", "sample(s)", _when(grid, bad.first)))
    return out


def _kept_samples(
    bag: Path,
    mapping: Rosbag2Map,
    t: npt.NDArray[np.float64],
    features: npt.NDArray[np.float64],
    details: dict[str, str],
    warnings: list[str],
) -> tuple[npt.NDArray[np.bool_], list[str]]:
    """The samples to write (ego_speed known, ego_accel derivable when unmapped) and the measured features;
    derives ego_accel in `features` when the mapping has none."""
    speed = features[:, FEATURE_INDEX["ego_speed"]]
    keep = np.isfinite(speed)
    if not keep.all():
        warnings.append(f"left out {np.count_nonzero(~keep)} sample(s) with no ego_speed within {mapping.max_age_s} s")
    measured = [n for n in FEATURE_NAMES if n in mapping.features]
    if "ego_accel" not in mapping.features:
        features[keep, FEATURE_INDEX["ego_accel"]] = backward_accel(t[keep], speed[keep])
        details["ego_accel"] = f"backward slope of ego_speed over {ACCEL_WINDOW_S} s (action_labels.backward_accel)"
        measured = [n for n in FEATURE_NAMES if n in mapping.features or n == "ego_accel"]
        derived = np.isfinite(features[:, FEATURE_INDEX["ego_accel"]])
        if np.count_nonzero(keep & ~derived):
            warnings.append(
                f"left out {np.count_nonzero(keep & ~derived)} sample(s) where ego_accel has no past to be derived from"
            )
        keep &= derived
    if not keep.any():
        raise Rosbag2ImportError(f"{bag}: no sample has ego_speed (and a derivable ego_accel); nothing to import")
    return keep, measured


def import_rosbag2(
    bag: str | Path, map_file: str | Path, out_path: str | Path, *, start_time_unix_ns: int | None = None
) -> ImportReport:
    """Convert a ROS 2 MCAP bag (its .mcap file or its folder) into a dualloop log at `out_path` as the
    mapping file says."""
    bag, map_path, out_path = Path(bag), Path(map_file), Path(out_path)
    refuse_overwriting_inputs([out_path], [bag, map_path], Rosbag2ImportError)
    mapping = load_map(map_path)
    data = _read_bag(bag, mapping, map_path)
    rate_warnings = _check_rates(bag, map_path, mapping, data)
    grid = _grid(bag, mapping, data)
    period_ns = round(1e9 / mapping.rate_hz)
    details = {"file": str(bag), "map": str(map_path), "time": "MCAP log_time (the recorder's receive time)"}
    features = _resample(bag, map_path, mapping, data, grid, details)
    warnings = rate_warnings + _check_values(bag, map_path, mapping, grid, features)
    t = (grid - grid[0]) / 1e9
    speed = features[:, FEATURE_INDEX["ego_speed"]]
    keep, measured = _kept_samples(bag, mapping, t, features, details, warnings)
    rows = np.flatnonzero(keep)
    actions = np.full(len(grid), -1, dtype=np.int64)
    accel = np.full(len(grid), np.nan)
    actions[rows], accel[rows] = lookahead_labels(t[rows], speed[rows])
    details["actual_action"] = (
        f"lookahead_labels of ego_speed: band of (v(t + {LOOKAHEAD_S} s) - v(t)) / {LOOKAHEAD_S} s; "
        "controls[accel] = that look-ahead acceleration, steer NaN"
    )
    details[ACTUAL_CONTROLS_DETAIL] = "look-ahead acceleration label made from the speed profile, not a command"
    details["rate"] = (
        f"{mapping.rate_hz:g} Hz, the mapping file's rate_hz (sample-and-hold, max age {mapping.max_age_s:g} s)"
    )
    if warnings:
        details["warnings"] = "; ".join(warnings)
    header = imported_header(
        session_id=mapping.session_id or f"rosbag2-{bag.resolve().name if bag.is_dir() else bag.stem}",
        source=f"rosbag2 import of {bag}",
        measured=measured,
        observation_period_ns=period_ns,
        start_time_unix_ns=start_time_unix_ns,
        details=details,
    )
    write_log(out_path, header, _observations(grid, rows, features, actions, accel))
    lead = features[rows, FEATURE_INDEX["lead_present"]]
    return ImportReport(
        source=header.source,
        out_path=out_path,
        observations=len(rows),
        duration_s=float(t[rows[-1]] - t[rows[0]]),
        rate_hz=mapping.rate_hz,
        lead_present_fraction=float(np.mean(lead >= 0.5)) if "lead_present" in measured else 0.0,
        label_counts=count_labels(actions[rows]),
        measured_features=measured,
        filled_features=[],
        warnings=warnings,
        session_id=header.session_id,
    )
