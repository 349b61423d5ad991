"""Replay many logs at once: a process pool by default (one log per task, each on its own core),
or an existing Ray cluster when asked (`pip install 'dualloop[ray]'`, `--ray`). Workers return
plain report dicts; the parent aggregates them, with progress either way.

A pool worker loads the model and its gates once, in its initializer, and replays every log it is
given with them (loading them took longer than replaying a minute of drive); a Ray worker keeps
them after its first task. Only the Executor (the sessions' state) is new per log.

This module imports neither numpy nor the executor at its top: the command line starts the pool
first, and imports them while the workers start (`replay_many`'s while_waiting)."""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import signal
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import numpy as np

    from dualloop.controller.logs.logfile import LogData
    from dualloop.controller.replay.lockstep import LoadedModel, Recording

# what a worker imports: the fork server imports them once, before it forks the workers
_WORKER_MODULES = ["dualloop.controller.replay.lockstep", "threadpoolctl"]

RAY_MISSING = "--ray needs Ray, which is an optional extra: pip install 'dualloop[ray]'"


FLEET_SCHEMA = "dualloop.fleet/1"


def log_stem(path: str | Path) -> str:
    """A log's name without `.mcap`, and nothing else cut: `Path.stem` cut a recording's base name given
    without `.mcap` at its last dot (`dualloop-20261207-030754.000123-77-a1b2c3` became
    `dualloop-20261207-030754`), so recordings of one second replayed onto one another's files."""
    name = Path(path).name
    return name[: -len(".mcap")] if name.lower().endswith(".mcap") else name


class LogRefused(Exception):
    """A log the worker refused for what the file holds (empty, not a log, cut short, several
    sessions): its message names the file and what to do, as the single-log replay says it."""


@dataclass(frozen=True)
class FleetOptions:
    """How each log is replayed: the one-log command's flags, for every log of the fleet."""

    sessions: tuple[str, ...] = ()  # --session: only these sessions of each log (default: every one)
    # a recording's sessions each replayed, as one-log replay does (reports keyed "LOG session 'ID'");
    # False: such a log is refused, as replay_log refuses it (callers that key reports by log path)
    several_sessions: bool = False
    allow_truncated: bool = False  # the complete part of a cut log, not a refusal
    plots: bool = False  # --foxglove: the plot topic in each new log


@dataclass
class Outcome:
    """One session's replay in a worker: its report, or why it was not replayed."""

    key: str  # the log's path; "LOG session 'ID'" for a session of several
    report: dict | None
    error: str
    seconds: float
    cpu_seconds: float
    # the new log as written, and its name once the parent has the report (_publish): a fleet stopped
    # before then leaves neither, and the logs it says finished are the new logs there are
    partial: str = ""
    out: str = ""


@dataclass
class FleetResult:
    reports: dict[str, dict] = field(default_factory=dict)  # log path -> ReplayReport.as_dict()
    errors: dict[str, str] = field(default_factory=dict)  # log path -> why it failed
    order: list[str] = field(default_factory=list)  # the logs as given
    seconds: dict[str, float] = field(default_factory=dict)  # log path -> the worker's wall time on it
    # log path -> the worker's CPU time on it: on a busy machine, what the log cost without the waits
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0  # the whole fleet, pool start-up (model loads) included
    workers: int = 0
    # the logs whose replay ended (replayed or failed): what an interrupted fleet got through
    finished: list[str] = field(default_factory=list)
    keys: dict[str, list[str]] = field(default_factory=dict)  # log path -> its rows' keys, sessions of several

    @property
    def drive_s(self) -> float:
        return sum(r["drive_s"] for r in self.reports.values())

    @property
    def speedup(self) -> float:
        """Drive time over the fleet's wall time: the aggregate x real time."""
        return self.drive_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def ticks(self) -> int:
        return sum(r["ticks"] for r in self.reports.values())

    @property
    def gate_veto_fraction(self) -> float:
        return sum(r["gate_veto_ticks"] for r in self.reports.values()) / self.ticks if self.ticks else 0.0

    def confusion(self) -> np.ndarray | None:
        """Actual x applied over every log that has actual actions."""
        import numpy as np

        mats = [np.array(r["agreement"]["confusion"]) for r in self.reports.values() if r["agreement"].get("confusion")]
        return cast(np.ndarray, sum(mats)) if mats else None  # not sum()'s start, 0: mats is not empty

    @property
    def agreement_top1(self) -> float:
        import numpy as np

        m = self.confusion()
        return float(np.trace(m) / m.sum()) if m is not None and m.sum() else float("nan")

    def per_log(self) -> list[dict[str, Any]]:
        """One row per log, in the order given: what the per-log table prints."""
        rows: list[dict[str, Any]] = []
        for path in self.order:
            r = self.reports.get(path)
            if r is None:
                rows.append({"log": path, "error": self.errors.get(path, "not replayed")})
                continue
            compute = r["timings"].get("compute_s", 0.0)
            seconds = self.seconds.get(path, 0.0)
            rows.append(
                {
                    "log": path,
                    "drive_s": r["drive_s"],
                    "observations": r["observations"],
                    "ticks": r["ticks"],
                    "compute_s": compute,
                    "seconds": seconds,  # read, replay, write, report: the worker's whole time on it
                    "cpu_s": self.cpu_seconds.get(path, 0.0),
                    "compute_speedup": r["drive_s"] / compute if compute > 0 else 0.0,
                    "speedup": r["drive_s"] / seconds if seconds > 0 else 0.0,
                    "agreement_top1": _finite(r["agreement_top1"]),
                    "gate_veto_ticks": r["gate_veto_ticks"],
                    "gate_veto_fraction": r["gate_veto_fraction"],
                    "input_warning": r.get("input_warning", ""),
                }
            )
        return rows

    def pooled(self) -> dict[str, Any]:
        """Sums over the replayed logs (agreement from the pooled confusion: over ticks)."""
        import numpy as np

        seconds = [self.seconds[p] for p in self.order if p in self.reports and p in self.seconds]
        compute = sum(r["timings"].get("compute_s", 0.0) for r in self.reports.values())
        return {
            "logs": len(self.reports),
            "failed": len(self.errors),
            "drive_s": self.drive_s,
            "observations": sum(r["observations"] for r in self.reports.values()),
            "ticks": self.ticks,
            "compute_s": compute,
            "worker_s": sum(seconds),
            "worker_cpu_s": sum(self.cpu_seconds.get(p, 0.0) for p in self.order if p in self.reports),
            "wall_s": self.wall_s,
            "workers": self.workers,
            "speedup": self.speedup,
            "compute_speedup": self.drive_s / compute if compute > 0 else 0.0,
            "seconds_per_log": {
                "median": float(np.median(seconds)) if seconds else None,
                "p99": float(np.percentile(seconds, 99)) if seconds else None,
                "max": max(seconds) if seconds else None,
            },
            "agreement_top1": _finite(self.agreement_top1),
            "gate_veto_ticks": sum(r["gate_veto_ticks"] for r in self.reports.values()),
            "gate_veto_fraction": self.gate_veto_fraction,
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema": FLEET_SCHEMA,
            "logs": self.per_log(),
            "pooled": self.pooled(),
            "errors": dict(self.errors),
        }


def _finite(x: float) -> float | None:
    import numpy as np

    return float(x) if x is not None and np.isfinite(x) else None


# The worker's model and gates, loaded once (the pool's initializer, or a Ray worker's first task).
_LOADED: dict[tuple[str, tuple[str, ...]], LoadedModel] = {}


def _load(model: str, gates: list[str]) -> LoadedModel:
    from dualloop.controller.replay.lockstep import LoadedModel

    key = (model, tuple(gates))
    loaded = _LOADED.get(key)
    if loaded is None:
        loaded = _LOADED[key] = LoadedModel.load(model, gates)
    return loaded


def _init_worker(model: str, gates: list[str]) -> None:
    from threadpoolctl import threadpool_limits

    # Ctrl-C reaches the whole process group: the parent stops the fleet (and ends its workers), a
    # worker's own KeyboardInterrupt would only come back as a log's error
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # one log per core: BLAS threads would only fight the other workers
    threadpool_limits(1)
    _keep_freed_memory()
    _load(model, gates)


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def _keep_freed_memory() -> None:
    """glibc maps each large array afresh and hands it back when freed: a replay's ~6,000-7,500 page
    faults per 60 s log, about 10% of its CPU. A worker replays log after log of the same shapes, so
    it keeps what it frees for the next log (arrays below 32 MiB from the heap, the heap trimmed only
    past 512 MiB); the memory goes back when the worker exits. Not glibc: nothing to do."""
    import ctypes

    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, 32 << 20)
    mallopt(_M_TRIM_THRESHOLD, 512 << 20)


def output_paths(paths: Sequence[str | Path], out_dir: str | Path) -> list[Path]:
    """Each log's new log: `OUT/<name>.replayed.mcap`, as ever for logs of distinct names. Logs of one
    name (day1/drive.mcap, day2/drive.mcap) would each replace the other's: theirs go in sub-folders,
    the shortest end of their folders' paths that tells them apart (OUT/day1/drive.replayed.mcap).
    The same file given twice, or names nothing tells apart, are refused (LogFileError: exit 2)."""
    from dualloop.controller.logs.logfile import LogFileError

    out_dir = Path(out_dir)
    # named as given (a symlink's name, not its target's); the folders from the absolute path
    absolute = [Path(os.path.abspath(p)) for p in paths]
    outs = [out_dir / f"{log_stem(a)}.replayed.mcap" for a in absolute]
    by_stem: dict[str, list[int]] = {}
    for i, a in enumerate(absolute):
        by_stem.setdefault(log_stem(a), []).append(i)
    for members in by_stem.values():
        folders = [absolute[i].parent.parts[1:] for i in members]  # without the root: a relative path
        if len(members) < 2 or len(set(folders)) < len(folders):
            continue  # one log, or the same folder twice: refused below, naming both
        depth = next(k for k in range(1, max(map(len, folders)) + 1) if len({f[-k:] for f in folders}) == len(folders))
        for i, folder in zip(members, folders):
            outs[i] = out_dir.joinpath(*folder[-depth:], outs[i].name)
    first: dict[Path, int] = {}
    for i, out in enumerate(outs):
        j = first.setdefault(out, i)
        if j != i:
            same = Path(paths[i]).resolve() == Path(paths[j]).resolve()
            raise LogFileError(
                f"{paths[i]}: the same log as {paths[j]}: give it once"
                if same
                else f"{paths[i]} and {paths[j]} would both be replayed into {out}: rename one"
            )
    return outs


def _replay_one(
    log: str, model: str, gates: list[str], out: str | None, options: FleetOptions, token: str, publish: bool = False
) -> list[Outcome]:
    """Every session of one log (the --session ones), as one-log replay replays them: a log of
    several into OUT's folder, `<name>.<NNN>.<id>.replayed.mcap` each. publish: the new logs
    renamed here (Ray); otherwise the parent renames them when it takes the outcome."""
    from threadpoolctl import threadpool_limits

    from dualloop.controller.logs.logfile import LogFileError, check_sessions
    from dualloop.controller.replay.lockstep import read_recording_positions, session_file_name

    started = (time.perf_counter(), time.process_time())
    source = Path(log)
    with threadpool_limits(1):
        try:
            recording, positions = read_recording_positions(source, options.sessions)
            check_sessions(source, recording.sessions, options.allow_truncated, "replay")
        except LogFileError as err:
            raise LogRefused(str(err)) from None
        sessions = recording.sessions
        several = len(sessions) > 1
        if several and not options.several_sessions:
            names = ", ".join(d.name for d in sessions)
            raise LogRefused(f"{log}: {len(sessions)} sessions ({names}); name one")
        outcomes = []
        for index, data in zip(positions, sessions):
            if several and not data.observations:  # opened, then cut before its first observation: as one-log
                continue
            new = None if out is None else Path(out)
            if new is not None and several:
                new = new.with_name(session_file_name(log_stem(source), index, data.name))
            key = f"{log} session {data.name!r}" if several else log
            outcomes.append(_replay_session(key, data, source, model, gates, new, options, token, recording, started))
            started = (time.perf_counter(), time.process_time())
    if publish:
        _publish(outcomes)
    return outcomes


def _publish(outcomes: list[Outcome]) -> None:
    for o in outcomes:
        if o.partial:
            os.replace(o.partial, o.out)
            o.partial = ""


def _replay_session(
    key: str,
    data: LogData,
    source: Path,
    model: str,
    gates: list[str],
    out: Path | None,
    options: FleetOptions,
    token: str,
    recording: Recording,
    started: tuple[float, float],
) -> Outcome:
    """One session into `out`, under a partial name until its outcome is taken (_publish): a fleet
    stopped mid-way leaves no file that looks like a finished replay (the parent removes them)."""
    from dualloop.controller.replay.lockstep import ReplayOptions, replay_data
    from dualloop.executor.sessions import InvalidObservation

    partial = None if out is None else out.with_name(f".{out.name}.{token}.partial")
    if partial is not None:
        partial.parent.mkdir(parents=True, exist_ok=True)
    try:
        result = replay_data(
            data,
            source,
            model,
            gates,
            partial,
            ReplayOptions(plots=options.plots),
            loaded=_load(model, gates),
            column_log=recording.column_log,
            started=started[0],
        )
    except BaseException as err:
        if partial is not None:
            partial.unlink(missing_ok=True)
        if not isinstance(err, InvalidObservation):
            raise
        # a session the server would have refused: the others still replay
        return Outcome(key, None, f"{source}: session {data.name!r} not replayed: {err}", 0.0, 0.0)
    if key != str(source):  # the report and the evaluation name the session (each was the log's path)
        result.report.source = key
        if "source" in result.report.evaluation:
            result.report.evaluation["source"] = key
    report = result.report.as_dict()
    seconds, cpu = time.perf_counter() - started[0], time.process_time() - started[1]
    return Outcome(key, report, "", seconds, cpu, str(partial or ""), str(out or ""))


def replay_many(
    paths: Sequence[str | Path],
    model: str | Path,
    gates: Sequence[str | Path] = (),
    workers: int | None = None,
    use_ray: bool = False,
    out_dir: str | Path | None = None,
    progress: bool = True,
    while_waiting: Callable[[], object] | None = None,
    options: FleetOptions = FleetOptions(),
    into: FleetResult | None = None,
) -> FleetResult:
    """Every log replayed with the model and gates; out_dir: where the new logs go (`output_paths`).
    while_waiting: run here while the workers start, before the results are collected (the command
    line's own imports, while the workers import theirs). into: filled as logs finish, so that a
    caller interrupted (KeyboardInterrupt, the pool stopped at once) knows how far it got."""
    logs = [str(p) for p in paths]
    outs: list[str | None] = [str(p) for p in output_paths(paths, out_dir)] if out_dir else [None] * len(logs)
    result = into if into is not None else FleetResult()
    result.order = list(logs)
    t0 = time.perf_counter()
    jobs = list(zip(logs, outs))
    if use_ray:
        _with_ray(jobs, str(model), [str(g) for g in gates], options, result, progress, while_waiting)
    else:
        _with_pool(jobs, str(model), [str(g) for g in gates], options, result, workers, progress, while_waiting)
    result.order = [k for log in logs for k in result.keys.get(log, [log])]
    result.wall_s = time.perf_counter() - t0
    return result


def pool_size(requested: int | None, logs: int) -> int:
    """Worker processes for `logs` logs: the request (default: the cores), never more than the logs or
    the cores. A replay is CPU-bound: more processes than cores only share them, each holding a model
    (`--workers 100000` started one process per log)."""
    cores = os.cpu_count() or 1
    return max(1, min(requested or cores, cores, logs))


def workers_warning(requested: int | None) -> str | None:
    """What to tell a user whose `--workers` asks for more processes than the cores (None: nothing)."""
    cores = os.cpu_count() or 1
    if requested is None or requested <= cores:
        return None
    return f"--workers {requested}: a replay is CPU-bound and this machine has {cores} cores; using {cores}"


def _with_pool(
    jobs: list[tuple[str, str | None]],
    model: str,
    gates: list[str],
    options: FleetOptions,
    result: FleetResult,
    workers: int | None,
    progress: bool,
    while_waiting: Callable[[], object] | None,
) -> None:
    result.workers = workers = pool_size(workers, len(jobs))
    context = _pool_context()
    _start_fork_server(context)
    if while_waiting is not None:
        while_waiting()
    token = uuid.uuid4().hex[:12]  # this run's partial files, and only them, are removed when it is stopped
    before = multiprocessing.active_children()  # the pool's workers are the children it adds
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker, initargs=(model, gates))
    try:
        futures = {pool.submit(_replay_one, log, model, gates, out, options, token): log for log, out in jobs}
        _collect(futures, result, progress)
    except BaseException:
        # Ctrl-C, SIGTERM (cli.Terminated) or a bug: leaving `with ProcessPoolExecutor` waited for
        # every queued log (31 s for 168 logs in QA); stop the workers now, drop their partial files
        _stop_pool(pool, [child for child in multiprocessing.active_children() if child not in before])
        _remove_partials({Path(out).parent for _, out in jobs if out is not None}, token)
        raise
    pool.shutdown()


def _stop_pool(pool: ProcessPoolExecutor, processes: list[multiprocessing.process.BaseProcess]) -> None:
    """The queued logs cancelled and the workers (`processes`) ended, a replay mid-way included (its file
    is a partial one). ProcessPoolExecutor has no way to end its workers before Python 3.14: they are
    the children this process gained with the pool."""
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(5.0)
        if process.is_alive():
            process.kill()
            process.join(5.0)


def _remove_partials(folders: set[Path], token: str) -> None:
    for folder in folders:
        for partial in folder.glob(f".*.{token}.partial"):
            partial.unlink(missing_ok=True)


def _start_fork_server(context: multiprocessing.context.BaseContext) -> None:
    """The fork server started now, not at the pool's first task: that task waits for the server's
    imports (~0.5 s CPU), which then run while this process does its own (while_waiting)."""
    if context.get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


def _pool_context() -> multiprocessing.context.BaseContext:
    """Never a fork of this process (it may hold onnxruntime threads or a gRPC server). A fork
    server where there is one: a fresh process that imports the workers' modules once (not the
    command line's __main__) and forks each worker from there, so no worker pays the ~0.5 s CPU of
    importing numpy, onnxruntime, pydantic and the executor again; elsewhere spawn."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    # taken when the server starts (the first pool of this process); later pools reuse it
    context.set_forkserver_preload([__name__, *_WORKER_MODULES])
    return context


def _collect(futures: dict, result: FleetResult, progress: bool) -> None:
    def advance() -> None:
        return None

    bar = None
    # rich is an extra (not in the lean install): without it, no bar
    if progress and importlib.util.find_spec("rich") is not None:
        from rich.progress import Progress

        bar = Progress(transient=True)
        task = bar.add_task("replaying logs", total=len(futures))
        advance = lambda: bar.advance(task)  # noqa: E731
        bar.start()
    try:
        for future in as_completed(futures):
            path = futures[future]
            try:
                outcomes = future.result()
            except Exception as err:  # noqa: BLE001 - one bad log must not sink the fleet
                # a refused log is said as the single-log commands say it; anything else is named as a bug
                result.errors[path] = str(err) if isinstance(err, LogRefused) else f"{type(err).__name__}: {err}"
                outcomes = []
            _publish(outcomes)
            for o in outcomes:
                if o.report is None:
                    result.errors[o.key] = o.error
                else:
                    result.reports[o.key], result.seconds[o.key], result.cpu_seconds[o.key] = (
                        o.report,
                        o.seconds,
                        o.cpu_seconds,
                    )
            result.keys[path] = [o.key for o in outcomes] or [path]
            result.finished.append(path)
            advance()
    finally:
        if bar is not None:
            bar.stop()


def _with_ray(
    jobs: list[tuple[str, str | None]],
    model: str,
    gates: list[str],
    options: FleetOptions,
    result: FleetResult,
    progress: bool,
    while_waiting: Callable[[], object] | None,
) -> None:
    """One Ray task per log on an existing cluster (RAY_ADDRESS, or the one `ray start` left on this
    machine). dualloop does not start a cluster itself: Ray's services listen on the network, and
    nothing of ours binds beyond loopback unless the user chose it."""
    try:
        import ray
    except ImportError:
        raise RuntimeError(RAY_MISSING) from None
    if not ray.is_initialized():
        try:
            ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), log_to_driver=False)
        except ConnectionError as err:
            raise RuntimeError(
                f"--ray found no Ray cluster ({err}). Start one with `ray start --head` (its services "
                "listen on the network: see Ray's security notes) or set RAY_ADDRESS; without "
                "--ray, the logs are replayed by a local process pool."
            ) from None
    # Any: Ray's stubs type remote functions of up to 6 arguments
    remote: Any = ray.remote(num_cpus=1)(_replay_one)
    token = uuid.uuid4().hex[:12]
    futures = {remote.remote(log, model, gates, out, options, token, True).future(): log for log, out in jobs}
    if while_waiting is not None:
        while_waiting()
    _collect(futures, result, progress)


def format_fleet(result: FleetResult) -> str:
    """The per-log table (in the order given) and the pooled row."""
    header = (
        f"{'log':36s} {'drive s':>8s} {'ticks':>7s} {'replay ms':>9s} {'x rt':>6s} {'log ms':>8s} {'x rt':>6s} "
        f"{'agree':>6s} {'veto':>6s}"
    )
    lines = [header, "-" * len(header)]
    stems = [log_stem(p) for p in result.order]
    for row, stem in zip(result.per_log(), stems):
        name = stem if stems.count(stem) == 1 else row["log"]
        name = name if len(name) <= 36 else "…" + name[-35:]  # the end tells logs of one folder apart
        if "error" in row:
            lines.append(f"{name:36s} failed: {row['error']}")
            continue
        agree = row["agreement_top1"]
        lines.append(
            f"{name:36s} {row['drive_s']:8.1f} {row['ticks']:7d} {row['compute_s'] * 1e3:9.1f} "
            f"{row['compute_speedup']:5.0f}x {row['seconds'] * 1e3:8.1f} {row['speedup']:5.0f}x "
            f"{'n/a' if agree is None else f'{100 * agree:5.1f}%':>6s} {100 * row['gate_veto_fraction']:5.1f}%"
        )
        if row["input_warning"]:  # its decisions are not the recording's, whatever its agreement says
            lines.append(f"{'':36s} warning: {row['input_warning']}")
    p = result.pooled()
    lines.append("-" * len(header))
    agree = p["agreement_top1"]
    per_log = p["seconds_per_log"]
    pooled_name = f"pooled ({p['logs']} log{'' if p['logs'] == 1 else 's'}, {p['failed']} failed)"
    lines.append(
        f"{pooled_name:36s} {p['drive_s']:8.1f} "
        f"{p['ticks']:7d} {p['compute_s'] * 1e3:9.1f} {p['compute_speedup']:5.0f}x {p['worker_s'] * 1e3:8.1f} "
        f"{'':6s} {'n/a' if agree is None else f'{100 * agree:5.1f}%':>6s} {100 * p['gate_veto_fraction']:5.1f}%"
    )
    if per_log["median"] is not None:
        speed = p["speedup"]
        workers = f"{p['workers']} worker{'' if p['workers'] == 1 else 's'}"
        lines.append(
            f"{workers}, {p['wall_s']:.2f} s wall (model loads included): "
            f"{f'{speed:.0f}' if speed >= 10 else f'{speed:.2g}'}x real time in aggregate; "
            f"per log {per_log['median'] * 1e3:.0f} ms median, {per_log['p99'] * 1e3:.0f} ms p99"
        )
    return "\n".join(lines)
