"""Each error the executor raises for a client maps to its gRPC status through status.STATUS_OF_ERROR:
the real errors of a real executor, and the statuses a client gets from a real server."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from dualloop.controller.contract.client import DriveSession
from dualloop.controller.serve.status import STATUS_OF_ERROR, status_of
from dualloop.executor.candidate import SwapRefused
from dualloop.executor.config import ExecutorConfig
from dualloop.executor.core import Executor
from dualloop.executor.sessions import (
    InvalidObservation,
    SessionAlreadyOpen,
    SessionError,
    SessionNotOpen,
    SessionRequestInvalid,
    TooManySessions,
)
from dualloop.executor.snapshot import Observation
from dualloop.v2 import controller_pb2 as pb


def _raised(fn, *args, **kwargs) -> Exception:
    with pytest.raises((SessionError, InvalidObservation, SwapRefused)) as info:
        fn(*args, **kwargs)
    return info.value


def test_each_refusal_of_a_real_executor_has_its_status(test_model) -> None:
    ex = Executor(test_model, ExecutorConfig(max_sessions=1))
    ex.open_session("a")
    cases = [
        (_raised(ex.open_session, "a"), SessionAlreadyOpen, grpc.StatusCode.ALREADY_EXISTS),
        (_raised(ex.open_session, "b"), TooManySessions, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (_raised(ex.open_session, ""), SessionRequestInvalid, grpc.StatusCode.INVALID_ARGUMENT),
        (
            _raised(ex.open_session, "c", observation_period_ns=-1),
            SessionRequestInvalid,
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            _raised(ex.open_session, "d", provided_features=["no_such"]),
            SessionRequestInvalid,
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (_raised(ex.session, "e"), SessionNotOpen, grpc.StatusCode.NOT_FOUND),
        (
            _raised(ex.submit, "a", Observation(1, 0, np.zeros(3, np.float32))),
            InvalidObservation,
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (_raised(ex.promote), SwapRefused, grpc.StatusCode.FAILED_PRECONDITION),
    ]
    for err, cls, code in cases:
        assert type(err) is cls, err
        assert status_of(err) == code, (err, status_of(err))


def test_an_error_class_outside_the_table_is_internal() -> None:
    class Unlisted(Exception):
        pass

    assert Unlisted not in STATUS_OF_ERROR
    assert status_of(Unlisted("x")) == grpc.StatusCode.INTERNAL
    # a subclass of a listed class takes its parent's status
    assert status_of(type("Narrower", (SessionAlreadyOpen,), {})("x")) == grpc.StatusCode.ALREADY_EXISTS


def _open_code(channel, **open_args) -> tuple[grpc.StatusCode | None, str]:
    try:
        DriveSession(channel, **open_args).close()
    except grpc.RpcError as err:
        return err.code(), err.details() or ""
    return None, ""


def test_a_client_gets_the_status_of_each_refused_opening(channel) -> None:
    held = DriveSession(channel, "taken", pb.CLOCK_MODE_LOCKSTEP)
    try:
        code, details = _open_code(channel, session_id="taken", clock=pb.CLOCK_MODE_LOCKSTEP)
        assert code == grpc.StatusCode.ALREADY_EXISTS and "already open" in details, (code, details)
    finally:
        held.close()
    code, details = _open_code(channel, session_id="f", provided_features=["no_such"])
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "no_such" in details, (code, details)
    code, details = _open_code(channel, session_id="p", observation_period_ns=10**15)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "observation_period_ns" in details, (code, details)
