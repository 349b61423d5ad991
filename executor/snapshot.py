"""What flows through the executor: observations in, decision snapshots out (plain dataclasses).

The numeric values of the enums equal the wire enums in proto/dualloop/v2/controller.proto
(tests/proto/test_proto.py checks it), so conversion is a cast and the executor needs no wire import.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

INT64_MAX = 2**63 - 1  # the wire's int64 fields: an age or delay beyond it is sent saturated


class Clock(enum.IntEnum):
    REALTIME = 1
    LOCKSTEP = 2


class Reason(enum.IntEnum):
    OOD_VETO = 1
    LOW_MARGIN = 2
    STALE_OBSERVATION = 3
    STALE_PLAN = 4
    INVALID_INPUT = 5
    MODEL_ERROR = 6
    FALLBACK = 7
    SAFE_DEFAULT = 8
    THREAT_BRAKING = 9  # braking beyond the safe side's profile for a trusted threat (executor/threat.py)
    STANDSTILL_HOLD = 10  # the minimal-risk manoeuvre stopped the vehicle: stopped until released
    STOPPED_LEAD_HOLD = 11  # at rest behind a stopped lead: no positive command (executor/standstill.py)


class SafetyState(enum.IntEnum):
    NOMINAL = 1
    VETO_HOLD = 2
    FALLBACK_ACTIVE = 3
    RECOVERING = 4


class PlanState(enum.IntEnum):
    """Whether a tick had a valid plan (the wire's PLAN_STATE_* values)."""

    NONE = 1  # no plan received yet: the model's no-plan default
    VALID = 2
    EXPIRED = 3  # older than its validity (sensor time)


class Check(enum.IntEnum):
    """The checks a tick can run (docs/contract.md#checks)."""

    DECISION_VECTOR_DENSITY = 1
    INPUT_DENSITY = 2
    INPUT_RANGE = 3
    INPUT_CHANGE = 4
    PLAN_RANGE = 5
    FREEZE = 6
    ACTUATION = 7
    MARGIN = 8
    SIGNAL_STUCK = 9
    SPEED_ACCEL = 10
    GAP_RATE = 11
    LEAD_FLICKER = 12
    SPEED_REPEAT = 13
    GAP_REPEAT = 14
    GAP_STEP = 15
    REL_ACCEL = 16
    REL_UNIT = 17
    REL_SIGN = 18


class CheckStatus(enum.IntEnum):
    SCORED = 1
    NOT_APPLICABLE = 2
    NOT_SCORED = 3


# One row of a tick's raw inputs as the safe side reads it, value by value: a numpy row, or (at many
# sessions, where indexing a numpy row per value shows) the same values as Python floats.
FeatureRow = np.ndarray | Sequence[float]

# One tick's check results, one entry per configured check (Snapshot.check_kinds); a batch's are one
# (rows, checks) array of this dtype and each snapshot holds its row, a view (no per-check objects).
CHECK_DTYPE = np.dtype([("score", np.float64), ("threshold", np.float64), ("veto", np.bool_), ("status", np.int8)])


# Snapshot fields whose values come from the wall clock by nature; everything else is a pure
# function of the inputs in LOCKSTEP and must replay byte-identically.
WALL_CLOCK_FIELDS = (
    "emit_time_ns",
    "lateness_us",
    "timings",
    "max_lateness_since_previous_us",
    "transport_delay_ns",
    "observation_age_with_transport_ns",
)


@dataclass(slots=True)
class Observation:
    seq: int
    timestamp_ns: int
    features: np.ndarray  # float32, model feature order
    arrival_ns: int = 0  # server monotonic clock at receipt (REALTIME age is measured from here)
    actual_index: int = -1  # shadow mode: what the vehicle did
    actual_controls: np.ndarray | None = None
    plan_id: str = ""  # a plan made by the client (its own planner), with its values in plan order
    plan_values: np.ndarray | None = None
    sent_time_ns: int = 0  # client wall clock (Unix epoch) when sent; 0: not given
    received_wall_ns: int = 0  # server wall clock (Unix epoch) at receipt, for the transport delay
    plan_valid_for_ns: int = 0  # 0: the executor's default plan validity
    plan_created_ns: int = 0  # sensor time; 0: this observation's timestamp
    # Parts that held a non-finite value and were discarded on receipt ("plan"):
    # content errors never end a stream, the ticks on this observation report INVALID_INPUT.
    invalid_parts: tuple[str, ...] = ()
    # The history features (executor.history) the executor derived for this observation from the
    # session's stream; None for a model without them (set by the executor, never by a client: on
    # receipt in LOCKSTEP, by the first REALTIME tick that uses the observation).
    history: np.ndarray | None = None
    # The client releases a standstill hold (the minimal-risk manoeuvre's stop) from this observation's
    # first tick on; nothing else ends one.
    release_standstill: bool = False


@dataclass(slots=True)
class StageTimings:
    preprocess_us: int = 0
    forward_us: int = 0
    gate_us: int = 0
    postprocess_us: int = 0


@dataclass(slots=True)
class AppliedAction:
    index: int
    name: str
    controls: np.ndarray

    def with_control(self, i: int, value: float) -> AppliedAction:
        """The same action with control `i` set to `value` (as the controls' dtype); self unchanged."""
        controls = self.controls.copy()
        controls[i] = value
        return AppliedAction(self.index, self.name, controls)


@dataclass(slots=True)
class CandidateProposal:
    """A candidate model's proposal on a tick, beside the live model's: recorded, never applied
    (executor.candidate). index -1 (and an empty name and controls): the input could not be scored."""

    model_version: str
    index: int
    name: str
    controls: np.ndarray
    confidence: float
    margin: float


@dataclass(slots=True)
class Snapshot:
    session_id: str
    tick: int
    scheduled_time_ns: int
    emit_time_ns: int
    lateness_us: int
    observation_seq: int
    observation_age_ns: int
    model_version: str
    # The model's proposal; index -1 and empty arrays when the input could not be scored.
    proposed_index: int
    proposed_name: str
    probabilities: np.ndarray
    proposed_controls: np.ndarray
    confidence: float
    margin: float
    applied: AppliedAction
    reasons: tuple[Reason, ...]
    safety_state: SafetyState
    input_hash: int
    timings: StageTimings
    shadow: bool = False
    plan_id: str = ""
    plan_age_ns: int = 0
    plan_state: PlanState = PlanState.NONE
    plan_valid_for_ns: int = 0
    decision_vector: np.ndarray | None = None
    gate_score: float | None = None
    gate_threshold: float | None = None
    gate_veto: bool = False
    snapshots_dropped: int = 0
    observations_dropped: int = 0
    observation_held: bool = False  # the tick reused an observation an earlier tick used
    observation_period_ns: int = 0  # the period staleness was judged against
    actual_index: int = -1  # shadow mode: what the vehicle did on this tick's observation
    actual_controls: np.ndarray | None = None
    # Non-finite parts of the tick's observation: "features" (measured ones), "plan".
    invalid_input: tuple[str, ...] = ()
    extra: dict[str, float] = field(default_factory=dict)
    # Since the previous snapshot delivered to the client: the outbox accumulates these over the
    # snapshots it conflates (controller.serve.conflation); the executor fills in this tick's share.
    snapshots_conflated_since_previous: int = 0
    max_lateness_since_previous_us: int = 0
    ticks_missed_since_previous: int = 0  # REALTIME grid ticks skipped since this session's last tick
    # REALTIME, when the observation carried its send time (wall clock; None: unknown)
    transport_delay_ns: int | None = None
    observation_age_with_transport_ns: int | None = None
    # the executor's checks (shared tuple) and this tick's results, a CHECK_DTYPE row per check
    check_kinds: tuple[Check, ...] = ()
    checks: np.ndarray | None = None
    # a candidate model's proposal on the same input (None: no candidate loaded); never applied
    candidate: CandidateProposal | None = None


# Odd 64-bit multipliers, one per input word (grown on demand, from a fixed seed: hashes are stable).
_HASH_MULTIPLIERS = np.random.default_rng(0x5EED_1A9).integers(0, 2**63, size=256, dtype=np.uint64) * 2 + 1


def input_hashes(features: np.ndarray, plan: np.ndarray) -> np.ndarray:
    """A 64-bit fingerprint of each row's exact inputs (float32 bit patterns of features and plan),
    vectorised over rows so a live batch and a whole replay pay a handful of numpy calls. Rows that
    differ in one word never collide (odd multipliers); a splitmix64 finaliser mixes the bits."""
    words = np.concatenate(
        [
            np.ascontiguousarray(features, np.float32).view(np.uint32),
            np.ascontiguousarray(plan, np.float32).view(np.uint32),
        ],
        axis=1,
    ).astype(np.uint64)
    h = words @ _HASH_MULTIPLIERS[: words.shape[1]]  # wraps modulo 2**64
    h ^= h >> np.uint64(30)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(27)
    h *= np.uint64(0x94D049BB133111EB)
    h ^= h >> np.uint64(31)
    return h
