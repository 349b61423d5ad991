"""Shrinkage covariance estimators (Ledoit-Wolf, OAS) in plain numpy.

Both take data that is already centred (rows = samples) and return the shrunk covariance
``(1 - s) * S + s * mu * I`` together with the shrinkage coefficient ``s``, where ``S`` is the
empirical covariance (divided by n, as in the papers) and ``mu = trace(S) / d``.

The formulas follow scikit-learn's ``ledoit_wolf_shrinkage`` and ``_oas`` (>= 1.3) so a gate
fitted here and a covariance fitted there agree to floating-point precision. Shrinkage matters
because gate features are high-dimensional (64-256) and a raw sample covariance is badly
conditioned; its inverse would amplify noise directions into huge distances.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

ShrinkageMethod = Literal["ledoit_wolf", "oas"]
SHRINKAGE_METHODS: tuple[str, ...] = ("ledoit_wolf", "oas")


def _shrink(emp_cov: np.ndarray, shrinkage: float) -> np.ndarray:
    d = emp_cov.shape[0]
    mu = float(np.trace(emp_cov)) / d
    shrunk = (1.0 - shrinkage) * emp_cov
    shrunk.flat[:: d + 1] += shrinkage * mu
    return shrunk


def ledoit_wolf(centred: np.ndarray) -> tuple[np.ndarray, float]:
    """Ledoit-Wolf (2004) shrinkage towards a scaled identity."""
    x = np.asarray(centred, dtype=np.float64)
    n, d = x.shape
    emp_cov = x.T @ x / n
    if d == 1:
        return emp_cov, 0.0
    mu = float(np.trace(emp_cov)) / d
    # delta: squared Frobenius distance of S from mu*I; beta: variance of the per-sample
    # outer products around S. sum_i ||x_i||^4 equals sum(X2.T @ X2) without the d x d product.
    sq_norms = np.einsum("ij,ij->i", x, x)
    frob_s = float(np.sum(emp_cov**2))
    beta = (float(np.sum(sq_norms**2)) / n - frob_s) / (d * n)
    delta = (frob_s - d * mu * mu) / d
    beta = min(beta, delta)
    shrinkage = 0.0 if beta == 0.0 else beta / delta
    return _shrink(emp_cov, shrinkage), float(shrinkage)


def oas(centred: np.ndarray) -> tuple[np.ndarray, float]:
    """Oracle Approximating Shrinkage (Chen et al. 2010, eq. 23, scikit-learn's form)."""
    x = np.asarray(centred, dtype=np.float64)
    n, d = x.shape
    emp_cov = x.T @ x / n
    if d == 1:
        return emp_cov, 0.0
    mean_sq = float(np.mean(emp_cov**2))  # trace(S S^T) / d^2
    mu = float(np.trace(emp_cov)) / d
    num = mean_sq + mu * mu
    den = (n + 1) * (mean_sq - mu * mu / d)
    shrinkage = 1.0 if den == 0.0 else min(num / den, 1.0)
    return _shrink(emp_cov, shrinkage), float(shrinkage)


def shrunk_covariance(centred: np.ndarray, method: str) -> tuple[np.ndarray, float]:
    """Dispatch on the method name stored in the gate file."""
    if method == "ledoit_wolf":
        return ledoit_wolf(centred)
    if method == "oas":
        return oas(centred)
    raise ValueError(f"unknown shrinkage method {method!r}; expected one of {SHRINKAGE_METHODS}")
