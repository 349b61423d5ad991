"""Why a tick's proposal is not to be trusted as it is: the reasons a tick finds before the safe-state
machine, as bit flags. The live tick and the vectorised replay both call `ReasonRules.flags`, so
the rule has one definition; the safe-state machine may add FALLBACK/SAFE_DEFAULT afterwards."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from dualloop.executor.snapshot import PlanState, Reason

# A tick's reasons before the safe-state machine, in the order snapshots list them.
TICK_REASONS = (
    Reason.INVALID_INPUT,
    Reason.MODEL_ERROR,
    Reason.STALE_OBSERVATION,
    Reason.STALE_PLAN,
    Reason.OOD_VETO,
    Reason.LOW_MARGIN,
)
REASON_BITS = {r: 1 << k for k, r in enumerate(TICK_REASONS)}
# flags -> the reasons they stand for, in TICK_REASONS order (a lookup per row, not a loop over bits)
REASONS_OF_FLAGS = [tuple(r for r in TICK_REASONS if flags & REASON_BITS[r]) for flags in range(1 << len(TICK_REASONS))]

_INVALID = REASON_BITS[Reason.INVALID_INPUT]
_MODEL_ERROR = REASON_BITS[Reason.MODEL_ERROR]
_STALE_OBSERVATION = REASON_BITS[Reason.STALE_OBSERVATION]
_STALE_PLAN = REASON_BITS[Reason.STALE_PLAN]
_OOD_VETO = REASON_BITS[Reason.OOD_VETO]
_LOW_MARGIN = REASON_BITS[Reason.LOW_MARGIN]


class ReasonRules:
    """The limits the reasons are judged by (from ExecutorConfig), and the rule itself."""

    def __init__(self, max_observation_age_ns: int, max_plan_age_ns: int, min_margin: float) -> None:
        self.max_observation_age_ns = max_observation_age_ns
        self.max_plan_age_ns = max_plan_age_ns
        self.min_margin = min_margin

    def flags(
        self,
        finite: npt.NDArray[np.bool_],
        model_ok: npt.NDArray[np.bool_],
        age_ns: npt.NDArray[np.int64],
        stale_plan: npt.NDArray[np.bool_],
        veto: npt.NDArray[np.bool_],
        margin: npt.NDArray[np.floating],
        observation_period_ns: npt.NDArray[np.int64] | int = 0,
        invalid_content: npt.NDArray[np.bool_] | None = None,
    ) -> npt.NDArray[np.int64]:
        """Why each row's proposal is not to be trusted as it is, as REASON_BITS. LOW_MARGIN only on
        rows the model scored (finite input, working model): elsewhere the margin means nothing.
        An observation is late when older than its session's observation period plus the allowance.
        invalid_content: the row's observation had a discarded non-finite plan or actual controls
        (INVALID_INPUT as for non-finite features: one rule for invalid input)."""
        scored = finite & model_ok
        flags: npt.NDArray[np.int64] = np.where(finite, 0, _INVALID)
        if invalid_content is not None:
            flags |= np.where(invalid_content, _INVALID, 0)
        flags |= np.where(model_ok, 0, _MODEL_ERROR)
        flags |= np.where(age_ns > observation_period_ns + self.max_observation_age_ns, _STALE_OBSERVATION, 0)
        flags |= np.where(stale_plan, _STALE_PLAN, 0)
        flags |= np.where(veto, _OOD_VETO, 0)
        low = np.asarray(margin, np.float64) < self.min_margin  # float64, as the config states it
        flags |= np.where(scored & low, _LOW_MARGIN, 0)
        return flags


def plan_rule(
    has_plan: npt.NDArray[np.bool_],
    age_ns: npt.NDArray[np.int64],
    valid_for_ns: npt.NDArray[np.int64],
    require_plan: bool | npt.NDArray[np.bool_],
    expired_is_stale: bool | npt.NDArray[np.bool_],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """The one plan rule (docs/contract.md#plans), per row: (PlanState values, valid, stale).

    A plan is valid while its age (sensor time: the tick's observation timestamp minus the plan's
    creation) is at most its validity. Without a valid plan the model sees the no-plan default;
    that is STALE_PLAN when the session requires plans, or, for an expired plan, when the server's
    planner makes them (its failing to refresh one is a fault)."""
    valid = has_plan & (age_ns <= valid_for_ns)
    state = np.where(~has_plan, int(PlanState.NONE), np.where(valid, int(PlanState.VALID), int(PlanState.EXPIRED)))
    stale = ~valid & (require_plan | (has_plan & expired_is_stale))
    return state.astype(np.int64), valid, stale
