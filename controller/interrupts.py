"""SIGTERM as the Ctrl-C it stands for: one exception class, which the command line raises and the
commands that report how far they got (a fleet replay) recognise by type."""

from __future__ import annotations


class Terminated(KeyboardInterrupt):
    """SIGTERM (timeout, a CI cancel, kill) as the Ctrl-C it stands for: raised in the main thread,
    so every `with` and `finally` on the way out runs (a server child stopped, its folder removed)."""
