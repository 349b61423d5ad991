"""Per-episode safety/comfort metrics and plotting series, gathered step by step for a batch.

Hard brakes and jerk use the ego's actual acceleration (after actuator lag and friction): that is
what occupants feel, and a discrete controller's command would make jerk meaningless.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dualloop.sim.schema import BRAKE_HARD_BELOW, FEATURE_INDEX

FloatArray = npt.NDArray[np.float64]
_LEAD_PRESENT = FEATURE_INDEX["lead_present"]
_LEAD_GAP = FEATURE_INDEX["lead_distance"]
_LEAD_REL = FEATURE_INDEX["lead_rel_speed"]


@dataclass
class EpisodeSeries:
    t: FloatArray
    ego_speed: FloatArray
    lead_gap: FloatArray  # nan when no lead in range
    accel: FloatArray  # actual ego acceleration
    accel_cmd: FloatArray  # command as applied (clipped)


@dataclass
class EpisodeMetrics:
    seed: int
    collisions: int
    off_road: bool
    min_ttc_s: float  # to the in-lane lead; inf if never closing
    min_lead_gap_m: float  # inf if never a lead
    hard_brakes: int  # onsets of actual accel < -3.5 m/s^2
    max_abs_jerk: float  # m/s^3
    duration_s: float
    series: EpisodeSeries


class MetricsRecorder:
    def __init__(self, batch: int, max_steps: int, dt: float) -> None:
        self.dt = dt
        self.min_ttc = np.full(batch, np.inf)
        self.min_gap = np.full(batch, np.inf)
        self.hard_brakes = np.zeros(batch, dtype=np.int64)
        self.max_jerk = np.zeros(batch)
        self.steps = np.zeros(batch, dtype=np.int64)
        self._prev_a = np.full(batch, np.nan)
        self._prev_hard = np.zeros(batch, dtype=bool)
        self._columns: list[FloatArray] = []  # one (5, B) column per step, stacked on demand
        self._max_steps = max_steps

    def update(
        self,
        t: float,
        truth: FloatArray,
        ego_v: FloatArray,
        ego_a: FloatArray,
        accel_cmd: FloatArray,
        active: npt.NDArray[np.bool_],
    ) -> None:
        """Record one step for the episodes still `active` (truth = noise-free FEATURES)."""
        present = truth[:, _LEAD_PRESENT] > 0.5
        gap = np.where(present, truth[:, _LEAD_GAP], np.inf)
        closing = -truth[:, _LEAD_REL]
        ttc = np.where(present & (closing > 0.0), gap / np.maximum(closing, 1e-9), np.inf)
        self.min_ttc = np.where(active, np.minimum(self.min_ttc, ttc), self.min_ttc)
        self.min_gap = np.where(active, np.minimum(self.min_gap, gap), self.min_gap)
        hard = ego_a < BRAKE_HARD_BELOW
        self.hard_brakes += active & hard & ~self._prev_hard
        self._prev_hard = hard
        jerk = np.abs(ego_a - self._prev_a) / self.dt
        # At a full stop the world clamps speed at zero and the acceleration drops to 0 in one step:
        # an artefact of the model, not something occupants feel as jerk. Count only while moving.
        moving = ego_v > 0.1
        self.max_jerk = np.where(active & moving & np.isfinite(jerk), np.maximum(self.max_jerk, jerk), self.max_jerk)
        self._prev_a = ego_a.copy()
        self.steps += active
        if len(self._columns) < self._max_steps:
            col = np.empty((5, ego_v.shape[0]))
            col[0] = t
            col[1] = np.where(active, ego_v, np.nan)
            col[2] = np.where(active & present, gap, np.nan)
            col[3] = np.where(active, ego_a, np.nan)
            col[4] = np.where(active, accel_cmd, np.nan)
            self._columns.append(col)

    def episode(self, b: int, seed: int, collisions: int, off_road: bool) -> EpisodeMetrics:
        n = int(self.steps[b])
        n = min(n, len(self._columns))
        ser = np.stack([c[:, b] for c in self._columns[:n]], axis=1) if n else np.zeros((5, 0))
        return EpisodeMetrics(
            seed=seed,
            collisions=collisions,
            off_road=off_road,
            min_ttc_s=float(self.min_ttc[b]),
            min_lead_gap_m=float(self.min_gap[b]),
            hard_brakes=int(self.hard_brakes[b]),
            max_abs_jerk=float(self.max_jerk[b]),
            duration_s=n * self.dt,
            series=EpisodeSeries(ser[0].copy(), ser[1].copy(), ser[2].copy(), ser[3].copy(), ser[4].copy()),
        )
