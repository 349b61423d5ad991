"""The terminal every command prints to, and how a command reports an error a person can act on."""

from __future__ import annotations

import sys

from rich.console import Console

# Wide enough for the scenario table when the output is a log file rather than a terminal.
console = Console(width=None if sys.stdout.isatty() else 200)


def print_error(message: object) -> None:
    console.print(f"[red]error:[/] {message}", highlight=False)
