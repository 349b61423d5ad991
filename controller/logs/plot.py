"""The per-session plot channel: one decoded message per tick that Foxglove plots by field name.

The log's data topics (`/dualloop/snapshot`, `/dualloop/observation`, format.py) carry features and
controls as positional `repeated float`, share one topic name across sessions and, in LOCKSTEP,
carry sim time as log_time (1970 in a viewer). Beside them every recorded session gets
`/dualloop/<session>/plot`: a protobuf message whose schema is built from the session header's
feature, control, action and check names, so a plot path reads
`/dualloop/cut_in-900001/plot.features.ego_speed`; actions and the safety state are enums (a state
transitions panel shows their names), reasons a bool per reason code.
The schema is embedded in the file like every other (a FileDescriptorSet), so Foxglove and
`mcap_protobuf`'s decoder decode it without dualloop; dualloop's own readers skip the topic.

log_time of a plot message (docs/foxglove.md):
- REALTIME: the wall clock (Unix ns) when the recorder was handed the snapshot;
- LOCKSTEP: the session's tick time plus the channel's `log_time_offset_ns`, which is the header's
  start_time_unix_ns (the wall clock when the recording, or the recording a replay replays, began),
  or 0 when tick times are already Unix times (after 2001-09-09). A log without a start time
  (synthetic test logs) keeps its own times.

The schema is proto2 so that every field is written, zeros included (a plot shows a zero speed, not
a gap); values that do not exist are NaN (TTC when nothing closes in, an unscored tick's proposal).
The recorder (live sessions, `make demo`) always writes the topic (config `record_plots`); a replay
when asked (`dualloop replay --foxglove`), as it adds about a quarter to a replay's CPU.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

from dualloop.executor.checks import NAMES as CHECK_NAMES
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import log_pb2

PLOT_SUFFIX = "/plot"
# Features the plot's summary fields read, when the card has them (names, never the sim's schema).
SPEED, ACCEL, GAP, CLOSING = "ego_speed", "ego_accel", "lead_distance", "lead_rel_speed"
# Tick times at or beyond this are Unix times already (2001-09-09): no offset.
UNIX_TIME_FLOOR_NS = 10**18

_SAFE = re.compile(r"[^A-Za-z0-9_\-]")
_IDENT = re.compile(r"[^A-Za-z0-9_]")
_CHECKS = sorted((int(kind), name) for kind, name in CHECK_NAMES.items())

# The plot message's scalar fields: (name, number, type). Every field has a fixed width (fixed64
# for counters, 1-byte enums and bools, floats), and every one is written on every tick, so a
# session's plot messages all have one layout and a replay encodes them as one numpy record array
# (controller/replay/plot_batch.py). Sub-messages and enums follow in _build.
_F = descriptor_pb2.FieldDescriptorProto
_SCALARS: tuple[tuple[str, int, int], ...] = (
    ("session_id", 1, _F.TYPE_STRING),
    ("tick", 2, _F.TYPE_FIXED64),
    ("time_s", 3, _F.TYPE_DOUBLE),  # the tick's scheduled time on the session's clock
    ("overridden", 10, _F.TYPE_BOOL),  # the applied action is not the proposed one
    ("confidence", 11, _F.TYPE_FLOAT),
    ("margin", 12, _F.TYPE_FLOAT),
    ("gate_score", 13, _F.TYPE_FLOAT),
    ("gate_threshold", 14, _F.TYPE_FLOAT),
    ("gate_veto", 15, _F.TYPE_BOOL),
    ("observation_age_ms", 20, _F.TYPE_DOUBLE),
    ("plan_age_ms", 21, _F.TYPE_DOUBLE),
    ("held", 22, _F.TYPE_BOOL),
    ("observation_seq", 23, _F.TYPE_FIXED64),
    ("speed", 24, _F.TYPE_FLOAT),
    ("accel", 25, _F.TYPE_FLOAT),
    ("gap", 26, _F.TYPE_FLOAT),
    ("ttc_s", 27, _F.TYPE_FLOAT),  # gap / closing speed; NaN (no point in a plot) when not closing in
)
SAFETY_FIELD, REASONS_FIELD, PROPOSED_ACTION_FIELD, APPLIED_ACTION_FIELD = 4, 5, 6, 7
PROPOSED_FIELD, APPLIED_FIELD, CHECKS_FIELD, FEATURES_FIELD = 16, 17, 18, 19
NOT_SCORED = "NOT_SCORED"  # the action enum's 0: a tick the model could not score
# Without action names (a header that has none) the enum names the indices.
_UNNAMED_ACTIONS = tuple(f"action_{i}" for i in range(16))
REASONS = {v.number: v.name.removeprefix("REASON_CODE_") for v in pb.ReasonCode.DESCRIPTOR.values if v.number}
_REASON_ITEMS = sorted(REASONS.items())
_NO_REASONS = {name: False for _, name in _REASON_ITEMS}


ESCAPED_SEGMENT = "escaped"  # /dualloop/escaped/<encoded id>/plot: ids with other characters


def plot_topic(session_id: str) -> str:
    """`/dualloop/<session>/plot` for an id of letters, digits, `_` and `-`. Any other id (dots,
    slashes, spaces a message path would trip on; or empty) gets `/dualloop/escaped/<encoded>/plot`:
    each UTF-8 byte other than a letter, digit or `-` written `_xx` (hex), `_` itself included, and
    the empty id `_`. Decodable, so distinct ids never share a topic (`x.y` is `escaped/x_2ey`, `x/y`
    `escaped/x_2fy`, `x y` `escaped/x_20y`); the extra segment keeps them apart from plain ids."""
    if session_id and not _SAFE.search(session_id):
        return f"/dualloop/{session_id}{PLOT_SUFFIX}"
    encoded = "".join(
        chr(b) if chr(b) in _PLAIN_BYTES else f"_{b:02x}" for b in session_id.encode("utf-8", "surrogatepass")
    )
    return f"/dualloop/{ESCAPED_SEGMENT}/{encoded or '_'}{PLOT_SUFFIX}"


_PLAIN_BYTES = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-")


def is_plot_topic(topic: str) -> bool:
    if not (topic.startswith("/dualloop/") and topic.endswith(PLOT_SUFFIX)):
        return False
    slashes = topic.count("/")
    return slashes == 3 or (slashes == 4 and topic.startswith(f"/dualloop/{ESCAPED_SEGMENT}/"))


def field_names(names: Sequence[str]) -> list[str]:
    """Protobuf field names for `names`: other characters become `_`, a leading digit gets `f_`,
    repeats get `_2`, `_3` ..."""
    out: list[str] = []
    seen: set[str] = set()
    for raw in names:
        name = _IDENT.sub("_", raw) or "unnamed"
        if name[0].isdigit():
            name = "f_" + name
        base, k = name, 2
        while name in seen:
            name, k = f"{base}_{k}", k + 1
        seen.add(name)
        out.append(name)
    return out


def log_time_offset_ns(header: log_pb2.SessionHeader, first_tick_ns: int) -> int:
    """What a LOCKSTEP session's plot log_time adds to its tick times (module docstring)."""
    if header.clock == pb.CLOCK_MODE_REALTIME or first_tick_ns >= UNIX_TIME_FLOOR_NS:
        return 0
    return header.start_time_unix_ns


def channel_metadata(header: log_pb2.SessionHeader, offset_ns: int) -> dict[str, str]:
    if header.clock == pb.CLOCK_MODE_REALTIME:
        return {"session_id": header.session_id, "log_time": "wall clock (Unix ns) when recorded"}
    return {
        "session_id": header.session_id,
        "log_time": "tick time + log_time_offset_ns",
        "log_time_offset_ns": str(offset_ns),
    }


@dataclass
class PlotSchema:
    """The plot message of one feature / control / action naming: its class and embedded schema."""

    feature_names: tuple[str, ...]
    control_names: tuple[str, ...]
    action_names: tuple[str, ...] = ()
    name: str = ""
    data: bytes = b""
    message_type: type[Message] = field(init=False, repr=False)
    features: list[str] = field(init=False)  # the field names
    controls: list[str] = field(init=False)
    actions: list[str] = field(init=False)  # the action enum's value names, NOT_SCORED first
    speed: int | None = field(init=False)  # feature index of each summary field
    accel: int | None = field(init=False)
    gap: int | None = field(init=False)
    closing: int | None = field(init=False)

    def __post_init__(self) -> None:
        self.features = field_names(self.feature_names)
        self.controls = field_names(self.control_names)
        self.actions = field_names((NOT_SCORED, *(self.action_names or _UNNAMED_ACTIONS)))
        if len(self.actions) > 127:
            raise ValueError(f"{len(self.actions) - 1} actions: the plot's action enum holds at most 126")
        index = {n: i for i, n in enumerate(self.feature_names)}
        self.speed, self.accel = index.get(SPEED), index.get(ACCEL)
        self.gap, self.closing = index.get(GAP), index.get(CLOSING)
        names = (*self.feature_names, "|", *self.control_names, "|", *self.action_names)
        digest = hashlib.sha256("\0".join(names).encode()).hexdigest()
        package = f"dualloop.plot.s{digest[:12]}"
        fdp = _build(package, self.features, self.controls, self.actions)
        self.name = f"{package}.Plot"
        self.data = descriptor_pb2.FileDescriptorSet(file=[fdp]).SerializeToString(deterministic=True)
        pool = descriptor_pool.DescriptorPool()
        pool.Add(fdp)
        self.message_type = message_factory.GetMessageClass(pool.FindMessageTypeByName(self.name))

    @classmethod
    def for_header(cls, header: log_pb2.SessionHeader) -> PlotSchema:
        return cls(tuple(header.feature_names), tuple(header.control_names), tuple(header.action_names))

    def from_snapshot(self, snap: pb.DecisionSnapshot, observation: pb.Observation | None) -> Message:
        """The plot of one recorded snapshot; `observation` is the one it used (None: unknown,
        and the features are left out). Built with one constructor call: setting the fields one by
        one cost ~7x more (the recorder's thread makes one per snapshot)."""
        proposal = snap.proposed
        proposed, applied = proposal.action, snap.applied
        gate = snap.gate
        codes = snap.reasons
        proposed_controls = list(proposed.controls)
        kw: dict[str, object] = {
            "session_id": snap.session_id,
            "tick": snap.tick,
            "time_s": snap.scheduled_time_ns / 1e9,
            "safety_state": snap.safety_state,
            # most ticks have no reason: one shared dict (the constructor only reads it)
            "reasons": {name: code in codes for code, name in _REASON_ITEMS} if codes else _NO_REASONS,
            "proposed_action": proposed.index + 1 if proposed.index >= 0 else 0,
            "applied_action": applied.index + 1,
            "overridden": proposed.index != applied.index,
            "confidence": proposal.confidence,
            "margin": proposal.margin,
            "gate_score": gate.score,
            "gate_threshold": gate.threshold,
            "gate_veto": gate.veto,
            # an unscored tick proposes nothing: NaN, not a command of 0
            "proposed": dict(zip(self.controls, proposed_controls or [math.nan] * len(self.controls))),
            "applied": dict(zip(self.controls, applied.controls)),
            "observation_age_ms": snap.observation_age_ns / 1e6,
            "plan_age_ms": snap.plan_age_ns / 1e6,
            "held": snap.observation_held,
            "observation_seq": snap.observation_seq,
        }
        if snap.checks:
            checks: dict[str, dict[str, object]] = {}
            for check in snap.checks:
                name = CHECK_NAMES.get(check.check)
                if name is not None and name not in checks:  # the first of a kind, as the replay's columns
                    checks[name] = {"score": check.score, "threshold": check.threshold, "veto": check.veto}
            kw["checks"] = checks
        if observation is not None:
            values = list(observation.features)
            kw["features"] = dict(zip(self.features, values))
            for name, v in zip(("speed", "accel", "gap", "ttc_s"), self.summary(values)):
                if v is not None:
                    kw[name] = v
        return self.message_type(**kw)

    def summary(self, values: Sequence[float]) -> tuple[float | None, float | None, float | None, float | None]:
        """speed, accel, gap and time to collision from one observation's features."""

        def pick(i: int | None) -> float | None:
            return float(values[i]) if i is not None and i < len(values) else None

        speed, accel, gap, rel = pick(self.speed), pick(self.accel), pick(self.gap), pick(self.closing)
        ttc = None
        if gap is not None and rel is not None:  # NaN unless closing in (the replay's columns: the same rule)
            ttc = gap / -rel if rel < 0 and math.isfinite(gap / -rel) else math.nan
        return speed, accel, gap, ttc


def _build(
    package: str, features: Sequence[str], controls: Sequence[str], actions: Sequence[str]
) -> descriptor_pb2.FileDescriptorProto:
    fdp = descriptor_pb2.FileDescriptorProto(name=f"{package.replace('.', '/')}/plot.proto", package=package)
    fdp.syntax = "proto2"

    def message(name: str, fields: Sequence[tuple[str, int, int, str]]) -> descriptor_pb2.DescriptorProto:
        msg = fdp.message_type.add(name=name)
        for fname, number, ftype, type_name in sorted(fields, key=lambda f: f[1]):
            f = msg.field.add(name=fname, number=number, type=ftype, label=_F.LABEL_OPTIONAL)
            if type_name:
                f.type_name = type_name
        return msg

    def floats(names: Sequence[str]) -> list[tuple[str, int, int, str]]:
        return [(n, i + 1, _F.TYPE_FLOAT, "") for i, n in enumerate(names)]

    message("Features", floats(features))
    message("Controls", floats(controls))
    message("Reasons", [(name, code, _F.TYPE_BOOL, "") for code, name in REASONS.items()])
    message(
        "Check", [("score", 1, _F.TYPE_FLOAT, ""), ("threshold", 2, _F.TYPE_FLOAT, ""), ("veto", 3, _F.TYPE_BOOL, "")]
    )
    message("Checks", [(name, kind, _F.TYPE_MESSAGE, f".{package}.Check") for kind, name in _CHECKS])
    # enums nested in their own messages: enum values are scoped to the enclosing message, so an
    # action called NOMINAL cannot clash with the safety state
    action = fdp.message_type.add(name="Action").enum_type.add(name="Name")
    for number, name in enumerate(actions):
        action.value.add(name=name, number=number)
    safety = fdp.message_type.add(name="Safety").enum_type.add(name="State")
    for value in pb.SafetyState.DESCRIPTOR.values:
        safety.value.add(name=value.name.removeprefix("SAFETY_STATE_"), number=value.number)
    message(
        "Plot",
        [
            *((n, num, t, "") for n, num, t in _SCALARS),
            ("safety_state", SAFETY_FIELD, _F.TYPE_ENUM, f".{package}.Safety.State"),
            ("reasons", REASONS_FIELD, _F.TYPE_MESSAGE, f".{package}.Reasons"),
            ("proposed_action", PROPOSED_ACTION_FIELD, _F.TYPE_ENUM, f".{package}.Action.Name"),
            ("applied_action", APPLIED_ACTION_FIELD, _F.TYPE_ENUM, f".{package}.Action.Name"),
            ("proposed", PROPOSED_FIELD, _F.TYPE_MESSAGE, f".{package}.Controls"),
            ("applied", APPLIED_FIELD, _F.TYPE_MESSAGE, f".{package}.Controls"),
            ("checks", CHECKS_FIELD, _F.TYPE_MESSAGE, f".{package}.Checks"),
            ("features", FEATURES_FIELD, _F.TYPE_MESSAGE, f".{package}.Features"),
        ],
    )
    return fdp
