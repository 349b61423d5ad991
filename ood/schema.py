"""What a gate was fitted on (ordered feature names and their source), and how two name lists differ."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FeatureSchema:
    """What the gate was fitted on: ordered feature names and where they come from."""

    feature_names: tuple[str, ...]
    source: str  # e.g. "decision_vector" (model penultimate layer) or "input_features"

    def __post_init__(self) -> None:
        if not self.feature_names:
            raise ValueError("feature schema needs at least one feature name")
        if len(set(self.feature_names)) != len(self.feature_names):
            raise ValueError("feature names must be unique")
        if not self.source:
            raise ValueError("feature schema needs a source (e.g. 'decision_vector')")

    def to_dict(self) -> dict[str, Any]:
        return {"feature_names": list(self.feature_names), "source": self.source}


@dataclass(frozen=True)
class ModelRef:
    """The model a gate was fitted on: its card's name, version (content hash) and feature schema hash.
    The gate's statistics describe that model's decision vectors (or the inputs it was fed), so the
    serving path refuses to put the gate in front of another model."""

    name: str
    version: str
    schema_hash: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "schema_hash": self.schema_hash}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelRef:
        return cls(str(d["name"]), str(d["version"]), str(d["schema_hash"]))


def describe_schema_mismatch(gate_names: Sequence[str], expected: Sequence[str]) -> str | None:
    """Human-readable difference between two ordered name lists, or None if identical."""
    gate_names, expected = list(gate_names), list(expected)
    if gate_names == expected:
        return None
    parts = []
    if len(gate_names) != len(expected):
        parts.append(f"gate has {len(gate_names)} features, caller expects {len(expected)}")
    missing = [n for n in expected if n not in set(gate_names)]
    extra = [n for n in gate_names if n not in set(expected)]
    if missing:
        parts.append(f"expected but not in gate: {missing[:8]}{' ...' if len(missing) > 8 else ''}")
    if extra:
        parts.append(f"in gate but not expected: {extra[:8]}{' ...' if len(extra) > 8 else ''}")
    if not missing and not extra:
        i = next(i for i, (a, b) in enumerate(zip(gate_names, expected)) if a != b)
        parts.append(
            f"same names in a different order; first difference at position {i}: gate {gate_names[i]!r}, "
            f"caller {expected[i]!r}"
        )
    return "; ".join(parts)
