"""Where a command may write: never over a file it was given (an import written over its own CSV, a
replay over its log, would destroy what the user gave), and an output file's folder made, or the path
refused in one line, before the work."""

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


def prepare_output_file(path: Path, flag: str, error: Callable[[str], Exception]) -> None:
    """Make the folder of the output file `path` now, before the work (as replay --json does); raise
    `error` (the command's own error type, one line) naming `flag` when the file cannot be written
    there: a folder in its place, a file in place of a folder above it, a folder that cannot be made
    or written."""
    if path.is_dir():
        raise error(f"{flag} {path}: is a folder; give a file path")
    # the nearest existing folder up the path (parents: nearest first); a file there cannot hold one
    blocker = next((p for p in (path.parent, *path.parent.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise error(f"{flag} {path}: {blocker} is a file, not a folder; give a path in a folder")
    try:  # a folder that cannot be made: no permission, a read-only or virtual file system (/proc)
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise error(
            f"{flag} {path}: cannot make the folder {path.parent} ({err.strerror or err}); "
            "give a path in a folder you can write"
        ) from None
    if not os.access(path.parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise error(f"{flag} {path}: cannot write there (permissions); give a path you can write")
