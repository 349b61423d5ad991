"""The plan a session decides with while it has no valid plan (none yet, or its plan expired).

A model card gives it as `plan_default`, and may name plan fields raised to a feature of the
session's newest observation (`plan_default_at_least`, plan field -> feature). The shipped recipe
raises target_speed to ego_speed: no plan never asks the car to slow down. A fixed 25 m/s target
made a motorway drive at 37 m/s look 12 m/s too fast to the model, which proposed braking hard where
the driver cruised (docs/transfer.md). Below 25 m/s the target stays 25: a target that fell with the
speed looked, near standstill, like a stop plan's 0 m/s, and a model trained so braked too softly
behind a stopped car. A feature that is not measured (its sensor profile says so, or it is not
finite) leaves plan_default's value in place.

One rule for every user of a model: the executor's live and vectorised paths, the training rows of
recorded and simulated drives without a plan, the gate fits and the offline scoring.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dualloop.executor.model_card import ModelCard

F32 = npt.NDArray[np.float32]


@dataclass(frozen=True)
class DefaultPlan:
    values: F32  # (P,) plan_default
    plan_index: npt.NDArray[np.intp]  # (K,) the plan fields raised to the observation's features
    feature_index: npt.NDArray[np.intp]  # (K,) those features

    @classmethod
    def named(
        cls,
        default: npt.ArrayLike,
        plan_names: Sequence[str],
        feature_names: Sequence[str],
        raised_to: Mapping[str, str],
    ) -> DefaultPlan:
        pairs = sorted((list(plan_names).index(p), list(feature_names).index(f)) for p, f in raised_to.items())
        return cls(
            np.asarray(default, np.float32),
            np.array([p for p, _ in pairs], np.intp),
            np.array([f for _, f in pairs], np.intp),
        )

    @classmethod
    def of(cls, card: ModelCard) -> DefaultPlan:
        return cls.named(card.plan_default, [p.name for p in card.plan], card.feature_names, card.plan_default_at_least)

    @property
    def fixed(self) -> bool:
        """Whether the plan is the same for every observation (plan_default as it is)."""
        return self.plan_index.size == 0

    def rows(self, features: npt.NDArray[np.floating], present: npt.NDArray[np.bool_] | None = None) -> F32:
        """(n, P) the default plan of each observation row `features` (n, F) (the wire features first);
        `present` (n, F) bool or None (all measured): the rows' sensor profiles."""
        out = np.tile(self.values, (len(features), 1))
        if not self.fixed:
            taken = features[:, self.feature_index].astype(np.float32)
            ok = np.isfinite(taken)
            if present is not None:
                ok &= present[:, self.feature_index]
            default = out[:, self.plan_index]
            out[:, self.plan_index] = np.where(ok, np.maximum(taken, default), default)
        return out

    def fill(
        self,
        plans: F32,
        where: npt.NDArray[np.bool_],
        features: npt.NDArray[np.floating],
        present: npt.NDArray[np.bool_] | None,
    ) -> None:
        """Overwrite plans[where] (rows without a valid plan) in place with each row's default plan."""
        if self.fixed:
            plans[where] = self.values
        else:
            plans[where] = self.rows(features[where], None if present is None else present[where])
