"""What the chaos tests share: a streaming session in a background thread, and the end-of-test check.

Every test runs a real `dualloop serve` process on loopback (controller.server_process.serve_shipped)
and asserts on counts, states and statuses with generous timeouts, never on wall-clock timing.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc
import numpy as np

from dualloop.controller.server_process import ServerProcess, probe_session
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc

TIMEOUT_S = 90.0
NOMINAL = pb.SafetyState.Value("SAFETY_STATE_NOMINAL")  # generous: a CI machine may be loaded several times over


@dataclass(frozen=True)
class Seen:
    """What a test needs of one snapshot."""

    tick: int
    state: str
    reasons: tuple[str, ...]
    plan_id: str
    dropped: int


def seen(snap: pb.DecisionSnapshot) -> Seen:
    return Seen(
        snap.tick,
        pb.SafetyState.Name(snap.safety_state).removeprefix("SAFETY_STATE_"),
        tuple(pb.ReasonCode.Name(r).removeprefix("REASON_CODE_") for r in snap.reasons),
        snap.plan_id,
        snap.snapshots_dropped,
    )


class Driver:
    """A REALTIME session on its own thread: sends rows (cycling) once per tick period and, unless
    `read` is False, reads every snapshot it is given. stop() half-closes and waits for the status."""

    def __init__(
        self,
        address: str,
        rows: np.ndarray,
        session_id: str = "",
        read: bool = True,
        options: Sequence[tuple[str, int]] = (),
    ) -> None:
        self.address, self.rows, self.session_id, self.read, self.options = address, rows, session_id, read, options
        self.snaps: list[Seen] = []
        self.status: grpc.StatusCode | None = None
        self.opened = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()
        assert self.opened.wait(TIMEOUT_S), "the session did not open"

    async def _run(self) -> None:
        async with grpc.aio.insecure_channel(self.address, options=list(self.options)) as channel:
            call = pb_grpc.ControllerServiceStub(channel).Drive()
            await call.write(
                pb.DriveRequest(open=pb.OpenSession(session_id=self.session_id, clock=pb.CLOCK_MODE_REALTIME))
            )
            opened = await call.read()
            self.session_id = opened.opened.session_id
            period_s = opened.opened.tick_period_ns / 1e9
            self.opened.set()

            async def send() -> None:
                seq = 0
                while not self._stop.is_set():
                    row = self.rows[seq % len(self.rows)]
                    seq += 1
                    obs = pb.Observation(seq=seq, timestamp_ns=time.monotonic_ns(), features=row.tolist())
                    await call.write(pb.DriveRequest(observation=obs))
                    await asyncio.sleep(period_s)
                await call.done_writing()

            sender = asyncio.ensure_future(send())
            if self.read:
                while (msg := await call.read()) is not grpc.aio.EOF:
                    self.snaps.append(seen(msg.snapshot))
                await sender
            else:  # never reads: the snapshots pile up in the server's outbox (conflated) and the window
                await sender
                call.cancel()
            self.status = await call.code()

    def wait_for(self, predicate: Callable[[Seen], bool], start: int = 0, timeout_s: float = TIMEOUT_S) -> int:
        """Index of the first snapshot from `start` on that satisfies predicate; fails after timeout_s."""
        deadline = time.monotonic() + timeout_s
        k = start
        while time.monotonic() < deadline:
            while k < len(self.snaps):
                if predicate(self.snaps[k]):
                    return k
                k += 1
            assert self._thread.is_alive(), f"the session ended ({self.status}) before the awaited snapshot"
            time.sleep(0.05)
        raise AssertionError(f"no awaited snapshot within {timeout_s:.0f} s; the last: {self.snaps[-3:]}")

    def stop(self) -> grpc.StatusCode | None:
        self._stop.set()
        self._thread.join(TIMEOUT_S)
        assert not self._thread.is_alive(), "the session did not end"
        return self.status


def assert_still_serving(server: ServerProcess, rows: np.ndarray) -> None:
    """Health SERVING, and a fresh session is soon NOMINAL (a clean dwell after its first ticks)."""
    assert server.proc.poll() is None, f"the server exited ({server.proc.returncode}): {server.stderr_text()[-2000:]}"
    assert server.health() == "SERVING"
    # up to 20 s of ticks: on a loaded machine a session may first see late observations
    snaps = probe_session(
        server.address, rows, snapshots=4000, timeout_s=TIMEOUT_S, until=lambda s: s.safety_state == NOMINAL
    )
    states = [pb.SafetyState.Name(s.safety_state).removeprefix("SAFETY_STATE_") for s in snaps]
    assert states[-1] == "NOMINAL", f"a fresh session is not NOMINAL: {states[-10:]}"
