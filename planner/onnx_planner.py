"""A learned planner as an ONNX file, and the builder that exports one.

The file carries a JSON card under the metadata key `dualloop.planner_card`:

    {"format_version": 1, "name": "...", "size_class": "large", "version": "<hash>",
     "features": [FEATURE_NAMES...],           # input order, raw units (normalisation is in the graph)
     "behaviours": [BEHAVIOURS...],            # order of the logits
     "lane_width": 3.5, "max_speed": 40.0, "valid_for_s": 1.0,
     "io": {"features": "features", "behaviour_logits": "behaviour_logits",
            "target_speed": "target_speed"},
     "training": {...}}

Graph: features (batch, 19) float32 -> behaviour_logits (batch, 4), target_speed (batch, 1) in m/s.
The planner picks the most likely behaviour among those physically possible (no change into a lane
that does not exist), derives the lane offset from it, and clips the speed to [0, max_speed]
(0 for "stop"). Needs `onnx` only to build files; running needs only onnxruntime.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from dualloop.planner.plan import Plan, PlanRequest, make_plan_id
from dualloop.sim.schema import BEHAVIOURS, FEATURE_INDEX, FEATURE_NAMES, N_FEATURES

METADATA_KEY = "dualloop.planner_card"
FORMAT_VERSION = 1
DEFAULT_IO: dict[str, str] = {
    "features": "features",
    "behaviour_logits": "behaviour_logits",
    "target_speed": "target_speed",
}
_LEFT, _RIGHT = BEHAVIOURS.index("change_left"), BEHAVIOURS.index("change_right")
_STOP = BEHAVIOURS.index("stop")
_LANE_SIGN = np.array([{"change_left": 1.0, "change_right": -1.0}.get(b, 0.0) for b in BEHAVIOURS])


class PlannerFileError(ValueError):
    """An ONNX planner file that cannot be used; the message names the file and the problem."""


def parse_planner_card(raw: str | None, path: str) -> dict[str, Any]:
    if raw is None:
        raise PlannerFileError(
            f"{path}: no '{METADATA_KEY}' entry in the ONNX metadata; a planner model must "
            f"declare its feature order and outputs there (build it with "
            f"planner.onnx_planner.export_planner_mlp)"
        )
    try:
        card = json.loads(raw)
    except json.JSONDecodeError as err:
        raise PlannerFileError(f"{path}: '{METADATA_KEY}' is not valid JSON: {err}") from None
    if not isinstance(card, dict):
        raise PlannerFileError(f"{path}: '{METADATA_KEY}' must be a JSON object")
    problems = []
    if card.get("format_version") != FORMAT_VERSION:
        problems.append(f"format_version is {card.get('format_version')!r}, expected {FORMAT_VERSION}")
    if list(card.get("features", [])) != list(FEATURE_NAMES):
        problems.append(f"features {card.get('features')!r} do not match sim.schema.FEATURES {list(FEATURE_NAMES)}")
    if list(card.get("behaviours", [])) != list(BEHAVIOURS):
        problems.append(f"behaviours {card.get('behaviours')!r} do not match sim.schema.BEHAVIOURS {list(BEHAVIOURS)}")
    for key in ("lane_width", "max_speed", "valid_for_s"):
        value = card.get(key)
        if not isinstance(value, (int, float)) or not np.isfinite(value) or value <= 0:
            problems.append(f"{key} must be a positive number, got {value!r}")
    if card.get("size_class") not in ("test", "small", "base", "large"):
        problems.append(f"size_class {card.get('size_class')!r} is not one of test/small/base/large")
    if problems:
        raise PlannerFileError(f"{path}: invalid '{METADATA_KEY}': " + "; ".join(problems))
    card["io"] = {**DEFAULT_IO, **card.get("io", {})}
    return card


def _session_options() -> ort.SessionOptions:
    opts = ort.SessionOptions()
    # One thread and no spinning: planning shares a 2-core machine with the 5 ms executor.
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    opts.log_severity_level = 3
    return opts


class OnnxPlanner:
    """PlanSource running a learned planner (see the module docstring for the file contract)."""

    def __init__(self, path: str | Path, name: str | None = None) -> None:
        self.path = str(path)
        if not Path(path).is_file():
            raise PlannerFileError(f"{path}: planner model file not found")
        try:
            self._session = ort.InferenceSession(self.path, _session_options(), providers=["CPUExecutionProvider"])
        except Exception as err:  # onnxruntime has its own exception types
            raise PlannerFileError(f"{path}: onnxruntime cannot load it: {err}") from None
        self.card = parse_planner_card(self._session.get_modelmeta().custom_metadata_map.get(METADATA_KEY), self.path)
        io = self.card["io"]
        self._check_graph(io)
        self._input = io["features"]
        self._outputs = [io["behaviour_logits"], io["target_speed"]]
        self.name = name or f"onnx:{self.card['name']}@{self.card.get('version', '')}"
        self._valid_for_ns = int(self.card["valid_for_s"] * 1e9)
        self._x = np.zeros((1, N_FEATURES), dtype=np.float32)
        for _ in range(3):  # first runs allocate: keep that out of the first plan
            self._session.run(self._outputs, {self._input: self._x})

    def _check_graph(self, io: dict[str, str]) -> None:
        have_in = {i.name: i.shape for i in self._session.get_inputs()}
        have_out = {o.name: o.shape for o in self._session.get_outputs()}
        want = (
            ("input", have_in, io["features"], N_FEATURES),
            ("output", have_out, io["behaviour_logits"], len(BEHAVIOURS)),
            ("output", have_out, io["target_speed"], 1),
        )
        for kind, have, name, width in want:
            if name not in have:
                raise PlannerFileError(f"{self.path}: the card names {kind} {name!r} but the graph has {sorted(have)}")
            if len(have[name]) != 2 or have[name][1] != width:
                raise PlannerFileError(
                    f"{self.path}: {kind} {name!r} has shape {have[name]}, expected [batch, {width}]"
                )

    def infer(self, features: npt.NDArray[np.float32]) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """Raw outputs for a batch (n, 19): logits (n, 4), target speed (n, 1)."""
        logits, speed = self._session.run(self._outputs, {self._input: np.ascontiguousarray(features, np.float32)})
        return logits, speed

    def plan(self, request: PlanRequest) -> Plan:
        x = request.features
        if not np.all(np.isfinite(x)):
            raise ValueError("features contain NaN or Inf")
        self._x[0] = x
        logits, speed = self.infer(self._x)
        scores = logits[0].astype(np.float64)
        if not np.all(np.isfinite(scores)) or not np.isfinite(speed[0, 0]):
            raise ValueError(f"{self.path}: the model produced non-finite outputs")
        # The model may be wrong; it may not change into a lane that is not there.
        if x[FEATURE_INDEX["left_lane_exists"]] < 0.5:
            scores[_LEFT] = -np.inf
        if x[FEATURE_INDEX["right_lane_exists"]] < 0.5:
            scores[_RIGHT] = -np.inf
        behaviour = int(np.argmax(scores))
        target = 0.0 if behaviour == _STOP else float(np.clip(speed[0, 0], 0.0, self.card["max_speed"]))
        return Plan(
            plan_id=make_plan_id(self.name, request.session_id, request.now_ns),
            session_id=request.session_id,
            created_ns=request.now_ns,
            valid_for_ns=self._valid_for_ns,
            source=self.name,
            behaviour=BEHAVIOURS[behaviour],
            target_speed=target,
            target_lane_offset=float(_LANE_SIGN[behaviour] * self.card["lane_width"]),
        )


# ---- building planner files ------------------------------------------------------------------
@dataclass(frozen=True)
class PlannerWeights:
    feature_mean: npt.NDArray[np.float32]  # (19,)
    feature_std: npt.NDArray[np.float32]  # (19,)
    hidden: list[tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]]  # (W (in, out), b (out,))
    logits: tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]
    speed: tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]  # pre-sigmoid, times max_speed


# Rough scales of the raw features, so random and freshly trained weights see unit-sized inputs.
_DEFAULT_STD = np.array(
    [
        10.0
        if n in ("ego_speed",) or n.endswith("rel_speed")
        else 50.0
        if n.endswith("_gap") or n == "lead_distance"
        else 0.01
        if n == "road_curvature"
        else 1.0
        for n in FEATURE_NAMES
    ],
    dtype=np.float32,
)


def random_planner_weights(hidden: tuple[int, ...] = (256, 256, 256), seed: int = 0) -> PlannerWeights:
    """He-initialised weights from a fixed seed: a valid (untrained) planner for tests, no download."""
    rng = np.random.default_rng(seed)
    layers, width = [], N_FEATURES
    for h in hidden:
        layers.append((rng.normal(0, np.sqrt(2.0 / width), (width, h)).astype(np.float32), np.zeros(h, np.float32)))
        width = h

    def head(n: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        return rng.normal(0, np.sqrt(1.0 / width), (width, n)).astype(np.float32), np.zeros(n, np.float32)

    return PlannerWeights(np.zeros(N_FEATURES, np.float32), _DEFAULT_STD.copy(), layers, head(len(BEHAVIOURS)), head(1))


def export_planner_mlp(
    path: str | Path,
    weights: PlannerWeights | None = None,
    *,
    name: str = "mlp-planner",
    size_class: str = "large",
    max_speed: float = 40.0,
    lane_width: float = 3.5,
    valid_for_s: float = 1.0,
    training: dict[str, float | str] | None = None,
) -> dict[str, Any]:
    """Write a planner ONNX file (normalise -> [Gemm, Relu]* -> logits / sigmoid speed); returns its card."""
    import onnx
    from onnx import helper

    model = _planner_graph(weights or random_planner_weights(), name, max_speed)
    onnx.checker.check_model(model)
    card: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "name": name,
        "size_class": size_class,
        "version": "",
        "features": list(FEATURE_NAMES),
        "behaviours": list(BEHAVIOURS),
        "lane_width": lane_width,
        "max_speed": max_speed,
        "valid_for_s": valid_for_s,
        "io": dict(DEFAULT_IO),
        "training": training or {},
    }
    digest = hashlib.sha256(model.SerializeToString(deterministic=True))
    digest.update(json.dumps(card, sort_keys=True).encode())
    card["version"] = digest.hexdigest()[:12]
    helper.set_model_props(model, {METADATA_KEY: json.dumps(card, sort_keys=True)})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString(deterministic=True))
    return card


def _planner_graph(w: PlannerWeights, name: str, max_speed: float) -> Any:
    """The planner's ONNX model (normalise -> [Gemm, Relu]* -> logits / sigmoid speed) of weights `w`."""
    from onnx import TensorProto, helper, numpy_helper

    io = DEFAULT_IO
    inits = [
        numpy_helper.from_array(w.feature_mean.astype(np.float32), "mean"),
        numpy_helper.from_array((1.0 / w.feature_std).astype(np.float32), "inv_std"),
        numpy_helper.from_array(np.array([max_speed], np.float32), "max_speed"),
    ]
    nodes = [
        helper.make_node("Sub", [io["features"], "mean"], ["centred"]),
        helper.make_node("Mul", ["centred", "inv_std"], ["h_in"]),
    ]
    prev = "h_in"
    for i, (wi, bi) in enumerate(w.hidden):
        inits += [numpy_helper.from_array(wi, f"W{i}"), numpy_helper.from_array(bi, f"b{i}")]
        nodes += [
            helper.make_node("Gemm", [prev, f"W{i}", f"b{i}"], [f"z{i}"]),
            helper.make_node("Relu", [f"z{i}"], [f"h{i}"]),
        ]
        prev = f"h{i}"
    inits += [
        numpy_helper.from_array(w.logits[0], "W_logits"),
        numpy_helper.from_array(w.logits[1], "b_logits"),
        numpy_helper.from_array(w.speed[0], "W_speed"),
        numpy_helper.from_array(w.speed[1], "b_speed"),
    ]
    nodes += [
        helper.make_node("Gemm", [prev, "W_logits", "b_logits"], [io["behaviour_logits"]]),
        helper.make_node("Gemm", [prev, "W_speed", "b_speed"], ["speed_raw"]),
        helper.make_node("Sigmoid", ["speed_raw"], ["speed_unit"]),
        # Sigmoid times max_speed: the output is in range by construction.
        helper.make_node("Mul", ["speed_unit", "max_speed"], [io["target_speed"]]),
    ]
    graph = helper.make_graph(
        nodes,
        name,
        inputs=[helper.make_tensor_value_info(io["features"], TensorProto.FLOAT, ["batch", N_FEATURES])],
        outputs=[
            helper.make_tensor_value_info(io["behaviour_logits"], TensorProto.FLOAT, ["batch", len(BEHAVIOURS)]),
            helper.make_tensor_value_info(io["target_speed"], TensorProto.FLOAT, ["batch", 1]),
        ],
        initializer=inits,
    )
    model = helper.make_model(graph, producer_name="dualloop", opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model
