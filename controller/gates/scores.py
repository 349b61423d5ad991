"""One scenario's gate scores over a batch of episodes, as the evaluation and its plots read them."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class ScenarioScores:
    name: str
    ood: bool
    t: np.ndarray  # (T,)
    score: np.ndarray  # (B, T) Mahalanobis score (ratio to threshold with several gates), +inf for non-finite rows
    alarm: np.ndarray  # (B, T) veto as the executor would apply it
    immediate: np.ndarray  # (B, T) a guard vetoed at once (NaN/Inf, norm band, feature range, freeze check)
    valid: np.ndarray  # (B, T)
    onset_tick: np.ndarray  # (B,) first tick at or after the fault's onset; T when never
    end_tick: np.ndarray  # (B,) first tick after the fault is over (noise bursts end); T when it lasts
    demand: np.ndarray = field(
        repr=False, default_factory=lambda: np.zeros(0, bool)
    )  # (B, T) |command| >= evaluation.DEMAND_ACCEL
    decision: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))  # (B, T, d) sampled later
    action: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))  # (B, T) model argmax
    # the model's logits and the expert's action: calibration under stress (controller/qualify/stress.py)
    logits: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))  # (B, T, actions)
    label: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, np.int64))  # (B, T)


def fault_active(s: ScenarioScores) -> np.ndarray:
    """The ticks the fault is active: from onset until it ends (a noise burst does), valid only."""
    ticks = np.arange(s.score.shape[1])[None, :]
    return s.valid & (ticks >= s.onset_tick[:, None]) & (ticks < s.end_tick[:, None])
