"""Loading a candidate model for a running server (LoadCandidate, `serve --candidate`).

The files are read and the model warmed up off the event loop (seconds at most); the checks that
decide whether it may run beside the live model are `executor.candidate`'s. What goes wrong is a
CandidateError with the gRPC status a caller gets: INVALID_ARGUMENT for a file that cannot be read
as a model or gate (or whose card's version is not its content's hash), FAILED_PRECONDITION for one
that does not fit the live model, its sessions or the tick's budget for models (its measured cost).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import grpc

from dualloop import ood
from dualloop.controller.contract.gate_files import load_gate_for_model, read_gate
from dualloop.executor.candidate import Candidate, SwapRefused
from dualloop.executor.config import ExecutorConfig
from dualloop.executor.core import Executor
from dualloop.executor.gating import GateMismatch
from dualloop.executor.model_card import ModelFileError
from dualloop.executor.model_cost import OverBudget, check_candidate
from dualloop.executor.model_runner import DecisionModel, check_card_version
from dualloop.executor.model_version import UnreadableModel, content_version
from dualloop.v2 import controller_pb2 as pb


class CandidateError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def check_version(live: DecisionModel, candidate: DecisionModel) -> None:
    """CandidateError unless the candidate's card version is its content's hash, and a candidate
    with the live model's version is the live model's graph: a version is what identifies it
    (PromoteCandidate's expected_version, the shadow tally, every snapshot)."""
    card = candidate.card
    try:  # DecisionModel checked it when it loaded; the file may have been replaced since
        content = check_card_version(candidate.path, card)
    except ModelFileError as err:
        raise CandidateError(grpc.StatusCode.INVALID_ARGUMENT, f"candidate model {err}") from None
    if card.version == live.card.version:
        try:
            live_content = content_version(live.path, live.card)
        except (UnreadableModel, OSError) as err:
            live_content = f"unknown ({err})"
        if live_content != content:
            raise CandidateError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"candidate model {candidate.path} has the live model's version {card.version} but another graph "
                f"(the live model {live.path} hashes to {live_content}): the live model's card does not match its "
                f"graph, so the two could not be told apart",
            )


def load_candidate(executor: Executor, model_path: Path | str, gate_paths: Sequence[Path | str]) -> Candidate:
    """A checked candidate for `executor` (not installed); CandidateError says why not."""
    if not str(model_path):
        raise CandidateError(grpc.StatusCode.INVALID_ARGUMENT, "LoadCandidateRequest.model_path is empty")
    cap = executor.config.max_sessions
    try:
        model = DecisionModel(model_path, warmup_batches=tuple(b for b in (1, 2, 4, 8, 16, 32, 64) if b <= cap))
    except (ModelFileError, OSError) as err:
        raise CandidateError(grpc.StatusCode.INVALID_ARGUMENT, f"candidate model: {err}") from None
    check_version(executor.model, model)
    try:
        check_candidate(executor.model, model, executor.config)
    except OverBudget as err:
        raise CandidateError(grpc.StatusCode.FAILED_PRECONDITION, str(err)) from None
    gates = []
    for path in gate_paths:
        try:  # a file that cannot be read as a gate (missing, damaged, edited) is the caller's argument
            read_gate(Path(path))
        except (OSError, ood.GateFileError) as err:
            raise CandidateError(grpc.StatusCode.INVALID_ARGUMENT, f"candidate gate {path}: {err}") from None
        try:  # a readable gate fitted on another model does not fit this candidate (docs/contract.md)
            gates.append(load_gate_for_model(Path(path), model))
        except OSError as err:
            raise CandidateError(grpc.StatusCode.INVALID_ARGUMENT, f"candidate gate {path}: {err}") from None
        except ood.GateFileError as err:  # names the file; a gate fitted on another model is said so
            raise CandidateError(grpc.StatusCode.FAILED_PRECONDITION, f"candidate gate: {err}") from None
    try:
        return executor.prepare_candidate(model, gates, [str(p) for p in gate_paths])
    except (SwapRefused, GateMismatch) as err:
        raise CandidateError(grpc.StatusCode.FAILED_PRECONDITION, str(err)) from None


def candidate_status(candidate: Candidate, config: ExecutorConfig) -> pb.CandidateStatus:
    """GetStatsResponse.candidate, LoadCandidateResponse.candidate."""
    cost = candidate.model.forward_cost
    return pb.CandidateStatus(
        version=candidate.version,
        paused=candidate.paused,
        forward_median_us=cost.median_ns / 1e3 if cost is not None else 0.0,
        measured_batch=cost.batch if cost is not None else 0,
        model_budget_us=config.model_budget_ns / 1e3,
    )
