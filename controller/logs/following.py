"""A human car-following pair (follower speed, leader speed, gap over time) as dualloop sessions.

Shared by the OpenACC and NGSIM importers. What a session carries (docs/importers.md):

- features: ego_speed, ego_accel (`action_labels.backward_accel` of the follower's speed: causal),
  lead_present = 1, lead_distance = the gap, lead_rel_speed = leader speed - follower speed. The
  other features are NaN (not in the data) and `measured_features` lists exactly these five;
- the human's action: `action_labels.lookahead_labels` of the follower's speed in
  `ActualAction.action_index`, the look-ahead acceleration in `controls[accel]`, steer NaN;
- timing: the source's sample period as `observation_period_ns`, the executor's 5 ms tick.

A row is usable when the follower's speed, the leader's speed and the gap are all known. Usable rows
make pieces: a hole of at most MAX_HOLE_S stays inside a piece (the rows are skipped; the executor
holds the last observation, as it would for a sensor dropout), a longer hole ends it, because the
labels and ego_accel do not bridge holes over 1 s (`max_gap_s` of action_labels). Pieces shorter
than MIN_PIECE_S are dropped: too short to say anything about following. Each kept piece is its own
session and file. The first row of a piece has no causal acceleration yet (NaN) and is left out.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from dualloop.controller.logs.format import ACTUAL_CONTROLS_DETAIL, FORMAT_VERSION
from dualloop.controller.logs.import_report import ImportReport, count_labels
from dualloop.controller.logs.logfile import write_log
from dualloop.executor.action_labels import ACCEL_WINDOW_S, LOOKAHEAD_S, backward_accel, lookahead_labels
from dualloop.sim.schema import ACTIONS, CONTROL_NAMES, FEATURE_INDEX, FEATURE_NAMES, N_FEATURES
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import log_pb2

# The executor's tick: the replay runs every 5 ms grid tick, holding the newest observation between.
TICK_PERIOD_NS = 5_000_000
MAX_HOLE_S = 1.0
MIN_PIECE_S = 10.0
FOLLOWING_FEATURES = ("ego_speed", "ego_accel", "lead_present", "lead_distance", "lead_rel_speed")
LABEL_DETAIL = (
    f"lookahead_labels: band of (v(t + {LOOKAHEAD_S} s) - v(t)) / {LOOKAHEAD_S} s of the follower's speed; "
    "controls[accel] = that look-ahead acceleration, steer NaN (unknown)"
)
CONTROLS_DETAIL = "look-ahead acceleration label made from the speed profile, not a command"

FloatArray = npt.NDArray[np.float64]


@dataclass
class FollowingPair:
    """One leader-follower pair of a source file; NaN marks an unknown value."""

    session_id: str
    t_s: FloatArray
    ego_speed: FloatArray
    lead_speed: FloatArray
    gap: FloatArray
    # Facts about this pair for the header's source_details (vehicles, columns used).
    details: dict[str, str]


def imported_header(
    session_id: str,
    source: str,
    measured: Sequence[str],
    observation_period_ns: int,
    details: Mapping[str, str],
    start_time_unix_ns: int | None = None,
) -> log_pb2.SessionHeader:
    """The header of an imported drive: a shadow LOCKSTEP session in the highway schema whose sensors
    measured `measured` (the other features are NaN), with where each value came from in `details`."""
    return log_pb2.SessionHeader(
        session_id=session_id,
        clock=pb.CLOCK_MODE_LOCKSTEP,
        shadow=True,
        config_json="{}",
        source=source,
        format_version=FORMAT_VERSION,
        start_time_unix_ns=time.time_ns() if start_time_unix_ns is None else start_time_unix_ns,
        feature_names=FEATURE_NAMES,
        measured_features=list(measured),
        action_names=ACTIONS,
        control_names=CONTROL_NAMES,
        tick_period_ns=TICK_PERIOD_NS,
        observation_period_ns=observation_period_ns,
        source_details=details,
    )


def timestamps_ns(t_s: FloatArray) -> npt.NDArray[np.int64]:
    """Seconds to ns, rounded to the microsecond: a 10 Hz source's 5370.1 - 5370.0 is 0.0999999999995 s
    in binary, and the intervals should read 100 ms."""
    return np.round(np.asarray(t_s, dtype=np.float64) * 1e6).astype(np.int64) * 1000


def pieces(
    t_s: FloatArray, usable: npt.NDArray[np.bool_], max_hole_s: float = MAX_HOLE_S, min_piece_s: float = MIN_PIECE_S
) -> list[npt.NDArray[np.int64]]:
    """Row indices of each piece: usable rows, split where consecutive usable rows are more than
    max_hole_s apart, pieces spanning less than min_piece_s dropped."""
    rows = np.flatnonzero(usable)
    if len(rows) == 0:
        return []
    breaks = np.flatnonzero(np.diff(t_s[rows]) > max_hole_s + 1e-9) + 1
    return [p for p in np.split(rows, breaks) if t_s[p[-1]] - t_s[p[0]] >= min_piece_s - 1e-9]


def pair_sessions(pair: FollowingPair) -> list[tuple[str, npt.NDArray[np.int64]]]:
    """(session id, rows) per kept piece: the pair's id alone when there is one piece, else -p1, -p2..."""
    usable = np.isfinite(pair.ego_speed) & np.isfinite(pair.lead_speed) & np.isfinite(pair.gap)
    found = pieces(pair.t_s, usable)
    if len(found) == 1:
        return [(pair.session_id, found[0])]
    return [(f"{pair.session_id}-p{k + 1}", rows) for k, rows in enumerate(found)]


def write_following_session(
    out_path: Path,
    session_id: str,
    pair: FollowingPair,
    rows: npt.NDArray[np.int64],
    *,
    source: str,
    details: Mapping[str, str],
    observation_period_ns: int,
    start_time_unix_ns: int | None = None,
) -> ImportReport:
    """Write the rows of one piece of a pair as a session at out_path."""
    t = pair.t_s[rows]
    speed = pair.ego_speed[rows]
    labels, label_accel = lookahead_labels(t, speed)
    accel = backward_accel(t, speed)
    keep = np.isfinite(accel)  # the piece's first row: no past yet
    features = np.full((len(rows), N_FEATURES), np.nan, dtype=np.float64)
    features[:, FEATURE_INDEX["ego_speed"]] = speed
    features[:, FEATURE_INDEX["ego_accel"]] = accel
    features[:, FEATURE_INDEX["lead_present"]] = 1.0
    features[:, FEATURE_INDEX["lead_distance"]] = pair.gap[rows]
    features[:, FEATURE_INDEX["lead_rel_speed"]] = pair.lead_speed[rows] - speed
    features, labels, label_accel = features[keep], labels[keep], label_accel[keep]
    stamps = timestamps_ns(t[keep])
    header = imported_header(
        session_id=session_id,
        source=source,
        measured=[n for n in FEATURE_NAMES if n in FOLLOWING_FEATURES],
        observation_period_ns=observation_period_ns,
        start_time_unix_ns=start_time_unix_ns,
        details={
            **details,
            **pair.details,
            "ego_accel": f"backward_accel: slope of the follower's speed over the previous {ACCEL_WINDOW_S} s "
            "(causal; the piece's first row, which has no past, is left out)",
            "lead_present": "1: every row of the session has a known gap",
            "lead_rel_speed": "leader speed - follower speed",
            "actual_action": LABEL_DETAIL,
            ACTUAL_CONTROLS_DETAIL: CONTROLS_DETAIL,
            "rows": f"{int(rows[0])}-{int(rows[-1])} of the source's data rows (0 = first), "
            f"holes <= {MAX_HOLE_S:g} s skipped, pieces < {MIN_PIECE_S:g} s dropped",
        },
    )
    feats32 = features.astype(np.float32)

    def observations() -> Iterator[pb.Observation]:
        for i in range(len(stamps)):
            yield pb.Observation(
                seq=i + 1,
                timestamp_ns=int(stamps[i]),
                features=feats32[i].tolist(),
                actual=pb.ActualAction(action_index=int(labels[i]), controls=[float(label_accel[i]), float("nan")]),
            )

    write_log(out_path, header, observations())
    return ImportReport(
        source=source,
        out_path=out_path,
        observations=len(stamps),
        duration_s=float(stamps[-1] - stamps[0]) / 1e9 if len(stamps) else 0.0,
        rate_hz=1e9 / observation_period_ns,
        lead_present_fraction=1.0,
        label_counts=count_labels(labels),
        measured_features=list(header.measured_features),
        filled_features=[],
        session_id=session_id,
    )


def output_path(out: Path | None, session_id: str, stem: str, sessions: int) -> Path:
    """Where a session goes: `out` is a directory (default: the current one) holding <session id>.mcap,
    or a .mcap file name: that name for a single session, <name>-<session id suffix>.mcap for several."""
    if out is None:
        return Path(f"{session_id}.mcap")
    if out.suffix != ".mcap":
        out.mkdir(parents=True, exist_ok=True)
        return out / f"{session_id}.mcap"
    out.parent.mkdir(parents=True, exist_ok=True)
    if sessions == 1:
        return out
    suffix = session_id.removeprefix(stem).lstrip("-") or session_id
    return out.with_name(f"{out.stem}-{suffix}.mcap")


def write_pairs(
    pairs: Iterable[FollowingPair],
    out: Path | None,
    stem: str,
    *,
    only: Collection[str] | None,
    source: Callable[[FollowingPair], str],
    details: Mapping[str, str],
    observation_period_ns: int,
    start_time_unix_ns: int | None,
) -> list[ImportReport]:
    """Every piece of every pair (or of those whose session id is in `only`), one session each, at
    `output_path(out, ..., stem, ...)`; one report per written session."""
    planned = [
        (session_id, pair, rows)
        for pair in pairs
        if only is None or pair.session_id in only
        for session_id, rows in pair_sessions(pair)
    ]
    return [
        write_following_session(
            output_path(out, session_id, stem, len(planned)),
            session_id,
            pair,
            rows,
            source=source(pair),
            details=details,
            observation_period_ns=observation_period_ns,
            start_time_unix_ns=start_time_unix_ns,
        )
        for session_id, pair, rows in planned
    ]
