"""The metadata contract every decision model carries inside its ONNX file.

The JSON below is stored in the ONNX `metadata_props` under METADATA_KEY. Without it the executor
cannot know what the features mean, how to normalise them, what the actions are called or which
output is the decision vector, so a model without it is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Annotated, Final, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

METADATA_KEY = "dualloop.model_card"
FORMAT_VERSION: Final = 1
# Training metrics that are measurements of this machine at export time, not properties of the
# model: stored in the card, left out of the version hash so a retrain reproduces the version.
MEASURED_METRICS = ("forward_b1_p50_us", "forward_b1_p99_us")
# A number the executor computes with: a finite int or float, never a string pydantic would parse
# ("25" in a TOML card is a typo or a quoting slip) and never inf/nan (a card's JSON cannot hold them).
Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]


class FeatureSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    unit: str
    mean: Number = 0.0
    std: Number = Field(1.0, gt=0.0)


class ControlSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    unit: str
    min: Number
    max: Number

    @model_validator(mode="after")
    def _range(self) -> ControlSpec:
        if not self.min < self.max:
            raise ValueError(f"control {self.name!r}: min {self.min} must be below max {self.max}")
        return self


class SafeAction(BaseModel):
    """What to apply when a session has nothing valid to hold (first tick invalid, for example)."""

    model_config = ConfigDict(extra="forbid")
    action: str
    controls: list[Number]


class IONames(BaseModel):
    model_config = ConfigDict(extra="forbid")
    features: str = "features"
    plan: str = "plan"
    logits: str = "logits"
    controls: str = "controls"
    decision_vector: str = "decision_vector"


class DecisionVectorPart(BaseModel):
    """One graph output that makes up part of the decision vector (a layer of a pool, for example)."""

    model_config = ConfigDict(extra="forbid")
    output: str
    size: int = Field(gt=0)


class ModelCard(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format_version: Literal[1] = FORMAT_VERSION
    name: str
    size_class: Literal["test", "small", "base", "large"]
    version: str = ""  # content hash, filled in by the exporter
    features: list[FeatureSpec] = Field(min_length=1)
    plan: list[FeatureSpec] = Field(min_length=1)
    plan_default: list[Number]
    # Plan fields of plan_default raised to a feature of the session's newest observation while it has
    # no valid plan (plan field -> feature), where that feature is measured (executor.default_plan).
    plan_default_at_least: dict[str, str] = {}
    actions: list[str] = Field(min_length=2)
    controls: list[ControlSpec] = Field(min_length=1)
    safe_action: SafeAction
    io: IONames = IONames()
    decision_vector_size: int = Field(gt=0)
    # The decision vector as several graph outputs, concatenated in this order (their sizes summing to
    # decision_vector_size); empty: the one output io.decision_vector.
    decision_vector_outputs: list[DecisionVectorPart] = []
    # The model was trained with missing features masked: its features input is the normalised
    # features followed by the sensor profile as 0/1 (width 2n). Without it a missing feature is
    # still fed as its training mean, the best a model that never met masks can be given.
    mask_input: bool = False
    # Features the executor derives from the session's own recent observations (executor.history),
    # fed after the wire features (and, with mask_input, their masks after the wire features' masks);
    # mean/std normalise them as the wire features'. Empty: the model sees one observation.
    history_features: list[FeatureSpec] = []
    # Softmax temperature fitted on held-out data; 1.0 means uncalibrated.
    temperature: Number = Field(1.0, gt=0.0)
    training_metrics: dict[str, float | str] = {}

    @model_validator(mode="after")
    def _consistent(self) -> ModelCard:
        if len(self.plan_default) != len(self.plan):
            raise ValueError(f"plan_default has {len(self.plan_default)} values for {len(self.plan)} plan fields")
        plan_names, feature_names = [p.name for p in self.plan], [f.name for f in self.features]
        for plan_field, feature in self.plan_default_at_least.items():
            if plan_field not in plan_names or feature not in feature_names:
                raise ValueError(
                    f"plan_default_at_least {plan_field!r} -> {feature!r}: the plan fields are {plan_names}, "
                    f"the features {feature_names}"
                )
        if self.safe_action.action not in self.actions:
            raise ValueError(f"safe_action.action {self.safe_action.action!r} is not one of {self.actions}")
        if len(self.safe_action.controls) != len(self.controls):
            raise ValueError(
                f"safe_action.controls has {len(self.safe_action.controls)} values for {len(self.controls)} controls"
            )
        for value, spec in zip(self.safe_action.controls, self.controls):
            if not spec.min <= value <= spec.max:
                raise ValueError(f"safe_action control {spec.name}={value} is outside [{spec.min}, {spec.max}]")
        if self.decision_vector_outputs:
            total = sum(p.size for p in self.decision_vector_outputs)
            if total != self.decision_vector_size:
                raise ValueError(
                    f"decision_vector_outputs sizes sum to {total}, decision_vector_size is {self.decision_vector_size}"
                )
        for kind, names in (
            ("decision vector output", [p.output for p in self.decision_vector_outputs]),
            ("feature", [f.name for f in self.features] + [h.name for h in self.history_features]),
            ("plan", [p.name for p in self.plan]),
            ("action", self.actions),
            ("control", [c.name for c in self.controls]),
        ):
            if len(set(names)) != len(names):
                raise ValueError(f"duplicate {kind} names in {names}")
        return self

    @property
    def feature_names(self) -> list[str]:
        return [f.name for f in self.features]

    def schema_hash(self) -> str:
        """Hash of what a client must agree on to send valid observations (not the weights)."""
        schema = {
            "features": [(f.name, f.unit) for f in self.features],
            "plan": [(p.name, p.unit) for p in self.plan],
            "actions": self.actions,
            "controls": [(c.name, c.unit) for c in self.controls],
        }
        return hashlib.sha256(json.dumps(schema, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def history_names(self) -> list[str]:
        return [h.name for h in self.history_features]

    @property
    def input_width(self) -> int:
        """Width of the graph's features input: wire and history features (and their masks)."""
        return (len(self.features) + len(self.history_features)) * (2 if self.mask_input else 1)

    @property
    def decision_vector_parts(self) -> list[DecisionVectorPart]:
        """The graph outputs that make up the decision vector, in order (one for most models)."""
        return self.decision_vector_outputs or [
            DecisionVectorPart(output=self.io.decision_vector, size=self.decision_vector_size)
        ]

    def to_json(self) -> str:
        # the fields below are written only when set: cards (and version hashes) of earlier models
        # stay as they were
        optional = (
            ("plan_default_at_least", self.plan_default_at_least),
            ("mask_input", self.mask_input),
            ("history_features", self.history_features),
            ("decision_vector_outputs", self.decision_vector_outputs),
        )
        exclude = {k for k, on in optional if not on}
        return self.model_dump_json(exclude=exclude or None)

    def identity_json(self) -> str:
        """The card as the version hash sees it: without the version and the measured metrics."""
        metrics = {k: v for k, v in self.training_metrics.items() if k not in MEASURED_METRICS}
        return self.model_copy(update={"version": "", "training_metrics": metrics}).to_json()


@dataclass(frozen=True)
class Normalisation:
    """(x - mean) * float32(1 / std), exactly as every user of a model's inputs must apply it."""

    mean: np.ndarray
    inv_std: np.ndarray
    plan_mean: np.ndarray
    plan_inv_std: np.ndarray

    @classmethod
    def of(cls, card: ModelCard) -> Normalisation:
        def f32(values: list[float]) -> np.ndarray:
            return np.array(values, np.float32)

        specs = card.features + card.history_features  # history features follow the wire features
        return cls(
            f32([f.mean for f in specs]),
            f32([1.0 / f.std for f in specs]),
            f32([p.mean for p in card.plan]),
            f32([1.0 / p.std for p in card.plan]),
        )

    def apply(
        self,
        x: np.ndarray,
        p: np.ndarray,
        xn: np.ndarray | None = None,
        pn: np.ndarray | None = None,
        present: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(features, plan, finite rows); non-finite feature rows become 0 so the model never sees NaN.
        `present` (rows, n) bool, None = all: a missing feature is whatever the client sent (NaN by
        contract), does not make its row non-finite, and is fed as the training mean (0).
        Writes into xn/pn when given (the tick's preallocated buffers)."""
        # a finite input far outside float32's range after scaling overflows to inf: the model's
        # output then is not finite, which the tick reports (MODEL_ERROR), not a warning on stderr
        with np.errstate(over="ignore"):
            xn = np.subtract(x, self.mean, out=xn)
            xn *= self.inv_std
            pn = np.subtract(p, self.plan_mean, out=pn)
            pn *= self.plan_inv_std
        if present is None:
            finite = np.isfinite(x).all(axis=1)
        else:
            finite = (np.isfinite(x) | ~present).all(axis=1)
            np.copyto(xn, 0.0, where=~present)
        if not finite.all():
            xn[~finite] = 0.0
        return xn, pn, finite


class ModelFileError(ValueError):
    """A model file that the executor cannot serve; the message names the file and the problem."""


def unreadable(path: object, err: OSError) -> str:
    """Why a file the process may not read cannot be read, and the fix: in a container the server runs
    as another user than the file's owner (onnxruntime said only "system error number 13")."""
    return (
        f"cannot read it ({err.strerror}); this process runs as uid {os.geteuid()}: make it readable (chmod a+r {path})"
    )


def parse_card(raw: str | None, path: str) -> ModelCard:
    if raw is None:
        raise ModelFileError(
            f"{path}: no '{METADATA_KEY}' entry in the ONNX metadata. dualloop needs the feature schema, "
            f"action schema and decision-vector output declared there: for a model from another tool, "
            f"`dualloop card init {path}`, fill in the TODOs, then `dualloop card attach {path} CARD.toml`."
        )
    try:
        return ModelCard.model_validate_json(raw)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(card)'}: {e['msg']}" for e in err.errors())
        raise ModelFileError(f"{path}: invalid '{METADATA_KEY}' metadata: {problems}") from None
