"""Train, calibrate and export the driving decision models (small / base / large).

    train(size, seed, out, options=TrainOptions(logs=...))  -> TrainResult       the library call

Pipeline: simulated drives (controller.training.data) and recorded drives (controller.training.
recorded: their training sessions; one in five validates) -> numpy MLP on [normalised features,
sensor profile, plan] (controller.training.mlp) -> softmax temperature on the validation split
(controller.training.calibration) -> metrics on the simulated test split and on the recorded
validation sessions beside the trivial baselines (controller.training.log_eval) -> export_mlp with
mask_input -> batch-1 forward latency of the exported file -> export again with it in the card.

Reproducibility: the same seed on the same machine gives the same weights, the same card and the
same version hash; only the two measured latency fields (wall-clock by nature, left out of the
hash) differ. With measure_latency_in_card=False the file is byte-identical.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from dualloop.controller.training.calibration import (
    expected_calibration_error,
    fit_temperature,
    nll,
    per_class_recall,
    probabilities,
)
from dualloop.controller.training.calibration_guard import (
    CalibrationGuard,
    CalibrationRefused,
    calibration_problems,
    reference_metrics,
)
from dualloop.controller.training.dagger import dagger_rows, with_dagger
from dualloop.controller.training.data import (
    DataConfig,
    Dataset,
    Normaliser,
    Split,
    add_logs,
    concat,
    deriver,
    generate,
)
from dualloop.controller.training.driving_card import driving_card
from dualloop.controller.training.log_eval import evaluate as evaluate_logs
from dualloop.controller.training.log_eval import report_metrics
from dualloop.controller.training.mlp import FitHistory, FitRows, MLPConfig, fit, forward_weights
from dualloop.controller.training.recorded import (
    LogRows,
    file_facts,
    log_paths,
    read_log_rows,
)
from dualloop.controller.training.recorded import training_splits as recorded_training_splits
from dualloop.executor.model_card import MEASURED_METRICS, ModelCard
from dualloop.executor.model_runner import DecisionModel
from dualloop.executor.onnx_export import MLPWeights, export_mlp
from dualloop.sim import schema

SIZES: dict[str, tuple[int, ...]] = {"small": (32, 32), "base": (64, 64), "large": (128, 128, 128)}
DEFAULT_SEED = 7
FULL_DATA = DataConfig()
QUICK_DATA = DataConfig(train_episodes=12, val_episodes=4, test_episodes=4, every=20, realistic_episodes=(12, 4, 4))
# The recorded drives' share of the total training weight (controller.training.data.add_logs).
LOG_SHARE = 0.35
QUICK_EPOCHS = 8
LATENCY_KEYS = MEASURED_METRICS  # measured at export; not part of the version hash


@dataclass
class TrainResult:
    path: Path
    card: ModelCard
    weights: MLPWeights
    normaliser: Normaliser
    metrics: dict[str, float | str]
    history: FitHistory
    timings_s: dict[str, float] = field(default_factory=dict)
    # the calibration guard's findings (written anyway: --force), and the default model's test ECE/NLL
    calibration_warnings: list[str] = field(default_factory=list)
    reference_calibration: dict[str, float] | str | None = None


@dataclass
class Hooks:
    """Progress callbacks; all optional so the library call stays silent."""

    on_scenario: Callable[[str], None] | None = None
    on_epoch: Callable[[int, float, float], None] | None = None
    on_stage: Callable[[str], None] | None = None


def mlp_config(size: str, quick: bool = False) -> MLPConfig:
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
    cfg = MLPConfig(hidden=SIZES[size])
    return replace(cfg, max_epochs=QUICK_EPOCHS) if quick else cfg


def evaluate(weights: MLPWeights, x: np.ndarray, split: Split, temperature: float) -> dict[str, float | str]:
    """Test-split metrics of the exported weights (the numbers a user of the file will see)."""
    logits, controls, _ = forward_weights(weights, x)
    pred = logits.argmax(axis=1)
    recall = per_class_recall(pred, split.label)
    err = np.clip(controls, [c.low for c in schema.CONTROLS], [c.high for c in schema.CONTROLS]) - split.controls
    rmse = np.sqrt(np.nanmean(err.astype(np.float64) ** 2, axis=0))
    out: dict[str, float | str] = {  # a recall is "n/a" for an action the test split lacks
        "test_accuracy": float((pred == split.label).mean()),
        "test_balanced_accuracy": float(np.nanmean(recall)),
        "test_nll_before": nll(logits, split.label),
        "test_nll_after": nll(logits, split.label, temperature),
        "test_ece_before": expected_calibration_error(probabilities(logits), split.label),
        "test_ece_after": expected_calibration_error(probabilities(logits, temperature), split.label),
        "test_majority_baseline": float(split.class_counts().max() / len(split)),
    }
    for name, r in zip(schema.ACTIONS, recall):
        out[f"test_recall_{name}"] = float(r) if np.isfinite(r) else "n/a"
    for name, r in zip(schema.CONTROL_NAMES, rmse):
        out[f"test_rmse_{name}"] = float(r)
    return out


def measure_latency(
    path: Path, features: np.ndarray, plan: np.ndarray, present: np.ndarray | None = None, n_calls: int = 3000
) -> tuple[float, float]:
    """Median and p99 (us) of DecisionModel.forward at batch 1, cycling through real test inputs
    (normalised features and plan, and the sensor profile)."""
    model = DecisionModel(path)
    n = min(len(features), 256)
    rows = [
        (
            np.ascontiguousarray(features[i : i + 1], np.float32),
            np.ascontiguousarray(plan[i : i + 1], np.float32),
            None if present is None else np.ascontiguousarray(present[i : i + 1]),
        )
        for i in range(n)
    ]
    times = np.empty(n_calls, np.int64)
    for i in range(n_calls):
        f, p, m = rows[i % len(rows)]
        t0 = time.perf_counter_ns()
        model.forward(f, p, m)
        times[i] = time.perf_counter_ns() - t0
    us = times / 1000.0
    return round(float(np.median(us)), 1), round(float(np.percentile(us, 99)), 1)


def _round_metrics(m: dict[str, float | str]) -> dict[str, float | str]:
    # Rounded: a card is read by people; 6 significant digits keep it exact enough for comparisons.
    return {k: (float(f"{v:.6g}") if isinstance(v, float) else v) for k, v in m.items()}


def _card(size: str, dv: int, norm: Normaliser, temperature: float, metrics: dict[str, float | str]) -> ModelCard:
    history = (norm.history, norm.hist_mean, norm.hist_std) if norm.history else None
    return driving_card(
        f"dualloop-{size}",
        size,
        dv,
        feature_stats=(norm.feat_mean, norm.feat_std),
        plan_stats=(norm.plan_mean, norm.plan_std),
        temperature=temperature,
        training_metrics=_round_metrics(metrics),
        mask_input=norm.mask_input,
        history=history,
    )


def with_logs(data: Dataset, rows: LogRows, facts: dict[str, str], share: float = LOG_SHARE) -> Dataset:
    """The simulated dataset with the recorded drives' training sessions in train and val (with the
    history features of DataConfig.history, from each drive's own stream)."""
    by_split: dict[str, dict[str, Split]] = dict(recorded_training_splits(rows, deriver(data.config.history)))
    return add_logs(data, by_split, share, facts)


def _sources_metrics(data: Dataset, weights: MLPWeights, x_te: np.ndarray) -> dict[str, float | str]:
    """Test accuracy of the simulated drives with a plan (sim/) and of the realistic ones."""
    logits, _, _ = forward_weights(weights, x_te)
    pred = logits.argmax(axis=1)
    out: dict[str, float | str] = {}
    for kind in ("sim", "realistic"):
        rows = data.source_rows("test", f"{kind}/")
        if rows.any():
            out[f"test_accuracy_{kind}"] = float((pred[rows] == data.test.label[rows]).mean())
    return out


@dataclass
class _Fitted:
    weights: MLPWeights
    norm: Normaliser
    temperature: float
    metrics: dict[str, float | str]
    history: FitHistory


def _fit(data: Dataset, config: MLPConfig, seed: int, hooks: Hooks) -> _Fitted:
    """Normalise, fit, calibrate on the validation split, evaluate on the test split."""
    norm = Normaliser.fit(data.train, history=data.config.history)
    x_tr, x_va, x_te = (norm.inputs(s) for s in (data.train, data.val, data.test))
    # One BLAS thread: float sums then do not depend on how many cores the machine has, and the
    # small matmuls here gain nothing from threads anyway.
    with threadpool_limits(limits=1):
        model, history = fit(
            FitRows(x_tr, data.train.label, data.train.controls, data.train.weight),
            FitRows(x_va, data.val.label, data.val.controls, data.val.weight),
            config,
            seed,
            hooks.on_epoch,
        )
        weights = model.to_weights()
        val_logits, _, _ = forward_weights(weights, x_va)
        temperature = fit_temperature(val_logits, data.val.label)
        metrics: dict[str, float | str] = evaluate(weights, x_te, data.test, temperature)
        metrics |= _sources_metrics(data, weights, x_te)
    metrics |= {
        "temperature": temperature,
        "val_nll_before": nll(val_logits, data.val.label),
        "val_nll_after": nll(val_logits, data.val.label, temperature),
    }
    return _Fitted(weights, norm, temperature, metrics, history)


@dataclass(frozen=True)
class TrainOptions:
    """What a training run adds to the simulated drives, and how it exports.

    logs: recorded drives (files or folders: their training sessions), `log_share` of the training weight.
    dagger: rounds of driving the nominal scenarios with the model, adding the expert's actions in the
    states it reached and training again (controller.training.dagger).
    guard: raise CalibrationRefused instead of writing a model worse calibrated than its uncalibrated
    logits or the default model (unless guard.force).
    measure_latency_in_card: the batch-1 forward latency goes into the card (False: byte-identical files)."""

    logs: Sequence[str | Path] = ()
    log_share: float = LOG_SHARE
    dagger: int = 0
    guard: CalibrationGuard | None = None
    measure_latency_in_card: bool = True


@dataclass
class _Data:
    """The training data and where it came from: the simulated part, the recorded drives' rows and facts."""

    data: Dataset
    sim: Dataset
    log_rows: LogRows | None = None
    facts: dict[str, str] = field(default_factory=dict)


def _with_recorded(sim: Dataset, options: TrainOptions) -> _Data:
    if not options.logs:
        return _Data(sim, sim)
    paths = log_paths(options.logs)
    log_rows = read_log_rows(paths)
    facts = file_facts(paths, log_rows)
    return _Data(with_logs(sim, log_rows, facts, options.log_share), sim, log_rows, facts)


def _dagger_rounds(
    size: str,
    seed: int,
    out: Path,
    config: MLPConfig,
    hooks: Hooks,
    options: TrainOptions,
    run: _Data,
    fitted: _Fitted,
    timings: dict[str, float],
) -> tuple[_Fitted, list[int]]:
    """Each round: the model drives, the expert labels its states, train again on everything so far.
    The last fit and, per round, the model's nominal drives that crashed or left the road."""
    failed_drives: list[int] = []
    dagger_sets = []
    for round_index in range(options.dagger):
        export_mlp(fitted.weights, _card(size, config.hidden[-1], fitted.norm, fitted.temperature, {}), out)
        if hooks.on_stage is not None:
            hooks.on_stage(f"DAgger round {round_index + 1}: driving the nominal scenarios with the model")
        t2 = time.perf_counter()
        rows, failed = dagger_rows(out, run.sim.config, seed, 0, round_index, on_scenario=hooks.on_scenario)
        dagger_sets.append(rows)
        failed_drives.append(sum(failed.values()))
        run.data = with_dagger(run.sim, concat(dagger_sets))
        if run.log_rows is not None:
            run.data = with_logs(run.data, run.log_rows, run.facts, options.log_share)
        timings["dagger_rollouts"] = timings.get("dagger_rollouts", 0.0) + time.perf_counter() - t2
        t3 = time.perf_counter()
        fitted = _fit(run.data, config, seed, hooks)
        timings["train"] += time.perf_counter() - t3
    return fitted, failed_drives


def _check_calibration(
    metrics: dict[str, float | str], data: Dataset, out: Path, guard: CalibrationGuard | None
) -> tuple[list[str], dict[str, float] | str | None]:
    """The guard's findings and the reference it compared with; raises CalibrationRefused unless forced."""
    warnings: list[str] = []
    reference: dict[str, float] | str | None = None
    if guard is not None:
        if guard.reference is not None and Path(guard.reference).is_file():
            reference = reference_metrics(Path(guard.reference), data.test)
        warnings = calibration_problems(metrics, reference, guard)
        if warnings and not guard.force:
            skipped = f"; not compared with {guard.reference}: {reference}" if isinstance(reference, str) else ""
            raise CalibrationRefused(
                f"not writing {out}: " + "; ".join(warnings) + f"{skipped} (--force writes it anyway)"
            )
    return warnings, reference


def _run_metrics(
    seed: int, config: MLPConfig, options: TrainOptions, run: _Data, history: FitHistory, failed_drives: list[int]
) -> dict[str, float | str]:
    """What the card records about the run beside the test metrics: data sizes, epochs, recipe."""
    data = run.data
    metrics: dict[str, float | str] = {
        "seed": float(seed),
        "n_train": float(len(data.train)),
        "n_val": float(len(data.val)),
        "n_test": float(len(data.test)),
        "data_every_steps": float(data.config.every),
        "epochs_run": float(history.epochs_run),
        "best_epoch": float(history.best_epoch + 1),
        "hidden": "x".join(map(str, config.hidden)),
        "trainer": "numpy float32 AdamW, weighted CE + range-scaled controls MSE",
        "realism_seed": float(data.config.realism.seed),
        "log_share": options.log_share if run.log_rows is not None else 0.0,
    }
    if options.dagger:
        drives = run.sim.config.dagger_episodes * len(run.sim.config.scenarios)
        metrics |= {
            "dagger_rounds": float(options.dagger),
            "dagger_rows": float(data.source_rows("train", "dagger/").sum()),
            # per round, the nominal drives of the model it drove with that crashed or left the road
            "dagger_failed_drives": ", ".join(f"{n} of {drives}" for n in failed_drives),
        }
    return metrics


def train(
    size: str,
    seed: int,
    out: Path,
    quick: bool = False,
    data: Dataset | None = None,
    data_config: DataConfig | None = None,
    config: MLPConfig | None = None,
    hooks: Hooks | None = None,
    options: TrainOptions | None = None,
) -> TrainResult:
    """Generate data (unless given), add the recorded drives of `options.logs` (training drives only),
    train, calibrate, evaluate and export one model to `out` (TrainOptions: DAgger, the calibration guard)."""
    hooks = hooks or Hooks()
    options = options or TrainOptions()
    out = Path(out)
    config = config or mlp_config(size, quick)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    if data is None:
        data_config = data_config or (QUICK_DATA if quick else FULL_DATA)
        data = generate(data_config, seed, hooks.on_scenario)
    run = _with_recorded(data, options)
    timings["data"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    fitted = _fit(run.data, config, seed, hooks)
    timings["train"] = time.perf_counter() - t1
    fitted, failed_drives = _dagger_rounds(size, seed, out, config, hooks, options, run, fitted, timings)
    weights, norm, temperature, metrics, history = (
        fitted.weights,
        fitted.norm,
        fitted.temperature,
        fitted.metrics,
        fitted.history,
    )
    data = run.data
    warnings, reference = _check_calibration(metrics, data, out, options.guard)
    metrics |= _run_metrics(seed, config, options, run, history, failed_drives)
    metrics |= data.logs
    card = export_mlp(weights, _card(size, config.hidden[-1], norm, temperature, metrics), out)
    if run.log_rows is not None:
        # the recorded validation sessions, beside the baselines: what tuning may look at
        val = run.log_rows.validation
        if val.any():
            metrics |= report_metrics(evaluate_logs(out, run.log_rows, on=val), "val_logs")
            card = export_mlp(weights, _card(size, config.hidden[-1], norm, temperature, metrics), out)
    if options.measure_latency_in_card:
        if hooks.on_stage is not None:
            hooks.on_stage("measuring forward latency")
        f, p = norm.apply(
            data.test.features, data.test.plan, data.test.present, data.test.history if norm.history else None
        )
        present = norm.full_present(data.test.present, len(f)) if norm.history else data.test.present
        p50, p99 = measure_latency(out, f, p, present)
        metrics |= dict(zip(LATENCY_KEYS, (p50, p99)))
        card = export_mlp(weights, _card(size, config.hidden[-1], norm, temperature, metrics), out)
    timings["total"] = time.perf_counter() - t0
    return TrainResult(out, card, weights, norm, card.training_metrics, history, timings, warnings, reference)


def model_path(size: str, out_dir: Path, quick: bool) -> Path:
    # A quick model never overwrites the shipped one.
    return Path(out_dir) / (f"{size}.quick.onnx" if quick else f"{size}.onnx")


def compare_models(a: Path, b: Path) -> list[str]:
    """What differs between two exported models, beyond the measured metrics (empty: the same model)."""
    import onnx
    from onnx import numpy_helper

    ma, mb = onnx.load(str(a)), onnx.load(str(b))
    diffs = []
    wa = {t.name: numpy_helper.to_array(t) for t in ma.graph.initializer}
    wb = {t.name: numpy_helper.to_array(t) for t in mb.graph.initializer}
    if wa.keys() != wb.keys():
        diffs.append(f"different tensors: {sorted(wa.keys() ^ wb.keys())}")
    diffs += [
        f"weights {k} differ (max |diff| {np.abs(wa[k] - wb[k]).max():.3g})"
        for k in sorted(wa.keys() & wb.keys())
        if not np.array_equal(wa[k], wb[k])
    ]
    ca = DecisionModel(a, warmup_batches=()).card
    cb = DecisionModel(b, warmup_batches=()).card
    if ca.identity_json() != cb.identity_json():
        diffs.append("model cards differ beyond the measured metrics")
    if ca.version != cb.version:
        diffs.append(f"versions differ: {ca.version} vs {cb.version}")
    return diffs
