"""What a replay found: decisions, reasons, safety states, gate vetoes, agreement with the actual
(human) action, and how fast it ran. Plain data (JSON-safe via `as_dict`) plus a text printer."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from dualloop.controller.contract.shadow import ShadowAgreement
from dualloop.executor.columns import as_columns
from dualloop.executor.core import Executor
from dualloop.executor.lockstep_batch import TickTable
from dualloop.executor.snapshot import Reason, SafetyState, Snapshot


@dataclass
class ReplayReport:
    source: str = ""
    model: str = ""
    gates: list[str] = field(default_factory=list)
    observations: int = 0
    ticks: int = 0
    drive_s: float = 0.0
    applied: dict[str, int] = field(default_factory=dict)  # applied action name -> ticks
    proposed: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, int] = field(default_factory=dict)  # ticks carrying each reason
    safety_states: dict[str, int] = field(default_factory=dict)
    gate_veto_ticks: int = 0
    gate_veto_fraction: float = 0.0  # how much of the drive the gate calls out of distribution
    agreement: dict = field(default_factory=dict)  # ShadowAgreement.as_dict() over every tick
    agreement_top1: float = float("nan")
    # one tick per observation (the tick at its own timestamp): agreement per sensor sample
    fresh_ticks: int = 0
    fresh_agreement_top1: float = float("nan")
    timings: dict[str, float] = field(default_factory=dict)
    speedup: float = 0.0  # drive duration / replay compute time
    actuation_check: str = ""  # whether the gate's actuation check ran, and why not
    # not empty: the log cannot give its recorded decisions back (lockstep.recorded_input_warning says why)
    input_warning: str = ""
    # evaluation.LogEvaluation.as_dict() against the labels and the baselines, or {"skipped": why}
    evaluation: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class TickSummary:
    """What the report reads of each tick, as columns (from Snapshots or straight from the fast
    path's TickTable: the same numbers either way, tests/controller/replay/test_fleet.py)."""

    applied: np.ndarray  # (T,) int64
    applied_controls: np.ndarray  # (T, controls) float64
    actual: np.ndarray  # (T,) int64
    actual_controls: np.ndarray  # (T, controls) float64, NaN rows where the tick had none
    seq: np.ndarray  # (T,) int64 observation seq
    gate_veto: np.ndarray  # (T,) bool
    states: list[str]  # safety state name per tick
    reasons: list[tuple[str, ...]]  # reason names per tick
    applied_names: list[str]
    proposed_names: list[str]  # "-" where the model proposed nothing

    @classmethod
    def of_snapshots(cls, snaps: Sequence[Snapshot], n_ctl: int) -> TickSummary:
        missing = np.full(n_ctl, np.nan)
        return cls(
            applied=np.fromiter((s.applied.index for s in snaps), np.int64, len(snaps)),
            applied_controls=np.array([s.applied.controls for s in snaps], np.float64).reshape(len(snaps), n_ctl),
            actual=np.fromiter((s.actual_index for s in snaps), np.int64, len(snaps)),
            actual_controls=np.array(
                [
                    s.actual_controls if s.actual_controls is not None and s.actual_controls.size == n_ctl else missing
                    for s in snaps
                ],
                np.float64,
            ).reshape(len(snaps), n_ctl),
            seq=np.fromiter((s.observation_seq for s in snaps), np.int64, len(snaps)),
            gate_veto=np.fromiter((s.gate_veto for s in snaps), bool, len(snaps)),
            states=[s.safety_state.name for s in snaps],
            reasons=[tuple(r.name for r in s.reasons) for s in snaps],
            applied_names=[s.applied.name for s in snaps],
            proposed_names=[s.proposed_name or "-" for s in snaps],
        )

    @classmethod
    def of_table(cls, table: TickTable) -> TickSummary:
        obs, n_ctl, which = table.observations, table.applied_controls.shape[1], table.obs_index
        cols = as_columns(obs)
        if cols is not None:
            per_obs, actual, seq = cols.actual_controls_or_nan(n_ctl), cols.actual_index, cols.seq
        else:
            per_obs = np.full((len(obs), n_ctl), np.nan)
            known = [(i, o.actual_controls) for i, o in enumerate(obs) if o.actual_controls is not None]
            known = [(i, c) for i, c in known if c.size == n_ctl]
            if known:
                per_obs[[i for i, _ in known]] = np.stack([c for _, c in known])
            actual = np.fromiter((o.actual_index for o in obs), np.int64, len(obs))
            seq = np.fromiter((o.seq for o in obs), np.int64, len(obs))
        # names by lookup in object arrays: no Python call per tick
        state_names = np.empty(max(int(s) for s in SafetyState) + 1, object)
        for state in SafetyState:
            state_names[int(state)] = state.name
        # reasons by identity: ticks share their reason tuples (hashing a tuple of enums calls Python
        # per element); each distinct object is named once
        objects = {id(rs): rs for rs in table.reasons}
        ids = np.fromiter(map(id, table.reasons), np.int64, len(table.reasons))
        distinct, inverse = np.unique(ids, return_inverse=True)
        reason_names = np.empty(len(distinct), object)
        for j, i in enumerate(distinct.tolist()):
            reason_names[j] = tuple(Reason(r).name for r in objects[i])
        inverse = inverse.reshape(-1)
        names = np.array([*table.actions, "-"], object)
        proposed = np.where(table.scored.astype(bool), table.proposed, len(table.actions))
        return cls(
            applied=table.applied.astype(np.int64),
            applied_controls=table.applied_controls.astype(np.float64),
            actual=actual[which],
            actual_controls=per_obs[which],
            seq=seq[which],
            gate_veto=table.gate_veto.astype(bool),
            states=state_names[table.safety_state].tolist(),
            reasons=reason_names[inverse].tolist(),
            applied_names=names[table.applied].tolist(),
            proposed_names=names[proposed].tolist(),
        )


def summarise(
    snaps: Sequence[Snapshot] | TickTable,
    ex: Executor,
    observations: int,
    drive_s: float,
    source: Path,
    timings: dict[str, float],
) -> ReplayReport:
    """The report of a replay's ticks: its Snapshots, or the fast path's TickTable (no Snapshots)."""
    actions, n_ctl = list(ex.card.actions), len(ex.card.controls)
    t = TickSummary.of_table(snaps) if isinstance(snaps, TickTable) else TickSummary.of_snapshots(snaps, n_ctl)
    ticks = len(t.applied)
    states, names = t.states, t.reasons
    reasons = Counter(name for tick in names for name in tick)
    agreement = ShadowAgreement(actions, n_ctl)
    agreement.update_many(t.applied, t.applied_controls, t.actual, t.actual_controls, states, names)
    # one tick per observation (the first to use it): agreement per sensor sample
    seq = t.seq
    first = np.flatnonzero(np.concatenate([[True], seq[1:] != seq[:-1]])) if ticks else np.zeros(0, np.int64)
    fresh = ShadowAgreement(actions, n_ctl)
    fresh.update_many(
        t.applied[first],
        t.applied_controls[first],
        t.actual[first],
        t.actual_controls[first],
        [states[k] for k in first],
        [names[k] for k in first],
    )
    vetoes = int(np.count_nonzero(t.gate_veto))
    compute = timings.get("compute_s", 0.0)
    return ReplayReport(
        source=str(source),
        model=f"{ex.card.name} {ex.card.version}",
        gates=[g.version_hash for g in ex.gates],
        observations=observations,
        ticks=ticks,
        drive_s=drive_s,
        applied=dict(Counter(t.applied_names)),
        proposed=dict(Counter(t.proposed_names)),
        reasons=dict(reasons),
        safety_states=dict(Counter(states)),
        gate_veto_ticks=vetoes,
        gate_veto_fraction=vetoes / ticks if ticks else 0.0,
        agreement=agreement.as_dict(),
        agreement_top1=agreement.agreement(),
        fresh_ticks=fresh.groups["all"].ticks if "all" in fresh.groups else 0,
        fresh_agreement_top1=fresh.agreement(),
        timings=dict(timings),
        speedup=drive_s / compute if compute > 0 else 0.0,
    )


def format_confusion(
    actions: Sequence[str], confusion: Sequence[Sequence[int]], rows: str = "actual", cols: str = "applied"
) -> str:
    width = max(10, *(len(a) + 2 for a in actions))
    lines = [f"{rows} \\ {cols}".ljust(width) + "".join(a.rjust(width) for a in actions)]
    for name, row in zip(actions, confusion):
        lines.append(name.ljust(width) + "".join(str(v).rjust(width) for v in row))
    return "\n".join(lines)


def format_report(r: ReplayReport) -> str:
    t = r.timings
    lines = [
        f"replay of {r.source}",
        f"  model {r.model}; gates {', '.join(r.gates) or 'none'}",
        *([f"  warning: {r.input_warning}"] if r.input_warning else []),
        f"  {r.observations} observations, {r.ticks} ticks, {r.drive_s:.2f} s of drive",
        f"  replay {t.get('compute_s', 0) * 1e3:.1f} ms{_real_time(r.speedup)} (reading the log "
        f"{t.get('load_s', 0) * 1e3:.0f} ms, snapshots {t.get('snapshots_s', 0) * 1e3:.0f} ms"
        + (f", writing the log {t['write_s'] * 1e3:.0f} ms)" if "write_s" in t else ")"),
        f"  applied:  {_counts(r.applied)}",
        f"  proposed: {_counts(r.proposed)}",
        f"  reasons:  {_counts(r.reasons) or 'none'}",
        f"  safety:   {_counts(r.safety_states)}",
        f"  gate veto on {r.gate_veto_ticks} ticks "
        f"({100 * r.gate_veto_fraction:.1f}% of the drive looks out of distribution)",
    ]
    if r.actuation_check:
        lines.append(f"  actuation check: {r.actuation_check}")
    groups = r.agreement.get("groups", {})
    if "all" in groups:
        lines.append(
            f"  agreement with the actual action: {100 * r.agreement_top1:.1f}% of {groups['all']['ticks']} "
            f"ticks; {100 * r.fresh_agreement_top1:.1f}% of {r.fresh_ticks} observations"
        )
        lines.append(
            "    " + format_confusion(r.agreement["actions"], r.agreement["confusion"]).replace("\n", "\n    ")
        )
        for key, g in groups.items():
            mae = ", ".join(f"{v:.3f}" for v in g["control_mae"])
            lines.append(
                f"    {key:28s} {g['ticks']:7d} ticks  agree {100 * (g['agreement'] or 0):5.1f}%  control MAE [{mae}]"
            )
    else:
        lines.append(
            f"  no actual action in the log ({r.agreement.get('ticks_without_actual', 0)} ticks): no agreement"
        )
    return "\n".join(lines)


def _real_time(speedup: float) -> str:
    """The replay's speed against the drive's: nothing when either took no measurable time (a drive
    of one observation printed "0x real time"); two figures below 10x (0.4x printed as "0x")."""
    if not (speedup > 0 and np.isfinite(speedup)):
        return ""
    return f": {speedup:.0f}x real time" if speedup >= 10 else f": {speedup:.2g}x real time"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
