"""The check that a command never writes over a file it was given: an import written over its own
CSV, a replay over its log, would destroy what the user gave."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path


def _overlap(out: Path, source: Path) -> str:
    """How writing `out` would hit `source` ("" when it would not: a missing source is its reader's error)."""
    if not source.exists():
        return ""
    r_out, r_src = out.resolve(), source.resolve()
    if r_out == r_src:
        return "the output would overwrite the input"
    try:  # another name for the same file (a hard link): writing one truncates the other
        if out.exists() and os.path.samefile(out, source):
            return "the output would overwrite the input"
    except OSError:
        pass
    if r_src.is_dir() and r_src in r_out.parents:
        return "the output would be written inside the input folder"
    if r_out.is_dir() and r_out in r_src.parents:
        return "the output folder holds the input"
    return ""


def refuse_overwriting_inputs(
    outputs: Iterable[str | Path], inputs: Iterable[str | Path], error: Callable[[str], Exception]
) -> None:
    """Raise `error` (the command's own error type) naming both paths when an output is one of the
    inputs, lies in an input folder or is a folder holding an input: an import written over its own
    CSV, a replay over its log, would destroy what the user gave. Checked before anything is written;
    paths are compared resolved (symlinks, ./x and x) and existing files by identity (hard links)."""
    sources = [Path(p) for p in inputs]
    for out in map(Path, outputs):
        for source in sources:
            why = _overlap(out, source)
            if why:
                raise error(f"{out}: {why} {source}; give another output path")
