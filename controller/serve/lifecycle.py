"""Building, starting, draining and stopping a server (ServerLifecycle), and a server on a thread of
its own (ServerThread) for tests, demos and benchmarks. Named for its job, the server's life from a
ServerConfig to its stop, apart from what it runs (runtime.SessionRuntime, service.RpcHandlers)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import tempfile
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np

from dualloop.controller.contract.addresses import host_port
from dualloop.controller.contract.errors import ConfigError
from dualloop.controller.contract.gate_files import load_gate_for_model
from dualloop.controller.logs.recorder import Recorder, unique_log_path
from dualloop.controller.serve import board as wb
from dualloop.controller.serve import events
from dualloop.controller.serve.candidate import CandidateError, load_candidate
from dualloop.controller.serve.config import ServerConfig
from dualloop.controller.serve.cpu_latency import CpuLatencyRequest, hold_cpu_wake_latency
from dualloop.controller.serve.file_copies import as_configured, snapshot_files, temporary_folder
from dualloop.controller.serve.health import Health, enable_reflection
from dualloop.controller.serve.metrics import (
    MetricsCollector,
    MetricsEndpoint,
)
from dualloop.controller.serve.planning import ServerPlanning
from dualloop.controller.serve.realtime_threads import (
    lower_this_thread,
    one_blas_thread,
    set_realtime_priority,
)
from dualloop.controller.serve.runtime import SessionRuntime
from dualloop.controller.serve.security import (
    Authenticator,
    AuthError,
    AuthInterceptor,
)
from dualloop.controller.serve.service import V1_SERVICE, RpcHandlers, add_rpc_handlers
from dualloop.controller.serve.session_claims import SessionClaims
from dualloop.controller.serve.ticker import percentiles_us
from dualloop.executor.core import Executor
from dualloop.executor.model_cost import OverBudget, check_live
from dualloop.executor.model_runner import DecisionModel
from dualloop.ood import GateFileError
from dualloop.planner.scheduler import PlannerStartError
from dualloop.planner.tls import validity_problem
from dualloop.planner.worker import SourceFactory
from dualloop.v2 import controller_pb2 as pb

_mono_ns = time.monotonic_ns


def _check_writable(folder: Path) -> None:
    """A record_dir the server cannot write to is refused at start: the recorder opens its file on its
    own thread, so a read-only folder was found at the first session (its records all dropped) or at
    shutdown, after the server had said it was recording."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except PermissionError as err:
        # in a container the server runs as a user the host's folder does not belong to: name it
        uid = os.geteuid()
        raise ConfigError(
            f"record_dir (--record-dir) {folder}: cannot write there: {err.strerror or err}; this process runs as "
            f"uid {uid}: give it the folder (chown {uid} {folder}) or mount a volume it owns"
        ) from None
    except OSError as err:
        raise ConfigError(f"record_dir (--record-dir) {folder}: cannot write there: {err.strerror or err}") from None


class ServerLifecycle:
    """Owns the model, executor, gRPC server and tick loop; run it on an asyncio loop."""

    def __init__(
        self,
        config: ServerConfig,
        model: DecisionModel | None = None,
        plan_source: SourceFactory | None = None,
        worker: tuple[wb.Board, int] | None = None,
        read_from: Mapping[Path, Path] | None = None,
    ) -> None:
        """plan_source overrides config.planner.source (its period and deadline still apply).
        worker: (board, slot) when this is one of several processes sharing the port (workers.py).
        read_from: the file to load for each configured model, gate and planner model path (a
        worker's: the copies its parent took at the server's start; one process copies its ONNX
        planner's model itself, file_copies.py); the configuration, logs and recordings keep the
        configured paths."""
        self.config = config
        files = dict(read_from or {})
        one_blas_thread()  # constructed on the main thread (ServerThread too): see one_blas_thread
        try:  # tokens are read here, never kept in the configuration (it is recorded in session logs)
            self.auth = Authenticator(config.auth)
        except AuthError as err:
            raise ConfigError(str(err)) from None
        self.model = model or DecisionModel(
            files.get(config.model, config.model),
            warmup_batches=tuple(b for b in (1, 2, 4, 8, 16, 32, 64) if b <= config.executor.max_sessions),
        )
        gates = []
        for path in config.gates:
            try:
                gates.append(load_gate_for_model(files.get(path, path), self.model))
            except GateFileError as err:  # its message starts "gate file PATH:" already: said once
                raise ConfigError(str(err)) from None
            except (OSError, ValueError) as err:
                raise ConfigError(f"gate {path}: {err}") from None
        try:  # on this machine, at the server's batch size: a model over the tick's budget never serves
            check_live(self.model, config.executor)
        except OverBudget as err:
            raise ConfigError(f"--model {self.model.path}: {err}") from None
        self.executor = Executor(self.model, config.executor, gates)
        self.runtime = SessionRuntime(self.executor, config)
        if config.auth.tokens_file is not None:
            self.runtime.token_store = self.auth.store
        if config.candidate is not None:
            try:
                cand = load_candidate(
                    self.executor,
                    files.get(config.candidate, config.candidate),
                    [files.get(g, g) for g in config.candidate_gates],
                )
            except CandidateError as err:
                raise ConfigError(f"--candidate {config.candidate}: {err.message}") from None
            self.runtime.set_candidate(cand, config.candidate)
        self._copies: tempfile.TemporaryDirectory[str] | None = None  # one process's copy of its planner model
        if config.planner.enabled or plan_source is not None:
            planner = config.planner  # an ONNX planner from its copy: a replaced planner worker loads it again
            if plan_source is None and planner.source == "onnx" and planner.path not in files:
                self._copies = temporary_folder("dualloop-serve-", "the server", "a copy of its planner model")
                files.update(snapshot_files(config, Path(self._copies.name), workers=False))
            if planner.path is not None and planner.path in files:
                planner = planner.model_copy(update={"path": files[planner.path]})
            self.runtime.planning = ServerPlanning(planner, self.executor, plan_source)
        self._read_from = files  # for errors about a copy: as_configured
        if worker is not None:
            self.runtime.board, self.runtime.board_slot = worker
            self.runtime.claims = SessionClaims(worker[0].sessions_folder)
        self.port: int | None = None
        self.scheduling = "not started"
        self._cpu_latency: CpuLatencyRequest | None = None
        self._server: grpc.aio.Server | None = None
        self._ticks: asyncio.Task | None = None
        self.health: Health | None = None
        self.metrics_endpoint: MetricsEndpoint | None = None
        self.metrics_port: int | None = None  # where the metrics are served, once started

    async def start(self) -> int:
        if self.config.record_dir is not None:
            _check_writable(self.config.record_dir)
        if self.runtime.planning is not None:  # spawns the worker and builds the sources: seconds at most
            try:
                await asyncio.to_thread(self.runtime.planning.start)
            except PlannerStartError as err:  # the source's own error: the planner model it cannot load, say
                raise ConfigError(as_configured(str(err), self._read_from)) from None
        self._server = grpc.aio.server(
            options=[
                # several worker processes listen on one port; a single server keeps the port its own
                ("grpc.so_reuseport", 1 if self.runtime.board is not None else 0),
                ("grpc.max_receive_message_length", self.config.max_receive_message_bytes),
                ("grpc.keepalive_time_ms", round(self.config.keepalive_s * 1000)),
                ("grpc.keepalive_timeout_ms", round(self.config.keepalive_timeout_s * 1000)),
                # a keepalive ping waits while another ping is out (gRPC's own flow-control probe, with a
                # timeout of 60 s): every ping gets the keepalive's timeout
                ("grpc.http2.ping_timeout_ms", round(self.config.keepalive_timeout_s * 1000)),
                # a silent LOCKSTEP stream must be pinged on and on, not twice (gRPC's default)
                ("grpc.http2.max_pings_without_data", 0),
            ],
            interceptors=[AuthInterceptor(self.auth)] if self.auth.enabled else None,
        )
        add_rpc_handlers(RpcHandlers(self.runtime), self._server)
        services = (pb.DESCRIPTOR.services_by_name["ControllerService"].full_name, V1_SERVICE)
        self.health = Health(self._server, services)
        await self.health.not_serving()
        if self.config.reflection_enabled:  # v1 is an alias without descriptors of its own: not listed
            enable_reflection(self._server, services[:1])
        address = host_port(self.config.host, self.config.port)
        tls = self.config.tls
        problem = validity_problem(tls.cert_file) if tls is not None else None
        if problem is not None:  # served anyway: the clock may be what is wrong, and a reload may fix it
            events.event("server.tls_certificate", logging.WARNING, problem=problem)
        try:  # older grpc returned port 0, newer raises RuntimeError with a hint about GRPC_VERBOSITY
            self.port = (
                self._server.add_insecure_port(address)
                if tls is None
                else self._server.add_secure_port(address, tls.credentials())
            )
        except RuntimeError:
            self.port = 0
        if self.port == 0:
            raise OSError(f"cannot bind {address}: is the port in use by another server? (--port 0 picks a free one)")
        await self._server.start()
        # After gRPC has started its threads, so that they are placed too (realtime_threads.py).
        self.scheduling = set_realtime_priority(self.config.realtime_priority)
        # to_thread's workers start from this (the loop's) thread: below it, as the others
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(thread_name_prefix="dualloop-worker", initializer=lower_this_thread)
        )
        self._cpu_latency, held = hold_cpu_wake_latency(self.config.cpu_wake_latency_us)
        if held:
            self.scheduling = f"{self.scheduling}; {held}"
        self.runtime.scheduling = self.scheduling
        if self.config.record_dir is not None:
            mb = self.config.record_rotate_mb
            self.runtime.recorder = Recorder(
                unique_log_path(self.config.record_dir, suffix=self._worker_suffix),
                rotate_bytes=int(mb * 1e6) if mb else None,
                rotate_seconds=self.config.record_rotate_s,
                plots=self.config.record_plots,
                exclusive=True,  # servers sharing a record dir: never overwrite another's log
            )
        if self.runtime.metrics is not None and self.config.metrics_port is not None:
            collector = MetricsCollector(self.runtime.metrics_reading, asyncio.get_running_loop())
            self.metrics_endpoint = MetricsEndpoint(collector)
            self.metrics_port = self.metrics_endpoint.start(self.config.metrics_host, self.config.metrics_port)
        self._ticks = asyncio.create_task(self.runtime.run_ticks())
        # SERVING only once a forward pass has run (an onnxruntime session's first calls are slow); on
        # a thread, so that health answers NOT_SERVING meanwhile
        await asyncio.to_thread(self._warm)
        await self.health.serving()
        if self.runtime.board is not None:
            self.runtime.board_fields = {wb.READY: 1, wb.METRICS_PORT: self.metrics_port or 0}
            self.runtime.publish()
        return self.port

    @property
    def _worker_suffix(self) -> str:
        """Each worker records to files of its own."""
        return f"-w{self.runtime.board_slot}" if self.runtime.board is not None else ""

    def log_start(self) -> None:
        """The server.start event (the CLI logs it after its own start line, which scripts read first)."""
        card = self.executor.card
        assert self.port is not None
        events.event(
            "server.start",
            address=host_port(self.config.host, self.port),
            model=card.name,
            model_version=card.version,
            schema_hash=card.schema_hash(),
            gates=[str(g) for g in self.config.gates],
            tick_period_ms=self.config.executor.tick_period_ms,
            scheduling=self.scheduling,
            reflection=self.config.reflection_enabled,
            record_dir=str(self.config.record_dir) if self.config.record_dir is not None else None,
            gc_frozen_objects=gc.get_freeze_count(),  # settle_collector's work, when this process did it
            gc_young_threshold=gc.get_threshold()[0],
        )

    def _warm(self) -> None:
        # the model's whole input: wire features, then the history features it derives (if any)
        self.model.forward(np.zeros((1, self.model.n_inputs), np.float32), np.zeros((1, self.model.n_plan), np.float32))
        # numpy's first percentile imports numpy.ma (8-16 ms here): not on the loop at the first
        # GetStats, where it cost a missed deadline (found by bench/stall_trace.py)
        percentiles_us(np.arange(2, dtype=np.int64))

    async def drain(self, grace_s: float | None = None) -> None:
        """Health NOT_SERVING, refuse new sessions (UNAVAILABLE), end the open ones after a final
        snapshot (UNAVAILABLE "server draining"), and wait up to grace_s (config.drain_grace_s) for them."""
        runtime = self.runtime
        if runtime.draining.is_set():
            return
        grace = self.config.drain_grace_s if grace_s is None else grace_s
        runtime.draining.set()
        if runtime.board is not None:
            runtime.board_fields[wb.DRAINING] = 1
            runtime.publish()
        events.event("server.drain", sessions_open=len(self.executor.sessions), grace_s=grace)
        if self.health is not None:
            await self.health.draining()
        try:
            await asyncio.wait_for(runtime.drives_idle.wait(), grace)
        except TimeoutError:
            events.event("server.drain_timeout", logging.WARNING, streams_left=runtime.drives_active, grace_s=grace)

    async def stop(self, grace_s: float | None = None) -> None:
        """Drain (grace_s: default config.drain_grace_s), then stop gRPC, the ticks, the planner and the recorder."""
        await self.drain(grace_s)
        self.runtime.stop()
        if self._server is not None:
            # the drained streams' statuses are on their way; what is still open (a stream stuck
            # past the grace, health Watch streams) is cancelled after this
            await self._server.stop(0.5)
            # the streams it cancelled close their sessions on this loop: let them, so their
            # session.close lines come before server.stop's (bounded: a handler may be stuck)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.runtime.drives_idle.wait(), 2.0)
        if self._ticks is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticks
        if self.runtime.planning is not None:
            await asyncio.to_thread(self.runtime.planning.stop)
        if self._copies is not None:  # no planner worker is started again
            self._copies.cleanup()
        recording: dict[str, int] = {}
        if self.runtime.recorder is not None:
            self.recording_stats = await asyncio.to_thread(self.runtime.recorder.close)
            recording = {"recorder_dropped": self.recording_stats.total_dropped}
        stats = self.runtime.stats
        self.runtime.publish()  # the final totals, for the parent's exit line
        events.event(
            "server.stop",
            uptime_s=round((_mono_ns() - stats.started_ns) / 1e9, 3),
            ticks_total=stats.ticks_total,
            missed_deadlines_total=self.runtime.ticker.missed,
            snapshots_sent_total=stats.snapshots_sent_total,
            **recording,
        )
        if self._cpu_latency is not None:
            self._cpu_latency.close()
        if self.metrics_endpoint is not None:  # last: a scrape during the stop still gets its answer
            await asyncio.to_thread(self.metrics_endpoint.stop)

    async def wait(self) -> None:
        assert self._server is not None
        await self._server.wait_for_termination()


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux and macOS
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class ServerThread:
    """A real server on its own loop in a background thread: for tests, demos and benchmarks."""

    def __init__(
        self, config: ServerConfig, model: DecisionModel | None = None, plan_source: SourceFactory | None = None
    ) -> None:
        self.server = ServerLifecycle(config, model, plan_source)
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self._run, name="dualloop-server", daemon=True)
        self._started = threading.Event()
        self._error: BaseException | None = None

    @property
    def port(self) -> int:
        assert self.server.port is not None
        return self.server.port

    @property
    def address(self) -> str:
        """Where a client on this machine reaches the server (the bind host; localhost: 127.0.0.1)."""
        host = self.server.config.host
        return host_port("127.0.0.1" if host.strip().lower() in ("localhost", "localhost.") else host, self.port)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self.server.start())
        except BaseException as err:  # noqa: BLE001 - reported to the starting thread
            self._error = err
            self._started.set()
            return
        self._started.set()
        self.loop.run_forever()

    def start(self) -> ServerThread:
        self._thread.start()
        self._started.wait(30)
        if self._error is not None:
            raise self._error
        return self

    def call(self, fn, *args):
        """Run fn(*args) on the server loop and return its result (for inspecting state in tests)."""
        return asyncio.run_coroutine_threadsafe(_call(fn, *args), self.loop).result(10)

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(self.server.config.drain_grace_s + 10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


async def _call(fn, *args):
    return fn(*args)
