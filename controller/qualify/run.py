"""`dualloop qualify`: one verdict for a model change, from the three validation steps.

    qualify(QualifyInputs(...)) -> Qualification     the library call

(a) replay agreement on recorded drives (replay_step), (b) the stress set (stress), (c) shadow
evidence when recorded shadow sessions are given (shadow_step), and the per-class INT8 check when
an INT8 variant is given (int8_step). Every step runs the candidate and the baseline model on the
same inputs; the verdict is the list of checks (criteria.py) the candidate fails.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from dualloop.controller.contract.errors import ConfigError
from dualloop.controller.contract.gate_files import load_gate_for_model
from dualloop.controller.qualify.checks import Check
from dualloop.controller.qualify.criteria import Criteria
from dualloop.controller.qualify.int8_step import check_int8_source, int8_checks, run_int8_step
from dualloop.controller.qualify.replay_step import ModelRun, ReplayStep, run_replay_step
from dualloop.controller.qualify.shadow_step import ShadowStep, run_shadow_step
from dualloop.controller.qualify.stress import STRESS_SEED0, StressResult, run_stress, stress_checks
from dualloop.controller.qualify.transfer_step import read_transfer, transfer_checks
from dualloop.controller.transfer.leave_out import TransferReport
from dualloop.executor.model_card import ModelFileError
from dualloop.executor.model_runner import DecisionModel
from dualloop.models import BASE_MODEL_PATH, gates_beside
from dualloop.ood import Gate
from dualloop.sim.env import ExpertData

SCHEMA: Final = "dualloop.qualify/1"
DEFAULT_STRESS_SEEDS: Final = 4


@dataclass
class QualifyInputs:
    candidate: Path
    logs: Sequence[Path]
    baseline: Path = BASE_MODEL_PATH
    candidate_gates: Sequence[Path] | None = None  # None: gates_beside
    baseline_gates: Sequence[Path] | None = None
    shadow: Sequence[Path] = ()
    int8: Path | None = None
    criteria: Criteria = field(default_factory=Criteria)
    stress_seeds: int = DEFAULT_STRESS_SEEDS
    stress_scenarios: Sequence[str] | None = None  # None: every OOD scenario
    stress_duration_s: float | None = None  # None: each scenario's own duration
    workers: int | None = None
    work_dir: Path | None = None  # the replayed logs (default: a temporary folder)
    transfer: Path | None = None  # a leave-one-dataset-out report of the candidate's recipe (transfer.json)


@dataclass
class Qualification:
    inputs: QualifyInputs
    checks: list[Check]
    replay: ReplayStep | None
    stress: tuple[StressResult, StressResult] | None  # candidate, baseline
    shadow: ShadowStep | None
    int8: dict[str, Any] | None
    models: dict[str, dict[str, Any]]
    timings_s: dict[str, float]
    transfer: TransferReport | None = None

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    @property
    def not_judged(self) -> list[Check]:
        return [c for c in self.checks if not c.judged]

    @property
    def verdict(self) -> str:
        """'fail', 'pass', or 'not judged': no check had anything to compare, which is no evidence
        that the candidate is as good (the command exits 2, as for inputs it cannot judge)."""
        if self.failed:
            return "fail"
        return "pass" if len(self.not_judged) < len(self.checks) else "not judged"

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def why_not_judged(self) -> str:
        """Why nothing was judged, from the checks' notes (each said once)."""
        notes = dict.fromkeys(f"{c.step}: {c.note.removeprefix('not judged: ')}" for c in self.not_judged)
        return "; ".join(notes) or "the inputs give no criterion to check"

    def as_dict(self) -> dict[str, Any]:
        i = self.inputs
        return {
            "schema": SCHEMA,
            "verdict": self.verdict,
            "failed": [c.line() for c in self.failed],
            "not_judged": [c.line() for c in self.not_judged],
            "checks": [c.as_dict() for c in self.checks],
            "models": self.models,
            "criteria": i.criteria.model_dump(),
            "inputs": {
                "logs": [str(p) for p in i.logs],
                "shadow": [str(p) for p in i.shadow],
                "int8": None if i.int8 is None else str(i.int8),
                "stress_seeds": i.stress_seeds,
                "stress_scenarios": None if i.stress_scenarios is None else list(i.stress_scenarios),
                "stress_duration_s": i.stress_duration_s,
            },
            "replay": self.replay.as_dict() if self.replay else None,
            "stress": None
            if self.stress is None
            else {"candidate": self.stress[0].as_dict(), "baseline": self.stress[1].as_dict()},
            "shadow": self.shadow.as_dict() if self.shadow else None,
            "int8": self.int8,
            "transfer": None if self.transfer is None else json.loads(self.transfer.to_json()),
            "timings_s": self.timings_s,
        }


def _model_info(model: DecisionModel, gates: Sequence[Path]) -> dict[str, Any]:
    return {
        "path": str(model.path),
        "name": model.card.name,
        "version": model.card.version,
        "temperature": model.card.temperature,
        "gates": [str(g) for g in gates],
    }


def _quiet(_: str) -> None:
    return None


@dataclass(frozen=True)
class _Models:
    """The candidate and the baseline with their gates (the files named, else those beside each model)."""

    candidate: DecisionModel
    baseline: DecisionModel
    candidate_gates: tuple[Path, ...]
    baseline_gates: tuple[Path, ...]
    candidate_gate_objects: list[Gate]
    baseline_gate_objects: list[Gate]
    int8: DecisionModel | None = None

    @classmethod
    def load(cls, inputs: QualifyInputs) -> _Models:
        """The models and gates, once the inputs name something to qualify and files that exist."""
        given = (inputs.logs, inputs.stress_seeds > 0, inputs.shadow, inputs.int8, inputs.transfer)
        if not any(x is not None and x is not False and x != () and x != [] for x in given):
            raise ConfigError("nothing to qualify: give --logs, stress seeds, --shadow, --int8 or --transfer")
        for p in inputs.logs:
            if not Path(p).is_file():
                raise ConfigError(f"--logs: {p}: no such log file")
        cand_model, base_model = DecisionModel(inputs.candidate), DecisionModel(inputs.baseline)
        if list(cand_model.card.actions) != list(base_model.card.actions):
            raise ConfigError(
                f"{inputs.candidate}: actions {list(cand_model.card.actions)} differ from the baseline "
                f"{inputs.baseline}'s {list(base_model.card.actions)}; the models cannot be compared"
            )
        cand_gate_paths = (
            tuple(inputs.candidate_gates) if inputs.candidate_gates is not None else gates_beside(inputs.candidate)
        )
        base_gate_paths = (
            tuple(inputs.baseline_gates) if inputs.baseline_gates is not None else gates_beside(inputs.baseline)
        )
        cand_gates = [load_gate_for_model(g, cand_model) for g in cand_gate_paths]
        base_gates = [load_gate_for_model(g, base_model) for g in base_gate_paths]
        int8 = None
        if inputs.int8 is not None:  # now, not after the replay and the stress set
            try:
                int8 = DecisionModel(inputs.int8)
            except ModelFileError as err:
                raise ModelFileError(f"--int8 {err}") from None
            check_int8_source(cand_model, int8)
        return cls(cand_model, base_model, cand_gate_paths, base_gate_paths, cand_gates, base_gates, int8)


def qualify(inputs: QualifyInputs, say: Callable[[str], None] = _quiet) -> Qualification:
    """Run the steps and collect the checks. Bad input (a file that is not a model, a gate or a log;
    models with different actions; shadow logs without the candidate) raises the error that names it
    (ConfigError, ModelFileError, GateFileError, LogFileError, OSError): the command exits 2. `say`
    is told which step starts."""
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    m = _Models.load(inputs)
    cand_model, base_model, cand_gate_paths, base_gate_paths = (
        m.candidate,
        m.baseline,
        m.candidate_gates,
        m.baseline_gates,
    )
    cand_gates, base_gates = m.candidate_gate_objects, m.baseline_gate_objects
    c = inputs.criteria
    checks: list[Check] = []
    transfer = None
    if inputs.transfer is not None:  # first: the headline, and the cheapest to refuse
        transfer = read_transfer(inputs.transfer)
        checks += transfer_checks(transfer)
    shadow = None
    if inputs.shadow:  # read before the replay: a log that is no shadow recording is refused before the replay
        t = time.perf_counter()
        say(f"(c) shadow evidence from {len(inputs.shadow)} logs")
        shadow = run_shadow_step(inputs.shadow, cand_model.card, base_model.card)
        timings["shadow"] = time.perf_counter() - t

    replay = None
    if inputs.logs:
        t = time.perf_counter()
        say(f"(a) replaying {len(inputs.logs)} logs with both models, then diffing the replays")
        with tempfile.TemporaryDirectory(prefix="qualify-") as tmp:
            work = Path(inputs.work_dir) if inputs.work_dir is not None else Path(tmp)
            replay = run_replay_step(
                inputs.logs,
                ModelRun(Path(inputs.candidate), cand_gate_paths),
                ModelRun(Path(inputs.baseline), base_gate_paths),
                work,
                inputs.workers,
            )
        checks += replay.checks(c.replay)
        timings["replay"] = time.perf_counter() - t

    stress = None
    if inputs.stress_seeds > 0:
        t = time.perf_counter()
        seeds = range(STRESS_SEED0, STRESS_SEED0 + inputs.stress_seeds)
        say(f"(b) the stress set on {inputs.stress_seeds} seeds per scenario, both models")
        params = {} if inputs.stress_duration_s is None else {"duration_s": inputs.stress_duration_s}
        expert: dict[str, ExpertData] = {}  # the same episodes for both models
        stress = (
            run_stress(cand_model, cand_gates, seeds, inputs.stress_scenarios, expert, **params),
            run_stress(base_model, base_gates, seeds, inputs.stress_scenarios, expert, **params),
        )
        checks += stress_checks(*stress, c.stress)
        timings["stress"] = time.perf_counter() - t
    if shadow is not None:
        checks += shadow.checks(c.shadow)

    int8 = None
    if m.int8 is not None:
        t = time.perf_counter()
        say(f"INT8: {inputs.int8} against the candidate, per class")
        int8 = run_int8_step(cand_model, m.int8, c.int8.max_recall_drop)
        checks += int8_checks(int8, c.int8)
        timings["int8"] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - t0
    return Qualification(
        inputs,
        checks,
        replay,
        stress,
        shadow,
        int8,
        {"candidate": _model_info(cand_model, cand_gate_paths), "baseline": _model_info(base_model, base_gate_paths)},
        timings,
        transfer,
    )
