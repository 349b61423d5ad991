"""`dualloop bench planner --compare-pure`: CPU per BehaviourPlanner.plan_many batch on the compiled
rollout (planner._rollout) and on numpy's, interleaved in one process.

time.thread_time_ns around each call; median and p99 per batch size. Half the sessions of a batch
have features from simulated drives (the expert driving dense_traffic, cut_in, slow_merge,
stopped_vehicle_ahead and lead_brakes_hard, every 200 ms), half random ones (every feature N(0, 1),
the ego at 25 m/s). Every batch is planned once by each path, in alternating order, and the plans
must be equal: a difference stops the bench.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import track
from rich.table import Table

from dualloop.controller.bench.harness import store_result
from dualloop.planner import compiled as planner_compiled
from dualloop.planner.behaviour import BehaviourPlanner
from dualloop.planner.plan import PlanRequest
from dualloop.sim.env import run_expert_batch
from dualloop.sim.schema import FEATURE_INDEX, N_FEATURES

SCENARIOS = ("dense_traffic", "cut_in", "slow_merge", "stopped_vehicle_ahead", "lead_brakes_hard")


def simulated_features(seeds: Sequence[int] = (1, 2)) -> np.ndarray:
    feats = []
    for name in SCENARIOS:
        _, data = run_expert_batch(name, list(seeds), every=40)
        feats.append(data.features[data.valid])
    return np.concatenate(feats)


def bench_features(rng: np.random.Generator) -> np.ndarray:
    """The bench's random features: every feature N(0, 1), the ego at 25 m/s (float32)."""
    x = rng.normal(0.0, 1.0, N_FEATURES)
    x[FEATURE_INDEX["ego_speed"]] = 25.0
    return x.astype(np.float32)


def make_batches(size: int, count: int, simulated: np.ndarray, seed: int) -> list[list[PlanRequest]]:
    rng = np.random.default_rng(seed)
    out = []
    for k in range(count):
        requests = []
        for i in range(size):
            x = bench_features(rng) if (i + k) % 2 else simulated[rng.integers(len(simulated))]
            requests.append(PlanRequest(f"s{i}", np.asarray(x, np.float32), k * 200_000_000))
        out.append(requests)
    return out


def planner_pair() -> tuple[BehaviourPlanner, BehaviourPlanner]:
    """(compiled, numpy) behaviour planners, whatever path new planners take by default."""
    if not planner_compiled.available():
        raise RuntimeError("planner._rollout is not built (no C compiler at install time): nothing to compare")
    before = planner_compiled.use_compiled(True)
    try:
        fast = BehaviourPlanner()
        planner_compiled.use_compiled(False)
        reference = BehaviourPlanner()
    finally:
        planner_compiled.use_compiled(before)
    return fast, reference


def compare_paths(
    sizes: Sequence[int] = (32, 1),
    batches: int = 600,
    warmup: int = 20,
    console: Console | None = None,
    seeds: Sequence[int] = (1, 2),
) -> dict[str, Any]:
    """{"batch_<size>": {"compiled": {...}, "numpy": {...}, "ratio_p50", "ratio_p99"}}; CPU in us."""
    fast, reference = planner_pair()
    simulated = simulated_features(seeds)
    result: dict[str, Any] = {}
    for size in sizes:
        work = make_batches(size, batches + warmup, simulated, seed=size)
        cpu: dict[str, list[int]] = {"compiled": [], "numpy": []}
        for k, requests in enumerate(
            track(work, description=f"batches of {size}", console=console, disable=console is None)
        ):
            order = (
                ((fast, "compiled"), (reference, "numpy")) if k % 2 == 0 else ((reference, "numpy"), (fast, "compiled"))
            )
            plans = []
            for source, name in order:
                t0 = time.thread_time_ns()
                plans.append(source.plan_many(requests))
                if k >= warmup:
                    cpu[name].append(time.thread_time_ns() - t0)
            if plans[0] != plans[1]:
                raise AssertionError(f"batch {k} of {size}: the compiled and numpy paths planned differently")
        row: dict[str, Any] = {
            name: {"p50_us": float(np.median(v)) / 1e3, "p99_us": float(np.percentile(v, 99)) / 1e3}
            for name, v in cpu.items()
        }
        row["ratio_p50"] = row["numpy"]["p50_us"] / row["compiled"]["p50_us"]
        row["ratio_p99"] = row["numpy"]["p99_us"] / row["compiled"]["p99_us"]
        result[f"batch_{size}"] = row
    return result


def bench_plan_cost(
    out_dir: Path, console: Console, sizes: Sequence[int] = (32, 1), batches: int = 600
) -> dict[str, Any]:
    result = {
        "when": datetime.now().isoformat(timespec="seconds"),
        "batches": batches,
        **compare_paths(sizes, batches, console=console),
    }
    table = Table(title=f"planner CPU per plan_many batch (us), {batches} batches each, both paths interleaved")
    for col in ("sessions", "compiled p50", "p99", "numpy p50", "p99", "numpy / compiled p50", "p99"):
        table.add_column(col, justify="right")
    for size in sizes:
        r = result[f"batch_{size}"]
        table.add_row(
            str(size),
            f"{r['compiled']['p50_us']:.0f}",
            f"{r['compiled']['p99_us']:.0f}",
            f"{r['numpy']['p50_us']:.0f}",
            f"{r['numpy']['p99_us']:.0f}",
            f"{r['ratio_p50']:.1f}x",
            f"{r['ratio_p99']:.1f}x",
        )
    console.print(table)
    console.print(f"results: {store_result(out_dir, 'planner-cost', result)}")
    return result
