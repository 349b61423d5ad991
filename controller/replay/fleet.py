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
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import numpy as np

    from dualloop.controller.replay.lockstep import LoadedModel

# what a worker imports: the fork server imports them once, before it forks the workers
_WORKER_MODULES = ["dualloop.controller.replay.lockstep", "threadpoolctl"]

RAY_MISSING = "--ray needs Ray, which is an optional extra: pip install 'dualloop[ray]'"


FLEET_SCHEMA = "dualloop.fleet/1"


class LogRefused(Exception):
    """A log the worker refused for what the file holds (empty, not a log, cut short, several
    sessions): its message names the file and what to do, as the single-log replay says it."""


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


def _replay_one(log: str, model: str, gates: list[str], out_dir: str | None) -> tuple[dict, float, float]:
    from threadpoolctl import threadpool_limits

    from dualloop.controller.logs.logfile import LogFileError
    from dualloop.controller.replay.lockstep import replay_log

    t0, cpu0 = time.perf_counter(), time.process_time()
    out = str(Path(out_dir) / f"{Path(log).stem}.replayed.mcap") if out_dir else None
    with threadpool_limits(1):
        try:
            report = replay_log(log, model, gates, out_path=out, loaded=_load(model, gates)).report.as_dict()
        except LogFileError as err:
            raise LogRefused(str(err)) from None
    return report, time.perf_counter() - t0, time.process_time() - cpu0


def replay_many(
    paths: Sequence[str | Path],
    model: str | Path,
    gates: Sequence[str | Path] = (),
    workers: int | None = None,
    use_ray: bool = False,
    out_dir: str | Path | None = None,
    progress: bool = True,
    while_waiting: Callable[[], object] | None = None,
) -> FleetResult:
    """Every log replayed with the model and gates; out_dir: where the new logs go (named after
    each log's stem: give logs distinct names). while_waiting: run here while the workers start,
    before the results are collected (the command line's own imports, while the workers import
    theirs)."""
    args = ([str(p) for p in paths], str(model), [str(g) for g in gates], str(out_dir) if out_dir else None)
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if use_ray:
        result = _with_ray(*args, progress=progress, while_waiting=while_waiting)
    else:
        result = _with_pool(*args, workers=workers, progress=progress, while_waiting=while_waiting)
    result.order = list(args[0])
    result.wall_s = time.perf_counter() - t0
    return result


def _with_pool(
    paths: list[str],
    model: str,
    gates: list[str],
    out_dir: str | None,
    workers: int | None,
    progress: bool,
    while_waiting: Callable[[], object] | None,
) -> FleetResult:
    workers = max(1, min(workers or os.cpu_count() or 1, len(paths)))
    result = FleetResult(workers=workers)
    context = _pool_context()
    _start_fork_server(context)
    if while_waiting is not None:
        while_waiting()
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker, initargs=(model, gates)) as pool:
        futures = {pool.submit(_replay_one, p, model, gates, out_dir): p for p in paths}
        _collect(futures, result, progress)
    return result


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
                result.reports[path], result.seconds[path], result.cpu_seconds[path] = future.result()
            except Exception as err:  # noqa: BLE001 - one bad log must not sink the fleet
                # a refused log is said as the single-log commands say it; anything else is named as a bug
                result.errors[path] = str(err) if isinstance(err, LogRefused) else f"{type(err).__name__}: {err}"
            advance()
    finally:
        if bar is not None:
            bar.stop()


def _with_ray(
    paths: list[str],
    model: str,
    gates: list[str],
    out_dir: str | None,
    progress: bool,
    while_waiting: Callable[[], object] | None,
) -> FleetResult:
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
    remote = ray.remote(num_cpus=1)(_replay_one)
    futures = {remote.remote(p, model, gates, out_dir).future(): p for p in paths}
    if while_waiting is not None:
        while_waiting()
    result = FleetResult()
    _collect(futures, result, progress)
    return result


def format_fleet(result: FleetResult) -> str:
    """The per-log table (in the order given) and the pooled row."""
    header = (
        f"{'log':36s} {'drive s':>8s} {'ticks':>7s} {'replay ms':>9s} {'x rt':>6s} {'log ms':>8s} {'x rt':>6s} "
        f"{'agree':>6s} {'veto':>6s}"
    )
    lines = [header, "-" * len(header)]
    stems = [Path(p).stem for p in result.order]
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
    p = result.pooled()
    lines.append("-" * len(header))
    agree = p["agreement_top1"]
    per_log = p["seconds_per_log"]
    lines.append(
        f"{'pooled (' + str(p['logs']) + ' logs, ' + str(p['failed']) + ' failed)':36s} {p['drive_s']:8.1f} "
        f"{p['ticks']:7d} {p['compute_s'] * 1e3:9.1f} {p['compute_speedup']:5.0f}x {p['worker_s'] * 1e3:8.1f} "
        f"{'':6s} {'n/a' if agree is None else f'{100 * agree:5.1f}%':>6s} {100 * p['gate_veto_fraction']:5.1f}%"
    )
    if per_log["median"] is not None:
        lines.append(
            f"{p['workers']} workers, {p['wall_s']:.2f} s wall (model loads included): {p['speedup']:.0f}x real time "
            f"in aggregate; per log {per_log['median'] * 1e3:.0f} ms median, {per_log['p99'] * 1e3:.0f} ms p99"
        )
    return "\n".join(lines)
