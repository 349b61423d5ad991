"""`dualloop demo-safety`: what reached the actuators around every safety transition.

Drives the six out-of-distribution scenarios, and the two lead scenarios with a veto forced by an
unrelated sensor's fault, in process (the executor the server wraps, with the shipped model and
gates) on seeds nothing was tuned on, and reads each tick's applied command:

- **onset bound**: ticks in the first second after leaving NOMINAL whose applied acceleration is
  below min(command applied at the last NOMINAL tick, 0) - jerk_limit * t (trusted-threat braking,
  which may exceed the limit and says so, aside);
- **largest step**: the largest change of the acceleration command between two ticks either of
  which is not NOMINAL (THREAT_BRAKING ticks aside), against jerk_limit * tick period;
- **largest steering step**: the same for the steering command at 10 m/s and faster, against the
  lane keeper's max_steer_rate * tick period (into the hold, through the fallback and back to the
  model; slower, the recovery's return may turn faster within its lateral-jerk bound);
- **name/band**: applied actions whose name is not the band of their acceleration;
- **standstill**: ticks held at standstill, and ticks on which a session that had stopped left the
  hold (a drive-off: only an explicit release may end it, and these runs send none);
- collisions, and for the forced-veto runs the least gap to the lead. A collision with a car that
  cut in so close that braking at the tyre limit from that very tick could not have avoided it
  (relative speed^2 / (2 gap) above the simulator's 8 m/s^2) is counted, and reported apart as
  unavoidable by braking; `--check` fails on the others.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dualloop.controller.console import console
from dualloop.controller.contract.errors import ConfigError
from dualloop.controller.contract.gate_files import load_gate_for_model
from dualloop.controller.demo.closed_loop import ClosedLoopRun, InProcessDecider, run_closed_loop
from dualloop.controller.demo.traffic_demo import strict_json
from dualloop.controller.logs.outputs import prepare_output_file
from dualloop.controller.server_process import require_files
from dualloop.executor.action_labels import action_of_accel
from dualloop.executor.config import ExecutorConfig
from dualloop.executor.core import Executor
from dualloop.executor.model_runner import DecisionModel
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES
from dualloop.sim.env import SimEnv, make_scenario
from dualloop.sim.scenarios import OOD_SCENARIOS, SCENARIOS
from dualloop.sim.schema import ACCEL_MIN, FEATURE_INDEX
from dualloop.v2 import controller_pb2 as pb

TICK_S = 0.005
# Seeds no model, gate or safety setting was fitted or tuned on (training and the demo use others).
UNTUNED_SEEDS = tuple(range(910_001, 910_009))
FORCED_VETO_SCENARIOS = ("lead_brakes_hard", "cut_in")
STEER_FIGURE_MIN_SPEED = 10.0  # m/s: above ~8.2 the recovery's lateral-jerk rate is below max_steer_rate
NEW_LEAD_DROP_M = 3.0  # a lead gap shorter by this in one tick is another car (a cut-in)
CONTACT_GAP_M = 1.0  # a run that ends with its lead this close ended in contact with it


@dataclass
class Truth:
    """What the vehicle and its lead really did, per tick (the simulator's noise-free features)."""

    speed: np.ndarray  # m/s
    lead_present: np.ndarray  # bool
    lead_gap: np.ndarray  # m
    lead_rel_speed: np.ndarray  # m/s, lead minus ego


def unavoidable_by_braking(truth: Truth, max_decel: float = -ACCEL_MIN) -> bool:
    """Whether a car appeared ahead (the lead flag rising, or the gap shorter by NEW_LEAD_DROP_M in
    one tick) closing so fast that braking at `max_decel` from that tick on, with no reaction time,
    could not stop the closing before contact, and the run ended in contact with its lead."""
    present, gap, rel = truth.lead_present, truth.lead_gap, truth.lead_rel_speed
    if len(gap) < 2 or not (present[-1] and gap[-1] < CONTACT_GAP_M):
        return False
    appeared = present[1:] & (~present[:-1] | (gap[1:] < gap[:-1] - NEW_LEAD_DROP_M))
    k = np.flatnonzero(appeared) + 1
    closing = rel[k] < 0.0
    need = rel[k] ** 2 / (2.0 * np.maximum(gap[k], 1e-3))
    return bool((closing & (need > max_decel)).any())


class WatchedScenario:
    """A scenario whose true speed and least lead gap are recorded per tick. With `force`, its
    rear-right gap sensor reads -50 m (an input-range veto of every tick, the lead's own readings
    healthy) from the moment the lead becomes a threat: it closes at more than 1 m/s, or a car cuts
    in closer than 25 m."""

    def __init__(self, env: SimEnv, force: bool = True) -> None:
        self._env = env
        self.force = force  # False: only watched (the truth, the least gap)
        self.min_lead_gap = float("inf")
        self.onset_s: float | None = None
        self.true_rows: list[tuple[float, float, float, float]] = []  # per observation: speed, lead

    def truth(self, ticks: int) -> Truth:
        rows = np.array(self.true_rows[:ticks], np.float64).reshape(-1, 4)
        return Truth(rows[:, 0], rows[:, 1] == 1.0, rows[:, 2], rows[:, 3])

    def observe(self) -> tuple[np.ndarray, np.ndarray]:
        features, plan = self._env.observe()
        true = self._env.true_features()
        speed, present, gap_true, rel_true = (
            float(true[FEATURE_INDEX[n]]) for n in ("ego_speed", "lead_present", "lead_distance", "lead_rel_speed")
        )
        self.true_rows.append((speed, present, gap_true, rel_true))
        lead = features[FEATURE_INDEX["lead_present"]] == 1.0
        gap, rel = float(features[FEATURE_INDEX["lead_distance"]]), float(features[FEATURE_INDEX["lead_rel_speed"]])
        if lead:
            self.min_lead_gap = min(self.min_lead_gap, gap)
        if self.onset_s is None and lead and (rel < -1.0 or gap < 25.0):
            self.onset_s = self._env.t
        if self.onset_s is not None and self.force:
            features = features.copy()
            features[FEATURE_INDEX["right_rear_gap"]] = -50.0
        return features, plan

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)


@dataclass
class TransitionFigures:
    scenario: str
    seed: int
    onsets: int  # exits from NOMINAL
    onset_bound_violations: int
    min_applied_first_second: float  # m/s^2, over every onset's first second
    largest_step: float  # m/s^2 per tick, in or next to a non-NOMINAL state (threat braking aside)
    largest_steer_step: float  # rad per tick, the same ticks at 10 m/s or faster (true speed)
    name_band_contradictions: int
    threat_braking_ticks: int
    standstill_ticks: int
    drive_offs: int
    collisions: int
    unavoidable_collisions: int = 0  # of those, with a cut-in no braking could have avoided
    min_lead_gap_m: float | None = None


def transition_figures(
    run: ClosedLoopRun, jerk_limit: float, min_lead_gap: float | None = None, truth: Truth | None = None
) -> TransitionFigures:
    """`truth`: what the vehicle really did (None: every tick counts for the steering, and no
    collision is judged unavoidable)."""
    a = run.applied_accel.astype(np.float64)
    nominal = run.safety_state == pb.SAFETY_STATE_NOMINAL
    threat = ((run.reasons >> pb.REASON_CODE_THREAT_BRAKING) & 1).astype(bool)
    standstill = ((run.reasons >> pb.REASON_CODE_STANDSTILL_HOLD) & 1).astype(bool)
    decided = run.applied_index >= 0
    onsets = np.flatnonzero(nominal[:-1] & ~nominal[1:] & decided[:-1]) + 1
    violations, lowest = 0, float("inf")
    for k in onsets.tolist():
        held = min(float(a[k - 1]), 0.0)
        window = np.arange(k, min(k + int(1.0 / TICK_S), len(a)))
        t = (window - k + 1) * TICK_S
        below = (a[window] < held - jerk_limit * t - 1e-9) & ~threat[window]
        violations += int(below.sum())
        lowest = min(lowest, float(a[window].min()))
    steps = np.abs(np.diff(a))
    steer_steps = np.abs(np.diff(run.applied_steer.astype(np.float64)))
    near = (~nominal[1:] | ~nominal[:-1]) & ~threat[1:] & ~threat[:-1] & decided[:-1]
    fast = near if truth is None else near & (truth.speed[:-1] >= STEER_FIGURE_MIN_SPEED)
    collisions = int(run.metrics.collisions)
    stopped_at = np.flatnonzero(standstill)
    drive_offs = int((~standstill[stopped_at[0] :]).sum()) if len(stopped_at) else 0
    return TransitionFigures(
        scenario=run.scenario,
        seed=run.seed,
        onsets=len(onsets),
        onset_bound_violations=violations,
        min_applied_first_second=lowest if len(onsets) else float("nan"),
        largest_step=float(steps[near].max()) if near.any() else 0.0,
        largest_steer_step=float(steer_steps[fast].max()) if fast.any() else 0.0,
        name_band_contradictions=int((action_of_accel(a)[decided] != run.applied_index[decided]).sum()),
        threat_braking_ticks=int(threat.sum()),
        standstill_ticks=int(standstill.sum()),
        drive_offs=drive_offs,
        collisions=collisions,
        unavoidable_collisions=collisions if truth is not None and unavoidable_by_braking(truth) else 0,
        min_lead_gap_m=min_lead_gap,
    )


def drive(
    model: DecisionModel, gates: list[Path], scenario: str, seed: int, forced_veto: bool
) -> tuple[ClosedLoopRun, float | None, Truth]:
    """(the run, the least lead gap of a forced-veto run, what the vehicle really did)."""
    executor = Executor(model, ExecutorConfig(), [load_gate_for_model(g, model) for g in gates])
    env = WatchedScenario(make_scenario(scenario, seed), force=forced_veto)
    run = run_closed_loop(env, InProcessDecider(executor, f"{scenario}-{seed}"), seed)  # type: ignore[arg-type]
    return run, (env.min_lead_gap if forced_veto else None), env.truth(len(run.t))


def check(
    model_path: Path, gates: list[Path], seeds: Sequence[int], scenarios: Sequence[str]
) -> list[TransitionFigures]:
    model = DecisionModel(model_path)
    jerk = ExecutorConfig().safety.jerk_limit
    runs = [(s, False) for s in scenarios if s not in FORCED_VETO_SCENARIOS]
    runs += [(s, True) for s in scenarios if s in FORCED_VETO_SCENARIOS]
    out = []
    with console.status("") as status:
        for scenario, forced in runs:
            for seed in seeds:
                status.update(f"{scenario}{' (forced veto)' if forced else ''} seed {seed}")
                run, gap, truth = drive(model, gates, scenario, seed, forced)
                fig = transition_figures(run, jerk, gap, truth)
                if forced:
                    fig.scenario += "+forced_veto"
                out.append(fig)
    return out


def summarise(figures: list[TransitionFigures], jerk_step: float, steer_step: float) -> list[dict[str, Any]]:
    rows = []
    for name in dict.fromkeys(f.scenario for f in figures):
        fs = [f for f in figures if f.scenario == name]
        gaps = [f.min_lead_gap_m for f in fs if f.min_lead_gap_m is not None]
        # a seed that never left NOMINAL has no such figure (nan): left out, or min() would answer nan
        # whenever such a seed came first and hide the others' figures
        lows = [f.min_applied_first_second for f in fs if math.isfinite(f.min_applied_first_second)]
        rows.append(
            {
                "scenario": name,
                "seeds": len(fs),
                "onset_bound_violations": sum(f.onset_bound_violations for f in fs),
                "min_applied_first_second": min(lows) if lows else None,
                "largest_step": max(f.largest_step for f in fs),
                "step_limit": jerk_step,
                "largest_steer_step": max(f.largest_steer_step for f in fs),
                "steer_step_limit": steer_step,
                "name_band_contradictions": sum(f.name_band_contradictions for f in fs),
                "threat_braking_ticks": sum(f.threat_braking_ticks for f in fs),
                "seeds_stopped": sum(f.standstill_ticks > 0 for f in fs),
                "drive_offs": sum(f.drive_offs for f in fs),
                "collisions": sum(f.collisions for f in fs),
                "unavoidable": sum(f.unavoidable_collisions for f in fs),
                "min_lead_gap_m": min(gaps) if gaps else None,
            }
        )
    return rows


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo-safety", help="what reached the actuators at every safety transition, OOD and forced-veto scenarios"
    )
    p.add_argument("--model", type=Path, default=BASE_MODEL_PATH)
    p.add_argument("--gate", type=Path, action="append", help="gate files (default: the base model's two)")
    p.add_argument(
        "--seeds", type=int, default=len(UNTUNED_SEEDS), help="how many of the untuned seeds, at least 1 (default 8)"
    )
    p.add_argument("--scenarios", help="comma-separated (default: the six OOD ones and the two forced-veto ones)")
    p.add_argument(
        "--json", type=Path, help="write every run's figures here (JSON; null: a figure that does not exist)"
    )
    p.add_argument("--check", action="store_true", help="exit 1 when a target is not met")
    p.set_defaults(fn=_main)


def check_args(args: argparse.Namespace, gates: list[Path]) -> tuple[list[str], Sequence[int]]:
    """(the scenarios, the seeds), every argument checked before the first run (a ConfigError: one
    line, exit 2)."""
    if args.seeds < 1:  # -1 sliced the seeds to 7 of 8, 0 to none
        raise ConfigError(f"--seeds {args.seeds}: must be at least 1")
    scenarios = [*OOD_SCENARIOS, *FORCED_VETO_SCENARIOS]
    if args.scenarios is not None:
        scenarios = list(dict.fromkeys(s.strip() for s in args.scenarios.split(",") if s.strip()))  # each once
        unknown = [s for s in scenarios if s not in SCENARIOS]
        if unknown or not scenarios:
            what = f"unknown {', '.join(unknown)}" if unknown else "names no scenario"
            raise ConfigError(f"--scenarios {args.scenarios!r}: {what}; choose from {', '.join(SCENARIOS)}")
    require_files(args.model, gates)
    if args.json:
        prepare_output_file(args.json, "--json", ConfigError)
    n = args.seeds
    return scenarios, UNTUNED_SEEDS[:n] if n <= len(UNTUNED_SEEDS) else range(910_001, 910_001 + n)


def cell(value: object) -> str:
    """A table cell: a figure that does not exist (None: no lead gap outside the forced-veto runs; nan:
    no onset, so no first second after one) is a dash, as docs/demo.md says and the JSON's null."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _main(args: argparse.Namespace) -> int:
    from rich.table import Table

    gates = args.gate or [g for g in DEFAULT_GATES if g.is_file()]
    scenarios, seeds = check_args(args, gates)
    figures = check(args.model, gates, seeds, scenarios)
    safety = ExecutorConfig().safety
    step = safety.jerk_limit * TICK_S
    steer_step = safety.lane_keeping.max_steer_rate * TICK_S if safety.lane_keeping else float("inf")
    rows = summarise(figures, step, steer_step)
    table = Table(title=f"what reached the actuators, seeds {seeds[0]}-{seeds[-1]} (untuned)")
    for col in rows[0]:
        table.add_column(col.replace("_", " "), justify="right" if col != "scenario" else "left")
    for r in rows:
        table.add_row(*(cell(v) for v in r.values()))
    console.print(table)
    if args.json:
        args.json.write_text(strict_json({"summary": rows, "runs": [asdict(f) for f in figures]}))
    failed = [
        f"{r['scenario']}: {what}"
        for r in rows
        for what, bad in (
            ("onset bound", r["onset_bound_violations"] > 0),
            (f"step {r['largest_step']:.4g} > {step}", r["largest_step"] > step),
            (
                f"steering step {r['largest_steer_step']:.4g} > {steer_step:.4g}",
                r["largest_steer_step"] > steer_step + 1e-6,
            ),
            ("name/band", r["name_band_contradictions"] > 0),
            ("drive-off", r["drive_offs"] > 0),
            ("collision", r["collisions"] > r["unavoidable"]),
        )
        if bad
    ]
    for r in rows:
        if r["unavoidable"]:
            console.print(
                f"{r['scenario']}: {r['unavoidable']} collision(s) with a car that cut in closer than braking at "
                f"{-ACCEL_MIN:g} m/s^2 could stop for (not counted against --check)"
            )
    for f in failed:
        console.print(f"[red]not met[/]: {f}")
    return 1 if (failed and args.check) else 0
