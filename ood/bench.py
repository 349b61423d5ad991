"""Microbenchmark of the per-tick scorer (wired into the CLI elsewhere)."""

from __future__ import annotations

import time

import numpy as np

from dualloop.ood.fit import fit_statistics
from dualloop.ood.score import GateScorer


def bench_scorer(
    d: int = 64, batch: int = 1, n_iter: int = 20000, variant: str = "single", seed: int = 0
) -> dict[str, float]:
    """Time ``GateScorer.score`` on random float32 rows; microseconds per call and per row."""
    rng = np.random.default_rng(seed)
    n_train = max(4 * d, 2000)
    mean = rng.normal(size=d)
    x_train = mean + rng.normal(size=(n_train, d)) * 0.5
    y = rng.integers(0, 5, size=n_train) if variant != "single" else None
    scorer = GateScorer(
        fit_statistics(x_train, y, variant=variant), threshold=float(d), norm_low=1e-3, norm_high=1e6, max_batch=batch
    )
    x = (mean + rng.normal(size=(batch, d)) * 0.5).astype(np.float32)
    for _ in range(min(200, n_iter)):  # warm caches and buffers
        scorer.score(x)
    times = np.empty(n_iter)
    clock = time.perf_counter_ns
    for i in range(n_iter):
        t0 = clock()
        scorer.score(x)
        times[i] = clock() - t0
    us = times / 1e3
    med, p99 = float(np.median(us)), float(np.percentile(us, 99))
    return {
        "d": float(d),
        "batch": float(batch),
        "n_iter": float(n_iter),
        "median_us_per_call": med,
        "p99_us_per_call": p99,
        "median_us_per_row": med / batch,
        "p99_us_per_row": p99 / batch,
    }
