"""The server's structured log: lifecycle and per-session events on stdlib logging.

Each event is one record of the `dualloop.serve` logger whose message is the event name
("session.open", "server.drain", ...) and whose fields travel in `extra`. Two renderings: human
(`time LEVEL event key=value ...`, the default) and JSON lines (one object per line, for log
shippers). Nothing here runs per tick: sessions log when they open and close, and on errors.

Fields carry client strings (session ids, error messages quoting them), so neither rendering lets a
value break its line: JSON escapes every control character itself, and the human format writes a
value bare only when it is plain text (printable, no space, quote, backslash or `=`), otherwise as a
JSON string (newlines, ANSI escapes, Unicode line separators all escaped). A record is one line.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, Literal, TextIO

LOGGER_NAME = "dualloop.serve"
LogFormat = Literal["human", "json"]
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

logger = logging.getLogger(LOGGER_NAME)
# A library default: silent until configure_logging (no "lastResort" bare lines from servers in tests)
logger.addHandler(logging.NullHandler())

_FIELDS = "dualloop_fields"  # the attribute of a LogRecord that carries an event's fields


def event(name: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log one event with its fields (skipped cheaply when the level is off)."""
    if logger.isEnabledFor(level):
        logger.log(level, name, extra={_FIELDS: fields})


def _utc(record: logging.LogRecord) -> str:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{stamp}.{int(record.msecs):03d}Z"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (UTC, ISO 8601), level, logger, event, then the event's fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _utc(record),
            "level": record.levelname,
            "logger": record.name,
            "event": record.getMessage(),
        }
        out.update(getattr(record, _FIELDS, {}))
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, separators=(",", ":"))


_NOT_BARE = frozenset(' "=\\')


def human_value(value: object) -> str:
    """A field's value in the human format: a string bare when plain, else as a JSON string (one line,
    escaped); other values (numbers, lists of names) as str() makes them, escaped the same way if that
    is not printable."""
    if isinstance(value, str):
        return value if value and value.isprintable() and _NOT_BARE.isdisjoint(value) else json.dumps(value)
    text = str(value)
    return text if text.isprintable() else json.dumps(text)


def _one_line(text: str) -> str:
    """A message (an event name, another logger's text) with its control characters escaped."""
    return text if text.isprintable() else json.dumps(text)[1:-1]


class HumanFormatter(logging.Formatter):
    """`2026-12-01T18:09:39.123Z INFO  session.open session_id=rt clock=REALTIME ...`"""

    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, _FIELDS, {})
        parts = [_utc(record), f"{record.levelname:<5}", _one_line(record.getMessage())]
        parts += [f"{k}={human_value(v)}" for k, v in fields.items()]
        text = " ".join(parts)
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


class _CurrentStderr(logging.StreamHandler):
    """Writes to sys.stderr as it is when a record is emitted, not as it was when logging was
    configured: a server started in process outlives a caller that swapped stderr and closed it."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass


def configure_logging(level: str = "INFO", fmt: LogFormat = "human", stream: TextIO | None = None) -> None:
    """Send the server's events (and the other dualloop loggers') to stream (default stderr)."""
    handler: logging.StreamHandler = logging.StreamHandler(stream) if stream is not None else _CurrentStderr()
    handler.setFormatter(JsonFormatter() if fmt == "json" else HumanFormatter())
    root = logging.getLogger("dualloop")
    for old in list(root.handlers):  # configuring twice (tests, a second serve) must not double lines
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    root.propagate = False


class SessionTrace:
    """What one Drive stream logs: `session.open` once opened, then `session.close` with its status
    and counts; a stream refused before it opened logs `session.refused` instead."""

    __slots__ = (
        "peer",
        "session_id",
        "clock",
        "shadow",
        "instance",
        "opened_ns",
        "ticks",
        "snapshots_sent",
        "snapshots_dropped",
        "observations_dropped",
        "last_seq",
        "ending",
    )

    def __init__(self, peer: str) -> None:
        self.peer = peer
        self.session_id = ""
        self.clock = ""
        self.shadow = False
        self.instance = ""
        self.opened_ns = 0  # 0: not opened
        self.ticks = self.snapshots_sent = self.snapshots_dropped = self.observations_dropped = self.last_seq = 0
        self.ending = ""  # what an OK end says (a stream ended before it opened a session: why that may be)

    def opened(self, session_id: str, clock: str, shadow: bool, instance: str) -> None:
        self.session_id, self.clock, self.shadow, self.instance = session_id, clock, shadow, instance
        self.opened_ns = time.monotonic_ns()
        event("session.open", peer=self.peer, session_id=session_id, clock=clock, shadow=shadow, instance=instance)

    def ended(self, code: str, message: str) -> None:
        """code: the gRPC status name the client gets (OK, INVALID_ARGUMENT, CANCELLED, ...)."""
        level = logging.INFO if code in ("OK", "CANCELLED") else logging.WARNING
        if not self.opened_ns:
            event("session.refused", level, peer=self.peer, code=code, message=message)
            return
        event(
            "session.close",
            level,
            peer=self.peer,
            session_id=self.session_id,
            clock=self.clock,
            shadow=self.shadow,
            instance=self.instance,
            code=code,
            message=message,
            duration_s=round((time.monotonic_ns() - self.opened_ns) / 1e9, 3),
            ticks=self.ticks,
            last_seq=self.last_seq,
            snapshots_sent=self.snapshots_sent,
            snapshots_dropped=self.snapshots_dropped,
            observations_dropped=self.observations_dropped,
        )
