"""Loading a candidate model for a running server (LoadCandidate, `serve --candidate`).

The files are read and the model warmed up off the event loop (seconds at most); the checks that
decide whether it may run beside the live model are `executor.candidate`'s. What goes wrong is a
CandidateError with the gRPC status a caller gets: INVALID_ARGUMENT for a file that cannot be read
as a model or gate, FAILED_PRECONDITION for one that does not fit the live model or its sessions.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import grpc

from dualloop import ood
from dualloop.controller.serve.gate_files import load_gate_for_model
from dualloop.executor.candidate import Candidate, SwapRefused
from dualloop.executor.core import Executor
from dualloop.executor.gating import GateMismatch
from dualloop.executor.model_card import ModelFileError
from dualloop.executor.model_runner import DecisionModel


class CandidateError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def load_candidate(executor: Executor, model_path: Path | str, gate_paths: Sequence[Path | str]) -> Candidate:
    """A checked candidate for `executor` (not installed); CandidateError says why not."""
    if not str(model_path):
        raise CandidateError(grpc.StatusCode.INVALID_ARGUMENT, "LoadCandidateRequest.model_path is empty")
    cap = executor.config.max_sessions
    try:
        model = DecisionModel(model_path, warmup_batches=tuple(b for b in (1, 2, 4, 8, 16, 32, 64) if b <= cap))
    except (ModelFileError, OSError) as err:
        raise CandidateError(grpc.StatusCode.INVALID_ARGUMENT, f"candidate model: {err}") from None
    gates = []
    for path in gate_paths:
        try:
            gates.append(load_gate_for_model(Path(path), model))
        except OSError as err:
            raise CandidateError(grpc.StatusCode.INVALID_ARGUMENT, f"candidate gate {path}: {err}") from None
        except ood.GateFileError as err:  # names the file; a gate fitted on another model is said so
            raise CandidateError(grpc.StatusCode.FAILED_PRECONDITION, f"candidate gate: {err}") from None
    try:
        return executor.prepare_candidate(model, gates, [str(p) for p in gate_paths])
    except (SwapRefused, GateMismatch) as err:
        raise CandidateError(grpc.StatusCode.FAILED_PRECONDITION, str(err)) from None
