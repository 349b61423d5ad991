"""DriveAgents: one stream drives a group of agents. A real server on loopback with the shipped model and
gates, real gRPC clients; each agent's snapshots against the same agent driven in its own Drive session."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import grpc
import pytest

from dualloop.controller.contract.agents_client import AgentsStream, agent_open, observation
from dualloop.controller.contract.client import DriveSession
from dualloop.controller.contract.observation_columns import observation_columns
from dualloop.controller.contract.wire import without_wall_clock
from dualloop.controller.logs.logfile import read_log
from dualloop.controller.logs.synthetic import synthetic_log
from dualloop.controller.replay.lockstep import _observations
from dualloop.executor.snapshot import Observation
from dualloop.v2 import controller_pb2 as pb
from tests.controller.serve.servers import shipped

LOCKSTEP, REALTIME = pb.CLOCK_MODE_LOCKSTEP, pb.CLOCK_MODE_REALTIME
# the decision fields: what the model, the checks and the safety machine made of the input
DECISION_FIELDS = (
    "tick",
    "observation_seq",
    "plan_id",
    "plan_state",
    "model_version",
    "proposed",
    "applied",
    "reasons",
    "safety_state",
    "input_hash",
    "checks",
    "vetoed_by",
    "invalid_input",
    "hazard_lights",
    "observation_held",
)


@pytest.fixture(scope="module")
def driving(tmp_path_factory) -> list[Observation]:
    log = synthetic_log(Path(tmp_path_factory.mktemp("agents")) / "syn.mcap", seconds=3.0, rate_hz=100.0)
    return _observations(read_log(log))


def agent_inputs(driving: list[Observation], agent: int, n: int) -> list[pb.Observation]:
    """Agent `agent`'s observations: its own stretch of the drive on a clock of its own; agent 2 has a
    non-finite feature once and agent 3 a gap (held ticks); every other agent sends a plan."""
    out = []
    base = driving[agent * 7 : agent * 7 + n]
    t0 = 5_000_000_000 * (agent + 1)
    for k, o in enumerate(base):
        x = o.features.tolist()
        if agent == 2 and k == 30:
            x[1] = float("nan")
        ts = t0 + (o.timestamp_ns - base[0].timestamp_ns) + (20_000_000 if agent == 3 and k > 40 else 0)
        plan = None if agent % 2 or o.plan_values is None else o.plan_values.tolist()
        out.append(observation(k + 1, ts, x, plan_id=o.plan_id, plan=plan))
    return out


PROFILES = {1: ["ego_speed", "ego_accel", "lead_present", "lead_distance", "lead_rel_speed"]}


def single(channel: grpc.Channel, session_id: str, inputs: list[pb.Observation], **open_fields) -> list:
    session = DriveSession(channel, session_id, LOCKSTEP, **open_fields)
    for obs in inputs:
        session.send_raw(pb.DriveRequest(observation=obs))
    session.close()
    return list(session.snapshots())


def assert_same_decisions(batched: list[pb.DecisionSnapshot], alone: list[pb.DecisionSnapshot]) -> None:
    assert len(batched) == len(alone) > 0
    for b, a in zip(batched, alone):
        for name in DECISION_FIELDS:
            assert getattr(b, name) == getattr(a, name), (b.session_id, b.tick, name)
        assert without_wall_clock(b) == without_wall_clock(a)  # and every other field, byte for byte


@pytest.mark.parametrize(
    ("columns", "observations_as_columns"),
    [(False, False), (True, False), (True, True)],
    ids=["snapshots", "snapshot-columns", "both-as-columns"],
)
def test_lockstep_batched_equals_each_alone(shipped_channel, driving, columns, observations_as_columns):
    n_agents, n = 5, 120
    inputs = {f"agent-{i}": agent_inputs(driving, i, n) for i in range(n_agents)}
    group = AgentsStream(shipped_channel, columns=columns)
    assert group.model.model_version and group.limits.max_agents_per_stream == 1024
    group.send(join=[agent_open(sid, LOCKSTEP, provided_features=PROFILES.get(i, [])) for i, sid in enumerate(inputs)])
    opened = group.recv()
    assert [o.session_id for o in opened.opened] == list(inputs) and not opened.errors
    assert list(opened.opened[1].provided_features) == PROFILES[1]
    batched: dict[str, list] = {sid: [] for sid in inputs}
    for k in range(n):  # one request per tick, every agent's observation in it
        tick = {sid: obs[k] for sid, obs in inputs.items()}
        if observations_as_columns:
            group.send(observation_columns=observation_columns(tick))
        else:
            group.send(observations=tick)
        response = group.recv()
        assert not response.errors
        assert response.HasField("columns") == columns and (not columns or not response.snapshots)
        for snap in group.snapshots(response):
            batched[snap.session_id].append(snap)
    group.close()
    assert list(group.responses()) == []
    for i, (sid, obs) in enumerate(inputs.items()):  # the same ids, now each alone (the group has closed)
        alone = single(shipped_channel, sid, obs, provided_features=PROFILES.get(i, []))
        assert_same_decisions(batched[sid], alone)
    held = [s for s in batched["agent-3"] if s.observation_held]
    assert held, "agent-3's gap gives held ticks"
    assert any(pb.REASON_CODE_INVALID_INPUT in s.reasons for s in batched["agent-2"])


def test_agents_join_and_leave_between_ticks(shipped_channel, driving):
    a, b, c = (agent_inputs(driving, i, 60) for i in range(3))
    group = AgentsStream(shipped_channel)
    group.send(join=[agent_open("jl-a"), agent_open("jl-b")])
    assert len(group.recv().opened) == 2
    got: dict[str, list] = {"jl-a": [], "jl-b": [], "jl-c": []}
    for k in range(60):
        obs = {"jl-b": b[k]}
        if k < 20:
            obs["jl-a"] = a[k]
        if k >= 30:
            obs["jl-c"] = c[k - 30]
        join = [agent_open("jl-c")] if k == 30 else []
        leave = ["jl-a"] if k == 19 else []
        group.send(join=join, observations=obs, leave=leave)
        response = group.recv()
        assert not response.errors, response.errors
        assert list(response.left) == leave
        for snap in response.snapshots:
            got[snap.session_id].append(snap)
    group.send(observations={"jl-a": a[20]})  # after leaving: answered for itself
    (error,) = group.recv().errors
    assert error.session_id == "jl-a" and error.code == grpc.StatusCode.NOT_FOUND.value[0]
    assert "not in this stream" in error.message
    group.close()
    list(group.responses())
    assert_same_decisions(got["jl-a"], single(shipped_channel, "jl-a", a[:20]))
    assert_same_decisions(got["jl-b"], single(shipped_channel, "jl-b", b))
    assert_same_decisions(got["jl-c"], single(shipped_channel, "jl-c", c[:30]))


def test_an_invalid_agent_never_ends_the_others(shipped_server, shipped_channel, driving):
    good = agent_inputs(driving, 0, 10)
    group = AgentsStream(shipped_channel)
    group.send(
        join=[
            agent_open("ok"),
            agent_open("bad-seq"),
            agent_open("ok"),  # the same id twice
            agent_open("rt", REALTIME),  # not the stream's clock
            agent_open("odd", LOCKSTEP, provided_features=["no_such_feature"]),
            agent_open("x" * 200),  # an id past its limit: not echoed, so the message names the join
        ]
    )
    first = group.recv()
    assert [o.session_id for o in first.opened] == ["ok", "bad-seq"]
    codes = {e.session_id: (grpc.StatusCode(_code(e.code)), e.message) for e in first.errors}
    # the second join of "ok" is refused, and "ok" goes on (it decides below)
    assert codes["ok"][0] is grpc.StatusCode.ALREADY_EXISTS and codes["ok"][1].startswith("join[2]: agent 'ok'")
    assert "already in this stream (it goes on as it was)" in codes["ok"][1]
    assert codes["rt"][0] is grpc.StatusCode.INVALID_ARGUMENT and "stream's clock" in codes["rt"][1]
    assert codes["rt"][1].startswith("join[3]: ")
    assert codes["odd"][0] is grpc.StatusCode.INVALID_ARGUMENT and "no_such_feature" in codes["odd"][1]
    assert codes[""][0] is grpc.StatusCode.INVALID_ARGUMENT and codes[""][1].startswith("join[5]: ")
    assert "200 bytes" in codes[""][1]
    ok_snaps = []
    for k in range(10):
        bad = observation(5 if k > 3 else k + 1, good[k].timestamp_ns, good[k].features)  # seq stops increasing
        group.send(observations={"ok": good[k], "bad-seq": bad} if k <= 5 else {"ok": good[k]})
        response = group.recv()
        ok_snaps += [s for s in response.snapshots if s.session_id == "ok"]
        if k == 5:  # seq 5 again
            (error,) = response.errors
            assert error.session_id == "bad-seq" and error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
            assert "not after the previous seq" in error.message
    # "ok" went on (two 5 ms ticks per 100 Hz observation), "bad-seq" is closed on the server
    assert len(ok_snaps) == 19 and ok_snaps[-1].observation_seq == 10 and not response.errors
    assert shipped_server.call(lambda: sorted(shipped_server.server.executor.sessions)) == ["ok"]
    group.close()
    list(group.responses())


def _code(number: int) -> tuple:
    return next(c.value for c in grpc.StatusCode if c.value[0] == number)


def test_limits_agents_per_stream_and_bytes_per_message(driving):
    with (
        shipped(max_agents_per_stream=3, max_receive_message_bytes=4096) as srv,
        grpc.insecure_channel(srv.address) as channel,
    ):
        group = AgentsStream(channel)
        assert group.limits.max_agents_per_stream == 3 and group.limits.max_receive_message_bytes == 4096
        group.send(join=[agent_open(f"l{i}") for i in range(4)])
        response = group.recv()
        assert len(response.opened) == 3
        (error,) = response.errors
        assert error.session_id == "l3" and error.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
        assert "max_agents_per_stream = 3" in error.message
        obs = agent_inputs(driving, 0, 1)[0]
        group.send(observations={f"l{i}": obs for i in range(3)})
        assert len(group.recv().snapshots) == 3  # within both limits
        big = observation(2, obs.timestamp_ns + 5_000_000, list(obs.features) * 60)
        group.send(observations={"l0": big})  # past max_receive_message_bytes: gRPC ends the stream
        with pytest.raises(grpc.RpcError) as err:
            group.recv()
        assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert srv.call(lambda: len(srv.server.executor.sessions)) == 0 or _eventually_closed(srv)


def _eventually_closed(srv) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if srv.call(lambda: len(srv.server.executor.sessions)) == 0:
            return True
        time.sleep(0.05)
    return False


def realtime_by_seq(responses, agents: list[str], n: int, send) -> dict[str, dict[int, pb.DecisionSnapshot]]:
    """Sends observation k of every agent, then reads until each agent has a snapshot on it; returns
    the first tick on each observation (not held), by seq, where the client saw it (a loaded machine
    may conflate it away: the next snapshot then holds it)."""
    fresh: dict[str, dict[int, pb.DecisionSnapshot]] = {sid: {} for sid in agents}
    seen = dict.fromkeys(agents, 0)
    for k in range(1, n + 1):
        send(k)
        while any(seen[sid] < k for sid in agents):
            for snap in next(responses):
                seen[snap.session_id] = max(seen[snap.session_id], snap.observation_seq)
                if not snap.observation_held:
                    fresh[snap.session_id].setdefault(snap.observation_seq, snap)
    return fresh


# A REALTIME tick runs every session with an observation in one batch: the gate's float64 density
# scores then differ in their last bits with the batch's rows (three agents here, one alone), as for
# any sessions that share ticks; every verdict and decision is equal.
REALTIME_DECISION_FIELDS = (
    "observation_seq",
    "proposed",
    "applied",
    "reasons",
    "safety_state",
    "input_hash",
    "vetoed_by",
)


@pytest.mark.parametrize("columns", [False, True], ids=["snapshots", "columns"])
def test_realtime_on_a_foreign_clock_decides_as_alone(shipped_channel, driving, columns):
    """REALTIME, sensor timestamps on a clock of the client's (years from the server's): the first
    snapshot on each observation decides the same batched as alone. Inputs without vetoes (past the
    drive's first 0.6 s), so no decision depends on how many ticks held an observation."""
    agents, n = ["rt-0", "rt-1", "rt-2"], 40
    inputs = {sid: agent_inputs(driving[60:], i + 4, n) for i, sid in enumerate(agents)}
    opts = {"observation_period_ns": 1_000_000_000}  # the client waits for each answer: never stale
    group = AgentsStream(shipped_channel, columns=columns)
    group.send(join=[agent_open(sid, REALTIME, **opts) for sid in agents])

    def batched_responses():
        while True:
            yield group.snapshots(group.recv())

    batched = realtime_by_seq(
        batched_responses(), agents, n, lambda k: group.send(observations={s: inputs[s][k - 1] for s in agents})
    )
    group.close()
    for sid in agents:
        session = DriveSession(shipped_channel, sid + "-alone", REALTIME, **opts)

        def alone_responses(session=session):
            while True:
                yield [session.recv()]

        alone = realtime_by_seq(
            alone_responses(),
            [sid + "-alone"],
            n,
            lambda k, session=session, sid=sid: session.send_raw(pb.DriveRequest(observation=inputs[sid][k - 1])),
        )[sid + "-alone"]
        session.cancel()
        both = sorted(set(batched[sid]) & set(alone))
        assert len(both) >= n // 2, (sid, len(both))  # most first ticks reach a client that waits for them
        for k in both:
            b, a = batched[sid][k], alone[k]
            for name in REALTIME_DECISION_FIELDS:
                assert getattr(b, name) == getattr(a, name), (sid, k, name)
            for cb, ca in zip(b.checks, a.checks, strict=True):  # every verdict equal, scores to the last bits
                assert (cb.check, cb.veto, cb.status, cb.threshold) == (ca.check, ca.veto, ca.status, ca.threshold)
                assert cb.score == pytest.approx(ca.score, rel=1e-9, abs=1e-12), (sid, k, cb.name)
        assert all(s.safety_state == pb.SAFETY_STATE_NOMINAL for s in batched[sid].values())


def test_realtime_one_response_per_tick_with_every_agent(shipped_channel, driving):
    agents = [f"tick-{i}" for i in range(8)]
    inputs = {sid: agent_inputs(driving[60:], i, 200) for i, sid in enumerate(agents)}
    group = AgentsStream(shipped_channel)
    group.send(join=[agent_open(sid, REALTIME, observation_period_ns=10_000_000) for sid in agents])
    stop = threading.Event()

    def produce() -> None:
        for k in range(200):
            if stop.is_set():
                return
            group.send(observations={s: inputs[s][k] for s in agents})
            time.sleep(0.01)

    producer = threading.Thread(target=produce)
    producer.start()
    responses = []
    while len(responses) < 100:
        r = group.recv()
        if r.snapshots:
            responses.append(r)
    stop.set()
    producer.join()
    group.cancel()
    ticks = [r.tick for r in responses]
    assert all(b > a for a, b in zip(ticks, ticks[1:]))
    full = [r for r in responses if len(r.snapshots) == len(agents)]
    assert len(full) >= 90  # every agent's snapshot of the tick in one response (once all have observed)
    for r in full:
        assert sorted(s.session_id for s in r.snapshots) == agents
        assert all(s.tick == r.tick for s in r.snapshots)


def test_observation_columns_are_judged_agent_by_agent(shipped_channel, driving):
    """An agent observed twice (a message and a column), an unknown agent, a plan id past its limit:
    each answered for itself, the others observed; columns whose sizes do not add up end the stream."""
    group = AgentsStream(shipped_channel, columns=True)
    group.send(join=[agent_open(f"col-{i}", LOCKSTEP) for i in range(3)])
    assert len(group.recv().opened) == 3
    obs = {f"col-{i}": agent_inputs(driving, i, 1)[0] for i in range(3)}
    long_plan = pb.Observation()
    long_plan.CopyFrom(obs["col-2"])
    long_plan.plan.plan_id = "p" * 200
    cols = observation_columns(
        {"col-0": obs["col-0"], "col-1": obs["col-1"], "ghost": obs["col-1"], "col-2": long_plan}
    )
    group.send(observations={"col-1": obs["col-1"]}, observation_columns=cols)
    response = group.recv()
    errors = {e.session_id: (e.code, e.message) for e in response.errors}
    assert errors["col-1"][0] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert errors["col-1"][1].startswith("agent 'col-1': a second observation in one DriveAgentsRequest"), errors
    assert errors["col-1"][1].count("col-1") == 1, errors  # named once
    assert errors["ghost"][0] == grpc.StatusCode.NOT_FOUND.value[0]
    assert "ObservationColumns.plan_id" in errors["col-2"][1] and "128" in errors["col-2"][1]
    # col-1's message came first (observations, then columns) and was decided before its column closed it
    assert [s.session_id for s in group.snapshots(response)] == ["col-1", "col-0"]
    broken = observation_columns({"col-0": agent_inputs(driving, 0, 2)[1]})
    del broken.features[-1]
    group.send(observation_columns=broken)
    with pytest.raises(grpc.RpcError) as err:
        group.recv()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "DriveAgentsRequest.observation_columns: ObservationColumns.features" in err.value.details()


def test_a_stream_keeps_the_layout_its_first_request_chose(shipped_channel, driving):
    """Columns asked for by the first request: later requests that leave the flag unset (proto3 reads
    it False) still get columns. A stream that chose a message per snapshot and then asks for
    columns ends with INVALID_ARGUMENT saying so, after answering what came before."""
    group = AgentsStream(shipped_channel, columns=True)
    group.send(join=[agent_open("layout-0", LOCKSTEP)], observations={})
    assert [o.session_id for o in group.recv().opened] == ["layout-0"]
    group.send(observations={"layout-0": agent_inputs(driving, 0, 1)[0]})
    assert [s.tick for s in group.snapshots(group.recv())] == [0]
    obs = agent_inputs(driving, 0, 2)[1]
    group.send_raw(pb.DriveAgentsRequest(observations=[pb.AgentObservation(session_id="layout-0", observation=obs)]))
    response = group.recv()
    assert not response.errors and not response.snapshots and set(response.columns.session_id) == {"layout-0"}
    group.close()

    group = AgentsStream(shipped_channel, columns=False)
    group.send(join=[agent_open("layout-1", LOCKSTEP)], observations={})
    assert [o.session_id for o in group.recv().opened] == ["layout-1"]
    group.send_raw(pb.DriveAgentsRequest(snapshot_columns=True))
    with pytest.raises(grpc.RpcError) as err:
        group.recv()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "snapshot_columns is set after the stream's first request chose a message per snapshot" in (
        err.value.details()
    )


def test_drain_ends_agent_streams_and_refuses_new_agents(server, channel):
    """The server draining ends every DriveAgents stream as it ends a Drive stream (UNAVAILABLE, saying
    so), and closes every agent."""
    from tests.controller.serve.inputs import sensor

    groups = {clock: AgentsStream(channel) for clock in (REALTIME, LOCKSTEP)}
    for clock, group in groups.items():
        group.send(join=[agent_open(f"d{clock}-{i}", clock) for i in range(3)])
        assert len(group.recv().opened) == 3
        group.send(observations={f"d{clock}-{i}": observation(1, 1_000_000_000, sensor(i)) for i in range(3)})
    assert len(groups[LOCKSTEP].recv().snapshots) == 3
    while not groups[REALTIME].recv().snapshots:
        pass
    late = AgentsStream(channel)
    asyncio.run_coroutine_threadsafe(server.server.drain(10.0), server.loop).result(30)
    for group in groups.values():
        with pytest.raises(grpc.RpcError) as err:
            while True:
                group.recv()
        assert err.value.code() is grpc.StatusCode.UNAVAILABLE and "server draining" in err.value.details()
    late.send(join=[agent_open("too-late")])
    with pytest.raises(grpc.RpcError) as err:  # a stream open before the drain ends without taking the agent
        late.recv()
    assert err.value.code() is grpc.StatusCode.UNAVAILABLE and "server draining" in err.value.details()
    assert server.call(lambda: len(server.server.executor.sessions)) == 0


def test_each_agent_has_its_own_shadow_statistics(server, channel):
    """GetShadowStats answers per agent, as for a Drive session: each agent's own ticks and actual actions."""
    from dualloop.v2 import controller_pb2_grpc as pb_grpc
    from tests.controller.serve.inputs import sensor

    group = AgentsStream(channel)
    group.send(join=[agent_open("sh-a"), agent_open("sh-b")])
    instances = {o.session_id: o.session_instance for o in group.recv().opened}
    for k in range(10):
        obs = {sid: observation(k + 1, 1_000_000_000 + k * 5_000_000, sensor(k + i)) for i, sid in enumerate(instances)}
        obs["sh-a"].actual.action_index = 0  # only agent a reports what its vehicle did
        group.send(observations=obs)
        group.recv()
    stub = pb_grpc.ControllerServiceStub(channel)
    a = stub.GetShadowStats(pb.GetShadowStatsRequest(session_id="sh-a"))
    b = stub.GetShadowStats(pb.GetShadowStatsRequest(session_id="sh-b"))
    assert (a.session_instance, b.session_instance) == (instances["sh-a"], instances["sh-b"])
    assert sum(a.confusion) == 10 and a.ticks_without_actual == 0
    assert sum(b.confusion) == 0 and b.ticks_without_actual == 10
    group.close()
    list(group.responses())


def test_a_malformed_request_ends_the_stream_and_long_ids_are_never_echoed(server, channel):
    group = AgentsStream(channel)
    long_id = "x" * 1000
    group.send(join=[agent_open(long_id)], observations={long_id: observation(1, 1, [0.0])})
    response = group.recv()
    assert [e.session_id for e in response.errors] == ["", ""]  # past the id limit: not repeated back
    assert "OpenSession.session_id is 1000 bytes long; the limit is 128 bytes" in response.errors[0].message
    assert "an id of 1000 bytes" in response.errors[1].message and long_id not in str(response)
    raw = channel.stream_stream(
        "/dualloop.v2.ControllerService/DriveAgents",
        request_serializer=lambda b: b,
        response_deserializer=pb.DriveAgentsResponse.FromString,
    )
    responses = raw(iter([b"\xff\xff\xff"]))  # not a protobuf message
    next(responses)  # the stream's first response (model, limits)
    with pytest.raises(grpc.RpcError) as err:
        next(responses)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid dualloop.v2.DriveAgentsRequest message" in err.value.details()
