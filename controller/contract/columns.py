"""Reading a columns message (SnapshotColumns, ObservationColumns): per-agent runs of a column laid
end to end with a count per agent, and sparse columns that hold an entry per agent whose `has_`
column is set. Every size is checked; what does not add up is a ColumnsError naming the column."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class ColumnsError(ValueError):
    """Columns whose sizes do not add up (a broken or foreign message)."""


def check_sizes(message: Any, names: Sequence[str], size: int, what: str) -> None:
    """Each named column of `message` holds `size` entries (one per `what`)."""
    for name in names:
        got = len(getattr(message, name))
        if got != size:
            raise ColumnsError(f"{type(message).__name__}.{name}: {got} entries for {size} {what}")


def _counted(message: Any, name: str, count_name: str, rows: int) -> tuple[Sequence[int], Sequence[Any]]:
    counts, values = getattr(message, count_name), getattr(message, name)
    if len(counts) != rows or sum(counts) != len(values):
        raise ColumnsError(
            f"{type(message).__name__}.{name}: {len(counts)} counts adding to {sum(counts)} for {rows} agents"
            f" and {len(values)} values"
        )
    return counts, values


def float_runs(message: Any, name: str, rows: int) -> list[np.ndarray]:
    """Column `name` (floats) split by `name_count` into `rows` float32 arrays (views of one array)."""
    counts, values = _counted(message, name, name + "_count", rows)
    if not rows:
        return []
    flat = np.asarray(values, np.float32)
    if min(counts) == max(counts):  # every agent the same size (the usual): rows of one reshape
        return list(flat.reshape(rows, counts[0]))
    return np.split(flat, np.cumsum(counts)[:-1])


def runs(message: Any, name: str, count_name: str, rows: int) -> list[list[Any]]:
    """Column `name` split by column `count_name` into `rows` lists."""
    counts, values = _counted(message, name, count_name, rows)
    out, at = [], 0
    for c in counts:
        out.append(list(values[at : at + c]))
        at += c
    return out


def sparse_rows(
    message: Any, has: str, names: Sequence[str], rows: int, empty_is_none: bool = False
) -> list[tuple[Any, ...] | None]:
    """Per agent: its entries of the named columns (one per agent whose `has` column is set, in
    agent order), or None. `empty_is_none`: an empty `has` column means no agent has them."""
    flags = getattr(message, has)
    if empty_is_none and not flags:
        flags = [False] * rows
    else:
        check_sizes(message, (has,), rows, "agents")
    check_sizes(message, names, sum(flags), f"agents with {has}")
    entries = iter(zip(*(getattr(message, n) for n in names)))
    return [next(entries) if h else None for h in flags]
