"""Training data: seeded simulated drives of every nominal scenario, split by seed, and recorded drives.

Three kinds of rows, each with its source (Dataset.sources) for per-source reports:

- sim/<scenario>: the expert driving with a plan, sensed by the simulator's own sensors (every
  feature, 200 Hz): what closed-loop driving with the built-in planner looks like;
- realistic/<scenario>: a population of drivers sensed as real stacks sense (sim.realism: 10-100 Hz,
  latency, noise, sensor profiles with missing features), most of them without a plan;
- log/<dataset>: recorded human drives (controller.training.logs), added with `add_logs`.

Labels are the look-ahead band of the measured speed (executor.action_labels), as a recorded
human's are. One exception: the relabelled rows of sim/ drives (DataConfig.relabel_targets) pair a
recorded state with a target speed the ego did not drive at, so no future speed exists for them;
their label is the band of the expert's command for that target.

Splits are disjoint by episode seed (never by time step): neighbouring steps of one episode are
near-duplicates, so a per-step split would leak the test set into training. Recorded drives split by
session (controller.training.logs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from dualloop.executor.history import HistoryDeriver, episode_history
from dualloop.executor.model_card import ModelCard
from dualloop.sim import schema
from dualloop.sim.env import ActionNoise, ExpertData, run_expert_batch
from dualloop.sim.realism import RealismConfig, run_realistic_batch
from dualloop.sim.scenarios import NOMINAL_SCENARIOS
from dualloop.sim.sensors import TRAINING_SEES_LANE_ENDS

SPLITS: tuple[str, ...] = ("train", "val", "test")
# Seed layout: root seed * _ROOT + split offset + kind offset + scenario * _SCENARIO + episode.
# Disjoint as long as a split has fewer than _SCENARIO episodes per scenario (checked in DataConfig)
# and there are fewer than 15 scenarios.
_ROOT = 1_000_000
_SPLIT_OFFSET = {"train": 0, "val": 300_000, "test": 600_000}
_REALISTIC_OFFSET = 150_000
_SCENARIO = 10_000

F32 = npt.NDArray[np.float32]


@dataclass(frozen=True)
class DataConfig:
    """How much simulated data to generate; episode counts are per scenario."""

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
    # realistic/ drives (sim.realism) per scenario and split; 0 for none
    realistic_episodes: tuple[int, int, int] = (96, 24, 24)
    realism: RealismConfig = RealismConfig()
    # History features (executor.history) every row gets, derived from its drive's observation
    # stream as the executor derives them; () for a model that sees one observation.
    history: tuple[str, ...] = ()
    # With `dualloop train --dagger`: the first model's own drives per nominal scenario, labelled
    # by the expert (controller.training.dagger), added to train.
    dagger_episodes: int = 48

    def __post_init__(self) -> None:
        counts = (self.train_episodes, self.val_episodes, self.test_episodes)
        if min(counts) < 1 or max(counts) >= _SCENARIO:
            raise ValueError(f"episodes per split must be in [1, {_SCENARIO}), got {counts}")
        if min(self.realistic_episodes) < 0 or max(self.realistic_episodes) >= _SCENARIO:
            raise ValueError(f"realistic episodes per split must be in [0, {_SCENARIO}), got {self.realistic_episodes}")
        if self.every < 1:
            raise ValueError(f"every must be >= 1, got {self.every}")

    def episodes(self, split: str) -> int:
        return {"train": self.train_episodes, "val": self.val_episodes, "test": self.test_episodes}[split]

    def realistic(self, split: str) -> int:
        return self.realistic_episodes[SPLITS.index(split)]


@dataclass(frozen=True)
class Split:
    """Flat (N, ...) rows of one split.

    features: NaN where not measured (present False); controls: NaN where the target is unknown (a
    recorded drive's steering), which leaves it out of the controls loss; weight: the row's weight
    in every loss (recorded drives carry a set share of the total, DataConfig-independent)."""

    features: F32
    present: npt.NDArray[np.bool_]
    plan: F32
    label: npt.NDArray[np.int64]
    controls: F32
    source: npt.NDArray[np.int16]  # index into Dataset.sources
    weight: F32
    history: F32  # (N, H) history features (DataConfig.history), derived from each row's drive

    def __len__(self) -> int:
        return int(self.label.shape[0])

    def subset(self, idx: npt.NDArray[np.int64] | npt.NDArray[np.bool_]) -> Split:
        return Split(*(getattr(self, f)[idx] for f in _FIELDS))

    def class_counts(self) -> npt.NDArray[np.int64]:
        return np.bincount(self.label, minlength=schema.N_ACTIONS)


_FIELDS = ("features", "present", "plan", "label", "controls", "source", "weight", "history")


def empty_split() -> Split:
    n, p = schema.N_FEATURES, schema.N_PLAN
    return Split(
        np.zeros((0, n), np.float32),
        np.zeros((0, n), bool),
        np.zeros((0, p), np.float32),
        np.zeros(0, np.int64),
        np.zeros((0, 2), np.float32),
        np.zeros(0, np.int16),
        np.zeros(0, np.float32),
        np.zeros((0, 0), np.float32),
    )


def make_split(
    features: np.ndarray,
    present: np.ndarray,
    plan: np.ndarray,
    label: np.ndarray,
    controls: np.ndarray,
    source: int,
    weight: float = 1.0,
    history: np.ndarray | None = None,
) -> Split:
    n = len(label)
    return Split(
        np.ascontiguousarray(features, np.float32),
        np.ascontiguousarray(np.broadcast_to(present, (n, schema.N_FEATURES)), bool),
        np.ascontiguousarray(np.broadcast_to(plan, (n, schema.N_PLAN)), np.float32),
        np.ascontiguousarray(label, np.int64),
        np.ascontiguousarray(controls, np.float32),
        np.full(n, source, np.int16),
        np.full(n, weight, np.float32),
        np.zeros((n, 0), np.float32) if history is None else np.ascontiguousarray(history, np.float32),
    )


def concat(parts: Sequence[Split]) -> Split:
    parts = [p for p in parts if len(p)]  # an empty part's history has no width to agree on
    if not parts:
        return empty_split()
    return Split(*(np.concatenate([getattr(p, f) for p in parts]) for f in _FIELDS))


@dataclass(frozen=True)
class Dataset:
    train: Split
    val: Split
    test: Split
    config: DataConfig
    seed: int
    seeds: dict[str, list[int]] = field(default_factory=dict)  # per split, all scenarios and kinds
    sources: tuple[str, ...] = ()
    logs: dict[str, str] = field(default_factory=dict)  # what add_logs took: card-ready facts

    def split(self, name: str) -> Split:
        return {"train": self.train, "val": self.val, "test": self.test}[name]

    def source_rows(self, split: str, prefix: str) -> npt.NDArray[np.bool_]:
        """Rows of a split whose source name starts with prefix ("sim/", "realistic/", "log/")."""
        ids = [i for i, s in enumerate(self.sources) if s.startswith(prefix)]
        return np.isin(self.split(split).source, ids)


def split_seeds(seed: int, split: str, scenario_index: int, n: int, realistic: bool = False) -> list[int]:
    start = seed * _ROOT + _SPLIT_OFFSET[split] + scenario_index * _SCENARIO + (_REALISTIC_OFFSET if realistic else 0)
    return list(range(start, start + n))


def _flatten(
    features: np.ndarray,
    plan: np.ndarray,
    label: np.ndarray,
    controls: np.ndarray,
    keep: np.ndarray,
    source: int,
    history: np.ndarray | None = None,
) -> Split:
    keep = keep.reshape(-1)
    return make_split(
        features.reshape(-1, schema.N_FEATURES)[keep],
        np.ones(schema.N_FEATURES, bool),
        plan.reshape(-1, schema.N_PLAN)[keep],
        label.reshape(-1)[keep],
        controls.reshape(-1, 2)[keep],
        source,
        history=None if history is None else history.reshape(-1, history.shape[-1])[keep],
    )


def deriver(names: Sequence[str]) -> HistoryDeriver | None:
    return HistoryDeriver(names, schema.FEATURE_NAMES) if names else None


def _sim_rows(name: str, config: DataConfig, per_split: dict[str, list[int]], source: int) -> dict[str, list[Split]]:
    """The expert with a plan on the simulator's sensors; all splits in one batch (episodes do not
    depend on their batch, and one big batch is much cheaper than three small ones)."""
    params: dict[str, Any] = {} if config.duration_s is None else {"duration_s": config.duration_s}
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
    label = data.lookahead_label()
    hist = deriver(config.history)
    history = None if hist is None else _stream_history(hist, name, all_seeds, config, params, data)
    out: dict[str, list[Split]] = {s: [] for s in SPLITS}
    start = 0
    for s in SPLITS:
        sl = slice(start, start + len(per_split[s]))
        start = sl.stop
        driven = data.valid[sl] & (label[sl] >= 0)
        h = None if history is None else history[sl]
        out[s].append(_flatten(data.features[sl], data.plan[sl], label[sl], data.controls[sl], driven, source, h))
        if data.alt_plan is not None and data.alt_label is not None and data.alt_controls is not None:
            # no future exists under a target the ego did not drive at: the expert's command for it
            out[s].append(
                _flatten(
                    data.features[sl],
                    data.alt_plan[sl],
                    data.alt_label[sl],
                    data.alt_controls[sl],
                    data.valid[sl],
                    source,
                    h,
                )
            )
    return out


def _stream_history(
    hist: HistoryDeriver, name: str, seeds: list[int], config: DataConfig, params: dict[str, Any], data: ExpertData
) -> np.ndarray:
    """(B, T, H) history features of the recorded steps, derived from every 5 ms observation as the
    executor receives the simulator's 200 Hz sensors (its bins average 20 observations; the recorded
    steps alone would give it 2 of them, a noisier feature than the executor ever sees). The same
    episodes again, recorded at every step (recording does not change the driving: checked)."""
    _, full = run_expert_batch(
        name, seeds, every=1, noise=config.noise, see_lane_ends=TRAINING_SEES_LANE_ENDS, relabel=False, **params
    )
    picked = full.features[:, :: config.every]
    if not np.array_equal(picked[data.valid], data.features[data.valid]):
        raise RuntimeError(
            f"{name}: the episodes recorded at every step differ from those recorded every {config.every}"
        )
    return episode_history(hist, full.t, full.features, full.valid)[:, :: config.every]


def _realistic_rows(
    name: str, config: DataConfig, per_split: dict[str, list[int]], source: int
) -> dict[str, list[Split]]:
    params: dict[str, Any] = {} if config.duration_s is None else {"duration_s": config.duration_s}
    all_seeds = [x for s in SPLITS for x in per_split[s]]
    out: dict[str, list[Split]] = {s: [] for s in SPLITS}
    if not all_seeds:
        return out
    data = run_realistic_batch(name, all_seeds, config.realism, history=deriver(config.history), **params)
    start = 0
    for s in SPLITS:
        rows = (data.episode >= start) & (data.episode < start + len(per_split[s]))
        start += len(per_split[s])
        out[s].append(
            make_split(
                data.features[rows],
                data.present[rows],
                data.plan[rows],
                data.label[rows],
                data.controls[rows],
                source,
                history=None if data.history is None else data.history[rows],
            )
        )
    return out


def generate(config: DataConfig, seed: int, on_scenario: Callable[[str], None] | None = None) -> Dataset:
    """Simulated rows of every scenario: sim/ and realistic/ drives, split by seed."""
    parts: dict[str, list[Split]] = {s: [] for s in SPLITS}
    seeds: dict[str, list[int]] = {s: [] for s in SPLITS}
    sources: list[str] = []
    for si, name in enumerate(config.scenarios):
        for realistic in (False, True):
            count = config.realistic if realistic else config.episodes
            per_split = {s: split_seeds(seed, s, si, count(s), realistic) for s in SPLITS}
            if not any(per_split.values()):
                continue
            sources.append(f"{'realistic' if realistic else 'sim'}/{name}")
            rows = (_realistic_rows if realistic else _sim_rows)(name, config, per_split, len(sources) - 1)
            for s in SPLITS:
                parts[s] += rows[s]
                seeds[s] += per_split[s]
        if on_scenario is not None:
            on_scenario(name)
    splits = {s: concat(parts[s]) for s in SPLITS}
    return Dataset(splits["train"], splits["val"], splits["test"], config, seed, seeds, tuple(sources))


def add_logs(data: Dataset, by_split: dict[str, dict[str, Split]], share: float, facts: dict[str, str]) -> Dataset:
    """The dataset with recorded rows added: by_split[split][dataset name] -> rows (source index
    ignored). In train (and val alike), the recorded rows carry `share` of the total weight, each
    dataset in proportion to the square root of its rows (a small dataset is not drowned, a single
    short drive does not dominate)."""
    if not 0.0 <= share < 1.0:
        raise ValueError(f"the recorded drives' share of the weight must be in [0, 1), got {share}")
    names = sorted({n for per in by_split.values() for n in per})
    sources = data.sources + tuple(f"log/{n}" for n in names)
    out = {}
    for s in SPLITS:
        base = data.split(s)
        per = by_split.get(s, {})
        present = [n for n in names if n in per and len(per[n])]
        if not present:
            out[s] = base
            continue
        sim_weight = float(base.weight.sum())
        root = {n: np.sqrt(len(per[n])) for n in present}
        log_weight = share / (1.0 - share) * sim_weight if sim_weight > 0 else float(sum(len(per[n]) for n in present))
        added = []
        for n in present:
            w = log_weight * root[n] / sum(root.values()) / len(per[n])
            rows = per[n]
            added.append(
                replace(
                    rows,
                    source=np.full(len(rows), sources.index(f"log/{n}"), np.int16),
                    weight=np.full(len(rows), w, np.float32),
                )
            )
        out[s] = concat([base, *added])
    return replace(data, train=out["train"], val=out["val"], test=out["test"], sources=sources, logs=dict(facts))


@dataclass(frozen=True)
class Normaliser:
    """(x - mean) / std exactly as the executor applies it (executor.model_card.Normalisation): float32
    mean, float32(1 / std); a missing feature is fed as its mean (0 normalised).

    Statistics are rounded to float32 before they go into the card, so the card's JSON floats, the
    trainer and the executor all use the same numbers. A feature's statistics are over the rows that
    measure it.
    """

    feat_mean: npt.NDArray[np.float64]
    feat_std: npt.NDArray[np.float64]
    plan_mean: npt.NDArray[np.float64]
    plan_std: npt.NDArray[np.float64]
    mask_input: bool = True
    # history features after the wire features (executor.history): names and statistics
    history: tuple[str, ...] = ()
    hist_mean: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    hist_std: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))

    @staticmethod
    def _stats(x: np.ndarray, present: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        x = x.astype(np.float64)
        if present is not None:
            x = np.where(present, x, np.nan)
        with np.errstate(invalid="ignore"):
            mean = np.nan_to_num(np.nanmean(x, axis=0))
            std = np.nan_to_num(np.nanstd(x, axis=0))
        # A constant column (e.g. a behaviour the expert never chose) would get std ~0 and blow an
        # unseen value up to 1e6 at run time; pass it through unscaled instead.
        std = np.where(std < 1e-3, 1.0, std)
        return mean.astype(np.float32).astype(np.float64), std.astype(np.float32).astype(np.float64)

    @classmethod
    def fit(cls, split: Split, mask_input: bool = True, history: tuple[str, ...] = ()) -> Normaliser:
        fm, fs = cls._stats(split.features, split.present)
        pm, ps = cls._stats(split.plan)
        if not history:
            return cls(fm, fs, pm, ps, mask_input)
        hm, hs = cls._stats(split.history, cls._history_present(history, split.present))
        return cls(fm, fs, pm, ps, mask_input, tuple(history), hm, hs)

    @staticmethod
    def _history_present(history: tuple[str, ...], present: np.ndarray) -> np.ndarray:
        d = deriver(history)
        assert d is not None
        out = d.present(np.asarray(present, bool))
        assert out is not None
        return out

    @classmethod
    def from_card(cls, card: ModelCard) -> Normaliser:
        def arr(specs: list[Any], attr: str) -> np.ndarray:
            return np.array([getattr(s, attr) for s in specs], np.float64)

        return cls(
            arr(card.features, "mean"),
            arr(card.features, "std"),
            arr(card.plan, "mean"),
            arr(card.plan, "std"),
            card.mask_input,
            tuple(card.history_names),
            arr(card.history_features, "mean"),
            arr(card.history_features, "std"),
        )

    @staticmethod
    def _apply(x: np.ndarray, mean: np.ndarray, std: np.ndarray) -> F32:
        inv = np.array([1.0 / s for s in std], np.float32)  # same rounding as executor.model_card.Normalisation
        out = np.subtract(np.asarray(x, np.float32), mean.astype(np.float32))
        out *= inv
        return out

    def apply(
        self,
        features: np.ndarray,
        plan: np.ndarray,
        present: np.ndarray | None = None,
        history: np.ndarray | None = None,
    ) -> tuple[F32, F32]:
        """Normalised (features, plan) as Normalisation.apply gives them: missing features 0; with
        history features, the features are [wire, history] and `present` is the wire profile."""
        if self.history:
            assert history is not None, "this normaliser's model takes history features"
            features = np.concatenate([np.asarray(features, np.float32), np.asarray(history, np.float32)], axis=1)
            present = self.full_present(present, len(features))
        xn = self._apply(features, np.r_[self.feat_mean, self.hist_mean], np.r_[self.feat_std, self.hist_std])
        if present is not None:
            np.copyto(xn, np.float32(0.0), where=~np.asarray(present, bool))
        return xn, self._apply(plan, self.plan_mean, self.plan_std)

    def full_present(self, present: np.ndarray | None, n: int) -> np.ndarray:
        wire = np.ones((n, len(self.feat_mean)), bool) if present is None else np.asarray(present, bool)
        wire = np.broadcast_to(wire, (n, len(self.feat_mean)))
        return np.concatenate([wire, self._history_present(self.history, wire)], axis=1)

    def graph_inputs(
        self,
        features: np.ndarray,
        plan: np.ndarray,
        present: np.ndarray | None = None,
        history: np.ndarray | None = None,
    ) -> tuple[F32, F32]:
        """The ONNX graph's (features, plan) inputs: with mask_input the features input is
        [normalised features, present as 0/1], as executor.model_runner.DecisionModel.forward builds it
        (history features after the wire features in both)."""
        xn, pn = self.apply(features, plan, present, history)
        if self.mask_input:
            if self.history:
                mask = self.full_present(present, len(xn)).astype(np.float32)
            else:
                mask = np.ones(xn.shape, np.float32) if present is None else np.asarray(present, np.float32)
            xn = np.concatenate([xn, mask], axis=1)
        return xn, pn

    def inputs(self, split: Split) -> F32:
        """The trainer's input: concat(graph features input, plan), as the ONNX graph's Concat does."""
        f, p = self.graph_inputs(split.features, split.plan, split.present, split.history if self.history else None)
        return np.ascontiguousarray(np.concatenate([f, p], axis=1), np.float32)
