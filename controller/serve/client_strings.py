"""Length limits of the strings a client sends, checked where each request is first read.

Every snapshot repeats the session id and the plan id, the recorder keeps them per record, the
shadow statistics per closed session, the log per event: an unbounded id multiplies into every one
of them (a 1 MiB id made 200 MiB/s of snapshots to one client). So each client string has a limit
in UTF-8 bytes, the same on every server (proto comments, docs/contract.md#client-strings;
SessionOpened.limits reports the two a client chooses). Past it the request is refused with
INVALID_ARGUMENT naming the field, its length and the limit, never echoing the string itself.
"""

from __future__ import annotations

from collections.abc import Sequence

from dualloop.v2 import controller_pb2 as pb

MAX_ID_BYTES = 128  # session ids, plan ids, session instances, versions and hashes a client names
MAX_NAME_BYTES = 128  # a feature name (OpenSession.provided_features)
MAX_NAMES = 1024  # entries in OpenSession.provided_features
MAX_PATH_BYTES = 4096  # a file path on the server (LoadCandidate; Linux's PATH_MAX)
MAX_PATHS = 64  # LoadCandidateRequest.gate_paths


def too_long(field: str, value: str, limit: int) -> str | None:
    """The refusal of `value` as `field` when it exceeds `limit` UTF-8 bytes; None when it fits."""
    if len(value) <= limit // 4:  # at most 4 bytes a character: fits without encoding it
        return None
    size = len(value.encode("utf-8", "surrogatepass"))
    if size <= limit:
        return None
    return f"{field} is {size} bytes long; the limit is {limit} bytes (UTF-8)"


def _first(*refusals: str | None) -> str | None:
    return next((r for r in refusals if r is not None), None)


def _each(field: str, values: Sequence[str], limit: int, max_count: int) -> str | None:
    if len(values) > max_count:
        return f"{field} has {len(values)} entries; the limit is {max_count}"
    return _first(*(too_long(f"{field}[{i}]", v, limit) for i, v in enumerate(values)))


def open_session_refusal(req: pb.OpenSession) -> str | None:
    return _first(
        too_long("OpenSession.session_id", req.session_id, MAX_ID_BYTES),
        too_long("OpenSession.expected_schema_hash", req.expected_schema_hash, MAX_ID_BYTES),
        _each("OpenSession.provided_features", req.provided_features, MAX_NAME_BYTES, MAX_NAMES),
    )


def observation_refusal(obs: pb.Observation) -> str | None:
    """Per observation: only the plan carries a string (HasField first: reading an unset plan is no cheaper)."""
    if not obs.HasField("plan"):
        return None
    refusal = too_long("Observation.plan.plan_id", obs.plan.plan_id, MAX_ID_BYTES)
    return None if refusal is None else f"observation seq {obs.seq}: {refusal}"


def shadow_stats_refusal(req: pb.GetShadowStatsRequest) -> str | None:
    return _first(
        too_long("GetShadowStatsRequest.session_id", req.session_id, MAX_ID_BYTES),
        too_long("GetShadowStatsRequest.session_instance", req.session_instance, MAX_ID_BYTES),
    )


def load_candidate_refusal(req: pb.LoadCandidateRequest) -> str | None:
    return _first(
        too_long("LoadCandidateRequest.model_path", req.model_path, MAX_PATH_BYTES),
        _each("LoadCandidateRequest.gate_paths", req.gate_paths, MAX_PATH_BYTES, MAX_PATHS),
    )


def promote_refusal(req: pb.PromoteCandidateRequest) -> str | None:
    return too_long("PromoteCandidateRequest.expected_version", req.expected_version, MAX_ID_BYTES)
