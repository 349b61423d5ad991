"""Fixtures the serve tests share: a real server with the shipped model and its two gates."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from dualloop.controller.serve.lifecycle import ServerThread
from tests.controller.serve.servers import shipped


@pytest.fixture(scope="module")
def shipped_server() -> Iterator[ServerThread]:
    with shipped() as srv:
        yield srv


@pytest.fixture()
def shipped_channel(shipped_server: ServerThread) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(shipped_server.address) as ch:
        yield ch
