"""The per-class INT8 check of `dualloop qualify --int8`: the INT8 variant against the candidate
it was quantised from, on the candidate's own test episodes, with the same comparison (and the same
data) as `dualloop quantize` prints (controller.training.quantize.compare)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Final

from dualloop.controller.contract.errors import ConfigError
from dualloop.controller.qualify.checks import Check, at_most
from dualloop.controller.qualify.criteria import Int8Criteria
from dualloop.controller.training.data import DataConfig, Normaliser, generate
from dualloop.controller.training.quantize import QUANT_DATA, compare
from dualloop.executor.model_runner import DecisionModel

STEP: Final = "int8"


def check_int8_source(fp32: DecisionModel, int8: DecisionModel) -> None:
    """ConfigError unless `int8` was quantised from `fp32` (qualify checks it before any step runs)."""
    source = str(int8.card.training_metrics.get("quantized_from", ""))
    if source != fp32.card.version:
        raise ConfigError(
            f"--int8 {int8.path}: quantised from model version {source or '(not recorded)'}, not from the "
            f"candidate {fp32.path} (version {fp32.card.version}); quantise it with `dualloop quantize`"
        )


def run_int8_step(
    fp32: DecisionModel, int8: DecisionModel, flag_drop: float, data_config: DataConfig = QUANT_DATA
) -> dict[str, Any]:
    """compare()'s report of the INT8 variant; ConfigError when it was not quantised from `fp32`."""
    check_int8_source(fp32, int8)
    seed = int(float(fp32.card.training_metrics.get("seed", 0)))
    data = generate(replace(data_config, history=tuple(fp32.card.history_names)), seed)
    norm = Normaliser.from_card(fp32.card)
    present = data.test.present
    f, p = norm.apply(data.test.features, data.test.plan, present, data.test.history if norm.history else None)
    if norm.history:
        present = norm.full_present(present, len(f))
    return compare(fp32, int8, f, p, data.test.label, flag_drop=flag_drop, present=present)


def int8_checks(report: dict[str, Any], c: Int8Criteria) -> list[Check]:
    return [
        at_most(
            STEP, f"INT8 recall drop on {r['action']} ({r['support']} samples)", r["recall_drop"], c.max_recall_drop
        )
        for r in report["per_class"]
        if r["support"] > 0
    ]
