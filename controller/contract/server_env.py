"""The environment a server reads besides its flags (DUALLOOP_* settings, the tokens variable), and the
environment of a private server a dualloop command starts for its own client."""

from __future__ import annotations

import os

TOKENS_ENV = "DUALLOOP_TOKENS"


def private_server_env() -> dict[str, str]:
    """The environment for a private loopback server a dualloop command starts for its own client
    (demo, stream): configured by that command's flags alone, not by the operator's DUALLOOP_*
    settings (its client sends no token, and e.g. DUALLOOP_GATES must not change a demo)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("DUALLOOP_") and k != TOKENS_ENV}
