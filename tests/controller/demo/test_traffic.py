"""The simulator's vehicles driven by the model through one DriveAgents stream: a real server on loopback
with the shipped model and gates. Nothing here depends on what the model decides: each run is compared
with another way of running the same vehicles."""

from __future__ import annotations

import json

import grpc
import numpy as np
import pytest

from dualloop.controller.cli import main
from dualloop.controller.contract.client import DriveSession
from dualloop.controller.contract.wire import without_wall_clock
from dualloop.controller.demo.traffic import ModelTraffic, TrafficAgents, agents_of, run_traffic
from dualloop.controller.serve.config import ServerConfig
from dualloop.controller.serve.lifecycle import ServerThread
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES
from dualloop.sim.env import SimEnv, make_batch
from dualloop.v2 import controller_pb2 as pb

SEED = 910_101
COLUMNS = [0, 1, 2, 3, 4]  # the ego and four traffic cars
STEPS = 160  # 0.8 s of sim time


@pytest.fixture(scope="module")
def channel():
    config = ServerConfig(model=BASE_MODEL_PATH, gates=list(DEFAULT_GATES), port=0)  # type: ignore[arg-type]
    with ServerThread(config) as srv, grpc.insecure_channel(srv.address) as ch:
        yield ch


def dense(seed: int = SEED) -> SimEnv:
    return make_batch("dense_traffic", [seed], end_on_collision=False)


def alone(channel: grpc.Channel, session_id: str, sent: list[pb.Observation]) -> list[pb.DecisionSnapshot]:
    session = DriveSession(channel, session_id, pb.CLOCK_MODE_LOCKSTEP, actual_controls_are_commands=True)
    for obs in sent:
        session.send_raw(pb.DriveRequest(observation=obs))
    session.close()
    return list(session.snapshots())


def test_each_vehicle_is_driven_by_its_own_snapshots(channel):
    env = dense()
    record = run_traffic(env, channel, COLUMNS, steps=STEPS, keep=True)
    assert record.agents == len(COLUMNS) and record.ticks == STEPS and not record.errors
    assert record.snapshots == len(COLUMNS) * STEPS
    features = {sid: np.array([o.features for o in sent]) for sid, sent in record.sent.items()}
    speeds = [f[0, 0] for f in features.values()]
    assert len(set(speeds)) == len(speeds), "each vehicle sees its own speed"
    for sid, snaps in record.received.items():
        # what the simulator applied to the car is what its snapshot said
        applied = np.array([s.applied.controls[0] for s in snaps])
        np.testing.assert_array_equal(np.array(record.commanded[sid]), applied)
    # the same observations, each vehicle in a Drive session of its own (the group has closed): the same decisions
    for sid in (agents_of(env, [0])[0].session_id, agents_of(env, [3])[0].session_id):
        single = alone(channel, sid, record.sent[sid])
        assert len(single) == len(record.received[sid]) == STEPS
        for b, a in zip(record.received[sid], single):
            assert without_wall_clock(b) == without_wall_clock(a), (sid, b.tick)


def test_the_same_seed_gives_the_same_run(channel):
    runs = []
    for _ in range(2):
        env = dense()
        record = run_traffic(env, channel, COLUMNS, steps=STEPS, keep=True)
        runs.append((record.commanded, env.world.s.copy(), env.world.v.copy()))
    (cmd_a, s_a, v_a), (cmd_b, s_b, v_b) = runs
    assert cmd_a == cmd_b
    np.testing.assert_array_equal(s_a, s_b)
    np.testing.assert_array_equal(v_a, v_b)
    # and the model did drive: the simulator's own drivers end elsewhere
    own = dense()
    for _ in range(STEPS):
        own.step(*own.expert_action())
    assert not np.array_equal(own.world.v[:, COLUMNS], v_a[:, COLUMNS])


def test_vehicles_that_leave_the_road_leave_the_group_alone(channel):
    env = dense()
    ahead = max(COLUMNS[1:], key=lambda c: env.world.s[0, c])
    exit_s = float(env.world.s[0, ahead]) + 5.0  # the car furthest ahead passes it within the run
    record = run_traffic(env, channel, COLUMNS, steps=STEPS, exit_s=exit_s, keep=True)
    assert agents_of(env, [ahead])[0].session_id in record.left and not record.errors
    assert len(record.left) < len(COLUMNS)
    for agent in agents_of(env, COLUMNS):
        got = len(record.received[agent.session_id])
        if agent.session_id in record.left:
            assert 0 < got < STEPS, "it was driven, then left"
            assert len(record.commanded[agent.session_id]) == got  # and was commanded no more
            assert not env.world.driven[0, agent.col], "the simulator drives it again"
            assert env.world.s[0, agent.col] > exit_s
        else:
            assert got == STEPS, f"{agent.session_id} kept its snapshots after the others left"


def test_a_vehicle_the_server_refuses_is_left_to_the_simulator_and_the_others_drive(channel):
    env, twin = dense(), dense()
    group = TrafficAgents(env, channel, agents_of(env, [1, 2]))
    other = TrafficAgents(twin, channel, agents_of(twin, [2, 3]))  # car 2's session id is open in `group`
    assert len(other.record.errors) == 1 and "ALREADY_EXISTS" in other.record.errors[0]
    assert [a.col for a in other.agents.values()] == [3]
    for _ in range(5):
        group.step()
        other.step()
    assert group.close().snapshots == 10 and other.close().snapshots == 5
    assert twin.world.driven[0, 3] and not twin.world.driven[0, 2]


def test_the_vector_env_routes_its_traffic_through_the_same_stream(channel):
    from dualloop.sim.gym_env import HighwayVectorEnv

    seeds, steps = [SEED, SEED + 1], 60
    venv = HighwayVectorEnv(2, "dense_traffic", end_on_collision=False)
    venv.before_step = traffic = ModelTraffic(channel, [1, 2, 3])
    venv.reset(seed=seeds)
    for _ in range(steps):
        venv.step(np.zeros((2, 2)))
    (record,) = traffic.close()
    assert record.agents == 6 and record.snapshots == 6 * steps and not record.errors
    # the same cars driven on the simulator directly, the ego held as the env's actions held it
    env = make_batch("dense_traffic", seeds, end_on_collision=False)
    group = TrafficAgents(env, channel, agents_of(env, [1, 2, 3]))
    for _ in range(steps):
        group.decide()
        env.step(0.0, 0.0)
    group.close()
    sim = venv.sim
    assert sim is not None
    np.testing.assert_array_equal(sim.world.v, env.world.v)
    np.testing.assert_array_equal(sim.world.s, env.world.s)


def test_realtime_applies_each_vehicles_newest_snapshot(channel):
    env = dense()
    record = run_traffic(env, channel, [1, 2, 3], clock=pb.CLOCK_MODE_REALTIME, steps=200, keep=True)
    assert not record.errors and record.ticks == 200
    for sid, commanded in record.commanded.items():
        snaps = record.received[sid]
        assert snaps, f"{sid} had snapshots"
        controls = {s.applied.controls[0] for s in snaps}
        driven = [c for c in commanded if not np.isnan(c)]
        assert driven and set(driven) <= controls  # whatever the car did came from one of its snapshots
        assert np.isnan(commanded[: commanded.index(driven[0])]).all()  # and nothing before its first


def test_demo_traffic_reports_every_seed(tmp_path, capsys):
    out = tmp_path / "rows.json"
    assert main(["demo-traffic", "--seeds", "910001,910002", "--duration", "0.2", "--json", str(out), "--check"]) == 0
    rows = json.loads(out.read_text())
    assert [r["seed"] for r in rows] == [910001, 910002]
    for r in rows:
        assert r["agents"] == 33 and r["ticks"] == 40 and r["errors"] == 0 and r["clock"] == "lockstep"
        assert r["collisions_between_agents"] == 0
        # LOCKSTEP: the server's ticks are its snapshots' (GetStats counts REALTIME ones only: it said
        # 0), and no figure that needs a deadline exists (they said 0, as if every tick was on time)
        assert r["server_ticks"] == 40 and r["server_lateness_p99_us"] is None and r["missed_deadlines"] is None
    assert "every vehicle driven by" in capsys.readouterr().out
    assert main(["demo-traffic", "--seeds", "x1"]) == 2  # one line, exit 2, as every bad argument
    assert "--seeds 'x1': takes comma-separated integers" in capsys.readouterr().err
    assert main(["demo-traffic", "--seeds", ""]) == 2  # it ran the three held-out seeds at full length
    assert "--seeds '': empty" in capsys.readouterr().err


def test_demo_traffic_realtime_keeps_the_servers_deadline_figures(tmp_path):
    """REALTIME rows carry the server's deadline figures (that they exist; their values are the load's)."""
    out = tmp_path / "rows.json"
    assert (
        main(["demo-traffic", "--seeds", "910001", "--duration", "0.2", "--clock", "realtime", "--json", str(out)]) == 0
    )
    (row,) = json.loads(out.read_text())
    assert row["clock"] == "realtime" and row["server_ticks"] >= 1
    assert isinstance(row["missed_deadlines"], int) and isinstance(row["client_behind"], int)
    assert isinstance(row["server_lateness_p99_us"], float) and isinstance(row["server_lateness_max_us"], float)
