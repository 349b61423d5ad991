"""A model file's version as its content says it: the hash the exporter and `dualloop card attach`
write into the card (sha256 of the ONNX graph without the card, then the card's identity).

The card's `version` is only a claim: a graph swapped under an old card, or a card copied onto
another graph, keeps it. A candidate is identified by its version (PromoteCandidate's expected
version, the shadow tally, snapshots), so its claim is checked against its content before it is
loaded. onnx (the train extra) is not needed: the card's metadata entry is cut out of the file's
top-level protobuf fields, which every dualloop writer emits in deterministic order.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from dualloop.executor.model_card import METADATA_KEY, ModelCard

_METADATA_PROPS = 14  # ModelProto.metadata_props (onnx.proto)
_KEY = METADATA_KEY.encode()


class UnreadableModel(ValueError):
    """The file's top level is not a protobuf message this parser can walk."""


def _varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= len(data) or shift > 63:
            raise UnreadableModel("a truncated or oversized varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(data: bytes | memoryview) -> list[tuple[int, int, int, int]]:
    """(field number, start, end of the whole field, start of a length-delimited payload)."""
    out, pos = [], 0
    while pos < len(data):
        start = pos
        tag, pos = _varint(data, pos)
        number, wire = tag >> 3, tag & 7
        payload = pos
        if wire == 0:
            _, pos = _varint(data, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            size, payload = _varint(data, pos)
            pos = payload + size
        else:
            raise UnreadableModel(f"wire type {wire} at byte {start}")
        if pos > len(data) or number == 0:
            raise UnreadableModel(f"a field running past the end at byte {start}")
        out.append((number, start, pos, payload))
    return out


def _is_card_entry(entry: memoryview) -> bool:
    for number, _, end, payload in _fields(entry):
        if number == 1:  # StringStringEntryProto.key
            return bytes(entry[payload:end]) == _KEY
    return False


def content_version(path: str | Path, card: ModelCard) -> str:
    """The version `card` would have on this file's graph (12 hex digits); UnreadableModel if the
    file's top level cannot be walked."""
    data = memoryview(Path(path).read_bytes())
    digest = hashlib.sha256()
    for number, start, end, payload in _fields(data):
        if number == _METADATA_PROPS and _is_card_entry(data[payload:end]):
            continue
        digest.update(data[start:end])
    digest.update(card.identity_json().encode())
    return digest.hexdigest()[:12]
