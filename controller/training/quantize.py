"""INT8 variant of a trained decision model, and what quantisation costs per action class.

    quantize(fp32_path, out_path, seed, ...)  -> QuantResult   the library call
    quantize_main(fp32_path, out_path, seed)  -> dict          the CLI call: prints the report

Static quantisation (onnxruntime.quantization.quantize_static): uint8 activations, int8 per-channel
weights, ranges calibrated on normalised validation inputs from the model's own data seed. Total
accuracy hides what matters here: a rare class (brake_hard) can lose recall while the common `keep`
class keeps the total flat, so the report is per class and flags any recall drop above a threshold.
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static

from dualloop.controller.training.calibration import confusion, per_class_recall
from dualloop.controller.training.data import DataConfig, Dataset, Normaliser, generate
from dualloop.controller.training.trainer import measure_latency
from dualloop.executor.model_card import METADATA_KEY, ModelCard
from dualloop.executor.model_runner import DecisionModel
from dualloop.executor.onnx_export import write_atomically
from dualloop.sim import schema

# Calibration and test data for quantisation: the first episodes of the model's validation and test
# seed ranges (controller.training.data.split_seeds), so these test samples are a subset of the model's own test
# split and never seen in training.
QUANT_DATA = DataConfig(train_episodes=1, val_episodes=8, test_episodes=32, every=10, realistic_episodes=(0, 4, 16))
CALIBRATION_SAMPLES = 4096
RECALL_DROP_FLAG = 0.02  # flag a class losing more than 2 points of recall


class _Reader(CalibrationDataReader):
    """Feeds normalised (features, plan) batches; onnxruntime records activation ranges from them."""

    def __init__(self, features: np.ndarray, plan: np.ndarray, card: ModelCard, batch: int = 256) -> None:
        """features: the graph's features input (with the mask for a mask_input model)."""
        self._batches = [
            {card.io.features: features[i : i + batch], card.io.plan: plan[i : i + batch]}
            for i in range(0, len(features), batch)
        ]
        self._it = iter(self._batches)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)

    def rewind(self) -> None:
        self._it = iter(self._batches)


@dataclass
class QuantResult:
    path: Path
    card: ModelCard
    report: dict[str, Any]


def _calibration_inputs(data: Dataset, norm: Normaliser, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = min(CALIBRATION_SAMPLES, len(data.val))
    idx = np.sort(rng.choice(len(data.val), size=n, replace=False))
    history = data.val.history[idx] if norm.history else None
    return norm.graph_inputs(data.val.features[idx], data.val.plan[idx], data.val.present[idx], history)


def _int8_card(fp32: ModelCard, model: onnx.ModelProto, quant_format: QuantFormat) -> ModelCard:
    """Same schema and calibration as the FP32 card; new version hash because the graph changed."""
    metrics = dict(fp32.training_metrics)
    # The FP32 latency does not describe this file; quantize() measures the INT8 one.
    for k in ("forward_b1_p50_us", "forward_b1_p99_us"):
        metrics.pop(k, None)
    metrics |= {
        "quantization": f"int8 static {quant_format.name}, u8 activations, s8 per-channel weights",
        "quantized_from": fp32.version,
    }
    card = fp32.model_copy(update={"version": "", "training_metrics": metrics})
    del model.metadata_props[:]
    digest = hashlib.sha256(model.SerializeToString(deterministic=True))
    digest.update(card.to_json().encode())
    return card.model_copy(update={"version": digest.hexdigest()[:12]})


def _write(model: onnx.ModelProto, card: ModelCard, path: Path) -> None:
    del model.metadata_props[:]
    onnx.helper.set_model_props(model, {METADATA_KEY: card.to_json()})
    write_atomically(path, model.SerializeToString(deterministic=True))  # never half a model in place


def quantize_file(
    fp32_path: Path, out_path: Path, calib: tuple[np.ndarray, np.ndarray], quant_format: QuantFormat = QuantFormat.QDQ
) -> ModelCard:
    """Quantise and write `out_path` with the dualloop card (quantize_static drops metadata_props)."""
    fp32 = DecisionModel(fp32_path, warmup_batches=()).card
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "q.onnx"
        quantize_static(
            str(fp32_path),
            str(raw),
            _Reader(*calib, fp32),
            quant_format=quant_format,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
        )
        model = onnx.load(str(raw))
    card = _int8_card(fp32, model, quant_format)
    _write(model, card, out_path)
    return card


def compare(
    fp32: DecisionModel,
    int8: DecisionModel,
    features: np.ndarray,
    plan: np.ndarray,
    labels: np.ndarray,
    flag_drop: float = RECALL_DROP_FLAG,
    present: np.ndarray | None = None,
) -> dict[str, Any]:
    """Per-class FP32 vs INT8 recall, agreement and the FP32-vs-INT8 confusion matrix (normalised
    features and plan, the sensor profile)."""
    a, b = fp32.forward(features, plan, present), int8.forward(features, plan, present)
    pa, pb = a.logits.argmax(axis=1), b.logits.argmax(axis=1)
    ra, rb = per_class_recall(pa, labels), per_class_recall(pb, labels)
    cm = confusion(pa, pb)
    rows = []
    for c, name in enumerate(schema.ACTIONS):
        n_fp32 = int(cm[c].sum())
        drop = float(ra[c] - rb[c]) if np.isfinite(ra[c]) else float("nan")
        rows.append(
            {
                "action": name,
                "support": int((labels == c).sum()),
                "fp32_recall": float(ra[c]),
                "int8_recall": float(rb[c]),
                "recall_drop": drop,
                "agreement": float(cm[c, c] / n_fp32) if n_fp32 else float("nan"),
                "flagged": bool(np.isfinite(drop) and drop > flag_drop),
            }
        )
    return {
        "n_test": int(len(labels)),
        "fp32_accuracy": float((pa == labels).mean()),
        "int8_accuracy": float((pb == labels).mean()),
        "agreement": float((pa == pb).mean()),
        "controls_max_abs_diff": [float(v) for v in np.abs(a.controls - b.controls).max(axis=0)],
        "decision_vector_max_abs_diff": float(np.abs(a.decision_vector - b.decision_vector).max()),
        "per_class": rows,
        "confusion_fp32_rows_int8_cols": cm.tolist(),
        "flagged": [r["action"] for r in rows if r["flagged"]],
        "flag_threshold": flag_drop,
    }


def quantize(
    fp32_path: Path,
    out_path: Path,
    seed: int | None = None,
    data: Dataset | None = None,
    quant_format: QuantFormat = QuantFormat.QDQ,
    latency_calls: int = 3000,
) -> QuantResult:
    """Quantise, then compare against FP32 on test episodes and time both at batch 1.

    `seed` defaults to the seed recorded in the FP32 card, so calibration and test data come from the
    model's own validation and test seed ranges."""
    fp32 = DecisionModel(fp32_path)
    if seed is None:
        seed = int(float(fp32.card.training_metrics.get("seed", 0)))
    # a model with history features gets them in its calibration and test rows too
    data = data if data is not None else generate(replace(QUANT_DATA, history=tuple(fp32.card.history_names)), seed)
    norm = Normaliser.from_card(fp32.card)
    card = quantize_file(fp32_path, out_path, _calibration_inputs(data, norm, seed), quant_format)
    int8 = DecisionModel(out_path)
    present = data.test.present
    f, p = norm.apply(data.test.features, data.test.plan, present, data.test.history if norm.history else None)
    if norm.history:
        present = norm.full_present(present, len(f))
    report = compare(fp32, int8, f, p, data.test.label, present=present)
    report["latency_us"] = {
        "fp32_p50_p99": measure_latency(Path(fp32_path), f, p, present, latency_calls),
        "int8_p50_p99": measure_latency(Path(out_path), f, p, present, latency_calls),
    }
    report |= {
        "fp32_path": str(fp32_path),
        "int8_path": str(out_path),
        "int8_version": card.version,
        "format": quant_format.name,
        "seed": seed,
    }
    return QuantResult(Path(out_path), card, report)


def print_report(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    pct = lambda v: "n/a" if not np.isfinite(v) else f"{100 * v:.1f} %"  # noqa: E731
    t = Table(title=f"INT8 ({report['format']}) vs FP32 on {report['n_test']} test samples")
    for col in ("action", "support", "FP32 recall", "INT8 recall", "drop (pts)", "agreement", ""):
        t.add_column(col, justify="right")
    for r in report["per_class"]:
        drop = "n/a" if not np.isfinite(r["recall_drop"]) else f"{100 * r['recall_drop']:+.1f}"
        t.add_row(
            r["action"],
            str(r["support"]),
            pct(r["fp32_recall"]),
            pct(r["int8_recall"]),
            drop,
            pct(r["agreement"]),
            "[red]FLAG[/]" if r["flagged"] else "",
        )
    console.print(t)
    cm = Table(title="predictions: FP32 (rows) vs INT8 (columns)")
    cm.add_column("")
    for a in schema.ACTIONS:
        cm.add_column(a, justify="right")
    for a, row in zip(schema.ACTIONS, report["confusion_fp32_rows_int8_cols"]):
        cm.add_row(a, *map(str, row))
    console.print(cm)
    lat = report["latency_us"]
    console.print(
        f"accuracy FP32 {pct(report['fp32_accuracy'])}, INT8 {pct(report['int8_accuracy'])}, "
        f"agreement {pct(report['agreement'])}; controls max |diff| "
        f"{report['controls_max_abs_diff']}; forward batch 1 p50/p99: FP32 "
        f"{lat['fp32_p50_p99'][0]}/{lat['fp32_p50_p99'][1]} us, INT8 "
        f"{lat['int8_p50_p99'][0]}/{lat['int8_p50_p99'][1]} us"
    )
    if report["flagged"]:
        console.print(
            f"[red]recall drops by more than {100 * report['flag_threshold']:.0f} points for: "
            f"{', '.join(report['flagged'])}[/]"
        )
    else:
        console.print(f"no class loses more than {100 * report['flag_threshold']:.0f} points of recall")


def quantize_main(
    fp32_path: Path, out_path: Path, seed: int | None = None, quant_format: str = "QDQ"
) -> dict[str, Any]:
    """CLI entry: quantise, print the per-class report, return it as a dict."""
    result = quantize(Path(fp32_path), Path(out_path), seed, quant_format=QuantFormat[quant_format])
    print_report(result.report)
    return result.report
