"""A whole LOCKSTEP session in one pass (replay): the decisions of `advance_lockstep`, ~100x faster.

Replay inputs never depend on the controller's outputs, so a tick's memoryless work (validation, the
forward pass, gate scores, probabilities, reason flags, the input hash) is done once per observation,
vectorised, and gathered onto the tick grid. What has memory runs as scans over the ticks: each
gate's sequential filter and the freeze check (their `scan` methods in ood/), and the safe-state
machine, which is stepped tick by tick only where something happens (a tick with a reason, a tick at
rest behind a stopped lead or ramping out of that hold, or any state but NOMINAL). A stretch of
clean NOMINAL ticks applies the model's proposals as they are, and leaves the machine's memory as
stepping through it would (`SafetyMachine.trust_run`).

`advance_lockstep` stays the reference: tests compare both paths tick by tick, on logs with faults,
gaps, plan changes and off-grid observations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from dualloop.executor.checks import CheckValues
from dualloop.executor.columns import as_columns
from dualloop.executor.core import Executor
from dualloop.executor.gating import RowScores
from dualloop.executor.model_runner import ModelOutputs
from dualloop.executor.reasons import REASONS_OF_FLAGS, plan_rule
from dualloop.executor.sessions import PERIOD_WINDOW, Session, median_interval, without_invalid_content
from dualloop.executor.snapshot import (
    AppliedAction,
    Check,
    Observation,
    PlanState,
    Reason,
    SafetyState,
    Snapshot,
    StageTimings,
    input_hashes,
)


@dataclass
class TickTable:
    """One LOCKSTEP session's ticks as columns, row k = tick k; `snapshots()` gives the Snapshots."""

    session_id: str
    shadow: bool
    model_version: str
    actions: list[str]
    observations: Sequence[Observation]
    tick_ns: np.ndarray  # (T,) int64 scheduled time
    obs_index: np.ndarray  # (T,) the observation each tick used
    age_ns: np.ndarray  # (T,) int64
    held: np.ndarray  # (T,) bool: the tick reused the observation of an earlier tick
    observation_period_ns: np.ndarray  # (T,) int64: what staleness was judged against
    plan_id: list[str]  # per observation: the plan in force from it on
    plan_age_ns: np.ndarray  # (T,) int64
    plan_state: np.ndarray  # (T,) int64 PlanState values
    plan_valid_for_ns: np.ndarray  # (T,) int64, 0 without a plan
    scored: np.ndarray  # (T,) bool: finite input and a working model
    finite: np.ndarray  # (T,) bool: the measured features were finite
    proposed: np.ndarray  # (T,) int64 action index
    probabilities: np.ndarray  # (T, actions) float32
    proposed_controls: np.ndarray  # (T, controls) float32
    confidence: np.ndarray  # (T,) float32
    margin: np.ndarray  # (T,) float32
    applied: np.ndarray  # (T,) int64 action index
    applied_controls: np.ndarray  # (T, controls) float32
    reasons: list[tuple[Reason, ...]]
    safety_state: np.ndarray  # (T,) int64 SafetyState values
    input_hash: np.ndarray  # (T,) uint64
    gate_score: np.ndarray | None  # (T,) float64; None without gates
    gate_threshold: np.ndarray | None
    gate_veto: np.ndarray  # (T,) bool
    observations_dropped: np.ndarray  # (T,) int64
    decision_vector: np.ndarray | None  # (T, dim) when the session asked for it
    check_kinds: tuple[Check, ...] = ()
    checks: np.ndarray | None = None  # (T, checks) CHECK_DTYPE, as the live ticks' snapshots carry them

    def __len__(self) -> int:
        return len(self.tick_ns)

    def snapshots(self) -> list[Snapshot]:
        # Rows of the table's arrays are handed out as views: nothing reuses them (a live tick copies
        # out of its reused buffers instead).
        empty = np.zeros(0, np.float32)
        states = {int(s): s for s in SafetyState}
        plan_states = {int(s): s for s in PlanState}
        timings = StageTimings()  # wall-clock by nature; a replay has none per tick
        names, obs_all = self.actions, self.observations
        if as_columns(obs_all) is not None:  # one Observation per observation, not one per tick
            obs_all = list(obs_all)
        gate_score, gate_threshold = self.gate_score, self.gate_threshold  # both None without gates
        out = []
        for k in range(len(self.tick_ns)):
            obs = obs_all[self.obs_index[k]]
            scored = bool(self.scored[k])
            idx = int(self.proposed[k]) if scored else -1
            applied = int(self.applied[k])
            out.append(
                Snapshot(
                    session_id=self.session_id,
                    tick=k,
                    scheduled_time_ns=int(self.tick_ns[k]),
                    emit_time_ns=0,
                    lateness_us=0,
                    observation_seq=obs.seq,
                    observation_age_ns=int(self.age_ns[k]),
                    model_version=self.model_version,
                    proposed_index=idx,
                    proposed_name=names[idx] if scored else "",
                    probabilities=self.probabilities[k] if scored else empty,
                    proposed_controls=self.proposed_controls[k] if scored else empty,
                    confidence=float(self.confidence[k]) if scored else 0.0,
                    margin=float(self.margin[k]) if scored else 0.0,
                    applied=AppliedAction(applied, names[applied], self.applied_controls[k]),
                    reasons=self.reasons[k],
                    safety_state=states[int(self.safety_state[k])],
                    input_hash=int(self.input_hash[k]),
                    timings=timings,
                    shadow=self.shadow,
                    plan_id=self.plan_id[self.obs_index[k]],
                    plan_age_ns=int(self.plan_age_ns[k]),
                    plan_state=plan_states[int(self.plan_state[k])],
                    plan_valid_for_ns=int(self.plan_valid_for_ns[k]),
                    # none on a tick the model failed on, as a live tick (its values may not be finite)
                    decision_vector=self.decision_vector[k]
                    if self.decision_vector is not None and Reason.MODEL_ERROR not in self.reasons[k]
                    else None,
                    observations_dropped=int(self.observations_dropped[k]),
                    observation_held=bool(self.held[k]),
                    observation_period_ns=int(self.observation_period_ns[k]),
                    actual_index=obs.actual_index,
                    actual_controls=obs.actual_controls,
                    invalid_input=obs.invalid_parts if self.finite[k] else ("features", *obs.invalid_parts),
                    gate_score=float(gate_score[k]) if gate_score is not None else None,
                    gate_threshold=float(gate_threshold[k]) if gate_threshold is not None else None,
                    gate_veto=bool(self.gate_veto[k]),
                    check_kinds=self.check_kinds,
                    checks=None if self.checks is None else self.checks[k],
                )
            )
        return out


@dataclass(frozen=True)
class _Grid:
    """The tick grid: a tick every period from the first timestamp; each uses the newest observation
    at or before its time (as advance_lockstep: ticks strictly before an observation use the previous one)."""

    tick_ns: np.ndarray  # (T,) int64 scheduled time
    which: np.ndarray  # (T,) the observation each tick uses
    fresh: np.ndarray  # (T,) bool: the tick is the first to use its observation
    used: np.ndarray  # (N,) bool: some tick uses the observation
    dropped_before: np.ndarray  # (N,) observations dropped up to each one (a newer one arrived before any tick)

    @classmethod
    def of(cls, ts: np.ndarray, period: int) -> _Grid:
        n_ticks = int((ts[-1] - ts[0]) // period) + 1
        tick_ns = ts[0] + np.arange(n_ticks, dtype=np.int64) * period
        which = np.searchsorted(ts, tick_ns, side="right") - 1
        fresh = np.ones(n_ticks, bool)
        fresh[1:] = which[1:] != which[:-1]
        used = np.zeros(len(ts), bool)
        used[which] = True
        return cls(tick_ns, which, fresh, used, np.cumsum(~used))


@dataclass(frozen=True)
class _Plans:
    """Per observation: the plan in force from it on (`_plans`) and the plan rule's verdict on it."""

    values: np.ndarray  # (N, plan) float32
    ids: list[str]
    created: np.ndarray  # (N,) int64
    valid_for: np.ndarray  # (N,) int64 resolved validity
    has: np.ndarray  # (N,) bool: any plan yet
    age: np.ndarray  # (N,) int64, saturated
    state: np.ndarray  # (N,) PlanState values
    valid: np.ndarray  # (N,) bool
    stale: np.ndarray  # (N,) bool: STALE_PLAN

    @classmethod
    def of(cls, ex: Executor, session: Session, observations: Sequence[Observation], ts: np.ndarray) -> _Plans:
        values, ids, created, valid_for, has = _plans(ex, observations)
        # The plan rule, per observation: a plan's age is sensor time, the timestamp of the observation
        # a tick decides on, so held ticks share their observation's plan state (as live ticks do).
        # created <= ts (validated), so a negative difference is int64 wrapping round: an age beyond
        # int64 (a created_ns in the far past), saturated as a live tick saturates it
        age = ts - created
        plan_age = np.where(has, np.where(age < 0, np.iinfo(np.int64).max, age), 0)
        state, valid, stale = plan_rule(has, plan_age, valid_for, session.require_plan, session.expired_plan_is_stale)
        return cls(values, ids, created, valid_for, has, plan_age, state, valid, stale)


@dataclass(frozen=True)
class _Scored:
    """The memoryless work, once per observation row that ticks use (`rows`)."""

    rows: np.ndarray  # (R,) indices of the used observations
    x: np.ndarray  # (R, F) their features
    p: np.ndarray  # (R, plan) the plans the model saw (the default where none is valid)
    finite: np.ndarray  # (R,) bool
    out: ModelOutputs | None
    model_ok: np.ndarray  # (R,) bool
    probs: np.ndarray
    top: np.ndarray
    top1: np.ndarray
    margin: np.ndarray
    controls: np.ndarray
    gate_rows: list[RowScores]
    hashes: np.ndarray

    @classmethod
    def of(
        cls, ex: Executor, session: Session, feats: np.ndarray, ts: np.ndarray, rows: np.ndarray, plans: _Plans
    ) -> _Scored:
        x, p = feats[rows], plans.values[rows].copy()
        present = None if session.present is None else np.broadcast_to(session.present, x.shape)
        ex.default_plan.fill(p, ~plans.valid[rows], x, present)
        if ex.history is None:
            xn, pn, finite = ex.normalisation.apply(x, p, present=present)
        else:  # history features of the used observations, from the whole stream (as pushed live)
            present = ex.model_present(present)
            xn, pn, finite = ex.normalisation.apply(
                np.concatenate([x, ex.history.batch(ts, feats, rows)], axis=1), p, present=present
            )
        out: ModelOutputs | None
        try:
            out = ex.model.forward(xn, pn, present)
            model_ok = np.isfinite(out.logits).all(axis=1) & np.isfinite(out.controls).all(axis=1)
        except Exception:  # noqa: BLE001 - as in a live tick: every tick degrades to MODEL_ERROR
            out, model_ok = None, np.zeros(len(rows), bool)
        n_act, n_ctl = len(ex.card.actions), len(ex.card.controls)
        if out is not None:
            probs, top, top1, margin, controls = ex.propose(out)
        else:
            probs, controls = np.zeros((len(rows), n_act), np.float32), np.zeros((len(rows), n_ctl), np.float32)
            top, top1, margin = (
                np.zeros(len(rows), np.int64),
                np.zeros(len(rows), np.float32),
                np.zeros(len(rows), np.float32),
            )
        dv = out.decision_vector if out is not None else None
        gate_rows = ex.gating.score_rows(x, p, dv, finite, model_ok, session.slot, ts[rows], session.present)
        hashes = input_hashes(x, p)
        return cls(rows, x, p, finite, out, model_ok, probs, top, top1, margin, controls, gate_rows, hashes)


@dataclass(frozen=True)
class _Scans:
    """What has memory, scanned over the ticks: the freeze check, actuation, each gate's filter, the
    per-signal checks; `veto` (T,) is every veto of them together."""

    counts: np.ndarray | None  # (T,) the freeze check's repeat count; None without it
    frozen: np.ndarray  # (T,) bool
    actuation: tuple[np.ndarray, np.ndarray] | None  # per observation row
    density: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
    score: np.ndarray | None
    threshold: np.ndarray | None
    veto: np.ndarray
    signals: np.ndarray | None  # per observation row

    @classmethod
    def of(
        cls,
        ex: Executor,
        session: Session,
        observations: Sequence[Observation],
        feats: np.ndarray,
        ts: np.ndarray,
        m: _Scored,
        r: np.ndarray,
        x_ticks: np.ndarray,
        fresh: np.ndarray,
    ) -> _Scans:
        gating = ex.gating
        counts = gating.scan_freeze_counts(x_ticks, session.slot, fresh, session.present)
        frozen = np.zeros(len(r), bool) if counts is None else counts >= gating.freeze.repeats  # type: ignore[union-attr]
        actuation = gating.scan_actuation(session, observations, feats, ts, m.rows)
        density: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        score, threshold, veto = gating.scan(session.slot, m.gate_rows, r, actuation, session.present, density)
        veto |= frozen
        signals = gating.scan_signals(m.x, session.slot, ts[m.rows], session.present)
        signal_veto = gating.signal_vetoes(signals)
        if signal_veto is not None:
            veto |= signal_veto[r]
        return cls(counts, frozen, actuation, density, score, threshold, veto, signals)


def run_lockstep(ex: Executor, session_id: str, observations: Sequence[Observation]) -> TickTable:
    """All ticks of the new LOCKSTEP session `session_id` fed with `observations`, in one vectorised
    pass: the same decisions as `ex.advance_lockstep` observation by observation, and the session
    left as those calls would leave it."""
    session = ex.session(session_id)
    if session.last_timestamp_ns is not None or session.lockstep_tick:
        raise ValueError(f"session {session.session_id!r} has ticked already; run_lockstep needs a new session")
    feats, ts = _validate(ex, session, observations)
    observations, bad_content = _without_invalid_content(observations)
    grid = _Grid.of(ts, ex.period_ns)
    which, plans = grid.which, _Plans.of(ex, session, observations, ts)
    m = _Scored.of(ex, session, feats, ts, np.flatnonzero(grid.used), plans)  # memoryless, once per used row
    # -- onto the tick grid --
    r = np.searchsorted(m.rows, which)  # row of each tick's observation
    age = grid.tick_ns - ts[which]
    x_ticks = feats[which]
    scans = _Scans.of(ex, session, observations, feats, ts, m, r, x_ticks, grid.fresh)
    periods = _observation_periods(ex, session, ts)[which]
    flags = ex.reasons.flags(
        m.finite[r], m.model_ok[r], age, plans.stale[which], scans.veto, m.margin[r], periods, bad_content[which]
    )
    scored = (m.finite & m.model_ok)[r]
    checks = _checks(ex, session, m, scans, r, x_ticks, scored)
    # columns never carry a release (the column decoder leaves such logs to the Observation path)
    release = (
        np.zeros(len(which), bool)
        if as_columns(observations) is not None
        else np.fromiter((o.release_standstill for o in observations), bool, len(observations))[which]
    )
    safety = _SafetyInputs(
        flags,
        scored,
        m.top[r],
        m.controls[r],
        grid.tick_ns,
        x_ticks,
        scans.frozen,
        ex.checks.actuation_only(checks),
        release,
        ex.checks.lead_doubt(checks),
    )
    applied, applied_controls, state, reasons = _safety_scan(ex, session, safety)
    table = TickTable(
        session_id=session.session_id,
        shadow=session.shadow,
        model_version=ex.card.version,
        actions=list(ex.card.actions),
        observations=observations,
        tick_ns=grid.tick_ns,
        obs_index=which,
        age_ns=age,
        held=~grid.fresh,
        observation_period_ns=periods,
        plan_id=plans.ids,
        plan_age_ns=plans.age[which],
        plan_state=plans.state[which],
        plan_valid_for_ns=np.where(plans.has, plans.valid_for, 0)[which],
        scored=scored,
        finite=m.finite[r],
        proposed=m.top[r],
        probabilities=m.probs[r],
        proposed_controls=m.controls[r],
        confidence=m.top1[r],
        margin=m.margin[r],
        applied=applied,
        applied_controls=applied_controls,
        reasons=reasons,
        safety_state=state,
        input_hash=m.hashes[r],
        gate_score=scans.score,
        gate_threshold=scans.threshold,
        gate_veto=scans.veto,
        observations_dropped=grid.dropped_before[which],
        decision_vector=m.out.decision_vector[r] if (session.include_decision_vector and m.out is not None) else None,
        check_kinds=ex.checks.kinds,
        checks=checks,
    )
    _leave_session(ex, session, observations, feats, ts, table, plans, grid.used)
    ex.stats.model_errors += int(np.count_nonzero(~m.model_ok[r]))
    return table


def _without_invalid_content(observations: Sequence[Observation]) -> tuple[Sequence[Observation], np.ndarray]:
    """(the observations, which had invalid content), content errors as advance_lockstep treats them:
    non-finite plans discarded (a column's plans are all finite, so nothing of theirs is ever discarded)."""
    if as_columns(observations) is not None:
        return observations, np.zeros(len(observations), bool)
    cleaned = [without_invalid_content(o) for o in observations]
    return cleaned, np.fromiter((bool(o.invalid_parts) for o in cleaned), bool, len(cleaned))


def _checks(
    ex: Executor,
    session: Session,
    m: _Scored,
    scans: _Scans,
    r: np.ndarray,
    x_ticks: np.ndarray,
    scored: np.ndarray,
) -> np.ndarray:
    """The check table (T, checks) CHECK_DTYPE, as the live ticks' snapshots carry it."""
    changes = ex.gating.scanned_changes
    present = session.present
    # the range checks once per observation row, not once per tick that holds it, on the plans the
    # model and the gates saw (a card's default plan raised to the row's features, as a live tick's)
    ranged = ex.checks.judge_ranges(
        m.x, changes, m.p, None if present is None else np.broadcast_to(present, m.x.shape), m.finite
    )
    actuation = scans.actuation
    return ex.checks.assemble(
        CheckValues(
            m.finite[r],
            scored,
            scans.density if ex.gating.runs else None,
            x_ticks,
            m.p[r],
            None if changes is None else changes[r],
            None if present is None else np.broadcast_to(present, x_ticks.shape),
            scans.counts,
            scans.frozen,
            None if actuation is None else (actuation[0][r], actuation[1][r]),
            m.margin[r],
            ex.reasons.min_margin,
            ranged=None if ranged is None else ranged[r],
            signals=None if scans.signals is None else scans.signals[r],
        )
    )


def _validate(ex: Executor, session: Session, observations: Sequence[Observation]) -> tuple[np.ndarray, np.ndarray]:
    """(features (N, F) float32, timestamps (N,)); vectorised checks, and on any failure the
    observation-by-observation checks of advance_lockstep, which name the first bad one."""
    if not observations:
        raise ValueError("no observations to run")
    n_feat, n_ctl, n_act = ex.model.n_features, len(ex.card.controls), len(ex.card.actions)
    cols = as_columns(observations)
    if cols is not None:
        ts, seq, actual, feats = cols.timestamp_ns, cols.seq, cols.actual_index, cols.features
        ok = feats.shape[1:] == (n_feat,) and cols.actual_controls.shape[1] in (0, n_ctl)
        plans = cols.plans
        if plans is not None:  # as the per-observation checks below (created 0: the timestamp)
            has = plans.present
            created = np.where(plans.created_ns == 0, ts, plans.created_ns)
            ok = ok and plans.values.shape[1] == ex.model.n_plan
            ok = ok and not np.any(has & ((plans.valid_for_ns < 0) | (created > ts)))
    else:
        ts = np.fromiter((o.timestamp_ns for o in observations), np.int64, len(observations))
        seq = np.fromiter((o.seq for o in observations), np.int64, len(observations))
        actual = np.fromiter((o.actual_index for o in observations), np.int64, len(observations))
        try:
            feats = _stacked_features(observations)
            ok = feats.shape[1:] == (n_feat,)
        except ValueError:
            feats, ok = np.zeros((0, n_feat), np.float32), False
        ok = ok and all(o.actual_controls is None or o.actual_controls.size in (0, n_ctl) for o in observations)
    ok = ok and seq[0] > session.last_seq and bool(np.all(np.diff(seq) > 0)) and bool(np.all(np.diff(ts) > 0))
    ok = ok and bool(np.all((actual >= -1) & (actual < n_act)))
    ok = ok and (
        cols is not None  # checked above
        or all(
            o.plan_values.shape == (ex.model.n_plan,)
            and o.plan_valid_for_ns >= 0
            and (o.plan_created_ns or o.timestamp_ns) <= o.timestamp_ns  # 0: the observation's timestamp
            for o in observations
            if o.plan_values is not None
        )
    )
    # the gap limit as check_lockstep_time: from the previous observation's timestamp
    ok = ok and bool(np.all(np.diff(ts) <= ex.max_lockstep_ticks * ex.period_ns))
    if not ok:
        scratch = replace(session)
        for obs in observations:  # raises with the message a live session would get
            ex.check_observation(scratch, obs)
            ex.check_lockstep_time(scratch, obs)
            scratch.last_seq, scratch.last_timestamp_ns = obs.seq, obs.timestamp_ns
        raise ValueError("observations failed a check that the per-observation checks accept (a bug)")
    return feats, ts


def _stacked_features(observations: Sequence[Observation]) -> np.ndarray:
    """(N, F) float32: the observations' features as np.stack(...).astype(np.float32) gives them
    (ValueError when their shapes differ), in a quarter of its time."""
    return np.array([o.features for o in observations], np.float32)


def _observation_periods(ex: Executor, session: Session, ts: np.ndarray) -> np.ndarray:
    """The period each observation's ticks are judged against, as `note_observation_time` and
    `Executor.observation_period_ns` give it observation by observation."""
    if session.observation_period_ns:
        return np.full(len(ts), session.observation_period_ns, np.int64)
    # the upper median of the last PERIOD_WINDOW intervals (fewer at the start), as median_interval
    # gives it: the first observations one by one, then every full window at once
    out = np.empty(len(ts), np.int64)
    out[0] = ex.observation_period_ns(session)
    gaps = np.diff(ts)
    head = min(len(gaps), PERIOD_WINDOW - 1)
    for i in range(1, head + 1):
        out[i] = median_interval(gaps[:i].tolist())
    if len(gaps) >= PERIOD_WINDOW:
        windows = np.lib.stride_tricks.sliding_window_view(gaps, PERIOD_WINDOW)
        out[PERIOD_WINDOW:] = np.partition(windows, PERIOD_WINDOW // 2, axis=1)[:, PERIOD_WINDOW // 2]
    intervals = gaps[-PERIOD_WINDOW:].tolist()
    session.intervals_ns, session.measured_period_ns = intervals, median_interval(intervals)
    return out


def _plans(
    ex: Executor, observations: Sequence[Observation]
) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray, np.ndarray]:
    """The plan received by each observation (values, id, creation time, resolved validity, whether
    any): a client plan applies from its observation's timestamp; a repeated plan id changes
    nothing (`Executor.set_plan`)."""
    n = len(observations)
    cols = as_columns(observations)
    if cols is not None and cols.plans is None:  # no plans: the default throughout
        no = np.zeros(n, np.int64)
        return np.tile(ex.plan_default, (n, 1)).astype(np.float32), [""] * n, no, no.copy(), np.zeros(n, bool)
    # the observations that change the plan in force, in Python (a plan every 200 ms: a few in a
    # hundred); everything else follows the last of them
    default_validity = ex.reasons.max_plan_age_ns
    at: list[int] = []
    plan_id = ""
    if cols is not None and cols.plans is not None:
        plans = cols.plans
        for i in np.flatnonzero(plans.present).tolist():
            if not (plans.plan_id[i] and plans.plan_id[i] == plan_id):
                at.append(i)
                plan_id = plans.plan_id[i]
        adopted = np.array(at, np.int64)
        new_values = plans.values[adopted]
        new_ids = [plans.plan_id[i] for i in at]
        new_created = np.where(plans.created_ns[adopted] == 0, cols.timestamp_ns[adopted], plans.created_ns[adopted])
        new_valid_for = np.where(plans.valid_for_ns[adopted] == 0, default_validity, plans.valid_for_ns[adopted])
    else:
        carriers: list[Observation] = []
        for i, o in enumerate(observations):
            if o.plan_values is not None and not (o.plan_id and o.plan_id == plan_id):
                at.append(i)
                carriers.append(o)
                plan_id = o.plan_id
        new_values = np.array([o.plan_values for o in carriers], np.float32).reshape(len(at), len(ex.plan_default))
        new_ids = [o.plan_id for o in carriers]
        new_created = np.array([o.plan_created_ns or o.timestamp_ns for o in carriers], np.int64)
        new_valid_for = np.array([o.plan_valid_for_ns or default_validity for o in carriers], np.int64)
    k = np.searchsorted(np.array(at, np.int64), np.arange(n), side="right") - 1  # -1: no plan yet
    has = k >= 0
    values = np.concatenate([np.asarray(ex.plan_default, np.float32)[None, :], new_values])[k + 1]
    ids = ["", *new_ids]
    created = np.concatenate([np.zeros(1, np.int64), new_created])[k + 1]
    valid_for = np.concatenate([np.zeros(1, np.int64), new_valid_for])[k + 1]
    return values, [ids[j] for j in (k + 1).tolist()], created, valid_for, has


@dataclass(frozen=True)
class _SafetyInputs:
    """What the safe-state machine takes per tick (T,): reason flags, a proposal (scored, its action and
    controls), the tick's time and features, the freeze verdict, the actuation-only veto, a release,
    the lead's readings doubted by their checks."""

    flags: np.ndarray
    scored: np.ndarray
    top: np.ndarray
    controls: np.ndarray
    tick_ns: np.ndarray
    x: np.ndarray
    frozen: np.ndarray
    actuation_only: np.ndarray
    release: np.ndarray
    lead_doubt: np.ndarray  # LeadDoubt per tick


def _safety_scan(
    ex: Executor, session: Session, ticks: _SafetyInputs
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[tuple[Reason, ...]]]:
    flags, scored, top, controls, tick_ns = ticks.flags, ticks.scored, ticks.top, ticks.controls, ticks.tick_ns
    x, frozen, actuation_only, release = ticks.x, ticks.frozen, ticks.actuation_only, ticks.release
    n = len(flags)
    banded = ex.safety.band_indices(controls)
    applied = top.astype(np.int64, copy=True) if banded is None else banded
    applied_controls = controls.astype(np.float32, copy=True)
    state = np.full(n, int(SafetyState.NOMINAL), np.int64)
    reasons = [REASONS_OF_FLAGS[f] for f in flags.tolist()]
    names, mem, machine = ex.card.actions, session.safety, ex.safety
    keep = machine.config.rollback_ticks + 1
    at_rest = np.zeros(n, bool) if machine.standstill is None else machine.standstill.engaged_rows(x) & ~frozen
    events = np.flatnonzero((flags != 0) | release | at_rest)
    t = 0
    while t < n:
        if mem.state is SafetyState.NOMINAL and not mem.lead_hold:
            nxt = events[np.searchsorted(events, t)] if events.size and events[-1] >= t else n
            if nxt > t:  # clean NOMINAL ticks: the proposals apply as they are (filled above)
                machine.follow_lead_rows(mem, tick_ns[t:nxt], x[t:nxt], ~frozen[t:nxt])
                last = range(max(t, nxt - keep), nxt)
                machine.trust_run(
                    mem,
                    [AppliedAction(int(top[k]), names[top[k]], controls[k].copy()) for k in last],
                    [x[k] for k in range(max(t, nxt - max(keep, machine.history_ticks)), nxt)],
                )
                t = nxt
                continue
        tick_reasons = list(reasons[t])
        proposal = AppliedAction(int(top[t]), names[top[t]], controls[t].copy()) if scored[t] else None
        action, st = machine.decide(
            mem,
            int(tick_ns[t]),
            tick_reasons,
            proposal,
            None if frozen[t] else x[t],
            bool(actuation_only[t]),
            bool(release[t]),
            int(ticks.lead_doubt[t]),
        )
        applied[t], applied_controls[t], state[t] = action.index, action.controls, int(st)
        reasons[t] = tuple(tick_reasons)
        t += 1
    return applied, applied_controls, state, reasons


def _leave_session(
    ex: Executor,
    session: Session,
    observations: Sequence[Observation],
    feats: np.ndarray,
    ts: np.ndarray,
    table: TickTable,
    plans: _Plans,
    used: np.ndarray,
) -> None:
    """The session as advance_lockstep would have left it, so live ticks may continue from here."""
    held = observations[int(table.obs_index[-1])]
    last = observations[-1]
    if session.history is not None:  # the stream's tail, and the history of what later ticks hold on
        session.history.load(ts, feats)
        assert ex.history is not None
        h = ex.history.batch(ts, feats, np.array([int(table.obs_index[-1]), len(observations) - 1]))
        held, last = replace(held, history=h[0]), replace(last, history=h[1])
        if int(table.obs_index[-1]) == len(observations) - 1:
            held = last
    n_ticks = len(table)
    session.last_seq, session.last_timestamp_ns = last.seq, last.timestamp_ns
    session.lockstep_tick = n_ticks
    session.next_tick_ns = int(table.tick_ns[-1]) + ex.period_ns
    session.ticks += n_ticks
    session.current = held
    session.pending = None if used[-1] else last
    session.observations_dropped = int(np.count_nonzero(~used[:-1]))
    session.plan[:] = plans.values[-1]
    session.plan_id, session.plan_created_ns = plans.ids[-1], int(plans.created[-1])
    session.plan_valid_for_ns, session.has_plan = int(plans.valid_for[-1]), bool(plans.has[-1])
    ex.stats.ticks += n_ticks
    ex.stats.rows += n_ticks
