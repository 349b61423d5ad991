"""Expert demonstrations for training: seeded episodes of every nominal scenario, split by seed.

Splits are disjoint by episode seed (never by time step): neighbouring steps of one episode are
near-duplicates, so a per-step split would leak the test set into training.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from dualloop.executor.model_card import ModelCard
from dualloop.sim import schema
from dualloop.sim.env import ActionNoise, run_expert_batch
from dualloop.sim.scenarios import NOMINAL_SCENARIOS
from dualloop.sim.sensors import TRAINING_SEES_LANE_ENDS

SPLITS: tuple[str, ...] = ("train", "val", "test")
# Seed layout: root seed * _ROOT + split offset + scenario * _SCENARIO + episode. Disjoint as long as
# a split has fewer than _SCENARIO episodes per scenario (checked in DataConfig).
_ROOT = 1_000_000
_SPLIT_OFFSET = {"train": 0, "val": 300_000, "test": 600_000}
_SCENARIO = 10_000


@dataclass(frozen=True)
class DataConfig:
    """How much expert data to generate; episode counts are per scenario."""

    train_episodes: int = 128
    val_episodes: int = 32
    test_episodes: int = 32
    every: int = 10  # record every k-th 5 ms step: neighbouring steps carry almost no new information
    duration_s: float | None = None  # None: each scenario's own duration
    scenarios: tuple[str, ...] = NOMINAL_SCENARIOS
    # Executed-action noise (labels stay clean) so the data shows how to recover from drift; without
    # it the learned steering was unstable in closed loop (it steered into the lane error).
    noise: ActionNoise | None = ActionNoise()
    # Every recorded state a second time under another target speed, with the expert's controls for
    # it (sim.env.ExpertData.alt_plan): the target then changes how the model accelerates, not where
    # it steers (docs/design-notes/controller.md).
    relabel_targets: bool = True

    def __post_init__(self) -> None:
        counts = (self.train_episodes, self.val_episodes, self.test_episodes)
        if min(counts) < 1 or max(counts) >= _SCENARIO:
            raise ValueError(f"episodes per split must be in [1, {_SCENARIO}), got {counts}")
        if self.every < 1:
            raise ValueError(f"every must be >= 1, got {self.every}")

    def episodes(self, split: str) -> int:
        return {"train": self.train_episodes, "val": self.val_episodes, "test": self.test_episodes}[split]


@dataclass(frozen=True)
class Split:
    """Flat (N, ...) samples of one split; only steps before an episode ended."""

    features: npt.NDArray[np.float32]
    plan: npt.NDArray[np.float32]
    label: npt.NDArray[np.int64]
    controls: npt.NDArray[np.float32]
    scenario: npt.NDArray[np.int16]  # index into DataConfig.scenarios, for per-scenario reports

    def __len__(self) -> int:
        return int(self.label.shape[0])

    def subset(self, idx: npt.NDArray[np.int64]) -> Split:
        return Split(self.features[idx], self.plan[idx], self.label[idx], self.controls[idx], self.scenario[idx])

    def class_counts(self) -> npt.NDArray[np.int64]:
        return np.bincount(self.label, minlength=schema.N_ACTIONS)


@dataclass(frozen=True)
class Dataset:
    train: Split
    val: Split
    test: Split
    config: DataConfig
    seed: int
    seeds: dict[str, list[int]] = field(default_factory=dict)  # per split, all scenarios

    def split(self, name: str) -> Split:
        return {"train": self.train, "val": self.val, "test": self.test}[name]


def split_seeds(seed: int, split: str, scenario_index: int, n: int) -> list[int]:
    start = seed * _ROOT + _SPLIT_OFFSET[split] + scenario_index * _SCENARIO
    return list(range(start, start + n))


def _flatten(
    data_features: np.ndarray,
    data_plan: np.ndarray,
    label: np.ndarray,
    controls: np.ndarray,
    valid: np.ndarray,
    scenario_index: int,
) -> Split:
    keep = valid.reshape(-1)
    n = int(keep.sum())
    return Split(
        features=np.ascontiguousarray(data_features.reshape(-1, schema.N_FEATURES)[keep], np.float32),
        plan=np.ascontiguousarray(data_plan.reshape(-1, schema.N_PLAN)[keep], np.float32),
        label=np.ascontiguousarray(label.reshape(-1)[keep], np.int64),
        controls=np.ascontiguousarray(controls.reshape(-1, 2)[keep], np.float32),
        scenario=np.full(n, scenario_index, np.int16),
    )


def concat(parts: list[Split]) -> Split:
    return Split(
        *(np.concatenate([getattr(p, f) for p in parts]) for f in ("features", "plan", "label", "controls", "scenario"))
    )


def generate(config: DataConfig, seed: int, on_scenario: Callable[[str], None] | None = None) -> Dataset:
    """Run the expert on every scenario; all three splits of a scenario go in one batch (episodes do
    not depend on their batch, and one big batch is much cheaper than three small ones)."""
    parts: dict[str, list[Split]] = {s: [] for s in SPLITS}
    seeds: dict[str, list[int]] = {s: [] for s in SPLITS}
    params: dict[str, Any] = {} if config.duration_s is None else {"duration_s": config.duration_s}
    for si, name in enumerate(config.scenarios):
        per_split = {s: split_seeds(seed, s, si, config.episodes(s)) for s in SPLITS}
        all_seeds = [x for s in SPLITS for x in per_split[s]]
        _, data = run_expert_batch(
            name,
            all_seeds,
            every=config.every,
            noise=config.noise,
            see_lane_ends=TRAINING_SEES_LANE_ENDS,
            relabel=config.relabel_targets,
            **params,
        )
        start = 0
        for s in SPLITS:
            sl = slice(start, start + len(per_split[s]))
            start = sl.stop
            parts[s].append(
                _flatten(data.features[sl], data.plan[sl], data.label[sl], data.controls[sl], data.valid[sl], si)
            )
            if data.alt_plan is not None and data.alt_label is not None and data.alt_controls is not None:
                parts[s].append(
                    _flatten(
                        data.features[sl],
                        data.alt_plan[sl],
                        data.alt_label[sl],
                        data.alt_controls[sl],
                        data.valid[sl],
                        si,
                    )
                )
            seeds[s] += per_split[s]
        if on_scenario is not None:
            on_scenario(name)
    splits = {s: concat(parts[s]) for s in SPLITS}
    return Dataset(splits["train"], splits["val"], splits["test"], config, seed, seeds)


@dataclass(frozen=True)
class Normaliser:
    """(x - mean) / std exactly as the executor applies it (executor.model_card.Normalisation): float32
    mean, float32(1 / std).

    Statistics are rounded to float32 before they go into the card, so the card's JSON floats, the
    trainer and the executor all use the same numbers.
    """

    feat_mean: npt.NDArray[np.float64]
    feat_std: npt.NDArray[np.float64]
    plan_mean: npt.NDArray[np.float64]
    plan_std: npt.NDArray[np.float64]

    @staticmethod
    def _stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        mean = x.astype(np.float64).mean(axis=0)
        std = x.astype(np.float64).std(axis=0)
        # A constant column (e.g. a behaviour the expert never chose) would get std ~0 and blow an
        # unseen value up to 1e6 at run time; pass it through unscaled instead.
        std = np.where(std < 1e-3, 1.0, std)
        return mean.astype(np.float32).astype(np.float64), std.astype(np.float32).astype(np.float64)

    @classmethod
    def fit(cls, split: Split) -> Normaliser:
        fm, fs = cls._stats(split.features)
        pm, ps = cls._stats(split.plan)
        return cls(fm, fs, pm, ps)

    @classmethod
    def from_card(cls, card: ModelCard) -> Normaliser:
        def arr(specs: list, attr: str) -> np.ndarray:
            return np.array([getattr(s, attr) for s in specs], np.float64)

        return cls(arr(card.features, "mean"), arr(card.features, "std"), arr(card.plan, "mean"), arr(card.plan, "std"))

    @staticmethod
    def _apply(x: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
        inv = np.array([1.0 / s for s in std], np.float32)  # same rounding as executor.model_card.Normalisation
        out = np.subtract(np.asarray(x, np.float32), mean.astype(np.float32))
        out *= inv
        return out

    def apply(self, features: np.ndarray, plan: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return (self._apply(features, self.feat_mean, self.feat_std), self._apply(plan, self.plan_mean, self.plan_std))

    def inputs(self, split: Split) -> np.ndarray:
        """The trainer's input: concat(features_norm, plan_norm), as the ONNX graph's Concat does."""
        f, p = self.apply(split.features, split.plan)
        return np.ascontiguousarray(np.concatenate([f, p], axis=1), np.float32)
