"""Softmax temperature scaling and the calibration and accuracy metrics reported in the model card."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from dualloop.sim import schema


def log_softmax(logits: np.ndarray, temperature: float = 1.0) -> npt.NDArray[np.float64]:
    z = np.asarray(logits, np.float64) / temperature
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def probabilities(logits: np.ndarray, temperature: float = 1.0) -> npt.NDArray[np.float64]:
    return np.exp(log_softmax(logits, temperature))


def nll(logits: np.ndarray, labels: npt.NDArray[np.int64], temperature: float = 1.0) -> float:
    """Mean negative log-likelihood (unweighted: calibration is about the true label frequencies)."""
    lp = log_softmax(logits, temperature)
    return float(-lp[np.arange(len(labels)), labels].mean())


def fit_temperature(
    logits: np.ndarray, labels: npt.NDArray[np.int64], lo: float = 0.05, hi: float = 20.0, iters: int = 80
) -> float:
    """Golden-section search on log T: NLL(T) is unimodal in T for temperature scaling."""
    a, b = math.log(lo), math.log(hi)
    g = (math.sqrt(5.0) - 1.0) / 2.0
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = nll(logits, labels, math.exp(c)), nll(logits, labels, math.exp(d))
    for _ in range(iters):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = nll(logits, labels, math.exp(c))
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = nll(logits, labels, math.exp(d))
    # Rounded: the card is read by people, and 4 decimals are far below the search's sensitivity.
    return round(math.exp((a + b) / 2.0), 4)


def expected_calibration_error(probs: np.ndarray, labels: npt.NDArray[np.int64], n_bins: int = 15) -> float:
    """Top-1 ECE: sum over equal-width confidence bins (lo, hi] of |accuracy - confidence| * share."""
    probs = np.asarray(probs, np.float64)
    conf = probs.max(axis=1)
    correct = (probs.argmax(axis=1) == labels).astype(np.float64)
    # Bin b holds conf in (b/n, (b+1)/n]; conf == 0 cannot happen for a softmax, clip it anyway.
    bins = np.clip(np.ceil(conf * n_bins).astype(np.int64) - 1, 0, n_bins - 1)
    np.bincount(bins, minlength=n_bins).astype(np.float64)
    acc_sum = np.bincount(bins, weights=correct, minlength=n_bins)
    conf_sum = np.bincount(bins, weights=conf, minlength=n_bins)
    return float(np.abs(acc_sum - conf_sum).sum() / max(len(labels), 1))


def per_class_recall(
    pred: npt.NDArray[np.int64], labels: npt.NDArray[np.int64], n_classes: int = schema.N_ACTIONS
) -> npt.NDArray[np.float64]:
    """Recall per class; NaN for a class absent from `labels` (not 0: nothing was missed)."""
    hits = np.bincount(labels[pred == labels], minlength=n_classes).astype(np.float64)
    support = np.bincount(labels, minlength=n_classes).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(support > 0, hits / support, np.nan)


def confusion(a: npt.NDArray[np.int64], b: npt.NDArray[np.int64], n_classes: int = schema.N_ACTIONS) -> np.ndarray:
    """Counts[i, j] = samples with a == i and b == j."""
    return np.bincount(a * n_classes + b, minlength=n_classes * n_classes).reshape(n_classes, n_classes)
