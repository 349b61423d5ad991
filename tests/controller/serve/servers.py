"""Servers the serve tests start: real, on loopback."""

from __future__ import annotations

from dualloop.controller.serve.config import ServerConfig
from dualloop.controller.serve.lifecycle import ServerThread
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES


def shipped(**config: object) -> ServerThread:
    """A server with the shipped model and its two gates (and any other settings)."""
    return ServerThread(ServerConfig(model=BASE_MODEL_PATH, gates=list(DEFAULT_GATES), port=0, **config))  # type: ignore[arg-type]
