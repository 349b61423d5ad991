"""Argument types for the command line: a number outside its range is refused while the arguments
are parsed (argparse says "argument --flag: ..." and exits 2), never found minutes into a run, and
never run as a nonsense (a benchmark of -1 s, zero sessions)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def whole_number(low: int, high: int | None = None) -> Callable[[str], int]:
    """An int from `low` (to `high`)."""
    span = f"from {low}" if high is None else f"from {low} to {high}"

    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a whole number ({span})") from None
        if n < low or (high is not None and n > high):
            raise argparse.ArgumentTypeError(f"{n}: a whole number {span}")
        return n

    parse.__name__ = f"whole number {span}"
    return parse


positive_int = whole_number(1)


def _number(value: str, ok: Callable[[float], bool], what: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number ({what})") from None
    if not (math.isfinite(x) and ok(x)):
        raise argparse.ArgumentTypeError(f"{value}: {what}")
    return x


def positive_number(value: str) -> float:
    """A finite float > 0 (a duration, a rate)."""
    return _number(value, lambda x: x > 0.0, "a finite number > 0")


def non_negative_number(value: str) -> float:
    """A finite float >= 0."""
    return _number(value, lambda x: x >= 0.0, "a finite number >= 0")
