"""CPU per BehaviourPlanner.plan_many batch on the compiled rollout (planner._rollout) and on numpy's,
interleaved in one process: time.thread_time_ns around each call, median and p99.

Half the sessions of a batch have features from simulated drives (the expert driving dense_traffic,
cut_in, slow_merge, stopped_vehicle_ahead and lead_brakes_hard, every 200 ms), half random ones
(every feature N(0, 1), the ego at 25 m/s). Every batch is planned once by each path, in alternating
order, and the plans are checked equal.

    .venv/bin/python scripts/bench_planner_compiled.py [--batches 600] [--sizes 32,1]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import planner.compiled
from planner.behaviour import BehaviourPlanner
from planner.plan import PlanRequest
from sim.env import run_expert_batch
from sim.schema import FEATURE_INDEX, N_FEATURES


def simulated_features() -> np.ndarray:
    feats = []
    for name in ("dense_traffic", "cut_in", "slow_merge", "stopped_vehicle_ahead", "lead_brakes_hard"):
        _, data = run_expert_batch(name, [1, 2], every=40)
        feats.append(data.features[data.valid])
    return np.concatenate(feats)


def batches(size: int, count: int, simulated: np.ndarray, seed: int) -> list[list[PlanRequest]]:
    rng = np.random.default_rng(seed)
    out = []
    for k in range(count):
        requests = []
        for i in range(size):
            if (i + k) % 2:
                x = rng.normal(0.0, 1.0, N_FEATURES)
                x[FEATURE_INDEX["ego_speed"]] = 25.0
            else:
                x = simulated[rng.integers(len(simulated))]
            requests.append(PlanRequest(f"s{i}", np.asarray(x, np.float32), k * 200_000_000))
        out.append(requests)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=600)
    parser.add_argument("--sizes", default="32,1")
    args = parser.parse_args()
    if not planner.compiled.available():
        raise SystemExit("planner._rollout is not built: pip install -e .")
    before = planner.compiled.use_compiled(True)
    fast = BehaviourPlanner()
    planner.compiled.use_compiled(False)
    reference = BehaviourPlanner()
    planner.compiled.use_compiled(before)
    simulated = simulated_features()
    for size in (int(s) for s in args.sizes.split(",")):
        work = batches(size, args.batches, simulated, seed=size)
        for requests in work[:20]:  # warm up both
            fast.plan_many(requests)
            reference.plan_many(requests)
        cpu: dict[str, list[int]] = {"compiled": [], "numpy": []}
        for k, requests in enumerate(work):
            order = ((fast, "compiled"), (reference, "numpy")) if k % 2 == 0 else ((reference, "numpy"), (fast, "compiled"))
            plans = []
            for source, name in order:
                t0 = time.thread_time_ns()
                plans.append(source.plan_many(requests))
                cpu[name].append(time.thread_time_ns() - t0)
            assert plans[0] == plans[1], f"batch {k}: the paths planned differently"
        row = {name: (np.median(v) / 1e3, np.percentile(v, 99) / 1e3) for name, v in cpu.items()}
        print(f"batch of {size:3d}, {len(work)} batches: "
              + ", ".join(f"{name} median {m:7.1f} us p99 {p:7.1f} us" for name, (m, p) in row.items())
              + f"; numpy / compiled: median {row['numpy'][0] / row['compiled'][0]:.1f}x,"
                f" p99 {row['numpy'][1] / row['compiled'][1]:.1f}x")


if __name__ == "__main__":
    main()
