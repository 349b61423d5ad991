"""Observations the serve tests send: a seeded, plausible feature row per sequence number."""

from __future__ import annotations

import numpy as np

MS = 1_000_000


def sensor(seq: int) -> list[float]:
    """19 features, reproducible from `seq`, at about 20 m/s."""
    rng = np.random.default_rng(seq)
    x = rng.normal(0, 1, 19)
    x[0] = 20 + x[0]
    return x.astype(np.float32).tolist()
