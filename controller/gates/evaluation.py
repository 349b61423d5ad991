"""`dualloop gate eval`: how well a gate separates nominal driving from each OOD scenario.

Open loop: expert-driven episodes on held-out seeds; their recorded features go through the model
and the gate exactly as in the executor (same monitor, same filter, same freeze check, one slot per
episode, tick by tick), giving per-tick scores and vetoes. From those: AUROC and TNR at 95% TPR per
OOD scenario (nominal ticks vs ticks after the fault's onset; a tick that a guard vetoes at once
ranks above every score, nominal ticks included), the detection delay after onset, and
the false-veto rate per hour of nominal driving. A gate's actuation check sees, with each tick, the
command the expert's previous step applied (as the closed-loop client sends it). Low friction shows
only while the car is asked to brake or accelerate, so each scenario's separation is also reported
on the post-onset ticks with such a demand (|command| >= DEMAND_ACCEL), next to their share, and
judged there (sim.scenarios: the scenario's `observable`): no monitor of the observations can tell
a low-friction road from a dry one while the car coasts. The targets (AUROC >= TARGET_AUROC on the
ticks where each fault is observable, nominal false vetoes <= TARGET_FALSE_VETOES per tick) are
checked and printed. Closed loop: each OOD scenario driven by the executor with the gate and without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from dualloop import ood
from dualloop.controller.contract.errors import ConfigError
from dualloop.controller.demo.closed_loop import drive_in_process
from dualloop.controller.gates.fitting import episode_changes, forward_rows, model_features
from dualloop.controller.gates.plots import plot_evaluation
from dualloop.controller.gates.scores import ScenarioScores, fault_active
from dualloop.executor.config import ExecutorConfig
from dualloop.executor.core import Executor
from dualloop.executor.history import episode_history
from dualloop.executor.model_runner import DecisionModel
from dualloop.executor.snapshot import Reason, SafetyState
from dualloop.ood.filter import make_filter
from dualloop.ood.freeze import common_settings
from dualloop.ood.marginal import profile_gate
from dualloop.sim.env import ExpertData, run_expert_batch
from dualloop.sim.scenarios import NOMINAL_SCENARIOS, OOD_SCENARIOS, SCENARIOS, build_scenario

EVAL_SEEDS = range(700_000, 700_006)
TICK_S = 0.005
# m/s^2: a command at least this strong asks the car to brake or accelerate (the action labels'
# brake / accelerate boundary); below it a shortfall of actuation cannot show.
DEMAND_ACCEL = 0.5
TARGET_AUROC = 0.99
TARGET_FALSE_VETOES = 0.001  # per nominal tick
JUDGED_ON = {"always": "every tick after onset", "under_demand": "ticks after onset with a demand"}


@dataclass(frozen=True, eq=False)
class _Episodes:
    """Expert episodes as the executor's gates see them, and the model's outputs on them."""

    data: ExpertData
    features: np.ndarray  # (B, T, F), NaN where the sensors do not measure
    flat_x: np.ndarray  # (B*T, F)
    flat_p: np.ndarray  # (B*T, P) the plans
    finite: np.ndarray  # (B, T): every measured feature finite
    history: np.ndarray | None  # (B*T, H) a model's history features
    logits: np.ndarray  # (B, T, A)
    dv: np.ndarray  # (B, T, D) decision vectors
    command: np.ndarray  # (B, T) the command in effect (what the previous step applied), NaN where unknown

    @property
    def shape(self) -> tuple[int, int]:
        return self.data.valid.shape

    @staticmethod
    def of(model: DecisionModel, data: ExpertData, present: np.ndarray | None) -> _Episodes:
        b, t_len = data.valid.shape
        features = data.features
        if present is not None:  # the sensors: NaN where not measured
            features = np.where(present, features, np.float32(np.nan))
        flat_x = features.reshape(b * t_len, -1)
        flat_p = data.plan.reshape(b * t_len, -1)
        measured = features if present is None else features[..., present]
        finite = cast("np.ndarray", np.isfinite(measured).all(axis=2))  # (B, T); the stubs allow a scalar
        model_x = flat_x
        if present is not None:  # the model sees a missing feature as its training mean
            model_x = np.where(present, flat_x, np.array([f.mean for f in model.card.features], np.float32))
        # a model with history features gets them from each episode's 5 ms observations, as the executor would
        history = (
            None
            if model.history is None
            else episode_history(model.history, data.t, features, data.valid).reshape(b * t_len, -1)
        )
        logits, _, dv = forward_rows(model, model_x, flat_p, history=history)
        assert data.applied is not None  # run_expert_batch records it
        command = np.where(data.valid, data.applied[..., 0], np.nan)
        return _Episodes(
            data,
            features,
            flat_x,
            flat_p,
            finite,
            history,
            logits.reshape(b, t_len, -1),
            dv.reshape(b, t_len, -1),
            command,
        )


@dataclass(frozen=True, eq=False)
class _Verdicts:
    """Per-tick (B, T) score and vetoes, accumulated gate by gate."""

    score: np.ndarray
    alarm: np.ndarray
    immediate: np.ndarray


def _gate_verdicts(
    model: DecisionModel, gate: ood.Gate, ep: _Episodes, present: np.ndarray | None, ratios: bool, out: _Verdicts
) -> None:
    """One gate's per-tick verdicts into ``out``, tick by tick as the executor's monitor makes them."""
    b, t_len = ep.shape
    slots = np.arange(b)
    judged = None if present is None or gate.schema.source != "input_features" else profile_gate(gate, present)
    if gate.schema.source == "decision_vector":
        feats = ep.dv
    elif judged is not None:  # the gate's completed copy of the rows
        feats = judged.marginal.complete(ep.flat_x).reshape(b, t_len, -1)
    else:
        feats = model_features(model, ep.flat_x, ep.flat_p, gate.schema.source, history=ep.history)
        feats = feats.reshape(b, t_len, -1)
    feats = np.where(ep.finite[..., None], feats, np.nan)
    if judged is None:
        feats = feats.astype(np.float32)
    rng = gate.feature_range
    changes = episode_changes(ep.features, ep.data.t, present) if rng is not None and rng.change_low else None
    plans = ep.data.plan if rng is not None and rng.context_names else None
    monitor = gate.monitor(b) if judged is None else ood.GateMonitor(judged.scorer(b), make_filter(gate.filter, b))
    threshold = gate.threshold if judged is None else judged.threshold
    scale = 1.0 / threshold if ratios else 1.0
    # a profile's norm guard looks at the present features (ood.marginal.ProfileGate.norm_out)
    norm_out = None if judged is None else judged.norm_out(ep.flat_x).reshape(b, t_len) & ep.finite
    for k in range(t_len):
        step = monitor.step(
            feats[:, k], slots, None if changes is None else changes[:, k], None if plans is None else plans[:, k]
        )
        out.score[:, k] = np.maximum(out.score[:, k], step.score * scale)
        out.alarm[:, k] |= step.alarm
        out.immediate[:, k] |= step.flags.immediate
        if norm_out is not None:
            out.alarm[:, k] |= norm_out[:, k]
            out.immediate[:, k] |= norm_out[:, k]
    if gate.actuation is not None:
        act_score, act_alarm = actuation_verdicts(model, gate.actuation, ep.data.t, ep.features, ep.command)
        out.score[...] = np.fmax(out.score, act_score / gate.actuation.threshold)  # no verdict (NaN) changes nothing
        out.alarm[...] |= act_alarm


def _freeze_verdicts(
    model: DecisionModel,
    gates: Sequence[ood.Gate],
    ep: _Episodes,
    present: np.ndarray | None,
    repeats: int,
    out: _Verdicts,
) -> None:
    """The freeze check's vetoes into ``out`` (every tick a fresh observation)."""
    b, t_len = ep.shape
    stated = common_settings([g.freeze for g in gates])
    rest = None if stated is None else stated.rest(model.card.feature_names)
    freeze = ood.FreezeDetector(b, ep.features.shape[2], repeats, rest)
    for slot in range(b):
        freeze.set_present(slot, present)
    fresh = np.ones(b, bool)
    slots = np.arange(b)
    for k in range(t_len):
        frozen = freeze.update(ep.features[:, k], slots, fresh)
        out.alarm[:, k] |= frozen
        out.immediate[:, k] |= frozen


def score_episodes(
    model: DecisionModel,
    gates: ood.Gate | Sequence[ood.Gate],
    name: str,
    seeds: Sequence[int],
    freeze_repeats: int = 2,
    present: np.ndarray | None = None,
    expert: ExpertData | None = None,
    **params: Any,
) -> ScenarioScores:
    """Per-tick score and veto as the executor computes them. With several gates the score is the
    largest score/threshold ratio (so the threshold is 1) and any gate's alarm vetoes; a tick a guard
    vetoes at once (NaN/Inf, norm band, feature range, freeze check) is marked `immediate`.

    ``present`` ((F,) bool): sensors that measure only these features (docs/design-notes/real-sensors.md):
    the others are NaN, the model sees them as their training mean, a raw-input gate judges the profile
    (``ood.marginal.profile_gate``), and the change, range and freeze checks look at present features only."""
    gates = [gates] if isinstance(gates, ood.Gate) else list(gates)
    # expert: these episodes already driven (the same name, seeds and params), e.g. for a second model
    data = expert if expert is not None else run_expert_batch(name, list(seeds), **params)[1]
    ep = _Episodes.of(model, data, present)
    b, t_len = ep.shape
    out = _Verdicts(np.full((b, t_len), -np.inf), np.zeros((b, t_len), bool), np.zeros((b, t_len), bool))
    ratios = len(gates) > 1 or any(g.actuation is not None for g in gates)  # compare gates by score / threshold
    for gate in gates:
        _gate_verdicts(model, gate, ep, present, ratios, out)
    if freeze_repeats:
        _freeze_verdicts(model, gates, ep, present, freeze_repeats, out)

    instance = build_scenario(name, list(seeds), **params)
    onset_s = instance.ood_onset_s
    end_s = onset_s + np.broadcast_to(np.asarray(instance.fault.duration_s, float), onset_s.shape)

    def to_tick(times):
        return np.array([np.searchsorted(data.t, x - 1e-9) if np.isfinite(x) else t_len for x in times])

    return ScenarioScores(
        name,
        bool(np.isfinite(onset_s).any()),
        data.t,
        out.score,
        out.alarm,
        out.immediate,
        data.valid,
        to_tick(onset_s),
        to_tick(end_s),
        demand=np.abs(np.nan_to_num(ep.command)) >= DEMAND_ACCEL,
        decision=ep.dv,
        action=ep.logits.argmax(axis=2),
        logits=ep.logits,
        label=data.label,
    )


def actuation_verdicts(
    model: DecisionModel, check: ood.ActuationCheck, t: np.ndarray, features: np.ndarray, command: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(score, alarm) (B, T) of the actuation check on episodes observed at every tick, each episode
    scanned as a replay scans a session (the live ticks' rule; one slot per episode)."""
    b, t_len = command.shape
    accel_at, speed_at, _ = check.indices(model.card.feature_names, [c.name for c in model.card.controls])
    monitor = check.monitor(b)
    t_ns = np.round(t * 1e9).astype(np.int64)
    score, alarm = np.full((b, t_len), np.nan), np.zeros((b, t_len), bool)
    for e in range(b):
        score[e], alarm[e] = monitor.scan(e, t_ns, features[e, :, accel_at], features[e, :, speed_at], command[e])
    return score, alarm


def verdict(s: ScenarioScores) -> np.ndarray:
    """The gate's judgement of each tick as one number: its score, and +inf where a guard vetoed at
    once, since such a veto outranks every score."""
    return np.where(s.immediate, np.inf, s.score)


def separation(nominal: list[ScenarioScores], faulty: ScenarioScores, observable: str = "always") -> dict[str, Any]:
    inside = np.concatenate([verdict(s)[s.valid] for s in nominal])
    outside = verdict(faulty)[fault_active(faulty)]
    # +inf (non-finite input) ranks above everything, which is what a veto means
    big = np.finfo(np.float64).max
    inside, outside = np.minimum(inside, big), np.minimum(outside, big)
    delays = []
    for b in range(faulty.score.shape[0]):
        start = faulty.onset_tick[b]
        hits = np.flatnonzero(faulty.alarm[b, start:] & faulty.valid[b, start:])
        delays.append(float(hits[0]) if hits.size else np.inf)
    d = np.array(delays)
    after = fault_active(faulty)
    with_demand = after & faulty.demand
    demand = np.minimum(verdict(faulty)[with_demand], big)
    nan = float("nan")
    # a short episode may hold no judged tick (low friction: no demand yet): NaN, not a crash; the
    # caller says the scenario was not judged
    judged = demand if observable == "under_demand" else outside
    return {
        "auroc": ood.auroc(inside, outside) if outside.size else nan,
        "tnr_at_95tpr": ood.tnr_at_tpr(inside, outside, 0.95) if outside.size else nan,
        "delay_median_ticks": float(np.median(d)),
        "delay_max_ticks": float(d.max()),
        "detected": float(np.isfinite(d).mean()),
        "vetoed_after_onset": float(faulty.alarm[after].mean()),
        # the ticks after onset on which the car was asked to brake or accelerate
        "demand_share": float(with_demand.sum() / max(after.sum(), 1)),
        "auroc_demand": ood.auroc(inside, demand) if demand.size else float("nan"),
        "vetoed_with_demand": float(faulty.alarm[with_demand].mean()) if demand.size else float("nan"),
        "judged_on": JUDGED_ON[observable],
        "judged_ticks": int(judged.size),
        "auroc_judged": ood.auroc(inside, judged) if judged.size else nan,
    }


def targets(result: dict[str, Any]) -> dict[str, Any]:
    """Which of the sim targets the evaluation meets: each OOD scenario's AUROC on the ticks where
    its fault is observable, and the nominal false-veto rate."""
    failed = [
        f"{name}: AUROC {r['auroc_judged']:.4f} < {TARGET_AUROC} ({r['judged_on']})"
        for name, r in result["ood"].items()
        if not r["auroc_judged"] >= TARGET_AUROC
    ]
    rate = result["false_vetoes_nominal"]["per_tick"]
    if rate > TARGET_FALSE_VETOES:
        failed.append(f"nominal false vetoes {rate * 100:.3f}% per tick > {TARGET_FALSE_VETOES * 100:.1f}%")
    return {"auroc_min": TARGET_AUROC, "false_vetoes_max_per_tick": TARGET_FALSE_VETOES, "failed": failed}


def false_vetoes(nominal: list[ScenarioScores]) -> dict[str, float]:
    ticks = sum(int(s.valid.sum()) for s in nominal)
    vetoes = sum(int((s.alarm & s.valid).sum()) for s in nominal)
    hours = ticks * TICK_S / 3600
    return {"ticks": ticks, "vetoes": vetoes, "per_tick": vetoes / max(ticks, 1), "per_hour": vetoes / hours}


def closed_loop_with_and_without(
    model: DecisionModel,
    gate: ood.Gate | list[ood.Gate],
    scenarios: Sequence[str],
    seed: int,
    config: ExecutorConfig | None = None,
) -> list[dict[str, Any]]:
    rows = []
    for name in scenarios:
        row: dict[str, Any] = {"scenario": name}
        for label, g in (("without", None), ("with", gate)):
            run = drive_in_process(Executor(model, config, g), name, seed)
            m = run.metrics
            row[label] = {
                "collisions": m.collisions,
                "off_road": bool(m.off_road),
                "min_ttc_s": m.min_ttc_s,
                "vetoes": run.ticks_with(Reason.OOD_VETO),
                "fallback_s": float((run.safety_state == SafetyState.FALLBACK_ACTIVE).sum()) * TICK_S,
            }
        rows.append(row)
    return rows


def present_mask(model: DecisionModel, present: Sequence[str] | None) -> np.ndarray | None:
    """(F,) bool of the features the sensors measure (None: all). ConfigError listing the model's
    feature names for a name it does not have, or for no names at all: `gate eval` checks this before
    its minutes of scoring, and a typo must not be a traceback."""
    if present is None:
        return None
    names = model.card.feature_names
    unknown = [n for n in present if n not in names]
    if unknown or not present:
        given = f"names features the model does not have: {', '.join(unknown)}" if unknown else "names no feature"
        raise ConfigError(f"--present {given}; the model's features: {', '.join(names)}")
    return np.array([n in set(present) for n in names])


def evaluate(
    model: DecisionModel,
    gate: ood.Gate | list[ood.Gate],
    seeds: Sequence[int] = EVAL_SEEDS,
    closed_loop_seed: int = 700_100,
    out_dir: Path | None = None,
    console: Console | None = None,
    present: Sequence[str] | None = None,
    **params: Any,
) -> dict[str, Any]:
    """The open-loop separation and false vetoes, then the closed loop with and without the gates.
    ``present`` (feature names): sensors that measure only these (open loop only: the closed loop drives
    the simulator's full sensors)."""
    console = console or Console()
    gates = [gate] if isinstance(gate, ood.Gate) else list(gate)
    names = list(NOMINAL_SCENARIOS) + list(OOD_SCENARIOS)
    scores: dict[str, ScenarioScores] = {}
    mask = present_mask(model, present)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("scoring scenarios", total=len(names) + len(OOD_SCENARIOS))
        for name in names:
            progress.update(task, description=f"scoring {name}")
            scores[name] = score_episodes(model, gates, name, seeds, present=mask, **params)
            progress.advance(task)
        nominal = [scores[n] for n in NOMINAL_SCENARIOS]
        result: dict[str, Any] = {
            "gate": "+".join(g.version_hash[:16] for g in gates),
            "source": "+".join(g.schema.source for g in gates),
            "threshold": gates[0].threshold if len(gates) == 1 and gates[0].actuation is None else 1.0,
            "seeds": [int(s) for s in seeds],
            "false_vetoes_nominal": false_vetoes(nominal),
            "ood": {n: separation(nominal, scores[n], SCENARIOS[n].observable) for n in OOD_SCENARIOS},
            "present": None if present is None else list(present),
        }
        progress.update(task, description="closed loop with and without the gate")
        result["closed_loop"] = (
            closed_loop_with_and_without(model, gates, OOD_SCENARIOS, closed_loop_seed) if present is None else []
        )
        progress.update(task, completed=len(names) + len(OOD_SCENARIOS))
    result["targets"] = targets(result)
    print_evaluation(result, console)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        result["plots"] = [str(p) for p in plot_evaluation(scores, result["threshold"], out_dir)]
    return result


def print_evaluation(result: dict[str, Any], console: Console) -> None:
    fv = result["false_vetoes_nominal"]
    profile = "" if not result.get("present") else f", sensors measuring {', '.join(result['present'])}"
    table = Table(
        title=f"gate {result['gate']} ({result['source']}{profile}), threshold {result['threshold']:.1f}; nominal: "
        f"{fv['vetoes']} vetoes in {fv['ticks']} ticks = {fv['per_tick'] * 100:.3f}% per tick, "
        f"{fv['per_hour']:.1f} per hour"
    )
    for col in (
        "OOD scenario",
        "AUROC",
        "TNR@95%TPR",
        "detected",
        "delay median",
        "delay max",
        "vetoed after onset",
        "demand share",
        "AUROC demand",
        "vetoed w/ demand",
        "judged AUROC",
    ):
        table.add_column(col, justify="left" if col == "OOD scenario" else "right")
    for name, r in result["ood"].items():
        table.add_row(
            name,
            f"{r['auroc']:.4f}",
            f"{r['tnr_at_95tpr']:.3f}",
            f"{r['detected'] * 100:.0f}%",
            f"{r['delay_median_ticks']:.0f}",
            f"{r['delay_max_ticks']:.0f}",
            f"{r['vetoed_after_onset'] * 100:.0f}%",
            f"{r['demand_share'] * 100:.0f}%",
            f"{r['auroc_demand']:.4f}",
            f"{r['vetoed_with_demand'] * 100:.0f}%",
            f"{r['auroc_judged']:.4f}" + (" (w/ demand)" if r["judged_on"] == JUDGED_ON["under_demand"] else ""),
        )
    console.print(table)
    t = result.get("targets")
    if t is not None:
        console.print(
            f"[green]targets met[/]: AUROC >= {t['auroc_min']} where each fault is observable, nominal false "
            f"vetoes <= {t['false_vetoes_max_per_tick'] * 100:.1f}% per tick"
            if not t["failed"]
            else "[red]targets not met:[/] " + "; ".join(t["failed"])
        )
    if not result["closed_loop"]:
        return
    loop = Table(title="closed loop on OOD scenarios, without and with the gate")
    for col in ("scenario", "collisions w/o", "min TTC w/o", "collisions with", "min TTC with", "fallback s with"):
        loop.add_column(col, justify="left" if col == "scenario" else "right")
    for row in result["closed_loop"]:
        w, g = row["without"], row["with"]
        loop.add_row(
            row["scenario"],
            f"{w['collisions']}{' off-road' if w['off_road'] else ''}",
            f"{w['min_ttc_s']:.1f}",
            f"{g['collisions']}{' off-road' if g['off_road'] else ''}",
            f"{g['min_ttc_s']:.1f}",
            f"{g['fallback_s']:.1f}",
        )
    console.print(loop)
