"""Replay many logs at once: a process pool by default (one log per task, each on its own core),
or an existing Ray cluster when asked (`pip install 'dualloop[ray]'`, `--ray`). Workers return
plain report dicts; the parent aggregates them, with progress either way."""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np

from dualloop.controller.replay.lockstep import replay_log

RAY_MISSING = "--ray needs Ray, which is an optional extra: pip install 'dualloop[ray]'"


@dataclass
class FleetResult:
    reports: dict[str, dict] = field(default_factory=dict)  # log path -> ReplayReport.as_dict()
    errors: dict[str, str] = field(default_factory=dict)  # log path -> why it failed

    @property
    def ticks(self) -> int:
        return sum(r["ticks"] for r in self.reports.values())

    @property
    def gate_veto_fraction(self) -> float:
        return sum(r["gate_veto_ticks"] for r in self.reports.values()) / self.ticks if self.ticks else 0.0

    def confusion(self) -> np.ndarray | None:
        """Actual x applied over every log that has actual actions."""
        mats = [np.array(r["agreement"]["confusion"]) for r in self.reports.values() if r["agreement"].get("confusion")]
        return cast(np.ndarray, sum(mats)) if mats else None  # not sum()'s start, 0: mats is not empty

    @property
    def agreement_top1(self) -> float:
        m = self.confusion()
        return float(np.trace(m) / m.sum()) if m is not None and m.sum() else float("nan")


def _replay_one(log: str, model: str, gates: list[str], out_dir: str | None) -> dict:
    from threadpoolctl import threadpool_limits

    out = str(Path(out_dir) / f"{Path(log).stem}.replay.mcap") if out_dir else None
    with threadpool_limits(1):  # one log per core: BLAS threads would only fight the other workers
        return replay_log(log, model, gates, out_path=out).report.as_dict()


def replay_many(
    paths: Sequence[str | Path],
    model: str | Path,
    gates: Sequence[str | Path] = (),
    workers: int | None = None,
    use_ray: bool = False,
    out_dir: str | Path | None = None,
    progress: bool = True,
) -> FleetResult:
    args = ([str(p) for p in paths], str(model), [str(g) for g in gates], str(out_dir) if out_dir else None)
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
    if use_ray:
        return _with_ray(*args, progress=progress)
    return _with_pool(*args, workers=workers, progress=progress)


def _with_pool(
    paths: list[str], model: str, gates: list[str], out_dir: str | None, workers: int | None, progress: bool
) -> FleetResult:
    result = FleetResult()
    workers = max(1, min(workers or os.cpu_count() or 1, len(paths)))
    # spawn: no fork of a process that may hold onnxruntime threads or a gRPC server
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_replay_one, p, model, gates, out_dir): p for p in paths}
        _collect(futures, result, progress)
    return result


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
                result.reports[path] = future.result()
            except Exception as err:  # noqa: BLE001 - one bad log must not sink the fleet
                result.errors[path] = f"{type(err).__name__}: {err}"
            advance()
    finally:
        if bar is not None:
            bar.stop()


def _with_ray(paths: list[str], model: str, gates: list[str], out_dir: str | None, progress: bool) -> FleetResult:
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
    result = FleetResult()
    _collect(futures, result, progress)
    return result
