"""dualloop OOD gate: features and statistics only; never imports executor/planner/controller/sim.

Typical use::

    gate = ood.fit_gate(ood.FeatureRows(X_train), ood.FeatureRows(X_calib),
                        ood.FeatureSchema(names, "decision_vector"),
                        "highway nominal logs 2026-05, model v3", ood.GateFitSettings(alpha=1e-3))
    gate.save("gate.npz")
    gate = ood.load_gate("gate.npz", expected_feature_names=names)
    monitor = gate.monitor(n_slots=32)
    step = monitor.step(features_batch, slots)   # per tick: step.score, step.alarm, step.flags
    judged = ood.profile_gate(gate, present)       # sensors measuring only `present` (a raw-input gate)
"""

from dualloop.ood.actuation import (
    ActuationCheck,
    ActuationEpisode,
    ActuationModel,
    ActuationMonitor,
    ActuationSettings,
    fit_actuation_check,
)
from dualloop.ood.bank import BankStep, GateBank
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
from dualloop.ood.change import ChangeTracker
from dualloop.ood.filter import CusumFilter, CusumSettings, FilterSettings, KOfNFilter, KOfNSettings, make_filter
from dualloop.ood.fit import GateStats, fit_statistics
from dualloop.ood.freeze import FreezeDetector, FreezeSettings
from dualloop.ood.gate import Gate, GateFitSettings, fit_gate
from dualloop.ood.gatefile import GateFileError, check_feature_names, load_gate
from dualloop.ood.gateformat import save_gate
from dualloop.ood.mahalanobis import GateFlags, GateScorer, RowScores, StackedScorer, score_in_chunks
from dualloop.ood.marginal import Marginal, ProfileGate, marginal, profile_gate
from dualloop.ood.metrics import auroc, detection_delay, false_veto_rate, tnr_at_tpr
from dualloop.ood.monitor import GateMonitor, GateStep
from dualloop.ood.schema import FeatureSchema, ModelRef
from dualloop.ood.signal_settings import SignalSettings
from dualloop.ood.signals import SignalMonitor
from dualloop.ood.sites import SiteRows, sample_site_rows, site_quantiles, site_threshold

__all__ = [
    "ActuationCheck",
    "ActuationEpisode",
    "ActuationModel",
    "ActuationMonitor",
    "ActuationSettings",
    "fit_actuation_check",
    "BankStep",
    "ChangeTracker",
    "CusumFilter",
    "FeatureRange",
    "FeatureRows",
    "RangeSettings",
    "GateFitSettings",
    "fit_feature_range",
    "CusumSettings",
    "FeatureSchema",
    "ModelRef",
    "FreezeDetector",
    "FreezeSettings",
    "FilterSettings",
    "Gate",
    "GateBank",
    "GateFlags",
    "GateMonitor",
    "GateScorer",
    "GateStats",
    "GateStep",
    "KOfNFilter",
    "KOfNSettings",
    "Marginal",
    "ProfileGate",
    "NormBand",
    "ThresholdCalibration",
    "auroc",
    "calibrate_norm_band",
    "calibrate_threshold",
    "detection_delay",
    "false_veto_rate",
    "fit_gate",
    "fit_statistics",
    "GateFileError",
    "check_feature_names",
    "load_gate",
    "make_filter",
    "marginal",
    "profile_gate",
    "RowScores",
    "StackedScorer",
    "save_gate",
    "tnr_at_tpr",
    "SignalMonitor",
    "SignalSettings",
    "SiteRows",
    "sample_site_rows",
    "score_in_chunks",
    "site_quantiles",
    "site_threshold",
]
