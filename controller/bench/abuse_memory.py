"""Server memory under hostile client strings, with recording on: numbers, not a test.

    python -m dualloop.controller.bench.abuse_memory [--seconds 10] [--sessions 16]

Each scenario starts its own `dualloop serve --record-dir` (the shipped model and gates) and reads
the server's RSS (/proc/PID/status) every 0.25 s against its baseline, taken before the attack:

- huge-id: one client keeps opening a REALTIME session with a 1 MiB id, streams observations at
  200 Hz and reads every snapshot (a server without an id limit serves and records it);
- longest-id: `--sessions` REALTIME sessions with the longest allowed id (128 bytes), each
  observation carrying a new 128-byte plan id, at 200 Hz, reading as fast as they can;
- short-lived: one client after another opens a LOCKSTEP session with a fresh 128-byte id, sends
  5 observations and closes: the growth per closed session.

Prints one line per scenario and what GetStats says of the recorder (records dropped, queue bytes).
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc

from dualloop.controller.server_process import ServerProcess
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc

MIB = 1 << 20
LONGEST_ID = 128


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


class Server(ServerProcess):
    """`dualloop serve --record-dir` with the shipped model and gates; what the attacks send."""

    def __init__(self, record_dir: Path) -> None:
        gates = [a for g in DEFAULT_GATES for a in ("--gate", str(g))]
        args = ["--model", str(BASE_MODEL_PATH), *gates, "--record-dir", str(record_dir), "--log-level", "WARNING"]
        super().__init__(args, record_dir / "server")
        info = self.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=30).model
        self.features = [f.mean for f in info.features]
        self.n_plan = len(info.plan)


def _stream(server: Server, session_id: str, stop: threading.Event, plan_ids: bool, counts: dict[str, int]) -> None:
    """One REALTIME session at 200 Hz, read as fast as it comes; reopened while refused."""

    def requests() -> Iterator[pb.DriveRequest]:
        yield pb.DriveRequest(open=pb.OpenSession(session_id=session_id, clock=pb.CLOCK_MODE_REALTIME))
        seq = 0
        while not stop.is_set():
            seq += 1
            obs = pb.Observation(seq=seq, timestamp_ns=time.monotonic_ns(), features=server.features)
            if plan_ids:
                obs.plan.plan_id = f"{seq:012d}".ljust(LONGEST_ID, "p")
                obs.plan.values.extend([0.0] * server.n_plan)
            yield pb.DriveRequest(observation=obs)
            time.sleep(0.005)

    stub = pb_grpc.ControllerServiceStub(server.channel)
    while not stop.is_set():
        try:
            for response in stub.Drive(requests()):
                counts["bytes"] += response.ByteSize()
        except grpc.RpcError as err:
            counts[err.code().name] = counts.get(err.code().name, 0) + 1
            time.sleep(0.01)


def _short_lived(server: Server, stop: threading.Event, counts: dict[str, int]) -> None:
    stub = pb_grpc.ControllerServiceStub(server.channel)
    k = 0
    while not stop.is_set():
        k += 1
        sid = f"{os.getpid()}-{k:09d}".ljust(LONGEST_ID, "s")
        msgs = [pb.DriveRequest(open=pb.OpenSession(session_id=sid, clock=pb.CLOCK_MODE_LOCKSTEP))]
        msgs += [
            pb.DriveRequest(observation=pb.Observation(seq=i, timestamp_ns=i * 5_000_000, features=server.features))
            for i in range(1, 6)
        ]
        try:
            list(stub.Drive(iter(msgs), timeout=30))
            counts["sessions"] += 1
        except grpc.RpcError as err:
            counts[err.code().name] = counts.get(err.code().name, 0) + 1


def run(
    name: str, seconds: float, attack: Callable[[Server, threading.Event, dict[str, int]], list[threading.Thread]]
) -> None:
    with tempfile.TemporaryDirectory(prefix="dualloop-abuse-") as tmp:
        server = Server(Path(tmp))
        try:
            time.sleep(2.0)  # settle after warm-up
            baseline = rss_bytes(server.pid)
            stop, counts = threading.Event(), {"bytes": 0, "sessions": 0}
            threads = attack(server, stop, counts)
            for t in threads:
                t.start()
            samples, queue_bytes = [], []
            end = time.monotonic() + seconds
            while time.monotonic() < end and server.proc.poll() is None:
                samples.append(rss_bytes(server.pid))
                queue_bytes.append(getattr(server.stats(30), "recorder_queue_bytes", 0))
                time.sleep(0.25)
            stop.set()
            for t in threads:
                t.join(30)
            time.sleep(1.0)
            after = rss_bytes(server.pid)
            stats = server.stats(30)
            record_mb = sum(f.stat().st_size for f in Path(tmp).glob("*.mcap")) / 1e6
        finally:
            server.stop(sig=signal.SIGTERM)
    peak = max(samples)
    extra = ""
    if counts["sessions"]:
        extra = f", {counts['sessions']} sessions closed: {(after - baseline) / counts['sessions']:.0f} B each"
    refused = {k: v for k, v in counts.items() if k not in ("bytes", "sessions")}
    print(
        f"{name:12s} baseline {baseline / MIB:6.1f} MiB  peak {peak / MIB:6.1f} (+{(peak - baseline) / MIB:6.1f})  "
        f"after {after / MIB:6.1f} (+{(after - baseline) / MIB:6.1f}) MiB; client read {counts['bytes'] / MIB:.1f} MiB"
        f"{extra}; errors {refused}; recorded {record_mb:.1f} MB, records dropped "
        f"{getattr(stats, 'records_dropped_total', 'n/a')}, recorder queue max "
        f"{max(queue_bytes) / MIB:.2f} MiB",
        flush=True,
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--seconds", type=float, default=10.0, help="each attack's duration")
    p.add_argument("--sessions", type=int, default=16, help="longest-id: concurrent sessions")
    p.add_argument("--only", choices=["huge-id", "longest-id", "short-lived"], action="append")
    args = p.parse_args(argv)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, load {load}, {os.cpu_count()} CPUs")
    scenarios: dict[str, Callable[[Server, threading.Event, dict[str, int]], list[threading.Thread]]] = {
        "huge-id": lambda s, stop, c: [threading.Thread(target=_stream, args=(s, "x" * MIB, stop, False, c))],
        "longest-id": lambda s, stop, c: [
            threading.Thread(target=_stream, args=(s, f"{k:04d}".ljust(LONGEST_ID, "L"), stop, True, c))
            for k in range(args.sessions)
        ],
        "short-lived": lambda s, stop, c: [threading.Thread(target=_short_lived, args=(s, stop, c))],
    }
    for name, attack in scenarios.items():
        if not args.only or name in args.only:
            run(name, args.seconds, attack)


if __name__ == "__main__":
    main()
