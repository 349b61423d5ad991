"""The OOD gates as the executor wires them onto a model: which features each gate scores, the
per-session state they keep (filters, change and freeze trackers, the actuation check), the live
tick's gate step, and the scans a vectorised replay runs to reach the same verdicts.

The live step (`GateWiring.step`) and the replay scans (`score_rows`, `scan_freeze`,
`scan_actuation`, `scan`) are two implementations of one rule; tests/executor and
tests/controller/replay pin them against each other tick by tick.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from operator import attrgetter, is_not
from typing import Any

import numpy as np
import numpy.typing as npt

from dualloop.executor.columns import as_columns
from dualloop.executor.history import tuple_getter
from dualloop.executor.model_runner import DecisionModel, ModelOutputs
from dualloop.executor.sessions import Session
from dualloop.executor.snapshot import Observation
from dualloop.ood import ActuationMonitor, ChangeTracker, FreezeDetector, Gate, GateBank, GateMonitor
from dualloop.ood.decision import ratio_at_zero
from dualloop.ood.freeze import common_settings
from dualloop.ood.mahalanobis import GateFlags, score_in_chunks
from dualloop.ood.marginal import ProfileGate, profile_gate
from dualloop.ood.signal_settings import Scores, SignalSettings
from dualloop.ood.signals import SignalMonitor

# What a gate may watch. decision_vector: the model's penultimate layer; input_features: the raw
# inputs, whose norm guard catches a dead sensor in its own tick and whose range guard a value far
# outside training or a jump since the previous observation. Other sources were measured and
# rejected (docs/design-notes/executor.md).
GATE_SOURCES = ("decision_vector", "input_features")

BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]
# a live tick's gate verdicts: score and threshold per row as Python floats (snapshots take them one
# by one), the veto as an array (the reason flags take it whole)
GateVerdicts = tuple[list[float], list[float], BoolArray]
# one gate's scores of a replay's observation rows
RowScores = tuple[FloatArray, GateFlags]

_NAN = float("nan")
_BOOL = np.dtype(bool)  # a dtype object: np.array resolves it faster than the type
_slot_of = attrgetter("slot")
_timestamp_of = attrgetter("timestamp_ns")
_present_of = attrgetter("present")
_given = partial(is_not, None)


def _density(
    bank: GateBank,
    runs: Sequence[GateRun],
    slots: list[int],
    present_norm: list[bool] | None = None,
    judged: Sequence[int] = (),
) -> Density:
    """Each gate's (score, threshold, veto) per row of the bank's last step: its filter's own verdict
    (the state it was left in), its norm guard or NaN/Inf, and for gates in `judged` (a sensor
    profile's raw-input gates) the norm guard on the present features."""
    scores, hits = bank.entries()
    g_count = len(runs)
    out: Density = []
    for g, run in enumerate(runs):
        f = run.monitor.filter
        # Any: a k-of-n filter's states are ints, a CUSUM's floats; each filter reads its own
        alarmed: Callable[[Any], bool] = f.alarmed
        states: list[Any] = f.slot_states
        hit = hits[g::g_count]
        if present_norm is not None and g in judged:
            hit = [a or b for a, b in zip(hit, present_norm)]
        out.append(
            (scores[g::g_count], [run.threshold] * len(slots), [alarmed(states[s]) or h for s, h in zip(slots, hit)])
        )
    return out


class GateMismatch(ValueError):
    """A gate fitted on other features than this model provides; the message says which."""


def decision_vector_names(model: DecisionModel) -> list[str]:
    """Names of the decision vector's components, as a gate fitted on it records them."""
    return [f"{p.output}[{i}]" for p in model.card.decision_vector_parts for i in range(p.size)]


def gate_feature_names(model: DecisionModel, source: str) -> list[str]:
    if source not in GATE_SOURCES:
        raise GateMismatch(f"gate source {source!r} is not one of {GATE_SOURCES}")
    return decision_vector_names(model) if source == "decision_vector" else model.card.feature_names


def fill_gate_features(
    source: str,
    out: npt.NDArray[np.float32],
    x: npt.NDArray[np.float32],
    dv: npt.NDArray[np.float32] | None,
    bad_dv: BoolArray | None,
) -> None:
    """What a gate of this source scores, into `out`. Rows the model could not be trusted on are NaN,
    which vetoes them immediately: the model saw a substitute for invalid input, the gate must not.
    (A live tick does not copy: `GateWiring.step` hands the bank the rows themselves and the rows
    whose raw inputs hold NaN/Inf, which every gate scores as NaN.)"""
    rows = x if source == "input_features" else dv  # raw inputs: NaN stays NaN
    if rows is None:
        out[:] = np.nan  # no decision vector: nothing can pass
    else:
        np.copyto(out, rows)
        if rows is dv and bad_dv is not None:
            out[bad_dv] = np.nan


def nearest_gate(per_gate: Sequence[tuple[FloatArray, BoolArray, float]]) -> tuple[FloatArray, FloatArray, BoolArray]:
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


def command_in_effect(session: Session, obs: Observation, at: int) -> float:
    """Control `at` of the command the vehicle was executing when `obs` was taken (its actual action),
    as the actuation check reads it on live ticks and in a replay; NaN when there is none or the
    session's actual actions are not commands."""
    c = obs.actual_controls
    return c.item(at) if session.actual_is_command and c is not None and c.size else _NAN


# Distinct sensor profiles whose gates are kept made. Making one scores the gate's calibration rows
# (40-70 ms for the shipped raw-input gate's 20 000): call `GateWiring.profile` when a session opens.
MAX_PROFILES = 16


def _finite_present(x: npt.NDArray[np.float32], finite: BoolArray, presents: list[BoolArray | None]) -> BoolArray:
    """Per row: the features its session measures are finite (NaN elsewhere is how a missing feature
    arrives, not an invalid input). `finite` as the executor made it, for every feature or for these."""
    out = finite.copy()
    for i, present in enumerate(presents):
        if present is not None and not out[i]:
            out[i] = bool(np.isfinite(x[i][present]).all())
    return out


# per gate: (score, threshold, veto) per row, as `CheckBoard.assemble` takes them
Density = list[tuple[Any, Any, Any]]


@dataclass(slots=True)
class TickChecks:
    """The per-check values of a live tick's rows that the combined verdict does not keep."""

    density: Density
    changes: FloatArray | None  # (rows, F): each feature's change per second (NaN unknown)
    freeze_count: list[int] | None
    actuation: tuple[list[float], list[bool]] | None
    signals: list[Scores] | None = None  # per row, the per-signal checks' scores


@dataclass(slots=True)
class GateRun:
    """One gate as wired: its per-slot monitor and what it scores."""

    monitor: GateMonitor
    source: str  # one of GATE_SOURCES
    dim: int  # features the gate scores
    threshold: float


@dataclass(slots=True)
class Profile:
    """The gates as they judge the sessions of one sensor profile (`GateWiring.profile`)."""

    present: BoolArray
    gates: list[ProfileGate | None]  # per gate: how it completes and judges the rows; None: unchanged
    runs: list[GateRun]  # per gate: its run for these sessions (the profile's scorer, the gate's filter)
    bank: GateBank


def _gate_runs(model: DecisionModel, gates: list[Gate], capacity: int) -> list[GateRun]:
    """Each gate's run; a gate fitted on other features than the model provides is refused."""
    card = model.card
    runs = []
    for g in gates:
        expected = gate_feature_names(model, g.schema.source)
        if list(g.schema.feature_names) != expected:
            have = g.schema.feature_names
            raise GateMismatch(
                f"the gate was fitted on {len(have)} {g.schema.source} features "
                f"({have[0]}, ..., {have[-1]}); model {card.name} {card.version} provides "
                f"{len(expected)} ({expected[0]}, ..., {expected[-1]})"
            )
        runs.append(GateRun(g.monitor(capacity), g.schema.source, g.dim, float(g.threshold)))
    return runs


def _plan_gates(model: DecisionModel, gates: list[Gate]) -> list[bool]:
    """Per gate: it limits the plan; a gate limiting another plan than the model's is refused."""
    card = model.card
    plan_names = [p.name for p in card.plan]
    out = []
    for g in gates:
        context = [] if g.feature_range is None else list(g.feature_range.context_names)
        if context and context != plan_names:
            raise GateMismatch(
                f"the gate limits a plan of {context}; model {card.name} {card.version} is conditioned on {plan_names}"
            )
        out.append(bool(context))
    return out


def _actuation(
    model: DecisionModel, gates: list[Gate], capacity: int
) -> tuple[ActuationMonitor | None, tuple[int, int, int]]:
    """The actuation check's monitor (None: no gate carries one) and where it reads (accel feature,
    speed feature, command control); at most one gate may carry it."""
    card = model.card
    checks = [g.actuation for g in gates if g.actuation is not None]
    if len(checks) > 1:
        raise GateMismatch(f"{len(checks)} gates carry an actuation check; a session's command is judged once")
    if not checks:
        return None, (0, 0, 0)
    try:
        at = checks[0].indices(card.feature_names, [c.name for c in card.controls])
    except ValueError as exc:
        raise GateMismatch(f"model {card.name} {card.version}: {exc}") from None
    return checks[0].monitor(capacity), at


def _freeze_detector(
    model: DecisionModel, gates: list[Gate], capacity: int, freeze_repeats: int
) -> FreezeDetector | None:
    """The freeze check with the gates' common settings; None without gates or repeats."""
    card = model.card
    try:
        stated = common_settings([g.freeze for g in gates])
        rest = None if stated is None else stated.rest(card.feature_names)
    except ValueError as exc:
        raise GateMismatch(f"model {card.name} {card.version}: {exc}") from None
    return FreezeDetector(capacity, model.n_features, freeze_repeats, rest) if gates and freeze_repeats > 0 else None


class GateWiring:
    """Every gate on one model and the per-session state they keep, one slot per session.

    Several gates may watch different features (decision vector, raw inputs); any one vetoes. Gates
    on the raw inputs may also limit the changes between observations, the plan (it conditions the
    model as much as the observation does) and carry the actuation check (measured acceleration
    short of the command in effect). With a gate, a frozen sensor vetoes too.

    The live step reads the executor's tick buffers (`inputs`, `plans`, `fresh`: rows 0..n-1 are the
    tick's sessions) and writes `frozen`, the freeze check's verdict per row of the last tick.
    """

    def __init__(
        self,
        model: DecisionModel,
        gates: Sequence[Gate],
        capacity: int,
        freeze_repeats: int,
        inputs: npt.NDArray[np.float32],
        plans: npt.NDArray[np.float32],
        fresh: BoolArray,
        signals: SignalSettings | None = None,
    ) -> None:
        """`signals`: the per-signal checks' settings (ood/signals.py); None: they do not run. They run
        with a gate, on a schema with the ego speed."""
        card = model.card
        self.gates = list(gates)
        self.runs: list[GateRun] = _gate_runs(model, self.gates, capacity)
        # all gates scored, filtered and combined in one pass (the same decisions as per-gate monitors
        # and `nearest_gate`); None without gates
        self.bank = GateBank([run.monitor for run in self.runs], capacity) if self.runs else None
        self._x, self._p, self._fresh = inputs, plans, fresh
        self.frozen = np.zeros(capacity, bool)  # rows the freeze check flagged in the last tick
        self._any_frozen = False
        # per batch size: the tick's inputs, fresh flags and freeze verdicts, and each gate's plan rows
        self._views: dict[
            int, tuple[npt.NDArray[np.float32], BoolArray, BoolArray, list[npt.NDArray[np.float32] | None] | None]
        ] = {}
        self.change_gates = [
            g.schema.source == "input_features" and g.feature_range is not None and bool(g.feature_range.change_low)
            for g in self.gates
        ]
        self.plan_gates = _plan_gates(model, self.gates)
        self._any_plan_gate = any(self.plan_gates)
        self.capacity = capacity
        # what the last live tick's checks said, per row, for DecisionSnapshot.checks (`TickChecks`)
        self.last: TickChecks | None = None
        self._raw_input_gates = any(run.source == "input_features" for run in self.runs)
        # per sensor profile (Session.present), the gates as they judge its sessions (`profile`)
        self._profiles: dict[bytes, Profile] = {}
        self.profiles_dropped = 0
        # per slot: the profile and, per raw-input gate, the completed row and norm verdict of the
        # session's current observation (`_completion`)
        self._held: list[tuple[Profile, dict[int, tuple[FloatArray, bool]]] | None] = [None] * capacity
        # per gate, (decision vector, inputs)[on inputs] and (None, changes)[limits changes], in one C call
        self._pick_features = tuple_getter([int(run.source == "input_features") for run in self.runs])
        self._pick_changes = tuple_getter([int(c) for c in self.change_gates])
        self.change = ChangeTracker(capacity, model.n_features) if any(self.change_gates) else None
        # accel feature, speed feature, command control
        self.actuation, self.actuation_at = _actuation(model, self.gates, capacity)
        self.freeze = _freeze_detector(model, self.gates, capacity, freeze_repeats)
        monitor = None if signals is None or not self.gates else SignalMonitor(capacity, signals, card.feature_names)
        self.signals = monitor if monitor is not None and monitor.available else None
        # the sensor profile (Session.present) each slot's state was last set for, and how many slots
        # have one: with none, a tick of unmasked sessions does not look
        self._slot_present: list[BoolArray | None] = [None] * capacity
        self._profiled = 0

    def reset(self, slot: int) -> None:
        """A new session in `slot`: every gate's state for it starts afresh."""
        for run in self.runs:
            run.monitor.reset(slot)
        if self.freeze is not None:
            self.freeze.reset(slot)
        if self._slot_present[slot] is not None:
            self._slot_present[slot] = None
            self._profiled -= 1
        self._held[slot] = None
        if self.change is not None:
            self.change.reset(slot)
        if self.actuation is not None:
            self.actuation.reset(slot)
        if self.signals is not None:
            self.signals.reset(slot)

    # -- the live tick --------------------------------------------------------------------------

    def step(
        self, rows: list[Session], observations: list[Observation], finite: BoolArray, out: ModelOutputs | None
    ) -> GateVerdicts | None:
        """(score, threshold, veto) per row of this tick (None without gates), scored on the tick's own
        features: a veto is never a tick late. `out` is None when the model failed. The freeze check's
        and the actuation check's vetoes are included."""
        bank = self.bank
        if bank is None:
            return None
        n = len(rows)
        views = self._views
        try:
            x, fresh, frozen, plans = views[n]
        except KeyError:
            plans = list(map((None, self._p[:n]).__getitem__, self.plan_gates)) if self._any_plan_gate else None
            x, fresh, frozen, plans = views[n] = self._x[:n], self._fresh[:n], self.frozen[:n], plans
        slots = list(map(_slot_of, rows))
        presents = list(map(_present_of, rows))
        masked = any(map(_given, presents))
        if masked or self._profiled:
            self._note_profiles(slots, presents)
        if masked:  # NaN in a feature a session does not measure is no invalid input
            finite = _finite_present(x, finite, presents)
        dv = out.decision_vector if out is not None else None
        # rows with NaN/Inf inputs are scored as NaN by every gate (the model saw a substitute)
        ok = finite.tolist()
        bad = None if all(ok) else ~finite
        fresh_rows = fresh.tolist()
        # what fill_gate_features would copy, per gate
        features = self._pick_features((dv, x))
        changes = change_rows = None
        times: list[int] | None = None
        at = np.array(slots, np.intp)  # the slots once for the array stages below
        if self.change is not None:
            times = list(map(_timestamp_of, observations))
            change_rows = self.change.step(x, at, fresh, ok, times)
            changes = self._pick_changes((None, change_rows))
        frozen_rows = None if self.freeze is None else self.freeze.step(x, at, fresh)
        any_frozen = frozen_rows is not None and True in frozen_rows
        if any_frozen or self._any_frozen:  # else the buffer is all False already
            self.frozen[:] = False
            frozen[:] = frozen_rows if any_frozen else False
            self._any_frozen = any_frozen
        # Python lists: the actuation check folds in on floats, and only the veto becomes an array (at
        # one session, numpy calls are most of what a tick costs)
        if masked:
            score, threshold, veto, density = self._step_profiles(
                slots, presents, fresh_rows, x, dv, bad, frozen_rows, changes, plans
            )
        else:
            score, threshold, veto = bank.step_lists(slots, features, bad, frozen_rows, changes, plans)
            density = _density(bank, self.runs, slots)
        actuation = None
        if self.actuation is not None:
            actuation = self._actuation_step(
                self.actuation, rows, observations, slots, fresh_rows, x, score, threshold, veto
            )
        signal_rows = None
        if self.signals is not None:
            signal_rows = self.signals.step(
                x, slots, fresh_rows, times if times is not None else list(map(_timestamp_of, observations)), veto
            )
        counts = None if self.freeze is None else self.freeze.counts(at)
        self.last = TickChecks(density, change_rows, counts, actuation, signal_rows)
        return score, threshold, np.array(veto, _BOOL)

    def _step_profiles(
        self,
        slots: list[int],
        presents: list[BoolArray | None],
        fresh: list[bool],
        x: npt.NDArray[np.float32],
        dv: npt.NDArray[np.float32] | None,
        bad: BoolArray | None,
        frozen: list[bool] | None,
        changes: Sequence[Any] | None,
        plans: list[npt.NDArray[np.float32] | None] | None,
    ) -> tuple[list[float], list[float], list[bool], Density]:
        """`GateBank.step_lists` for a tick with sessions that measure only some features: each sensor
        profile's rows through its own bank (its raw-input gates on their completed copies, with the
        profile's thresholds and limits; the same filters), in row order. A tick that reuses its
        observation reuses its completion too (a 10 Hz sensor on 200 Hz ticks completes once in 20)."""
        n = len(slots)
        groups: dict[int, tuple[Profile | None, list[int]]] = {}
        for i, present in enumerate(presents):
            profile = self.profile(present)
            groups.setdefault(id(profile), (profile, []))[1].append(i)
        score, threshold, veto = [0.0] * n, [0.0] * n, [False] * n
        density: Density = [([0.0] * n, [0.0] * n, [False] * n) for _ in self.runs]
        for profile, idx in groups.values():
            whole = len(idx) == n  # every row (one profile ticking): the tick's own arrays, not copies
            at: Any = slice(None) if whole else np.array(idx, np.intp)
            features: list[npt.NDArray[Any] | None] = []
            also = None if frozen is None else [frozen[i] for i in idx]
            present_norm: list[bool] | None = None  # the input gates' norm guard on the present features
            for g, run in enumerate(self.runs):
                judged = None if profile is None else profile.gates[g]
                if run.source == "decision_vector":
                    features.append(None if dv is None else dv[at])
                elif judged is not None:
                    assert profile is not None  # judged is a profile's
                    done = [self._completion(slots[i], fresh[i], profile, g, judged, x[i : i + 1]) for i in idx]
                    features.append(done[0][0] if len(done) == 1 else np.vstack([d for d, _ in done]))
                    # its norm guard on the present features: a veto now, as the scorer's band would be
                    also = [o for _, o in done] if also is None else [a or o for a, (_, o) in zip(also, done)]
                    norms = [o for _, o in done]
                    present_norm = norms if present_norm is None else [a or o for a, o in zip(present_norm, norms)]
                else:
                    features.append(x[at])
            sub_bad = None if bad is None or not bad[at].any() else bad[at]
            sub_changes: Any = changes if whole or changes is None else [None if c is None else c[at] for c in changes]
            bank = self.bank if profile is None else profile.bank
            assert bank is not None  # a tick with gates
            sub_slots = slots if whole else [slots[i] for i in idx]
            s, t, v = bank.step_lists(
                sub_slots,
                features,
                sub_bad,
                also,
                sub_changes,
                plans if whole or plans is None else [None if p is None else p[at] for p in plans],
            )
            judged_gates = [] if profile is None else [g for g, j in enumerate(profile.gates) if j is not None]
            sub = _density(bank, self.runs if profile is None else profile.runs, sub_slots, present_norm, judged_gates)
            if whole:
                return s, t, v, sub
            for i, si, ti, vi in zip(idx, s, t, v):
                score[i], threshold[i], veto[i] = si, ti, vi
            for (ds, dt, dv_), (ss, st, sv) in zip(density, sub):
                for k, i in enumerate(idx):
                    ds[i], dt[i], dv_[i] = ss[k], st[k], sv[k]
        return score, threshold, veto, density

    def _completion(
        self, slot: int, fresh: bool, profile: Profile, g: int, judged: ProfileGate, row: npt.NDArray[np.float32]
    ) -> tuple[FloatArray, bool]:
        """Gate g's completed copy of a session's row and its present features' norm verdict, made once
        per fresh observation and kept for the ticks that reuse it."""
        held = self._held[slot]
        if not fresh and held is not None and held[0] is profile and g in held[1]:
            return held[1][g]
        made = judged.marginal.complete(row), bool(judged.norm_out(row)[0])
        if fresh or held is None or held[0] is not profile:
            self._held[slot] = held = (profile, {})
        held[1][g] = made
        return made

    def profile(self, present: BoolArray | None) -> Profile | None:
        """The gates as they judge sessions measuring only `present` (None, or all present, or no gate on
        the raw inputs: the gates themselves). Made on first use and kept for the next ones (at most
        `MAX_PROFILES`, the oldest dropped first, counted in `profiles_dropped`)."""
        if present is None or present.all() or not self._raw_input_gates:
            return None
        key = present.tobytes()
        found = self._profiles.get(key)
        if found is None:
            if len(self._profiles) >= MAX_PROFILES:
                del self._profiles[next(iter(self._profiles))]
                self.profiles_dropped += 1
            found = self._profiles[key] = self._make_profile(present)
        return found

    def _make_profile(self, present: BoolArray) -> Profile:
        gates: list[ProfileGate | None] = []
        runs = []
        for gate, run in zip(self.gates, self.runs):
            if run.source != "input_features":
                gates.append(None)
                runs.append(run)
                continue
            judged = profile_gate(gate, present)
            gates.append(judged)
            # the profile's scorer, the gate's own filter (its per-slot state is the session's)
            monitor = GateMonitor(judged.scorer(self.capacity), run.monitor.filter)
            runs.append(GateRun(monitor, run.source, run.dim, float(judged.threshold)))
        return Profile(present.copy(), gates, runs, GateBank([r.monitor for r in runs], self.capacity))

    def _note_profiles(self, slots: list[int], presents: list[BoolArray | None]) -> None:
        """Set the per-slot state that depends on a session's sensor profile where it changed."""
        for slot, present in zip(slots, presents):
            if self._slot_present[slot] is not present:
                self._profiled += (present is not None) - (self._slot_present[slot] is not None)
                self._slot_present[slot] = present
                self._held[slot] = None
                if self.freeze is not None:
                    self.freeze.set_present(slot, present)
                if self.signals is not None:
                    self.signals.set_present(slot, present)

    def _actuation_step(
        self,
        monitor: ActuationMonitor,
        rows: list[Session],
        observations: list[Observation],
        slots: list[int],
        fresh: list[bool],
        x: npt.NDArray[np.float32],
        score: list[float],
        threshold: list[float],
        veto: list[bool],
    ) -> tuple[list[float], list[bool]]:
        """The actuation check on this tick's rows, folded into the gates' (score, threshold, veto) lists
        in place (and returned per row as (score, alarm)): its alarm vetoes, and it is reported when
        nearer its threshold than every gate (as `nearest_gate` ranks it last in a replay). No command
        on a row: no verdict. Plain Python per row (`.item` reads one float without making an array):
        about a microsecond a session."""
        accel_at, speed_at, command_at = self.actuation_at
        item = x.item  # the tick's float32 inputs, as a replay reads them
        times, accel, speed, commands = [], [], [], []
        for i, (s, obs) in enumerate(zip(rows, observations)):
            times.append(obs.timestamp_ns)
            accel.append(item(i, accel_at))
            speed.append(item(i, speed_at))
            commands.append(command_in_effect(s, obs, command_at))
        scores, alarms = monitor.step(slots, fresh, times, accel, speed, commands)
        limit = monitor.threshold
        checked = (scores, alarms)
        for i, (s_i, alarm) in enumerate(zip(scores, alarms)):
            if alarm:
                veto[i] = True
            if s_i == s_i:  # a verdict: report it if nearer its threshold than the nearest gate
                best, t = score[i], threshold[i]
                # a zero threshold: IEEE division, as the gates are ranked
                nearer = s_i / limit > (best / t if t else ratio_at_zero(best, t))
                if nearer:
                    score[i], threshold[i] = s_i, limit
        return checked

    # -- a replay's scans -----------------------------------------------------------------------

    def score_rows(
        self,
        x: npt.NDArray[np.float32],
        p: npt.NDArray[np.float32],
        dv: npt.NDArray[np.float32] | None,
        finite: BoolArray,
        model_ok: BoolArray,
        slot: int,
        timestamps: npt.NDArray[np.int64],
        present: BoolArray | None = None,
    ) -> list[RowScores]:
        """Per gate: (score, flags) of each observation row (features x, plan p, decision vector dv,
        sensor timestamps) of a session with this sensor profile (`Session.present`), scored as a live
        tick would; rows the model could not be trusted on are NaN for decision-vector gates. Advances
        the slot's change tracker over the rows, as live ticks would."""
        profile = self.profile(present)
        if present is not None:  # NaN in a feature the session does not measure is no invalid input
            finite = finite | np.isfinite(x[:, present]).all(axis=1)
        change = None if self.change is None else self.change.scan(x, finite, slot, timestamps)
        self.scanned_changes = change  # per row, for the change check (`CheckBoard`)
        untrusted = ~finite | ~model_ok
        results = []
        for g, (run, changes_limited, plan_limited) in enumerate(zip(self.runs, self.change_gates, self.plan_gates)):
            judged = None if profile is None else profile.gates[g]
            feats: npt.NDArray[Any]
            if judged is not None:
                feats = judged.marginal.complete(x)
                run = profile.runs[g]  # type: ignore[union-attr]
            else:
                feats = np.empty((len(x), run.dim), np.float32)
                fill_gate_features(run.source, feats, x, dv, untrusted)
            score, flags = score_in_chunks(
                run.monitor.scorer,
                feats,
                changes=change if changes_limited else None,
                context=p if plan_limited else None,
            )
            if judged is not None:  # its norm guard on the present features (as the live step's)
                out = judged.norm_out(x)
                flags = flags._replace(norm_out=flags.norm_out | out)  # immediate: norm_out among others
            results.append((score, flags))
        return results

    def scan_freeze(
        self, x: npt.NDArray[np.float32], slot: int, fresh: BoolArray, present: BoolArray | None = None
    ) -> BoolArray:
        """The freeze check's verdict per tick (x and fresh per tick) of a session with this sensor
        profile (`Session.present`), the slot left as live ticks would leave it; all False without the
        check."""
        self._note_profiles([slot], [present])
        if self.freeze is None:
            return np.zeros(len(x), bool)
        return self.freeze.scan(x, slot, fresh)

    def scan_freeze_counts(
        self, x: npt.NDArray[np.float32], slot: int, fresh: BoolArray, present: BoolArray | None = None
    ) -> npt.NDArray[np.int64] | None:
        """`scan_freeze`'s repeat count per tick (the verdict is count >= freeze_repeats); None without
        the check."""
        self._note_profiles([slot], [present])
        if self.freeze is None:
            return None
        return self.freeze.scan_counts(x, slot, fresh)

    def scan_signals(
        self, x: npt.NDArray[np.float32], slot: int, timestamps: npt.NDArray[np.int64], present: BoolArray | None = None
    ) -> FloatArray | None:
        """The per-signal checks' scores (rows, 8) after each observation row the ticks used (x and
        timestamps of those rows, in order; each fresh once) of a session with this sensor profile, the
        slot left as live ticks would leave it; None without the checks."""
        self._note_profiles([slot], [present])
        if self.signals is None:
            return None
        return self.signals.scan(x, slot, timestamps)

    def signal_vetoes(self, scores: FloatArray | None) -> BoolArray | None:
        """Per row of `scan_signals`' scores: some per-signal check vetoes (NaN: no verdict)."""
        if scores is None or self.signals is None:
            return None
        veto: BoolArray = np.any(scores > np.array(self.signals.thresholds), axis=1)
        return veto

    def scan_actuation(
        self,
        session: Session,
        observations: Sequence[Observation],
        feats: npt.NDArray[np.float32],
        ts: npt.NDArray[np.int64],
        rows: npt.NDArray[np.intp],
    ) -> tuple[FloatArray, BoolArray] | None:
        """The actuation check's (score, alarm) per observation row the ticks used, scanned as live ticks
        step it (each row fresh once); None without the check."""
        if self.actuation is None:
            return None
        accel_at, speed_at, command_at = self.actuation_at
        cols = as_columns(observations)
        commands: list[float] | npt.NDArray[np.float64]
        if not session.actual_is_command:  # no commands: command_in_effect is NaN throughout
            commands = np.full(len(rows), np.nan)
        elif cols is None:
            commands = [command_in_effect(session, observations[i], command_at) for i in rows.tolist()]
        elif cols.actual_controls.shape[1]:  # command_in_effect, all rows at once
            commands = np.where(cols.actual_present[rows], cols.actual_controls[rows, command_at], np.nan)
        else:
            commands = np.full(len(rows), np.nan)
        x = feats[rows]
        return self.actuation.scan(session.slot, ts[rows], x[:, accel_at], x[:, speed_at], commands)

    def scan(
        self,
        slot: int,
        gate_rows: list[RowScores],
        r: npt.NDArray[np.intp],
        actuation: tuple[FloatArray, BoolArray] | None = None,
        present: BoolArray | None = None,
        density: Density | None = None,
    ) -> tuple[FloatArray | None, FloatArray | None, BoolArray]:
        """(score, threshold, veto) per tick, tick k on observation row r[k], of a session with this
        sensor profile: each gate's sequential filter scanned over the ticks, and the actuation check's
        verdicts last (None, None, no veto without gates). `density`, when given, gets each gate's
        (score, threshold, veto) per tick, as the live step keeps them (`TickChecks.density`)."""
        if not self.runs:
            return None, None, np.zeros(len(r), bool)
        profile = self.profile(present)
        runs = self.runs if profile is None else profile.runs
        per_gate = []
        for run, (score, flags) in zip(runs, gate_rows):
            # the filter's own verdict, then the immediate hits (as `filter.scan(exceed, immediate)`)
            filtered = run.monitor.filter.scan(flags.exceed[r], None, slot)
            per_gate.append((score[r], filtered | flags.immediate[r], run.threshold))
            if density is not None:  # the density check: the filter, its norm guard, NaN/Inf
                immediate = (flags.norm_out | flags.nonfinite)[r]
                density.append((score[r], np.full(len(r), run.threshold), filtered | immediate))
        if actuation is not None and self.actuation is not None:
            per_gate.append((actuation[0][r], actuation[1][r], self.actuation.threshold))
        return nearest_gate(per_gate)
