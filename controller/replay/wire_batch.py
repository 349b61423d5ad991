"""A replay's DecisionSnapshots as wire bytes, straight from the TickTable's columns.

`snapshot_to_proto(s).SerializeToString(deterministic=True)` costs ~20 us per tick in Python (a
Snapshot object, a message built field by field, then serialised): 12,000 ticks of a 60 s log took
longer than the replay itself. Here every field is encoded for all ticks at once with numpy: a
field is a column of byte strings held as a (ticks, width) uint8 matrix and a length per tick,
fields are concatenated in field-number order, and omitted where proto3 omits them (zero scalars,
empty strings and repeated fields). The bytes are the ones upb's deterministic serialiser writes
for the same snapshot (tests compare them tick by tick on logs with every fault), so files written
either way are byte-identical.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from dualloop.executor.checks import NAMES as CHECK_NAMES
from dualloop.executor.columns import ObservationColumns, as_columns
from dualloop.executor.lockstep_batch import TickTable
from dualloop.executor.snapshot import Reason, StageTimings

U8 = np.uint8
_WIRE_VARINT, _WIRE_I64, _WIRE_LEN, _WIRE_I32 = 0, 1, 2, 5


class Col:
    """A column of byte strings: row k is buf[k, :n[k]]."""

    __slots__ = ("buf", "n")

    def __init__(self, buf: np.ndarray, n: np.ndarray) -> None:
        self.buf, self.n = buf, n


# A field (or a whole message) is the list of its pieces' columns, in wire order: nothing is
# concatenated until the very end, where one mask over all of them gives every row's bytes.
Fields = list[Col]


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _tag(field: int, wire: int) -> bytes:
    return _varint_bytes((field << 3) | wire)


def varints(values: np.ndarray, prefix: bytes = b"") -> Fields:
    """`prefix` then each value (int64 as two's complement, as protobuf does) as a varint."""
    v = np.asarray(values).astype(np.int64, copy=False).view(np.uint64)
    top = int(v.max()) if len(v) else 0
    width = max(1, (top.bit_length() + 6) // 7)
    if width == 1:  # every value below 128: one byte each
        return _prefixed(prefix, v.astype(U8).reshape(-1, 1), _full(len(v), 1))
    shifts = np.arange(width, dtype=np.uint64) * np.uint64(7)
    rest = v[:, None] >> shifts[None, :]  # the value from group j up
    more = rest >= 128  # another group follows group j
    # group j's 7 bits and the continuation bit: the low byte of `rest`, bit 7 set where more follows
    groups = (rest | (more.view(U8) << 7)).astype(U8)
    n = 1 + np.searchsorted(np.uint64(1) << shifts[1:], v, side="right")
    return _prefixed(prefix, groups, n)


def _prefixed(prefix: bytes, body: np.ndarray, n: np.ndarray) -> Fields:
    # the prefix stays a broadcast view: the one copy is the final join (_flat)
    return [const(prefix, len(body)), Col(body, n)] if prefix else [Col(body, n)]


def _present(fields: Fields, present: np.ndarray) -> Fields:
    if bool(present.all()):  # keep constant sizes constant (a broadcast, cheap to test and add)
        return fields
    for c in fields:
        c.n = c.n * present
    return fields


def _full(rows: int, size: int) -> np.ndarray:
    """`size` for every row, as a read-only broadcast of one value."""
    return np.broadcast_to(np.int64(size), (rows,))


def _is_constant(n: np.ndarray, size: int) -> bool:
    """Whether every row's size is `size`."""
    if len(n) and n.strides == (0,):
        return int(n[0]) == size
    return bool((n == size).all())


def const(data: bytes, rows: int, present: np.ndarray | None = None) -> Col:
    buf = np.broadcast_to(np.frombuffer(data, U8), (rows, len(data)))
    n = _full(rows, len(data))
    return Col(buf, n) if present is None else _present([Col(buf, n)], present)[0]


def lengths(fields: Fields) -> np.ndarray:
    total = np.zeros(len(fields[0].n), np.int64)
    for c in fields:
        total += c.n
    return total


def _flat(cols: Fields, sizes: np.ndarray) -> np.ndarray:
    """Every row's bytes one after the other (row 0's pieces, then row 1's ...); `sizes` is
    `lengths(cols)`. Each piece is written for all rows at once at the rows' running offsets, as one
    element of its width per row (its bytes past a row's size too: the pieces after it overwrite
    them). Bytes that run past a row's end land on the next row's first pieces, so those must be
    carried whole by every row, at least as wide as the overrun, and are written again at the end;
    otherwise `_flat_masked`."""
    widths = [c.buf.shape[1] for c in cols]
    whole = [_is_constant(c.n, w) for c, w in zip(cols, widths)]
    overrun = max((w - int(c.n.min()) for c, w, f in zip(cols, widths, whole) if not f), default=0)
    lead = 0  # the leading pieces that cover any overrun
    while sum(widths[:lead]) < overrun and lead < len(cols) and whole[lead]:
        lead += 1
    if sum(widths[:lead]) < overrun:
        return _flat_masked(cols)
    ends = np.cumsum(sizes)
    total = int(ends[-1]) if len(ends) else 0
    out = np.empty(total + overrun, U8)
    starts = ends - sizes
    at = starts.copy()
    for c, w in zip(cols, widths):
        _elements_at(out, w)[at] = _as_void(c.buf)
        at += c.n
    at = starts
    for c, w in zip(cols[:lead], widths[:lead]):
        _elements_at(out, w)[at] = _as_void(c.buf)
        at = at + w
    return out[:total]


def _elements_at(out: np.ndarray, width: int) -> np.ndarray:
    """`out` (bytes) as overlapping elements of `width` bytes: element i is out[i : i + width]."""
    return _as_void(as_strided(out, (len(out) - width + 1, width), (1, 1)))


def _flat_masked(cols: Fields) -> np.ndarray:
    """`_flat` by keeping, of all pieces side by side, byte j of piece i where j < n_i."""
    rows = len(cols[0].n)
    big = np.empty((rows, sum(c.buf.shape[1] for c in cols)), U8)
    partial = []
    start = 0
    for c in cols:
        width = c.buf.shape[1]
        _as_void(big[:, start : start + width])[:] = _as_void(c.buf)
        if not _is_constant(c.n, width):
            partial.append((start, width, c.n))
        start += width
    if not partial:
        return big.reshape(-1)
    # Most pieces are carried whole by every row: the mask is written only over the others, each
    # row's from a table of the width + 1 possible masks.
    mask = np.ones(big.shape, bool)
    for start, width, n in partial:
        masks = np.arange(width)[None, :] < np.arange(width + 1)[:, None]
        _as_void(mask[:, start : start + width])[:] = _as_void(masks)[n]
    return big[mask]


def _as_void(a: np.ndarray) -> np.ndarray:
    """A (rows, width) array of bytes as a column of `rows` elements of `width` bytes (a view)."""
    return a.view(np.dtype((np.void, a.shape[1])))[:, 0]


class PackedRows:
    """Rows of bytes not yet joined: each row's size, and all rows joined with, optionally, a
    head of bytes before each (an MCAP message record's, so that the records need no second copy)."""

    def __init__(self, fields: Fields, rows: int) -> None:
        self.fields = [c for c in fields if not _is_constant(c.n, 0)]  # a piece no row carries adds nothing
        self.sizes = lengths(self.fields) if self.fields else np.zeros(rows, np.int64)

    def joined(self, heads: np.ndarray | None = None) -> np.ndarray:
        """Every row's bytes one after the other (uint8), each after its row of `heads` (uint8,
        one row per row here, all of one width) when given."""
        cols = self.fields
        if heads is not None:
            cols = [Col(heads, _full(len(heads), heads.shape[1])), *cols]
        sizes = self.sizes if heads is None else self.sizes + heads.shape[1]
        return _flat(cols, sizes) if cols and len(self.sizes) else np.zeros(0, U8)


def field_varint(field: int, values: np.ndarray) -> Fields:
    """A proto3 integer, enum or bool field: omitted when zero."""
    values = np.asarray(values).astype(np.int64)
    return _present(varints(values, _tag(field, _WIRE_VARINT)), values != 0)


def _fixed(field: int, wire: int, v: np.ndarray, size: int, bits: np.dtype) -> Fields:
    body = v.view(U8).reshape(len(v), size)
    # proto3 omits a zero scalar; upb compares the bits (-0.0 is written)
    return _present(_prefixed(_tag(field, wire), body, _full(len(v), size)), v.view(bits) != 0)


def field_fixed64(field: int, values: np.ndarray) -> Fields:
    v = np.ascontiguousarray(np.asarray(values).astype(np.uint64), dtype="<u8")
    return _fixed(field, _WIRE_I64, v, 8, np.dtype(np.uint64))


def field_float(field: int, values: np.ndarray) -> Fields:
    v = np.ascontiguousarray(np.asarray(values, np.float32), dtype="<f4")
    return _fixed(field, _WIRE_I32, v, 4, np.dtype(np.uint32))


def field_double(field: int, values: np.ndarray) -> Fields:
    v = np.ascontiguousarray(np.asarray(values, np.float64), dtype="<f8")
    return _fixed(field, _WIRE_I64, v, 8, np.dtype(np.uint64))


def field_packed_floats(field: int, values: np.ndarray, present: np.ndarray | None = None) -> Fields:
    """A packed repeated float of a fixed count per row; rows not `present` carry none (omitted)."""
    v = np.ascontiguousarray(np.asarray(values, np.float32), dtype="<f4")
    rows, count = v.shape
    head = _tag(field, _WIRE_LEN) + _varint_bytes(4 * count)
    fields = _prefixed(head, v.view(U8).reshape(rows, 4 * count), _full(rows, 4 * count))
    if count == 0:
        return _present(fields, np.zeros(rows, bool))
    return fields if present is None else _present(fields, present)


def field_message(field: int, inner: Fields, present: np.ndarray | None = None) -> Fields:
    """A sub-message: tag, length, its pieces; always written (even empty) unless not `present`."""
    fields = [*varints(lengths(inner), _tag(field, _WIRE_LEN)), *inner]
    return fields if present is None else _present(fields, present)


def lookup(encoded: Sequence[bytes], index: np.ndarray) -> Fields:
    """Row k is encoded[index[k]]: for fields with few distinct values (names, reason sets)."""
    width = max((len(e) for e in encoded), default=0)
    table = np.zeros((len(encoded), max(width, 1)), U8)
    sizes = np.zeros(len(encoded), np.int64)
    for i, e in enumerate(encoded):
        table[i, : len(e)] = np.frombuffer(e, U8)
        sizes[i] = len(e)
    return [Col(table[index], sizes[index])]


def by_value(values: Sequence[Hashable], encode: Callable[[Any], bytes]) -> Fields:
    """Row k is encode(values[k]), encoding each distinct value once."""
    codes: dict[Hashable, int] = {}
    index = np.fromiter((codes.setdefault(v, len(codes)) for v in values), np.int64, len(values))
    return lookup([encode(v) for v in codes], index)


def by_identity(values: Sequence[object], encode: Callable[[Any], bytes]) -> Fields:
    """`by_value` for columns whose equal values are mostly one object (a reason set, a plan id):
    the objects are told apart by identity in numpy, and each distinct one is encoded once."""
    ids = np.fromiter(map(id, values), np.int64, len(values))
    _, first, index = np.unique(ids, return_index=True, return_inverse=True)
    return lookup([encode(values[i]) for i in first.tolist()], index.reshape(-1))


def reason_codes(reasons: Sequence[tuple[Reason, ...]]) -> list[tuple[int, ...]]:
    """Each tick's reasons as plain ints: hashable in C (an enum's hash is a Python call). Ticks
    mostly share their tuple objects (one per reason set), so each object is converted once."""
    code = {i: tuple(map(int, rs)) for i, rs in {id(rs): rs for rs in reasons}.items()}
    return list(map(code.__getitem__, map(id, reasons)))


def string_bytes(field: int, text: str) -> bytes:
    data = text.encode()
    return _tag(field, _WIRE_LEN) + _varint_bytes(len(data)) + data if data else b""


def _packed_enums(field: int, values: Sequence[int]) -> bytes:
    if not values:
        return b""
    body = b"".join(_varint_bytes(v) for v in values)
    return _tag(field, _WIRE_LEN) + _varint_bytes(len(body)) + body


def _strings(field: int, texts: Sequence[str]) -> bytes:
    # repeated string: one record per element, empty ones included
    return b"".join(_tag(field, _WIRE_LEN) + _varint_bytes(len(t.encode())) + t.encode() for t in texts)


def _per_observation(table: TickTable, fields: Fields) -> Fields:
    """Fields made per observation, onto the ticks."""
    return [Col(c.buf[table.obs_index], c.n[table.obs_index]) for c in fields]


def _action(index: np.ndarray, names: Sequence[str], controls: np.ndarray, present: np.ndarray | None) -> Fields:
    """Action {index, name, controls}: an unscored proposal is index -1, no name, no controls."""
    name_index = np.where(index >= 0, index, len(names))
    return [
        *field_varint(1, index),
        *lookup([string_bytes(2, n) for n in names] + [b""], name_index),
        *field_packed_floats(3, controls, present),
    ]


def encode_snapshots(table: TickTable) -> list[bytes]:
    """Every tick's DecisionSnapshot as `snapshot_to_proto(s).SerializeToString(deterministic=True)`
    gives it for `s` in `table.snapshots()`."""
    packed = encode_snapshots_packed(table)
    data = packed.joined().tobytes()
    ends = np.cumsum(packed.sizes).tolist()
    return [data[a:b] for a, b in zip([0, *ends[:-1]], ends)]


def encode_snapshots_packed(table: TickTable) -> PackedRows:
    """`encode_snapshots` as rows not yet joined: what `bulk.write_messages` takes, which writes
    them with their message records' heads in one copy and no bytes object per snapshot."""
    rows = len(table)
    if rows == 0:
        return PackedRows([], 0)
    if StageTimings() != StageTimings(0, 0, 0, 0):  # a replay's per-stage timings are all zero
        raise AssertionError("StageTimings defaults changed: update encode_snapshots")
    scored = table.scored.astype(bool)
    proposed_index = np.where(scored, table.proposed, -1)
    cols = as_columns(table.observations)
    if cols is not None:
        obs_seq = cols.seq
    else:
        obs_seq = np.fromiter((o.seq for o in table.observations), np.int64, len(table.observations))
    fields: Fields = [
        const(string_bytes(1, table.session_id), rows),
        *field_varint(2, np.arange(rows)),
        *field_varint(3, table.tick_ns),
        *field_varint(6, obs_seq[table.obs_index]),
        *field_varint(7, table.age_ns),
        *_per_observation(table, by_identity(table.plan_id, lambda p: string_bytes(8, p))),
        *field_varint(9, table.plan_age_ns),
        const(string_bytes(10, table.model_version), rows),
        *field_message(11, _proposal(table, scored, proposed_index)),
        *field_message(12, _action(table.applied, table.actions, table.applied_controls, None)),
        # by identity: hashing a tuple of enums calls Python per element
        *by_identity(table.reasons, lambda rs: _packed_enums(13, [int(r) for r in rs])),
        *field_varint(14, table.safety_state),
    ]
    if table.gate_score is not None:
        threshold = table.gate_threshold if table.gate_threshold is not None else np.zeros(rows)
        gate = [*field_float(1, table.gate_score), *field_float(2, threshold), *field_varint(3, table.gate_veto)]
        fields += field_message(15, gate)
    if table.decision_vector is not None:
        fields += field_packed_floats(16, table.decision_vector)
    fields += [
        *field_fixed64(17, table.input_hash),
        const(b"\x92\x01\x00", rows),  # timings (18): present and empty, a replay has none per tick
        const(b"\x98\x01\x01" if table.shadow else b"", rows),
        *field_varint(21, table.observations_dropped),
        *field_varint(23, table.held),
        *field_varint(24, table.observation_period_ns),
        *field_varint(25, table.plan_state),
        *field_varint(26, table.plan_valid_for_ns),
    ]
    fields += _check_fields(table)
    fields += _invalid_input(table, cols)
    # hazard_lights (37): while the fallback's reason stands
    fields += by_identity(table.reasons, lambda rs: b"\xa8\x02\x01" if Reason.FALLBACK in rs else b"")
    return PackedRows(fields, rows)


def _proposal(table: TickTable, scored: np.ndarray, proposed_index: np.ndarray) -> Fields:
    """The proposal's fields (DecisionSnapshot.proposal): zeros where the model proposed nothing."""
    rows = len(table)
    zero_f = np.zeros(rows, np.float32)
    return [
        *field_message(1, _action(proposed_index, table.actions, table.proposed_controls, scored)),
        *field_packed_floats(2, table.probabilities, scored),
        *field_float(3, np.where(scored, table.confidence, zero_f)),
        *field_float(4, np.where(scored, table.margin, zero_f)),
    ]


def _check_fields(table: TickTable) -> Fields:
    """The check table (28, a message per check) and the vetoing checks' kinds (29); none without checks."""
    if table.checks is None or not len(table.check_kinds):
        return []
    rows = len(table)
    fields: Fields = []
    for j, kind in enumerate(table.check_kinds):
        c = table.checks[:, j]
        result = [
            const(_tag(1, _WIRE_VARINT) + _varint_bytes(int(kind)) if int(kind) else b"", rows),
            const(string_bytes(2, CHECK_NAMES[kind]), rows),
            *field_double(3, c["score"]),
            *field_double(4, c["threshold"]),
            *field_varint(5, c["veto"]),
            *field_varint(6, c["status"]),
        ]
        fields += field_message(28, result)
    kinds = [int(k) for k in table.check_kinds]
    vetoes = table.checks["veto"].astype(bool)
    bits = (vetoes * (1 << np.arange(len(kinds), dtype=np.int64))).sum(axis=1)
    distinct, index = np.unique(bits, return_inverse=True)
    fields += lookup(
        [_packed_enums(29, [k for i, k in enumerate(kinds) if (b >> i) & 1]) for b in distinct.tolist()],
        index.reshape(-1),
    )
    return fields


def _invalid_input(table: TickTable, cols: ObservationColumns | None) -> Fields:
    """invalid_input (35), per observation: its parts, and whether its features were finite."""
    finite = np.ones(len(table.observations), bool)
    finite[table.obs_index] = table.finite
    if cols is not None:  # columns have nothing discarded on receipt
        return _per_observation(table, lookup([b"", _strings(35, ["features"])], (~finite).astype(np.int64)))
    invalid = [
        tuple(o.invalid_parts) if f else ("features", *o.invalid_parts)
        for o, f in zip(table.observations, finite.tolist())
    ]
    return _per_observation(table, by_value(invalid, lambda parts: _strings(35, parts)))
