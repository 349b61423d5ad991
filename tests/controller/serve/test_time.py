"""Time is honest: conflation and missed ticks accounted for in every delivered snapshot, missed
deadlines defined and counted, totals that no reset erases, and observation age including transport.

Real server on loopback, real gRPC clients; bounds are one-sided so that a loaded machine only makes
them easier to meet."""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
import pytest

from dualloop.controller.contract.client import DriveSession, realtime_channel
from dualloop.controller.contract.wire import without_wall_clock
from dualloop.controller.serve import ticker as ticker_module
from dualloop.controller.serve.cli import stop_line
from dualloop.controller.serve.ticker import PreciseTicker
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc
from tests.controller.serve.inputs import MS, sensor

PERIOD = 5_000_000


def produce(session: DriveSession, stop: threading.Event) -> threading.Thread:
    """A 200 Hz sensor on the session until `stop`."""

    def run() -> None:
        seq = 0
        while not stop.is_set():
            seq += 1
            session.send(seq, time.monotonic_ns(), sensor(seq))
            time.sleep(0.005)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def assert_ticks_accounted(snaps: list[pb.DecisionSnapshot]) -> None:
    """Every tick between two delivered snapshots was either conflated away or missed."""
    for prev, snap in zip(snaps, snaps[1:]):
        gap = snap.tick - prev.tick
        assert gap == snap.snapshots_conflated_since_previous + snap.ticks_missed_since_previous + 1, (prev, snap)
        assert snap.max_lateness_since_previous_us >= snap.lateness_us


def test_slow_reader_learns_what_was_conflated(server):
    channel = realtime_channel(server.address)
    session = DriveSession(channel, "slow", pb.CLOCK_MODE_REALTIME)
    stop = threading.Event()
    producer = produce(session, stop)
    first = session.recv()
    time.sleep(1.5)  # not reading: the small HTTP/2 window fills, then the outbox conflates
    snaps = [first] + [session.recv() for _ in range(120)]
    stop.set()
    producer.join()
    session.cancel()
    channel.close()
    assert_ticks_accounted(snaps)
    conflated = [s.snapshots_conflated_since_previous for s in snaps[1:]]
    assert sum(conflated) > 100  # ~300 ticks passed while the client slept; the window holds a few
    # the drop counter the stream already had agrees with the per-snapshot counts
    assert snaps[-1].snapshots_dropped - first.snapshots_dropped == sum(conflated)
    # the worst lateness over the conflated ticks is reported, not just the delivered tick's own
    jumped = max(snaps[1:], key=lambda s: s.snapshots_conflated_since_previous)
    assert jumped.max_lateness_since_previous_us >= jumped.lateness_us


def test_missed_deadlines_reach_the_snapshots_and_the_totals(server):
    """A stalled server loop: the skipped deadlines are in the reader's snapshots, in the window and
    in the totals; a reset clears the window only, and the exit line reports totals."""
    channel = realtime_channel(server.address)
    stub = pb_grpc.ControllerServiceStub(channel)
    session = DriveSession(channel, "stall", pb.CLOCK_MODE_REALTIME)
    stop = threading.Event()
    producer = produce(session, stop)
    snaps = [session.recv() for _ in range(20)]
    server.call(time.sleep, 0.05)  # blocks the tick loop through ~10 deadlines
    snaps += [session.recv() for _ in range(40)]
    window = stub.GetStats(pb.GetStatsRequest(reset=True))
    after_reset = stub.GetStats(pb.GetStatsRequest())
    stop.set()
    producer.join()
    session.cancel()
    channel.close()

    assert_ticks_accounted(snaps)
    assert sum(s.ticks_missed_since_previous for s in snaps) >= 8
    assert window.missed_deadlines >= 8 and window.missed_deadlines_total >= window.missed_deadlines
    # the reset started a new window; the totals since start went on from where they were
    assert after_reset.ticks_total - after_reset.ticks == window.ticks_total >= window.ticks
    assert after_reset.missed_deadlines_total - after_reset.missed_deadlines == window.missed_deadlines_total
    assert after_reset.snapshots_sent_total >= window.snapshots_sent_total >= window.snapshots_sent >= 60
    assert after_reset.uptime_s >= window.uptime_s >= window.window_s > after_reset.window_s
    # a tick that runs starts within one period of its deadline: the rest were counted as missed
    assert window.lateness_max_us < PERIOD / 1000

    def line_and_counts(srv):  # one call on the server loop: the ticker cannot move in between
        st = srv.runtime.stats
        return stop_line(srv), st.ticks_total, st.ticks, srv.runtime.ticker.missed, st.snapshots_sent_total

    line, ticks_total, ticks, missed, sent_total = server.call(line_and_counts, server.server)
    assert f" {ticks_total} ticks" in line and ticks_total > ticks  # totals, not the window
    assert f" {missed} missed deadlines" in line
    assert f" {sent_total} snapshots sent" in line and "since start" in line


def test_a_wait_that_overshoots_is_a_missed_deadline_not_a_late_tick(monkeypatch):
    """The process descheduled in the middle of a tick's wait: that deadline is skipped and counted,
    like one the loop arrived at too late, so lateness stays under one period."""
    real = time.monotonic_ns
    state = {"armed": False, "calls": 0}

    def clock() -> int:
        if not state["armed"]:
            return real()
        state["calls"] += 1
        # the first reading of next() is before the wait; every later one is 13 ms on
        return real() + (13 * MS if state["calls"] > 1 else 0)

    monkeypatch.setattr(ticker_module, "_now_ns", clock)

    async def run() -> tuple:
        ticker = PreciseTicker(PERIOD)
        first = await ticker.next()
        state["armed"] = True
        second = await ticker.next()
        return first, second, ticker.missed

    first, second, missed = asyncio.run(run())
    assert second.lateness_ns < PERIOD
    # the count holds the first tick's misses too: a loaded machine can make that one late for real
    assert second.missed_before >= 1 and missed == first.missed_before + second.missed_before
    assert second.index - first.index == second.missed_before + 1


def test_transport_delay_and_true_age(server, channel):
    session = DriveSession(channel, "tx", pb.CLOCK_MODE_REALTIME)
    # a buffer held the first observation 200 ms before it was sent ...
    session.send(1, 0, sensor(1), sent_time_ns=time.time_ns() - 200 * MS)
    snap = session.recv()
    assert snap.HasField("transport_delay_ns") and snap.transport_delay_ns >= 200 * MS
    assert snap.observation_age_with_transport_ns == snap.observation_age_ns + snap.transport_delay_ns
    assert snap.observation_age_with_transport_ns >= 200 * MS
    # ... the second waited 50 ms between stamping and sending
    sent = time.time_ns()
    time.sleep(0.05)
    session.send(2, 5 * MS, sensor(2), sent_time_ns=sent)
    while (snap := session.recv()).observation_seq != 2:
        pass
    assert snap.transport_delay_ns >= 50 * MS and snap.observation_age_with_transport_ns >= 50 * MS
    # without a send time: unknown, so absent (not 0)
    session.send(3, 10 * MS, sensor(3))
    while (snap := session.recv()).observation_seq != 3:
        pass
    assert not snap.HasField("transport_delay_ns") and not snap.HasField("observation_age_with_transport_ns")
    session.cancel()


def lockstep_run(channel: grpc.Channel, session_id: str, sent_time: bool) -> list[pb.DecisionSnapshot]:
    session = DriveSession(channel, session_id, pb.CLOCK_MODE_LOCKSTEP)
    out = []
    for k in range(30):
        session.send(k + 1, k * PERIOD, sensor(k), sent_time_ns=time.time_ns() if sent_time else 0)
        out.append(session.recv())
    session.close()
    assert list(session.snapshots()) == []  # the stream ended (so the id is free again): nothing more came
    return out


def test_lockstep_time_fields_are_deterministic(channel):
    """LOCKSTEP is lossless and ticks on sensor time: nothing conflated or missed, no transport
    delay even when the client stamps its sends, and the bytes are the same either way."""
    stamped = lockstep_run(channel, "ls", sent_time=True)
    plain = lockstep_run(channel, "ls", sent_time=False)
    for a, b in zip(stamped, plain):
        assert a.snapshots_conflated_since_previous == a.ticks_missed_since_previous == 0
        assert a.max_lateness_since_previous_us == 0
        assert not a.HasField("transport_delay_ns") and not a.HasField("observation_age_with_transport_ns")
        assert without_wall_clock(a) == without_wall_clock(b)
    assert [s.tick for s in stamped] == list(range(30))


def test_seq_zero_and_realtime_time_going_back_are_refused(channel):
    """seq starts at 1 in both clocks (0 is protobuf's unset value); REALTIME sensor time may stand
    still but never go back. Each is INVALID_ARGUMENT naming the values."""
    for clock in (pb.CLOCK_MODE_REALTIME, pb.CLOCK_MODE_LOCKSTEP):
        session = DriveSession(channel, f"zero-{clock}", clock)
        session.send(0, 0, sensor(0))
        with pytest.raises(grpc.RpcError) as err:
            session.recv()
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "observation seq 0: seq starts at 1" in err.value.details()

    session = DriveSession(channel, "back", pb.CLOCK_MODE_REALTIME)
    session.send(1, 2_000 * MS, sensor(1))
    session.recv()
    session.send(2, 2_000 * MS, sensor(2))  # equal: allowed (a sensor that repeats its stamp)
    while session.recv().observation_seq != 2:
        pass
    session.send(3, 1_999 * MS, sensor(3))
    with pytest.raises(grpc.RpcError) as err:
        while True:  # snapshots of held seq 2 until the refusal ends the stream
            session.recv()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    expected = "seq 3 has timestamp 1999000000 ns, before the previous observation's (seq 2) 2000000000 ns"
    assert expected in err.value.details()
