"""A replay's plot messages (controller/logs/plot.py) as wire bytes, straight from its TickTable.

Every field of the plot message has a fixed width and is written on every tick, so all of a
session's plot messages share one byte layout: tags and lengths are constants and the values are
columns. The layout is a numpy record dtype, the ticks one record array, its bytes the messages
(~1 us per tick; a message per tick through the protobuf runtime costs ~15 us, longer than the
replay). The bytes are those `PlotSchema.from_snapshot(snapshot_to_proto(s), observation)`
serialises for the same tick; tests/controller/logs/test_foxglove.py compares the files
(docs/duplicated-rules.md, section 8).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dualloop.controller.logs.plot import (
    APPLIED_ACTION_FIELD,
    APPLIED_FIELD,
    CHECKS_FIELD,
    FEATURES_FIELD,
    PROPOSED_ACTION_FIELD,
    PROPOSED_FIELD,
    REASONS,
    REASONS_FIELD,
    SAFETY_FIELD,
    PlotSchema,
)
from dualloop.controller.replay.wire_batch import reason_codes
from dualloop.executor.columns import as_columns
from dualloop.executor.lockstep_batch import TickTable

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_F32_MAX = float(np.finfo(np.float32).max)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        out.append(b | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _tag(number: int, wire: int) -> bytes:
    return _varint((number << 3) | wire)


@dataclass
class _Layout:
    """A message's fields in wire order: record dtype entries and what fills each."""

    dtype: list[tuple[str, str, tuple[int, ...]]] = field(default_factory=list)
    values: dict[str, np.ndarray | bytes] = field(default_factory=dict)
    size: int = 0

    def _add(self, code: str, width: int, value: np.ndarray | bytes, shape: tuple[int, ...] = ()) -> None:
        name = f"f{len(self.dtype)}"
        self.dtype.append((name, code, shape))
        self.values[name] = value
        self.size += width

    def const(self, data: bytes) -> None:
        self._add("u1", len(data), data, (len(data),))

    def scalar(self, number: int, code: str, values: np.ndarray) -> None:
        """float32 (<f4), double (<f8), fixed64 (<u8), or a bool/enum below 128 (u1, one varint byte)."""
        wire = {"<f4": _I32, "<f8": _I64, "<u8": _I64, "u1": _VARINT}[code]
        self.const(_tag(number, wire))
        self._add(code, np.dtype(code).itemsize, values)

    def message(self, number: int, inner: _Layout) -> None:
        self.const(_tag(number, _LEN) + _varint(inner.size))
        for (_, code, shape), value in zip(inner.dtype, inner.values.values()):
            self._add(code, int(np.dtype((code, shape)).itemsize), value, shape)

    def floats(self, matrix: np.ndarray) -> _Layout:
        """A message of float fields 1..k from the columns of `matrix`."""
        out = _Layout()
        for j in range(matrix.shape[1]):
            out.scalar(j + 1, "<f4", matrix[:, j])
        return out

    def encode(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        records = np.empty(rows, np.dtype(self.dtype))
        for name, value in self.values.items():
            records[name] = np.frombuffer(value, np.uint8) if isinstance(value, bytes) else value
        assert records.dtype.itemsize == self.size
        return records.view(np.uint8).reshape(-1), np.full(rows, self.size, np.int64)


def _saturated(x: np.ndarray) -> np.ndarray:
    """As the wire's gate score: a finite double past float32's range is float32's largest."""
    return np.where(np.isfinite(x), np.clip(x, -_F32_MAX, _F32_MAX), x)


def encode_plots_packed(schema: PlotSchema, table: TickTable) -> tuple[np.ndarray, np.ndarray]:
    """Every tick's plot message: one uint8 buffer and each tick's size (bulk.TopicMessages.packed)."""
    rows = len(table)
    if rows == 0:
        return np.zeros(0, np.uint8), np.zeros(0, np.int64)
    scored = table.scored.astype(bool)
    proposed = np.where(scored, table.proposed, -1)
    applied = np.asarray(table.applied, np.int64)
    if applied.max(initial=0) + 1 >= len(schema.actions):
        raise ValueError(f"action index {applied.max()} beyond the plot schema's {len(schema.actions) - 1} actions")
    cols = as_columns(table.observations)  # a log read as columns: its arrays, no Observation each
    if cols is not None:
        obs_seq = cols.seq
    else:
        obs_seq = np.fromiter((o.seq for o in table.observations), np.int64, len(table.observations))
    zero = np.zeros(rows)
    gate_score = zero if table.gate_score is None else _saturated(np.asarray(table.gate_score, np.float64))
    reason_bits = _reason_bits(table)
    m = _Layout()
    m.const(_tag(1, _LEN) + _varint(len(table.session_id.encode())) + table.session_id.encode())
    m.scalar(2, "<u8", np.arange(rows))
    m.scalar(3, "<f8", table.tick_ns / 1e9)
    m.scalar(SAFETY_FIELD, "u1", table.safety_state)
    reasons = _Layout()
    for code in sorted(REASONS):
        reasons.scalar(code, "u1", reason_bits[:, code])
    m.message(REASONS_FIELD, reasons)
    m.scalar(PROPOSED_ACTION_FIELD, "u1", proposed + 1)
    m.scalar(APPLIED_ACTION_FIELD, "u1", applied + 1)
    m.scalar(10, "u1", proposed != applied)
    m.scalar(11, "<f4", np.where(scored, table.confidence, 0.0))
    m.scalar(12, "<f4", np.where(scored, table.margin, 0.0))
    m.scalar(13, "<f4", gate_score)
    m.scalar(14, "<f4", zero if table.gate_threshold is None else table.gate_threshold)
    m.scalar(15, "u1", table.gate_veto)
    n_controls = len(schema.controls)  # as many as the schema names (from_snapshot zips them)
    proposed_controls = np.asarray(table.proposed_controls, np.float32).reshape(rows, -1)[:, :n_controls]
    proposed_controls = np.where(scored[:, None], proposed_controls, np.float32(np.nan))
    m.message(PROPOSED_FIELD, m.floats(proposed_controls))
    m.message(APPLIED_FIELD, m.floats(np.asarray(table.applied_controls, np.float32).reshape(rows, -1)[:, :n_controls]))
    checks = _checks_message(table)
    if checks is not None:
        m.message(CHECKS_FIELD, checks)
    if cols is not None:
        features = cols.features
    else:
        features = np.stack([np.asarray(o.features, np.float32) for o in table.observations])
    features = features[:, : len(schema.features)][table.obs_index]
    m.message(FEATURES_FIELD, m.floats(features))
    m.scalar(20, "<f8", table.age_ns / 1e6)
    m.scalar(21, "<f8", table.plan_age_ns / 1e6)
    m.scalar(22, "u1", table.held)
    m.scalar(23, "<u8", obs_seq[table.obs_index])
    _driving(m, schema, features)
    return m.encode(rows)


def _reason_bits(table: TickTable) -> np.ndarray:
    """(ticks, max reason + 1) bool: each tick's reasons as bits."""
    rows = len(table)
    # few distinct reason sets: each one's bits once, then a row per tick by index
    distinct: dict[tuple[int, ...], int] = {}
    set_of_tick = np.fromiter(
        (distinct.setdefault(rs, len(distinct)) for rs in reason_codes(table.reasons)), np.int64, rows
    )
    bits = np.zeros((len(distinct), max(REASONS) + 1), bool)
    for rs, i in distinct.items():
        bits[i, list(rs)] = True
    return bits[set_of_tick]


def _checks_message(table: TickTable) -> _Layout | None:
    """The Checks message (each check's score, threshold and veto); None without checks."""
    if table.checks is None or not len(table.check_kinds):
        return None
    first: dict[int, int] = {}
    for j, kind in enumerate(table.check_kinds):
        first.setdefault(int(kind), j)  # the first of a kind, as PlotSchema.from_snapshot
    checks = _Layout()
    for number, j in sorted(first.items()):  # Checks' field numbers are the kinds
        c = table.checks[:, j]
        check = _Layout()
        check.scalar(1, "<f4", c["score"])
        check.scalar(2, "<f4", c["threshold"])
        check.scalar(3, "u1", c["veto"])
        checks.message(number, check)
    return checks


def _driving(m: _Layout, schema: PlotSchema, features: np.ndarray) -> None:
    """The driving signals the schema finds among the features (speed, acceleration, gap) and the
    time to collision from the gap and the closing speed, onto `m`."""
    width = features.shape[1]
    for number, index in ((24, schema.speed), (25, schema.accel), (26, schema.gap)):
        if index is not None and index < width:
            m.scalar(number, "<f4", features[:, index])
    if schema.gap is not None and schema.closing is not None and max(schema.gap, schema.closing) < width:
        gap = features[:, schema.gap].astype(np.float64)
        rel = features[:, schema.closing].astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            ttc = gap / -rel
        m.scalar(27, "<f4", np.where((rel < 0) & np.isfinite(ttc), ttc, np.nan))
