"""The wire contract: committed stubs match the .proto, and the executor's enums match the wire's."""

from __future__ import annotations

import importlib.util

import pytest

from dualloop.executor.snapshot import Check, CheckStatus, Clock, Reason, SafetyState
from dualloop.v2 import controller_pb2 as pb
from tests.paths import REPO_ROOT

ROOT = REPO_ROOT
GEN = ROOT / "proto" / "dualloop" / "v2"


@pytest.mark.skipif(importlib.util.find_spec("grpc_tools") is None, reason="grpcio-tools (dev extra) not installed")
def test_committed_stubs_match_proto(tmp_path):
    spec = importlib.util.spec_from_file_location("gen_proto", ROOT / "scripts" / "gen_proto.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    gen.generate(tmp_path)
    for name in ("controller_pb2.py", "controller_pb2.pyi", "controller_pb2_grpc.py"):
        fresh = (tmp_path / "dualloop" / "v2" / name).read_text()
        assert fresh == (GEN / name).read_text(), f"{name} drifted from controller.proto: run `make proto`"


@pytest.mark.parametrize(
    "ours, wire, prefix",
    [
        (Reason, pb.ReasonCode, "REASON_CODE_"),
        (SafetyState, pb.SafetyState, "SAFETY_STATE_"),
        (Clock, pb.ClockMode, "CLOCK_MODE_"),
    ],
)
def test_enums_match_wire(ours, wire, prefix):
    for member in ours:
        assert wire.Value(prefix + member.name) == member.value, member
    assert len(wire.keys()) == len(ours) + 1  # + the UNSPECIFIED zero value


@pytest.mark.parametrize(
    "ours, wire, prefix", [(Check, pb.Check, "CHECK_"), (CheckStatus, pb.CheckStatus, "CHECK_STATUS_")]
)
def test_check_enums_match_wire(ours, wire, prefix):
    for member in ours:
        assert wire.Value(prefix + member.name) == member.value, member
    assert len(wire.keys()) == len(ours) + 1  # + the UNSPECIFIED zero value


def test_wire_has_only_typed_fields():
    """No opaque payloads (bytes, Any) that could smuggle a pickle or other language-specific blob."""
    from google.protobuf.descriptor import FieldDescriptor

    seen = 0
    for message in pb.DESCRIPTOR.message_types_by_name.values():
        for field in message.fields:
            seen += 1
            assert field.type != FieldDescriptor.TYPE_BYTES, f"{message.name}.{field.name} is bytes"
            if field.message_type is not None:
                assert field.message_type.full_name.startswith("dualloop.v2."), f"{message.name}.{field.name}"
    assert seen > 40 and pb.DESCRIPTOR.package == "dualloop.v2"


def test_plan_state_matches_wire():
    from dualloop.executor.snapshot import PlanState

    for member in PlanState:
        assert pb.PlanState.Value(f"PLAN_STATE_{member.name}") == member.value, member
    assert len(pb.PlanState.keys()) == len(PlanState) + 1  # + PLAN_STATE_UNSPECIFIED
