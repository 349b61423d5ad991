"""The terminal every command prints to, and how a command reports an error a person can act on.

rich is an optional extra (the demo's, training's, the benches'); the lean server install prints through
a plain stand-in with the same print/print_json, its markup stripped.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

# rich markup tags: [red], [/], [bold yellow], [/red]; not "[1, 2]", "[::1]:50151" or an escaped "\\[demo]"
_MARKUP = re.compile(r"(?<!\\)(\[/?[a-z][a-z ]*\]|\[/\])")
# what rich.markup.escape escapes: a "[" that would open a tag
_TAG_LIKE = re.compile(r"(\[[a-z#/@][^[]*?\])")


class PlainConsole:
    """What the serving commands use of rich's Console, as plain text on stdout (stderr: on stderr)."""

    def __init__(self, stderr: bool = False) -> None:
        self.stderr = stderr

    def print(self, *objects: object, sep: str = " ", end: str = "\n", markup: bool = True, **_style: Any) -> None:
        text = sep.join(str(o) for o in objects)
        if markup:
            text = _MARKUP.sub("", text).replace("\\[", "[")
        print(text, end=end, flush=True, file=sys.stderr if self.stderr else sys.stdout)

    def print_json(self, text: str) -> None:
        print(json.dumps(json.loads(text), indent=2), flush=True)


try:
    from rich.console import Console

    # Wide enough for the scenario table when the output is a log file rather than a terminal.
    console: Any = Console(width=None if sys.stdout.isatty() else 200)
    # errors on stderr: a command's output piped or redirected stays its output
    error_console: Any = Console(stderr=True, width=None if sys.stderr.isatty() else 200)
except ModuleNotFoundError:  # the lean install (pip install dualloop, no extras)
    console = PlainConsole()
    error_console = PlainConsole(stderr=True)


def print_error(message: object) -> None:
    # the message is text, not markup: "pip install 'dualloop[demo]'" must print as written
    text = _TAG_LIKE.sub(r"\\\1", str(message))
    # soft_wrap: one line however long (the terminal wraps it; a log or a pipe keeps it whole)
    error_console.print(f"[red]error:[/] {text}", highlight=False, soft_wrap=True)


def print_warning(message: object) -> None:
    """A line on stderr that does not stop the command: what the user should know about what it runs."""
    text = _TAG_LIKE.sub(r"\\\1", str(message))
    error_console.print(f"[yellow]warning:[/] {text}", highlight=False, soft_wrap=True)
