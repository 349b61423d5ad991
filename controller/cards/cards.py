"""Write a card template from an ONNX graph, read a completed card (TOML), embed it, check it.

A model exported by another tool has the graph but not what dualloop must know about it: what the
features are called and how to normalise them, what the actions and controls are, which outputs make
the decision vector. `template` writes what the graph tells (names, widths) and marks the rest TODO;
`read_card` validates what the user filled in (pydantic, errors naming the field); `attach` stores it
under METADATA_KEY; `check_model` loads the result exactly as the server would and runs it once.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from pydantic import ValidationError

from dualloop.controller.cards import toml_text
from dualloop.controller.contract.config_files import problem_text, read_text_file
from dualloop.controller.contract.errors import ConfigError
from dualloop.executor.model_card import METADATA_KEY, ModelCard, ModelFileError
from dualloop.executor.model_runner import DecisionModel

TODO = "TODO"


class CardError(ModelFileError):
    """A card that does not fit: the message names the file and the field."""


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int | str, ...]  # a str is a symbolic (or unknown) dimension
    elem_type: int = onnx.TensorProto.FLOAT

    @property
    def width(self) -> int | None:
        """The second dimension of a [batch, width] tensor, when the graph fixes it."""
        return self.shape[1] if len(self.shape) == 2 and isinstance(self.shape[1], int) else None


def load_graph(path: Path) -> onnx.ModelProto:
    try:
        return onnx.load(str(path))
    except FileNotFoundError:
        raise ModelFileError(f"{path}: model file not found") from None
    except Exception as err:  # onnx raises protobuf's DecodeError and others for a file that is not ONNX
        raise ModelFileError(f"{path}: not a readable ONNX model ({type(err).__name__}: {err})") from None


def _shape(vi: onnx.ValueInfoProto) -> tuple[int | str, ...]:
    dims = vi.type.tensor_type.shape.dim
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in dims)


def graph_io(model: onnx.ModelProto) -> tuple[list[Tensor], list[Tensor]]:
    # older IR versions list initializers among the inputs: they are weights, not inputs to feed
    weights = {i.name for i in model.graph.initializer}
    inputs = [
        Tensor(i.name, _shape(i), i.type.tensor_type.elem_type) for i in model.graph.input if i.name not in weights
    ]
    outputs = [Tensor(o.name, _shape(o)) for o in model.graph.output]
    return inputs, outputs


def _pick(tensors: list[Tensor], hints: tuple[str, ...], taken: set[str]) -> Tensor | None:
    """The first tensor whose name contains a hint, else the first one not taken yet."""
    free = [t for t in tensors if t.name not in taken]
    for t in free:
        if any(h in t.name.lower() for h in hints):
            return t
    return free[0] if free else None


def template(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """A card as a TOML document with TODO where the graph cannot tell, and comments saying what."""
    inputs, outputs = graph_io(load_graph(path))
    taken: set[str] = set()
    feats = _pick(inputs, ("feat", "obs", "state", "input", "x"), taken)
    taken |= {feats.name} if feats else set()
    plan = _pick(inputs, ("plan", "goal", "context", "cond"), taken)
    taken = set()
    logits = _pick(outputs, ("logit", "action", "class", "score"), taken)
    taken |= {logits.name} if logits else set()
    controls = _pick(outputs, ("control", "command", "reg", "cont"), taken)
    taken |= {controls.name} if controls else set()
    dv_parts = [t for t in outputs if t.name not in taken]

    def width(t: Tensor | None, default: int) -> int:
        return t.width if t is not None and t.width else default

    n_feat, n_plan = width(feats, 1), width(plan, 1)
    n_act, n_ctl = max(width(logits, 2), 2), width(controls, 1)
    comments: dict[str, str] = {
        "name": "TODO: a short name for the model",
        "size_class": "test | small | base | large",
        "actions": f"TODO: the {n_act} action names, in the order of output {logits.name if logits else '?'}",
        "plan_default": "TODO: the plan (raw units) a session without one is given",
        "mask_input": "true when the features input is [features, presence 0/1] (twice the feature count)",
        "temperature": "softmax temperature applied to the logits (1.0: none)",
        "features": f"TODO: name, unit and training mean/std of each of the {n_feat} columns of input "
        f"{feats.name if feats else '?'} (the executor feeds (x - mean) / std)",
        "plan": f"TODO: the {n_plan} columns of input {plan.name if plan else '?'}, normalised as the features",
        "controls": "TODO: name, unit and the range [min, max] the model's controls may take",
        "safe_action": "TODO: what to apply when nothing valid is known (an action above, controls in range)",
        "decision_vector_outputs": "the outputs concatenated, in this order, into the decision vector the "
        "OOD gate watches (a pool of layers); sizes sum to decision_vector_size",
    }
    if feats is None or plan is None:
        comments["io"] = f"TODO: the graph has inputs {[t.name for t in inputs]}; dualloop feeds two, features and plan"
    for name, t in (("features", feats), ("plan", plan), ("logits", logits), ("controls", controls)):
        if t is not None and t.width is None:
            comments[f"io.{name}"] = f"TODO: {t.name} has shape {list(t.shape)}, not [batch, width]"
    doc: dict[str, Any] = {
        "name": f"{TODO}_{path.stem}",
        "size_class": "small",
        "actions": [f"{TODO}_action_{i}" for i in range(n_act)],
        "plan_default": [0.0] * n_plan,
        "mask_input": False,
        "temperature": 1.0,
        "decision_vector_size": sum(width(t, 1) for t in dv_parts) or 1,
        "io": {
            "features": feats.name if feats else TODO,
            "plan": plan.name if plan else TODO,
            "logits": logits.name if logits else TODO,
            "controls": controls.name if controls else TODO,
        },
        "safe_action": {"action": f"{TODO}_action_0", "controls": [0.0] * n_ctl},
        "features": [{"name": f"{TODO}_feature_{i}", "unit": TODO, "mean": 0.0, "std": 1.0} for i in range(n_feat)],
        "plan": [{"name": f"{TODO}_plan_{i}", "unit": TODO, "mean": 0.0, "std": 1.0} for i in range(n_plan)],
        "controls": [{"name": f"{TODO}_control_{i}", "unit": TODO, "min": -1.0, "max": 1.0} for i in range(n_ctl)],
        "decision_vector_outputs": [{"output": t.name, "size": width(t, 1)} for t in dv_parts]
        or [{"output": TODO, "size": 1}],
    }
    if not dv_parts:
        comments["decision_vector_outputs"] = "TODO: the graph has no output left for the decision vector"
    return doc, comments


def input_type_warnings(graph: onnx.ModelProto) -> list[str]:
    """Inputs the executor cannot feed: it passes float32, and onnxruntime refuses any other type
    (what `card check` reports as "the graph fails on a batch of zeros ... Unexpected input data type")."""
    out = []
    for t in graph_io(graph)[0]:
        if t.elem_type != onnx.TensorProto.FLOAT:
            kind = onnx.TensorProto.DataType.Name(t.elem_type).lower()
            out.append(
                f"input {t.name!r} is {kind}, but dualloop feeds float32: `card check` and the server will "
                f"refuse the graph; export it with float32 inputs (or a Cast node after them)"
            )
    return out


def embedded_card(graph: onnx.ModelProto, path: Path) -> ModelCard | None:
    """The card already in the model, None without one; CardError for one that does not parse (the
    user fixes it, or removes it, rather than losing it to a template of TODOs)."""
    raw = next((p.value for p in graph.metadata_props if p.key == METADATA_KEY), None)
    if raw is None:
        return None
    try:
        return ModelCard.model_validate_json(raw)
    except ValidationError as err:
        problems = "; ".join(f"{_where(tuple(e['loc']))}: {e['msg']}" for e in err.errors())
        raise CardError(f"{path}: its embedded card is invalid ({problems}); `dualloop card check {path}`") from None


def template_text(path: Path) -> tuple[str, ModelCard | None, list[str]]:
    """The card file `card init` writes, the embedded card it started from (None: the graph) and the
    warnings about the graph. A model that has a card keeps its values: re-versioning a model whose
    graph changed (or editing one field) must not mean typing the card in again."""
    graph = load_graph(path)
    warnings = input_type_warnings(graph)
    notes = "".join(f"# WARNING: {w}\n" for w in warnings)
    card = embedded_card(graph, path)
    if card is not None:
        doc = json.loads(card.to_json())
        del doc["version"]  # attach writes the version of what it embeds
        head = (
            f"# dualloop model card for {path.name}, written by `dualloop card init` from the card embedded "
            f"in it (version {card.version}).\n# Edit what changed, then: dualloop card attach {path.name} THIS.toml\n"
        )
        return head + notes + toml_text.dumps(doc), card, warnings
    doc, comments = template(path)
    head = (
        f"# dualloop model card for {path.name}, written by `dualloop card init` from the graph.\n"
        f"# Replace every TODO, then: dualloop card attach {path.name} THIS.toml\n"
    )
    return head + notes + toml_text.dumps(doc, comments), None, warnings


def _where(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(card)"


def _todos(doc: Any, loc: tuple[int | str, ...] = ()) -> list[str]:
    if isinstance(doc, str):
        return [_where(loc)] if TODO in doc else []
    if isinstance(doc, dict):
        return [w for k, v in doc.items() for w in _todos(v, (*loc, k))]
    if isinstance(doc, list):
        return [w for i, v in enumerate(doc) for w in _todos(v, (*loc, i))]
    return []


def read_card(path: Path) -> ModelCard:
    """The completed card; CardError naming the file, line or field for anything wrong or left TODO."""
    try:
        doc = tomllib.loads(read_text_file(path, "card file"))
    except ConfigError as err:  # missing or not UTF-8: named as the card's, like every card error
        raise CardError(str(err)) from None
    except tomllib.TOMLDecodeError as err:
        raise CardError(f"{path}: not valid TOML: {err}") from None
    left = _todos(doc)
    if left:
        more = f" and {len(left) - 12} more" if len(left) > 12 else ""
        raise CardError(f"{path}: {len(left)} fields still TODO: {', '.join(left[:12])}{more}")
    try:
        return ModelCard.model_validate(doc)
    except ValidationError as err:
        problems = "; ".join(f"{_where(tuple(e['loc']))}: {problem_text({**e, 'loc': ()})}" for e in err.errors())
        raise CardError(f"{path}: {problems}") from None


def _version(model: onnx.ModelProto, card: ModelCard) -> str:
    # as the exporter's: the graph (without any card) and the card's identity
    bare = onnx.ModelProto()
    bare.CopyFrom(model)
    kept = [p for p in bare.metadata_props if p.key != METADATA_KEY]
    del bare.metadata_props[:]
    bare.metadata_props.extend(kept)
    digest = hashlib.sha256(bare.SerializeToString(deterministic=True))
    digest.update(card.identity_json().encode())
    return digest.hexdigest()[:12]


def with_card(model: onnx.ModelProto, card: ModelCard) -> tuple[onnx.ModelProto, ModelCard]:
    card = card.model_copy(update={"version": _version(model, card)})
    out = onnx.ModelProto()
    out.CopyFrom(model)
    kept = [p for p in out.metadata_props if p.key != METADATA_KEY]
    del out.metadata_props[:]
    out.metadata_props.extend(kept)
    entry = out.metadata_props.add()
    entry.key, entry.value = METADATA_KEY, card.to_json()
    return out, card


def check_model(path: Path, label: str | None = None) -> DecisionModel:
    """Load as the server does (card against graph) and run a batch; errors name `label` (default: path)."""
    label = label or str(path)
    try:
        model = DecisionModel(path, warmup_batches=())
        for n in (1, 3):  # a graph that loads may still fail to run (types, fixed batch sizes)
            out = model.forward(np.zeros((n, model.n_inputs), np.float32), np.zeros((n, model.n_plan), np.float32))
            dv = out.decision_vector
            want = (n, model.card.decision_vector_size)
            if dv.shape != want or not np.isfinite(dv).all():
                raise ModelFileError(f"{path}: decision vector of shape {dv.shape} (want {want}) or not finite")
    except ModelFileError as err:
        raise CardError(str(err).replace(str(path), label)) from None
    except Exception as err:  # onnxruntime's own errors when the graph runs
        raise CardError(f"{label}: the graph fails on a batch of zeros ({type(err).__name__}: {err})") from None
    return model


def attach(model_path: Path, card_path: Path, out: Path) -> ModelCard:
    """Embed the card from card_path; writes `out` only after the result loads and runs."""
    card = read_card(card_path)
    graph = load_graph(model_path)
    combined, card = with_card(graph, card)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Written beside `out` and renamed over it: `out` is often the model itself (attach without
    # --out), which a crash or a full disk mid-write must not leave half-written, and a reader (a
    # server loading it) sees the old file or the new one, never a mix.
    fd, name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    trial = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(combined.SerializeToString(deterministic=True))
        check_model(trial, f"{model_path} with {card_path}")
        os.chmod(trial, _mode_for(out))
        os.replace(trial, out)
    finally:
        trial.unlink(missing_ok=True)
    return card


def _mode_for(out: Path) -> int:
    """The mode `out` has (or a new file would get): mkstemp's 0600 must not replace it."""
    try:
        return out.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def check(model_path: Path, card_path: Path | None) -> ModelCard:
    """The embedded card (card_path None) or the one in card_path, against the graph."""
    if card_path is None:
        return check_model(model_path).card
    with tempfile.TemporaryDirectory() as tmp:
        trial = Path(tmp) / "model.onnx"
        combined, card = with_card(load_graph(model_path), read_card(card_path))
        trial.write_bytes(combined.SerializeToString(deterministic=True))
        check_model(trial, f"{model_path} with {card_path}")
    return card
