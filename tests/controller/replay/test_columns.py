"""Replay from columns: observations decoded column-wise from their bytes are the parsed
messages, only the canonical encoding is taken, and a replay from columns gives the Observation
path's ticks, report and evaluation, and the per-tick path's file byte for byte."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from google.protobuf.message import DecodeError

from dualloop.controller.contract.wire import observation_from_proto, snapshot_to_proto
from dualloop.controller.logs.format import ACTUAL_CONTROLS_DETAIL
from dualloop.controller.logs.logfile import read_log, write_log
from dualloop.controller.logs.synthetic import REAL_DRIVE, slice_log, synthetic_log
from dualloop.controller.replay.evaluation import evaluate_replay
from dualloop.controller.replay.lockstep import (
    LoadedModel,
    ReplayOptions,
    SessionOptions,
    _observations,
    executor_config_for,
    read_columns,
    replay_log,
    run_replay,
)
from dualloop.controller.replay.report import summarise
from dualloop.controller.replay.wire_batch import encode_snapshots
from dualloop.controller.replay.wire_columns import NotCanonical, decode_observations
from dualloop.executor.columns import ObservationColumns
from dualloop.executor.lockstep_batch import TickTable, run_lockstep
from dualloop.executor.snapshot import Clock
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES, TEST_MODEL_PATH
from dualloop.v2 import controller_pb2 as pb


def _same_observation(a, b) -> None:
    assert (a.seq, a.timestamp_ns, a.actual_index, a.sent_time_ns) == (
        b.seq,
        b.timestamp_ns,
        b.actual_index,
        b.sent_time_ns,
    )
    assert a.features.dtype == b.features.dtype == np.float32 and a.features.tobytes() == b.features.tobytes()
    assert (a.actual_controls is None) == (b.actual_controls is None)
    if a.actual_controls is not None:
        assert a.actual_controls.tobytes() == b.actual_controls.tobytes()
    assert (a.plan_id, a.plan_valid_for_ns, a.plan_created_ns) == (b.plan_id, b.plan_valid_for_ns, b.plan_created_ns)
    assert (a.plan_values is None) == (b.plan_values is None)
    if a.plan_values is not None:
        assert a.plan_values.dtype == b.plan_values.dtype == np.float32
        assert a.plan_values.tobytes() == b.plan_values.tobytes()
    assert a.invalid_parts == () == b.invalid_parts
    assert (a.history is None) == (b.history is None)  # a session's current observation has its history
    if a.history is not None:
        assert a.history.tobytes() == b.history.tobytes()


def _random_messages(seed: int, n: int, with_actual: str, with_plan: str = "none") -> list[pb.Observation]:
    """Observations with extreme values: negative and huge integers, NaN, -0.0 and infinite floats
    (plans: finite values, empty and non-ASCII ids, zero and extreme times)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        m = pb.Observation(seq=int(rng.integers(1, 2**62)), timestamp_ns=int(rng.integers(-(2**63), 2**63 - 1)))
        x = rng.standard_normal(7).astype(np.float32) * np.float32(10.0 ** rng.integers(-30, 30))
        x[rng.integers(0, 7)] = rng.choice(np.array([np.nan, -0.0, np.inf, -np.inf, 0.0], np.float32))
        m.features.extend(x.tolist())
        if rng.random() < 0.5:
            m.sent_time_ns = int(rng.integers(-(2**40), 2**40))
        if with_actual == "controls" or (with_actual == "some" and i % 3):
            m.actual.action_index = int(rng.choice([-1, 0, 3, -(2**31), 2**31 - 1]))
            if with_actual == "controls":
                m.actual.controls.extend(rng.standard_normal(2).astype(np.float32).tolist())
        if with_plan == "all" or (with_plan == "some" and i % 4 == 0):
            m.plan.plan_id = str(rng.choice(["", "a", "p12", "plan \u00e9\u2713"]))
            v = rng.standard_normal(3).astype(np.float32) * np.float32(10.0 ** rng.integers(-30, 30))
            v[rng.integers(0, 3)] = rng.choice(np.array([-0.0, 0.0, 3.4e38], np.float32))
            m.plan.values.extend(v.tolist())
            m.plan.valid_for_ns = int(rng.choice([0, -1, 2**62, 50_000_000]))
            m.plan.created_ns = int(rng.choice([0, -(2**63), m.timestamp_ns, 2**63 - 1]))
        out.append(m)
    return out


@pytest.mark.parametrize(
    "seed,with_actual,with_plan",
    [(0, "controls", "none"), (1, "some", "some"), (2, "none", "none"), (3, "controls", "all"), (4, "none", "some")],
)
def test_decoded_columns_are_the_parsed_messages(seed, with_actual, with_plan):
    messages = _random_messages(seed, 300, with_actual, with_plan)
    blobs = [m.SerializeToString(deterministic=True) for m in messages]
    cols = decode_observations(blobs)
    assert isinstance(cols, ObservationColumns) and len(cols) == len(messages)
    for i, blob in enumerate(blobs):
        _same_observation(cols[i], observation_from_proto(pb.Observation.FromString(blob), 0))
    assert cols[-1].seq == messages[-1].seq and len(cols[10:20]) == 10
    assert (cols.plans is None) == (with_plan == "none")


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("features", [0, 1, 7])
def test_decoded_columns_of_one_or_two_messages_with_few_or_no_features(n, features):
    # the payloads are copied by rows of a window view of the bytes: a message's last bytes, and none
    messages = [pb.Observation(seq=i + 1, timestamp_ns=2**60 + i, features=[1.5] * features) for i in range(n)]
    if features:  # the last bytes of the buffer are a control
        messages[-1].actual.action_index = 2
        messages[-1].actual.controls.extend([-0.25, 3.0])
    blobs = [m.SerializeToString(deterministic=True) for m in messages]
    cols = decode_observations(blobs)
    for i, blob in enumerate(blobs):
        _same_observation(cols[i], observation_from_proto(pb.Observation.FromString(blob), 0))


def test_decoded_columns_of_the_real_drive():
    data = read_log(REAL_DRIVE)
    cols = decode_observations([o.SerializeToString(deterministic=True) for o in data.observations])
    for a, b in zip(cols, _observations(data)):
        _same_observation(a, b)


def _varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b, v = v & 0x7F, v >> 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


_FEATURES = b"\x1a\x08" + struct.pack("<2f", 1.0, 2.0)
_GOOD = b"\x08\x05\x10\x80\x01" + _FEATURES  # seq 5, timestamp 128, two features

# Encodings protobuf parses but would write differently (copying them to a new log would change
# its bytes) or cannot parse at all: the decoder refuses every one.
NOT_CANONICAL = {
    "fields out of order": b"\x10\x80\x01\x08\x05" + _FEATURES,
    "a field twice": _GOOD + b"\x08\x06",
    "a zero written out": b"\x08\x05\x10\x80\x01" + _FEATURES + b"\x30\x00",
    "a varint not minimal": b"\x08\x85\x00\x10\x80\x01" + _FEATURES,
    "features not packed": b"\x08\x05\x10\x80\x01\x1d" + struct.pack("<f", 1.0) + b"\x1d" + struct.pack("<f", 2.0),
    "an empty packed field": b"\x08\x05\x10\x80\x01\x1a\x00",
    "an unknown field": _GOOD + b"\x38\x01",
    "an unknown plan field": _GOOD + b"\x2a\x02\x28\x01",
    "an empty plan id written out": _GOOD + b"\x2a\x02\x0a\x00",
    "a zero plan validity written out": _GOOD + b"\x2a\x02\x18\x00",
    "plan fields out of order": _GOOD + b"\x2a\x06\x18\x01\x0a\x02p1",
    "a plan id not UTF-8": _GOOD + b"\x2a\x04\x0a\x02\xff\xfe",
    "a non-finite plan": _GOOD + b"\x2a\x06\x12\x04" + struct.pack("<f", float("nan")),
    "an int32 in five bytes": _GOOD + b"\x22\x06\x08" + b"\xff\xff\xff\xff\x0f",
    "a length past the end": b"\x08\x05\x10\x80\x01\x1a\x7f" + struct.pack("<2f", 1.0, 2.0),
}


@pytest.mark.parametrize("case", sorted(NOT_CANONICAL))
def test_the_decoder_takes_only_the_canonical_encoding(case):
    bad = NOT_CANONICAL[case]
    assert decode_observations([_GOOD, _GOOD.replace(b"\x08\x05", b"\x08\x06")]).seq.tolist() == [5, 6]
    with pytest.raises(NotCanonical):
        decode_observations([_GOOD, bad])
    # why it must (but for a non-finite plan, discarded on receipt, and an unknown field): protobuf
    # writes it back otherwise, or fails
    try:
        again = pb.Observation.FromString(bad).SerializeToString(deterministic=True)
    except DecodeError:
        return
    assert (again == bad) == (case in ("a non-finite plan", "an unknown field", "an unknown plan field"))


def test_plans_are_decoded_and_plans_of_different_lengths_left_to_the_message_path():
    planned = _GOOD + b"\x2a\x04\x0a\x02p1"  # a plan with an id and no values
    cols = decode_observations([_GOOD, planned])
    assert cols.plans is not None and cols.plans.present.tolist() == [False, True]
    assert cols[1].plan_id == "p1" and cols[1].plan_values is not None and cols[1].plan_values.shape == (0,)
    assert cols[0].plan_values is None and decode_observations([_GOOD, _GOOD]).plans is None
    one = pb.Observation(seq=1, timestamp_ns=1, features=[1.0], plan=pb.PlanUpdate(values=[1.0]))
    two = pb.Observation(seq=2, timestamp_ns=2, features=[1.0], plan=pb.PlanUpdate(values=[1.0, 2.0]))
    with pytest.raises(NotCanonical):
        decode_observations([one.SerializeToString(), two.SerializeToString()])


def test_features_of_different_lengths_and_controls_on_some_actions_are_left_to_the_message_path():
    short = pb.Observation(seq=2, timestamp_ns=2, features=[1.0]).SerializeToString()
    with pytest.raises(NotCanonical):
        decode_observations([_GOOD, short])
    a = pb.Observation(seq=1, timestamp_ns=1, features=[1.0], actual=pb.ActualAction(action_index=1, controls=[0.5]))
    b = pb.Observation(seq=2, timestamp_ns=2, features=[1.0], actual=pb.ActualAction(action_index=1))
    with pytest.raises(NotCanonical):
        decode_observations([a.SerializeToString(), b.SerializeToString()])


def _without_plans(tmp_path, faults: bool) -> object:
    """The synthetic log (with every fault) without its plans: a log the column path takes."""
    log = synthetic_log(tmp_path / "plans.mcap", seconds=5.0, rate_hz=150.0, faults=faults)
    data = read_log(log)
    for o in data.observations:
        o.ClearField("plan")
    header = data.header
    header.source_details.clear()  # plans are not required
    header.source_details[ACTUAL_CONTROLS_DETAIL] = "command"
    return write_log(tmp_path / "no-plans.mcap", header, data.observations)


def _with_plans(tmp_path, kind: str, nonfinite: bool = False) -> object:
    """A log the column path takes, its plans as the synthetic log makes them ("synthetic": one
    every 0.2 s, none after 3.2 s of a drive with every fault) or changing every way ("changing":
    ids repeated, changed and empty, validities and creation times given, on a third of the
    observations); nonfinite: some plans hold NaN or Inf (the message path's)."""
    log = synthetic_log(tmp_path / "plans.mcap", seconds=5.0, rate_hz=150.0, faults=kind == "synthetic")
    data = read_log(log)
    header = data.header
    header.source_details[ACTUAL_CONTROLS_DETAIL] = "command"
    if kind == "changing":
        header.source_details.clear()  # plans are not required: ticks before the first are planless
        for i, o in enumerate(data.observations):
            o.ClearField("plan")
            if i < 40 or i % 3:
                continue
            k = i // 9
            o.plan.plan_id = ["", "a", "a", "b", f"p{k}", "\u00e9"][k % 6]
            o.plan.values.extend([20.0 + k % 5, 0.5 * (k % 3), 0.0, 1.0 if k % 2 else 0.0, 0.0, 0.0])
            o.plan.valid_for_ns = [0, 30_000_000, 400_000_000][k % 3]
            o.plan.created_ns = [0, o.timestamp_ns - 20_000_000, o.timestamp_ns][k % 4 % 3]
    if nonfinite:
        planned = [o for o in data.observations if o.HasField("plan")]
        planned[3].plan.values[0] = float("nan")
        planned[7].plan.values[2] = float("-inf")
    return write_log(tmp_path / f"{kind}.mcap", header, data.observations)


def test_plan_logs_and_replayed_logs_are_read_by_the_message_path(tmp_path):
    assert read_columns(synthetic_log(tmp_path / "s.mcap", seconds=1.0)) is not None  # plans: columns too
    assert read_columns(_with_plans(tmp_path, "changing", nonfinite=True)) is None  # discarded on receipt
    replayed = replay_log(REAL_DRIVE, TEST_MODEL_PATH, out_path=tmp_path / "r.mcap").out_path
    assert replayed is not None and read_columns(replayed) is None  # snapshots too
    assert read_columns(REAL_DRIVE) is not None
    assert read_columns(REAL_DRIVE, "no such session") is None  # read_log then names the sessions


def _tables(log, model, gates, actual_is_command):
    """The fast path's TickTable from columns and from Observations, and the per-tick snapshots."""
    columns = read_columns(log)
    assert columns is not None
    data = read_log(log)
    loaded = LoadedModel.load(model, gates)
    out = []
    for obs, fast in ((columns.observations, True), (_observations(data), True), (_observations(data), False)):
        tables: list[TickTable] = []
        ex = loaded.executor(executor_config_for(data.header))
        snaps, _ = run_replay(
            ex, "s", obs, SessionOptions(actual_is_command=actual_is_command), fast=fast, table_out=tables
        )
        out.append((ex, tables[0] if tables else None, snaps))
    return data, out


@pytest.mark.parametrize(
    "model,gates,faults,command,plans",
    [
        (BASE_MODEL_PATH, DEFAULT_GATES, True, True, ""),
        (BASE_MODEL_PATH, DEFAULT_GATES, False, False, ""),
        (TEST_MODEL_PATH, (), True, False, ""),
        (BASE_MODEL_PATH, DEFAULT_GATES, True, True, "synthetic"),
        (BASE_MODEL_PATH, DEFAULT_GATES, False, True, "changing"),
        (TEST_MODEL_PATH, (), False, False, "changing"),
    ],
)
def test_replay_from_columns_is_the_replay_from_observations(tmp_path, model, gates, faults, command, plans):
    log = _with_plans(tmp_path, plans) if plans else _without_plans(tmp_path, faults)
    data, ((ex_c, cols, snaps_c), (ex_o, obs, snaps_o), (_, _, plain)) = _tables(log, model, gates, command)
    assert cols is not None and obs is not None and isinstance(cols.observations, ObservationColumns)
    assert encode_snapshots(cols) == encode_snapshots(obs)  # every field, byte for byte
    for name in ("applied", "safety_state", "gate_veto", "input_hash", "observation_period_ns", "finite"):
        assert np.array_equal(getattr(cols, name), getattr(obs, name)), name
    assert [s.applied.index for s in snaps_c] == [s.applied.index for s in plain]
    assert [s.reasons for s in snaps_c] == [s.reasons for s in plain]
    drive_s = (data.observations[-1].timestamp_ns - data.observations[0].timestamp_ns) / 1e9
    reports = [
        summarise(t, ex, len(data.observations), drive_s, log, {}).as_dict() for t, ex in ((cols, ex_c), (obs, ex_o))
    ]
    assert json.dumps(reports[0], sort_keys=True) == json.dumps(reports[1], sort_keys=True)
    if model == BASE_MODEL_PATH:  # the test model's actions are not the label bands: no evaluation
        evaluations = [
            evaluate_replay(t, t.observations, ex.card, log).as_dict() for t, ex in ((cols, ex_c), (obs, ex_o))
        ]
        assert json.dumps(evaluations[0], sort_keys=True) == json.dumps(evaluations[1], sort_keys=True)
    if faults and gates:  # the faults reach the columns path: non-finite input, vetoes
        assert not cols.finite.all() and cols.gate_veto.any()
    if plans:  # and the plans: adopted, changing, stale or missing
        assert isinstance(cols.observations, ObservationColumns) and cols.observations.plans is not None
        assert len(set(cols.plan_id)) > 3 and len(set(cols.plan_state.tolist())) > 1
        assert cols.plan_id == obs.plan_id and np.array_equal(cols.plan_age_ns, obs.plan_age_ns)
        assert np.array_equal(cols.plan_valid_for_ns, obs.plan_valid_for_ns)


def test_a_session_fed_plan_columns_is_left_as_one_fed_observations(tmp_path):
    log = _with_plans(tmp_path, "changing")
    columns, data = read_columns(log), read_log(log)
    assert columns is not None and columns.observations.plans is not None
    loaded = LoadedModel.load(BASE_MODEL_PATH, DEFAULT_GATES)
    left = []
    for obs in (columns.observations, _observations(data)):
        ex = loaded.executor(executor_config_for(data.header))
        ex.open_session("s", Clock.LOCKSTEP)
        run_lockstep(ex, "s", obs)
        left.append(ex.session("s"))
    a, b = left
    assert (a.plan_id, a.plan_created_ns, a.plan_valid_for_ns, a.has_plan) == (
        b.plan_id,
        b.plan_created_ns,
        b.plan_valid_for_ns,
        b.has_plan,
    )
    assert a.has_plan and a.plan.tobytes() == b.plan.tobytes()
    _same_observation(a.current, b.current)


_BAD_PLANS = {  # (what to do, to how many of the plans: every plan, or the middle one)
    # plans of different sizes are left to the message path by the decoder: every plan is too long
    "plans of the wrong size": (lambda o: o.plan.values.append(1.0), "all"),
    "a negative validity": (lambda o: setattr(o.plan, "valid_for_ns", -5), "one"),
    "a plan made after its observation": (lambda o: setattr(o.plan, "created_ns", o.timestamp_ns + 1), "one"),
}


@pytest.mark.parametrize("case", sorted(_BAD_PLANS))
def test_a_bad_plan_fails_the_columns_as_it_fails_the_observations(tmp_path, case):
    data = read_log(_with_plans(tmp_path, "changing"))
    planned = [o for o in data.observations if o.HasField("plan")]
    spoil, which = _BAD_PLANS[case]
    first_bad = planned[0] if which == "all" else planned[len(planned) // 2]
    for o in planned if which == "all" else [first_bad]:
        spoil(o)
    log = write_log(tmp_path / "bad.mcap", data.header, data.observations)
    columns = read_columns(log)
    assert columns is not None
    loaded = LoadedModel.load(BASE_MODEL_PATH)
    errors = []
    for obs in (columns.observations, _observations(read_log(log))):
        with pytest.raises(ValueError) as err:
            run_replay(loaded.executor(executor_config_for(data.header)), "s", obs)
        errors.append(str(err.value))
    assert errors[0] == errors[1] and f"seq {first_bad.seq}" in errors[0], errors


@pytest.mark.parametrize(
    "source,plots", [("real", False), ("faults", False), ("real", True), ("synthetic", False), ("changing", True)]
)
def test_replay_log_from_columns_writes_the_per_tick_paths_file(tmp_path, source, plots):
    if source == "real":
        log = slice_log(tmp_path / "real.mcap", 1000, 1500, "real")
    else:
        log = _without_plans(tmp_path, True) if source == "faults" else _with_plans(tmp_path, source)
    assert read_columns(log) is not None
    fast = replay_log(
        log, BASE_MODEL_PATH, DEFAULT_GATES, out_path=tmp_path / "fast.mcap", options=ReplayOptions(plots=plots)
    )
    # the file the message path writes: the parsed observations and each snapshot serialised
    reference = write_log(
        tmp_path / "ref.mcap",
        fast.header,
        read_log(log).observations,
        (snapshot_to_proto(s) for s in fast.snapshots),
        plots=plots,
    )
    assert fast.out_path is not None and fast.out_path.read_bytes() == reference.read_bytes()
    # and the ticks are the per-tick path's
    plain = replay_log(log, BASE_MODEL_PATH, DEFAULT_GATES, options=ReplayOptions(fast=False))
    assert [s.applied.index for s in fast.snapshots] == [s.applied.index for s in plain.snapshots]
    assert [s.reasons for s in fast.snapshots] == [s.reasons for s in plain.snapshots]
