"""What status a client gets when a request is refused: requests that do not parse, strings past their
limit, calls that abort (logged with the status the client gets), and the one table from the
executor's error classes to gRPC status codes (STATUS_OF_ERROR). A candidate that cannot be loaded
is a CandidateError that carries its status itself (candidate.py: it depends on the file, not the class)."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable

import grpc
from google.protobuf.message import DecodeError, Message

from dualloop.controller.serve import events
from dualloop.executor.candidate import SwapRefused
from dualloop.executor.sessions import (
    InvalidObservation,
    SessionAlreadyOpen,
    SessionNotOpen,
    SessionRequestInvalid,
    TooManySessions,
)


class MalformedRequest:
    """What a request that does not parse as its message type arrives as (instead of an exception,
    which grpc.aio would turn into UNKNOWN with a Python class name): handlers answer INVALID_ARGUMENT."""

    __slots__ = ("message",)

    def __init__(self, type_name: str, size: int, error: str) -> None:
        self.message = (
            f"the request ({size} bytes) is not a valid {type_name} message: {error}; build requests with "
            f"code generated from proto/dualloop/v2/controller.proto"
        )


def lenient(message_type: type[Message]) -> Callable[[bytes], Message | MalformedRequest]:
    """A request deserializer that answers a MalformedRequest instead of raising."""
    name = message_type.DESCRIPTOR.full_name

    def parse(data: bytes) -> Message | MalformedRequest:
        try:
            return message_type.FromString(data)
        except DecodeError as err:
            return MalformedRequest(name, len(data), str(err))

    return parse


# The service name clients generated from proto v1 call. v2 renamed the service, enum values and
# response messages without changing a field number, so v1's messages are v2's on the wire; only


def release_aborted(err: grpc.aio.AbortError) -> None:
    """Let an aborted call's memory go when the call ends, not at the next full garbage collection.

    grpc.aio keeps the abort's exception on the call's state, and its traceback keeps the handler's
    frames, which keep the context (so the call's state: a cycle) and the request. Only the cyclic
    collector frees such a cycle, and garbage that lived through a young collection waits for an old
    one: refused 1 MiB requests piled up to ~600 MB before it came. Clearing the finished frames'
    locals (and the caller deleting its own) leaves the exception nothing that leads back to the call."""
    traceback.clear_frames(err.__traceback__)


def logged(method: str, handler: Callable) -> Callable:
    """A unary handler whose errors are logged (rpc.error) with the status and message the client gets."""

    async def logged(request: object, context: grpc.aio.ServicerContext) -> object:
        try:
            return await handler(request, context)
        except grpc.aio.AbortError as err:
            code = context.code()
            events.event(
                "rpc.error",
                logging.WARNING,
                method=method,
                peer=context.peer(),
                code=code.name if code is not None else "UNKNOWN",
                message=context.details() or "",
            )
            release_aborted(err)
            del request, context
            raise

    return logged


async def refuse_malformed(request: object, context: grpc.aio.ServicerContext) -> None:
    if isinstance(request, MalformedRequest):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)


async def refuse_too_long(refusal: str | None, context: grpc.aio.ServicerContext) -> None:
    """A client string past its limit (client_strings.py): INVALID_ARGUMENT naming the field."""
    if refusal is not None:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, refusal)


# The status a client gets for each error the executor raises on its behalf, looked up along the
# error's classes (a subclass takes its parent's status unless it is listed itself).
STATUS_OF_ERROR: dict[type[Exception], grpc.StatusCode] = {
    SessionAlreadyOpen: grpc.StatusCode.ALREADY_EXISTS,
    SessionRequestInvalid: grpc.StatusCode.INVALID_ARGUMENT,
    TooManySessions: grpc.StatusCode.RESOURCE_EXHAUSTED,
    SessionNotOpen: grpc.StatusCode.NOT_FOUND,
    InvalidObservation: grpc.StatusCode.INVALID_ARGUMENT,
    SwapRefused: grpc.StatusCode.FAILED_PRECONDITION,
}


def status_of(err: Exception) -> grpc.StatusCode:
    """err's status from STATUS_OF_ERROR; INTERNAL for a class nobody classified (a server bug)."""
    for cls in type(err).__mro__:
        code = STATUS_OF_ERROR.get(cls)
        if code is not None:
            return code
    return grpc.StatusCode.INTERNAL
