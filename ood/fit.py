"""Fit the gate's Gaussian statistics from recorded feature vectors.

Every row is L2-normalised before fitting (and, identically, before scoring): Mahalanobis
distance on normalised penultimate features separates OOD inputs much better than on raw ones
(Mueller and Hein 2025). The price is that the scale of a vector becomes invisible, so the raw
L2 norm is summarised here separately and guarded by its own band (see calibrate.py).

Variants (score = "d2", larger = less typical):

* ``single``: one mean, one shrinkage covariance; d2 = (z - mu)^T Sigma^-1 (z - mu).
* ``tied``: class means mu_k with one shared (pooled within-class) covariance Sigma;
  d2 = min_k (z - mu_k)^T Sigma^-1 (z - mu_k)  (Lee et al. 2018).
* ``relative``: relative Mahalanobis (Ren et al. 2021). With MD_k the tied class distance above
  and MD_0 the distance to one background Gaussian N(mu_0, Sigma_0) fitted on all data ignoring
  labels, RMD_k = MD_k - MD_0 and the OOD score is min_k RMD_k = min_k MD_k - MD_0. (Ren et al.
  report the confidence -min_k RMD_k; we keep the sign "larger = more OOD".) The score can be
  negative. Both covariances are shrunk here, which the paper does not do.

Scoring must be one matmul, so the whitening W (with Sigma^-1 = W W^T, W = L^-T for the Cholesky
factor Sigma = L L^T) is precomputed, and class means are stored already whitened and centred.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from dualloop.ood.shrinkage import SHRINKAGE_METHODS, shrunk_covariance

Variant = Literal["single", "tied", "relative"]
VARIANTS: tuple[str, ...] = ("single", "tied", "relative")


_NORM_KEYS = ("log_mean", "log_std", "minimum", "maximum", "q001", "q999")


@dataclass(frozen=True)
class NormStats:
    """Summary of the raw (pre-normalisation) L2 norms of the training rows."""

    log_mean: float
    log_std: float
    minimum: float
    maximum: float
    q001: float
    q999: float

    def to_dict(self) -> dict[str, float]:
        return {k: float(getattr(self, k)) for k in _NORM_KEYS}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> NormStats:
        return NormStats(**{k: float(d[k]) for k in _NORM_KEYS})


@dataclass(frozen=True, eq=False)  # holds numpy arrays: == would be ambiguous
class GateStats:
    """Everything the scorer needs, plus the raw covariances for audit.

    Arrays that a variant does not use are empty (shape (0,), (0, d) or (0, 0)) so the gate
    file always has the same entries.
    """

    variant: str
    shrinkage: str
    n_train: int
    center: np.ndarray  # (d,) mean of the normalised training rows
    covariance: np.ndarray  # (d, d) single: overall; tied/relative: pooled within-class
    whiten: np.ndarray  # (d, d) W with covariance^-1 = W W^T
    shrinkage_coef: float
    class_labels: np.ndarray  # (K,) int64
    class_means: np.ndarray  # (K, d) in normalised feature space
    class_offsets: np.ndarray  # (K, d) (class_mean - center) @ whiten
    bg_covariance: np.ndarray  # (d, d) relative only: background (label-free) covariance
    bg_whiten: np.ndarray  # (d, d) relative only
    bg_shrinkage_coef: float
    norm: NormStats = field(repr=False)

    @property
    def dim(self) -> int:
        return int(self.center.shape[0])

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            "center": self.center,
            "covariance": self.covariance,
            "whiten": self.whiten,
            "class_labels": self.class_labels,
            "class_means": self.class_means,
            "class_offsets": self.class_offsets,
            "bg_covariance": self.bg_covariance,
            "bg_whiten": self.bg_whiten,
        }


def raw_norms(x: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Row-wise L2 norms in float64 (float32 squares overflow sooner)."""
    x64 = np.asarray(x, dtype=np.float64)
    norms: npt.NDArray[np.float64] = np.sqrt(np.einsum("ij,ij->i", x64, x64))
    return norms


def check_feature_matrix(x: np.ndarray, what: str) -> np.ndarray:
    """Fitting and calibration data must be clean: bad rows would silently widen the gate."""
    arr = np.asarray(x)
    if arr.ndim != 2 or arr.shape[0] < 2 or arr.shape[1] < 1:
        raise ValueError(f"{what}: expected a (n>=2, d>=1) matrix, got shape {arr.shape}")
    arr = arr.astype(np.float64, copy=False)
    bad = ~np.isfinite(arr).all(axis=1)
    if bad.any():
        raise ValueError(f"{what}: {int(bad.sum())} rows contain NaN/Inf (first at row {int(np.argmax(bad))})")
    zero = raw_norms(arr) == 0.0
    if zero.any():
        raise ValueError(
            f"{what}: {int(zero.sum())} all-zero rows (first at row {int(np.argmax(zero))}); "
            "they cannot be normalised and must not define 'typical'"
        )
    return arr


def l2_normalise(x: npt.ArrayLike) -> npt.NDArray[np.float64]:
    norms = raw_norms(x)
    z: npt.NDArray[np.float64] = np.asarray(x, dtype=np.float64) / np.maximum(norms, np.finfo(np.float64).tiny)[:, None]
    return z


def whitening_from_covariance(cov: np.ndarray) -> np.ndarray:
    """W = L^-T so that ||(z - mu) @ W||^2 = (z - mu)^T cov^-1 (z - mu)."""
    d = cov.shape[0]
    jitter = 0.0
    scale = max(float(np.trace(cov)) / d, np.finfo(np.float64).tiny)
    for _ in range(8):
        try:
            chol = np.linalg.cholesky(cov + jitter * np.eye(d))
            break
        except np.linalg.LinAlgError:
            # Only reachable with zero shrinkage on rank-deficient data; a tiny ridge keeps the
            # gate usable and is recorded implicitly in the stored whitening.
            jitter = scale * 1e-12 if jitter == 0.0 else jitter * 100.0
    else:
        raise ValueError("covariance is not positive definite even after regularisation")
    return np.linalg.inv(chol).T.copy()


def _norm_stats(norms: np.ndarray) -> NormStats:
    logs = np.log(norms)
    return NormStats(
        log_mean=float(logs.mean()),
        log_std=float(logs.std()),
        minimum=float(norms.min()),
        maximum=float(norms.max()),
        q001=float(np.quantile(norms, 0.001)),
        q999=float(np.quantile(norms, 0.999)),
    )


def fit_statistics(
    x: np.ndarray,
    y: np.ndarray | None = None,
    variant: str = "single",
    shrinkage: str = "ledoit_wolf",
) -> GateStats:
    """Fit gate statistics on training features ``x`` (n, d) with optional integer labels ``y``."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; expected one of {VARIANTS}")
    if shrinkage not in SHRINKAGE_METHODS:
        raise ValueError(f"unknown shrinkage {shrinkage!r}; expected one of {SHRINKAGE_METHODS}")
    x64 = check_feature_matrix(x, "training features")
    n, d = x64.shape
    norm = _norm_stats(raw_norms(x64))
    z = l2_normalise(x64)
    center = z.mean(axis=0)
    empty_kd = np.zeros((0, d))
    empty_dd = np.zeros((0, 0))

    if variant == "single":
        cov, coef = shrunk_covariance(z - center, shrinkage)
        return GateStats(
            variant=variant,
            shrinkage=shrinkage,
            n_train=n,
            center=center,
            covariance=cov,
            whiten=whitening_from_covariance(cov),
            shrinkage_coef=coef,
            class_labels=np.zeros(0, dtype=np.int64),
            class_means=empty_kd,
            class_offsets=empty_kd,
            bg_covariance=empty_dd,
            bg_whiten=empty_dd,
            bg_shrinkage_coef=0.0,
            norm=norm,
        )

    if y is None:
        raise ValueError(f"variant {variant!r} needs integer class labels y")
    labels = np.asarray(y)
    if labels.shape != (n,) or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels y must be integers of shape ({n},), got {labels.dtype} {labels.shape}")
    classes, inverse = np.unique(labels, return_inverse=True)
    if variant == "relative" and classes.size < 2:
        raise ValueError("relative Mahalanobis needs at least 2 classes (with one it is identically 0)")
    counts = np.bincount(inverse, minlength=classes.size).astype(np.float64)
    sums = np.zeros((classes.size, d))
    np.add.at(sums, inverse, z)
    class_means = sums / counts[:, None]
    # Tied covariance: pool the residuals around each row's own class mean (Lee et al. 2018).
    cov, coef = shrunk_covariance(z - class_means[inverse], shrinkage)
    whiten = whitening_from_covariance(cov)
    offsets = (class_means - center) @ whiten
    bg_cov, bg_whiten, bg_coef = empty_dd, empty_dd, 0.0
    if variant == "relative":
        bg_cov, bg_coef = shrunk_covariance(z - center, shrinkage)
        bg_whiten = whitening_from_covariance(bg_cov)
    return GateStats(
        variant=variant,
        shrinkage=shrinkage,
        n_train=n,
        center=center,
        covariance=cov,
        whiten=whiten,
        shrinkage_coef=coef,
        class_labels=classes.astype(np.int64),
        class_means=class_means,
        class_offsets=offsets,
        bg_covariance=bg_cov,
        bg_whiten=bg_whiten,
        bg_shrinkage_coef=bg_coef,
        norm=norm,
    )
