"""Foxglove-friendly recordings: the per-session plot topic read back the way Foxglove reads it
(the schema embedded in the file, decoded by field name with mcap_protobuf), from the real server's
recorder and from a replay; its log_time; the layout's paths against a recording."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from mcap.reader import make_reader
from mcap_protobuf.decoder import DecoderFactory

from dualloop.controller.cli import main
from dualloop.controller.contract.client import DriveSession
from dualloop.controller.contract.wire import snapshot_to_proto
from dualloop.controller.demo.closed_loop import session_id as demo_session_id
from dualloop.controller.demo.suite import HELD_OUT_SEED
from dualloop.controller.logs.foxglove import layout, layout_paths
from dualloop.controller.logs.logfile import read_log, read_sessions, write_log
from dualloop.controller.logs.plot import (
    UNIX_TIME_FLOOR_NS,
    PlotSchema,
    field_names,
    is_plot_topic,
    log_time_offset_ns,
    plot_topic,
)
from dualloop.controller.logs.synthetic import synthetic_log
from dualloop.controller.replay.lockstep import ReplayOptions, replay_log
from dualloop.controller.serve.config import ServerConfig
from dualloop.controller.serve.lifecycle import ServerThread
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES
from dualloop.sim.scenarios import SCENARIOS
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import log_pb2
from tests.controller.serve.inputs import sensor
from tests.paths import FIXTURES

REPO = Path(__file__).resolve().parents[3]
SHIPPED_LAYOUT = REPO / "docs" / "foxglove" / "dualloop-layout.json"
YEAR_2020_NS = 1_577_836_800 * 10**9


def decoded(path: Path) -> dict[str, list[tuple[int, dict[str, str], object]]]:
    """topic -> [(log_time, channel metadata, decoded message)], as Foxglove decodes a file: the
    schema from the file itself, no dualloop stubs."""
    out: dict[str, list[tuple[int, dict[str, str], object]]] = {}
    with open(path, "rb") as f:
        reader = make_reader(f, decoder_factories=[DecoderFactory()])
        for _, channel, message, proto in reader.iter_decoded_messages():
            out.setdefault(channel.topic, []).append((message.log_time, dict(channel.metadata), proto))
    return out


def _send(session: DriveSession, seq: int, t_ns: int) -> None:
    session.send_raw(pb.DriveRequest(observation=pb.Observation(seq=seq, timestamp_ns=t_ns, features=sensor(seq))))


@pytest.fixture(scope="module")
def live_recording(tmp_path_factory, test_model, test_model_path):
    """One REALTIME and one LOCKSTEP session (an id with characters a message path cannot take)
    through the real server on loopback, recorded by its recorder."""
    tmp = tmp_path_factory.mktemp("live")
    config = ServerConfig(model=test_model_path, port=0, record_dir=tmp / "rec")
    wall_before = time.time_ns()
    with ServerThread(config, test_model) as srv:
        with grpc.insecure_channel(srv.address) as channel:
            lock = DriveSession(channel, "lock step.1", pb.CLOCK_MODE_LOCKSTEP, shadow=True)
            for i in range(60):
                _send(lock, i + 1, 1_000_000_000 + i * 10_000_000)
            lock.close()
            lockstep = list(lock.snapshots())
            live = DriveSession(channel, "rt-1", pb.CLOCK_MODE_REALTIME, shadow=True)
            for i in range(30):
                _send(live, i + 1, time.monotonic_ns())
                time.sleep(0.01)
            live.close()
            list(live.snapshots())
    wall_after = time.time_ns()
    (log,) = sorted((tmp / "rec").glob("*.mcap"))
    return log, lockstep, wall_before, wall_after


def test_the_recorders_sessions_each_have_a_plot_topic_decoded_by_name(live_recording, test_model):
    log, lockstep, _, _ = live_recording
    topics = decoded(log)
    lock_topic, live_topic = plot_topic("lock step.1"), plot_topic("rt-1")
    assert lock_topic == "/dualloop/escaped/lock_20step_2e1/plot" and live_topic == "/dualloop/rt-1/plot"
    assert {lock_topic, live_topic} <= set(topics)
    assert {m["session_id"] for _, m, _ in topics[lock_topic]} == {"lock step.1"}
    plots = [p for _, _, p in topics[lock_topic]]
    assert len(plots) == len(lockstep) > 100  # every snapshot: 10 ms observations on a 5 ms grid
    names = field_names(test_model.card.feature_names)
    by_seq = {i + 1: sensor(i + 1) for i in range(60)}
    for plot, snap in zip(plots, lockstep):
        assert (plot.tick, plot.session_id, plot.observation_seq) == (snap.tick, "lock step.1", snap.observation_seq)
        # enums by name: the action names of the card, the safety states
        actions = type(plot).DESCRIPTOR.fields_by_name["applied_action"].enum_type
        assert actions.values_by_number[plot.applied_action].name == snap.applied.name
        assert actions.values_by_number[plot.proposed_action].name == (snap.proposed.action.name or "NOT_SCORED")
        states = type(plot).DESCRIPTOR.fields_by_name["safety_state"].enum_type
        assert states.values_by_number[plot.safety_state].name == pb.SafetyState.Name(snap.safety_state).removeprefix(
            "SAFETY_STATE_"
        )
        assert len(plot.reasons.ListFields()) == len(pb.ReasonCode.values()) - 1  # every reason, on or off
        assert {f.name for f, on in plot.reasons.ListFields() if on} == {
            pb.ReasonCode.Name(r).removeprefix("REASON_CODE_") for r in snap.reasons
        }
        # features by name, those of the observation the tick used (not merely the newest)
        expected = np.float32(by_seq[snap.observation_seq])
        got = np.float32([getattr(plot.features, n) for n in names])
        np.testing.assert_array_equal(got, expected)
        assert plot.speed == expected[0] and plot.HasField("accel") and plot.HasField("gap")
        assert plot.applied.accel == pytest.approx(snap.applied.controls[0])
        assert plot.overridden == (snap.proposed.action.index != snap.applied.index)
    # the data topics are as before and the old reader skips the plot topic
    sessions = read_sessions(log)
    assert set(sessions) == {"lock step.1", "rt-1"}
    assert len(sessions["lock step.1"].snapshots) == len(plots)
    assert len(sessions["rt-1"].snapshots) == len(topics[live_topic])


def test_plot_log_time_is_the_wall_clock_live_and_offset_in_lockstep(live_recording):
    log, lockstep, wall_before, wall_after = live_recording
    topics = decoded(log)
    live_times = [t for t, _, _ in topics[plot_topic("rt-1")]]
    assert live_times and all(wall_before <= t <= wall_after for t in live_times)
    assert live_times == sorted(live_times)
    (meta,) = {json.dumps(m, sort_keys=True) for _, m, _ in topics[plot_topic("lock step.1")]}
    offset = int(json.loads(meta)["log_time_offset_ns"])
    header = next(log_pb2.SessionHeader.FromString(m.data) for _, c, m in _raw(log) if c.topic == "/dualloop/header")
    assert wall_before <= offset <= wall_after  # the session's start on the wall clock
    lock_times = [t for t, _, _ in topics[plot_topic("lock step.1")]]
    assert lock_times == [s.scheduled_time_ns + offset for s in lockstep]
    assert lock_times == sorted(lock_times) and lock_times[0] > YEAR_2020_NS
    assert header.start_time_unix_ns > YEAR_2020_NS


def _raw(path: Path) -> list:
    with open(path, "rb") as f:
        return list(make_reader(f).iter_messages())


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("replay")
    log = synthetic_log(tmp / "faults.mcap", seconds=4.0, rate_hz=100.0, faults=True)
    return replay_log(log, BASE_MODEL_PATH, DEFAULT_GATES, out_path=tmp / "out.mcap", options=ReplayOptions(plots=True))


def test_a_replay_writes_the_plot_topic_with_its_gate_checks(replayed):
    topics = decoded(replayed.out_path)
    plots = topics[plot_topic("synthetic")]
    snaps = read_sessions(replayed.out_path)["synthetic"].snapshots
    assert len(plots) == len(snaps) > 500
    vetoed = [p for _, _, p in plots if p.gate_veto]
    assert vetoed and all(p.reasons.OOD_VETO or p.safety_state != 1 for p in vetoed)
    some = plots[len(plots) // 2][2]
    assert some.checks.HasField("decision_vector_density") and some.checks.HasField("input_density")
    assert some.gate_threshold > 0 and some.gate_score == pytest.approx(snaps[len(plots) // 2].gate.score, rel=1e-6)
    # a log without a start time (synthetic) keeps its own times: offset 0, recorded in the channel
    assert {m["log_time_offset_ns"] for _, m, _ in plots} == {"0"}
    assert [t for t, _, _ in plots] == [s.scheduled_time_ns for s in snaps]


def test_the_replays_column_wise_plots_are_the_per_message_ones(replayed, tmp_path):
    """The replay's record-array plots, byte for byte, against PlotSchema.from_snapshot message by
    message (write_log), on a log with every fault and both gates (vetoes, NaN features, unscored
    ticks, every check)."""
    source = read_log(replayed.source)
    reference = write_log(
        tmp_path / "ref.mcap",
        replayed.header,
        source.observations,
        (snapshot_to_proto(s) for s in replayed.snapshots),
        plots=True,
    )
    assert replayed.out_path.read_bytes() == reference.read_bytes()
    plots = [p for _, _, p in decoded(replayed.out_path)[plot_topic("synthetic")]]
    assert any(p.proposed_action == 0 for p in plots)  # unscored ticks: NOT_SCORED, NaN proposals
    assert all(np.isnan(p.proposed.accel) for p in plots if p.proposed_action == 0)
    assert any(p.reasons.INVALID_INPUT for p in plots) and any(p.checks.input_range.veto for p in plots)


def test_a_replay_without_plots_has_none(replayed, tmp_path):
    out = replay_log(replayed.source, BASE_MODEL_PATH, DEFAULT_GATES, out_path=tmp_path / "plain.mcap").out_path
    assert not [t for t in decoded(out) if is_plot_topic(t)]


def test_a_replay_of_a_recording_lines_up_with_its_wall_clock(live_recording, tmp_path, test_model_path):
    log, lockstep, wall_before, wall_after = live_recording
    out = replay_log(
        log, test_model_path, session_id="lock step.1", out_path=tmp_path / "r.mcap", options=ReplayOptions(plots=True)
    ).out_path
    times = [t for t, _, _ in decoded(out)[plot_topic("lock step.1")]]
    assert len(times) == len(lockstep) and wall_before <= times[0] - lockstep[0].scheduled_time_ns <= wall_after


def test_offset_rule_leaves_unix_times_alone():
    header = log_pb2.SessionHeader(clock=pb.CLOCK_MODE_LOCKSTEP, start_time_unix_ns=YEAR_2020_NS)
    assert log_time_offset_ns(header, 5_000_000) == YEAR_2020_NS
    assert log_time_offset_ns(header, UNIX_TIME_FLOOR_NS + 1) == 0
    header.clock = pb.CLOCK_MODE_REALTIME
    assert log_time_offset_ns(header, 5_000_000) == 0


def test_field_names_are_identifiers_and_unique():
    assert field_names(["ego speed", "ego.speed", "1x", ""]) == ["ego_speed", "ego_speed_2", "f_1x", "unnamed"]
    assert PlotSchema(("a b",), ("accel",)).features == ["a_b"]
    assert is_plot_topic(plot_topic("x/y")) and not is_plot_topic("/dualloop/snapshot")


def test_the_shipped_layout_is_the_demos_and_its_paths_exist_in_a_recording(live_recording, test_model):
    """docs/foxglove/dualloop-layout.json is the layout `make demo` writes for its default seed, and
    every path it plots is a field of a recorded plot message (checked on a recording whose session
    is named as a demo scenario's)."""
    sessions = [demo_session_id(name, HELD_OUT_SEED) for name in SCENARIOS]
    shipped = json.loads(SHIPPED_LAYOUT.read_text())
    assert shipped == layout(sessions)
    paths = layout_paths(shipped)
    assert {p.split(".", 1)[0] for p in paths} == {plot_topic(s) for s in sessions}
    log, _, _, _ = live_recording
    (_, _, plot), *_ = decoded(log)[plot_topic("lock step.1")]
    descriptor = type(plot).DESCRIPTOR
    for path in paths:
        fields = path.split(".")[1:]
        d = descriptor
        for i, name in enumerate(fields):
            assert name in d.fields_by_name, f"{path}: no field {name!r} in {d.full_name}"
            if i < len(fields) - 1:
                d = d.fields_by_name[name].message_type


def test_foxglove_layout_command_makes_a_tab_per_recorded_session(live_recording, tmp_path, capsys):
    log, _, _, _ = live_recording
    out = tmp_path / "layout.json"
    assert main(["foxglove-layout", str(log), "-o", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written == layout(["lock step.1", "rt-1"])
    plain = synthetic_log(tmp_path / "plain.mcap", seconds=0.2, rate_hz=50.0)
    assert main(["foxglove-layout", str(plain), "-o", str(tmp_path / "none.json")]) == 2
    assert "no plot topics" in "".join(capsys.readouterr()) and not (tmp_path / "none.json").exists()


def test_foxglove_layout_makes_a_missing_folder_and_names_o_when_the_path_cannot_be_written(
    live_recording, tmp_path, capsys
):
    """A folder that did not exist, or could not exist, gave a bare "[Errno N] ..." naming no flag;
    the missing one is made, as replay --json makes its folder."""
    log, _, _, _ = live_recording
    out = tmp_path / "new" / "folder" / "layout.json"
    assert main(["foxglove-layout", str(log), "-o", str(out)]) == 0
    assert json.loads(out.read_text()) == layout(["lock step.1", "rt-1"])
    capsys.readouterr()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    refusals = [
        (blocker / "layout.json", f"{blocker} is a file, not a folder; give a path in a folder"),
        (tmp_path, "is a folder; give a file path"),
    ]
    if Path("/proc/self").is_dir():  # Linux: a folder no one can make, whatever the user
        refusals.append((Path("/proc/x/layout.json"), "cannot make the folder /proc/x ("))
    for bad, why in refusals:
        assert main(["foxglove-layout", str(log), "-o", str(bad)]) == 2
        text = "".join(capsys.readouterr())
        assert f"error: -o {bad}: {why}" in text and "Errno" not in text, text
    assert blocker.read_text() == ""


def test_distinct_session_ids_have_distinct_plot_topics():
    """Ids that differ only in characters a message path cannot hold (`x.y`, `x/y`, `x y`) used to
    share a topic (`/dualloop/x_y/plot`, the id `x_y`'s too): each now has its own, plain ids keep
    theirs, and every one is still recognised as a plot topic."""
    ids = ["x.y", "x/y", "x y", "x_y", "x-y", "x_2ey", "x__y", "", "_", "escaped", "caf\u00e9", "a\nb", "x" * 128]
    topics = [plot_topic(i) for i in ids]
    assert len(set(topics)) == len(ids), topics
    assert all(is_plot_topic(t) for t in topics)
    assert plot_topic("x_y") == "/dualloop/x_y/plot" and plot_topic("cut_in-900001") == "/dualloop/cut_in-900001/plot"
    assert plot_topic("x.y") == "/dualloop/escaped/x_2ey/plot"
    assert all(re.fullmatch(r"[A-Za-z0-9_/-]+", t) for t in topics)  # nothing a message path trips on


def test_foxglove_layout_names_a_missing_empty_or_cut_recording(tmp_path, capsys):
    """A cut recording raised struct.error from inside the MCAP reader, and a missing one printed a bare
    [Errno 2]: each is now an error naming the file and what is wrong with it, exit 2."""
    cut = tmp_path / "trunc.mcap"
    cut.write_bytes(FIXTURES.joinpath("comma2k19-example1.mcap").read_bytes()[:200_000])
    empty = tmp_path / "empty.mcap"
    empty.write_bytes(b"")
    out = tmp_path / "fl.json"
    for path, message in (
        (cut, f"error: {cut}: truncated log: it ends inside a record before any plot topic"),
        (tmp_path / "absent.mcap", f"error: {tmp_path / 'absent.mcap'}: recording not found"),
        (empty, f"error: {empty}: empty file, not an MCAP log"),
    ):
        assert main(["foxglove-layout", str(path), "-o", str(out)]) == 2
        text = "".join(capsys.readouterr())
        assert message in text and "Errno" not in text
    assert not out.exists()


def test_foxglove_layout_help_says_where_the_layout_goes_without_o(capsys):
    """Without -o the command writes ./foxglove-layout.json, which --help did not say."""
    with pytest.raises(SystemExit) as done:
        main(["foxglove-layout", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help
    assert "-o OUT, --out OUT the layout file to write (default: foxglove-layout.json in the current directory)" in text
