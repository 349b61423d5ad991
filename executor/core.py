"""The executor: one batched decision per tick for every session, behind a small in-process API.

The gRPC server (controller/) is a thin layer over this class; embedding code and offline scoring
use it directly:

    ex = Executor(DecisionModel("model.onnx"))
    ex.open_session("car-1")
    snaps = ex.step({"car-1": Observation(seq=1, timestamp_ns=0, features=x)}, now_ns=0)

REALTIME sessions are ticked together by `tick()` (one onnxruntime call for all of them); a
LOCKSTEP session is ticked by its own observations' timestamps in `advance_lockstep()`, always with
a batch of one, so its output never depends on what other sessions happen to be doing; a whole
LOCKSTEP session runs in one vectorised pass with `lockstep_batch.run_lockstep` (replay).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from dualloop.executor.candidate import Candidate, SwapRefused, check_compatible, check_same_checks
from dualloop.executor.checks import CheckBoard, CheckValues
from dualloop.executor.config import ExecutorConfig
from dualloop.executor.default_plan import DefaultPlan
from dualloop.executor.gating import GateVerdicts, GateWiring
from dualloop.executor.history import HistoryRing
from dualloop.executor.model_card import Normalisation
from dualloop.executor.model_runner import DecisionModel, ModelOutputs
from dualloop.executor.reasons import REASONS_OF_FLAGS, ReasonRules, plan_rule
from dualloop.executor.safety import SafetyMachine
from dualloop.executor.sessions import (
    InvalidObservation,
    Session,
    SessionAlreadyOpen,
    SessionNotOpen,
    SessionRequestInvalid,
    TooManySessions,
    note_observation_time,
    without_invalid_content,
)
from dualloop.executor.snapshot import (
    INT64_MAX,
    AppliedAction,
    Clock,
    Observation,
    Snapshot,
    StageTimings,
    input_hashes,
)
from dualloop.executor.tick_snapshots import TickRows, tick_snapshots
from dualloop.ood import Gate
from dualloop.ood.signal_settings import SignalSettings

_perf_ns = time.perf_counter_ns
_mono_ns = time.monotonic_ns
# A sensor period beyond an hour is no sensor rate; the bound keeps period + allowance (the
# staleness limit, int64 nanoseconds) far from overflowing into "every tick STALE".
MAX_OBSERVATION_PERIOD_NS = 3_600_000_000_000


@dataclass
class ExecutorStats:
    ticks: int = 0
    rows: int = 0
    model_errors: int = 0
    stage_ns: np.ndarray = field(default_factory=lambda: np.zeros(4, np.int64))  # pre, fwd, gate, post
    candidate_ns: int = 0  # the candidate model's forward pass and proposal, when one is loaded


class Executor:
    """Sessions, input checks and the tick: the forward pass here, the gates in `gating`
    (GateWiring), why a proposal is distrusted in `reasons` (ReasonRules), what is applied then in
    `safety` (SafetyMachine)."""

    def __init__(
        self, model: DecisionModel, config: ExecutorConfig | None = None, gate: Gate | list[Gate] | None = None
    ) -> None:
        self._config = config or ExecutorConfig()
        self.period_ns = self.config.tick_period_ns
        self._bind_card(model)
        cap = self.config.max_sessions
        # the tick's buffers, rows 0..n-1 for its n sessions (the gate step reads them too)
        self._x = np.zeros((cap, model.n_features), np.float32)
        self._xn = np.zeros((cap, model.n_features), np.float32)
        self._p = np.zeros((cap, model.n_plan), np.float32)
        self._pn = np.zeros((cap, model.n_plan), np.float32)
        self._fresh = np.zeros(cap, bool)
        self._present = np.ones((cap, model.n_features), bool)  # the tick's sensor profiles
        # A model with history features (executor.history) takes [wire, history] features: derived per
        # observation (Observation.history), assembled here; gates and the input hash stay on the wire
        # features, what the client sent. Every received observation enters its session's stream on
        # receipt; a REALTIME tick derives the features of the observations it uses, all rows in one
        # pass over the sessions' ring (HistoryRing); LOCKSTEP derives them on receipt.
        self.history = model.history
        self._history_ring = None if model.history is None else HistoryRing(model.history, self.config.max_sessions)
        self._xm = np.zeros((cap, model.n_inputs), np.float32)
        self._xmn = np.zeros((cap, model.n_inputs), np.float32)
        self.sessions: dict[str, Session] = {}
        self.stats = ExecutorStats()
        self._realtime_tick = 0
        self._assumed_period_ns = self.config.assumed_observation_period_ns
        self.reasons = ReasonRules(
            self.config.max_observation_age_ns, int(self.config.max_plan_age_ms * 1e6), self.config.min_margin
        )
        self._free_slots = list(range(cap - 1, -1, -1))
        gates = [] if gate is None else list(gate) if isinstance(gate, (list, tuple)) else [gate]
        self._bind_gates(*self._wire_gates(model, gates))
        self._tick_present: np.ndarray | None = None  # the tick's sensor profiles (None: all measured)
        self._tick_no_plan: np.ndarray | None = None  # the tick's rows without a valid plan (None: none)
        # a second model deciding on every batch beside this one, never applied (executor.candidate)
        self.candidate: Candidate | None = None

    def _bind_card(self, model: DecisionModel) -> None:
        """What the tick reads from the live model and its card (at start, and at a promotion)."""
        self.model = model
        card = self.card = model.card
        self.normalisation = Normalisation.of(card)
        self.plan_default = np.array(card.plan_default, np.float32)  # a session's plan until it gets one
        self.default_plan = DefaultPlan.of(card)  # ... some fields raised to its newest observation
        self._ctrl_min = np.array([c.min for c in card.controls], np.float32)
        self._ctrl_max = np.array([c.max for c in card.controls], np.float32)
        self._inv_temperature = np.float32(1.0 / card.temperature)
        self._actions = list(card.actions)
        safe = card.safe_action
        self.safe_action = AppliedAction(
            self._actions.index(safe.action), safe.action, np.array(safe.controls, np.float32)
        )
        # the rules only: each session's safety state lives in its Session and survives a promotion
        self.safety = SafetyMachine(
            self.config.safety,
            [c.name for c in card.controls],
            self.period_ns,
            self.safe_action,
            card.feature_names,
            self._actions,
        )

    def _wire_gates(self, model: DecisionModel, gates: list[Gate]) -> tuple[GateWiring, CheckBoard]:
        cap, repeats = self.config.max_sessions, self.config.freeze_repeats
        signals = SignalSettings() if self.config.signal_checks else None
        g = GateWiring(model, gates, cap, repeats, self._x, self._p, self._fresh, signals)
        checks = CheckBoard(
            g.gates,
            [run.source for run in g.runs],
            self.config.freeze_repeats if g.freeze is not None else 0,
            None if g.actuation is None else g.actuation.threshold,
            None if g.signals is None else g.signals.thresholds,
        )
        return g, checks

    def _bind_gates(self, gating: GateWiring, checks: CheckBoard) -> None:
        self.gating = gating
        self.gates = gating.gates
        self._frozen = gating.frozen  # the freeze check's verdicts of the tick's rows
        self.checks = checks

    # -- candidate model ----------------------------------------------------------------------

    def prepare_candidate(self, model: DecisionModel, gates: list[Gate], gate_paths: Sequence[str] = ()) -> Candidate:
        """A candidate for this executor, checked (SwapRefused: why it cannot run beside the live
        model or replace it); not installed. Safe off the tick's thread: it reads only the cards."""
        check_compatible(self.model, model, len(self.sessions))
        gating, checks = self._wire_gates(model, gates)
        check_same_checks(self.checks, checks, list(gate_paths))
        return Candidate(model, gating.gates, gating, checks, self.config.max_sessions)

    def promote(self) -> tuple[str, str]:
        """The candidate becomes the live model (between two ticks); (previous, new) versions.
        Sessions keep their state, history and safety state; the gates' per-session state (filters,
        freeze counts) starts afresh on the new gates, which were fitted on the new model."""
        cand = self.candidate
        if cand is None:
            raise SwapRefused("no candidate loaded: load one first (LoadCandidate, or serve --candidate)")
        check_compatible(self.model, cand.model, len(self.sessions))
        previous = self.card.version
        for s in self.sessions.values():
            cand.gating.reset(s.slot)
            cand.gating.profile(s.present)
        self._bind_card(cand.model)
        self._bind_gates(cand.gating, cand.checks)
        self.candidate = None
        return previous, self.card.version

    @property
    def config(self) -> ExecutorConfig:
        return self._config

    @config.setter
    def config(self, config: ExecutorConfig) -> None:
        """A new config on a running executor: max_sessions, lockstep_max_gap_s and min_margin take
        effect from now on; the rest was fixed when the executor was built."""
        self._config = config
        self.reasons.min_margin = config.min_margin

    # -- sessions -----------------------------------------------------------------------------

    def open_session(
        self,
        session_id: str,
        clock: Clock = Clock.REALTIME,
        shadow: bool = False,
        include_decision_vector: bool = False,
        actual_is_command: bool = True,
        observation_period_ns: int = 0,
        provided_features: list[str] | tuple[str, ...] | None = None,
        require_plan: bool = False,
        expired_plan_is_stale: bool = False,
    ) -> Session:
        """`observation_period_ns`: the sensor's period (0: measured); `provided_features`: the
        sensor profile, the features this session measures (None or empty: all); `require_plan`:
        no valid plan is STALE_PLAN; `expired_plan_is_stale`: an expired plan is (a session the
        server's planner plans: its plans stopping is a fault)."""
        if not session_id:
            raise SessionRequestInvalid("session id must not be empty")
        if not 0 <= observation_period_ns <= MAX_OBSERVATION_PERIOD_NS:
            raise SessionRequestInvalid(
                f"observation_period_ns must be between 0 (0: measured) and {MAX_OBSERVATION_PERIOD_NS} (one hour), "
                f"got {observation_period_ns}"
            )
        present = self.sensor_profile(provided_features)
        if session_id in self.sessions:
            raise SessionAlreadyOpen(f"session {session_id!r} is already open")
        if len(self.sessions) >= self.config.max_sessions:
            raise TooManySessions(f"the server is full: {self.config.max_sessions} sessions open (max_sessions)")
        session = Session(
            session_id=session_id,
            clock=Clock(clock),
            shadow=shadow,
            include_decision_vector=include_decision_vector,
            plan=self.plan_default.copy(),
            slot=self._free_slots.pop(),
            actual_is_command=actual_is_command,
            present=present,
            observation_period_ns=observation_period_ns,
            require_plan=require_plan,
            expired_plan_is_stale=expired_plan_is_stale,
        )
        if self._history_ring is not None:
            session.history = self._history_ring.state(session.slot)
        self.gating.reset(session.slot)
        self.gating.profile(present)  # built now (tens of ms), not on the session's first tick
        self.sessions[session_id] = session
        return session

    def sensor_profile(self, provided_features: list[str] | tuple[str, ...] | None) -> np.ndarray | None:
        """The present mask of a sensor profile; None when every feature is provided."""
        if not provided_features:
            return None
        names = self.card.feature_names
        unknown = [n for n in provided_features if n not in names]
        if unknown:
            raise SessionRequestInvalid(
                f"provided_features names {', '.join(map(repr, unknown))}, not features of model "
                f"{self.card.name}; GetModelInfo lists them ({names[0]}, {names[1]}, ..., {names[-1]})"
            )
        if repeated := sorted(n for n, count in Counter(provided_features).items() if count > 1):  # built wrongly
            raise SessionRequestInvalid(f"provided_features names {', '.join(map(repr, repeated))} more than once")
        present = np.isin(np.array(names), np.array(list(provided_features)))
        return None if present.all() else present

    def observation_period_ns(self, session: Session) -> int:
        """The period a session's staleness is judged against: declared, else measured, else assumed."""
        period = session.observation_period_ns or session.measured_period_ns or self._assumed_period_ns
        return min(period, MAX_OBSERVATION_PERIOD_NS)  # a measured one too: timestamps are the client's

    @property
    def assumed_observation_period_ns(self) -> int:
        """The observation period assumed until a session that declared none has measured one."""
        return self._assumed_period_ns

    @property
    def realtime_sessions(self) -> int:
        """How many sessions tick on the wall clock (the server keeps precise time only for them)."""
        return sum(1 for s in self.sessions.values() if s.clock is Clock.REALTIME)

    def close_session(self, session_id: str) -> None:
        session = self.sessions.pop(session_id, None)
        if session is not None:
            self._free_slots.append(session.slot)

    def session(self, session_id: str) -> Session:
        """The open session `session_id` (SessionError if there is none)."""
        try:
            return self.sessions[session_id]
        except KeyError:
            raise SessionNotOpen(f"no open session {session_id!r}") from None

    # -- input ----------------------------------------------------------------------------------

    def check_observation(self, session: Session, obs: Observation) -> None:
        """Structure errors (sizes, indices, order): InvalidObservation, which ends the stream.
        Non-finite values are content errors, handled by `without_invalid_content` (never here)."""
        n, n_ctl, n_plan, n_act = self.model.n_features, len(self.card.controls), self.model.n_plan, len(self._actions)
        if not isinstance(obs.features, np.ndarray) or obs.features.shape != (n,):  # in process: a list, say
            names, kind = self.card.feature_names, type(obs.features).__name__
            raise InvalidObservation(
                f"observation seq {obs.seq}: Observation.features has {np.size(obs.features)} values"
                f"{'' if kind == 'ndarray' else f' in a {kind}, not a numpy array'}; expected {n} "
                f"({names[0]}, {names[1]}, ..., {names[-1]}; GetModelInfo lists them in order)"
            )
        if obs.seq == 0:
            raise InvalidObservation(
                "observation seq 0: seq starts at 1 and strictly increases (0 is protobuf's unset value, "
                "so it would hide a client that never sets seq)"
            )
        if obs.seq <= session.last_seq:
            raise InvalidObservation(
                f"observation seq {obs.seq} is not after the previous seq "
                f"{session.last_seq}; sequence numbers must strictly increase"
            )
        if obs.actual_controls is not None and obs.actual_controls.size not in (0, n_ctl):
            raise InvalidObservation(
                f"observation seq {obs.seq}: Observation.actual.controls has {obs.actual_controls.size} "
                f"values; expected {n_ctl} ({', '.join(c.name for c in self.card.controls)}) or none"
            )
        if obs.plan_values is not None and obs.plan_values.shape != (n_plan,):
            raise InvalidObservation(
                f"observation seq {obs.seq}: Observation.plan.values (plan {obs.plan_id!r}) has "
                f"{obs.plan_values.size} values; expected {n_plan} ({', '.join(p.name for p in self.card.plan)})"
            )
        if obs.plan_values is not None and obs.plan_valid_for_ns < 0:
            raise InvalidObservation(
                f"observation seq {obs.seq}: plan {obs.plan_id!r} has valid_for_ns {obs.plan_valid_for_ns}; "
                f"it must be > 0, or 0 for the default ({self.reasons.max_plan_age_ns} ns)"
            )
        # created_ns 0 stands for the observation's own timestamp, which may be negative sensor time
        if obs.plan_values is not None and obs.plan_created_ns != 0 and obs.plan_created_ns > obs.timestamp_ns:
            raise InvalidObservation(
                f"observation seq {obs.seq}: plan {obs.plan_id!r} has created_ns {obs.plan_created_ns}, "
                f"after the observation's timestamp_ns {obs.timestamp_ns}; created_ns is sensor time "
                f"(0: the observation's timestamp)"
            )
        if not -1 <= obs.actual_index < n_act:
            raise InvalidObservation(
                f"observation seq {obs.seq}: Observation.actual.action_index is {obs.actual_index}; "
                f"expected -1 (unknown) or an index into ModelInfo.actions, 0..{n_act - 1}"
            )

    def submit(self, session_id: str, obs: Observation) -> None:
        """REALTIME input: the newest observation replaces an unused older one (counted)."""
        session = self.session(session_id)
        self.check_observation(session, obs)
        if session.last_timestamp_ns is not None and obs.timestamp_ns < session.last_timestamp_ns:
            # sensor time going back is a client bug (or a restarted sensor): say so, don't guess
            raise InvalidObservation(
                f"observation seq {obs.seq} has timestamp {obs.timestamp_ns} ns, before the previous "
                f"observation's (seq {session.last_seq}) {session.last_timestamp_ns} ns; REALTIME "
                f"timestamps must not decrease (equal is allowed)"
            )
        obs = without_invalid_content(obs)
        if session.history is not None:  # into the stream now; its features when a tick uses it
            session.history.append(obs.timestamp_ns, obs.features)
            session.history_due = True
        session.last_seq = obs.seq
        note_observation_time(session, obs.timestamp_ns)
        if obs.plan_values is not None:
            self.set_plan(
                session_id, obs.plan_values, obs.plan_id, obs.plan_created_ns or obs.timestamp_ns, obs.plan_valid_for_ns
            )
        if session.pending is not None:
            session.observations_dropped += 1
        session.pending = obs

    def set_plan(
        self, session_id: str, values: np.ndarray, plan_id: str, created_ns: int, valid_for_ns: int = 0
    ) -> bool:
        """Condition the session on a new plan from now on, valid for `valid_for_ns` (0: the
        default) after `created_ns` (sensor time); a repeated plan id changes nothing, not even
        the validity."""
        session = self.session(session_id)
        if plan_id and plan_id == session.plan_id:
            return False
        session.plan[:] = values
        session.plan_id = plan_id
        session.plan_created_ns = created_ns
        session.plan_valid_for_ns = valid_for_ns or self.reasons.max_plan_age_ns
        session.has_plan = True
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
        return self._run_batch(rows, tick_index, scheduled_ns, lateness_ns) if rows else []

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
        session = self.session(session_id)
        self.check_observation(session, obs)
        self.check_lockstep_time(session, obs)
        obs = without_invalid_content(obs)
        ts = obs.timestamp_ns
        if session.next_tick_ns is None:
            session.next_tick_ns = ts
        session.last_seq = obs.seq
        out: list[Snapshot] = []
        while session.next_tick_ns < ts:  # on the previous observation, with the period it gave
            out += self._lockstep_tick(session)
        note_observation_time(session, ts)
        obs = self._with_history(session, obs)  # after the ticks before it: they never see it
        if session.pending is not None:
            session.observations_dropped += 1  # an off-grid observation no tick got to use
        session.pending = obs
        if obs.plan_values is not None:  # from its timestamp on, not for the ticks before it
            self.set_plan(session_id, obs.plan_values, obs.plan_id, obs.plan_created_ns or ts, obs.plan_valid_for_ns)
        if session.next_tick_ns == ts:
            out += self._lockstep_tick(session)
        return out

    def _with_history(self, session: Session, obs: Observation) -> Observation:
        """The observation with its history features, every received observation entering the
        session's stream (also one a newer replaces before a tick uses it)."""
        if session.history is None:
            return obs
        return replace(obs, history=session.history.push(obs.timestamp_ns, obs.features))

    def check_lockstep_time(self, session: Session, obs: Observation) -> None:
        """LOCKSTEP time strictly increases and jumps at most lockstep_max_gap_s (in whole ticks) past
        the previous observation's, so one observation runs at most max_lockstep_ticks ticks."""
        ts, last, limit_ns = obs.timestamp_ns, session.last_timestamp_ns, self.max_lockstep_ticks * self.period_ns
        if last is not None and ts <= last:
            raise InvalidObservation(
                f"observation seq {obs.seq} has timestamp {ts} ns, not after the previous "
                f"{last} ns; LOCKSTEP time must strictly increase"
            )
        if last is not None and ts - last > limit_ns:
            raise InvalidObservation(
                f"observation seq {obs.seq} jumps {(ts - last) / 1e9:.9f} s past the previous one's "
                f"timestamp; LOCKSTEP refuses jumps over lockstep_max_gap_s={self.config.lockstep_max_gap_s} s "
                f"(SessionLimits.lockstep_max_gap_ns = {limit_ns})"
            )

    @property
    def max_lockstep_ticks(self) -> int:
        return int(self.config.lockstep_max_gap_s * 1e9 / self.period_ns)

    def _lockstep_tick(self, session: Session) -> list[Snapshot]:
        tick_ns = session.next_tick_ns
        assert tick_ns is not None  # advance_lockstep placed the grid before ticking it
        snaps = (
            self._run_batch([session], session.lockstep_tick, tick_ns, 0)
            if (session.pending is not None or session.current is not None)
            else []
        )
        session.lockstep_tick += 1
        session.next_tick_ns = tick_ns + self.period_ns
        return snaps

    def _run_batch(self, rows: list[Session], tick_index: int, tick_ns: int, lateness_ns: int) -> list[Snapshot]:
        n = len(rows)
        t0 = _perf_ns()
        observations, derive, present, has_plan, plan_ages, valid_for = self._gather(rows)
        plan_states, stale_plan = self._plan_rule(rows, has_plan, plan_ages, valid_for, present)
        xn, pn, finite, model_present = self._normalise(rows, observations, derive, present)
        t1 = _perf_ns()
        out, gate_out, model_ok = self._forward(xn, pn, model_present, n)
        t2 = _perf_ns()
        gate = self.gating.step(rows, observations, finite, gate_out)
        t3 = _perf_ns()
        snaps = self._postprocess(
            rows,
            observations,
            finite,
            out,
            model_ok,
            gate,
            tick_index,
            tick_ns,
            lateness_ns,
            (plan_ages, plan_states, stale_plan),
        )
        t4 = _perf_ns()
        cand = self.candidate
        if cand is not None and not cand.paused:  # after the live decision: it cannot change what is applied
            xin = self._x[:n] if self.history is None else self._xm[:n]
            proposals = cand.decide(xin, self._p[:n], model_present, finite, self._tick_no_plan)
            for snap, proposal in zip(snaps, proposals):
                snap.candidate = proposal
            spent = _perf_ns() - t4
            self.stats.candidate_ns += spent
            cand.account(spent, t2 - t1, n, self._config.model_budget_ns, self.period_ns)
        self._account(snaps, (t0, t1, t2, t3, t4))
        return snaps

    def _gather(
        self, rows: list[Session]
    ) -> tuple[list[Observation], list[int], np.ndarray | None, np.ndarray, np.ndarray, np.ndarray]:
        """The tick's inputs into rows 0..n-1 of its buffers (features, plans, freshness, sensor
        profiles): (observations, rows whose history features are due, sensor profiles (None: all
        measured), has a plan, plan ages, plans' validity)."""
        n = len(rows)
        x, p = self._x[:n], self._p[:n]
        observations: list[Observation] = []
        derive: list[int] = []  # rows whose observation's history features are due (REALTIME)
        fresh = self._fresh[:n]
        present: np.ndarray | None = None
        plan_ages, valid_for = np.zeros(n, np.int64), np.zeros(n, np.int64)
        has_plan = np.zeros(n, bool)
        for i, s in enumerate(rows):
            obs = s.pending
            if obs is None:
                obs = s.current
                assert obs is not None  # tick() and _lockstep_tick() take only sessions that have had one
                fresh[i] = False
            else:
                s.current, s.pending = obs, None
                fresh[i] = True
                if s.history_due:
                    derive.append(i)
                    s.history_due = False
            observations.append(obs)
            x[i] = obs.features
            p[i] = s.plan
            # plan age in sensor time: the timestamp of the observation this tick decides on
            if s.has_plan:
                has_plan[i], valid_for[i] = True, s.plan_valid_for_ns
                # saturated: a created_ns in the far past (int64's minimum) is an age beyond int64
                plan_ages[i] = min(max(0, obs.timestamp_ns - s.plan_created_ns), INT64_MAX)
            if s.present is not None:
                if present is None:
                    present = self._present[:n]
                    present[:i] = True
                present[i] = s.present
            elif present is not None:
                present[i] = True
        return observations, derive, present, has_plan, plan_ages, valid_for

    def _normalise(
        self, rows: list[Session], observations: list[Observation], derive: list[int], present: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """(normalised inputs, normalised plans, finite, the model's input profile) of the gathered rows,
        with the history features of `derive`'s observations derived first."""
        n = len(rows)
        x, p = self._x[:n], self._p[:n]
        # the model never sees NaN; such rows are marked INVALID_INPUT later (missing features are
        # masked, not invalid)
        self._tick_present = present
        if self.history is None:
            xn, pn, finite = self.normalisation.apply(x, p, self._xn[:n], self._pn[:n], present)
            return xn, pn, finite, present
        xm, nf = self._xm[:n], self.model.n_features
        xm[:, :nf] = x
        if derive:  # the newest of each session's stream: the observation the tick takes
            assert self._history_ring is not None
            states = [h for h in (rows[i].history for i in derive) if h is not None]
            derived = self._history_ring.newest(states, x[derive])
            for i, h in zip(derive, derived):
                observations[i].history = h
        # every row's observation new (derive lists rows in order): the derived rows, in one copy
        xm[:, nf:] = derived if len(derive) == n else [obs.history for obs in observations]
        model_present = self.model_present(present)
        xn, pn, finite = self.normalisation.apply(xm, p, self._xmn[:n], self._pn[:n], model_present)
        return xn, pn, finite, model_present

    def _forward(
        self, xn: np.ndarray, pn: np.ndarray, model_present: np.ndarray | None, n: int
    ) -> tuple[ModelOutputs | None, ModelOutputs | None, np.ndarray]:
        """(outputs for the decision, outputs for the gates, the model's outputs are finite per row)."""
        out: ModelOutputs | None
        gate_out: ModelOutputs | None
        try:
            out = self.model.forward(xn, pn, model_present)
            # per row, as a replay judges its ticks: one session's input that overflows the model
            # (finite, but huge) costs that session its proposal, not every session on the tick
            model_ok = np.isfinite(out.logits).all(axis=1) & np.isfinite(out.controls).all(axis=1)
        except Exception:  # noqa: BLE001 - any runtime failure degrades the tick, never the loop
            out, model_ok = None, np.zeros(n, bool)
        gate_out = out
        if not model_ok.all():
            self.stats.model_errors += int(np.count_nonzero(~model_ok))
            if not model_ok.any():
                out = gate_out = None
            else:  # the decision-vector gates score a failed row as NaN (a replay's `fill_gate_features`)
                assert out is not None
                dv = np.where(model_ok[:, None], out.decision_vector, np.float32(np.nan))
                gate_out = replace(out, decision_vector=dv)
        return out, gate_out, model_ok

    def _account(self, snaps: list[Snapshot], t: tuple[int, int, int, int, int]) -> None:
        """The stage timings (`t`: the perf counter at the tick's start and after each stage) onto the
        tick's snapshots and into the executor's totals."""
        t0, t1, t2, t3, t4 = t
        timings = StageTimings((t1 - t0) // 1000, (t2 - t1) // 1000, (t3 - t2) // 1000, (t4 - t3) // 1000)
        emit_ns = _mono_ns()
        for snap in snaps:
            snap.timings = timings
            snap.emit_time_ns = emit_ns
        st = self.stats
        st.ticks += 1
        st.rows += len(snaps)
        st.stage_ns[0] += t1 - t0
        st.stage_ns[1] += t2 - t1
        st.stage_ns[2] += t3 - t2
        st.stage_ns[3] += t4 - t3

    def model_present(self, present: np.ndarray | None) -> np.ndarray | None:
        """The model's input profile (rows, n_inputs) of wire sensor profiles (rows, F): a history
        feature is missing when a feature it reads is."""
        if present is None or self.history is None:
            return present
        return np.concatenate([present, self.history.present(present)], axis=1)

    def _plan_rule(
        self,
        rows: list[Session],
        has_plan: np.ndarray,
        ages: np.ndarray,
        valid_for: np.ndarray,
        present: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(PlanState, STALE_PLAN) per row; rows without a valid plan get the default plan in the tick's
        plans (executor.default_plan), from their gathered features and sensor profiles `present`."""
        if len(rows) == 1:  # LOCKSTEP and most REALTIME ticks: no per-row arrays of flags
            s = rows[0]
            state, valid, stale = plan_rule(has_plan, ages, valid_for, s.require_plan, s.expired_plan_is_stale)
        else:
            require = np.fromiter((s.require_plan for s in rows), bool, len(rows))
            expired_stale = np.fromiter((s.expired_plan_is_stale for s in rows), bool, len(rows))
            state, valid, stale = plan_rule(has_plan, ages, valid_for, require, expired_stale)
        self._tick_no_plan = None if valid.all() else ~valid
        if self._tick_no_plan is not None:
            n = len(rows)
            self.default_plan.fill(self._p[:n], self._tick_no_plan, self._x[:n], present)
        return state, stale

    def propose(self, out: ModelOutputs) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The model's proposal per row: (probabilities, top-1 index, its probability, top-1 minus
        top-2 margin, controls clipped to the card's ranges)."""
        n = len(out.logits)
        with np.errstate(invalid="ignore", over="ignore"):  # a row the model failed on: NaN, never used
            z = out.logits * self._inv_temperature
            z -= z.max(axis=1, keepdims=True)
            probs = np.exp(z)
            probs /= probs.sum(axis=1, keepdims=True)
        top = np.argsort(-probs, axis=1, kind="stable")[:, :2]
        top1 = probs[np.arange(n), top[:, 0]]
        margin = top1 - probs[np.arange(n), top[:, 1]]
        return probs, top[:, 0], top1, margin, np.clip(out.controls, self._ctrl_min, self._ctrl_max)

    def _postprocess(
        self,
        rows: list[Session],
        observations: list[Observation],
        finite: np.ndarray,
        out: ModelOutputs | None,
        model_ok: np.ndarray,
        gate: GateVerdicts | None,
        tick_index: int,
        tick_ns: int,
        lateness_ns: int,
        plans: tuple[np.ndarray, np.ndarray, np.ndarray],
    ) -> list[Snapshot]:
        """`model_ok`: the model's outputs for the row are finite (`out` None: no row's);
        `plans`: each row's (plan age, PlanState, STALE_PLAN) by the plan rule."""
        n = len(rows)
        plan_ages, plan_states, stale_plan = plans
        if out is not None:
            probs, top, top1, margin, controls = self.propose(out)
        else:
            margin = np.zeros(n, np.float32)
        ages, periods, flags = self._flag_rows(rows, observations, finite, model_ok, gate, margin, stale_plan, tick_ns)
        hashes = input_hashes(self._x[:n], self._p[:n]).tolist()
        table = self._check_table(rows, finite, model_ok, gate is not None, margin)
        # the batch's columns as Python values, once: a numpy scalar per row and field costs more
        # than the rule itself at a live tick's few dozen rows
        reasons = [list(REASONS_OF_FLAGS[f]) for f in flags.tolist()]
        proposals: list[AppliedAction | None] = [None] * n
        prob_rows: list[np.ndarray] = []
        confs: list[float] = []
        margins: list[float] = []
        if out is not None:
            # rows of this tick's own arrays (fresh every tick), not copies
            prob_rows, control_rows = list(probs), list(controls)
            tops, confs, margins = top.tolist(), top1.tolist(), margin.tolist()
            scored = (finite & model_ok).tolist()  # a row the model failed on proposes nothing
            for i in range(n):
                if scored[i]:
                    proposals[i] = AppliedAction(tops[i], self._actions[tops[i]], control_rows[i])
        # frozen readings steer no fallback and are no threat; the check table is read only on a veto
        vetoed = gate is not None and gate[2].any()
        decided = self.safety.decide_batch(
            [s.safety for s in rows],
            tick_ns,
            reasons,
            proposals,
            self._x[:n],
            (~self._frozen[:n]).tolist(),
            self.checks.actuation_only(table).tolist() if vetoed else None,
            [obs.release_standstill for obs in observations]
            if any(o.release_standstill for o in observations)
            else None,
            self.checks.lead_doubt(table).tolist() if vetoed else None,
        )
        columns = TickRows(
            tick_index,
            tick_ns,
            max(0, lateness_ns) // 1000,
            ages.tolist(),
            periods,
            (~self._fresh[:n]).tolist(),
            finite.tolist(),
            hashes,
            plan_ages.tolist(),
            plan_states.tolist(),
            reasons,
            proposals,
            prob_rows,
            confs,
            margins,
            decided,
            None if out is None else out.decision_vector,
            model_ok,
            gate,
            list(table),
        )
        return tick_snapshots(rows, observations, columns, self.card.version, self.checks.kinds)

    def _flag_rows(
        self,
        rows: list[Session],
        observations: list[Observation],
        finite: np.ndarray,
        model_ok: np.ndarray,
        gate: GateVerdicts | None,
        margin: np.ndarray,
        stale_plan: np.ndarray,
        tick_ns: int,
    ) -> tuple[np.ndarray, list[int], np.ndarray]:
        """(observation ages at `tick_ns`, the periods staleness is judged against, reason flags) per row."""
        n = len(rows)
        ages = np.fromiter(
            (
                tick_ns - (obs.arrival_ns if s.clock is Clock.REALTIME else obs.timestamp_ns)
                for s, obs in zip(rows, observations)
            ),
            np.int64,
            n,
        )
        np.maximum(ages, 0, out=ages)
        periods = [self.observation_period_ns(s) for s in rows]
        flags = self.reasons.flags(
            finite,
            model_ok,
            ages,
            stale_plan,
            gate[2] if gate is not None else np.zeros(n, bool),
            margin,
            np.array(periods, np.int64),
            np.fromiter((bool(obs.invalid_parts) for obs in observations), bool, n),
        )
        return ages, periods, flags

    def _check_table(
        self, rows: list[Session], finite: np.ndarray, model_ok: np.ndarray, gated: bool, margin: np.ndarray
    ) -> np.ndarray:
        """The tick's (rows, checks) results (DecisionSnapshot.checks), from what the gate step kept."""
        n = len(rows)
        last = self.gating.last if gated else None
        changes = None if last is None else last.changes
        return self.checks.assemble(
            CheckValues(
                finite,
                finite & model_ok,
                None if last is None else last.density,
                self._x[:n],
                self._p[:n],
                changes,
                self._tick_present,
                None if last is None else last.freeze_count,
                self._frozen[:n],
                None if last is None else last.actuation,
                margin,
                self.reasons.min_margin,
                signals=None if last is None else last.signals,
            )
        )
