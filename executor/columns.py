"""A replay's observations as columns: one array per field instead of one Observation per sample.

A 60 s log holds 6,000-12,000 observations; building an Observation (and before it a protobuf
message) for each cost more than replaying them. `ObservationColumns` holds the same values as
arrays and is still a `Sequence[Observation]` (an item is made when asked for), so code that has not
learnt the columns keeps working; the replay's hot paths (`lockstep_batch`, the report, the
evaluation, the snapshot encoder) read the arrays. It covers observations with nothing discarded on
receipt: client plans only when all their values are finite (a non-finite plan, discarded on
receipt, keeps the Observation path).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np
import numpy.typing as npt

from dualloop.executor.snapshot import Observation


@dataclass(frozen=True, eq=False)
class PlanColumns:
    """The client plans the observations carried, row i = observation i; every value finite."""

    present: npt.NDArray[np.bool_]  # (N,) the observation carried a plan
    plan_id: list[str]  # (N,) "" without a plan
    values: npt.NDArray[np.float32]  # (N, P): P values on every plan (P may be 0); zeros without one
    valid_for_ns: npt.NDArray[np.int64]  # (N,) 0: the executor's default validity
    created_ns: npt.NDArray[np.int64]  # (N,) 0: the observation's timestamp


@dataclass(frozen=True, eq=False)
class ObservationColumns(Sequence[Observation]):
    """Row i is observation i (as `observation_from_proto(msg, 0)` gives it): arrival 0, no history,
    nothing discarded."""

    seq: npt.NDArray[np.int64]  # (N,)
    timestamp_ns: npt.NDArray[np.int64]  # (N,)
    features: npt.NDArray[np.float32]  # (N, F)
    actual_present: npt.NDArray[np.bool_]  # (N,) the observation carried an actual action
    actual_index: npt.NDArray[np.int64]  # (N,) -1 without one
    actual_controls: npt.NDArray[np.float32]  # (N, K): K controls on every actual action (K may be 0)
    sent_time_ns: npt.NDArray[np.int64]  # (N,)
    plans: PlanColumns | None = None  # None: no observation carried a plan

    def __len__(self) -> int:
        return len(self.seq)

    @overload
    def __getitem__(self, i: int) -> Observation: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[Observation]: ...

    def __getitem__(self, i: int | slice) -> Observation | Sequence[Observation]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        present = bool(self.actual_present[i])
        plan = self.plans if self.plans is not None and self.plans.present[i] else None
        return Observation(
            seq=int(self.seq[i]),
            timestamp_ns=int(self.timestamp_ns[i]),
            features=self.features[i].copy(),
            actual_index=int(self.actual_index[i]),
            actual_controls=self.actual_controls[i].copy() if present else None,
            sent_time_ns=int(self.sent_time_ns[i]),
            plan_id=plan.plan_id[i] if plan is not None else "",
            plan_values=plan.values[i].copy() if plan is not None else None,
            plan_valid_for_ns=int(plan.valid_for_ns[i]) if plan is not None else 0,
            plan_created_ns=int(plan.created_ns[i]) if plan is not None else 0,
        )

    def __iter__(self) -> Iterator[Observation]:
        return (self[i] for i in range(len(self)))

    def actual_controls_or_nan(self, n_ctl: int) -> npt.NDArray[np.float64]:
        """(N, n_ctl) float64: each observation's actual controls, NaN rows where it has none of that
        size (what the report and the evaluation read per observation)."""
        out = np.full((len(self), n_ctl), np.nan)
        if self.actual_controls.shape[1] == n_ctl:
            out[self.actual_present] = self.actual_controls[self.actual_present]
        return out


def as_columns(observations: Sequence[Observation]) -> ObservationColumns | None:
    """The columns when `observations` already are columns, else None (the Observation path)."""
    return observations if isinstance(observations, ObservationColumns) else None
