"""One verdict of `dualloop qualify`: a measured value of the candidate against the baseline's, with its limit."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Check:
    step: str  # replay, stress, shadow, int8
    name: str
    candidate: float | None
    baseline: float | None  # None: an absolute limit
    limit: float | None
    passed: bool
    note: str = ""
    # False: nothing to compare (no value on either side, no tick to judge on); not a failure, but
    # a verdict made only of such checks is no pass (Qualification.verdict)
    judged: bool = True

    @property
    def status(self) -> str:
        return "n/a" if not self.judged else "pass" if self.passed else "FAIL"

    def line(self) -> str:
        """'FAIL stress: ECE nominal 0.210 (baseline 0.031, limit <= 0.051)'."""
        base = "" if self.baseline is None else f"baseline {_fmt(self.baseline)}, "
        limit = self.note if self.limit is None else f"limit {self.note}{_fmt(self.limit)}"
        return f"{self.status} {self.step}: {self.name} {_fmt(self.candidate)} ({base}{limit})"

    def as_dict(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()}


def _fmt(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.4g}"


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def no_worse(
    step: str, name: str, candidate: float, baseline: float, tolerance: float, higher_is_better: bool
) -> Check:
    """The candidate at most `tolerance` worse than the baseline. A value the baseline has and the
    candidate lacks fails; one the baseline lacks is not judged (said in the note)."""
    if not _finite(baseline):
        why = "neither model has a value" if not _finite(candidate) else "the baseline has no value"
        return Check(step, name, candidate, baseline, None, True, f"not judged: {why}", judged=False)
    limit = baseline - tolerance if higher_is_better else baseline + tolerance
    ok = _finite(candidate) and (candidate >= limit if higher_is_better else candidate <= limit)
    return Check(step, name, candidate, baseline, limit, bool(ok), ">= " if higher_is_better else "<= ")


def at_most(step: str, name: str, value: float, limit: float) -> Check:
    """An absolute limit (no baseline)."""
    return Check(step, name, value, None, limit, _finite(value) and value <= limit, "<= ")


def not_judged(step: str, name: str, why: str) -> Check:
    """A criterion with nothing to judge it on (`why` says what is missing)."""
    return Check(step, name, None, None, None, True, f"not judged: {why}", judged=False)
