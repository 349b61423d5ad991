"""Deterministic LOCKSTEP replay of a recorded log through the executor (`dualloop replay`).

Replay inputs never depend on the controller's outputs, so a whole session runs in one vectorised
pass (`run_lockstep` in executor/lockstep_batch.py): one forward call for every
observation, the gates' filters and the safe-state machine as scans. `fast=False` runs the
executor observation by observation instead (`advance_lockstep`); tests compare both.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from google.protobuf.message import DecodeError

from dualloop.controller.contract.gate_files import load_gate_for_model
from dualloop.controller.contract.wire import observation_from_proto, snapshot_to_proto
from dualloop.controller.logs.bulk import NotFast, TopicMessages, read_messages, write_messages
from dualloop.controller.logs.format import (
    ACTUAL_CONTROLS_DETAIL,
    FORMAT_VERSION,
    TOPIC_HEADER,
    TOPIC_OBSERVATION,
    TOPIC_SNAPSHOT,
    actual_is_command,
    expired_plan_is_stale,
    require_plan,
    sensor_profile,
)
from dualloop.controller.logs.logfile import LogData, LogFileError, read_log, read_sessions, write_log
from dualloop.controller.logs.plot import PlotSchema, channel_metadata, log_time_offset_ns, plot_topic
from dualloop.controller.replay.evaluation import EvaluationUnavailable, evaluate_replay, unmeasured_features
from dualloop.controller.replay.plot_batch import encode_plots_packed
from dualloop.controller.replay.report import ReplayReport, summarise
from dualloop.controller.replay.wire_batch import encode_snapshots_packed
from dualloop.controller.replay.wire_columns import NotCanonical, decode_observations
from dualloop.executor.columns import ObservationColumns
from dualloop.executor.config import ExecutorConfig
from dualloop.executor.core import Executor
from dualloop.executor.lockstep_batch import TickTable, run_lockstep
from dualloop.executor.model_card import ModelCard
from dualloop.executor.model_runner import DecisionModel
from dualloop.executor.snapshot import Clock, Observation, Snapshot
from dualloop.ood import Gate
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import log_pb2


@dataclass
class ReplayResult:
    source: Path
    header: log_pb2.SessionHeader  # of the replay's own log
    report: ReplayReport
    out_path: Path | None = None
    timings: dict[str, float] = field(default_factory=dict)  # seconds per phase
    # The fast path's ticks: its Snapshots are only made when asked for (a fleet never needs them;
    # the report, the evaluation and the new log are made from the table's columns).
    table: TickTable | None = None
    _snapshots: list[Snapshot] | None = field(default=None, repr=False)

    @property
    def snapshots(self) -> list[Snapshot]:
        if self._snapshots is None:
            self._snapshots = self.table.snapshots() if self.table is not None else []
        return self._snapshots


@dataclass(frozen=True)
class SessionOptions:
    """How a replayed LOCKSTEP session is opened (`Executor.open_session`): as the log's header says the
    recorded one was (`of_header`), and in shadow unless asked otherwise.

    actual_is_command: the observations' actual controls are the command in effect (the log says so,
    `controller.logs.format.actual_is_command`), so the gate's actuation check judges them.
    require_plan: the session required plans (OpenSession.require_plan; the log says so).
    expired_plan_is_stale: the server's own planner planned it, so an expired plan was STALE_PLAN."""

    shadow: bool = True
    actual_is_command: bool = False
    observation_period_ns: int = 0
    provided_features: Sequence[str] | None = None
    require_plan: bool = False
    expired_plan_is_stale: bool = False

    @classmethod
    def of_header(cls, header: log_pb2.SessionHeader, shadow: bool = True) -> SessionOptions:
        return cls(
            shadow=shadow,
            actual_is_command=actual_is_command(header),
            observation_period_ns=header.observation_period_ns,
            provided_features=sensor_profile(header),
            require_plan=require_plan(header),
            expired_plan_is_stale=expired_plan_is_stale(header),
        )

    def open(self, ex: Executor, session_id: str) -> None:
        """Open `session_id` on `ex`, a LOCKSTEP session with these options."""
        ex.open_session(
            session_id,
            Clock.LOCKSTEP,
            shadow=self.shadow,
            actual_is_command=self.actual_is_command,
            observation_period_ns=self.observation_period_ns,
            provided_features=None if self.provided_features is None else list(self.provided_features),
            require_plan=self.require_plan,
            expired_plan_is_stale=self.expired_plan_is_stale,
        )


@dataclass(frozen=True)
class ReplayOptions:
    """How `replay_log` replays.

    fast: the whole session in one vectorised pass (`lockstep_batch.run_lockstep`); otherwise observation
    by observation through `advance_lockstep`, the reference the fast path is tested against.
    tick_period_ms: the executor's tick (None: the log's).
    plots: the new log also gets the session's plot topic (logs/plot.py, for Foxglove): ~1/4 more
    CPU and 2/3 more bytes per log, so fleets and benchmarks leave it out."""

    shadow: bool = True
    fast: bool = True
    tick_period_ms: float | None = None
    plots: bool = False


def executor_config_for(header: log_pb2.SessionHeader, tick_period_ms: float | None = None) -> ExecutorConfig:
    """The executor settings the log was recorded with (config_json's `executor`), else defaults.

    An imported log's header tick_period_ns is the sensor rate, not an executor setting, so it is
    not used: the replay ticks at the configured executor period (5 ms by default)."""
    raw = json.loads(header.config_json or "{}")
    settings = dict(raw.get("executor", {})) if isinstance(raw, dict) else {}
    if tick_period_ms is not None:
        settings["tick_period_ms"] = tick_period_ms
    return ExecutorConfig(**settings)


@dataclass(frozen=True)
class LoadedModel:
    """A model and its gates, loaded once and shared by the replays of many logs (a fleet worker
    loads them in its initializer): an Executor keeps its sessions' state, never theirs."""

    model: DecisionModel
    gates: tuple[Gate, ...]
    gate_paths: tuple[str, ...]

    @classmethod
    def load(cls, model_path: str | Path, gate_paths: Sequence[str | Path] = ()) -> LoadedModel:
        model = DecisionModel(model_path, warmup_batches=(1,))
        gates = tuple(load_gate_for_model(Path(g), model) for g in gate_paths)
        return cls(model, gates, tuple(str(g) for g in gate_paths))

    def executor(self, config: ExecutorConfig) -> Executor:
        return Executor(self.model, config, list(self.gates) or None)


def build_executor(model_path: str | Path, gate_paths: Sequence[str | Path], config: ExecutorConfig) -> Executor:
    return LoadedModel.load(model_path, gate_paths).executor(config)


@dataclass
class ColumnLog:
    """A log read as the replay's fast path takes it: its header, its observations as columns,
    and their serialised bytes (canonical: what re-serialising the parsed messages would give)."""

    data: LogData  # the header; no messages
    observations: ObservationColumns
    observation_bytes: list[bytes]


def read_columns(path: Path, session_id: str | None = None) -> ColumnLog | None:
    """The log in one pass over its bytes, its observations decoded as columns; None when it is
    anything else than one complete file holding just this session's header and observations in
    the canonical encoding, their plans finite (read_log then reads it, and says what is wrong)."""
    try:
        channels, messages = read_messages(path)
    except (NotFast, OSError):
        return None
    sessions = {s for _, s in channels.values()}
    topics = {t for t, _ in channels.values()}
    if len(sessions) != 1 or (session_id is not None and session_id not in sessions):
        return None
    if not topics <= {TOPIC_HEADER, TOPIC_OBSERVATION}:  # snapshots, plans ...: the general reader
        return None
    header_ch = {c for c, (t, _) in channels.items() if t == TOPIC_HEADER}
    obs_ch = {c for c, (t, _) in channels.items() if t == TOPIC_OBSERVATION}
    headers = [d for c, _, d in messages if c in header_ch]
    blobs = [d for c, _, d in messages if c in obs_ch]
    if len(headers) != 1 or not blobs:
        return None
    try:
        header = log_pb2.SessionHeader.FromString(headers[0])
        columns = decode_observations(blobs)
    except (NotCanonical, DecodeError):
        return None
    if header.format_version > FORMAT_VERSION or header.session_id != next(iter(sessions)):
        return None
    return ColumnLog(LogData(header=header, files=[path], messages_read=len(messages)), columns, blobs)


@dataclass
class Recording:
    """The sessions of a log to replay, in order of first appearance."""

    sessions: list[LogData]
    column_log: ColumnLog | None = None  # a one-session log read as columns (the fast path)

    @property
    def truncated(self) -> bool:
        return any(d.truncated for d in self.sessions)

    @property
    def truncation(self) -> str:
        return next((d.truncation for d in self.sessions if d.truncated), "")


def read_recording(path: Path, session_ids: Sequence[str] | None = None) -> Recording:
    """Every session of a log (a server's recording holds one per client), or the named ones.
    A session named twice is replayed once; a name not in the log is an error listing the log's."""
    if not session_ids or len(set(session_ids)) == 1:
        column_log = read_columns(path, session_ids[0] if session_ids else None)
        if column_log is not None:
            return Recording([column_log.data], column_log)
    sessions = read_sessions(path)
    if not session_ids:
        return Recording(list(sessions.values()))
    missing = [s for s in dict.fromkeys(session_ids) if s not in sessions]
    if missing:
        listed = ", ".join(repr(s) for s in sessions) or "none"
        raise LogFileError(f"{path}: no session {', '.join(repr(s) for s in missing)} (sessions: {listed})")
    return Recording([sessions[s] for s in dict.fromkeys(session_ids)])


def read_recording_positions(source: Path, ids: Sequence[str] | None) -> tuple[Recording, list[int]]:
    """The sessions to replay (read_recording's) and each one's position in the recording, which numbers
    its file (docs/operations.md), whatever order `--session` named them in (the file names of a
    session must not change with the command line)."""
    asked = list(dict.fromkeys(ids or []))
    if len(asked) < 2:  # every session, in order; or one, whose file is not numbered
        recording = read_recording(source, asked or None)
        return recording, list(range(len(recording.sessions)))
    whole = read_recording(source)
    position = {data.name: index for index, data in enumerate(whole.sessions)}
    missing = [s for s in asked if s not in position]
    if missing:  # as read_recording says it
        listed = ", ".join(repr(s) for s in position) or "none"
        raise LogFileError(f"{source}: no session {', '.join(repr(s) for s in missing)} (sessions: {listed})")
    return Recording([whole.sessions[position[s]] for s in asked]), [position[s] for s in asked]


def session_file_name(stem: str, index: int, session_id: str) -> str:
    """A replayed session's file name in a folder of several: its position in the recording (ids
    may differ only in characters a file name cannot hold) and its id made safe, cut at 64."""
    safe = "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "_" for c in session_id)[:64]
    return f"{stem}.{index:03d}.{safe.strip('.') or 'session'}.replayed.mcap"


def _observations(data: LogData) -> list[Observation]:
    # arrival time is irrelevant in LOCKSTEP (ages come from timestamps): 0 keeps replays identical
    return [observation_from_proto(msg, 0) for msg in data.observations]


def run_replay(
    ex: Executor,
    session_id: str,
    observations: Sequence[Observation],
    session: SessionOptions = SessionOptions(),
    fast: bool = True,
    table_out: list[TickTable] | None = None,
    snapshots: bool = True,
) -> tuple[list[Snapshot], dict[str, float]]:
    """All snapshots of one LOCKSTEP session fed with `observations`; timings in seconds.

    fast: the whole session in one vectorised pass (`lockstep_batch.run_lockstep`); otherwise observation
    by observation through `advance_lockstep`, the reference the fast path is tested against.
    table_out: the fast path appends its TickTable there (the snapshots' columns, for encoding);
    snapshots=False: the fast path makes no Snapshots (an empty list), table_out has the ticks."""
    t0 = time.perf_counter()
    session.open(ex, session_id)
    try:
        if fast:
            table = run_lockstep(ex, session_id, observations)
            t1 = time.perf_counter()
            if table_out is not None:
                table_out.append(table)
            snaps = table.snapshots() if snapshots or table_out is None else []
        else:
            snaps = []
            for obs in observations:
                snaps += ex.advance_lockstep(session_id, obs)
            t1 = time.perf_counter()
    finally:
        ex.close_session(session_id)
    return snaps, {"compute_s": t1 - t0, "snapshots_s": time.perf_counter() - t1}


def replay_header(
    source: LogData, source_path: Path, ex: Executor, gate_paths: Sequence[str | Path], shadow: bool
) -> log_pb2.SessionHeader:
    header = log_pb2.SessionHeader()
    header.CopyFrom(source.header)
    header.clock = pb.CLOCK_MODE_LOCKSTEP
    header.shadow = shadow
    header.model_version = ex.card.version
    header.model_schema_hash = ex.card.schema_hash()
    header.gate_version = "+".join(g.version_hash for g in ex.gates)
    header.config_json = json.dumps(
        {
            "model": str(ex.model.path),
            "gates": [str(g) for g in gate_paths],
            "executor": ex.config.model_dump(mode="json"),
        },
        sort_keys=True,
    )
    header.source = f"replay of {source_path} ({source.header.source})"
    header.tick_period_ns = ex.period_ns
    header.part = 0
    if not header.feature_names:  # the names the plot channel plots by: the card's order is the observations'
        header.feature_names[:] = ex.card.feature_names
    if not header.control_names:
        header.control_names[:] = [c.name for c in ex.card.controls]
    if not header.action_names:
        header.action_names[:] = ex.card.actions
    header.source_details["replay_of"] = str(source_path)
    header.source_details["replayed_model"] = f"{ex.card.name} {ex.card.version}"
    return header


def replay_log(
    log_path: str | Path,
    model_path: str | Path,
    gate_paths: Sequence[str | Path] = (),
    out_path: str | Path | None = None,
    options: ReplayOptions = ReplayOptions(),
    session_id: str | None = None,
    loaded: LoadedModel | None = None,
    allow_truncated: bool = False,
) -> ReplayResult:
    """Replay one session of a log in LOCKSTEP with a model (and gates); optionally write a new log.

    allow_truncated: replay the complete part of a log whose end is missing or broken (a recorder
    killed mid-drive); without it such a log is refused, so that a cut drive is never replayed,
    and its agreement reported, as if it were whole.

    loaded: the model and gates already loaded (model_path and gate_paths are then only named in
    the new log's header and must be the ones `loaded` was loaded from)."""
    source_path = Path(log_path)
    t0 = time.perf_counter()
    # the fast path reads logs as columns (and keeps their bytes for the new log)
    column_log = read_columns(source_path, session_id) if options.fast else None
    if column_log is not None:
        data: LogData = column_log.data
    else:
        data = read_log(source_path, session_id)
        if data.truncated and not allow_truncated:
            raise LogFileError(
                f"{data.truncation}; the drive may be cut short: replay its complete part with "
                f"`dualloop replay --allow-truncated`, or rewrite it whole with `dualloop recover`"
            )
    return replay_data(
        data,
        source_path,
        model_path,
        gate_paths,
        out_path,
        options,
        loaded=loaded,
        column_log=column_log,
        started=t0,
    )


def check_log_schema(header: log_pb2.SessionHeader, card: ModelCard, source_path: Path, session_id: str) -> None:
    """Refuse a log whose observations mean something else to this model: its features, or its
    actual controls and actions, named in another order or other names. A wrong count was refused
    by the observations' size; the same count in another order replayed silently, each value read
    as another signal's. A log without names (an older import) is taken by position, as before."""
    for what, logged, expected in (
        ("features", header.feature_names, card.feature_names),
        ("controls", header.control_names, [c.name for c in card.controls]),
        ("actions", header.action_names, card.actions),
    ):
        if not logged or list(logged) == list(expected):
            continue
        at = next((i for i, (a, b) in enumerate(zip(logged, expected)) if a != b), min(len(logged), len(expected)))
        said = f"{logged[at]!r}" if at < len(logged) else "nothing"
        wanted = f"{expected[at]!r}" if at < len(expected) else "nothing"
        raise LogFileError(
            f"{source_path}: session {session_id!r} was recorded with {len(logged)} {what} that are not "
            f"model {card.name} {card.version}'s {len(expected)}: at position {at} the log has {said}, the "
            f"model {wanted}; replay it with the model it was recorded for, or import the drive again for "
            f"this model"
        )


def replay_data(
    data: LogData,
    source_path: Path,
    model_path: str | Path,
    gate_paths: Sequence[str | Path] = (),
    out_path: str | Path | None = None,
    options: ReplayOptions = ReplayOptions(),
    loaded: LoadedModel | None = None,
    column_log: ColumnLog | None = None,
    started: float | None = None,
) -> ReplayResult:
    """replay_log of a session already read (one of read_sessions' when a recording holds several);
    truncation is the caller's to judge."""
    t0 = time.perf_counter() if started is None else started
    observations: Sequence[Observation] = column_log.observations if column_log is not None else _observations(data)
    if not observations:
        raise ValueError(f"{source_path}: session {data.session_id!r} has no observations to replay")
    t_read = time.perf_counter()
    if loaded is None:
        loaded = LoadedModel.load(model_path, gate_paths)
    elif loaded.gate_paths != tuple(str(g) for g in gate_paths):
        raise ValueError(f"the loaded gates {loaded.gate_paths} are not the ones named: {list(gate_paths)}")
    ex = loaded.executor(executor_config_for(data.header, options.tick_period_ms))
    check_log_schema(data.header, ex.card, source_path, data.session_id)
    t1 = time.perf_counter()
    tables: list[TickTable] = []
    session = SessionOptions.of_header(data.header, options.shadow)
    snaps, timings = run_replay(ex, data.session_id, observations, session, options.fast, tables, snapshots=False)
    table = tables[0] if tables else None
    ticks: list[Snapshot] | TickTable = table if table is not None else snaps
    timings["load_s"] = t1 - t0
    timings["read_s"] = t_read - t0
    header = replay_header(data, source_path, ex, gate_paths, options.shadow)
    result = ReplayResult(source_path, header, ReplayReport(), timings=timings, table=table, _snapshots=snaps or None)
    if out_path is not None:
        t2 = time.perf_counter()
        result.out_path = _write_replay(Path(out_path), header, data, snaps, table, options.plots, column_log)
        timings["write_s"] = time.perf_counter() - t2
    t3 = time.perf_counter()
    drive_s = (observations[-1].timestamp_ns - observations[0].timestamp_ns) / 1e9
    result.report = summarise(ticks, ex, len(observations), drive_s, source_path, timings)
    result.report.actuation_check = (
        "none in the gates"
        if ex.gating.actuation is None
        else "ran"
        if session.actual_is_command
        else "skipped, the log's actual controls: "
        f"{data.header.source_details.get(ACTUAL_CONTROLS_DETAIL) or 'not declared the command in effect'}"
    )
    result.report.input_warning = recorded_input_warning(data, ticks)
    t4 = time.perf_counter()
    timings["report_s"] = t4 - t3
    try:  # against the labels and the baselines, one tick per observation
        evaluation = evaluate_replay(
            ticks, observations, ex.card, source_path, unmeasured_features(data.header, ex.card.feature_names)
        )
        result.report.evaluation = evaluation.as_dict()
    except EvaluationUnavailable as err:
        result.report.evaluation = {"skipped": str(err)}
    timings["evaluation_s"] = time.perf_counter() - t4
    return result


def recorded_input_warning(data: LogData, ticks: Sequence[Snapshot] | TickTable) -> str:
    """What the report must say when the log cannot give the recorded decisions back, however well the
    replay agrees with the actual action: its recorded decisions used plans that no observation carries
    (a session planned by the server's planner, recorded before the recorder kept its plans), or, in a
    LOCKSTEP recording, whose ticks line up with the replay's, the first tick saw another input (its
    input hash differs). "" when neither, or when the log holds no recorded decisions."""
    if not data.snapshots:
        return ""
    carried = {o.plan.plan_id for o in data.observations if o.HasField("plan")}
    missing = list(dict.fromkeys(s.plan_id for s in data.snapshots if s.plan_id and s.plan_id not in carried))
    if missing:
        return (
            f"the recorded decisions used {len(missing)} plans that no observation of the log carries (the first "
            f"{missing[0]!r}): the log lacks its plans (a session planned by the server's planner, recorded before "
            "the recorder kept them), so the replay ran without them and its decisions are not the recording's"
        )
    first = data.snapshots[0]
    if data.header.clock != pb.CLOCK_MODE_LOCKSTEP:
        return ""
    if isinstance(ticks, TickTable):
        replayed = int(ticks.input_hash[first.tick]) if 0 <= first.tick < len(ticks) else None
    else:
        replayed = next((s.input_hash for s in ticks if s.tick == first.tick), None)
    if replayed is None or replayed == first.input_hash:
        return ""
    return (
        f"tick {first.tick} saw another input than the recorded tick (input hash {replayed:016x}, recorded "
        f"{first.input_hash:016x}): a model that fills in the plan or missing features otherwise, or observations "
        "changed since they were recorded; its decisions are not the recording's"
    )


def _write_replay(
    path: Path,
    header: log_pb2.SessionHeader,
    data: LogData,
    snaps: list[Snapshot],
    table: TickTable | None,
    plots: bool = False,
    column_log: ColumnLog | None = None,
) -> Path:
    """The replay's log: the source's observations, then the snapshots, then (plots) their plot
    messages (logs/plot.py). From the fast path's table the snapshots and plots are encoded column-wise and
    the file written in bulk (byte-identical to `write_log` of `snapshot_to_proto`,
    tests/controller/replay/test_fleet.py); a log read as columns gives its observations' bytes as
    they were (canonical, so the same bytes)."""
    if table is None:
        return write_log(path, header, data.observations, (snapshot_to_proto(s) for s in snaps), plots=plots)
    if not header.format_version:
        header.format_version = FORMAT_VERSION
    if column_log is not None:
        observation_bytes, times = column_log.observation_bytes, column_log.observations.timestamp_ns
    else:
        observation_bytes = [o.SerializeToString(deterministic=True) for o in data.observations]
        times = np.fromiter((o.timestamp_ns for o in data.observations), np.int64, len(data.observations))
    first = int(times[0])
    return write_messages(
        path,
        header.session_id,
        [
            TopicMessages(TOPIC_HEADER, [header.SerializeToString(deterministic=True)], np.array([first])),
            TopicMessages(TOPIC_OBSERVATION, observation_bytes, times),
            TopicMessages(TOPIC_SNAPSHOT, [], table.tick_ns, packed=encode_snapshots_packed(table)),
            *(_plot_group(header, table) if plots else []),
        ],
    )


def _plot_group(header: log_pb2.SessionHeader, table: TickTable) -> list[TopicMessages]:
    if not len(table):
        return []
    schema = PlotSchema.for_header(header)
    offset = log_time_offset_ns(header, int(table.tick_ns[0]))
    return [
        TopicMessages(
            plot_topic(header.session_id),
            [],
            table.tick_ns + offset,
            packed=encode_plots_packed(schema, table),
            schema=(schema.name, schema.data),
            metadata=channel_metadata(header, offset),
        )
    ]
