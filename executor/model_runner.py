"""The decision model on onnxruntime: load, check against its card, warm up, run one batch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from dualloop.executor.history import HistoryDeriver, HistoryError
from dualloop.executor.model_card import METADATA_KEY, ModelCard, ModelFileError, parse_card, unreadable
from dualloop.executor.model_version import UnreadableModel, content_version


@dataclass(slots=True)
class ModelOutputs:
    logits: np.ndarray  # (n, actions)
    controls: np.ndarray  # (n, controls)
    decision_vector: np.ndarray  # (n, decision_vector_size)


@dataclass(frozen=True, slots=True)
class ForwardCost:
    """A model's forward pass measured on this machine (executor/model_cost.py)."""

    batch: int
    passes: int
    median_ns: int
    max_ns: int

    def text(self) -> str:
        return (
            f"{self.median_ns / 1e3:.0f} us median, {self.max_ns / 1e3:.0f} us slowest, over {self.passes} "
            f"forward passes at batch {self.batch}"
        )


def _session_options() -> ort.SessionOptions:
    opts = ort.SessionOptions()
    # One thread, no spinning: the default pool gave millisecond outliers on a 2-core VM and the
    # spinning workers steal the core the event loop needs.
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    opts.log_severity_level = 3
    return opts


def check_card_version(path: str | Path, card: ModelCard) -> str:
    """The file's content hash; ModelFileError unless it is the card's version. A version names a
    model everywhere (snapshots, gates fitted on it, PromoteCandidate, the shadow tally), so a graph
    changed under an old card must not serve under that name, nor with that model's gates."""
    try:
        content = content_version(path, card)
    except (UnreadableModel, OSError) as err:
        raise ModelFileError(f"{path}: cannot hash its graph to check its card's version ({err})") from None
    if content != card.version:
        raise ModelFileError(
            f"{path}: its card says version {card.version!r} but its graph and card hash to {content}: the graph "
            f"or card was changed after the version was written. Re-version it with `dualloop card attach` "
            f"(`dualloop card init {path}` drafts the card from the embedded one) and refit its gates, which are "
            f"bound to the version, or export the model again"
        )
    return content


class DecisionModel:
    """One onnxruntime session; `forward` runs a whole batch of sessions in one call."""

    def __init__(self, path: str | Path, warmup_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)) -> None:
        self.path = str(path)
        if not Path(path).is_file():
            raise ModelFileError(f"{path}: model file not found")
        try:  # onnxruntime says only "system error number 13" of a file it may not read
            open(self.path, "rb").close()
        except PermissionError as err:
            raise ModelFileError(f"{path}: {unreadable(path, err)}") from None
        try:
            self._session = ort.InferenceSession(self.path, _session_options(), providers=["CPUExecutionProvider"])
        except Exception as err:  # onnxruntime raises its own exception types
            raise ModelFileError(f"{path}: onnxruntime cannot load it: {err}") from None
        try:  # onnxruntime decodes metadata and graph names as UTF-8 only when asked for them
            meta = self._session.get_modelmeta().custom_metadata_map
            self.card: ModelCard = parse_card(meta.get(METADATA_KEY), self.path)
            self._check_graph()
        except UnicodeDecodeError as err:
            raise ModelFileError(f"{path}: its metadata or graph names are not UTF-8 text ({err})") from None
        check_card_version(self.path, self.card)  # after the card and graph checks: theirs say more
        try:  # what the executor derives from a session's stream for this model (None: nothing)
            self.history = (
                HistoryDeriver(self.card.history_names, self.card.feature_names) if self.card.history_features else None
            )
        except HistoryError as err:
            raise ModelFileError(f"{path}: {err}") from None
        io = self.card.io
        self._inputs = (io.features, io.plan)
        self._outputs = [io.logits, io.controls] + [p.output for p in self.card.decision_vector_parts]
        self.n_features = len(self.card.features)  # on the wire
        self.n_history = len(self.card.history_features)  # derived by the executor (executor.history)
        self.n_inputs = self.n_features + self.n_history
        self.n_plan = len(self.card.plan)
        self._all_present: np.ndarray = np.ones((0, self.n_inputs), np.float32)
        self.forward_cost: ForwardCost | None = None  # measured when loaded to serve (model_cost)
        for n in warmup_batches:  # first calls allocate and pick kernels: keep that out of the first tick
            for _ in range(3):
                self.forward(np.zeros((n, self.n_inputs), np.float32), np.zeros((n, self.n_plan), np.float32))

    def _check_graph(self) -> None:
        card, io = self.card, self.card.io
        inputs = {i.name: i.shape for i in self._session.get_inputs()}
        outputs = {o.name: o.shape for o in self._session.get_outputs()}
        expected_in = {io.features: card.input_width, io.plan: len(card.plan)}
        expected_out = {io.logits: len(card.actions), io.controls: len(card.controls)}
        for part in card.decision_vector_parts:
            if part.output in expected_out:
                raise ModelFileError(f"{self.path}: the card uses output {part.output!r} twice")
            expected_out[part.output] = part.size
        for kind, have, want in (("input", inputs, expected_in), ("output", outputs, expected_out)):
            for name, width in want.items():
                if name not in have:
                    raise ModelFileError(
                        f"{self.path}: the card names {kind} {name!r} but the graph has {sorted(have)}"
                    )
                shape = have[name]
                if len(shape) != 2 or shape[1] != width:
                    raise ModelFileError(
                        f"{self.path}: {kind} {name!r} has shape {shape}; the card implies [batch, {width}]"
                    )

    def forward(self, features: np.ndarray, plan: np.ndarray, present: np.ndarray | None = None) -> ModelOutputs:
        """Normalised features and plan (n, .) float32, the features being the wire features and then
        the history features (n_inputs wide); `present` (n, n_inputs) bool, None = all.
        A model with mask_input gets [features, present as 0/1]; any other ignores `present`
        (Normalisation.apply has already put missing features at their mean)."""
        if self.card.mask_input:
            features = np.concatenate([features, self._mask(len(features), present)], axis=1)
        logits, controls, *parts = self._session.run(self._outputs, {self._inputs[0]: features, self._inputs[1]: plan})
        # one part (every model dualloop exports): the output itself, no copy
        dv = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
        return ModelOutputs(logits=logits, controls=controls, decision_vector=dv)

    def _mask(self, n: int, present: np.ndarray | None) -> np.ndarray:
        if present is not None:
            return present.astype(np.float32)
        if len(self._all_present) < n:
            self._all_present = np.ones((max(n, 2 * len(self._all_present)), self.n_inputs), np.float32)
        return self._all_present[:n]
