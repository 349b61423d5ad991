"""The value checks every importer of a recorded drive makes (CSV rows, ROS 2 bag samples), said once.

- A speed in m/s whose median exceeds 45 or whose maximum exceeds 70 was almost surely written in
  km/h: the importer refuses it, naming where the peak is and how to declare the unit.
- A flag other than 0 or 1, a negative gap and a speed below -0.5 m/s are values no sensor of that
  kind reports: they are kept (a real log's faults are what the checks and replay judge) with a
  warning naming the feature, the count and the first place, where a convention is still easy to fix.
- A declared rate more than RATE_MISMATCH times off the data's own is a wrong declaration.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dualloop.sim.schema import FEATURES, SENSOR_RANGE_M

# A speed declared (or defaulted to) m/s with these statistics was almost surely written in km/h.
IMPLAUSIBLE_MEDIAN_MS = 45.0
IMPLAUSIBLE_MAX_MS = 70.0
# A speed below this (m/s) is driving backwards, not a standstill's sensor noise.
REVERSE_SPEED_MS = 0.5
# A declared rate this many times faster (or slower) than the data's own is a wrong declaration.
RATE_MISMATCH = 2.0

_UNITS = {f.name: f.unit for f in FEATURES}


def implausible_speed(values: npt.NDArray[np.float64]) -> tuple[int, str] | None:
    """(index of the peak, what is wrong) when a speed series in m/s looks like km/h, else None.
    NaN (a missing value) is ignored."""
    finite = values[np.isfinite(values)]
    if not finite.size:
        return None
    median, peak = float(np.median(finite)), float(np.max(finite))
    if median <= IMPLAUSIBLE_MEDIAN_MS and peak <= IMPLAUSIBLE_MAX_MS:
        return None
    return (
        int(np.nanargmax(values)),
        f"{peak:g} m/s (median {median:g}) is implausible for a car: looks like km/h",
    )


@dataclass(frozen=True)
class OutOfRange:
    """The values of one feature that no sensor of its kind reports."""

    count: int
    first: int  # index of the first such value
    value: str  # that value, with its unit
    expected: str  # what a value of this feature is

    def text(self, subject: str, noun: str, where: str) -> str:
        """`subject`: the column or feature; `noun`: row(s), sample(s); `where`: the first one's place."""
        return f"{subject}: {self.count} {noun} out of range (first at {where}: {self.value}); {self.expected}"


def out_of_range(name: str, values: npt.NDArray[np.float64]) -> OutOfRange | None:
    """The out-of-range values of feature `name` (in its schema unit; NaN is missing, not out of range)."""
    unit = _UNITS[name]
    if unit == "bool":
        bad, expected = (values != 0.0) & (values != 1.0) & ~np.isnan(values), "a flag is 1 or 0"
    elif unit == "m" and (name.endswith("_gap") or name.endswith("_distance")):
        bad, expected = values < 0.0, f"a gap is at least 0 m ({SENSOR_RANGE_M:g} m when nothing is there)"
    elif name == "ego_speed":
        bad, expected = values < -REVERSE_SPEED_MS, "the model knows forward driving only"
    else:
        return None
    if not bad.any():
        return None
    first = int(np.argmax(bad))
    value = f"{values[first]:g}" + ("" if unit == "bool" else f" {unit}")
    return OutOfRange(int(np.count_nonzero(bad)), first, value, expected)
