"""`dualloop serve --workers N`: N server processes on one port, each a full executor + gRPC server.

One Python process serves one core (one GIL, one event loop that also runs the tick), so the
parent starts N worker processes that all bind the port with SO_REUSEPORT (gRPC's
`grpc.so_reuseport` option; gRPC's own examples/python/multiprocessing does the same): the kernel
hands each new connection to one of them. Everything a session has stays on the process that
accepted its stream (REALTIME and LOCKSTEP alike), and its id is claimed for the whole server
(session_claims.py: no other worker opens it meanwhile); a channel's streams all go to one worker, so
spreading sessions over workers needs several channels (one per client process, as real stacks
have). Health and reflection are served by every worker.

Whole-server figures: each worker publishes its counters to a shared-memory board (board.py) and
answers GetStats from every row; the parent serves Prometheus metrics (when configured) by reading
each worker's own metrics endpoint (a private loopback port) and summing the samples: every family
the server exports is a counter, a histogram, a summary or an additive gauge. A dead worker's last
scraped counters stay in the sums (SummedMetrics), so they never fall.

What a worker starts with: the parent reads the model and gate files (the candidate's too) and the
server planner's ONNX model once, at the start, into read-only copies in its temporary folder
(file_copies.snapshot_files), and every worker loads those, at its first start and at each restart; the
configuration, logs and recordings keep the configured paths. A file replaced or damaged on disk
meanwhile never reaches a restarted worker, which would otherwise serve another model or planner
beside the others on the same port, or fail to start.

Supervision: SIGTERM or SIGINT to the parent is forwarded as SIGTERM to every worker, which drains
(ServerLifecycle.stop: NOT_SERVING, refuse new sessions, end open ones after a final snapshot);
the parent exits 0 once all have exited 0. A worker that dies on its own is reported
(server.worker_exit) and restarted in its slot: its sessions ended with it (their clients see
UNAVAILABLE and reconnect, to any worker), its totals are kept on the board. A worker that cannot
start says why in one line (server.worker_failed). A slot whose workers died more than MAX_RESTARTS
times within RESTART_WINDOW_S is restarted after a growing delay (restart_delay), never by stopping
the workers that serve; only when every slot keeps dying and none serves does the parent stop, exit 1.

Candidate models: SIGHUP to the parent is forwarded to every worker, each of which promotes the
candidate it loaded at start (`--candidate`): the one way to swap every worker. From then on a worker
(re)started takes the candidate as its model. The admin RPCs act on the worker that answers the call
only, and a worker restarted later starts with the server's model (the configured one, or the
candidate SIGHUP promoted), not with what an admin RPC loaded into the worker it replaces.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from pydantic import ValidationError

from dualloop.controller.cli_types import positive_int
from dualloop.controller.contract.addresses import bare_host, host_port
from dualloop.controller.contract.config_files import problem_text
from dualloop.controller.contract.errors import ConfigError
from dualloop.controller.serve import board as wb
from dualloop.controller.serve import events
from dualloop.controller.serve.config import ServerConfig, gates_summary
from dualloop.controller.serve.file_copies import as_configured, snapshot_files, temporary_folder
from dualloop.controller.serve.lifecycle import ServerLifecycle, new_event_loop
from dualloop.controller.serve.metrics import MetricsEndpoint
from dualloop.controller.serve.runtime import LATENESS_BUCKETS_US
from dualloop.controller.serve.security_cli import security_summary
from dualloop.controller.serve.ticker import settle_collector
from dualloop.executor.model_card import ModelFileError
from dualloop.ood import GateFileError
from dualloop.planner.onnx_planner import PlannerFileError
from dualloop.planner.tls import TLSFileError

MAX_RESTARTS = 3  # a slot's deaths within RESTART_WINDOW_S restarted at once; later ones wait (restart_delay)
RESTART_WINDOW_S = 60.0
RESTART_BACKOFF_MAX_S = 30.0
START_TIMEOUT_S = 120.0  # loading the model and the first forward pass, on a loaded machine
SCRAPE_TIMEOUT_S = 2.0


def worker_count(value: str) -> int:
    """--workers: a positive count, or 'auto' (one per CPU this process may run on)."""
    if value == "auto":
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        return positive_int(value)
    except argparse.ArgumentTypeError as err:
        raise argparse.ArgumentTypeError(f"{err}, or 'auto'") from None


def _stop_when_gone(parent: int, stop: threading.Event) -> None:
    """serve --exit-with-parent under --workers: the parent of the workers stops them all (a drain)."""
    while os.getppid() == parent:
        if stop.wait(0.5):
            return
    events.event("server.parent_gone", logging.WARNING, parent_pid=parent)
    stop.set()


def reserve_port(host: str, port: int) -> tuple[socket.socket, int]:
    """Check the port is free (a port already served by someone else's SO_REUSEPORT group would be
    silently shared), then hold it with SO_REUSEPORT so the workers can bind it; port 0 picks one."""
    bare = bare_host(host.strip())
    family = socket.AF_INET6 if ":" in bare else socket.AF_INET
    addr = "127.0.0.1" if bare.lower() in ("localhost", "localhost.") else bare
    if port:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((addr, port))
            except OSError as err:
                raise OSError(f"cannot bind {host_port(host, port)} ({err}): is the port in use?") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((addr, port))
    return sock, int(sock.getsockname()[1])


# Families whose samples only grow while their process lives: a dead worker's last values stay in the sums.
_CUMULATIVE = frozenset({"counter", "histogram", "summary"})
_Key = tuple[str, str, tuple[tuple[str, str], ...]]  # family, sample name, labels


class SummedMetrics(Collector):
    """The workers' metrics, sample by sample summed (scraped from their private endpoints).

    Counters (and histograms, summaries) must never fall, or Prometheus reads a reset and counts
    the whole total again: each worker process's last scraped values are kept, by slot and process
    id, and once another process takes the slot (or while a dead one is not yet replaced) they stay
    in the sums. What a worker counted after its last scrape and before it died is lost (at most one
    scrape interval). Gauges are summed over the workers that answered."""

    def __init__(self, board: wb.Board, restarts: list[int]) -> None:
        self.board = board
        self.restarts = restarts
        self._lock = threading.Lock()  # scrapes may overlap (one HTTP thread each)
        self._last: dict[int, tuple[int, dict[_Key, float]]] = {}  # slot -> (pid, cumulative samples)
        self._retired: dict[_Key, float] = {}  # of the processes that ended
        self._families: dict[str, tuple[str, str, str]] = {}  # name -> documentation, type, unit

    def _texts(self) -> list[tuple[int, int, str]]:
        texts = []
        for slot in range(self.board.workers):
            row = self.board.read_row(slot)
            if not row[wb.READY] or not row[wb.METRICS_PORT]:
                continue
            try:
                url = f"http://127.0.0.1:{int(row[wb.METRICS_PORT])}/metrics"
                with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as response:
                    texts.append((slot, int(row[wb.PID]), response.read().decode()))
            except OSError as err:  # a worker dying or stopping: its last counts stand in for it
                events.event("metrics.worker_unreachable", logging.WARNING, slot=slot, error=str(err))
        return texts

    def collect(self) -> Iterable[Metric]:
        texts = self._texts()
        with self._lock:
            gauges: dict[_Key, float] = {}
            for slot, pid, text in texts:
                cumulative: dict[_Key, float] = {}
                for fam in text_string_to_metric_families(text):
                    self._families.setdefault(fam.name, (fam.documentation, fam.type, fam.unit))
                    into = cumulative if fam.type in _CUMULATIVE else gauges
                    for s in fam.samples:
                        key = (fam.name, s.name, tuple(sorted(s.labels.items())))
                        into[key] = into.get(key, 0.0) + s.value
                previous = self._last.get(slot)
                if previous is not None and previous[0] != pid:  # another process in the slot: the old one ended
                    for key, value in previous[1].items():
                        self._retired[key] = self._retired.get(key, 0.0) + value
                self._last[slot] = (pid, cumulative)
            sums = dict(self._retired)
            for _, values in self._last.values():
                for key, value in values.items():
                    sums[key] = sums.get(key, 0.0) + value
            for key, value in gauges.items():
                sums[key] = sums.get(key, 0.0) + value
            families: dict[str, Metric] = {}
            for (name, sample, labels), value in sums.items():
                if name not in families:
                    documentation, kind, unit = self._families[name]
                    families[name] = Metric(name, documentation, kind, unit)
                families[name].add_sample(sample, dict(labels), value)
        yield from families.values()
        yield GaugeMetricFamily(
            "dualloop_workers", "Worker processes whose metrics this scrape summed.", value=len(texts)
        )
        # a counter (it only grows while the parent lives): increase() over it counts the restarts
        yield CounterMetricFamily(
            "dualloop_worker_restarts", "Worker processes restarted after dying.", value=self.restarts[0]
        )


def restart_delay(deaths: int) -> float:
    """Seconds before a slot's next worker starts, after its `deaths` within RESTART_WINDOW_S: none
    for the first MAX_RESTARTS, then 1, 2, 4 ... up to RESTART_BACKOFF_MAX_S. A worker that cannot
    start keeps being tried without spinning, and never stops the workers that serve."""
    return 0.0 if deaths <= MAX_RESTARTS else min(RESTART_BACKOFF_MAX_S, 2.0 ** (deaths - MAX_RESTARTS - 1))


def _worker_config(config: ServerConfig, port: int) -> ServerConfig:
    """What a worker serves: the reserved port, and its metrics (if any) on a private loopback port."""
    return config.model_copy(
        update={"port": port}
        | ({"metrics_port": 0, "metrics_host": "127.0.0.1"} if config.metrics_port is not None else {})
    )


class WorkerPool:
    """The worker processes and what each starts with, in the parent's temporary folder: the
    configuration (rewritten when SIGHUP promotes the candidate) and the copies of the model and gate
    files (snapshot_files), so that a worker restarted at any time serves what the others serve."""

    def __init__(self, config: ServerConfig, board: wb.Board, folder: Path) -> None:
        self.board = board
        self.procs: list[subprocess.Popen | None] = [None] * board.workers
        self.config_file = folder / "config.json"
        self.files_file = folder / "files.json"
        self.announce = folder / "announce.json"
        self.restarts = [0]  # read by SummedMetrics
        self._deaths: list[list[float]] = [[] for _ in self.procs]  # monotonic times, within RESTART_WINDOW_S
        self._due: dict[int, float] = {}  # slot -> when its next worker starts
        read_from = snapshot_files(config, folder / "files")
        self.files_file.write_text(json.dumps([[str(p), str(c)] for p, c in read_from.items()]))
        self.config = config
        self._write_config()

    def _write_config(self) -> None:
        # metrics_host only with a port: a given host without one is refused (nothing would serve it)
        no_metrics = {"metrics_host"} if self.config.metrics_port is None else None
        self.config_file.write_text(self.config.model_dump_json(exclude=no_metrics))

    def spawn(self, slot: int) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "dualloop.controller.serve.workers", "--config-json", str(self.config_file)]
        cmd += ["--files", str(self.files_file), "--board", str(self.board.path), "--workers", str(self.board.workers)]
        # the parent's pid and its temporary folder, which the workers remove if the parent dies without doing so
        cmd += ["--slot", str(slot), "--parent-pid", str(os.getpid()), "--parent-tmp", str(self.config_file.parent)]
        cmd += ["--announce", str(self.announce)] if slot == 0 else []
        # The worker starts with SIGHUP blocked and unblocks it once its handler is in place: a
        # promotion sent while it loads is then done, where SIGHUP's default action would kill it.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
        try:
            proc = self.procs[slot] = subprocess.Popen(cmd)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        return proc

    def promote(self) -> None:
        """SIGHUP: every worker promotes the candidate it loaded (`--candidate`), and a worker started
        from now on starts with the candidate as its model and its gates as the gates, so that a
        restart never brings the previous model back beside the promoted one. A file of its own: a
        worker started before, still loading, reads the configuration it was started with (and
        promotes once loaded), never one it would get the promotion's SIGHUP on top of."""
        if self.config.candidate is not None:
            update = {"model": self.config.candidate, "gates": self.config.candidate_gates, "candidate": None}
            self.config = self.config.model_copy(update=update | {"candidate_gates": []})
            self.config_file = self.config_file.with_name("config-promoted.json")
            self._write_config()
            events.event(
                "server.workers_promote", model=str(self.config.model), gates=list(map(str, self.config.gates))
            )
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGHUP)

    def supervise(self, stop: threading.Event, promote: threading.Event, print_line: Callable[[str], object]) -> int:
        """Until `stop`: promote when asked (SIGHUP), restart each worker that exits (at once, or after
        restart_delay when its slot keeps dying); 1 when every slot keeps dying and no worker serves,
        a crash loop of the whole server (0 otherwise). A slot that cannot start a worker leaves the
        others serving."""
        while not stop.wait(0.2):
            if promote.is_set():  # here, not in the signal handler: never between a spawn and its slot
                promote.clear()
                self.promote()
            now = time.monotonic()
            for slot, proc in enumerate(self.procs):
                if proc is not None and proc.poll() is not None:
                    self._ended(slot, proc, now)
                if self.procs[slot] is None and now >= self._due[slot]:
                    self._restart(slot, now)
            recent = [sum(now - t < RESTART_WINDOW_S for t in deaths) for deaths in self._deaths]
            if min(recent) > MAX_RESTARTS and self.board.totals().workers_ready == 0:
                print_line(
                    f"error: every worker process died more than {MAX_RESTARTS} times within "
                    f"{RESTART_WINDOW_S:g} s and none is serving; stopping"
                )
                stop.set()
                return 1
        return 0

    def _restart(self, slot: int, now: float) -> None:
        try:
            pid = self.spawn(slot).pid
        except OSError as err:  # no process to be had (fork's EAGAIN, ENOMEM): try again later
            events.event("server.worker_failed", logging.ERROR, slot=slot, error=f"cannot start a process: {err}")
            self._due[slot] = now + RESTART_BACKOFF_MAX_S
            return
        del self._due[slot]
        self.restarts[0] += 1
        events.event("server.worker_restart", logging.WARNING, slot=slot, pid=pid)

    def _ended(self, slot: int, proc: subprocess.Popen, now: float) -> None:
        events.event("server.worker_exit", logging.ERROR, slot=slot, pid=proc.pid, exit_code=proc.returncode)
        self.board.retire(slot)
        self.procs[slot] = None
        deaths = self._deaths[slot] = [t for t in self._deaths[slot] if now - t < RESTART_WINDOW_S] + [now]
        delay = restart_delay(len(deaths))
        self._due[slot] = now + delay
        if delay:
            events.event(
                "server.worker_restart_delayed",
                logging.WARNING,
                slot=slot,
                delay_s=delay,
                deaths=len(deaths),
                window_s=RESTART_WINDOW_S,
            )

    def stop_all(self, grace_s: float) -> list[int]:
        """SIGTERM to every worker (each drains), then wait; a worker still running after the grace and
        a margin for its stop is killed."""
        alive = [p for p in self.procs if p is not None and p.poll() is None]
        for p in alive:
            p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s + 15.0
        codes = []
        for q in self.procs:
            if q is None:
                continue
            try:
                codes.append(q.wait(max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                q.kill()
                codes.append(q.wait())
        return codes


def _wait_started(
    board: wb.Board, procs: list[subprocess.Popen | None], announce: Path, stop: threading.Event
) -> str | None:
    """Wait until every worker says READY on the board and worker 0 has written its announcement
    (it does so after READY); None, or why the start failed."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while board.totals().workers_ready < len(procs) or not announce.exists():
        dead = [(s, p.returncode) for s, p in enumerate(procs) if p is not None and p.poll() is not None]
        if dead or stop.is_set() or time.monotonic() > deadline:
            return (
                f"worker {dead[0][0]} exited with code {dead[0][1]} while starting (its error is above)"
                if dead
                else "stopped while starting"
                if stop.is_set()
                else f"the workers did not start within {START_TIMEOUT_S:g} s"
            )
        time.sleep(0.05)
    return None


def _workers_folder() -> tempfile.TemporaryDirectory[str]:
    """The parent's temporary folder (the workers' configuration and the copies of their files)."""
    return temporary_folder("dualloop-workers-", "serve --workers", "its workers' configuration")


def _start_line(config: ServerConfig, port: int, workers: int, info: dict) -> str:
    return (
        f"dualloop serving model {info['name']} {info['version']} (schema {info['schema_hash']}) on "
        f"{host_port(config.host, port)} with {workers} worker processes (SO_REUSEPORT), tick "
        f"{config.executor.tick_period_ms} ms, {info['scheduling']}, {gates_summary(config)}, "
        f"{security_summary(config, info['authenticated'])}. Ctrl-C stops."
    )


def serve_workers(config: ServerConfig, workers: int, print_line=print, exit_with_parent: int | None = None) -> int:
    """Run `workers` server processes on config's port until SIGTERM/SIGINT (or, with
    exit_with_parent, until that process is gone); the exit code."""
    reservation, port = reserve_port(config.host, config.port)
    board = wb.Board.create(workers, LATENESS_BUCKETS_US)
    stop, promote = threading.Event(), threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    # SIGHUP promotes the candidate in every worker (each loaded --candidate): WorkerPool.supervise does it
    previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, lambda *_: promote.set())
    if exit_with_parent is not None:
        threading.Thread(target=_stop_when_gone, args=(exit_with_parent, stop), daemon=True).start()
    endpoint: MetricsEndpoint | None = None
    try:
        with _workers_folder() as tmp:
            pool = WorkerPool(_worker_config(config, port), board, Path(tmp))
            for slot in range(workers):
                pool.spawn(slot)
            why = _wait_started(board, pool.procs, pool.announce, stop)
            if why is not None:
                print_line(f"error: {why}")
                pool.stop_all(config.drain_grace_s)
                return 1
            reservation.close()  # every worker is bound: the port cannot be taken from them now
            print_line(_start_line(config, port, workers, json.loads(pool.announce.read_text())))
            if config.metrics_port is not None:
                endpoint = MetricsEndpoint(SummedMetrics(board, pool.restarts))
                mport = endpoint.start(config.metrics_host, config.metrics_port)
                print_line(f"metrics: http://{host_port(config.metrics_host, mport)}/metrics (all workers summed)")
            events.event("server.workers", address=host_port(config.host, port), workers=workers)
            code = pool.supervise(stop, promote, print_line)
            codes = pool.stop_all(config.drain_grace_s)
            t = board.totals()
            uptime_s = (time.monotonic_ns() - t.started_ns) / 1e9
            print_line(
                f"stopped after {uptime_s:.1f} s; since start, {workers} workers: {t.ticks_total} ticks with "
                f"REALTIME sessions open, {t.missed_total} missed deadlines, {t.snapshots_sent_total} snapshots "
                f"sent; {pool.restarts[0]} worker restarts"
            )
            return code or (1 if any(c != 0 for c in codes) else 0)
    finally:
        reservation.close()
        if endpoint is not None:
            endpoint.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        board.close()


async def _run_worker(
    config: ServerConfig, board: wb.Board, slot: int, args: argparse.Namespace, read_from: Mapping[Path, Path]
) -> int:
    """Serve until SIGTERM/SIGINT (or the parent is gone); 0, or 2 when this worker could not start,
    said in one line (server.worker_failed: the parent restarts the slot)."""
    try:
        gone = [str(path) for path, copy in read_from.items() if not copy.is_file()]
        if gone:  # what a cleaner of temporary folders may do to a server that runs for weeks
            raise ConfigError(
                f"the copies of {', '.join(gone)} taken at the server's start are gone from "
                f"{args.files.parent}: keep that folder out of temporary-file cleaning, and restart the server"
            )
        server = ServerLifecycle(config, worker=(board, slot), read_from=read_from)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        loop.add_signal_handler(signal.SIGHUP, server.runtime.promote_on_signal)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})  # blocked by WorkerPool.spawn: see there
        await server.start()
    except (ConfigError, ModelFileError, GateFileError, TLSFileError, PlannerFileError, OSError) as err:
        events.event("server.worker_failed", logging.ERROR, slot=slot, error=as_configured(str(err), read_from))
        return 2
    settle_collector()
    announce: Path | None = args.announce
    if announce is not None:
        card = server.executor.card
        tmp = announce.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "name": card.name,
                    "version": card.version,
                    "schema_hash": card.schema_hash(),
                    "scheduling": server.scheduling,
                    # the parent words the security part as a single process does (security_summary)
                    "authenticated": server.auth.enabled,
                }
            )
        )
        tmp.replace(announce)  # the parent reads it once every worker is ready: never half written
    server.log_start()
    orphaned = asyncio.ensure_future(
        stop_when_parent_gone(
            args.parent_pid, stop, [board.path, board.sessions_folder, *([args.parent_tmp] if args.parent_tmp else [])]
        )
    )
    await stop.wait()
    orphaned.cancel()
    await server.stop()
    return 0


async def stop_when_parent_gone(parent: int, stop: asyncio.Event, leftovers: Sequence[Path] = ()) -> None:
    """A server whose parent died (SIGKILL: no SIGTERM forwarded) drains and exits instead of serving
    on unsupervised: a worker of `serve --workers`, or a server a command started for itself
    (`serve --exit-with-parent`). A worker also removes what the parent would have removed
    (`leftovers`): the board's file (the others still have it mapped) and the parent's temporary
    folder (the configuration, read by every worker at its start; with the parent gone no worker is
    started again). Every worker does it, so the last to notice finds nothing left. The parent's pid
    comes from the parent (os.getppid() read here would already be init's if the parent died while
    this process was starting)."""
    while os.getppid() == parent:
        await asyncio.sleep(0.5)
    events.event("server.parent_gone", logging.WARNING, parent_pid=parent)
    for path in leftovers:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    stop.set()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dualloop.controller.serve.workers")
    parser.add_argument("--config-json", type=Path, required=True)
    parser.add_argument("--files", type=Path, help="[[configured path, its copy], ...] (snapshot_files)")
    parser.add_argument("--board", type=Path, required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--slot", type=int, required=True)
    parser.add_argument("--announce", type=Path)
    parser.add_argument("--parent-pid", type=int, default=os.getppid())
    parser.add_argument("--parent-tmp", type=Path, help="the parent's temporary folder: removed if the parent dies")
    args = parser.parse_args(argv)
    try:
        text = args.config_json.read_text()
        read_from = {Path(p): Path(c) for p, c in json.loads(args.files.read_text())} if args.files else {}
    except OSError as err:  # the parent's folder gone: nothing to start from (no logging configured yet)
        print(f"error: worker {args.slot}: cannot read what its parent gave it: {err}", file=sys.stderr)
        return 2
    raw = json.loads(text)  # the parent's log settings first: a refused configuration is logged as they say
    events.configure_logging(raw.get("log_level", "INFO"), raw.get("log_format", "human"))
    try:  # validated again, and its checks of the disk with it (a record_dir that has become a file)
        config = ServerConfig.model_validate_json(text)
    except ValidationError as err:
        problems = "; ".join(problem_text(e) for e in err.errors())
        events.event("server.worker_failed", logging.ERROR, slot=args.slot, error=problems)
        return 2
    board = wb.Board.attach(args.board, args.workers, LATENESS_BUCKETS_US)
    loop = new_event_loop()
    try:
        return loop.run_until_complete(_run_worker(config, board, args.slot, args, read_from))
    finally:
        loop.close()


if __name__ == "__main__":
    sys.exit(main())
