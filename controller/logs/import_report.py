"""What an importer tells its caller (and the CLI prints) about the log it wrote."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from dualloop.sim.schema import ACTIONS


@dataclass
class ImportReport:
    source: str
    out_path: Path
    observations: int
    duration_s: float
    rate_hz: float
    # Share of observations with lead_present = 1 (0 when the source has no lead information).
    lead_present_fraction: float
    # Observations per actual action name; "unknown" counts rows without an actual action.
    label_counts: dict[str, int]
    measured_features: list[str]
    filled_features: list[str]
    warnings: list[str] = field(default_factory=list)
    session_id: str = ""

    def summary(self) -> str:
        labels = ", ".join(f"{name} {count}" for name, count in self.label_counts.items() if count)
        lines = [
            f"imported {self.source} -> {self.out_path}" + (f" (session {self.session_id})" if self.session_id else ""),
            f"  {self.observations} observations over {self.duration_s:.1f} s ({self.rate_hz:.0f} Hz), "
            f"lead present {100 * self.lead_present_fraction:.0f}% of the time",
            f"  actual actions: {labels or 'none'}",
            f"  measured features: {', '.join(self.measured_features)}",
        ]
        if self.filled_features:
            lines.append(f"  filled with neutral values: {', '.join(self.filled_features)}")
        lines += [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)


def count_labels(action_index: npt.NDArray[np.int64]) -> dict[str, int]:
    counts = {name: int(np.count_nonzero(action_index == i)) for i, name in enumerate(ACTIONS)}
    counts["unknown"] = int(np.count_nonzero(action_index < 0))
    return counts
