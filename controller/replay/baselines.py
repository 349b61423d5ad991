"""Trivial baselines a decision model must beat on recorded drives: without them an
agreement figure says nothing (most highway ticks hold the speed, so "keep" alone agrees often).

Each baseline maps one observation's features to a longitudinal acceleration; its action is that
acceleration's band (`executor.action_labels.action_of_accel`), the same bands the human's label
uses. They see only what the model sees at the tick (causal features, no look-ahead):

- keep:      a = 0, always (the majority class on a highway).
- ego_accel: a = the measured ego_accel feature: "keep doing what the car does now".
- time_gap:  an ACC-like constant time-gap law on the in-lane lead,
                 a = K_GAP * (lead_distance - (STANDSTILL_GAP_M + TIME_GAP_S * ego_speed))
                     + K_DV * lead_rel_speed,
             clipped to the model card's accel range; without a lead (lead_present < 0.5), keep (0):
             a log has no set speed to cruise towards.

The time-gap constants were fixed before any held-out log was looked at and are never fitted to one:
TIME_GAP_S and STANDSTILL_GAP_M are the simulator expert's (`sim/expert.py` ExpertParams.time_gap,
min_gap: the world the shipped model is trained in), K_GAP and K_DV are the gap-control gains of the
published ACC model (Milanes & Shladover; SUMO's MSCFModel_ACC defaults 0.23 and 0.07). Changing
them means saying so in docs/measurements.md next to the numbers they produced.

A baseline that needs a feature the log does not measure is n/a (NaN accel, action -1) on that
tick, never computed on an invented value: a feature is unmeasured where its value is NaN, and
everywhere when the log's header leaves it out of `measured_features` (or lists it among the neutral
`filled_features` of older imports).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from dualloop.executor.action_labels import action_of_accel

BASELINES: Final = ("keep", "ego_accel", "time_gap")

TIME_GAP_S: Final = 1.6  # s, desired time headway
STANDSTILL_GAP_M: Final = 3.0  # m, gap kept at standstill
K_GAP: Final = 0.23  # 1/s^2, per metre of gap error
K_DV: Final = 0.07  # 1/s, per m/s of lead speed minus ego speed

# The features each baseline reads (names of the highway schema; a log without one of them has the
# baseline n/a).
NEEDS: Final = {
    "keep": (),
    "ego_accel": ("ego_accel",),
    "time_gap": ("lead_present", "lead_distance", "lead_rel_speed", "ego_speed"),
}

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def measured_columns(
    features: npt.ArrayLike,
    feature_names: Sequence[str],
    names: Sequence[str],
    unmeasured: Collection[str] = (),
) -> dict[str, FloatArray]:
    """Each named feature as a float64 column, NaN where the log does not measure it (a NaN value,
    a name in `unmeasured`, or a name the feature schema does not have)."""
    x = np.asarray(features, np.float64).reshape(-1, len(feature_names))
    index = {n: i for i, n in enumerate(feature_names)}
    out = {}
    for name in names:
        if name in index and name not in unmeasured:
            out[name] = x[:, index[name]].copy()
        else:
            out[name] = np.full(len(x), np.nan)
    return out


def time_gap_accel(
    lead_present: FloatArray,
    lead_distance: FloatArray,
    lead_rel_speed: FloatArray,
    ego_speed: FloatArray,
    accel_range: tuple[float, float],
) -> FloatArray:
    """The time-gap law per row (see the module docstring); NaN where a needed input is NaN."""
    gap_error = lead_distance - (STANDSTILL_GAP_M + TIME_GAP_S * ego_speed)
    follow = np.clip(K_GAP * gap_error + K_DV * lead_rel_speed, *accel_range)  # NaN stays NaN
    with np.errstate(invalid="ignore"):
        has_lead = lead_present >= 0.5
    return np.where(np.isnan(lead_present), np.nan, np.where(has_lead, follow, 0.0))


def baseline_accels(
    features: npt.ArrayLike,
    feature_names: Sequence[str],
    accel_range: tuple[float, float],
    unmeasured: Collection[str] = (),
) -> dict[str, FloatArray]:
    """Every baseline's acceleration per observation row, NaN where it is n/a."""
    needed = sorted({n for names in NEEDS.values() for n in names})
    col = measured_columns(features, feature_names, needed, unmeasured)
    rows = len(next(iter(col.values())))
    return {
        "keep": np.zeros(rows),
        "ego_accel": col["ego_accel"],
        "time_gap": time_gap_accel(
            col["lead_present"], col["lead_distance"], col["lead_rel_speed"], col["ego_speed"], accel_range
        ),
    }


def baseline_actions(accels: dict[str, FloatArray]) -> dict[str, IntArray]:
    """The band of each baseline's acceleration; -1 (n/a) where it is NaN."""
    return {name: action_of_accel(a) for name, a in accels.items()}
