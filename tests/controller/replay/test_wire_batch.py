"""wire_batch's joining of rows (and of MCAP record heads with them) against the obvious byte loop,
and the bulk writer given rows not yet joined against the same messages as bytes."""

from __future__ import annotations

import numpy as np
import pytest

from dualloop.controller.contract.wire import snapshot_to_proto
from dualloop.controller.logs.bulk import TopicMessages, write_messages
from dualloop.controller.logs.format import TOPIC_OBSERVATION, TOPIC_SNAPSHOT
from dualloop.controller.logs.logfile import read_log
from dualloop.controller.logs.synthetic import synthetic_log
from dualloop.controller.replay import wire_batch
from dualloop.controller.replay.lockstep import LoadedModel, _observations, executor_config_for
from dualloop.controller.replay.wire_batch import (
    Col,
    PackedRows,
    _varint_bytes,
    const,
    encode_snapshots,
    field_double,
    field_varint,
    varints,
)
from dualloop.controller.replay.wire_batch import (
    _flat_masked as flat_masked,
)
from dualloop.executor.lockstep_batch import run_lockstep
from dualloop.executor.snapshot import Clock
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES
from dualloop.v2 import controller_pb2 as pb


def _random_fields(rng: np.random.Generator, rows: int) -> list[Col]:
    fields = []
    for _ in range(int(rng.integers(1, 12))):
        width = int(rng.integers(1, 12))
        kind = rng.integers(0, 4)
        if kind == 0:  # a constant carried by some rows
            fields.append(const(rng.bytes(width), rows, rng.random(rows) < 0.5))
            continue
        buf = rng.integers(0, 256, (rows, width), dtype=np.uint8)
        n = {
            1: np.full(rows, width),  # carried whole by every row
            2: np.zeros(rows, np.int64),  # by none
            3: rng.integers(0, width + 1, rows),  # a varying prefix
        }[int(kind)]
        fields.append(Col(buf, np.asarray(n, np.int64)))
    return fields


def _by_loop(fields: list[Col], rows: int, heads: np.ndarray | None) -> bytes:
    out = b""
    for k in range(rows):
        if heads is not None:
            out += heads[k].tobytes()
        out += b"".join(c.buf[k, : c.n[k]].tobytes() for c in fields)
    return out


@pytest.mark.parametrize("rows", [0, 1, 2, 37, 300])
@pytest.mark.parametrize("with_heads", [False, True])
def test_joined_rows_are_the_pieces_byte_by_byte(rows, with_heads):
    rng = np.random.default_rng(rows * 2 + with_heads)
    for _ in range(20):
        fields = _random_fields(rng, rows)
        expected_sizes = [sum(int(c.n[k]) for c in fields) for k in range(rows)]
        heads = rng.integers(0, 256, (rows, 31), dtype=np.uint8) if with_heads else None
        packed = PackedRows(fields, rows)
        assert packed.sizes.tolist() == expected_sizes
        assert packed.joined(heads).tobytes() == _by_loop(fields, rows, heads)


def test_rows_no_piece_carries_are_empty_rows():
    rows = 5
    packed = PackedRows([Col(np.ones((rows, 3), np.uint8), np.zeros(rows, np.int64))], rows)
    assert packed.sizes.tolist() == [0] * rows and packed.joined().tobytes() == b""
    heads = np.arange(rows * 2, dtype=np.uint8).reshape(rows, 2)
    assert packed.joined(heads).tobytes() == heads.tobytes()


@pytest.mark.parametrize("chunk_bytes", [50, 1000, 256 * 1024])
def test_bulk_writer_takes_rows_not_yet_joined(tmp_path, chunk_bytes):
    rng = np.random.default_rng(chunk_bytes)
    rows = 200
    fields = _random_fields(rng, rows)
    packed = PackedRows(fields, rows)
    data = packed.joined().tobytes()
    ends = np.cumsum(packed.sizes).tolist()
    messages = [data[a:b] for a, b in zip([0, *ends[:-1]], ends)]
    times = np.cumsum(rng.integers(1, 10**6, rows))
    observations = TopicMessages(TOPIC_OBSERVATION, [b"\x08\x01"] * 3, times[:3])

    def written(name: str, snapshots: TopicMessages) -> bytes:
        return write_messages(tmp_path / name, "s", [observations, snapshots], chunk_bytes).read_bytes()

    as_bytes = written("bytes.mcap", TopicMessages(TOPIC_SNAPSHOT, messages, times))
    for given in (packed, (packed.joined(), packed.sizes)):
        views, sizes = TopicMessages(TOPIC_SNAPSHOT, [], times, packed=given).messages()
        assert [bytes(v) for v in views] == messages and sizes.tolist() == list(map(len, messages))
    assert written("rows.mcap", TopicMessages(TOPIC_SNAPSHOT, [], times, packed=packed)) == as_bytes
    flat = (packed.joined(), packed.sizes)
    assert written("flat.mcap", TopicMessages(TOPIC_SNAPSHOT, [], times, packed=flat)) == as_bytes


def test_varints_are_protobufs_varints():
    rng = np.random.default_rng(7)
    edges = [0, 1, 127, 128, 16383, 16384, 2**63 - 1, -1, -(2**63), 300]
    edges += [2 ** (7 * k) + d for k in range(1, 9) for d in (-1, 0)]
    for values in (
        np.array(edges, np.int64),
        rng.integers(-(2**63), 2**63 - 1, 500, dtype=np.int64),
        rng.integers(0, 128, 50),  # one byte each
        rng.integers(0, 2**20, 50),
        np.array([5]),
        np.zeros(0, np.int64),
    ):
        cols = varints(values, b"\x08")
        packed = PackedRows(cols, len(values))
        expected = [b"\x08" + _varint_bytes(int(v)) for v in values]
        assert packed.joined().tobytes() == b"".join(expected)
        assert packed.sizes.tolist() == [len(e) for e in expected]


def test_fields_with_presence_are_omitted_where_absent():
    values = np.array([0, 3, 0, 200, 0], np.int64)
    packed = PackedRows([*field_varint(2, values), *field_double(3, values.astype(float))], len(values))
    expected = [(b"\x10" + _varint_bytes(int(v)) + b"\x19" + np.float64(v).tobytes()) if v else b"" for v in values]
    assert packed.joined().tobytes() == b"".join(expected) and packed.sizes.tolist() == list(map(len, expected))


@pytest.mark.parametrize("lead_width", [0, 3, 12])
def test_rows_written_in_place_and_by_mask_are_the_same(monkeypatch, lead_width):
    """_flat writes each piece over the rows' running offsets when the rows start with pieces wide
    enough to be written again over what the previous row's partial pieces ran into; otherwise it
    keeps bytes by a mask. Both give the loop's bytes, and each is taken where it should be."""
    masked = []
    monkeypatch.setattr(wire_batch, "_flat_masked", lambda cols: masked.append(1) or flat_masked(cols))
    rng = np.random.default_rng(lead_width)
    rows = 50
    for _ in range(30):
        lead = [const(rng.bytes(lead_width), rows)] if lead_width else []
        fields = [*lead, *_random_fields(rng, rows)]
        packed = PackedRows(fields, rows)
        overrun = max(
            (c.buf.shape[1] - int(c.n.min()) for c in packed.fields if (c.n != c.buf.shape[1]).any()), default=0
        )
        first_whole = bool(packed.fields) and (packed.fields[0].n == packed.fields[0].buf.shape[1]).all()
        covered = overrun == 0 or (lead_width >= overrun and first_whole)
        before = len(masked)
        assert packed.joined().tobytes() == _by_loop(fields, rows, None)
        if covered:
            assert len(masked) == before
    if lead_width == 0:
        assert masked  # random first pieces that do not cover: the mask path was taken
    if lead_width == 12:
        assert len(masked) < 30  # and pieces written in place


# DecisionSnapshot fields a LOCKSTEP replay leaves at their default: wall-clock and REALTIME counters, the
# candidate model (never loaded by a replay), the plan (synthetic logs carry none; test_columns.py's plan logs
# compare those files). Every other field is set on some tick below, so its literal field number is compared.
NEVER_SET_BY_THESE_REPLAYS = {
    "emit_time_ns",
    "lateness_us",
    "max_lateness_since_previous_us",
    "observation_age_with_transport_ns",
    "transport_delay_ns",
    "ticks_missed_since_previous",
    "snapshots_conflated_since_previous",
    "snapshots_dropped",
    "observations_dropped",
    "candidate_never_applied",
    "plan",
}


def test_the_encoders_comparison_sets_every_field_of_the_snapshot(tmp_path):
    """wire_batch writes DecisionSnapshot's field numbers as literals: the comparison with the serialiser
    must see every field set at least once, or a field added to controller.proto (or renumbered) could be
    missing from the encoder and no byte comparison would notice."""
    seen: set[str] = set()
    for rate_hz, faults, decision_vector in [(150.0, True, False), (10.0, False, True)]:
        data = read_log(synthetic_log(tmp_path / f"{rate_hz}.mcap", seconds=5.0, rate_hz=rate_hz, faults=faults))
        ex = LoadedModel.load(BASE_MODEL_PATH, DEFAULT_GATES).executor(executor_config_for(data.header))
        ex.open_session("s", Clock.LOCKSTEP, shadow=True, include_decision_vector=decision_vector)
        table = run_lockstep(ex, "s", _observations(data))
        messages = [snapshot_to_proto(s) for s in table.snapshots()]
        assert encode_snapshots(table) == [m.SerializeToString(deterministic=True) for m in messages]
        seen |= {field.name for m in messages for field, _ in m.ListFields()}
    every = {field.name for field in pb.DecisionSnapshot.DESCRIPTOR.fields}
    assert NEVER_SET_BY_THESE_REPLAYS <= every, NEVER_SET_BY_THESE_REPLAYS - every
    assert every - seen == NEVER_SET_BY_THESE_REPLAYS, "set these fields in the comparison: " + str(
        sorted(every - seen - NEVER_SET_BY_THESE_REPLAYS)
    )
