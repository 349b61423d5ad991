"""dualloop OOD gate: features and statistics only; never imports executor/planner/controller/sim.

Typical use::

    gate = ood.fit_gate(X_train, X_calib, feature_names=names, source="decision_vector",
                        data_description="highway nominal logs 2026-05, model v3", alpha=1e-3)
    gate.save("gate.npz")
    gate = ood.load_gate("gate.npz", expected_feature_names=names)
    monitor = gate.monitor(n_slots=32)
    step = monitor.step(features_batch, slots)   # per tick: step.score, step.alarm, step.flags
"""

from .actuation import (ActuationCheck, ActuationEpisode, ActuationModel, ActuationMonitor, ActuationSettings,
                        fit_actuation_check)
from .bank import BankStep, GateBank
from .bench import bench_scorer
from .calibrate import FeatureRange, NormBand, ThresholdCalibration, calibrate_norm_band, calibrate_threshold, fit_feature_range
from .change import ChangeTracker
from .filter import CusumFilter, CusumSettings, FilterSettings, KOfNFilter, KOfNSettings, make_filter
from .fit import GateStats, fit_statistics
from .freeze import FreezeDetector
from .gate import FeatureSchema, Gate, fit_gate
from .gatefile import load_gate, save_gate
from .metrics import auroc, detection_delay, false_veto_rate, tnr_at_tpr
from .monitor import GateMonitor, GateStep
from .score import GateFlags, GateScorer, RowScores, StackedScorer

__all__ = [
    "ActuationCheck", "ActuationEpisode", "ActuationModel", "ActuationMonitor", "ActuationSettings", "fit_actuation_check",
    "BankStep", "ChangeTracker", "CusumFilter", "FeatureRange", "fit_feature_range", "CusumSettings", "FeatureSchema", "FreezeDetector", "FilterSettings", "Gate", "GateBank",
    "GateFlags",
    "GateMonitor", "GateScorer", "GateStats", "GateStep", "KOfNFilter", "KOfNSettings", "NormBand",
    "ThresholdCalibration", "auroc", "bench_scorer", "calibrate_norm_band", "calibrate_threshold",
    "detection_delay", "false_veto_rate", "fit_gate", "fit_statistics", "load_gate", "make_filter",
    "RowScores", "StackedScorer", "save_gate", "tnr_at_tpr",
]
