"""A replay's plot messages (controller/logs/plot.py) as wire bytes, straight from its TickTable.

Built column-wise like wire_batch's snapshots (a message per tick through the protobuf runtime
costs ~15 us, which would make writing a replay's log slower than the replay): the bytes are those
`PlotSchema.from_snapshot(snapshot_to_proto(s), observation)` serialises for the same tick, which
tests/controller/logs/test_foxglove.py checks tick by tick. Every field is written (proto2: present
when set), except `ttc_s` where nothing is closing in and the proposal's controls of unscored ticks.
"""

from __future__ import annotations

import numpy as np

from dualloop.controller.logs.plot import (
    APPLIED_FIELD,
    CHECKS_FIELD,
    FEATURES_FIELD,
    PROPOSED_FIELD,
    SAFETY_FIELD,
    PlotSchema,
)
from dualloop.controller.replay.wire_batch import (
    U8,
    Col,
    Fields,
    by_value,
    const,
    field_message,
    lengths,
    lookup,
    reason_codes,
    varints,
)
from dualloop.controller.replay.wire_batch import _flat as flat
from dualloop.controller.replay.wire_batch import _tag as tag
from dualloop.controller.replay.wire_batch import _varint_bytes as varint_bytes
from dualloop.executor.lockstep_batch import TickTable
from dualloop.executor.snapshot import Reason

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_F32_MAX = float(np.finfo(np.float32).max)


def _string(field: int, text: str) -> bytes:
    data = text.encode()
    return tag(field, _LEN) + varint_bytes(len(data)) + data


def _int(field: int, values: np.ndarray) -> Fields:
    return varints(np.asarray(values).astype(np.int64), tag(field, _VARINT))


def _fixed(field: int, values: np.ndarray, dtype: str, present: np.ndarray | None = None) -> Fields:
    v = np.ascontiguousarray(values, dtype=dtype)
    size = v.dtype.itemsize
    rows = len(v)
    n = np.full(rows, size, np.int64)
    head = const(tag(field, _I32 if size == 4 else _I64), rows)
    if present is not None:
        n, head.n = n * present, head.n * present
    return [head, Col(v.view(U8).reshape(rows, size), n)]


def _float(field: int, values: np.ndarray, present: np.ndarray | None = None) -> Fields:
    return _fixed(field, values, "<f4", present)


def _double(field: int, values: np.ndarray) -> Fields:
    return _fixed(field, values, "<f8")


def _floats_message(field: int, matrix: np.ndarray, present: np.ndarray | None = None) -> Fields:
    """A message of float fields 1..k, every one written: row k of `matrix` (rows, k)."""
    inner: Fields = []
    for j in range(matrix.shape[1]):
        inner += _float(j + 1, matrix[:, j])
    if not inner:
        inner = [const(b"", len(matrix))]
    return field_message(field, inner, present)


def _columns(values: np.ndarray, count: int, rows: int) -> np.ndarray:
    matrix = np.asarray(values, np.float32).reshape(rows, -1)
    return matrix[:, :count]


def _saturated(x: np.ndarray) -> np.ndarray:
    """As the wire's gate score: a finite double past float32's range is float32's largest."""
    return np.where(np.isfinite(x), np.clip(x, -_F32_MAX, _F32_MAX), x)


def encode_plots_packed(schema: PlotSchema, table: TickTable) -> tuple[np.ndarray, np.ndarray]:
    """Every tick's plot message: one uint8 buffer and each tick's size (bulk.TopicMessages.packed)."""
    rows = len(table)
    if rows == 0:
        return np.zeros(0, U8), np.zeros(0, np.int64)
    scored = table.scored.astype(bool)
    proposed = np.where(scored, table.proposed, -1)
    applied = np.asarray(table.applied, np.int64)
    names = [*table.actions, ""]
    obs_seq = np.fromiter((o.seq for o in table.observations), np.int64, len(table.observations))
    zero = np.zeros(rows)
    gate_score = zero if table.gate_score is None else _saturated(np.asarray(table.gate_score, np.float64))
    gate_threshold = zero if table.gate_threshold is None else table.gate_threshold
    fields: Fields = [
        const(_string(1, table.session_id), rows),
        *_int(2, np.arange(rows)),
        *_double(3, table.tick_ns / 1e9),
        *_int(SAFETY_FIELD, table.safety_state),
        *by_value(reason_codes(table.reasons), lambda rs: _string(5, " ".join(Reason(r).name for r in rs))),
        *lookup([_string(6, n) for n in names], np.where(proposed >= 0, proposed, len(names) - 1)),
        *lookup([_string(7, n) for n in names], applied),
        *_int(8, proposed),
        *_int(9, applied),
        *_int(10, proposed != applied),
        *_float(11, np.where(scored, table.confidence, 0.0)),
        *_float(12, np.where(scored, table.margin, 0.0)),
        *_float(13, gate_score),
        *_float(14, gate_threshold),
        *_int(15, table.gate_veto.astype(bool)),
    ]
    if schema.controls:  # as many values as the schema has names (from_snapshot zips them)
        fields += _floats_message(PROPOSED_FIELD, _columns(table.proposed_controls, len(schema.controls), rows), scored)
        fields += _floats_message(APPLIED_FIELD, _columns(table.applied_controls, len(schema.controls), rows))
    if table.checks is not None and len(table.check_kinds):
        first: dict[int, int] = {}
        for j, kind in enumerate(table.check_kinds):
            first.setdefault(int(kind), j)  # the first of a kind, as PlotSchema.from_snapshot
        inner: Fields = []
        for number, j in sorted(first.items()):  # Checks' field numbers are the kinds
            c = table.checks[:, j]
            check = [*_double(1, c["score"]), *_double(2, c["threshold"]), *_int(3, c["veto"].astype(bool))]
            inner += field_message(number, check)
        fields += field_message(CHECKS_FIELD, inner)
    features = np.stack([np.asarray(o.features, np.float32) for o in table.observations])
    per_obs = _floats_message(FEATURES_FIELD, features[:, : len(schema.features)])
    fields += [Col(c.buf[table.obs_index], c.n[table.obs_index]) for c in per_obs]
    fields += [
        *_double(20, table.age_ns / 1e6),
        *_double(21, table.plan_age_ns / 1e6),
        *_int(22, table.held.astype(bool)),
        *_int(23, obs_seq[table.obs_index]),
    ]
    fields += _summary(schema, features[table.obs_index])
    return flat(fields), lengths(fields)


def _summary(schema: PlotSchema, features: np.ndarray) -> Fields:
    """speed, accel, gap (24-26) where the card has them; ttc_s (27) where the lead is closing in."""
    out: Fields = []
    for field, index in ((24, schema.speed), (25, schema.accel), (26, schema.gap)):
        if index is not None and index < features.shape[1]:
            out += _float(field, features[:, index])
    if schema.gap is not None and schema.closing is not None and max(schema.gap, schema.closing) < features.shape[1]:
        gap = features[:, schema.gap].astype(np.float64)
        rel = features[:, schema.closing].astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            ttc = gap / -rel
        out += _float(27, np.where(np.isfinite(ttc), ttc, 0.0), (rel < 0) & np.isfinite(ttc))
    return out
