from __future__ import annotations

from collections.abc import Iterator

import pytest

from dualloop.controller.serve.config import ServerConfig
from dualloop.controller.serve.lifecycle import ServerThread
from dualloop.executor.model_runner import DecisionModel
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES


@pytest.fixture(scope="module")
def shipped_server(base_model: DecisionModel) -> Iterator[ServerThread]:
    """A real server on loopback with the shipped model and gates, as a client in the field meets it."""
    config = ServerConfig(model=BASE_MODEL_PATH, gates=list(DEFAULT_GATES), port=0)
    with ServerThread(config, base_model) as srv:
        yield srv
