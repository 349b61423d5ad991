"""The files a server loads again while it runs, copied once at its start (snapshot_files): what a
restarted worker of `serve --workers` loads, and what a replaced planner worker loads in either kind of
server, is what the server started with, whatever has happened to the files on disk since.

`serve --workers` copies the model and gate files (the candidate's too) and the server planner's ONNX
model (planner.path) into its temporary folder, for every worker to load at its first start and at
each restart. A single process loads its model and gates once, but its planner worker is replaced
when it hangs or dies, and the replacement loads the planner model again: it copies that file alone,
into a temporary folder of its own (ServerLifecycle). An error about a copy names the configured file
(as_configured). The TLS files and the tokens file are never copied: they are re-read from their
paths while serving, for rotation.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from dualloop.controller.contract.errors import ConfigError
from dualloop.controller.serve.config import ServerConfig
from dualloop.executor.model_card import unreadable


def temporary_folder(prefix: str, who: str, what: str) -> tempfile.TemporaryDirectory[str]:
    """A temporary folder for `who` (the command) to keep `what` in; ConfigError naming the way out when
    there is none to write (a read-only root filesystem said only "No usable temporary directory")."""
    try:
        return tempfile.TemporaryDirectory(prefix=prefix)
    except OSError as err:
        raise ConfigError(
            f"{who} needs a writable temporary folder for {what} ({err}): set TMPDIR to one, or on a "
            f"read-only root filesystem mount one (docker run --tmpfs /tmp)"
        ) from None


def snapshot_files(config: ServerConfig, folder: Path, *, workers: bool = True) -> dict[Path, Path]:
    """Copy the files a server loads again while it runs into `folder`, read-only: {configured path: its
    copy}. workers: every file a worker of `serve --workers` loads (the model and gate files, the
    candidate's too, and the server planner's ONNX model); else (one process) the planner model alone,
    which a replaced planner worker loads. A file replaced or damaged on disk while the server runs then
    never reaches a restarted worker, which would serve another model or planner than the others on the
    same port (or than the one the server started with), or not start."""
    named = []
    if workers:
        named += [("model (--model)", config.model), *(("gate (--gate)", g) for g in config.gates)]
        if config.candidate is not None:
            named.append(("candidate (--candidate)", config.candidate))
        named += [("candidate gate (--candidate-gate)", g) for g in config.candidate_gates]
    if config.planner.source == "onnx" and config.planner.path is not None:
        named.append(("planner model (planner.path)", config.planner.path))
    copies: dict[Path, Path] = {}
    for what, path in named:
        if path in copies:
            continue
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise ConfigError(f"{what} {path}: file not found") from None
        except PermissionError as err:
            raise ConfigError(f"{what} {path}: {unreadable(path, err)}") from None
        except OSError as err:
            raise ConfigError(f"{what} {path}: cannot read it ({err.strerror or err})") from None
        copy = folder / str(len(copies)) / path.name  # a folder each: two files may share a name
        try:
            copy.parent.mkdir(parents=True)
            copy.write_bytes(data)
        except OSError as err:
            raise ConfigError(
                f"the server keeps a copy of {path} in {folder}, to load it as it was at the start, and cannot "
                f"write it ({err.strerror or err}): set TMPDIR to a folder with room"
            ) from None
        copy.chmod(0o400)
        copies[path] = copy
    return copies


def as_configured(message: str, read_from: Mapping[Path, Path]) -> str:
    """A loader's `message` about a copy (snapshot_files), naming the configured file instead: the
    copy holds what that file held at the server's start, and its folder means nothing to a person."""
    for path, copy in read_from.items():
        folder = "" if path.parent == Path(".") else str(path.parent).rstrip(os.sep) + os.sep
        message = message.replace(f"{copy.parent}{os.sep}", folder)
    return message
