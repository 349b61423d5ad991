"""The Gate: fitted statistics + calibrated threshold + norm band + filter + feature schema.

``fit_gate`` is the one-call path from recorded features to a saved, hashed gate file;
``Gate.monitor(n_slots)`` is the one object an executor loop needs per tick.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from dualloop.ood.actuation import ActuationCheck
from dualloop.ood.calibrate import (
    FeatureRange,
    FeatureRows,
    NormBand,
    RangeSettings,
    ThresholdCalibration,
    calibrate_norm_band,
    calibrate_threshold,
    fit_feature_range,
)
from dualloop.ood.filter import FilterSettings, KOfNSettings, make_filter
from dualloop.ood.fit import GateStats, check_feature_matrix, fit_statistics, raw_norms
from dualloop.ood.freeze import FreezeSettings
from dualloop.ood.gateformat import content_hash, save_gate
from dualloop.ood.mahalanobis import GateScorer, score_in_chunks
from dualloop.ood.monitor import GateMonitor
from dualloop.ood.schema import FeatureSchema, ModelRef
from dualloop.ood.sites import SiteRows


@dataclass(frozen=True, eq=False)  # holds numpy arrays: == would be ambiguous
class Gate:
    stats: GateStats
    calibration: ThresholdCalibration
    norm_band: NormBand
    filter: FilterSettings
    schema: FeatureSchema
    feature_range: FeatureRange | None = None  # raw features outside it veto at once; None: no range guard
    # measured acceleration short of the command in effect (raw-input gates only); None: no such check
    actuation: ActuationCheck | None = None
    # how the freeze check (on the raw inputs, with any gate) tells a car at rest from a stuck sensor;
    # None: every exact repeat counts
    freeze: FreezeSettings | None = None
    # (k, dim) float32: a sample of the held-out rows the threshold was calibrated on, kept so that a
    # sensor profile's threshold and norm band can be calibrated on them too (ood.marginal.profile_gate);
    # None: a profile keeps the gate's own
    calibration_rows: np.ndarray | None = None
    # the model it was fitted on; None: a gate file written before gates recorded it
    model: ModelRef | None = None
    # ordinary real driving from several sites, NaN where a site does not measure a feature: each sensor
    # profile's threshold also covers every site's own quantile (ood.sites); None: simulated rows only
    site_rows: SiteRows | None = None

    @property
    def threshold(self) -> float:
        return self.calibration.threshold

    @property
    def variant(self) -> str:
        return self.stats.variant

    @property
    def dim(self) -> int:
        return self.stats.dim

    @cached_property
    def version_hash(self) -> str:
        """sha256 of the canonical content (metadata JSON + arrays); identical after a round trip."""
        return content_hash(self)

    def nominal_veto_rate(self) -> dict[str, float]:
        """Upper-bound per-tick false-veto budget on in-distribution data, by source.

        ``norm_guard``: the band's stated alpha (immediate, unfiltered); ``filtered_score``: the
        filter's alarm probability for i.i.d. exceedances at the calibrated alpha (k-of-n only,
        NaN for CUSUM, which has no closed form here; measure it with metrics.false_veto_rate).
        """
        filt = self.filter
        score = filt.false_alarm_probability(self.calibration.alpha) if isinstance(filt, KOfNSettings) else float("nan")
        out = {
            "norm_guard": self.norm_band.alpha,
            "filtered_score": score,
            "norm_guard_measured": self.norm_band.empirical_rate,
        }
        if self.feature_range is not None:
            out["range_guard_measured"] = self.feature_range.calibration_rate
        if self.actuation is not None:  # before its filter and distrust hold, per observation with a verdict
            out["actuation_measured"] = self.actuation.calibration.empirical_rate
        return out

    def scorer(self, max_batch: int = 64) -> GateScorer:
        return GateScorer(
            self.stats,
            threshold=self.calibration.threshold,
            norm_low=self.norm_band.low,
            norm_high=self.norm_band.high,
            max_batch=max_batch,
            feature_range=self.feature_range,
        )

    def monitor(self, n_slots: int) -> GateMonitor:
        """Scorer + per-slot filter sized for ``n_slots`` concurrent sessions."""
        return GateMonitor(self.scorer(max_batch=n_slots), make_filter(self.filter, n_slots))

    def save(self, path: str | os.PathLike[str]) -> str:
        """Write the gate file (``gateformat.save_gate``); returns the version hash."""
        return save_gate(self, path)


@dataclass(frozen=True)
class GateFitSettings:
    """How a gate is fitted and calibrated (``fit_gate``), as whoever fits it states it.

    ``alpha`` is the per-tick false-veto rate of the score threshold (before the filter);
    ``norm_alpha`` (None: alpha) the per-tick rate of norm-guard hits, which veto at once (no filter),
    and ``norm_margin`` >= 1 widens that band multiplicatively to push the nominal immediate-veto rate
    well below norm_alpha; see ``Gate.nominal_veto_rate``. ``range`` adds a per-feature range guard
    (``fit_feature_range``; None fits none). ``keep_calibration_rows`` > 0 stores that many of the
    calibration rows (evenly spaced, float32) with the gate, for the thresholds of sensor profiles
    (``ood.marginal.profile_gate``); a raw-input gate wants at least 2 / norm_alpha of them.
    """

    variant: str = "single"
    shrinkage: str = "ledoit_wolf"
    alpha: float = 0.001
    norm_alpha: float | None = None
    norm_margin: float = 1.0
    filter: FilterSettings = KOfNSettings()  # a dict's: ``filter_settings_from_dict``
    range: RangeSettings | None = None
    keep_calibration_rows: int = 0


def fit_gate(
    train: FeatureRows,
    calib: FeatureRows,
    schema: FeatureSchema,
    data_description: str,
    settings: GateFitSettings | None = None,
    labels: np.ndarray | None = None,
) -> Gate:
    """Fit on ``train``, calibrate threshold and norm band (and the range guard's rate) on held-out
    ``calib``; ``schema`` names the feature columns and their source.

    ``data_description`` says what the calibration rows are (recorded where, which model version) and
    is stored with the threshold. ``labels`` (one class per training row) are for the class-conditional
    variants. The changes and context of the rows are read only by a range guard (``settings.range``).
    """
    settings = GateFitSettings() if settings is None else settings
    stats = fit_statistics(train.values, labels, variant=settings.variant, shrinkage=settings.shrinkage)
    if len(schema.feature_names) != stats.dim:
        raise ValueError(f"{len(schema.feature_names)} feature names for {stats.dim} feature columns")
    x_calib = check_feature_matrix(calib.values, "calibration features")
    if x_calib.shape[1] != stats.dim:
        raise ValueError(f"calibration features have {x_calib.shape[1]} columns, training has {stats.dim}")
    scores, _ = score_in_chunks(GateScorer(stats), x_calib)
    calibration = calibrate_threshold(scores, settings.alpha, data_description)
    norm_alpha = settings.alpha if settings.norm_alpha is None else settings.norm_alpha
    band = calibrate_norm_band(raw_norms(x_calib), norm_alpha, settings.norm_margin)
    feature_range = (
        None
        if settings.range is None
        else fit_feature_range(train, dataclasses.replace(calib, values=x_calib), settings.range)
    )
    kept = None
    if settings.keep_calibration_rows > 0:
        n_kept = min(int(settings.keep_calibration_rows), len(x_calib))
        pick = np.linspace(0, len(x_calib) - 1, n_kept).round().astype(np.intp)
        kept = np.ascontiguousarray(x_calib[np.unique(pick)], np.float32)
    return Gate(stats, calibration, band, settings.filter, schema, feature_range, calibration_rows=kept)
