"""Per-episode safety/comfort metrics and plotting series, gathered step by step for a batch.

Hard brakes and jerk use the ego's actual acceleration (after actuator lag and friction): that is
what occupants feel, and a discrete controller's command would make jerk meaningless.

The harm braking does behind the ego is measured on the simulator's ground truth: the time to
collision of the car behind the ego in its lane, rear-end collisions (the world counts them), and
phantom braking: braking beyond PHANTOM_DECEL while nothing ahead calls for it (phantom_braking_s).
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

PHANTOM_DECEL: float = 2.0  # m/s^2: braking harder than this needs a reason ahead
THREAT_TTC_S: float = 3.0  # a car ahead closing to contact within this is a reason
THREAT_MEMORY_S: float = 1.0  # a reason still counts this long after it has gone
MOVING_MPS: float = 0.1  # below this the car stands: a braking command decelerates nothing


def phantom_braking_s(
    dt: float,
    speed: FloatArray,
    accel: FloatArray,
    accel_cmd: FloatArray,
    required_decel: FloatArray,
    threat_ttc: FloatArray,
) -> float:
    """Seconds of phantom braking in one episode's per-step series (the state after each step).

    A step brakes when the ego's actual acceleration is below -PHANTOM_DECEL, or its applied command
    is while the car moves (speed > MOVING_MPS). A step has a reason when the ground truth ahead
    (World.ego_threat) needs PHANTOM_DECEL or more, or a car ahead would reach the ego within
    THREAT_TTC_S, at that step or within THREAT_MEMORY_S before it. Phantom braking: steps that brake
    without a reason, times dt. NaN entries (after the episode ended) count as neither.
    """
    with np.errstate(invalid="ignore"):
        braking = (accel < -PHANTOM_DECEL) | ((accel_cmd < -PHANTOM_DECEL) & (speed > MOVING_MPS))
        threat = (required_decel >= PHANTOM_DECEL) | (threat_ttc < THREAT_TTC_S)
    n = threat.shape[0]
    if n == 0:
        return 0.0
    # a reason within the last THREAT_MEMORY_S: a running count over a sliding window of steps
    window = max(1, int(round(THREAT_MEMORY_S / dt)) + 1)
    counts = np.cumsum(np.concatenate([[0], threat.astype(np.int64)]))
    recent = counts[1:] - counts[np.maximum(np.arange(n) + 1 - window, 0)] > 0
    return float((braking & ~recent).sum()) * dt


@dataclass
class EpisodeSeries:
    t: FloatArray
    ego_speed: FloatArray
    lead_gap: FloatArray  # nan when no lead in range
    accel: FloatArray  # actual ego acceleration
    accel_cmd: FloatArray  # command as applied (clipped)
    # ground truth (World.ego_threat, World.ego_neighbours); see phantom_braking_s
    required_decel: FloatArray  # to keep a margin behind what is ahead, m/s^2
    threat_ttc: FloatArray  # least TTC ahead, inf if nothing closes
    rear_gap: FloatArray  # to the car behind in the ego's lane, nan when none


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
    rear_end_collisions: int = 0  # of `collisions`, those where a car ran into the ego from behind
    min_rear_ttc_s: float = np.inf  # of the car behind the ego in its lane; inf if it never closed in
    min_rear_gap_m: float = np.inf
    phantom_braking_s: float = 0.0


_ROWS = 8  # EpisodeSeries' fields


class MetricsRecorder:
    def __init__(self, batch: int, max_steps: int, dt: float) -> None:
        self.dt = dt
        self.min_ttc = np.full(batch, np.inf)
        self.min_gap = np.full(batch, np.inf)
        self.hard_brakes = np.zeros(batch, dtype=np.int64)
        self.max_jerk = np.zeros(batch)
        self.steps = np.zeros(batch, dtype=np.int64)
        self.min_rear_ttc = np.full(batch, np.inf)
        self.min_rear_gap = np.full(batch, np.inf)
        self._prev_a = np.full(batch, np.nan)
        self._prev_hard = np.zeros(batch, dtype=bool)
        self._columns: list[FloatArray] = []  # one (_ROWS, B) column per step, stacked on demand
        self._max_steps = max_steps

    def update(
        self,
        t: float,
        truth: FloatArray,
        ego_v: FloatArray,
        ego_a: FloatArray,
        accel_cmd: FloatArray,
        active: npt.NDArray[np.bool_],
        threat: tuple[FloatArray, FloatArray] | None = None,
        rear: tuple[FloatArray, FloatArray] | None = None,
    ) -> None:
        """Record one step for the episodes still `active` (truth = noise-free FEATURES).

        threat: World.ego_threat() (required deceleration, TTC); rear: (gap, closing speed) of the
        car behind the ego in its lane (inf gap when none); both ground truth, None: not known."""
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
        nan = np.full(ego_v.shape[0], np.nan)
        need, ttc_ahead = threat if threat is not None else (nan, nan)
        rear_gap, rear_closing = rear if rear is not None else (np.full_like(nan, np.inf), nan)
        with np.errstate(invalid="ignore"):
            rear_ttc = np.where(rear_closing > 0.0, np.maximum(rear_gap, 0.0) / np.maximum(rear_closing, 1e-9), np.inf)
        self.min_rear_ttc = np.where(active, np.minimum(self.min_rear_ttc, rear_ttc), self.min_rear_ttc)
        self.min_rear_gap = np.where(active, np.minimum(self.min_rear_gap, rear_gap), self.min_rear_gap)
        if len(self._columns) < self._max_steps:
            col = np.empty((_ROWS, ego_v.shape[0]))
            col[0] = t
            col[1] = np.where(active, ego_v, np.nan)
            col[2] = np.where(active & present, gap, np.nan)
            col[3] = np.where(active, ego_a, np.nan)
            col[4] = np.where(active, accel_cmd, np.nan)
            col[5] = np.where(active, need, np.nan)
            col[6] = np.where(active, ttc_ahead, np.nan)
            col[7] = np.where(active & np.isfinite(rear_gap), rear_gap, np.nan)
            self._columns.append(col)

    def episode(self, b: int, seed: int, collisions: int, off_road: bool, rear_ends: int = 0) -> EpisodeMetrics:
        n = int(self.steps[b])
        n = min(n, len(self._columns))
        ser = np.stack([c[:, b] for c in self._columns[:n]], axis=1) if n else np.zeros((_ROWS, 0))
        series = EpisodeSeries(*(row.copy() for row in ser))
        return EpisodeMetrics(
            seed=seed,
            collisions=collisions,
            off_road=off_road,
            min_ttc_s=float(self.min_ttc[b]),
            min_lead_gap_m=float(self.min_gap[b]),
            hard_brakes=int(self.hard_brakes[b]),
            max_abs_jerk=float(self.max_jerk[b]),
            duration_s=n * self.dt,
            series=series,
            rear_end_collisions=rear_ends,
            min_rear_ttc_s=float(self.min_rear_ttc[b]),
            min_rear_gap_m=float(self.min_rear_gap[b]),
            phantom_braking_s=phantom_braking_s(
                self.dt, series.ego_speed, series.accel, series.accel_cmd, series.required_decel, series.threat_ttc
            ),
        )
