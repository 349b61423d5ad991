"""Gate statistics fitted on synthetic clustered data, shared by the scorer tests."""

from __future__ import annotations

import numpy as np

from dualloop import ood
from dualloop.ood.fit import fit_statistics


def clustered_stats(rng: np.random.Generator, d: int, variant: str, classes: int, n: int) -> ood.GateStats:
    """`classes` Gaussian clusters with a shared random covariance in d dimensions, n samples."""
    centres = 2.0 * rng.normal(size=(classes, d)) + 3.0 * rng.normal(size=d)
    y = rng.integers(0, classes, size=n)
    x = centres[y] + rng.normal(size=(n, d)) @ (rng.normal(size=(d, d)) / np.sqrt(d))
    return fit_statistics(x, None if variant == "single" else y, variant=variant)
