"""Leave one dataset out: how the training recipe does on data it never saw.

A held-out drive from a site the model trained on says little about a site it did not: the same
cars, roads, sensors and drivers are on both sides. So each recorded dataset (a site or campaign:
openacc-vicolungo, ngsim-i-80, ...) is held out in turn:

- left out: a model trained by the shipped recipe on the simulated data and on every *other*
  dataset's drives (both splits), its two gates fitted for it as the shipped ones are (on simulated
  driving, their thresholds calibrated on the other datasets as sites: ood.sites), scored on every
  labelled row of the held-out dataset and replayed in LOCKSTEP over all its drives;
- within: the shipped model and gates on the dataset's own held-out split (the folder `heldout/`
  that `dualloop import shared-data` writes), the figure the project used to report. For a dataset
  held out whole (no drive of it trained the shipped model) the two columns measure the same thing
  with different models.

Per dataset: the disagreement with the human's look-ahead action over the best trivial baseline's
on the same rows (controller.training.log_eval), the share of replayed ticks in NOMINAL and the
share with an OOD veto.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from dualloop.controller.gates.fitting import CALIBRATION_SEEDS, FIT_SEEDS, GateFitConfig, fit_gate_for_model
from dualloop.controller.replay.lockstep import replay_log
from dualloop.controller.training.data import DataConfig, generate
from dualloop.controller.training.log_eval import DatasetReport, evaluate, ratio_text
from dualloop.controller.training.recorded import LogRows, read_log_rows
from dualloop.controller.training.trainer import (
    DEFAULT_SEED,
    FULL_DATA,
    LOG_SHARE,
    QUICK_DATA,
    TrainOptions,
    mlp_config,
    train,
)
from dualloop.executor.checks import NAMES as CHECK_NAMES
from dualloop.executor.gating import GATE_SOURCES
from dualloop.executor.history import DEFAULT_HISTORY
from dualloop.executor.model_runner import DecisionModel
from dualloop.executor.snapshot import Reason, SafetyState

HELDOUT_FOLDER = "heldout"
# The targets of a site never seen (left-out column): at most this share of ticks vetoed, at least
# this share NOMINAL, disagreement at most this multiple of the best trivial baseline's.
VETO_TARGET = 0.005
NOMINAL_TARGET = 0.98
RATIO_TARGET = 0.80
SMOKE_DATA = DataConfig(
    train_episodes=2,
    val_episodes=1,
    test_episodes=1,
    every=20,
    duration_s=6.0,
    scenarios=("nominal_cruise",),
    realistic_episodes=(1, 1, 1),
)
SMOKE_GATE_DURATION_S = 6.0


@dataclass(frozen=True)
class TransferConfig:
    """The recipe each left-out model is trained with (the shipped model's, less its DAgger rounds
    unless `dagger` says otherwise: each round costs about one training)."""

    size: str = "base"
    seed: int = DEFAULT_SEED
    quick: bool = False  # little simulated data and few epochs
    smoke: bool = False  # one scenario, a few short episodes, few epochs: the tests' size (figures mean nothing)
    history: bool = True
    dagger: int = 0
    log_share: float = LOG_SHARE
    max_replay_files: int | None = None  # per dataset, for a quick run; None: every drive
    only: tuple[str, ...] = ()  # hold out only these datasets (every other one still trains them); (): each in turn


@dataclass(frozen=True)
class Driving:
    """What reaches the actuators over replayed drives: ticks, and the shares NOMINAL and vetoed;
    `vetoed_by`: per check, the share of ticks it vetoed (a tick can be vetoed by several), the
    checks that vetoed none left out."""

    ticks: int
    nominal: float
    vetoed: float
    vetoed_by: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Column:
    rows: int
    agreement: float
    best_baseline: str
    best_baseline_agreement: float
    disagreement_ratio: float
    driving: Driving | None
    # the ratio's 95% block-bootstrap interval (log_eval.ratio_interval); NaN in reports written before it
    ratio_low: float = float("nan")
    ratio_high: float = float("nan")

    @classmethod
    def of(cls, report: DatasetReport, driving: Driving | None) -> Column:
        b = report.best_baseline
        low, high = report.disagreement_interval
        return cls(
            report.model_on[b].rows,
            report.model_on[b].agreement,
            b,
            report.baselines[b].agreement,
            report.disagreement_ratio,
            driving,
            low,
            high,
        )

    def ratio_text(self) -> str:
        """The ratio with its interval where known: "0.88x [0.70-1.07]"."""
        return ratio_text(self.disagreement_ratio, (self.ratio_low, self.ratio_high))

    def misses(self) -> list[str]:
        """The left-out targets this column does not meet, as phrases."""
        out = []
        if not self.disagreement_ratio <= RATIO_TARGET:
            # an interval that holds the target: more drives of this dataset could still meet it
            undecided = " (its interval holds the target)" if self.ratio_low <= RATIO_TARGET else ""
            out.append(f"disagreement {self.ratio_text()} the best baseline's > {RATIO_TARGET:.2f}x{undecided}")
        if self.driving is not None and not self.driving.vetoed <= VETO_TARGET:
            out.append(f"{100 * self.driving.vetoed:.2f}% of ticks vetoed > {100 * VETO_TARGET:.1f}%")
        if self.driving is not None and not self.driving.nominal >= NOMINAL_TARGET:
            out.append(f"{100 * self.driving.nominal:.2f}% NOMINAL < {100 * NOMINAL_TARGET:.0f}%")
        return out


@dataclass(frozen=True)
class DatasetTransfer:
    dataset: str
    sessions: int
    left_out: Column
    within: Column | None  # None: the dataset has no held-out split

    @property
    def misses(self) -> list[str]:
        return self.left_out.misses()


@dataclass
class TransferReport:
    config: TransferConfig
    shipped_model: str
    shipped_gates: tuple[str, ...]
    datasets: list[DatasetTransfer] = field(default_factory=list)

    @property
    def failed(self) -> list[str]:
        return [f"{d.dataset}: {m}" for d in self.datasets for m in d.misses]

    def to_json(self) -> str:
        return json.dumps(asdict(self) | {"failed": self.failed}, indent=1, default=float) + "\n"

    @classmethod
    def from_json(cls, text: str) -> TransferReport:
        raw = json.loads(text)

        def column(c: dict[str, Any] | None) -> Column | None:
            if c is None:
                return None
            driving = None if c["driving"] is None else Driving(**c["driving"])
            return Column(**(c | {"driving": driving}))

        datasets = [
            DatasetTransfer(d["dataset"], d["sessions"], column(d["left_out"]), column(d["within"]))  # type: ignore[arg-type]
            for d in raw["datasets"]
        ]
        config = TransferConfig(**(raw["config"] | {"only": tuple(raw["config"].get("only", ()))}))
        return cls(config, raw["shipped_model"], tuple(raw["shipped_gates"]), datasets)


def replay_driving(files: Sequence[Path], model: Path, gates: Sequence[Path]) -> Driving:
    """NOMINAL and vetoed shares of every tick of a LOCKSTEP replay of these drives, and which checks vetoed."""
    ticks = nominal = vetoed = 0
    by_check: dict[str, int] = {}
    for path in files:
        table = replay_log(path, model, gates).table
        if table is None:  # the replay keeps its table; a replay without one is a bug, not a drive
            raise RuntimeError(f"{path}: the replay returned no tick table")
        ticks += len(table)
        nominal += int((np.asarray(table.safety_state) == SafetyState.NOMINAL).sum())
        is_vetoed = np.array([Reason.OOD_VETO in reasons for reasons in table.reasons], bool)
        vetoed += int(is_vetoed.sum())
        if table.checks is not None:
            for j, kind in enumerate(table.check_kinds):
                n = int((table.checks["veto"][:, j] & is_vetoed).sum())
                if n:
                    by_check[CHECK_NAMES[kind]] = by_check.get(CHECK_NAMES[kind], 0) + n
    shares = {name: n / max(ticks, 1) for name, n in sorted(by_check.items(), key=lambda kv: -kv[1])}
    return Driving(ticks, nominal / max(ticks, 1), vetoed / max(ticks, 1), shares)


def _gate_config(config: TransferConfig, source: str, real_logs: Sequence[Path]) -> GateFitConfig:
    """The shipped gates' fit (`dualloop gate fit --real-logs`), on fewer simulated drives for a quick or
    smoke run; `real_logs`: the drives whose sites the thresholds cover."""
    real = tuple(map(str, real_logs))
    if config.smoke:
        # a few thousand held-out rows: the norm band's tail at 1e-4 needs 20,000
        return GateFitConfig(
            source=source,
            fit_seeds=FIT_SEEDS[:1],
            calibration_seeds=CALIBRATION_SEEDS[:1],
            norm_alpha=1e-3,
            scenario_params={"duration_s": SMOKE_GATE_DURATION_S},
            real_logs=real,
        )
    if config.quick:
        return GateFitConfig(
            source=source, fit_seeds=FIT_SEEDS[:2], calibration_seeds=CALIBRATION_SEEDS[:2], real_logs=real
        )
    return GateFitConfig(source=source, real_logs=real)


def fit_gates(
    model_path: Path, config: TransferConfig, stem: Path, real_logs: Sequence[Path] = ()
) -> tuple[Path, Path]:
    """The model's decision-vector and input gates, fitted on simulated driving and calibrated on the sites
    of `real_logs` as the shipped ones are (a gate is tied to the model it was fitted for), as
    <stem>.gate.npz and <stem>.inputs.gate.npz."""
    model = DecisionModel(model_path)
    out = (stem.with_name(stem.name + ".gate.npz"), stem.with_name(stem.name + ".inputs.gate.npz"))
    for source, path in zip(GATE_SOURCES, out):
        fit_gate_for_model(model, _gate_config(config, source, real_logs)).save(str(path))
    return out


def _files_by_dataset(rows: LogRows) -> dict[str, list[Path]]:
    out: dict[str, set[Path]] = {}
    for file, dataset in zip(rows.paths, rows.datasets):
        out.setdefault(dataset, set()).add(Path(file))
    return {d: sorted(f) for d, f in sorted(out.items())}


def _pick(files: list[Path], most: int | None) -> list[Path]:
    return files if most is None or len(files) <= most else files[:: max(1, len(files) // most)][:most]


def leave_one_dataset_out(
    paths: Sequence[Path],
    shipped_model: Path,
    shipped_gates: Sequence[Path],
    config: TransferConfig,
    work_dir: Path | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> TransferReport:
    """Hold out each dataset of the drives in `paths` in turn (module docstring). `shipped_gates`:
    (decision-vector gate, input gate), as models/ holds them."""
    rows = read_log_rows(paths)
    by_dataset = _files_by_dataset(rows)
    if len(by_dataset) < 2:
        raise ValueError(f"leaving one dataset out needs drives of at least two datasets; these are {list(by_dataset)}")
    unknown = sorted(set(config.only) - set(by_dataset))
    if unknown:
        raise ValueError(f"no drives of dataset {', '.join(unknown)} among these; they are of {', '.join(by_dataset)}")
    held_out = [d for d in by_dataset if not config.only or d in config.only]
    data_config = SMOKE_DATA if config.smoke else QUICK_DATA if config.quick else FULL_DATA
    if config.history:
        data_config = replace(data_config, history=DEFAULT_HISTORY)
    progress(f"simulated training data ({'smoke' if config.smoke else 'quick' if config.quick else 'full'}) ...")
    simulated = generate(data_config, config.seed)
    report = TransferReport(config, str(shipped_model), tuple(map(str, shipped_gates)))
    work = Path(work_dir or tempfile.mkdtemp(prefix="dualloop-transfer-"))
    work.mkdir(parents=True, exist_ok=True)
    dataset_of_row = rows.dataset
    labelled = rows.label >= 0
    for n, dataset in enumerate(held_out, start=1):
        files = by_dataset[dataset]
        others = [f for d, fs in by_dataset.items() if d != dataset for f in fs]
        progress(f"[{n}/{len(held_out)}] {dataset}: training on {len(others)} drives of the other datasets ...")
        model_path = work / f"without-{dataset}.onnx"
        train(
            config.size,
            config.seed,
            model_path,
            quick=config.quick or config.smoke,
            data=simulated,
            config=mlp_config(config.size, config.quick or config.smoke),
            options=TrainOptions(
                logs=others, log_share=config.log_share, dagger=config.dagger, measure_latency_in_card=False
            ),
        )
        progress(f"[{n}/{len(held_out)}] {dataset}: fitting its two gates ...")
        # the left-out dataset's drives neither train the model nor calibrate its gates
        gate_paths = fit_gates(model_path, config, work / f"without-{dataset}", real_logs=others)
        progress(f"[{n}/{len(held_out)}] {dataset}: scoring and replaying {len(files)} drives ...")
        mine = dataset_of_row == dataset
        left_report = next(r for r in evaluate(model_path, rows, on=mine & labelled) if r.dataset == dataset)
        replayed = _pick(files, config.max_replay_files)
        left_out = Column.of(left_report, replay_driving(replayed, model_path, gate_paths))
        heldout = [f for f in files if HELDOUT_FOLDER in f.parts[:-1]]
        within = None
        if heldout:
            in_heldout = np.isin(np.asarray(rows.paths)[rows.session], [str(f) for f in heldout])
            within_report = next(
                r for r in evaluate(shipped_model, rows, on=mine & labelled & in_heldout) if r.dataset == dataset
            )
            within = Column.of(
                within_report, replay_driving(_pick(heldout, config.max_replay_files), shipped_model, shipped_gates)
            )
        sessions = len(set(rows.session[mine].tolist()))
        report.datasets.append(DatasetTransfer(dataset, sessions, left_out, within))
        progress(
            f"[{n}/{len(held_out)}] {dataset}: left out {left_out.disagreement_ratio:.2f}x"
            + (f", within {within.disagreement_ratio:.2f}x" if within else "")
        )
    return report
