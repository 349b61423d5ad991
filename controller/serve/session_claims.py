"""Which process of `dualloop serve --workers N` holds each open session id.

One process refuses a second open of an id already open (ALREADY_EXISTS); N workers behind one port
must refuse it too, or a client reconnecting while its old stream still lives (a network blip, a
retry) gets a second session of the same id on another worker: two recordings, two states, the
actuator driven by whichever answers last.

A claim is an exclusive `flock` of one file per id (its SHA-256, so any id is a safe name) in a
folder beside the workers' board. The kernel drops the lock when its holder closes it or dies, so a
killed worker's ids are free at once, with no cleanup and nothing to go stale. A release unlinks the
file before unlocking it; a claimer that opened the old file meanwhile sees that its lock is on a
file no longer at the path and tries again.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path

from dualloop.executor.sessions import SessionAlreadyOpen

_ATTEMPTS = 8  # a claim racing a release of the same id retries; more is a caller bug, not a race


class SessionClaims:
    """This process's claims in `folder` (made by the parent, shared by every worker)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._held: dict[str, int] = {}  # session id -> the locked file's descriptor

    def _path(self, session_id: str) -> Path:
        return self.folder / hashlib.sha256(session_id.encode()).hexdigest()

    def claim(self, session_id: str) -> None:
        """Hold `session_id` for this process; SessionAlreadyOpen when another process holds it."""
        path = self._path(session_id)
        for _ in range(_ATTEMPTS):
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            except FileNotFoundError:  # the folder went with a parent that died: this worker is draining
                return
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise SessionAlreadyOpen(
                    f"session {session_id!r} is already open on this server (on another of its worker "
                    f"processes); close it first, or open another id"
                ) from None
            except BaseException:
                os.close(fd)
                raise
            try:
                at_path = os.stat(path).st_ino
            except FileNotFoundError:
                at_path = -1
            if at_path == os.fstat(fd).st_ino:
                self._held[session_id] = fd
                return
            os.close(fd)  # released and unlinked between our open and our lock: the id is free, try again
        raise RuntimeError(f"session {session_id!r}: its claim file kept changing under {self.folder}")

    def release(self, session_id: str) -> None:
        """Give `session_id` up (nothing when this process does not hold it)."""
        fd = self._held.pop(session_id, None)
        if fd is None:
            return
        try:
            self._path(session_id).unlink(missing_ok=True)
        finally:
            os.close(fd)  # unlocks

    def holds(self, session_id: str) -> bool:
        return session_id in self._held

    def release_all(self) -> None:
        for session_id in list(self._held):
            self.release(session_id)
