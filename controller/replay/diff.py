"""Compare two logs of the same input (`dualloop diff A B`), like openpilot's process replay.

Snapshots are aligned by (session, tick); the report gives the first divergence, per-field counts
of ticks beyond tolerance, and the migration matrix of discrete decisions. `diff_exit_code` turns
it into a CI gate: non-zero when a chosen field changed on more ticks than allowed.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dualloop.controller.contract.errors import ConfigError
from dualloop.controller.logs.logfile import LogData, LogFileError, no_sessions_error, read_sessions
from dualloop.controller.replay.report import format_confusion
from dualloop.v2 import controller_pb2 as pb

FIELDS = (
    "missing",
    "applied_index",
    "proposed_index",
    "applied_controls",
    "proposed_controls",
    "reasons",
    "safety_state",
    "gate_veto",
    "vetoed_by",  # which checks vetoed (DecisionSnapshot.vetoed_by; empty in logs older than the checks)
)
DEFAULT_FIELDS = ("missing", "applied_index")  # what gates the exit code unless --field says otherwise


class NotSameInput(ValueError):
    """The two logs were not made from the same observations; a diff would be meaningless."""


@dataclass(frozen=True)
class Tolerances:
    controls_abs: float = 1e-4  # applied / proposed controls, per component


@dataclass
class Divergence:
    session_id: str
    tick: int
    scheduled_time_ns: int
    fields: list[str]


@dataclass
class DiffReport:
    a: str
    b: str
    ticks: int = 0  # aligned (session, tick) pairs, including ones missing from one side
    changed: dict[str, int] = field(default_factory=lambda: {f: 0 for f in FIELDS})
    first: Divergence | None = None
    actions: list[str] = field(default_factory=list)
    decisions: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))  # a x b, applied index

    def fraction(self, name: str) -> float:
        return self.changed[name] / self.ticks if self.ticks else 0.0

    @property
    def migrations(self) -> dict[tuple[str, str], int]:
        """Ticks whose applied action moved from one action (in A) to another (in B)."""
        return {
            (self.actions[i], self.actions[j]): int(v) for (i, j), v in np.ndenumerate(self.decisions) if i != j and v
        }


def _observation_digest(data: LogData) -> str:
    h = hashlib.blake2b(digest_size=16)
    for msg in data.observations:
        copy = pb.Observation()
        copy.CopyFrom(msg)
        copy.ClearField("actual")  # the input is what the controller saw, not the label
        copy.ClearField("sent_time_ns")  # when the client sent it is wall-clock, not input
        h.update(copy.SerializeToString(deterministic=True))
    return h.hexdigest()


def check_diff_options(tolerance: float, controls_tol: float, fields: Sequence[str]) -> None:
    """Refuse options that would make the exit code meaningless, before any log is read: a NaN
    tolerance compares False (every diff passes), a negative one fails identical logs, and an
    unknown field is a typo that CI must not take for "the logs differ" (exit 1)."""
    if not (math.isfinite(tolerance) and 0.0 <= tolerance <= 1.0):
        raise ConfigError(f"--tolerance {tolerance}: a fraction of the ticks, from 0 to 1 (0.01 allows 1%)")
    if not (math.isfinite(controls_tol) and controls_tol >= 0.0):
        raise ConfigError(f"--controls-tol {controls_tol}: an absolute tolerance, a finite number >= 0")
    unknown = [f for f in fields if f not in FIELDS]
    if unknown:
        raise ConfigError(f"--field: unknown diff field(s) {', '.join(unknown)}; choose from {', '.join(FIELDS)}")


def _sessions(log: str | Path | dict[str, LogData]) -> dict[str, LogData]:
    """The sessions of a log; a log with none is refused (an empty or cut file would otherwise
    diff as "0 ticks, identical" and pass a CI gate)."""
    if isinstance(log, dict):
        return log
    sessions = read_sessions(log)
    if not sessions:
        raise no_sessions_error(Path(log))
    return sessions


def _one_session(sessions: dict[str, LogData], name: str, session: str) -> dict[str, LogData]:
    """`session` of a log that holds several (a server's recording); a log of one session is taken as
    it is (a replayed session's own log), its key made `session`: the input check still applies."""
    if session in sessions:
        return {session: sessions[session]}
    if len(sessions) == 1:
        return {session: next(iter(sessions.values()))}
    listed = ", ".join(repr(s) for s in sessions)
    raise NotSameInput(f"{name}: no session {session!r} (sessions: {listed})")


def _check_comparable(sessions: dict[str, LogData], name: str) -> None:
    """Refuse (LogFileError, exit 2) a log with a cut session or without decisions: a cut drive diffed
    as whole said "identical" (or "not the same input" without saying why), and a log of observations
    only (an import) diffed as "0 ticks, identical", passing a CI gate with nothing compared."""
    cut = next((d.truncation for d in sessions.values() if d.truncated), "")
    if cut:
        raise LogFileError(
            f"{cut}: a cut log; diff compares whole drives: recover it (`dualloop recover {name} NEW.mcap` names "
            "the cut sessions) and diff a session that ended with --session, or replay its complete part "
            "with `dualloop replay --allow-truncated`"
        )
    if not any(d.snapshots for d in sessions.values()):
        raise LogFileError(
            f"no decision snapshots in {name}: diff compares decisions; replay it first with `dualloop replay`"
        )


def _check_same_input(a: dict[str, LogData], b: dict[str, LogData], names: tuple[str, str]) -> None:
    if set(a) != set(b):
        raise NotSameInput(f"{names[0]} and {names[1]} hold different sessions: {sorted(a)} vs {sorted(b)}")
    for sid in a:
        na, nb = len(a[sid].observations), len(b[sid].observations)
        if na != nb:
            raise NotSameInput(
                f"session {sid!r}: {na} observations in {names[0]}, {nb} in {names[1]}; not the same input"
            )
        if _observation_digest(a[sid]) != _observation_digest(b[sid]):
            raise NotSameInput(
                f"session {sid!r}: the observations differ between {names[0]} and {names[1]}; not the same input"
            )


def _differences(x: pb.DecisionSnapshot, y: pb.DecisionSnapshot, tol: Tolerances) -> list[str]:
    if x.input_hash != y.input_hash:
        raise NotSameInput(
            f"session {x.session_id!r} tick {x.tick}: input hashes differ "
            f"({x.input_hash:016x} vs {y.input_hash:016x}); not the same input"
        )
    out = []
    if x.applied.index != y.applied.index:
        out.append("applied_index")
    if x.proposed.action.index != y.proposed.action.index:
        out.append("proposed_index")
    for name, u, v in (
        ("applied_controls", x.applied.controls, y.applied.controls),
        ("proposed_controls", x.proposed.action.controls, y.proposed.action.controls),
    ):
        if len(u) != len(v) or (len(u) and np.max(np.abs(np.subtract(u, v))) > tol.controls_abs):
            out.append(name)
    if list(x.reasons) != list(y.reasons):
        out.append("reasons")
    if x.safety_state != y.safety_state:
        out.append("safety_state")
    if x.gate.veto != y.gate.veto:
        out.append("gate_veto")
    if list(x.vetoed_by) != list(y.vetoed_by):
        out.append("vetoed_by")
    return out


def diff_logs(
    a: str | Path | dict[str, LogData],
    b: str | Path | dict[str, LogData],
    tolerances: Tolerances = Tolerances(),
    actions: Sequence[str] | None = None,
    session: str | None = None,
) -> DiffReport:
    """Compare the snapshots of two logs of the same input; raises NotSameInput when they are not.
    `session`: compare that session of each log (see _one_session) rather than all of them."""
    names = (str(a) if not isinstance(a, dict) else "A", str(b) if not isinstance(b, dict) else "B")
    sa, sb = _sessions(a), _sessions(b)
    if session is not None:
        sa, sb = _one_session(sa, names[0], session), _one_session(sb, names[1], session)
    _check_comparable(sa, names[0])
    _check_comparable(sb, names[1])
    _check_same_input(sa, sb, names)
    first = next(iter(sa.values()), None)
    action_names = list(actions or (first.header.action_names if first else []))
    if not action_names:  # an old header without names: index them
        action_names = [
            str(i)
            for i in range(max([s.applied.index + 1 for d in [*sa.values(), *sb.values()] for s in d.snapshots] or [0]))
        ]
    report = DiffReport(
        names[0], names[1], actions=action_names, decisions=np.zeros((len(action_names), len(action_names)), np.int64)
    )
    for sid in sa:
        ta = {s.tick: s for s in sa[sid].snapshots}
        tb = {s.tick: s for s in sb[sid].snapshots}
        for tick in sorted(ta.keys() | tb.keys()):
            report.ticks += 1
            x, y = ta.get(tick), tb.get(tick)
            if x is None or y is None:
                fields = ["missing"]
            else:
                fields = _differences(x, y, tolerances)
                if 0 <= x.applied.index < len(action_names) and 0 <= y.applied.index < len(action_names):
                    report.decisions[x.applied.index, y.applied.index] += 1
            for f in fields:
                report.changed[f] += 1
            seen = x or y
            assert seen is not None  # the tick comes from ta or tb
            if fields and (report.first is None or seen.scheduled_time_ns < report.first.scheduled_time_ns):
                report.first = Divergence(sid, tick, seen.scheduled_time_ns, fields)
    return report


def diff_exit_code(report: DiffReport, tolerance: float = 0.0, fields: Sequence[str] = DEFAULT_FIELDS) -> int:
    """0 when every chosen field changed on at most `tolerance` (a fraction) of the ticks, else 1."""
    unknown = [f for f in fields if f not in FIELDS]
    if unknown:
        raise ValueError(f"unknown diff field(s) {unknown}; choose from {', '.join(FIELDS)}")
    return int(any(report.fraction(f) > tolerance for f in fields))


def format_diff(r: DiffReport) -> str:
    lines = [f"diff {r.a} -> {r.b}: {r.ticks} ticks"]
    if r.first is None:
        lines.append("  identical within tolerance")
    else:
        f = r.first
        lines.append(
            f"  first divergence: session {f.session_id} tick {f.tick} at {f.scheduled_time_ns / 1e9:.3f} s "
            f"({', '.join(f.fields)})"
        )
    for name in FIELDS:
        lines.append(f"  {name:18s} {r.changed[name]:7d} ticks ({100 * r.fraction(name):.2f}%)")
    moves = r.migrations
    lines.append(f"  migrations of the applied decision: {sum(moves.values())} ticks")
    for (src, dst), n in sorted(moves.items(), key=lambda kv: -kv[1]):
        lines.append(f"    {src} -> {dst}: {n}")
    if moves:
        lines.append("    " + format_confusion(r.actions, r.decisions.tolist(), "A", "B").replace("\n", "\n    "))
    return "\n".join(lines)
