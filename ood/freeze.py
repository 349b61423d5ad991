"""Frozen-input detection: a stuck sensor repeats itself exactly.

A single frozen vector looks perfectly typical to a Mahalanobis score; what gives it away is time:
real sensor noise never repeats every component bit for bit. This counts, per session slot, how many
consecutive *fresh* observations were identical to the one before and alarms at `repeats`.
Only fresh observations count, because a tick that reuses the same observation (a 100 Hz sensor on
200 Hz ticks) is not a repeat of the sensor.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial

import numpy as np

from dualloop.ood import compiled

_FLOAT32 = np.dtype(np.float32)


class FreezeDetector:
    """Per slot: the last fresh observation (float32, as Python floats) and the repeat count, kept
    as Python numbers because a tick has few rows and a numpy call costs more than the check."""

    step: Callable[[np.ndarray, Sequence[int], Sequence[bool]], list[bool]]
    """``update`` with the slots and fresh flags as Python sequences; returns a list. This instance's
    loop: the compiled one (ood/_tick.c) when built, called directly, else ``_step_python``."""

    def __init__(self, n_slots: int, dim: int, repeats: int = 2) -> None:
        if repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {repeats}")
        self.repeats = repeats
        self.dim = dim
        self._last: list[list[float]] = [[math.nan] * dim for _ in range(n_slots)]
        self._count = [0] * n_slots
        module = compiled.module()
        self.is_compiled = module is not None
        self.step = (
            self._step_python
            if module is None
            else partial(module.freeze_step, self._step_python, self._last, self._count, self.repeats)
        )

    def update(self, x: np.ndarray, slots: np.ndarray | Sequence[int], fresh: np.ndarray) -> np.ndarray:
        """x (batch, dim) raw features of the rows ticking now; returns the alarm per row.

        Delay: the `repeats`-th identical fresh observation after onset alarms, i.e. `repeats` ticks
        after the first frozen sample at the observation rate.
        """
        return np.array(
            self.step(x, np.asarray(slots, dtype=np.intp).tolist(), np.asarray(fresh, dtype=bool).tolist()), dtype=bool
        )

    def _step_python(self, x: np.ndarray, slots: Sequence[int], fresh: Sequence[bool]) -> list[bool]:
        """``step`` in Python: the reference, and the C loop's path for rows that are not float32.

        Comparing two rows' ``tolist()`` compares every component with float ``==``, as numpy's
        ``==`` does: NaN never equals, so non-finite rows are the gate's job, not a freeze."""
        rows = x.tolist()
        kept = rows if x.dtype is _FLOAT32 else np.asarray(x, dtype=np.float32).tolist()
        last, count, repeats = self._last, self._count, self.repeats
        alarm = []
        for slot, now, keep, is_fresh in zip(slots, rows, kept, fresh):
            if is_fresh:  # a reused observation is not a repeat of the sensor
                count[slot] = count[slot] + 1 if now == last[slot] else 0
                last[slot] = keep
            alarm.append(count[slot] >= repeats)
        return alarm

    @property
    def state(self) -> tuple[np.ndarray, np.ndarray]:
        """(last fresh observation, repeat count) per slot (copies, for tests and debugging)."""
        return np.array(self._last, dtype=np.float32), np.array(self._count)

    def scan(self, x: np.ndarray, slot: int, fresh: np.ndarray) -> np.ndarray:
        """``update`` of one slot over many consecutive ticks (replay), vectorised: x (ticks, dim),
        fresh (ticks,). Returns the alarm per tick; leaves the slot as tick-by-tick updates would."""
        fresh = np.asarray(fresh, dtype=bool)
        at = np.flatnonzero(fresh)
        if at.size == 0:
            return np.full(len(x), self._count[slot] >= self.repeats)
        xf = x[at]
        same = np.all(xf == np.vstack([np.array(self._last[slot], dtype=np.float32)[None], xf[:-1]]), axis=1)
        # count at the j-th fresh tick: fresh ticks since the last one that differed, or, before
        # any difference, the slot's old count plus the run so far
        j = np.arange(at.size)
        last_reset = np.maximum.accumulate(np.where(same, -1, j))
        count_f = np.where(last_reset >= 0, j - last_reset, self._count[slot] + j + 1)
        # a tick that reuses an observation keeps the count of the last fresh tick before it
        latest = np.searchsorted(at, np.arange(len(x)), side="right") - 1
        count = np.where(latest >= 0, count_f[np.maximum(latest, 0)], self._count[slot])
        self._count[slot] = int(count_f[-1])
        self._last[slot] = np.asarray(xf[-1], dtype=np.float32).tolist()
        return count >= self.repeats

    def reset(self, slot: int) -> None:
        self._last[slot] = [math.nan] * self.dim
        self._count[slot] = 0
