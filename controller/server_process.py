"""A dualloop server command (`dualloop serve`, `dualloop alpasim`) in a child process on loopback.

The one way the benches, the demo, the highway suite and the process-level tests (chaos, fuzz,
alpasim) start a server: `--port 0`, the address read from the line the command announces it on,
the environment of a private server (no operator DUALLOOP_* settings, no token), stdout and stderr
kept in files. What a caller watches of it is here too: health, GetStats, its structured log lines,
its /proc numbers (RSS, threads, fds) and its planner workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dualloop.controller.contract.errors import ConfigError
from dualloop.controller.contract.server_env import private_server_env
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc

# `dualloop serve` prints "dualloop serving model ... on 127.0.0.1:PORT, ..." first; `dualloop
# alpasim` "serving egodriver.EgodriverService on 127.0.0.1:PORT: ..."
_ANNOUNCED = re.compile(r" on (127\.0\.0\.1:\d+)")


@dataclass
class ProcSample:
    """One process's resources from /proc (Linux)."""

    rss_mb: float
    threads: int
    fds: int


def proc_sample(pid: int) -> ProcSample:
    status: dict[str, str] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            status[key] = value.strip()
    return ProcSample(
        rss_mb=int(status["VmRSS"].split()[0]) / 1024.0,
        threads=int(status["Threads"]),
        fds=len(os.listdir(f"/proc/{pid}/fd")),
    )


def child_pids(pid: int) -> list[int]:
    """The direct children of a process (every thread's list: a child belongs to the thread that forked it)."""
    out: list[int] = []
    with contextlib.suppress(FileNotFoundError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(FileNotFoundError), open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(p) for p in f.read().split()]
    return sorted(set(out))


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except FileNotFoundError:
        return ""


def require_files(model: Path, gates: Sequence[Path]) -> None:
    """The files a server child is started with, checked before it starts: a missing one is the
    user's to fix (ConfigError, one line naming it), not a server that would not start."""
    for flag, path in [("--model", model), *(("--gate", g) for g in gates)]:
        if not path.is_file():
            raise ConfigError(f"{flag} {path}: {'a folder, not a file' if path.is_dir() else 'no such file'}")


class ServerStartError(RuntimeError):
    """The server process exited, or did not announce its address in time; says which, with its own
    last lines."""


class ServerProcess:
    """A dualloop server command in its own process, serving on a loopback port it picked itself.

    args: the command's arguments after `dualloop COMMAND` (`--port 0` is added). config: ServerConfig
    fields written to work_dir/serve-config.yaml and passed as --config (flags in args win over it).
    env: added to the private server environment. preexec_fn runs in the child before exec (e.g.
    resource limits). wait_serving: also wait until grpc.health says SERVING. work_dir None: a
    temporary folder, removed once the process has stopped."""

    def __init__(
        self,
        args: Sequence[str] = (),
        work_dir: Path | None = None,
        *,
        config: Mapping[str, Any] | None = None,
        command: str = "serve",
        env: Mapping[str, str] | None = None,
        preexec_fn: Callable[[], None] | None = None,
        start_timeout_s: float = 120.0,
        wait_serving: bool = False,
    ) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="dualloop-server-") if work_dir is None else None
        self.work_dir = Path(self._tmp.name) if self._tmp is not None else work_dir
        assert self.work_dir is not None
        self.work_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "dualloop.controller.cli", command, *args, "--port", "0"]
        if command == "serve":  # a SIGKILL to this process must not leave the server serving on
            cmd += ["--exit-with-parent", str(os.getpid())]
        self.command = command
        self.config = dict(config) if config is not None else None
        if self.config is not None:
            config_file = self.work_dir / "serve-config.yaml"
            config_file.write_text(json.dumps(self.config, indent=2))  # JSON is YAML
            cmd += ["--config", str(config_file)]
        self.stderr_path = self.work_dir / f"{command}-stderr.log"
        self.stdout_path = self.work_dir / f"{command}-stdout.log"
        # rich wraps at the console's width: the announced address must stay on its line
        child_env = {**private_server_env(), "PYTHONUNBUFFERED": "1", "COLUMNS": "250", **(env or {})}
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=err, env=child_env, preexec_fn=preexec_fn, text=True
            )
        self.pid = self.proc.pid
        self.stop_s: float | None = None  # how long stop() took
        self.stopped_in_time = False  # stop()'s signal ended it (no SIGKILL)
        self._address: str | None = None
        self._announced = threading.Event()
        self._channel: grpc.Channel | None = None
        # read stdout to the end, or a long run fills the pipe and blocks the server
        self._reader = threading.Thread(target=self._read_stdout, daemon=True)
        try:  # from the child's first moment: a SIGTERM or Ctrl-C here must stop it too
            self._reader.start()
            self._wait_started(start_timeout_s, wait_serving)
        except BaseException:
            self.stop(timeout_s=10)
            raise

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        with open(self.stdout_path, "w") as out:
            for line in self.proc.stdout:
                out.write(line)
                out.flush()
                match = _ANNOUNCED.search(line) if self._address is None else None
                if match:
                    self._address = match.group(1)
                    self._announced.set()
        self._announced.set()  # ended without announcing: the waiter sees no address

    def _wait_started(self, timeout_s: float, wait_serving: bool) -> None:
        deadline = time.monotonic() + timeout_s
        while self._address is None or (wait_serving and self.health() != "SERVING"):
            exited = self.proc.poll() is not None
            if exited or time.monotonic() > deadline:
                self._reader.join(5)  # the whole of what it printed, for the error
                # said at once when it exits: a missing file is not a slow start
                what = (
                    f"exited with code {self.proc.returncode}" if exited else f"did not start within {timeout_s:.0f} s"
                )
                raise ServerStartError(f"the `dualloop {self.command}` server {what}: {self.last_words()}")
            if self._announced.is_set():  # announced (or its output ended): health, or its exit, next
                time.sleep(0.2)
            else:
                self._announced.wait(0.2)

    def last_words(self, lines: int = 5) -> str:
        """The child's last stderr lines (its own error), else its stdout's, as one line."""
        for text in (self.stderr_text(), self.stdout_text()):
            tail = [line.strip() for line in text.strip().splitlines()[-lines:] if line.strip()]
            if tail:
                return " | ".join(tail)
        return "(it printed nothing)"

    @property
    def address(self) -> str:
        assert self._address is not None
        return self._address

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    @property
    def channel(self) -> grpc.Channel:
        """This process's own channel to the server (health, GetStats)."""
        if self._channel is None:
            self._channel = grpc.insecure_channel(self.address)
        return self._channel

    @property
    def stub(self) -> pb_grpc.ControllerServiceStub:
        return pb_grpc.ControllerServiceStub(self.channel)

    def health(self) -> str:
        """grpc.health.v1 status of the whole server ('UNAVAILABLE' while it does not answer)."""
        try:
            reply = health_pb2_grpc.HealthStub(self.channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        except grpc.RpcError:
            return "UNAVAILABLE"
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))

    def stats(self, timeout_s: float = 10.0) -> pb.GetStatsResponse:
        return self.stub.GetStats(pb.GetStatsRequest(), timeout=timeout_s)

    def sample(self) -> ProcSample:
        return proc_sample(self.pid)

    def planner_workers(self) -> list[int]:
        """The planner's worker processes (multiprocessing spawn children; not its resource tracker)."""
        return [p for p in child_pids(self.pid) if "spawn_main" in cmdline(p)]

    def stderr_text(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def stdout_text(self) -> str:
        return self.stdout_path.read_text(errors="replace") if self.stdout_path.exists() else ""

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """The server's structured log lines so far (log_format json), of one event or all."""
        out = []
        for line in self.stderr_text().splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and (name is None or record.get("event") == name):
                    out.append(record)
        return out

    def stop(self, timeout_s: float = 30.0, sig: signal.Signals = signal.SIGINT) -> int:
        """sig (the server drains and stops), SIGKILL if it has not exited within timeout_s; the exit code."""
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
                self.stopped_in_time = True
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.stop_s is None:
            self.stop_s = time.monotonic() - t0
        if self._reader.ident is not None:  # started
            self._reader.join(10)
        if self._tmp is not None:
            self._tmp.cleanup()
        return int(self.proc.returncode)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_shipped(
    work_dir: Path,
    config: Mapping[str, Any] | None = None,
    *,
    log_level: str = "WARNING",
    log_format: str = "human",
    preexec_fn: Callable[[], None] | None = None,
) -> ServerProcess:
    """`dualloop serve` configured by a file of ServerConfig fields, the model and gates defaulting
    to the shipped ones (what users serve); returned once it answers health with SERVING."""
    full = {"model": str(BASE_MODEL_PATH), "gates": [str(g) for g in DEFAULT_GATES], **(config or {})}
    full.update(log_level=log_level, log_format=log_format)
    return ServerProcess(work_dir=work_dir, config=full, preexec_fn=preexec_fn, wait_serving=True)


def probe_session(
    address: str,
    rows: np.ndarray,
    snapshots: int = 20,
    timeout_s: float = 60.0,
    until: Callable[[pb.DecisionSnapshot], bool] | None = None,
) -> list:
    """Open a REALTIME session, send rows[k] (cycling) once per tick period until `snapshots`
    snapshots have come (or one for which `until` is true), close it; returns the snapshots."""

    async def run() -> list:
        async with grpc.aio.insecure_channel(address) as channel:
            call = pb_grpc.ControllerServiceStub(channel).Drive(timeout=timeout_s)
            await call.write(pb.DriveRequest(open=pb.OpenSession(clock=pb.CLOCK_MODE_REALTIME)))
            opened = await call.read()
            period_s = opened.opened.tick_period_ns / 1e9
            got: list = []
            stop = asyncio.Event()

            async def send() -> None:
                # stopped by the event, never cancelled: grpc.aio cancels the whole call when a
                # task is cancelled in the middle of a write
                for seq in itertools.count(1):
                    if stop.is_set():
                        break
                    row = rows[(seq - 1) % len(rows)]
                    obs = pb.Observation(seq=seq, timestamp_ns=time.monotonic_ns(), features=row.tolist())
                    await call.write(pb.DriveRequest(observation=obs))
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), period_s)
                await call.done_writing()

            sender = asyncio.ensure_future(send())
            try:
                while len(got) < snapshots:
                    msg = await call.read()
                    if msg is grpc.aio.EOF:
                        break
                    got.append(msg.snapshot)
                    if until is not None and until(msg.snapshot):
                        break
            finally:
                stop.set()
                await sender
            while await call.read() is not grpc.aio.EOF:
                pass
            return got

    return asyncio.run(run())


def wait_until(predicate: Callable[[], bool], timeout_s: float, every_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(every_s)
