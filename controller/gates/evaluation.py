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
from pathlib import Path
from typing import Any, cast

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from dualloop import ood
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
from dualloop.ood.marginal import ProfileGate, profile_gate
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
    b, t_len = data.valid.shape
    features, flat_x, flat_p, finite, history, logits, dv = _model_rows(model, data, present)
    slots = np.arange(b)
    score = np.full((b, t_len), -np.inf)
    alarm = np.zeros((b, t_len), bool)
    immediate = np.zeros((b, t_len), bool)
    # the command in effect at each tick (what the previous step applied), NaN where unknown or invalid
    assert data.applied is not None  # run_expert_batch records it
    command = np.where(data.valid, data.applied[..., 0], np.nan)
    ratios = len(gates) > 1 or any(g.actuation is not None for g in gates)  # compare gates by score / threshold
    for gate in gates:
        judged, feats = _gate_rows(model, gate, present, (flat_x, flat_p, history), dv, finite)
        rng = gate.feature_range
        changes = episode_changes(features, data.t, present) if rng is not None and rng.change_low else None
        plans = data.plan if rng is not None and rng.context_names else None
        monitor = gate.monitor(b) if judged is None else ood.GateMonitor(judged.scorer(b), make_filter(gate.filter, b))
        threshold = gate.threshold if judged is None else judged.threshold
        scale = 1.0 / threshold if ratios else 1.0
        # a profile's norm guard looks at the present features (ood.marginal.ProfileGate.norm_out)
        norm_out = None if judged is None else judged.norm_out(flat_x).reshape(b, t_len) & finite
        for k in range(t_len):
            step = monitor.step(
                feats[:, k], slots, None if changes is None else changes[:, k], None if plans is None else plans[:, k]
            )
            score[:, k] = np.maximum(score[:, k], step.score * scale)
            alarm[:, k] |= step.alarm
            immediate[:, k] |= step.flags.immediate
            if norm_out is not None:
                alarm[:, k] |= norm_out[:, k]
                immediate[:, k] |= norm_out[:, k]
        if gate.actuation is not None:
            act_score, act_alarm = actuation_verdicts(model, gate.actuation, data.t, features, command)
            score = np.fmax(score, act_score / gate.actuation.threshold)  # no verdict (NaN) changes nothing
            alarm |= act_alarm
    if freeze_repeats:
        frozen = _frozen(model, gates, features, present, freeze_repeats)
        alarm |= frozen
        immediate |= frozen
    has_fault, onset, end = _fault_ticks(name, seeds, data.t, **params)
    return ScenarioScores(
        name,
        has_fault,
        data.t,
        score,
        alarm,
        immediate,
        data.valid,
        onset,
        end,
        demand=np.abs(np.nan_to_num(command)) >= DEMAND_ACCEL,
        decision=dv,
        action=logits.argmax(axis=2),
        logits=logits,
        label=data.label,
    )


def _model_rows(
    model: DecisionModel, data: ExpertData, present: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray, np.ndarray]:
    """The episodes as the sensors report them (NaN where not measured) and the model's view of them:
    (features (B, T, F), flat features (B*T, F), flat plans, finite (B, T), history features (B*T, H) or
    None, logits (B, T, A), decision vectors (B, T, D))."""
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
    return features, flat_x, flat_p, finite, history, logits.reshape(b, t_len, -1), dv.reshape(b, t_len, -1)


def _gate_rows(
    model: DecisionModel,
    gate: ood.Gate,
    present: np.ndarray | None,
    rows: tuple[np.ndarray, np.ndarray, np.ndarray | None],
    dv: np.ndarray,
    finite: np.ndarray,
) -> tuple[ProfileGate | None, np.ndarray]:
    """(the gate as it judges the sensor profile, None without one or for a decision-vector gate; what
    the gate scores per tick (B, T, dim), NaN where the measured features are not finite). `rows`: the
    flat features, plans and history features (`_model_rows`)."""
    flat_x, flat_p, history = rows
    b, t_len = finite.shape
    judged = None if present is None or gate.schema.source != "input_features" else profile_gate(gate, present)
    if gate.schema.source == "decision_vector":
        feats = dv
    elif judged is not None:  # the gate's completed copy of the rows
        feats = judged.marginal.complete(flat_x).reshape(b, t_len, -1)
    else:
        feats = model_features(model, flat_x, flat_p, gate.schema.source, history=history).reshape(b, t_len, -1)
    feats = np.where(finite[..., None], feats, np.nan)
    if judged is None:
        feats = feats.astype(np.float32)
    return judged, feats


def _frozen(
    model: DecisionModel, gates: list[ood.Gate], features: np.ndarray, present: np.ndarray | None, repeats: int
) -> np.ndarray:
    """(B, T) bool: the freeze check's verdict on each tick, with the gates' common settings."""
    b, t_len = features.shape[:2]
    stated = common_settings([g.freeze for g in gates])
    rest = None if stated is None else stated.rest(model.card.feature_names)
    freeze = ood.FreezeDetector(b, features.shape[2], repeats, rest)
    for slot in range(b):
        freeze.set_present(slot, present)
    slots, fresh = np.arange(b), np.ones(b, bool)
    frozen = np.zeros((b, t_len), bool)
    for k in range(t_len):
        frozen[:, k] = freeze.update(features[:, k], slots, fresh)
    return frozen


def _fault_ticks(name: str, seeds: Sequence[int], t: np.ndarray, **params: Any) -> tuple[bool, np.ndarray, np.ndarray]:
    """(the scenario has a fault, the tick each episode's fault starts, the tick it ends); len(t) where never."""
    instance = build_scenario(name, list(seeds), **params)
    onset_s = instance.ood_onset_s
    end_s = onset_s + np.broadcast_to(np.asarray(instance.fault.duration_s, float), onset_s.shape)

    def to_tick(times: np.ndarray) -> np.ndarray:
        return np.array([np.searchsorted(t, x - 1e-9) if np.isfinite(x) else len(t) for x in times])

    return bool(np.isfinite(onset_s).any()), to_tick(onset_s), to_tick(end_s)


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
    return {
        "auroc": ood.auroc(inside, outside),
        "tnr_at_95tpr": ood.tnr_at_tpr(inside, outside, 0.95),
        "delay_median_ticks": float(np.median(d)),
        "delay_max_ticks": float(d.max()),
        "detected": float(np.isfinite(d).mean()),
        "vetoed_after_onset": float(faulty.alarm[after].mean()),
        # the ticks after onset on which the car was asked to brake or accelerate
        "demand_share": float(with_demand.sum() / max(after.sum(), 1)),
        "auroc_demand": ood.auroc(inside, demand) if demand.size else float("nan"),
        "vetoed_with_demand": float(faulty.alarm[with_demand].mean()) if demand.size else float("nan"),
        "judged_on": JUDGED_ON[observable],
    } | {"auroc_judged": ood.auroc(inside, demand if observable == "under_demand" else outside)}


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
    mask = None
    if present is not None:
        unknown = sorted(set(present) - set(model.card.feature_names))
        if unknown:
            raise ValueError(f"--present names features the model does not have: {unknown}")
        mask = np.array([n in set(present) for n in model.card.feature_names])
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
