"""The executor: one batched decision per tick for every session, behind a small in-process API.

The gRPC server (controller/) is a thin layer over this class; embedding code and offline scoring
use it directly:

    ex = Executor(DecisionModel("model.onnx"))
    ex.open_session("car-1")
    snaps = ex.step({"car-1": Observation(seq=0, timestamp_ns=0, features=x)}, now_ns=0)

REALTIME sessions are ticked together by `tick()` (one onnxruntime call for all of them); a
LOCKSTEP session is ticked by its own observations' timestamps in `advance_lockstep()`, always with
a batch of one, so its output never depends on what other sessions happen to be doing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING

import numpy as np

from dualloop.executor.config import ExecutorConfig
from dualloop.executor.model_card import Normalisation
from dualloop.executor.model_runner import DecisionModel, ModelOutputs
from dualloop.executor.safety import SafetyMachine, SafetyMemory
from dualloop.executor.snapshot import (
    AppliedAction,
    Clock,
    Observation,
    Reason,
    Snapshot,
    StageTimings,
    input_hashes,
)

if TYPE_CHECKING:
    from dualloop.executor.lockstep_batch import TickTable
    from dualloop.ood import Gate

# decision_vector: the model's penultimate layer; input_features: the raw inputs (their norm guard
# catches a dead sensor in its own tick; their range guard a value far outside training, or one that
# jumped too far since the previous observation). Inputs standardised with the card were tried as a
# third source and were worse on every count (false vetoes 0.71% per tick, unit mismatch AUROC 0.85);
# a Mahalanobis gate on the changes between observations was tried too: AUROC 0.36 on noise bursts
# (L2 normalisation hides their size) and 34% of the real drive over its threshold.
GATE_SOURCES = ("decision_vector", "input_features")

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
REASONS_OF_FLAGS = [tuple(r for r in TICK_REASONS if flags & REASON_BITS[r]) for flags in range(1 << len(TICK_REASONS))]

_NAN = float("nan")
_perf_ns = time.perf_counter_ns
_slot_of = attrgetter("slot")
_BOOL = np.dtype(bool)  # a dtype object: np.array resolves it faster than the type
_mono_ns = time.monotonic_ns


class InvalidObservation(ValueError):
    """An observation that breaks the session's contract (shape, order); the message says how."""


class SessionError(ValueError):
    """Opening or addressing a session failed (duplicate id, unknown id, capacity)."""


class GateMismatch(ValueError):
    """A gate fitted on other features than this model provides; the message says which."""


def decision_vector_names(model: DecisionModel) -> list[str]:
    """Names of the decision vector's components, as a gate fitted on it records them."""
    return [f"{model.card.io.decision_vector}[{i}]" for i in range(model.card.decision_vector_size)]


def gate_feature_names(model: DecisionModel, source: str) -> list[str]:
    if source not in GATE_SOURCES:
        raise GateMismatch(f"gate source {source!r} is not one of {GATE_SOURCES}")
    return decision_vector_names(model) if source == "decision_vector" else model.card.feature_names


@dataclass(slots=True)
class Session:
    session_id: str
    clock: Clock
    shadow: bool
    include_decision_vector: bool
    plan: np.ndarray
    slot: int  # row of this session in per-session state arrays (the gate's filter)
    # Whether the observations' actual controls are the command the vehicle was executing when each
    # was taken (controller.proto's contract), which the gate's actuation check compares with the
    # measured acceleration. False for logs whose actual action is a label (a comma2k19 import's is
    # the speed's slope over the next 0.5 s): the check then gives no verdict.
    actual_is_command: bool = True
    safety: SafetyMemory = field(default_factory=SafetyMemory)
    plan_id: str = ""
    plan_created_ns: int = 0
    pending: Observation | None = None  # newest observation no tick has used yet (latest wins)
    current: Observation | None = None  # the observation the last tick used
    last_seq: int = -1
    last_timestamp_ns: int | None = None
    observations_dropped: int = 0
    snapshots_dropped: int = 0
    next_tick_ns: int | None = None  # LOCKSTEP grid position
    lockstep_tick: int = 0
    ticks: int = 0


def _fill_gate_features(
    source: str, out: np.ndarray | None, x: np.ndarray, dv: np.ndarray | None, bad_dv: np.ndarray | None
) -> np.ndarray | None:
    """What a gate of this source scores, into `out`. Rows the model could not be trusted on are NaN,
    which vetoes them immediately: the model saw a substitute for invalid input, the gate must not.
    With `out` None nothing is copied: the rows are returned (None: no decision vector, every row is
    NaN) and the caller scores the `bad_dv` rows as NaN (a tick passes the rows whose raw inputs hold
    NaN/Inf: for the raw-input gate that changes nothing, those rows are non-finite either way)."""
    rows = x if source == "input_features" else dv  # raw inputs: NaN stays NaN
    if out is None:
        return rows
    if rows is None:
        out[:] = np.nan  # no decision vector this tick: nothing can pass
    else:
        np.copyto(out, rows)
        if rows is dv and bad_dv is not None:
            out[bad_dv] = np.nan
    return None


def nearest_gate(per_gate: list[tuple[np.ndarray, np.ndarray, float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(score, threshold, veto) per row from each gate's (score, alarm, threshold): any alarm vetoes,
    and the row reports the gate nearest its threshold (the first one on a tie)."""
    n = len(per_gate[0][0])
    best_ratio = np.full(n, -np.inf)
    score, threshold = np.zeros(n), np.zeros(n)
    veto = np.zeros(n, bool)
    for run_score, alarm, run_threshold in per_gate:
        veto |= alarm
        ratio = run_score / run_threshold
        take = ratio > best_ratio
        best_ratio = np.where(take, ratio, best_ratio)
        score = np.where(take, run_score, score)
        threshold = np.where(take, run_threshold, threshold)
    return score, threshold, veto


@dataclass(slots=True)
class _GateRun:
    monitor: object  # ood.GateMonitor
    source: str  # one of GATE_SOURCES
    dim: int  # features the gate scores
    threshold: float


def _picker(flags: Sequence[bool]) -> Callable[[tuple], tuple]:
    """pair -> (pair[flag] for each flag), as a tuple, by one C-level call (at one session a Python
    loop over the gates shows in the tick)."""
    if len(flags) > 1:
        return itemgetter(*map(int, flags))
    at = [int(flag) for flag in flags]  # no gates, or one: itemgetter would not return a tuple
    return lambda pair: tuple(pair[i] for i in at)


def command_in_effect(session: Session, obs: Observation, at: int) -> float:
    """Control `at` of the command the vehicle was executing when `obs` was taken (its actual action),
    as the actuation check reads it on live ticks and in a replay; NaN when there is none or the
    session's actual actions are not commands."""
    c = obs.actual_controls
    return c.item(at) if session.actual_is_command and c is not None and c.size else _NAN


@dataclass
class ExecutorStats:
    ticks: int = 0
    rows: int = 0
    model_errors: int = 0
    stage_ns: np.ndarray = field(default_factory=lambda: np.zeros(4, np.int64))  # pre, fwd, gate, post


class Executor:
    def __init__(
        self, model: DecisionModel, config: ExecutorConfig | None = None, gate: Gate | list[Gate] | None = None
    ) -> None:
        self.model = model
        self.config = config or ExecutorConfig()
        card = model.card
        self.card = card
        self.period_ns = self.config.tick_period_ns
        self._max_age_ns = self.config.max_observation_age_ns
        self.normalisation = Normalisation.of(card)
        self._plan_default = np.array(card.plan_default, np.float32)
        self._ctrl_min = np.array([c.min for c in card.controls], np.float32)
        self._ctrl_max = np.array([c.max for c in card.controls], np.float32)
        self._inv_temperature = np.float32(1.0 / card.temperature)
        self._actions = list(card.actions)
        cap = self.config.max_sessions
        self._x = np.zeros((cap, model.n_features), np.float32)
        self._xn = np.zeros((cap, model.n_features), np.float32)
        self._p = np.zeros((cap, model.n_plan), np.float32)
        self._pn = np.zeros((cap, model.n_plan), np.float32)
        self._fresh = np.zeros(cap, bool)
        self._frozen = np.zeros(cap, bool)  # rows the freeze check flagged this tick
        safe = card.safe_action
        self.safe_action = AppliedAction(
            self._actions.index(safe.action), safe.action, np.array(safe.controls, np.float32)
        )
        self.sessions: dict[str, Session] = {}
        self.stats = ExecutorStats()
        self._realtime_tick = 0
        self._max_plan_age_ns = int(self.config.max_plan_age_ms * 1e6)
        self.safety = SafetyMachine(
            self.config.safety, [c.name for c in card.controls], self.period_ns, self.safe_action, card.feature_names
        )
        self._free_slots = list(range(cap - 1, -1, -1))
        # Several gates may watch different features (decision vector, raw inputs); any one vetoes.
        self.gates: list[Gate] = [] if gate is None else list(gate) if isinstance(gate, (list, tuple)) else [gate]
        self._gate_runs: list[_GateRun] = []
        for g in self.gates:
            expected = gate_feature_names(model, g.schema.source)
            if list(g.schema.feature_names) != expected:
                have = g.schema.feature_names
                raise GateMismatch(
                    f"the gate was fitted on {len(have)} {g.schema.source} features "
                    f"({have[0]}, ..., {have[-1]}); model {card.name} {card.version} provides "
                    f"{len(expected)} ({expected[0]}, ..., {expected[-1]})"
                )
            self._gate_runs.append(_GateRun(g.monitor(cap), g.schema.source, g.dim, float(g.threshold)))
        self._gate_bank = None
        if self._gate_runs:
            from dualloop.ood import GateBank

            self._gate_bank = GateBank([run.monitor for run in self._gate_runs], cap)
        # per batch size: the tick's inputs, fresh flags and freeze verdicts, and each gate's plan rows
        self._gate_views: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, list[np.ndarray | None] | None]] = {}
        self._gate_any_frozen = False
        # the changes between observations, when a gate on the raw inputs limits them; the plan, when
        # a gate limits it (the plan conditions the model as much as its observation does)
        self._change = None
        self._change_gates = [
            g.schema.source == "input_features" and g.feature_range is not None and bool(g.feature_range.change_low)
            for g in self.gates
        ]
        self._plan_gates = [g.feature_range is not None and bool(g.feature_range.context_names) for g in self.gates]
        plan_names = [p.name for p in card.plan]
        for g, limited in zip(self.gates, self._plan_gates):
            if limited and list(g.feature_range.context_names) != plan_names:
                raise GateMismatch(
                    f"the gate limits a plan of {list(g.feature_range.context_names)}; model "
                    f"{card.name} {card.version} is conditioned on {plan_names}"
                )
        self._any_plan_gate = any(self._plan_gates)
        self._gate_on_inputs = [run.source == "input_features" for run in self._gate_runs]
        # per gate, (decision vector, inputs)[on inputs] and (None, changes)[limits changes], in one C call
        self._pick_features = _picker(self._gate_on_inputs)
        self._pick_changes = _picker(self._change_gates)
        if any(self._change_gates):
            from dualloop.ood import ChangeTracker

            self._change = ChangeTracker(cap, model.n_features)
        # measured acceleration short of the command in effect (a gate on the raw inputs may carry it)
        self._actuation = None
        self._actuation_at = (0, 0, 0)  # accel feature, speed feature, command control
        checks = [g.actuation for g in self.gates if g.actuation is not None]
        if len(checks) > 1:
            raise GateMismatch(f"{len(checks)} gates carry an actuation check; a session's command is judged once")
        if checks:
            try:
                self._actuation_at = checks[0].indices(card.feature_names, [c.name for c in card.controls])
            except ValueError as exc:
                raise GateMismatch(f"model {card.name} {card.version}: {exc}") from None
            self._actuation = checks[0].monitor(cap)
        self._freeze = None
        if self.gates and self.config.freeze_repeats > 0:
            from dualloop.ood import FreezeDetector

            self._freeze = FreezeDetector(cap, model.n_features, self.config.freeze_repeats)

    # -- sessions -----------------------------------------------------------------------------

    def open_session(
        self,
        session_id: str,
        clock: Clock = Clock.REALTIME,
        shadow: bool = False,
        include_decision_vector: bool = False,
        actual_is_command: bool = True,
    ) -> Session:
        if not session_id:
            raise SessionError("session id must not be empty")
        if session_id in self.sessions:
            raise SessionError(f"session {session_id!r} is already open")
        if len(self.sessions) >= self.config.max_sessions:
            raise SessionError(f"the server is full: {self.config.max_sessions} sessions open (max_sessions)")
        session = Session(
            session_id=session_id,
            clock=Clock(clock),
            shadow=shadow,
            include_decision_vector=include_decision_vector,
            plan=self._plan_default.copy(),
            slot=self._free_slots.pop(),
            actual_is_command=actual_is_command,
        )
        for run in self._gate_runs:
            run.monitor.reset(session.slot)
        if self._freeze is not None:
            self._freeze.reset(session.slot)
        if self._change is not None:
            self._change.reset(session.slot)
        if self._actuation is not None:
            self._actuation.reset(session.slot)
        self.sessions[session_id] = session
        return session

    @property
    def realtime_sessions(self) -> int:
        """How many sessions tick on the wall clock (the server keeps precise time only for them)."""
        return sum(1 for s in self.sessions.values() if s.clock is Clock.REALTIME)

    def close_session(self, session_id: str) -> None:
        session = self.sessions.pop(session_id, None)
        if session is not None:
            self._free_slots.append(session.slot)

    def _session(self, session_id: str) -> Session:
        try:
            return self.sessions[session_id]
        except KeyError:
            raise SessionError(f"no open session {session_id!r}") from None

    # -- input ----------------------------------------------------------------------------------

    def check_observation(self, session: Session, obs: Observation) -> None:
        n = self.model.n_features
        if obs.features.shape != (n,):
            names = self.card.feature_names
            raise InvalidObservation(
                f"observation seq {obs.seq} has {obs.features.size} features; the model expects {n} "
                f"({names[0]}, {names[1]}, ..., {names[-1]}); GetModelInfo lists them in order"
            )
        if obs.seq <= session.last_seq:
            raise InvalidObservation(
                f"observation seq {obs.seq} is not after the previous seq "
                f"{session.last_seq}; sequence numbers must strictly increase"
            )
        if obs.actual_controls is not None and obs.actual_controls.size not in (0, len(self.card.controls)):
            raise InvalidObservation(
                f"observation seq {obs.seq}: actual action has {obs.actual_controls.size} "
                f"controls; the model has {len(self.card.controls)} "
                f"({', '.join(c.name for c in self.card.controls)})"
            )
        if obs.plan_values is not None:
            if obs.plan_values.shape != (self.model.n_plan,):
                raise InvalidObservation(
                    f"observation seq {obs.seq}: plan {obs.plan_id!r} has {obs.plan_values.size} "
                    f"values; the model's plan has {self.model.n_plan} "
                    f"({', '.join(p.name for p in self.card.plan)})"
                )
            if not np.isfinite(obs.plan_values).all():
                raise InvalidObservation(f"observation seq {obs.seq}: plan {obs.plan_id!r} has non-finite values")
        if not -1 <= obs.actual_index < len(self._actions):
            raise InvalidObservation(
                f"observation seq {obs.seq}: actual action index {obs.actual_index} is "
                f"not -1 (unknown) or 0..{len(self._actions) - 1}"
            )

    def submit(self, session_id: str, obs: Observation) -> None:
        """REALTIME input: the newest observation replaces an unused older one (counted)."""
        session = self._session(session_id)
        self.check_observation(session, obs)
        session.last_seq = obs.seq
        if obs.plan_values is not None:
            self.set_plan(session_id, obs.plan_values, obs.plan_id, obs.arrival_ns)
        if session.pending is not None:
            session.observations_dropped += 1
        session.pending = obs

    def set_plan(self, session_id: str, values: np.ndarray, plan_id: str, created_ns: int) -> bool:
        """Condition the session on a new plan from now on; a repeated plan id changes nothing."""
        session = self._session(session_id)
        if plan_id and plan_id == session.plan_id:
            return False
        session.plan[:] = values
        session.plan_id = plan_id
        session.plan_created_ns = created_ns
        return True

    # -- ticking --------------------------------------------------------------------------------

    def tick(self, scheduled_ns: int, tick_index: int | None = None, lateness_ns: int = 0) -> list[Snapshot]:
        """One tick for every REALTIME session that has received an observation."""
        if tick_index is None:
            tick_index = self._realtime_tick
        self._realtime_tick = tick_index + 1
        rows = [
            s
            for s in self.sessions.values()
            if s.clock is Clock.REALTIME and (s.pending is not None or s.current is not None)
        ]
        if not rows:
            return []
        return self._run_batch(rows, tick_index, scheduled_ns, lateness_ns)

    def step(self, observations: dict[str, Observation], now_ns: int) -> list[Snapshot]:
        """In-process convenience for REALTIME sessions: submit, then tick at `now_ns`."""
        for session_id, obs in observations.items():
            if obs.arrival_ns == 0:
                obs.arrival_ns = now_ns
            self.submit(session_id, obs)
        return self.tick(now_ns)

    def advance_lockstep(self, session_id: str, obs: Observation) -> list[Snapshot]:
        """Run every tick of the session's grid up to the observation's timestamp.

        Ticks strictly before the timestamp use the previous observation (its age shows it); a tick
        exactly at the timestamp uses this one. The grid starts at the first observation's time.
        """
        session = self._session(session_id)
        self.check_observation(session, obs)
        self.check_lockstep_time(session, obs)
        ts = obs.timestamp_ns
        if session.next_tick_ns is None:
            session.next_tick_ns = ts
        session.last_seq = obs.seq
        session.last_timestamp_ns = ts
        out: list[Snapshot] = []
        while session.next_tick_ns < ts:
            out += self._lockstep_tick(session)
        if session.pending is not None:
            session.observations_dropped += 1  # an off-grid observation no tick got to use
        session.pending = obs
        if obs.plan_values is not None:  # from its timestamp on, not for the ticks before it
            self.set_plan(session_id, obs.plan_values, obs.plan_id, ts)
        if session.next_tick_ns == ts:
            out += self._lockstep_tick(session)
        return out

    def check_lockstep_time(self, session: Session, obs: Observation) -> None:
        """LOCKSTEP time strictly increases and never jumps further than lockstep_max_gap_s."""
        ts = obs.timestamp_ns
        if session.last_timestamp_ns is not None and ts <= session.last_timestamp_ns:
            raise InvalidObservation(
                f"observation seq {obs.seq} has timestamp {ts} ns, not after the previous "
                f"{session.last_timestamp_ns} ns; LOCKSTEP time must strictly increase"
            )
        next_tick = ts if session.next_tick_ns is None else session.next_tick_ns
        if (ts - next_tick) // self.period_ns + 1 > self.max_lockstep_ticks:
            raise InvalidObservation(
                f"observation seq {obs.seq} jumps {(ts - next_tick) / 1e9:.3f} s "
                f"ahead; LOCKSTEP refuses gaps over lockstep_max_gap_s="
                f"{self.config.lockstep_max_gap_s} s"
            )

    @property
    def max_lockstep_ticks(self) -> int:
        return int(self.config.lockstep_max_gap_s * 1e9 / self.period_ns)

    def run_lockstep(self, session_id: str, observations: Sequence[Observation]) -> TickTable:
        """All ticks of a new LOCKSTEP session fed with `observations`, in one vectorised pass
        (replay): the same decisions as `advance_lockstep` observation by observation."""
        from dualloop.executor.lockstep_batch import run_lockstep

        return run_lockstep(self, self._session(session_id), observations)

    def _lockstep_tick(self, session: Session) -> list[Snapshot]:
        snaps = (
            self._run_batch([session], session.lockstep_tick, session.next_tick_ns, 0)
            if (session.pending is not None or session.current is not None)
            else []
        )
        session.lockstep_tick += 1
        session.next_tick_ns += self.period_ns
        return snaps

    def _run_batch(self, rows: list[Session], tick_index: int, tick_ns: int, lateness_ns: int) -> list[Snapshot]:
        n = len(rows)
        t0 = _perf_ns()
        x, p = self._x[:n], self._p[:n]
        observations: list[Observation] = []
        fresh = self._fresh[:n]
        for i, s in enumerate(rows):
            fresh[i] = s.pending is not None
            if fresh[i]:
                s.current, s.pending = s.pending, None
            obs = s.current
            observations.append(obs)
            x[i] = obs.features
            p[i] = s.plan
        # the model never sees NaN; such rows are marked INVALID_INPUT below
        xn, pn, finite = self.normalisation.apply(x, p, self._xn[:n], self._pn[:n])
        t1 = _perf_ns()
        try:
            out = self.model.forward(xn, pn)
            model_ok = bool(np.isfinite(out.logits).all() and np.isfinite(out.controls).all())
        except Exception:  # noqa: BLE001 - any runtime failure degrades the tick, never the loop
            out, model_ok = None, False
        if not model_ok:
            self.stats.model_errors += 1
        t2 = _perf_ns()
        gate = self._gate(rows, finite, out if model_ok else None)
        t3 = _perf_ns()
        snaps = self._postprocess(
            rows, observations, finite, out if model_ok else None, gate, tick_index, tick_ns, lateness_ns
        )
        t4 = _perf_ns()
        timings = StageTimings((t1 - t0) // 1000, (t2 - t1) // 1000, (t3 - t2) // 1000, (t4 - t3) // 1000)
        emit_ns = _mono_ns()
        for snap in snaps:
            snap.timings = timings
            snap.emit_time_ns = emit_ns
        st = self.stats
        st.ticks += 1
        st.rows += n
        st.stage_ns[0] += t1 - t0
        st.stage_ns[1] += t2 - t1
        st.stage_ns[2] += t3 - t2
        st.stage_ns[3] += t4 - t3
        return snaps

    def propose(self, out: ModelOutputs) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The model's proposal per row: (probabilities, top-1 index, its probability, top-1 minus
        top-2 margin, controls clipped to the card's ranges)."""
        n = len(out.logits)
        z = out.logits * self._inv_temperature
        z -= z.max(axis=1, keepdims=True)
        probs = np.exp(z)
        probs /= probs.sum(axis=1, keepdims=True)
        top = np.argsort(-probs, axis=1, kind="stable")[:, :2]
        top1 = probs[np.arange(n), top[:, 0]]
        margin = top1 - probs[np.arange(n), top[:, 1]]
        return probs, top[:, 0], top1, margin, np.clip(out.controls, self._ctrl_min, self._ctrl_max)

    def reason_flags(
        self,
        finite: np.ndarray,
        model_ok: np.ndarray,
        age_ns: np.ndarray,
        plan_age_ns: np.ndarray,
        veto: np.ndarray,
        margin: np.ndarray,
    ) -> np.ndarray:
        """Why each row's proposal is not to be trusted as it is, as REASON_BITS (the live tick and the
        replay scan share this one definition); the safe-state machine may add FALLBACK/SAFE_DEFAULT."""
        scored = finite & model_ok
        flags = np.where(finite, 0, REASON_BITS[Reason.INVALID_INPUT])
        flags |= np.where(model_ok, 0, REASON_BITS[Reason.MODEL_ERROR])
        flags |= np.where(age_ns > self._max_age_ns, REASON_BITS[Reason.STALE_OBSERVATION], 0)
        flags |= np.where(plan_age_ns > self._max_plan_age_ns, REASON_BITS[Reason.STALE_PLAN], 0)
        flags |= np.where(veto, REASON_BITS[Reason.OOD_VETO], 0)
        low = np.asarray(margin, np.float64) < self.config.min_margin  # float64, as the config states it
        flags |= np.where(scored & low, REASON_BITS[Reason.LOW_MARGIN], 0)
        return flags

    def _gate(self, rows: list[Session], finite: np.ndarray, out) -> tuple[list[float], list[float], np.ndarray] | None:
        """(score, threshold, veto) per row, scored on this tick's own features: a veto is never a tick
        late. With several gates, any veto counts and the row reports the gate nearest its threshold.
        All gates are scored, filtered and combined in one pass (ood.GateBank, the same decisions as
        per-gate monitors and `nearest_gate`), with the freeze check's veto included. Scores and
        thresholds come as Python floats (snapshots take them one by one), the veto as an array (the
        reason flags take it whole)."""
        if not self._gate_runs:
            return None
        n = len(rows)
        bank, views = self._gate_bank, self._gate_views
        try:
            x, fresh, frozen, plans = views[n]
        except KeyError:
            plans = list(map((None, self._p[:n]).__getitem__, self._plan_gates)) if self._any_plan_gate else None
            x, fresh, frozen, plans = views[n] = self._x[:n], self._fresh[:n], self._frozen[:n], plans
        slots = list(map(_slot_of, rows))
        dv = out.decision_vector if out is not None else None
        # rows with NaN/Inf inputs are scored as NaN by every gate (the model saw a substitute)
        ok = finite.tolist()
        bad = None if all(ok) else ~finite
        fresh_rows = fresh.tolist()
        # what _fill_gate_features(source, None, ...) returns, per gate
        features = self._pick_features((dv, x))
        changes = None
        if self._change is not None:
            changes = self._pick_changes((None, self._change.step(x, slots, fresh_rows, ok)))
        frozen_rows = None if self._freeze is None else self._freeze.step(x, slots, fresh_rows)
        any_frozen = frozen_rows is not None and True in frozen_rows
        if any_frozen or self._gate_any_frozen:  # else the buffer is all False already
            self._frozen[:] = False
            frozen[:] = frozen_rows if any_frozen else False
            self._gate_any_frozen = any_frozen
        # Python lists: the actuation check folds in on floats, and only the veto becomes an array (at
        # one session, numpy calls are most of what a tick costs)
        score, threshold, veto = bank.step_lists(slots, features, bad, frozen_rows, changes, plans)
        if self._actuation is not None:
            self._actuation_step(rows, slots, fresh_rows, x, score, threshold, veto)
        return score, threshold, np.array(veto, _BOOL)

    def _actuation_step(
        self,
        rows: list[Session],
        slots: list[int],
        fresh: list[bool],
        x: np.ndarray,
        score: list[float],
        threshold: list[float],
        veto: list[bool],
    ) -> None:
        """The actuation check on this tick's rows, folded into the gates' (score, threshold, veto) lists
        in place: its alarm vetoes, and it is reported when nearer its threshold than every gate (as
        `nearest_gate` ranks it last in a replay). No command on a row: no verdict. Plain Python per
        row (`.item` reads one float without making an array): about a microsecond a session."""
        accel_at, speed_at, command_at = self._actuation_at
        monitor = self._actuation
        item = x.item  # the tick's float32 inputs, as a replay reads them
        times, accel, speed, commands = [], [], [], []
        for i, s in enumerate(rows):
            obs = s.current
            times.append(obs.timestamp_ns)
            accel.append(item(i, accel_at))
            speed.append(item(i, speed_at))
            commands.append(command_in_effect(s, obs, command_at))
        scores, alarms = monitor.step(slots, fresh, times, accel, speed, commands)
        limit = monitor.threshold
        for i, (s, alarm) in enumerate(zip(scores, alarms)):
            if alarm:
                veto[i] = True
            if s == s:  # a verdict: report it if nearer its threshold than the nearest gate
                best, t = score[i], threshold[i]
                if t:
                    nearer = s / limit > best / t
                else:  # a zero threshold: IEEE division, as the gates are ranked
                    from dualloop.ood.one_row import ratio_at_zero

                    nearer = s / limit > ratio_at_zero(best, t)
                if nearer:
                    score[i], threshold[i] = s, limit

    def _postprocess(
        self,
        rows: list[Session],
        observations: list[Observation],
        finite: np.ndarray,
        out,
        gate: tuple[list[float], list[float], np.ndarray] | None,
        tick_index: int,
        tick_ns: int,
        lateness_ns: int,
    ) -> list[Snapshot]:
        n = len(rows)
        if out is not None:
            probs, top, top1, margin, controls = self.propose(out)
        else:
            margin = np.zeros(n, np.float32)
        ages = np.fromiter(
            (
                tick_ns - (obs.arrival_ns if s.clock is Clock.REALTIME else obs.timestamp_ns)
                for s, obs in zip(rows, observations)
            ),
            np.int64,
            n,
        )
        np.maximum(ages, 0, out=ages)
        plan_ages = np.fromiter(((tick_ns - s.plan_created_ns) if s.plan_id else 0 for s in rows), np.int64, n)
        flags = self.reason_flags(
            finite,
            np.full(n, out is not None),
            ages,
            plan_ages,
            gate[2] if gate is not None else np.zeros(n, bool),
            margin,
        )
        hashes = input_hashes(self._x[:n], self._p[:n])
        empty = np.zeros(0, np.float32)
        lateness_us = max(0, lateness_ns) // 1000
        snaps = []
        for i, s in enumerate(rows):
            obs = observations[i]
            age, plan_age = int(ages[i]), int(plan_ages[i])
            reasons = list(REASONS_OF_FLAGS[flags[i]])
            scored = out is not None and finite[i]
            if scored:
                idx = int(top[i])
                prop_probs, prop_controls = probs[i].copy(), controls[i].copy()
                conf, marg = float(top1[i]), float(margin[i])
            else:
                idx, prop_probs, prop_controls, conf, marg = -1, empty, empty, 0.0, 0.0
            proposal = AppliedAction(idx, self._actions[idx], prop_controls) if scored else None
            # a frozen sensor's lane offset and heading must not steer the fallback
            applied, state = self.safety.decide(
                s.safety, tick_ns, reasons, proposal, None if self._frozen[i] else self._x[i]
            )
            s.ticks += 1
            snaps.append(
                Snapshot(
                    session_id=s.session_id,
                    tick=tick_index,
                    scheduled_time_ns=tick_ns,
                    emit_time_ns=0,
                    lateness_us=lateness_us,
                    observation_seq=obs.seq,
                    observation_age_ns=age,
                    model_version=self.card.version,
                    proposed_index=idx,
                    proposed_name=self._actions[idx] if idx >= 0 else "",
                    probabilities=prop_probs,
                    proposed_controls=prop_controls,
                    confidence=conf,
                    margin=marg,
                    applied=applied,
                    reasons=tuple(reasons),
                    safety_state=state,
                    input_hash=int(hashes[i]),
                    timings=StageTimings(),
                    shadow=s.shadow,
                    plan_id=s.plan_id,
                    plan_age_ns=plan_age,
                    decision_vector=out.decision_vector[i].copy()
                    if (s.include_decision_vector and out is not None)
                    else None,
                    snapshots_dropped=s.snapshots_dropped,
                    observations_dropped=s.observations_dropped,
                    actual_index=obs.actual_index,
                    actual_controls=obs.actual_controls,
                    gate_score=float(gate[0][i]) if gate is not None else None,
                    gate_threshold=float(gate[1][i]) if gate is not None else None,
                    gate_veto=bool(gate[2][i]) if gate is not None else False,
                )
            )
        return snaps
