"""Rows from the model's own driving, labelled by the expert (one DAgger round, Ross et al. 2011).

`dualloop train --dagger N` trains a model, drives the nominal scenarios with it in closed loop
(controller.training.rollouts), asks the expert what it would do in every state the model reached,
adds those rows to the training split and trains again from scratch with the same seed; N rounds,
each on new seeds, the rows of every round kept (DAgger's aggregate). Imitation
from the expert's own drives, even noise-perturbed ones, never shows the states a slightly
different driver drifts into: the first model left the road braking hard behind a lead, steering
too little, in 11 of 144 nominal episodes that the expert drives cleanly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from dualloop.controller.training.data import (
    DataConfig,
    Dataset,
    Split,
    concat,
    deriver,
    make_split,
    split_seeds,
)
from dualloop.controller.training.rollouts import run_model_batch
from dualloop.executor.history import episode_history
from dualloop.executor.model_runner import DecisionModel
from dualloop.sim.schema import N_FEATURES
from dualloop.sim.sensors import TRAINING_SEES_LANE_ENDS

# The model's roll-outs take seeds from their scenario's block of training seeds, past the expert's
# (DataConfig keeps those below this offset).
DAGGER_SEED_OFFSET = 5_000


def dagger_seeds(seed: int, scenario_index: int, n: int, round_index: int = 0) -> list[int]:
    return [s + DAGGER_SEED_OFFSET + round_index * n for s in split_seeds(seed, "train", scenario_index, n)]


def dagger_rows(
    model_path: Path,
    config: DataConfig,
    seed: int,
    source: int,
    round_index: int = 0,
    on_scenario: Callable[[str], None] | None = None,
) -> tuple[Split, dict[str, int]]:
    """Training rows of the model's own nominal drives, every `config.every`-th step, labelled with
    the expert's action; and how many of the drives the model crashed or left the road in (each
    drive's rows end there)."""
    if config.train_episodes > DAGGER_SEED_OFFSET or (round_index + 1) * config.dagger_episodes > DAGGER_SEED_OFFSET:
        raise ValueError(
            f"DAgger seeds start at offset {DAGGER_SEED_OFFSET} of a scenario's block: at most that many training "
            "episodes, and DAgger episodes over all rounds"
        )
    params: dict[str, Any] = {} if config.duration_s is None else {"duration_s": config.duration_s}
    model = DecisionModel(model_path)
    hist = deriver(config.history)
    parts: list[Split] = []
    failed: dict[str, int] = {}
    for si, name in enumerate(config.scenarios):
        seeds = dagger_seeds(seed, si, config.dagger_episodes, round_index)
        metrics, data = run_model_batch(model, name, seeds, see_lane_ends=TRAINING_SEES_LANE_ENDS, **params)
        failed[name] = sum(1 for m in metrics if m.collisions or m.off_road)
        pick = (slice(None), slice(None, None, config.every))
        history = None if hist is None else episode_history(hist, data.t, data.features, data.valid)[pick]
        keep = data.valid[pick].reshape(-1)
        parts.append(
            make_split(
                data.features[pick].reshape(-1, N_FEATURES)[keep],
                np.ones(N_FEATURES, bool),
                data.plan[pick].reshape(-1, data.plan.shape[-1])[keep],
                data.label[pick].reshape(-1)[keep],
                data.controls[pick].reshape(-1, 2)[keep],
                source,
                history=None if history is None else history.reshape(-1, history.shape[-1])[keep],
            )
        )
        if on_scenario is not None:
            on_scenario(f"dagger/{name}")
    return concat(parts), failed


def with_dagger(data: Dataset, rows: Split) -> Dataset:
    """The dataset with the DAgger rows added to its training split (source "dagger/")."""
    sources = (*data.sources, "dagger/nominal")
    rows = replace(rows, source=np.full(len(rows), len(sources) - 1, np.int16))
    return replace(data, train=concat([data.train, rows]), sources=sources)
