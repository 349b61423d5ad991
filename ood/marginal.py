"""A gate on the raw inputs seen through a sensor profile: the present features scored, the missing ones
completed by their conditional mean in the gate's own copy of the row.

A session whose sensors measure only some features sends the others as NaN (Session.present says
which; docs/design-notes/real-sensors.md). Filling them with invented values (a neighbour lane's gap at
150 m) makes the gate judge the invention. Instead the gate's copy of the row gets, for each missing
feature, its conditional mean given the present ones under the gate's fitted Gaussian,
mu_m - P_mm^-1 P_ma (z_a - mu_a) with P the precision the gate scores with. For a Gaussian that makes
the Mahalanobis distance of the completed row equal the marginal distance of the present features,
(z_a - mu_a)^T (Sigma_aa)^-1 (z_a - mu_a).

The gate's Gaussian is on L2-normalised rows (z = x / ||x||, ``ood.fit``), and the norm of a row with
missing features is unknown, so the scale of z_a = x_a / ||x|| is too. The completion takes the scale
that makes the completed row consistent: the present features x_a and the missing ones n (b - K x_a / n)
(K = P_mm^-1 P_ma, b = mu_m + K mu_a) form a row of norm n exactly, so the gate's own normalisation
gives z_a = x_a / n and the missing part their conditional mean: the gate's score is then exactly the
marginal distance at that scale. n solves (1 - |b|^2) n^2 + 2 (b . K x_a) n - (|x_a|^2 + |K x_a|^2) = 0:
one positive root when |b| < 1 (the longitudinal profile of the highway gate, for one); up to two when
|b| >= 1 (the one with the smaller marginal distance is taken); none when the conditional means of every
scale lie off the unit sphere, and then the completion is the scale whose conditional-mean row is nearest
the sphere (n = |x_a|^2 + |K x_a|^2 over b . K x_a), which the gate projects onto it. That happens on
nominal rows for some profiles (up to a third of them with most gaps missing), so a profile's threshold
is calibrated on the gate's stored calibration rows completed the same way (``profile_gate``): whatever
the completion does, a profile's false-veto rate is calibrated.

Only the gate's statistics are used here; it knows nothing of the features' meaning.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from dualloop.ood.calibrate import FeatureRange, calibrate_norm_band, calibrate_threshold
from dualloop.ood.fit import GateStats, raw_norms
from dualloop.ood.gate import Gate
from dualloop.ood.mahalanobis import GateScorer, score_in_chunks
from dualloop.ood.sites import site_threshold

BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]
_INF = math.inf


@dataclass(frozen=True, eq=False)  # holds numpy arrays
class Marginal:
    """How one gate's Gaussian completes the rows of one sensor profile (``marginal``)."""

    present: BoolArray  # (dim,) the features the profile measures
    at: npt.NDArray[np.intp]  # their positions (a)
    missing: npt.NDArray[np.intp]  # the others (m)
    gain: FloatArray  # (m, a) K = P_mm^-1 P_ma
    base: FloatArray  # (m,) b = mu_m + K mu_a: the missing part's conditional mean at z_a = 0
    center: FloatArray  # (a,) mu_a
    precision: FloatArray  # (a, a) (Sigma_aa)^-1 = P_aa - P_am K: the marginal distance's

    @property
    def dim(self) -> int:
        return int(self.present.size)

    def distance(self, z_a: npt.ArrayLike) -> FloatArray:
        """The marginal Mahalanobis distance of normalised present parts z_a (n, a)."""
        d = np.asarray(z_a, np.float64) - self.center
        out: FloatArray = np.einsum("ij,ij->i", d @ self.precision, d)
        return out

    def complete(self, x: npt.ArrayLike) -> FloatArray:
        """The gate's copy of rows x (n, dim) (float64, new): present features as they are, missing ones
        their conditional mean at the consistent scale (module docstring). A row with NaN/Inf in a present
        feature comes back non-finite (the gate vetoes it); one whose present features are all 0 comes
        back all 0 (the norm guard vetoes it); what the missing features held is never read."""
        rows = np.array(x, np.float64, ndmin=2)  # a copy: the caller's buffer is never written
        if self.at.size == 0:  # nothing measured: nothing to judge the row by
            rows[:] = np.nan
            return rows
        if self.missing.size == 0:
            return rows
        xa = rows[:, self.at]
        kx = xa @ self.gain.T
        b, bb = self.base, float(self.base @ self.base)
        gamma = np.einsum("ij,ij->i", xa, xa) + np.einsum("ij,ij->i", kx, kx)
        beta = kx @ b
        curve = 1.0 - bb
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            disc = beta * beta + gamma * curve
            sq = np.sqrt(np.maximum(disc, 0.0))
            near = gamma / (beta + sq)  # the root of the smaller n (the larger 1/n), where it exists
            if curve > 0.0:  # one positive root; without cancellation for either sign of beta
                n = np.where(beta >= 0.0, near, (sq - beta) / curve)
            else:  # none, one or two
                far = gamma / (beta - sq)
                two = (disc >= 0.0) & (beta > 0.0)
                u_near, u_far = 1.0 / near, 1.0 / far
                prefer_far = self._scaled_distance(xa, u_far) < self._scaled_distance(xa, u_near)
                n = np.where(two, np.where(prefer_far & np.isfinite(far) & (far > 0.0), far, near), gamma / beta)
                n = np.where(two | (beta > 0.0), n, np.sqrt(gamma))  # beta <= 0: no scale is nearer; the row's own
            n = np.where(gamma > 0.0, n, 0.0)  # all present features 0: an all-zero row
            rows[:, self.missing] = n[:, None] * b[None, :] - kx
        return rows

    def _scaled_distance(self, xa: FloatArray, u: FloatArray) -> FloatArray:
        return self.distance(xa * u[:, None])


def marginal(stats: GateStats, present: npt.ArrayLike) -> Marginal:
    """A gate's completion for the sensor profile ``present`` ((dim,) bool). The precision is the one
    the gate scores with (W W^T of its whitening); tied and relative gates complete with their pooled
    covariance and overall centre, for which the equality with the marginal distance is not exact."""
    mask = np.asarray(present, bool)
    if mask.shape != (stats.dim,):
        raise ValueError(f"a sensor profile of {mask.shape} for a gate of {stats.dim} features")
    at, missing = np.flatnonzero(mask), np.flatnonzero(~mask)
    precision = stats.whiten @ stats.whiten.T
    mu = stats.center
    p_mm, p_ma, p_aa = precision[np.ix_(missing, missing)], precision[np.ix_(missing, at)], precision[np.ix_(at, at)]
    gain = np.linalg.solve(p_mm, p_ma) if missing.size and at.size else np.zeros((missing.size, at.size))
    return Marginal(
        present=mask.copy(),
        at=at,
        missing=missing,
        gain=gain,
        base=mu[missing] + gain @ mu[at],
        center=mu[at],
        precision=p_aa - p_ma.T @ gain,
    )


@dataclass(frozen=True, eq=False)
class ProfileGate:
    """A gate as it judges the sessions of one sensor profile: its rows completed (``marginal``), its
    threshold calibrated on its calibration rows completed the same way (or, without them, the gate's
    own: see ``calibrated_on``), a norm band on the present features' norm (calibrated likewise, its
    upper end at least the range guard's farthest corner), and limits on the present features only.

    The norm guard looks at the present features (``norm_out``), not at the completed row, whose norm
    is the completion's scale: on real stop-and-go driving (NGSIM I-80, 5 to 15 m gaps) that scale fell
    below every simulated row's for 43% of the observations, while the present features' norm stays
    within the simulated range. The scorer's own band is left open (an all-zero row is still outside
    it)."""

    gate: Gate
    marginal: Marginal
    threshold: float
    norm_low: float  # of the present features' L2 norm
    norm_high: float
    feature_range: FeatureRange | None
    calibrated_on: int  # calibration rows the threshold and band were taken from; 0: none
    site_threshold: float | None = None  # the real sites' own quantile, when it raised the threshold

    def scorer(self, max_batch: int = 64) -> GateScorer:
        return GateScorer(self.gate.stats, self.threshold, 0.0, _INF, max_batch, self.feature_range)

    def norm_out(self, x: npt.ArrayLike) -> BoolArray:
        """Rows (n, dim) whose present features' L2 norm is outside the profile's band (NaN: not out,
        non-finite is the gate's other flag)."""
        rows = np.array(x, np.float64, ndmin=2)[:, self.marginal.at]
        n = np.sqrt(np.einsum("ij,ij->i", rows, rows))
        out: BoolArray = (n < self.norm_low) | (n > self.norm_high)
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "present": int(self.marginal.present.sum()),
            "threshold": self.threshold,
            "norm_band": [self.norm_low, self.norm_high],
            "calibrated_on": self.calibrated_on,
            "site_threshold": self.site_threshold,
        }


def present_limits(rng: FeatureRange | None, present: BoolArray) -> FeatureRange | None:
    """The range guard on the present features only: a missing feature's value and change limits open
    (its value in the gate's copy is the completion's, not a measurement)."""
    if rng is None:
        return None

    def opened(limits: tuple[float, ...], fill: float) -> tuple[float, ...]:
        return tuple(v if keep else fill for v, keep in zip(limits, present.tolist()))

    return dataclasses.replace(
        rng,
        low=opened(rng.low, -_INF),
        high=opened(rng.high, _INF),
        change_low=opened(rng.change_low, -_INF) if rng.change_low else (),
        change_high=opened(rng.change_high, _INF) if rng.change_high else (),
    )


def profile_gate(gate: Gate, present: npt.ArrayLike) -> ProfileGate:
    """``gate`` for sessions measuring only ``present`` features.

    The threshold is the gate's alpha quantile (conformal, as ``calibrate_threshold``) of the marginal
    scores of its stored calibration rows (``Gate.calibration_rows``) completed for this profile, and the
    norm band the gate's norm alpha and margin on their present features' norms: a distance over fewer
    dimensions has its own distribution (for the highway gate's longitudinal profile the quantile is
    higher than the full gate's), so the full gate's threshold would veto at another rate than it was
    calibrated for. A gate without stored rows (or with too few for its alphas) keeps its own threshold
    and a norm band that only refuses all-zero rows. A gate with real drives of several sites
    (``Gate.site_rows``) raises the threshold to the largest site quantile among the sites measuring
    every present feature (``ood.sites``): ordinary driving at a site it never saw is then not OOD."""
    m = marginal(gate.stats, present)
    rng = present_limits(gate.feature_range, m.present)
    rows = gate.calibration_rows
    if rows is None or not len(rows) or m.at.size == 0:
        return ProfileGate(gate, m, gate.threshold, 0.0, _INF, rng, 0)
    done = m.complete(rows)
    try:
        scores, _ = score_in_chunks(GateScorer(gate.stats), done)
        threshold = calibrate_threshold(scores, gate.calibration.alpha, "profile").threshold
    except ValueError:  # too few rows for the alpha
        return ProfileGate(gate, m, gate.threshold, 0.0, _INF, rng, 0)
    site = _site_threshold(gate, m)
    raised = site if site is not None and site > threshold else None
    threshold = threshold if raised is None else raised
    try:
        band = calibrate_norm_band(raw_norms(rows[:, m.at]), gate.norm_band.alpha, gate.norm_band.margin)
        low, high = min(band.low, NORM_FLOOR), max(band.high, _corner(gate.feature_range, m.at))
    except ValueError:  # too few rows for the norm alpha, or rows whose present features are all 0
        low, high = 0.0, _INF
    return ProfileGate(gate, m, threshold, low, high, rng, len(rows), raised)


def _site_threshold(gate: Gate, m: Marginal) -> float | None:
    """The largest site quantile of the gate's site rows that measure every feature of the profile."""
    sites = gate.site_rows
    if sites is None:
        return None
    covered = np.isfinite(sites.rows[:, m.at]).all(axis=1)
    if not covered.any():
        return None
    scores, _ = score_in_chunks(GateScorer(gate.stats), m.complete(sites.rows[covered]))
    return site_threshold(scores, sites.site[covered], sites.names, gate.calibration.alpha)


# The lowest a profile's norm band may start: a working sensor that sees a lead reads lead_present = 1,
# so its present features' norm is at least 1, even stopped 1 m behind the lead in a queue (real
# stop-and-go driving, NGSIM I-80 and the OpenACC ZalaZone course, reads 1.0-2.3 there, below every
# simulated row's). A dead sensor's all-zero row is refused by the scorer whatever the band.
NORM_FLOOR = 1.0


def _corner(rng: FeatureRange | None, at: npt.NDArray[np.intp]) -> float:
    """The norm of the range guard's farthest corner over these features: a norm band must not refuse
    what every value limit accepts (a real lead 250 m ahead, inside the widened range, would otherwise
    be out of a band calibrated on a simulated sensor's 150 m)."""
    if rng is None:
        return 0.0
    far = np.maximum(np.abs(np.array(rng.low)[at]), np.abs(np.array(rng.high)[at]))
    return float(np.sqrt(np.sum(far * far)))
