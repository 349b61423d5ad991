"""`dualloop bench gate`: the gate's cost per session per tick, next to the model's forward pass.

Runs the real executor in-process (one batched tick for N sessions, as the server does) with and
without the gate, and reads the executor's own stage timings.
"""

from __future__ import annotations

import time

import numpy as np

import ood
from executor.config import ExecutorConfig
from executor.core import Executor
from executor.model_runner import DecisionModel
from executor.snapshot import Observation


def bench_gate(model: DecisionModel, gate: ood.Gate | list[ood.Gate], sessions: int = 8, ticks: int = 4000,
               seed: int = 0) -> dict[str, dict[str, float]]:
    rng = np.random.default_rng(seed)
    n_feat = model.n_features
    out: dict[str, dict[str, float]] = {}
    for label, g in (("without gate", None), ("with gate", gate)):
        ex = Executor(model, ExecutorConfig(max_sessions=max(sessions, 1)), g)
        ids = [f"s{i}" for i in range(sessions)]
        for sid in ids:
            ex.open_session(sid)
        forward, gate_t, total = [], [], []
        for k in range(ticks):
            obs = {sid: Observation(seq=k + 1, timestamp_ns=0, features=rng.normal(0, 1, n_feat).astype(np.float32))
                   for sid in ids}
            t0 = time.perf_counter_ns()
            snaps = ex.step(obs, now_ns=k * 5_000_000)
            total.append(time.perf_counter_ns() - t0)
            forward.append(snaps[0].timings.forward_us)
            gate_t.append(snaps[0].timings.gate_us)
        warm = slice(ticks // 10, None)
        f, gt, tt = np.array(forward[warm], float), np.array(gate_t[warm], float), np.array(total[warm], float) / 1e3
        out[label] = {"forward_us_p50": float(np.median(f)), "forward_us_p99": float(np.percentile(f, 99)),
                      "gate_us_p50": float(np.median(gt)), "gate_us_p99": float(np.percentile(gt, 99)),
                      "gate_us_per_session_p50": float(np.median(gt)) / sessions,
                      "tick_us_p50": float(np.median(tt)), "tick_us_p99": float(np.percentile(tt, 99))}
    return out
