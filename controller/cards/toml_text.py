"""A small TOML writer for model cards: the value types a card holds, nothing more.

tomllib (stdlib) reads TOML but does not write it; a card has strings, numbers, booleans, lists of
them, tables and arrays of tables, so a few lines cover it without another dependency.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any


def value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"{v} has no place in a card")
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)  # a JSON string is a valid TOML basic string
    if isinstance(v, Sequence):
        return "[" + ", ".join(value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} as a TOML value")


def _key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else json.dumps(k)


def dumps(doc: Mapping[str, Any], comments: Mapping[str, str] | None = None) -> str:
    """TOML text of `doc`; `comments` maps dotted paths ("features.0.unit") to a trailing comment."""
    comments = comments or {}
    lines: list[str] = []
    _table(doc, "", lines, comments)
    return "\n".join(lines).strip() + "\n"


def _is_table_array(v: Any) -> bool:
    return isinstance(v, Sequence) and not isinstance(v, str) and len(v) > 0 and all(isinstance(x, Mapping) for x in v)


def _line(k: str, v: Any, path: str, comments: Mapping[str, str]) -> str:
    note = comments.get(path)
    return f"{_key(k)} = {value(v)}" + (f"  # {note}" if note else "")


def _table(doc: Mapping[str, Any], prefix: str, lines: list[str], comments: Mapping[str, str]) -> None:
    # plain keys first: in TOML they belong to the table above them
    for k, v in doc.items():
        if not isinstance(v, Mapping) and not _is_table_array(v):
            lines.append(_line(k, v, f"{prefix}{k}", comments))
    for k, v in doc.items():
        if isinstance(v, Mapping):
            lines += ["", f"[{prefix}{_key(k)}]"]
            if comments.get(f"{prefix}{k}"):
                lines.append(f"# {comments[f'{prefix}{k}']}")
            _table(v, f"{prefix}{k}.", lines, comments)
        elif _is_table_array(v):
            if comments.get(f"{prefix}{k}"):
                lines += ["", f"# {comments[f'{prefix}{k}']}"]
            for i, item in enumerate(v):
                lines += ["", f"[[{prefix}{_key(k)}]]"]
                for kk, vv in item.items():
                    if isinstance(vv, Mapping) or _is_table_array(vv):
                        raise TypeError(f"{prefix}{k}[{i}].{kk}: nested tables are not written")
                    lines.append(_line(kk, vv, f"{prefix}{k}.{i}.{kk}", comments))
