"""Server recordings for the replay tests, written as the recorder writes them: every session's header
first, then their observations interleaved."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dualloop.controller.logs.format import TOPIC_HEADER, TOPIC_OBSERVATION
from dualloop.controller.logs.logfile import LogFileWriter, read_log
from dualloop.controller.logs.synthetic import REAL_DRIVE
from dualloop.v2 import log_pb2


def write_recording(path: Path, sessions: Sequence[str], count: int, stagger: int = 0) -> Path:
    """`count` observations of the real drive per session; session j starts `j * stagger` rows in."""
    source = read_log(REAL_DRIVE)
    file = LogFileWriter(path)
    for sid in sessions:
        head = log_pb2.SessionHeader()
        head.CopyFrom(source.header)
        head.session_id = sid
        file.write(TOPIC_HEADER, sid, head, 0)
    for k in range(count):
        for j, sid in enumerate(sessions):
            file.write(TOPIC_OBSERVATION, sid, source.observations[j * stagger + k], k)
    file.finish()
    return path
