"""`tick_snapshots` builds each Snapshot positionally (keywords cost more than the rules at a tick of
many sessions): the comment naming each argument must be the field it lands in."""

from __future__ import annotations

import inspect
import re
from dataclasses import fields

from dualloop.executor.snapshot import Snapshot
from dualloop.executor.tick_snapshots import tick_snapshots


def _named_arguments() -> list[str]:
    source = inspect.getsource(tick_snapshots)
    call = source[source.index("Snapshot(\n") :]
    call = call[: call.index("\n            )\n")]
    return re.findall(r",\s+# (\w+)$", call, re.M)


def test_every_positional_argument_is_the_field_its_comment_names() -> None:
    named = _named_arguments()
    assert len(named) > 40  # the call was found and read
    assert named == [f.name for f in fields(Snapshot)][: len(named)]
    # the fields left out keep their defaults (a candidate's proposal is added by the executor)
    assert [f.name for f in fields(Snapshot)][len(named) :] == ["candidate"]
